package comm

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// TCPConfig says where the rendezvous is and who this rank is. It must
// agree on every rank except Rank and LocalRank.
type TCPConfig struct {
	// Addr and Port locate rank 0's rendezvous server (GOEP_MASTER_ADDR,
	// GOEP_MASTER_PORT). Rank 0 listens on Addr:Port; the others dial it.
	Addr string
	Port int
	// Rank in [0, Size) and Size, the number of ranks (RANK, WORLD_SIZE).
	Rank, Size int
	// LocalRank in [0, LocalSize) and LocalSize, the ranks on this host
	// (LOCAL_RANK, LOCAL_WORLD_SIZE). Informational: the launcher uses
	// them to pick a GPU; the rendezvous does not check them.
	LocalRank, LocalSize int
}

// Validate says what is wrong with c, if anything.
func (c TCPConfig) Validate() error {
	switch {
	case c.Size < 1:
		return fmt.Errorf("comm: tcp: world size %d: want at least 1", c.Size)
	case c.Rank < 0 || c.Rank >= c.Size:
		return fmt.Errorf("comm: tcp: rank %d outside [0, %d)", c.Rank, c.Size)
	case c.Addr == "":
		return errors.New("comm: tcp: no rendezvous address")
	case c.Port < 0 || c.Port > 65535:
		return fmt.Errorf("comm: tcp: port %d outside [0, 65535]", c.Port)
	case c.Port == 0 && c.Rank != 0:
		return fmt.Errorf("comm: tcp: rank %d needs rank 0's port (port 0 means rank 0 picks any, which nobody else can know)", c.Rank)
	case c.LocalSize < 1 || c.LocalSize > c.Size:
		return fmt.Errorf("comm: tcp: local size %d outside [1, %d]", c.LocalSize, c.Size)
	case c.LocalRank < 0 || c.LocalRank >= c.LocalSize:
		return fmt.Errorf("comm: tcp: local rank %d outside [0, %d)", c.LocalRank, c.LocalSize)
	}
	return nil
}

// TCPConfigFromEnv reads the rendezvous configuration the way torchrun
// sets it:
//
//	GOEP_MASTER_ADDR   rank 0's host name or IP address
//	GOEP_MASTER_PORT   rank 0's port, 1..65535
//	RANK               this rank, 0..WORLD_SIZE-1
//	WORLD_SIZE         number of ranks, at least 1
//	LOCAL_RANK         this rank's index on its host (default RANK)
//	LOCAL_WORLD_SIZE   ranks on this host (default WORLD_SIZE)
//
// If RANK and WORLD_SIZE are both unset, the process is a single rank and
// the result is {Addr: "127.0.0.1", Port: 0, Rank: 0, Size: 1, LocalRank: 0,
// LocalSize: 1} (the master variables, if set, are still checked). Otherwise
// every variable but the LOCAL pair is required, the LOCAL pair is set
// together or not at all, and a missing or invalid value is an error that
// names the variable and the value; nothing falls back silently.
func TCPConfigFromEnv() (TCPConfig, error) {
	return tcpConfigFrom(os.LookupEnv)
}

