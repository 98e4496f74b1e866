package comm

import (
	"crypto/hmac"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
)

// Timeouts of the rendezvous server, which has no caller's context: a
// connection must prove itself within handshakeTimeout (tcp_auth.go), and
// a client must read some of a frame written to it within
// serverWriteTimeout (clients read continuously, so only a stuck or dead
// client trips it; a slow one, however large the frame, does not).
const (
	serverWriteTimeout = 30 * time.Second
	// queryGrace bounds the wait for the server's answer when a collective
	// times out and asks who is missing.
	queryGrace = time.Second
)

// keepAlive finds a peer whose host vanished silently within about 10 s;
// a killed process is seen at once (its kernel resets the connection).
var keepAlive = net.KeepAliveConfig{Enable: true, Idle: 5 * time.Second, Interval: time.Second, Count: 5}

// tcpServer is the rendezvous store and relay that rank 0 runs. It admits
// Size ranks, each proving the world secret (tcp_auth.go), then relays
// every collective round: a round of group G with sequence number S
// completes when every member of G has contributed, and each member gets
// its share of the result. It watches every connection: a read error from
// a rank that did not say bye is a lost peer, announced at once to every
// rank. A connection that does not prove itself is refused alone (a
// warning on log, and refused counts it).
type tcpServer struct {
	ln     net.Listener
	size   int
	secret string
	log    *zap.Logger

	handshake atomic.Int64 // handshakeTimeout when it started; tests lower it
	refused   atomic.Int64 // connections refused before they proved themselves
	held      atomic.Int64 // bytes read and held from connections not yet proven
	peak      atomic.Int64 // the most held at once

	mu       sync.Mutex
	conns    []*srvConn // by world rank: admitted and not yet departed
	all      map[*srvConn]struct{}
	addrs    []string // peer addresses, by world rank
	joined   int
	seen     []bool // by world rank: has said hello (a timeout names the others)
	welcomed bool
	aborted  string // non-empty: the rendezvous failed; every hello is refused with this
	gone     []bool // by world rank, after the welcome
	groups   map[uint64]*srvGroup
	nextGID  uint64
	closed   bool

	wg      sync.WaitGroup // the accept loop and the writers
	readers sync.WaitGroup // serve goroutines (they linger up to queryGrace after a graceful close)
}

type srvGroup struct {
	members []int       // world ranks, by group rank
	index   map[int]int // world rank → group rank
	rounds  map[uint64]*srvRound
	failed  map[uint64]string // rounds that failed, with why
	gone    bool              // a member left: no round completes any more
}

type srvRound struct {
	op      tcpOp
	data    [][]byte
	arrived []bool
	count   int
}

// srvConn is one client connection. Frames to it are queued and written by
// its own goroutine, so that a slow client never blocks the server.
type srvConn struct {
	c      net.Conn
	rank   int  // -1 until admitted
	proven bool // it proved the world secret (guarded by the server's mu)

	mu      sync.Mutex
	queue   []outFrame
	closing bool // close once the queue is written
	wake    chan struct{}
	bye     bool   // the client said bye: its EOF is not a loss
	cut     string // non-empty: the writer closed the connection, why
}

type outFrame struct {
	h frameHeader
	p []byte
}

func startServer(ln net.Listener, size int, secret string, log *zap.Logger) *tcpServer {
	s := &tcpServer{
		ln:     ln,
		size:   size,
		secret: secret,
		log:    log,
		conns:  make([]*srvConn, size),
		all:    map[*srvConn]struct{}{},
		addrs:  make([]string, size),
		gone:   make([]bool, size),
		seen:   make([]bool, size),
		groups: map[uint64]*srvGroup{},
		// GID 0 is the world group; sub-groups count up from 1.
		nextGID: 1,
	}
	s.handshake.Store(int64(handshakeTimeout))
	if testHookServer != nil {
		testHookServer(s)
	}
	s.wg.Add(1)
	go s.accept()
	return s
}

// testHookServer, when set (tests), is called with every rendezvous server
// as it starts.
var testHookServer func(*tcpServer)

