package comm

import (
	"context"
	"crypto/hmac"
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

	"go.uber.org/zap"
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
	// Secret is the world secret (GOEP_WORLD_SECRET), the same on every
	// rank and known to no other process: the rendezvous and the peer
	// connections admit only a connection that proves it holds it, by an
	// HMAC of a nonce the other side chose, so it never crosses the wire.
	// At least 16 bytes; required when Size > 1 (a single rank with none
	// gets a random one). NewWorldSecret makes one.
	Secret string
	// Log receives the rendezvous's warnings (a connection refused because
	// it did not prove itself a rank of this world); nil: none.
	Log *zap.Logger
	// Departures, when not nil, carries news from this rank's launcher of
	// ranks whose process ended. Until every rank has joined, such news
	// makes NewTCP fail at once on this rank with a *PeerLostError naming
	// that rank (rank 0 then tells the ranks that joined, which fail the
	// same way): a rank that exits before it joins cannot hang the world.
	// Later news is not read: once the world has formed, the group sees a
	// departure itself.
	Departures <-chan Departure
}

// Departure is a launcher's news that world rank Rank's process ended:
// Cause says how ("exited with status 0").
type Departure struct {
	Rank  int
	Cause string
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
	case c.Secret == "" && c.Size > 1:
		return fmt.Errorf("comm: tcp: no world secret for a world of %d ranks: set the same GOEP_WORLD_SECRET (at least %d bytes, e.g. `openssl rand -hex 32`) on every rank (eprun launch sets one), so that no other process can join the world", c.Size, minSecretLen)
	case c.Secret != "" && len(c.Secret) < minSecretLen:
		return fmt.Errorf("comm: tcp: world secret of %d bytes: want at least %d", len(c.Secret), minSecretLen)
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
//	GOEP_WORLD_SECRET  the world secret, at least 16 bytes (TCPConfig.Secret)
//
// If RANK and WORLD_SIZE are both unset, the process is a single rank and
// the result is {Addr: "127.0.0.1", Port: 0, Rank: 0, Size: 1, LocalRank: 0,
// LocalSize: 1} (the master variables, if set, are still checked). Otherwise
// every variable but the LOCAL pair is required (GOEP_WORLD_SECRET when
// WORLD_SIZE > 1), the LOCAL pair is set together or not at all, and a
// missing or invalid value is an error that names the variable and, except
// the secret's, the value; nothing falls back silently.
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
	secret, haveSecret := lookup("GOEP_WORLD_SECRET")
	switch {
	case haveSecret && len(secret) < minSecretLen:
		return c, fmt.Errorf("comm: GOEP_WORLD_SECRET of %d bytes: want at least %d (e.g. `openssl rand -hex 32`, the same on every rank)", len(secret), minSecretLen)
	case !haveSecret && size > 1:
		return c, fmt.Errorf("comm: GOEP_WORLD_SECRET is not set: a world of %d ranks needs the same secret of at least %d bytes on every rank (e.g. `export GOEP_WORLD_SECRET=$(openssl rand -hex 32)` where they are started; eprun launch sets one), so that no other process can join it", size, minSecretLen)
	}
	c.Secret = secret
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
// not by the deadline, it returns a *TimeoutError naming them; if the
// launcher reports one gone first (cfg.Departures), a *PeerLostError naming
// it.
//
// Only the world's own ranks are admitted: every connection, to the
// rendezvous and between peers, proves that it holds cfg.Secret with an
// HMAC of a nonce the other side chose, and the other side proves it back
// (the secret itself never crosses the wire). A connection that does not
// prove itself within a few seconds, sends anything but a small hello, or
// proves the wrong secret is closed alone, with a warning on cfg.Log: a
// stray or hostile process on the host cannot join, claim a rank, abort
// the forming world or inject a frame, and holds at most a few KiB of
// rank 0's memory until it is closed. A proven rank whose Size disagrees
// with rank 0's, a rank outside [0, Size) and a rank that joins twice are
// ranks of this world started wrong: they make every waiting rank return
// an error. A rank whose secret differs from rank 0's is refused, saying
// so.
//
// cfg.Port 0 is allowed only for a single rank (nobody else could find
// rank 0); tests and launchers that want a free port should open the
// listener themselves and call NewTCPWithListener on rank 0.
//
// AllToAll goes over direct peer connections, one per pair of ranks, built
// eagerly by NewTCP: each rank listens on an ephemeral port of the interface
// it reaches rank 0 through (loopback when rank 0 is 127.0.0.1) and
// advertises it in its hello; once every rank has joined, rank i dials every
// rank j > i and accepts every j < i, each connection opened by a
// challenge and hellos that name both ranks and the world id from the
// welcome and prove the secret (anything else is closed), and the listener
// is closed. The ranks then agree, in one relayed
// round, whether every rank got every connection within min(ctx's
// deadline, 10 s); if any did not (a firewall, an address the peers cannot
// route to, a failed listen), every rank closes its peer connections and
// AllToAll is relayed through rank 0 like the other collectives: correct,
// but every byte crosses rank 0 twice. NewTCP says which happened only on
// cfg.Log (info); the result is the same either way. The world
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
	if cfg.Secret == "" {
		cfg.Secret = NewWorldSecret() // a single rank (Validate): nobody else needs to know it
	}
	log := cfg.Log
	if log == nil {
		log = zap.NewNop()
	}
	log = log.Named("comm.tcp")
	addr := net.JoinHostPort(cfg.Addr, strconv.Itoa(cfg.Port))
	var srv *tcpServer
	if ln != nil {
		srv = startServer(ln, cfg.Size, cfg.Secret, log)
		addr = ln.Addr().String()
		defer func() {
			if err != nil {
				srv.close()
			}
		}()
	}
	conn, err := dialRetry(ctx, cfg, addr)
	if err != nil {
		return nil, err
	}
	c := &tcpClient{
		rank:       cfg.Rank,
		size:       cfg.Size,
		secret:     cfg.Secret,
		addr:       addr,
		log:        log,
		conn:       conn,
		srv:        srv,
		waiters:    map[roundKey]chan inFrame{},
		notify:     make(chan struct{}),
		lost:       map[int]string{},
		left:       map[int]bool{},
		groupsLeft: map[uint64]int{},
		abortDone:  make(chan struct{}),
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
	c.hello = helloMsg{Magic: tcpMagic, Version: tcpVersion, Size: cfg.Size, LocalRank: cfg.LocalRank, LocalSize: cfg.LocalSize}
	if pln != nil {
		c.hello.PeerAddr = pln.Addr().String()
	}
	go c.read()
	if err := c.handshake(ctx, cfg); err != nil {
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
	peers, merr := connectMesh(ctx, pln, meshAuth{me: cfg.Rank, size: cfg.Size, worldID: c.worldID, secret: cfg.Secret, log: log}, c.peerAddrs)
	pln = nil
	// Every rank says whether it has all its connections; all must agree
	// to use them (one relayed round, the world's first).
	ok := byte(0)
	if merr == nil {
		ok = 1
	} else {
		log.Info("no direct peer connections: AllToAll goes through rank 0", zap.Int("rank", cfg.Rank), zap.Error(merr))
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

// dialRetry dials addr until it answers, ctx ends or cfg.Departures
// reports a rank gone (then a *PeerLostError names it).
func dialRetry(ctx context.Context, cfg TCPConfig, addr string) (net.Conn, error) {
	rank := cfg.Rank
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
		case dep := <-cfg.Departures:
			t.Stop()
			if err := departed(cfg, dep); err != nil {
				return nil, err
			}
		}
		wait = min(2*wait, 250*time.Millisecond)
	}
}

// departed is the error of a join on rank cfg.Rank that its launcher told
// of dep: a *PeerLostError naming the rank gone, or nil for news that
// cannot be about another rank of the world.
func departed(cfg TCPConfig, dep Departure) *PeerLostError {
	if dep.Rank < 0 || dep.Rank >= cfg.Size || dep.Rank == cfg.Rank {
		return nil
	}
	return &PeerLostError{Op: fmt.Sprintf("connect on rank %d", cfg.Rank), Ranks: []int{dep.Rank},
		Cause: dep.Cause + " before every rank joined (told by the launcher)"}
}

// firstDeparture is the launcher's first news of another rank's
// departure, waited for at most queryGrace; nil without a launcher or
// news. A rank whose connection to the rendezvous server broke before the
// welcome asks it: rank 0 may have stopped because an earlier departure
// failed its join, cutting this rank before it could be told, and the
// launcher reports departures in the order they happened, so the first
// news names the cause (rank 0's own exit if it was the first to go).
func firstDeparture(cfg TCPConfig) *PeerLostError {
	if cfg.Departures == nil {
		return nil
	}
	timeout := time.After(queryGrace)
	for {
		select {
		case dep, ok := <-cfg.Departures:
			if !ok {
				return nil
			}
			if err := departed(cfg, dep); err != nil {
				return err
			}
		case <-timeout:
			return nil
		}
	}
}

// testHookHandshakeBroke, when set (tests), is called with the rank when
// its connection to the server breaks before the welcome.
var testHookHandshakeBroke func(rank int)

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

// handshake waits for the reader to prove this rank to the server and
// the server to it (tcpClient.prove), then for the welcome (or a refusal).
// Waiting on a channel rather than on a read deadline keeps a frame cut by
// the deadline from garbling the stream.
func (c *tcpClient) handshake(ctx context.Context, cfg TCPConfig) error {
	op := fmt.Sprintf("connect on rank %d", cfg.Rank)
	addr := c.addr
	proven, expired := false, false
	var query <-chan time.Time // set once the deadline passed (and the server was asked, if it proved itself)
	// lost is the launcher's news of a departure that came before the
	// server proved itself: it is passed on once the proof arrives (the
	// ranks that joined must hear it), or returned at lostBy without.
	var lost *PeerLostError
	var lostBy <-chan time.Time
	tellLost := func(err *PeerLostError) {
		qctx, cancel := context.WithTimeout(context.Background(), queryGrace)
		c.send(qctx, frameHeader{Type: fLost, Rank: int32(err.Ranks[0])}, []byte(err.Cause))
		cancel()
	}
	ask := func() {
		qctx, cancel := context.WithTimeout(context.Background(), queryGrace)
		c.send(qctx, frameHeader{Type: fQuery, GID: helloGID, Rank: int32(cfg.Rank)}, nil)
		cancel()
		query = time.After(queryGrace)
	}
	for {
		select {
		case ev := <-c.hs:
			if ev.err != nil {
				var ae *authError
				switch {
				case errors.As(ev.err, &ae):
					return fmt.Errorf("comm: tcp: %s: %w", op, ev.err)
				case query != nil:
					return &TimeoutError{Op: op + " (the rendezvous server did not answer)", Missing: []int{0}}
				case lost != nil:
					return lost
				}
				if testHookHandshakeBroke != nil {
					testHookHandshakeBroke(cfg.Rank)
				}
				if err := firstDeparture(cfg); err != nil {
					return err
				}
				return &PeerLostError{Op: op, Ranks: []int{0}, Cause: fmt.Sprintf("rendezvous server at %s: %v", addr, ev.err)}
			}
			switch ev.h.Type {
			case fProof:
				proven = true
				if lost != nil {
					tellLost(lost)
					return lost
				}
				if expired { // the proof was on its way: ask now
					ask()
				}
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
			case fLost:
				// A rank that will never join: it aborted, or the launcher
				// told rank 0 it is gone.
				r := int(ev.h.Rank)
				if r < 0 || r >= cfg.Size {
					return fmt.Errorf("comm: tcp: %s: rank 0 at %s reports rank %d lost, outside [0, %d)", op, addr, r, cfg.Size)
				}
				return &PeerLostError{Op: op, Ranks: []int{r}, Cause: string(ev.p)}
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
		case dep := <-cfg.Departures:
			if lost != nil {
				// A later departure (a rank that failed on the first news,
				// say): the first one is the cause.
				return lost
			}
			if err := departed(cfg, dep); err != nil {
				// Rank 0 tells the ranks that joined, so that they fail
				// too, whatever their launcher told them.
				switch {
				case c.srv != nil:
					c.srv.lostBeforeWelcome(dep.Rank, err.Cause)
				case proven:
					tellLost(err)
				default:
					// The server's proof may be on its way: wait for it a
					// little, so that the ranks that joined hear of this.
					lost, lostBy = err, time.After(queryGrace)
					continue
				}
				return err
			}
		case <-lostBy:
			return lost
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.Canceled) {
				return fmt.Errorf("comm: tcp: %s: %w", op, context.Canceled)
			}
			ctx = context.Background() // wait for the answer below, not for ctx
			expired = true
			if proven {
				ask()
			} else {
				// Nothing to ask a server that has not proved itself; its
				// proof may be on its way.
				query = time.After(queryGrace)
			}
		case <-query:
			if !proven {
				return &TimeoutError{Op: fmt.Sprintf("%s (rank 0 at %s did not answer the hello)", op, addr), Missing: []int{0}}
			}
			return &TimeoutError{Op: op + " (the rendezvous server did not answer)", Missing: []int{0}}
		}
	}
}

// authError is a peer's failure to prove the world secret, or to speak
// this protocol: a refusal rather than a lost peer.
type authError struct{ msg string }

func (e *authError) Error() string { return e.msg }

// prove runs this rank's side of the rendezvous handshake: it answers the
// server's challenge with its hello and checks the server's proof. Until
// then it reads at most maxHandshakePayload bytes a frame, so a process
// that is not rank 0 of this world, listening where rank 0 should, cannot
// make it hold more.
func (c *tcpClient) prove() (refusal []byte, err error) {
	h, p, err := readFrameMax(c.conn, maxHandshakePayload, nil)
	if err != nil {
		return nil, err
	}
	switch h.Type {
	case fReject:
		return p, nil
	case fChallenge:
	default:
		return nil, &authError{fmt.Sprintf("%s answered with a %s frame, not a challenge: not a goep rendezvous", c.addr, h.Type)}
	}
	ch, err := decodeChallenge(p)
	if err == nil {
		err = ch.check()
	}
	if err != nil {
		return nil, &authError{fmt.Sprintf("%s is not a goep rendezvous of this version: %v", c.addr, err)}
	}
	hello := c.hello
	hello.Nonce = newNonce()
	hello.MAC = helloMAC(c.secret, ch.Nonce, int32(c.rank), hello)
	if err := c.send(context.Background(), frameHeader{Type: fHello, Rank: int32(c.rank)}, hello.encode()); err != nil {
		return nil, err
	}
	h, p, err = readFrameMax(c.conn, maxHandshakePayload, nil)
	if err != nil {
		return nil, err
	}
	switch h.Type {
	case fReject:
		return p, nil
	case fProof:
	default:
		return nil, &authError{fmt.Sprintf("%s answered the hello with a %s frame, not its proof", c.addr, h.Type)}
	}
	want := serverMAC(c.secret, hello.Nonce, ch.Nonce, int32(c.rank))
	if !hmac.Equal(p, want[:]) {
		return nil, &authError{fmt.Sprintf("the process at %s does not prove the world secret: it is not rank 0 of this world (another job's, or another process on its port), or GOEP_WORLD_SECRET differs between the ranks", c.addr)}
	}
	return nil, nil
}

// tcpClient is one rank's connection to the rendezvous server, shared by the
// world group and every sub-group split from it.
type tcpClient struct {
	rank, size int
	secret     string
	addr       string // rank 0's
	log        *zap.Logger
	hello      helloMsg // the hello's fields (prove adds the nonce and MAC)
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
	aborted    string         // non-empty: this rank aborted the world (Abort), why
	abortDone  chan struct{}  // closed when abort has told the peers and cut the connections
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

// read proves this rank to the server and the server to it, then
// dispatches the server's frames until the connection ends.
func (c *tcpClient) read() {
	defer close(c.readerDone)
	refusal, err := c.prove()
	switch {
	case err != nil:
		c.toHandshake(hsEvent{err: err})
		c.broken(err.Error(), false)
		return
	case refusal != nil:
		c.toHandshake(hsEvent{h: frameHeader{Type: fReject}, p: refusal})
		c.broken("refused: "+string(refusal), false)
		return
	}
	c.toHandshake(hsEvent{h: frameHeader{Type: fProof}})
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
			case fWelcome, fReject, fMissing, fShutdown, fLost:
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
	if c.aborted != "" {
		return fmt.Errorf("comm: %s on rank %d: this rank aborted the group (%s): %w", op, g.rank, c.aborted, ErrAborted)
	}
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
		if g.closed || c.closed || c.aborted != "" {
			// After an abort the peers have heard why; a bye would only
			// race with that notice.
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
	aborted := c.aborted != ""
	c.changedLocked()
	c.mu.Unlock()
	if aborted {
		// A collective fails as soon as the abort is recorded, so Close
		// can come while abort is still telling the peers: a graceful bye
		// sent now could reach a peer before the abort notice and read as
		// a clean exit. Let abort finish; it has cut every connection.
		<-c.abortDone
	} else {
		c.closeMesh(true)
		ctx, cancel := context.WithTimeout(context.Background(), queryGrace)
		defer cancel()
		c.send(ctx, frameHeader{Type: fBye, Rank: int32(c.rank)}, nil) // best effort: the server may be gone
	}
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

func (g *tcpGroup) abort(cause string) { g.c.abort(cause) }

// abortLinger bounds how long an aborting rank waits for its notice to
// reach rank 0 (and, on rank 0, for the server's notices to reach the
// ranks) before it cuts its connections.
const abortLinger = 250 * time.Millisecond

// testHookAbortRecorded, when set (tests), runs in abort once the abort is
// recorded (this rank's calls fail from then on) and before anyone is told.
var testHookAbortRecorded func(*tcpClient)

// abort cuts this rank off the world, telling why (see Abort): rank 0's
// server hears it first, then every connection is cut.
func (c *tcpClient) abort(cause string) {
	c.mu.Lock()
	if c.closed || c.aborted != "" {
		c.mu.Unlock()
		return
	}
	c.aborted = cause
	c.changedLocked()
	c.mu.Unlock()
	defer close(c.abortDone)
	if testHookAbortRecorded != nil {
		testHookAbortRecorded(c)
	}
	c.abortMesh(cause)
	if c.srv != nil {
		c.srv.abortRank0(cause)
	} else if c.wmu.TryLock() { // a large write in flight: no notice, the server sees a lost rank
		c.conn.SetWriteDeadline(time.Now().Add(abortLinger))
		if writeFrame(c.conn, frameHeader{Type: fAbort, Rank: int32(c.rank)}, []byte(cause)) == nil {
			// A FIN behind the notice, not a reset that could destroy it;
			// the server hangs up once it has read both.
			if tc, ok := c.conn.(*net.TCPConn); ok {
				tc.CloseWrite()
			}
			select {
			case <-c.readerDone:
			case <-time.After(abortLinger):
			}
		}
		c.wmu.Unlock()
	}
	c.conn.Close()
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