func tcpConfigFrom(lookup func(string) (string, bool)) (TCPConfig, error) {
	intVar := func(name string, lo, hi int) (int, bool, error) {
		s, ok := lookup(name)
		if !ok {
			return 0, false, nil
		}
		v, err := strconv.Atoi(s)
		if err != nil || v < lo || v > hi {
			return 0, true, fmt.Errorf("comm: %s=%q: want an integer in [%d, %d]", name, s, lo, hi)
		}
		return v, true, nil
	}
	const maxInt32 = 1<<31 - 1
	var c TCPConfig
	addr, haveAddr := lookup("GOEP_MASTER_ADDR")
	if haveAddr && (strings.TrimSpace(addr) != addr || addr == "" || strings.ContainsAny(addr, " \t\n/")) {
		return c, fmt.Errorf("comm: GOEP_MASTER_ADDR=%q: want a host name or IP address", addr)
	}
	port, havePort, err := intVar("GOEP_MASTER_PORT", 1, 65535)
	if err != nil {
		return c, err
	}
	size, haveSize, err := intVar("WORLD_SIZE", 1, maxInt32)
	if err != nil {
		return c, err
	}
	rank, haveRank, err := intVar("RANK", 0, maxInt32)
	if err != nil {
		return c, err
	}
	if !haveRank && !haveSize {
		c = TCPConfig{Addr: "127.0.0.1", Port: 0, Rank: 0, Size: 1, LocalRank: 0, LocalSize: 1}
		if haveAddr {
			c.Addr = addr
		}
		if havePort {
			c.Port = port
		}
		return c, nil
	}
	for _, v := range []struct {
		name string
		have bool
	}{{"RANK", haveRank}, {"WORLD_SIZE", haveSize}, {"GOEP_MASTER_ADDR", haveAddr}, {"GOEP_MASTER_PORT", havePort}} {
		if !v.have {
			return c, fmt.Errorf("comm: %s is not set (a multi-process run needs RANK, WORLD_SIZE, GOEP_MASTER_ADDR and GOEP_MASTER_PORT)", v.name)
		}
	}
	if rank >= size {
		s, _ := lookup("RANK")
		return c, fmt.Errorf("comm: RANK=%q: want an integer in [0, %d) (WORLD_SIZE is %d)", s, size, size)
	}
	c = TCPConfig{Addr: addr, Port: port, Rank: rank, Size: size, LocalRank: rank, LocalSize: size}
	lsize, haveLSize, err := intVar("LOCAL_WORLD_SIZE", 1, size)
	if err != nil {
		return c, err
	}
	lrank, haveLRank, err := intVar("LOCAL_RANK", 0, maxInt32)
	if err != nil {
		return c, err
	}
	switch {
	case haveLRank != haveLSize && haveLRank:
		return c, errors.New("comm: LOCAL_RANK is set but LOCAL_WORLD_SIZE is not (set both or neither)")
	case haveLRank != haveLSize:
		return c, errors.New("comm: LOCAL_WORLD_SIZE is set but LOCAL_RANK is not (set both or neither)")
	case haveLRank && lrank >= lsize:
		s, _ := lookup("LOCAL_RANK")
		return c, fmt.Errorf("comm: LOCAL_RANK=%q: want an integer in [0, %d) (LOCAL_WORLD_SIZE is %d)", s, lsize, lsize)
	case haveLRank:
		c.LocalRank, c.LocalSize = lrank, lsize
	}
	return c, nil
}

// NewTCP joins the TCP rendezvous described by cfg and returns the world
// group. Rank 0 listens on cfg.Addr:cfg.Port and runs the rendezvous server
// (every collective is relayed through it); every rank, rank 0 included,
// connects to it, retrying until ctx's deadline so that ranks may start in
// any order. NewTCP returns once all cfg.Size ranks have joined; if some have
// not by the deadline, it returns a *TimeoutError naming them. A rank whose
// Size disagrees with rank 0's, a rank outside [0, Size) and a rank that
// joins twice make every waiting rank return an error.
//
// cfg.Port 0 is allowed only for a single rank (nobody else could find
// rank 0); tests and launchers that want a free port should open the
// listener themselves and call NewTCPWithListener on rank 0.
//
// AllToAll goes over direct peer connections, one per pair of ranks, built
// eagerly by NewTCP: each rank listens on an ephemeral port of the interface
// it reaches rank 0 through (loopback when rank 0 is 127.0.0.1) and
// advertises it in its hello; once every rank has joined, rank i dials every
// rank j > i and accepts every j < i, each connection opened by a hello that
// names both ranks and the world id from the welcome (anything else is
// closed), and the listener is closed. The ranks then agree, in one relayed
// round, whether every rank got every connection within min(ctx's
// deadline, 10 s); if any did not (a firewall, an address the peers cannot
// route to, a failed listen), every rank closes its peer connections and
// AllToAll is relayed through rank 0 like the other collectives: correct,
// but every byte crosses rank 0 twice. NewTCP does not say which happened
// (there is no logger here); the result is the same either way. The world
// group and every sub-group share the peer connections; each part is framed
// with its group id and the group's sequence number, so concurrent
// AllToAlls of different groups and successive calls never mix. AllToAll
// with a peer whose connection broke, or whose process died, fails with a
// *PeerLostError naming it; with a peer that never calls, with a
// *TimeoutError naming it. A write to a peer that is cut short (ctx
// cancelled, or the peer did not read it all by the deadline plus a
// second) leaves a half-written frame, so that connection is closed: the
// peer sees this rank as lost from then on, and this rank's calls with the
// peer fail at once, with a *TimeoutError naming it if the write timed out
// (a peer slow to read, its process descheduled, say, is not evidence that
// it died) and a *PeerLostError otherwise. The same holds for the
// connection to rank 0's rendezvous server. Calls of different collectives
// in the same round, when one of them is a direct AllToAll, end in a
// timeout rather than the relay's "same collectives" error.
//
// Every collective's waits are bounded by its ctx; under a ctx without a
// deadline, a write fails once the other side has read none of it for
// DefaultTCPTimeout, however long the whole write takes. A rank whose
// connection breaks (its process died) is detected by the server at once,
// and every round of every group that includes it then fails on every rank
// with a *PeerLostError naming it; if rank 0 dies, every rank's current or
// next collective fails with a *PeerLostError naming rank 0. Closing the
// world group closes its sub-groups too; rank 0 closing stops the server,
// and the other ranks' later collectives return ErrClosed.
func NewTCP(ctx context.Context, cfg TCPConfig) (Group, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Rank != 0 {
		return newTCP(ctx, cfg, nil, tcpOptions{})
	}
	if cfg.Port == 0 && cfg.Size > 1 {
		return nil, fmt.Errorf("comm: tcp: rank 0 of %d cannot listen on port 0: the other ranks could not find it (use NewTCPWithListener)", cfg.Size)
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(cfg.Addr, strconv.Itoa(cfg.Port)))
	if err != nil {
		return nil, fmt.Errorf("comm: tcp: rank 0: listen: %w", err)
	}
	return newTCP(ctx, cfg, ln, tcpOptions{})
}