func (s *tcpServer) accept() {
	defer s.wg.Done()
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return
		}
		if tc, ok := c.(*net.TCPConn); ok {
			tc.SetKeepAliveConfig(keepAlive)
			tc.SetNoDelay(true)
		}
		sc := &srvConn{c: c, rank: -1, wake: make(chan struct{}, 1)}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			c.Close()
			continue
		}
		s.all[sc] = struct{}{}
		s.wg.Add(1)
		s.readers.Add(1)
		s.mu.Unlock()
		go s.write(sc)
		go s.serve(sc)
	}
}

// send queues a frame for sc's writer.
func (sc *srvConn) send(h frameHeader, p []byte) {
	sc.mu.Lock()
	if !sc.closing {
		sc.queue = append(sc.queue, outFrame{h, p})
	}
	sc.mu.Unlock()
	select {
	case sc.wake <- struct{}{}:
	default:
	}
}

// finish makes sc's writer close the connection once its queue is written.
func (sc *srvConn) finish() {
	sc.mu.Lock()
	sc.closing = true
	sc.mu.Unlock()
	select {
	case sc.wake <- struct{}{}:
	default:
	}
}

// write sends sc's queued frames. Once told to finish, it half-closes the
// connection (FIN, not RST: a reset could destroy frames the client has not
// read yet, such as its refusal) and gives the reader queryGrace to see the
// client hang up; the reader closes the connection.
func (s *tcpServer) write(sc *srvConn) {
	defer s.wg.Done()
	for range sc.wake {
		sc.mu.Lock()
		q, closing := sc.queue, sc.closing
		sc.queue = nil
		sc.mu.Unlock()
		b := writeBound{stall: serverWriteTimeout}
		for _, f := range q {
			if err := writeFrameBy(sc.c, f.h, f.p, func() error { return sc.c.SetWriteDeadline(b.next()) }); err != nil {
				if isTimeout(err) {
					sc.mu.Lock()
					sc.cut = fmt.Sprintf("rank 0 closed its connection: the client read none of a frame for %v (%v)", serverWriteTimeout, err)
					sc.mu.Unlock()
				}
				sc.c.Close() // the reader sees the closed connection
				return
			}
		}
		if closing {
			sc.mu.Lock()
			empty := len(sc.queue) == 0
			sc.mu.Unlock()
			if empty {
				if tc, ok := sc.c.(*net.TCPConn); ok {
					tc.CloseWrite()
				}
				sc.c.SetReadDeadline(time.Now().Add(queryGrace))
				return
			}
		}
	}
}

func (s *tcpServer) serve(sc *srvConn) {
	defer s.readers.Done()
	defer sc.c.Close()
	sc.c.SetReadDeadline(time.Now().Add(time.Duration(s.handshake.Load())))
	nonce := newNonce()
	sc.send(frameHeader{Type: fChallenge, Rank: -1}, challengeMsg{Magic: tcpMagic, Version: tcpVersion, Nonce: nonce}.encode())
	h, m, ok := s.prove(sc, nonce)
	if !ok {
		return
	}
	if !s.admit(sc, h, m) {
		// Refused: let the writer deliver why, and the client hang up.
		for {
			if _, _, err := readFrame(sc.c); err != nil {
				return
			}
		}
	}
	sc.c.SetReadDeadline(time.Time{}) // from now on keepalive watches the peer
	for {
		h, p, err := readFrame(sc.c)
		if err != nil {
			s.depart(sc, err)
			return
		}
		if err := s.handle(sc, h, p); err != nil {
			s.depart(sc, err)
			return
		}
	}
}