// NewTCPWithListener is NewTCP for rank 0 with a listener it already has
// open (for example net.Listen("tcp", "127.0.0.1:0"), whose port it then
// hands to the other ranks): no race for the port. cfg.Addr and cfg.Port
// are not used for listening. The group owns ln from now on, even on error.
func NewTCPWithListener(ctx context.Context, cfg TCPConfig, ln net.Listener) (Group, error) {
	if cfg.Rank != 0 {
		ln.Close()
		return nil, fmt.Errorf("comm: tcp: NewTCPWithListener is for rank 0, not rank %d", cfg.Rank)
	}
	if cfg.Addr == "" {
		cfg.Addr = "127.0.0.1" // not used
	}
	if err := cfg.Validate(); err != nil {
		ln.Close()
		return nil, err
	}
	return newTCP(ctx, cfg, ln, tcpOptions{})
}

// tcpOptions are knobs for tests and benchmarks.
type tcpOptions struct {
	// relay: advertise no peer address, so that the whole world falls
	// back to the relayed AllToAll.
	relay bool
}

// DefaultTCPTimeout bounds, when a collective's ctx has no deadline, how
// long a write of it to the rendezvous server or a peer may go without the
// other side reading any of it (the default of GOEP_TIMEOUT).
const DefaultTCPTimeout = 60 * time.Second

func newTCP(ctx context.Context, cfg TCPConfig, ln net.Listener, opt tcpOptions) (_ Group, err error) {
	addr := net.JoinHostPort(cfg.Addr, strconv.Itoa(cfg.Port))
	var srv *tcpServer
	if ln != nil {
		srv = startServer(ln, cfg.Size)
		addr = ln.Addr().String()
		defer func() {
			if err != nil {
				srv.close()
			}
		}()
	}
	conn, err := dialRetry(ctx, cfg.Rank, addr)
	if err != nil {
		return nil, err
	}
	c := &tcpClient{
		rank:       cfg.Rank,
		size:       cfg.Size,
		conn:       conn,
		srv:        srv,
		waiters:    map[roundKey]chan inFrame{},
		notify:     make(chan struct{}),
		lost:       map[int]string{},
		left:       map[int]bool{},
		groupsLeft: map[uint64]int{},
		readerDone: make(chan struct{}),
		hs:         make(chan hsEvent, 8),
	}
	// The peer listener, on the interface that reaches rank 0. Without it
	// this rank advertises no address and the world relays AllToAll.
	var pln net.Listener
	if cfg.Size > 1 && !opt.relay {
		pln, _ = peerListen(conn)
	}
	defer func() {
		if pln != nil {
			pln.Close() // connectMesh closed it already; harmless
		}
	}()
	peerAddr := ""
	if pln != nil {
		peerAddr = pln.Addr().String()
	}
	go c.read()
	if err := c.handshake(ctx, cfg, addr, peerAddr); err != nil {
		conn.Close()
		<-c.readerDone
		return nil, err
	}
	members := make([]int, cfg.Size)
	for r := range members {
		members[r] = r
	}
	g := &tcpGroup{c: c, gid: 0, members: members, rank: cfg.Rank}
	if cfg.Size == 1 {
		c.mesh = newMesh(make([]*peerConn, 1))
		return g, nil
	}
	peers, merr := connectMesh(ctx, pln, cfg.Rank, c.peerAddrs, c.worldID)
	pln = nil
	// Every rank says whether it has all its connections; all must agree
	// to use them (one relayed round, the world's first).
	ok := byte(0)
	if merr == nil {
		ok = 1
	}
	all, err := g.round(ctx, opAllGather, []byte{ok})
	if err == nil {
		var oks [][]byte
		if oks, err = splitChunks(all, cfg.Size); err == nil {
			for _, o := range oks {
				if len(o) != 1 || o[0] != 1 {
					ok = 0
				}
			}
		}
	}
	if err != nil || ok == 0 {
		for _, pc := range peers {
			if pc != nil {
				pc.conn.Close()
			}
		}
	}
	if err != nil {
		conn.Close()
		<-c.readerDone
		return nil, fmt.Errorf("comm: tcp: connect on rank %d: agreeing on direct AllToAll: %w", cfg.Rank, err)
	}
	if ok == 1 {
		c.startMesh(newMesh(peers))
	}
	return g, nil
}

// dialRetry dials addr until it answers or ctx ends.
func dialRetry(ctx context.Context, rank int, addr string) (net.Conn, error) {
	d := net.Dialer{KeepAliveConfig: keepAlive}
	wait := 10 * time.Millisecond
	for {
		conn, err := d.DialContext(ctx, "tcp", addr)
		if err == nil {
			if tc, ok := conn.(*net.TCPConn); ok {
				tc.SetNoDelay(true)
			}
			return conn, nil
		}
		if ctx.Err() != nil {
			if errors.Is(ctx.Err(), context.Canceled) {
				return nil, fmt.Errorf("comm: tcp: rank %d: connect to rank 0 at %s: %w", rank, addr, ctx.Err())
			}
			return nil, &TimeoutError{Op: fmt.Sprintf("connect on rank %d to rank 0 at %s (last error: %v)", rank, addr, err), Missing: []int{0}}
		}
		if testHookDialFailed != nil {
			testHookDialFailed(rank)
		}
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
		}
		wait = min(2*wait, 250*time.Millisecond)
	}
}

// testHookDialFailed, when set (tests), is called with the rank each time
// its dial to rank 0 fails and is to be retried.
var testHookDialFailed func(rank int)

// ctxWriteBound bounds the writes of a collective called with ctx: with a
// deadline, nothing is written past it plus queryGrace (so that a
// collective called with an expired ctx still contributes, then times out
// and asks who is missing); without one, a write goes on as long as the
// other side reads, and fails once it has read nothing for
// DefaultTCPTimeout.
func ctxWriteBound(ctx context.Context) writeBound {
	if d, ok := ctx.Deadline(); ok {
		return writeBound{hard: d.Add(queryGrace)}
	}
	return writeBound{stall: DefaultTCPTimeout}
}