// prove reads sc's hello, at most maxHandshakePayload bytes of it, and
// checks its proof of the world secret against nonce, the challenge sent
// to sc. A proven hello is answered with the server's own proof. A
// connection that does not prove itself (garbage, a frame too large,
// nothing before handshakeTimeout, another protocol, a wrong or missing
// secret) is refused alone, logged and counted, and ok is false: the
// rendezvous goes on as if it had never come.
func (s *tcpServer) prove(sc *srvConn, nonce [nonceLen]byte) (h frameHeader, m helloMsg, ok bool) {
	held := 0
	h, p, err := readFrameMax(sc.c, maxHandshakePayload, func(n int) { held = n; s.hold(n) })
	defer s.hold(-held)
	var why, tell string // tell: what the client is told, if anything
	switch {
	case err == io.EOF:
		// Gone without a word (a rank that gave up its join, a port
		// scan): nothing to refuse.
		s.log.Debug("rendezvous: a connection closed before its hello", zap.Stringer("from", sc.c.RemoteAddr()))
		s.mu.Lock()
		delete(s.all, sc)
		s.mu.Unlock()
		sc.finish()
		return h, m, false
	case errors.Is(err, os.ErrDeadlineExceeded):
		why = fmt.Sprintf("no hello within %v", time.Duration(s.handshake.Load()))
	case err != nil:
		why = "no hello: " + err.Error()
	case h.Type != fHello:
		why = fmt.Sprintf("a %s frame instead of a hello", h.Type)
	default:
		m, err = decodeHello(p)
		switch {
		case err != nil:
			why = "bad hello: " + err.Error()
		case m.Magic != tcpMagic || m.Version != tcpVersion:
			why = fmt.Sprintf("it speaks protocol %#x version %d, rank 0 speaks %#x version %d", m.Magic, m.Version, uint32(tcpMagic), tcpVersion)
			tell = why
		default:
			want := helloMAC(s.secret, nonce, h.Rank, m)
			if !hmac.Equal(m.MAC[:], want[:]) {
				why = fmt.Sprintf("its hello as rank %d does not prove the world secret", h.Rank)
				tell = "its hello does not prove the world secret: GOEP_WORLD_SECRET (TCPConfig.Secret) differs from rank 0's"
			}
		}
	}
	if why != "" {
		s.refuse(sc, why, tell)
		return h, m, false
	}
	s.mu.Lock()
	sc.proven = true
	s.mu.Unlock()
	proof := serverMAC(s.secret, m.Nonce, nonce, h.Rank)
	sc.send(frameHeader{Type: fProof, Rank: h.Rank}, proof[:])
	return h, m, true
}

// refuse ends a connection that did not prove itself: it is counted,
// logged, told tell (if not empty) and closed; nothing else changes.
func (s *tcpServer) refuse(sc *srvConn, why, tell string) {
	s.mu.Lock()
	delete(s.all, sc)
	closed := s.closed
	s.mu.Unlock()
	if closed { // the server closed the connection: nothing to refuse
		sc.finish()
		return
	}
	s.refused.Add(1)
	s.log.Warn("rendezvous: refused a connection that did not prove itself a rank of this world",
		zap.Stringer("from", sc.c.RemoteAddr()), zap.String("why", why))
	if tell == "" {
		sc.finish()
		return
	}
	reject(sc, tell)
	// Let the writer deliver it and the client hang up (the writer sets a
	// read deadline once it is written); what the client still sends is
	// read and dropped, never held.
	io.Copy(io.Discard, sc.c)
}

// hold counts n more bytes held from connections not yet proven (n < 0:
// released).
func (s *tcpServer) hold(n int) {
	now := s.held.Add(int64(n))
	for {
		p := s.peak.Load()
		if now <= p || s.peak.CompareAndSwap(p, now) {
			return
		}
	}
}

func reject(sc *srvConn, msg string) {
	sc.send(frameHeader{Type: fReject}, []byte(msg))
	sc.finish()
}

// lostBeforeWelcome fails the rendezvous because world rank r will never
// join (it aborted, or its launcher saw its process end): every admitted
// rank is told that r is lost, with cause, and every later hello is
// refused saying so. It does nothing once every rank has joined.
func (s *tcpServer) lostBeforeWelcome(r int, cause string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lostBeforeWelcomeLocked(r, cause)
}

func (s *tcpServer) lostBeforeWelcomeLocked(r int, cause string) {
	if s.welcomed || s.aborted != "" {
		return
	}
	s.aborted = fmt.Sprintf("rendezvous aborted: rank %d will not join: %s", r, cause)
	for w, o := range s.conns {
		if o != nil {
			o.send(frameHeader{Type: fLost, Rank: int32(r)}, []byte(cause))
			o.finish()
			delete(s.all, o)
			s.conns[w] = nil
		}
	}
	s.joined = 0
}