// handshake sends the hello and waits for the welcome (or a refusal). The
// reader goroutine is already running and hands it the frames that arrive
// before the welcome; waiting on a channel rather than on a read deadline
// keeps a frame cut by the deadline from garbling the stream.
func (c *tcpClient) handshake(ctx context.Context, cfg TCPConfig, addr, peerAddr string) error {
	op := fmt.Sprintf("connect on rank %d", cfg.Rank)
	hello := helloMsg{Magic: tcpMagic, Version: tcpVersion, Size: cfg.Size, LocalRank: cfg.LocalRank, LocalSize: cfg.LocalSize, PeerAddr: peerAddr}
	if err := c.send(ctx, frameHeader{Type: fHello, Rank: int32(cfg.Rank)}, hello.encode()); err != nil {
		if isTimeout(err) { // rank 0 accepted the connection but reads nothing
			return &TimeoutError{Op: fmt.Sprintf("%s (the hello to the rendezvous server at %s: %v)", op, addr, err), Missing: []int{0}}
		}
		return &PeerLostError{Op: op, Ranks: []int{0}, Cause: fmt.Sprintf("rendezvous server at %s: %v", addr, err)}
	}
	var query <-chan time.Time // set once the deadline passed and the server was asked
	for {
		select {
		case ev := <-c.hs:
			if ev.err != nil {
				if query != nil {
					return &TimeoutError{Op: op + " (the rendezvous server did not answer)", Missing: []int{0}}
				}
				return &PeerLostError{Op: op, Ranks: []int{0}, Cause: fmt.Sprintf("rendezvous server at %s: %v", addr, ev.err)}
			}
			switch ev.h.Type {
			case fWelcome:
				addrs, err := decodeAddrs(ev.p, cfg.Size)
				if err != nil {
					return fmt.Errorf("comm: tcp: %s: welcome from %s: %w", op, addr, err)
				}
				c.peerAddrs = addrs
				c.worldID = ev.h.Seq
				return nil
			case fReject:
				return fmt.Errorf("comm: tcp: %s: rank 0 at %s refused: %s", op, addr, ev.p)
			case fMissing:
				// The answer to our query, or rank 0 gave up waiting and
				// says for whom.
				missing, err := decodeRanks(ev.p, cfg.Size)
				if err != nil {
					return fmt.Errorf("comm: tcp: %s: from %s: %w", op, addr, err)
				}
				return &TimeoutError{Op: op, Missing: missing}
			case fShutdown:
				return fmt.Errorf("comm: tcp: %s: rank 0 closed the rendezvous before every rank joined: %w", op, ErrClosed)
			}
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.Canceled) {
				return fmt.Errorf("comm: tcp: %s: %w", op, context.Canceled)
			}
			ctx = context.Background() // wait for the answer below, not for ctx
			qctx, cancel := context.WithTimeout(ctx, queryGrace)
			c.send(qctx, frameHeader{Type: fQuery, GID: helloGID, Rank: int32(cfg.Rank)}, nil)
			cancel()
			query = time.After(queryGrace)
		case <-query:
			return &TimeoutError{Op: op + " (the rendezvous server did not answer)", Missing: []int{0}}
		}
	}
}

// tcpClient is one rank's connection to the rendezvous server, shared by the
// world group and every sub-group split from it.
type tcpClient struct {
	rank, size int
	conn       net.Conn
	srv        *tcpServer // rank 0 only
	peerAddrs  []string   // by world rank, from the welcome
	worldID    uint64     // from the welcome
	mesh       *tcpMesh   // direct peer connections; nil: AllToAll is relayed

	wmu sync.Mutex // serialises writes to conn

	mu         sync.Mutex
	waiters    map[roundKey]chan inFrame
	notify     chan struct{}  // closed (and replaced) whenever the state below changes
	lost       map[int]string // world ranks lost, with the cause
	left       map[int]bool   // world ranks that closed the world group
	groupsLeft map[uint64]int // sub-groups a member closed: gid → world rank
	dead       string         // non-empty: the connection to the server broke, why
	deadWrite  bool           // ... because this rank cut it when a write to the server timed out
	shutdown   bool           // rank 0 closed the rendezvous
	closed     bool           // this rank closed the world group
	readerDone chan struct{}
	hs         chan hsEvent // frames before the welcome, for handshake
}

type hsEvent struct {
	h   frameHeader
	p   []byte
	err error
}

type roundKey struct{ gid, seq uint64 }

type inFrame struct {
	h frameHeader
	p []byte
}

// changedLocked wakes everyone waiting on c.notify.
func (c *tcpClient) changedLocked() {
	close(c.notify)
	c.notify = make(chan struct{})
}

// read dispatches the server's frames until the connection ends.
func (c *tcpClient) read() {
	defer close(c.readerDone)
	welcomed := false
	for {
		h, p, err := readFrame(c.conn)
		if err != nil {
			if !welcomed {
				c.toHandshake(hsEvent{err: err})
			}
			c.broken(err.Error(), false)
			return
		}
		if !welcomed {
			switch h.Type {
			case fWelcome, fReject, fMissing, fShutdown:
				welcomed = h.Type == fWelcome
				c.toHandshake(hsEvent{h: h, p: p})
				continue
			}
		}
		c.mu.Lock()
		switch h.Type {
		case fResult, fFail, fMissing:
			if ch := c.waiters[roundKey{h.GID, h.Seq}]; ch != nil {
				select {
				case ch <- inFrame{h, p}:
				default:
				}
			}
		case fLost:
			if r := int(h.Rank); r >= 0 && r < c.size {
				c.lost[r] = string(p)
				c.changedLocked()
			}
		case fClosed:
			if r := int(h.Rank); r >= 0 && r < c.size {
				c.left[r] = true
				c.changedLocked()
			}
		case fGroupClosed:
			c.groupsLeft[h.GID] = int(h.Rank)
			c.changedLocked()
		case fShutdown:
			c.shutdown = true
			c.changedLocked()
		default:
			c.mu.Unlock()
			c.broken(fmt.Sprintf("unexpected %s frame", h.Type), false)
			c.conn.Close()
			return
		}
		c.mu.Unlock()
	}
}