// admit checks a proven hello. Before the welcome, a mismatch (size, rank
// range, duplicate rank) aborts the whole rendezvous so that every rank
// returns an error: it comes from a process that holds the world secret, a
// rank of this world started wrong; after it, only the offender is
// refused.
func (s *tcpServer) admit(sc *srvConn, h frameHeader, m helloMsg) bool {
	rank := int(h.Rank)
	s.mu.Lock()
	defer s.mu.Unlock()
	var msg string
	switch {
	case s.closed:
		msg = "the rendezvous server on rank 0 is closing"
	case s.aborted != "":
		msg = s.aborted
	case m.Size != s.size:
		msg = fmt.Sprintf("rank %d has world size %d but rank 0 has %d", rank, m.Size, s.size)
	case rank < 0 || rank >= s.size:
		msg = fmt.Sprintf("rank %d is outside [0, %d)", rank, s.size)
	case s.conns[rank] != nil || s.gone[rank]:
		msg = fmt.Sprintf("rank %d joined twice (from %s, and before from another connection)", rank, sc.c.RemoteAddr())
	}
	if msg != "" {
		delete(s.all, sc)
		reject(sc, msg)
		if !s.welcomed && s.aborted == "" {
			s.aborted = "rendezvous aborted: " + msg
			for r, o := range s.conns {
				if o != nil {
					reject(o, s.aborted)
					delete(s.all, o)
					s.conns[r] = nil
				}
			}
			s.joined = 0
		}
		return false
	}
	sc.rank = rank
	s.conns[rank] = sc
	s.seen[rank] = true
	s.addrs[rank] = m.PeerAddr
	s.joined++
	if s.joined == s.size && !s.welcomed {
		s.welcomed = true
		members := make([]int, s.size)
		index := make(map[int]int, s.size)
		for r := range members {
			members[r] = r
			index[r] = r
		}
		s.groups[0] = &srvGroup{members: members, index: index, rounds: map[uint64]*srvRound{}, failed: map[uint64]string{}}
		// The world id tags the direct peer connections, so that a rank
		// never takes a connection from another world for one of its own.
		w, id := encodeAddrs(s.addrs), rand.Uint64()|1
		for _, o := range s.conns {
			o.send(frameHeader{Type: fWelcome, Seq: id}, w)
		}
	}
	return true
}

// depart handles the end of an admitted connection: a bye before it makes
// the rank closed, anything else lost.
func (s *tcpServer) depart(sc *srvConn, cause error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.all, sc)
	sc.finish()
	r := sc.rank
	if s.conns[r] != sc {
		return // already departed (bye) or refused
	}
	s.conns[r] = nil
	if !s.welcomed {
		s.joined-- // it may come back
		return
	}
	why := cause.Error()
	sc.mu.Lock()
	if sc.cut != "" {
		why = sc.cut
	}
	sc.mu.Unlock()
	s.goneLocked(r, !sc.bye, why)
}

// goneLocked records that world rank r left (lost or closed), stops every
// group it is in and tells every remaining rank.
func (s *tcpServer) goneLocked(r int, lost bool, cause string) {
	if s.gone[r] {
		return
	}
	s.gone[r] = true
	for _, g := range s.groups {
		if _, ok := g.index[r]; ok {
			g.gone = true
			g.rounds = nil
		}
	}
	t, p := fClosed, []byte(nil)
	if lost {
		t, p = fLost, []byte(cause)
	}
	for _, o := range s.conns {
		if o != nil {
			o.send(frameHeader{Type: t, Rank: int32(r)}, p)
		}
	}
	if !slices.Contains(s.gone, false) {
		s.closeLocked()
	}
}