// toHandshake passes a frame to handshake, which may have returned already.
func (c *tcpClient) toHandshake(ev hsEvent) {
	select {
	case c.hs <- ev:
	default:
	}
}

// broken records that the connection to the server is gone; timedOut
// says that this rank cut it because a write to the server timed out.
func (c *tcpClient) broken(cause string, timedOut bool) {
	c.mu.Lock()
	if c.dead == "" {
		c.dead = cause
		c.deadWrite = timedOut
		c.changedLocked()
	}
	c.mu.Unlock()
}

// send writes one frame to the server, within ctxWriteBound(ctx). A failed
// write may have left half a frame on the wire, so it ends the connection.
func (c *tcpClient) send(ctx context.Context, h frameHeader, p []byte) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	b := ctxWriteBound(ctx)
	err := writeFrameBy(c.conn, h, p, func() error { return c.conn.SetWriteDeadline(b.next()) })
	if err != nil {
		c.broken("write: "+err.Error(), isTimeout(err))
		c.conn.Close()
	}
	return err
}

// tcpGroup is one rank's view of a group (the world or a sub-group).
// Like every Group, it must be used by one goroutine at a time.
type tcpGroup struct {
	c       *tcpClient
	gid     uint64
	members []int // world ranks, by group rank
	rank    int   // index in members
	seq     uint64
	closed  bool // guarded by c.mu
}

func (g *tcpGroup) Rank() int { return g.rank }
func (g *tcpGroup) Size() int { return len(g.members) }

// groupRank is world rank w's rank in g, or -1.
func (g *tcpGroup) groupRank(w int) int {
	if g.gid == 0 {
		return w
	}
	return slices.Index(g.members, w)
}

// check says why g can no longer run collectives, if it cannot.
func (g *tcpGroup) check(op string) error {
	c := g.c
	c.mu.Lock()
	defer c.mu.Unlock()
	return g.checkLocked(op)
}

func (g *tcpGroup) checkLocked(op string) error {
	c := g.c
	if c.closed || g.closed {
		return fmt.Errorf("comm: %s on rank %d: this rank closed the group: %w", op, g.rank, ErrClosed)
	}
	var lost []int
	var causes []string
	for i, w := range g.members {
		if cause, ok := c.lost[w]; ok {
			lost = append(lost, i)
			causes = append(causes, fmt.Sprintf("rank %d: %s", i, cause))
		}
	}
	if len(lost) > 0 {
		return &PeerLostError{Op: fmt.Sprintf("%s on rank %d", op, g.rank), Ranks: lost, Cause: strings.Join(causes, "; ")}
	}
	for i, w := range g.members {
		if c.left[w] {
			return fmt.Errorf("comm: %s on rank %d: rank %d closed the group: %w", op, g.rank, i, ErrClosed)
		}
	}
	if w, ok := c.groupsLeft[g.gid]; ok {
		return fmt.Errorf("comm: %s on rank %d: rank %d closed the group: %w", op, g.rank, g.groupRank(w), ErrClosed)
	}
	if c.dead != "" {
		if c.shutdown {
			return fmt.Errorf("comm: %s on rank %d: rank 0 closed the rendezvous: %w", op, g.rank, ErrClosed)
		}
		if c.deadWrite {
			// Rank 0 was slow to read, which is not evidence that it died:
			// a timeout, though this rank has given up the connection.
			return &TimeoutError{Op: fmt.Sprintf("%s on rank %d (a write to the rendezvous server, world rank 0, timed out and this rank closed the connection: %s)",
				op, g.rank, c.dead), Missing: g.rank0()}
		}
		return &PeerLostError{Op: fmt.Sprintf("%s on rank %d", op, g.rank), Ranks: g.rank0(),
			Cause: "connection to the rendezvous server (world rank 0) broke: " + c.dead}
	}
	return nil
}

// testHookBeforeContrib, when set (tests), runs in round after the checks
// and before the contribution is sent.
var testHookBeforeContrib func(*tcpGroup)