// handle processes one frame from an admitted rank. An error ends the
// connection (a protocol violation is treated like a lost peer).
func (s *tcpServer) handle(sc *srvConn, h frameHeader, p []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch h.Type {
	case fQuery:
		if h.GID == helloGID {
			sc.send(frameHeader{Type: fMissing, GID: h.GID}, appendRanks(nil, s.unseenLocked()))
			return nil
		}
		var missing []int
		if g := s.groups[h.GID]; g != nil {
			if rd := g.rounds[h.Seq]; rd != nil {
				for i, ok := range rd.arrived {
					if !ok {
						missing = append(missing, i)
					}
				}
			}
		}
		sc.send(frameHeader{Type: fMissing, GID: h.GID, Seq: h.Seq}, appendRanks(nil, missing))
		return nil
	case fContrib:
		if !s.welcomed {
			return fmt.Errorf("rank %d sent a contribution before the welcome", sc.rank)
		}
		s.contribLocked(sc, h, p, "")
		return nil
	case fAbandon:
		if !s.welcomed {
			return fmt.Errorf("rank %d abandoned a round before the welcome", sc.rank)
		}
		s.contribLocked(sc, h, nil, fmt.Sprintf("rank %d cannot take part in collective %d: %s", sc.rank, h.Seq, p))
		return nil
	case fLost:
		// This rank's launcher says world rank h.Rank is gone: before the
		// welcome, it will never join.
		if r := int(h.Rank); r >= 0 && r < s.size && r != sc.rank {
			s.lostBeforeWelcomeLocked(r, string(p))
		}
		return nil
	case fAbort:
		// The rank is about to exit: a lost peer, with its reason.
		cause := "aborted: " + string(p)
		if s.conns[sc.rank] == sc {
			s.conns[sc.rank] = nil
			if s.welcomed {
				s.goneLocked(sc.rank, true, cause)
			} else {
				s.lostBeforeWelcomeLocked(sc.rank, cause)
			}
		}
		if sc.rank == 0 {
			s.closeLocked()
		}
		return nil
	case fBye:
		sc.bye = true
		if s.conns[sc.rank] == sc && s.welcomed {
			s.conns[sc.rank] = nil
			s.goneLocked(sc.rank, false, "")
		}
		if sc.rank == 0 {
			s.closeLocked()
		}
		return nil
	case fGroupBye:
		g := s.groups[h.GID]
		if g == nil || h.GID == 0 {
			return nil
		}
		if _, ok := g.index[sc.rank]; !ok {
			return nil
		}
		if !g.gone {
			g.gone = true
			g.rounds = nil
			for _, w := range g.members {
				if o := s.conns[w]; o != nil && w != sc.rank {
					o.send(frameHeader{Type: fGroupClosed, GID: h.GID, Rank: int32(sc.rank)}, nil)
				}
			}
		}
		return nil
	}
	return fmt.Errorf("rank %d sent an unexpected %s frame", sc.rank, h.Type)
}