// round runs one relayed collective: contribute p to round (gid, seq) and
// wait for this member's share of the result.
func (g *tcpGroup) round(ctx context.Context, op tcpOp, p []byte) ([]byte, error) {
	c := g.c
	name := op.String()
	seq := g.seq
	g.seq++
	key := roundKey{g.gid, seq}
	ch := make(chan inFrame, 2)
	c.mu.Lock()
	if err := g.checkLocked(name); err != nil {
		c.mu.Unlock()
		return nil, err
	}
	c.waiters[key] = ch
	// notify is taken with the check, under one lock: news that comes
	// after the check (a peer lost before the server saw this round, which
	// the server then drops) closes this channel, so it cannot be missed.
	notify := c.notify
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		delete(c.waiters, key)
		c.mu.Unlock()
	}()

	if testHookBeforeContrib != nil {
		testHookBeforeContrib(g)
	}
	h := frameHeader{Type: fContrib, Op: op, GID: g.gid, Seq: seq, Rank: int32(g.rank)}
	if limit := frameLimit(); len(p) > limit {
		// Too large for a frame: the round fails on every member with
		// this reason (the server answers fFail), the connection intact.
		h.Type = fAbandon
		p = fmt.Appendf(nil, "its %s contribution is %d bytes, more than the %d-byte frame limit", name, len(p), limit)
	}
	if err := c.send(ctx, h, p); err != nil {
		if err := g.check(name); err != nil {
			return nil, err
		}
		return nil, &PeerLostError{Op: fmt.Sprintf("%s on rank %d", name, g.rank), Ranks: g.rank0(),
			Cause: "write to the rendezvous server (world rank 0): " + err.Error()}
	}
	timeout := func(missing []int, note string) error {
		return &TimeoutError{Op: fmt.Sprintf("%s on rank %d%s", name, g.rank, note), Missing: missing}
	}
	// answer turns the server's reply into the result.
	answer := func(f inFrame) ([]byte, error) {
		switch f.h.Type {
		case fResult:
			return f.p, nil
		case fMissing:
			missing, err := decodeRanks(f.p, len(g.members))
			if err != nil {
				return nil, timeout(g.rank0(), fmt.Sprintf(" (bad answer from the rendezvous server: %v)", err))
			}
			return nil, timeout(missing, "")
		}
		return nil, fmt.Errorf("comm: %s on rank %d: %s", name, g.rank, f.p)
	}
	var query <-chan time.Time // set once the deadline passed and the server was asked
	for {
		select {
		case f := <-ch:
			return answer(f)
		case <-notify:
			select {
			case f := <-ch: // a reply that came before the news wins
				return answer(f)
			default:
			}
			c.mu.Lock()
			err := g.checkLocked(name)
			notify = c.notify
			c.mu.Unlock()
			if err != nil {
				return nil, err
			}
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.Canceled) {
				return nil, fmt.Errorf("comm: %s on rank %d: %w", name, g.rank, context.Canceled)
			}
			ctx = context.Background() // wait for the answer below, not for ctx
			qctx, cancel := context.WithTimeout(ctx, queryGrace)
			err := c.send(qctx, frameHeader{Type: fQuery, GID: g.gid, Seq: seq, Rank: int32(g.rank)}, nil)
			cancel()
			if err != nil {
				return nil, timeout(g.rank0(), " (the rendezvous server did not answer)")
			}
			query = time.After(queryGrace)
		case <-query:
			return nil, timeout(g.rank0(), " (the rendezvous server did not answer)")
		}
	}
}

// rank0 is the group rank of world rank 0 as a list, or nil if it is not a
// member.
func (g *tcpGroup) rank0() []int {
	if r := g.groupRank(0); r >= 0 {
		return []int{r}
	}
	return nil
}

func (g *tcpGroup) AllGather(ctx context.Context, data []byte) ([][]byte, error) {
	p, err := g.round(ctx, opAllGather, data)
	if err != nil {
		return nil, err
	}
	all, err := splitChunks(p, len(g.members))
	if err != nil {
		return nil, fmt.Errorf("comm: allgather on rank %d: result: %w", g.rank, err)
	}
	return all, nil
}

// AllToAll sends send[p] to rank p over the direct peer connections, or
// through rank 0 where the world could not build them (see NewTCP).
func (g *tcpGroup) AllToAll(ctx context.Context, send [][]byte) ([][]byte, error) {
	if len(send) != len(g.members) {
		return nil, fmt.Errorf("comm: alltoall on rank %d: %d buffers for %d ranks", g.rank, len(send), len(g.members))
	}
	if g.c.mesh != nil {
		return g.allToAllDirect(ctx, send)
	}
	return g.allToAllRelay(ctx, send)
}