// contribLocked takes member sc's contribution p to round (h.GID, h.Seq),
// or, when abandon is set, its report that it cannot take part: the round
// then fails on every member with that message.
func (s *tcpServer) contribLocked(sc *srvConn, h frameHeader, p []byte, abandon string) {
	reply := func(t frameType, p []byte) {
		sc.send(frameHeader{Type: t, Op: h.Op, GID: h.GID, Seq: h.Seq}, p)
	}
	g := s.groups[h.GID]
	if g == nil {
		reply(fFail, fmt.Appendf(nil, "unknown group %d", h.GID))
		return
	}
	me, ok := g.index[sc.rank]
	if !ok {
		reply(fFail, fmt.Appendf(nil, "world rank %d is not in group %d", sc.rank, h.GID))
		return
	}
	if msg, ok := g.failed[h.Seq]; ok {
		reply(fFail, []byte(msg))
		return
	}
	if g.gone {
		return // every member has been (or is being) told who left
	}
	n := len(g.members)
	rd := g.rounds[h.Seq]
	if rd == nil {
		rd = &srvRound{op: h.Op, data: make([][]byte, n), arrived: make([]bool, n)}
		g.rounds[h.Seq] = rd
	}
	var msg string
	switch {
	case abandon != "":
		msg = abandon
	case rd.arrived[me]:
		msg = fmt.Sprintf("rank %d contributed twice to round %d", me, h.Seq)
	case rd.op != h.Op:
		first := slices.Index(rd.arrived, true)
		msg = fmt.Sprintf("collective %d: rank %d called %s but rank %d called %s (every rank must call the same collectives in the same order)",
			h.Seq, me, h.Op, first, rd.op)
	default:
		msg = checkContrib(h.Op, p, n)
	}
	if msg == "" && h.Op == opBroadcast {
		if first := slices.Index(rd.arrived, true); first >= 0 {
			r0, r1 := binary.LittleEndian.Uint32(rd.data[first]), binary.LittleEndian.Uint32(p)
			if r0 != r1 {
				msg = fmt.Sprintf("broadcast %d: rank %d names root %d but rank %d names root %d", h.Seq, me, r1, first, r0)
			}
		}
	}
	if msg != "" {
		g.failed[h.Seq] = msg
		delete(g.rounds, h.Seq)
		reply(fFail, []byte(msg))
		for i, ok := range rd.arrived {
			if ok {
				s.conns[g.members[i]].send(frameHeader{Type: fFail, Op: h.Op, GID: h.GID, Seq: h.Seq}, []byte(msg))
			}
		}
		return
	}
	rd.data[me] = p
	rd.arrived[me] = true
	rd.count++
	if rd.count < n {
		return
	}
	delete(g.rounds, h.Seq)
	replies := s.completeLocked(g, rd)
	for i, r := range replies {
		if limit := frameLimit(); len(r) > limit {
			// Every member is told, and every connection stays usable.
			msg := fmt.Sprintf("collective %d (%s): the result for rank %d is %d bytes, more than the %d-byte frame limit",
				h.Seq, h.Op, i, len(r), limit)
			g.failed[h.Seq] = msg
			for _, w := range g.members {
				s.conns[w].send(frameHeader{Type: fFail, Op: h.Op, GID: h.GID, Seq: h.Seq}, []byte(msg))
			}
			return
		}
	}
	for i, w := range g.members {
		s.conns[w].send(frameHeader{Type: fResult, Op: h.Op, GID: h.GID, Seq: h.Seq}, replies[i])
	}
}

// checkContrib validates a contribution's payload for its op; "" if fine.
func checkContrib(op tcpOp, p []byte, n int) string {
	switch op {
	case opBroadcast:
		if len(p) < 4 || int(binary.LittleEndian.Uint32(p)) >= n {
			return fmt.Sprintf("bad broadcast contribution of %d bytes", len(p))
		}
	case opBarrier:
		if len(p) != 0 {
			return "barrier contribution carries data"
		}
	case opAllToAll:
		if _, err := splitChunks(p, n); err != nil {
			return fmt.Sprintf("bad alltoall contribution: %v", err)
		}
	case opSplit:
		if len(p) != 16 {
			return fmt.Sprintf("split contribution of %d bytes, want 16", len(p))
		}
	case opAllGather:
	default:
		return fmt.Sprintf("unknown collective %d", op)
	}
	return ""
}

// completeLocked computes every member's reply to a full round.
func (s *tcpServer) completeLocked(g *srvGroup, rd *srvRound) [][]byte {
	n := len(g.members)
	replies := make([][]byte, n)
	switch rd.op {
	case opAllGather:
		all := appendChunks(make([]byte, 0, chunksLen(rd.data)), rd.data)
		for i := range replies {
			replies[i] = all
		}
	case opBroadcast:
		root := binary.LittleEndian.Uint32(rd.data[0])
		for i := range replies {
			replies[i] = rd.data[root][4:]
		}
	case opBarrier:
	case opAllToAll:
		parts := make([][][]byte, n)
		for i, d := range rd.data {
			parts[i], _ = splitChunks(d, n) // checked on arrival
		}
		col := make([][]byte, n)
		for i := range replies {
			for j := range col {
				col[j] = parts[j][i]
			}
			replies[i] = appendChunks(make([]byte, 0, chunksLen(col)), col)
		}
	case opSplit:
		colors := make([]int, n)
		keys := make([]int, n)
		for i, d := range rd.data {
			colors[i] = int(int64(binary.LittleEndian.Uint64(d)))
			keys[i] = int(int64(binary.LittleEndian.Uint64(d[8:])))
		}
		// One new group per color, numbered in ascending color order.
		gids := map[int]uint64{}
		subs := map[int][]int{}
		for _, c := range slices.Sorted(func(yield func(int) bool) {
			seen := map[int]bool{}
			for _, c := range colors {
				if !seen[c] {
					seen[c] = true
					if !yield(c) {
						return
					}
				}
			}
		}) {
			first := slices.Index(colors, c)
			idx, _ := splitMembers(first, colors, keys)
			world := make([]int, len(idx))
			index := make(map[int]int, len(idx))
			for k, i := range idx {
				world[k] = g.members[i]
				index[world[k]] = k
			}
			gid := s.nextGID
			s.nextGID++
			s.groups[gid] = &srvGroup{members: world, index: index, rounds: map[uint64]*srvRound{}, failed: map[uint64]string{}}
			gids[c], subs[c] = gid, world
		}
		for i := range replies {
			c := colors[i]
			sub := subs[c]
			replies[i] = splitReply{GID: gids[c], Index: slices.Index(sub, g.members[i]), Members: sub}.encode()
		}
	}
	return replies
}

// unseenLocked lists the ranks that have not said hello.
func (s *tcpServer) unseenLocked() []int {
	var missing []int
	for r, ok := range s.seen {
		if !ok {
			missing = append(missing, r)
		}
	}
	return missing
}

// closeLocked stops the server gracefully: every client gets a shutdown
// notice after what is already queued for it, then its connection closes.
// Before the welcome (rank 0 gave up waiting), the notice says which ranks
// never came, or why the rendezvous was aborted.
func (s *tcpServer) closeLocked() {
	if s.closed {
		return
	}
	s.closed = true
	s.ln.Close()
	for sc := range s.all {
		switch {
		case !sc.proven:
			sc.c.Close() // a stray: nothing to tell it
			continue
		case sc.rank == 0:
		case s.aborted != "":
			sc.send(frameHeader{Type: fReject}, []byte(s.aborted))
		case !s.welcomed:
			sc.send(frameHeader{Type: fMissing, GID: helloGID}, appendRanks(nil, s.unseenLocked()))
			sc.send(frameHeader{Type: fShutdown}, nil)
		default:
			sc.send(frameHeader{Type: fShutdown}, nil)
		}
		sc.finish()
	}
}

// close stops the server and waits until every queued frame is written (or
// its write deadline passed); the readers finish on their own, within
// queryGrace.
func (s *tcpServer) close() {
	s.mu.Lock()
	s.closeLocked()
	s.mu.Unlock()
	s.wg.Wait()
}

// abortRank0 is rank 0's Abort: every rank is told that rank 0 is lost,
// with cause, and the server stops; what it cannot deliver within
// abortLinger is dropped, every connection cut.
func (s *tcpServer) abortRank0(cause string) {
	s.mu.Lock()
	if c := s.conns[0]; c != nil {
		s.conns[0] = nil
		delete(s.all, c)
		c.finish()
	}
	if s.welcomed {
		s.goneLocked(0, true, "aborted: "+cause)
	} else {
		s.lostBeforeWelcomeLocked(0, "aborted: "+cause)
	}
	s.closeLocked()
	s.mu.Unlock()
	written := make(chan struct{})
	go func() { s.wg.Wait(); close(written) }()
	select {
	case <-written:
	case <-time.After(abortLinger):
	}
	s.mu.Lock()
	for sc := range s.all {
		sc.c.Close()
	}
	s.mu.Unlock()
}

// kill stops the server abruptly, the way a killed process would: no
// notices, every connection cut. For tests.
func (s *tcpServer) kill() {
	s.mu.Lock()
	s.closed = true
	s.ln.Close()
	for sc := range s.all {
		sc.c.Close()
		sc.finish()
	}
	s.mu.Unlock()
	s.wg.Wait()
	s.readers.Wait()
}