// allToAllRelay is AllToAll through rank 0's relay.
func (g *tcpGroup) allToAllRelay(ctx context.Context, send [][]byte) ([][]byte, error) {
	if len(send) != len(g.members) {
		return nil, fmt.Errorf("comm: alltoall on rank %d: %d buffers for %d ranks", g.rank, len(send), len(g.members))
	}
	p, err := g.round(ctx, opAllToAll, appendChunks(make([]byte, 0, chunksLen(send)), send))
	if err != nil {
		return nil, err
	}
	all, err := splitChunks(p, len(g.members))
	if err != nil {
		return nil, fmt.Errorf("comm: alltoall on rank %d: result: %w", g.rank, err)
	}
	return all, nil
}

func (g *tcpGroup) Broadcast(ctx context.Context, root int, data []byte) ([]byte, error) {
	if root < 0 || root >= len(g.members) {
		return nil, fmt.Errorf("comm: broadcast root %d out of range [0, %d)", root, len(g.members))
	}
	p := binary.LittleEndian.AppendUint32(nil, uint32(root))
	if g.rank == root {
		p = append(p, data...)
	}
	out, err := g.round(ctx, opBroadcast, p)
	if err != nil {
		return nil, err
	}
	return out, nil
}

func (g *tcpGroup) Barrier(ctx context.Context) error {
	_, err := g.round(ctx, opBarrier, nil)
	return err
}

func (g *tcpGroup) Split(ctx context.Context, color, key int) (Group, error) {
	var b [16]byte
	binary.LittleEndian.PutUint64(b[:], uint64(int64(color)))
	binary.LittleEndian.PutUint64(b[8:], uint64(int64(key)))
	p, err := g.round(ctx, opSplit, b[:])
	if err != nil {
		return nil, err
	}
	r, err := decodeSplitReply(p, g.c.size)
	if err != nil {
		return nil, fmt.Errorf("comm: split on rank %d: result: %w", g.rank, err)
	}
	if r.GID == 0 || r.Members[r.Index] != g.members[g.rank] {
		return nil, fmt.Errorf("comm: split on rank %d: result places world rank %d at index %d", g.rank, r.Members[r.Index], r.Index)
	}
	return &tcpGroup{c: g.c, gid: r.GID, members: r.Members, rank: r.Index}, nil
}

// Close releases the group. Closing a sub-group tells its other members
// (their collectives on it return ErrClosed); closing the world group
// closes this rank's connections (to the server and to its peers, each
// with a bye) and every sub-group with it, and on rank 0 stops the
// rendezvous server.
func (g *tcpGroup) Close() error {
	c := g.c
	if g.gid != 0 {
		c.mu.Lock()
		if g.closed || c.closed {
			c.mu.Unlock()
			return nil
		}
		g.closed = true
		c.meshGroupClosedLocked(g.gid)
		c.changedLocked()
		c.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), queryGrace)
		defer cancel()
		// Best effort, both: the peers hear it on their peer connections,
		// behind any part this rank sent them, and from the server.
		g.meshGroupBye(ctx)
		c.send(ctx, frameHeader{Type: fGroupBye, GID: g.gid, Rank: int32(g.rank)}, nil)
		return nil
	}
	return c.close()
}

func (c *tcpClient) close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	c.changedLocked()
	c.mu.Unlock()
	c.closeMesh(true)
	ctx, cancel := context.WithTimeout(context.Background(), queryGrace)
	defer cancel()
	c.send(ctx, frameHeader{Type: fBye, Rank: int32(c.rank)}, nil) // best effort: the server may be gone
	err := c.conn.Close()
	<-c.readerDone
	if c.srv != nil {
		c.srv.close()
	}
	if err != nil && !errors.Is(err, net.ErrClosed) {
		return fmt.Errorf("comm: tcp: close on rank %d: %w", c.rank, err)
	}
	return nil
}

// kill cuts this rank off the way a killed process would be: no bye, the
// connection (and on rank 0 the server) closed at once. For tests.
func (g *tcpGroup) kill() {
	c := g.c
	c.mu.Lock()
	c.closed = true
	c.changedLocked()
	c.mu.Unlock()
	c.closeMesh(false)
	if c.srv != nil {
		c.srv.kill()
	}
	c.conn.Close()
	<-c.readerDone
}
