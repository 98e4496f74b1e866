package comm

import (
	"context"
	"crypto/hmac"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"
)

// Direct AllToAll of the TCP group. Every pair of world ranks shares one
// connection (the lower rank dials the higher one), built by NewTCP and
// used by the world group and every sub-group: a part travels as one
// fPeerData frame tagged with its group id and the group's sequence
// number, and one reader goroutine per connection files it under that key
// until the call that wants it takes it. The rendezvous server is not
// involved, except that the ranks agree through it, once, to use the
// connections.

// meshTimeout bounds the building of the peer connections: every rank is
// already listening when the welcome comes, so they connect at once or
// not at all.
const meshTimeout = 10 * time.Second

// peerReadUpfront is how much of a part a peer reader allocates before the
// bytes arrive (see readFrameUpfront).
const peerReadUpfront = 64 << 20

// tcpMesh is one rank's set of peer connections.
type tcpMesh struct {
	peers   []*peerConn // by world rank; nil for this rank
	readers sync.WaitGroup

	// Guarded by the client's mu.
	rounds map[roundKey]*p2pRound // parts that came, by (group, sequence)
	next   map[uint64]uint64      // group id → lowest sequence still wanted
}

// peerConn is the connection to one peer.
type peerConn struct {
	rank int // the peer's world rank
	conn net.Conn
	wmu  sync.Mutex // serialises writes

	// Guarded by the client's mu.
	down    string          // non-empty: the connection is unusable, why
	slow    bool            // ... because this rank cut it when a write to the peer timed out
	bye     bool            // the peer closed its world group (down then means closed, not lost)
	byeLost map[int]string  // with its bye: the world ranks it had seen lost, with the causes
	groups  map[uint64]bool // sub-groups the peer closed
}

// p2pRound collects the parts of one AllToAll call.
type p2pRound struct {
	parts map[int][]byte // by sender's world rank
	wake  chan struct{}  // cap 1: a part came
}

func newMesh(peers []*peerConn) *tcpMesh {
	return &tcpMesh{peers: peers, rounds: map[roundKey]*p2pRound{}, next: map[uint64]uint64{}}
}

// peerListen opens the peer listener on an ephemeral port of the local
// address of conn, the connection to rank 0.
func peerListen(conn net.Conn) (net.Listener, error) {
	la, ok := conn.LocalAddr().(*net.TCPAddr)
	if !ok {
		return nil, fmt.Errorf("comm: tcp: local address %v is not TCP", conn.LocalAddr())
	}
	return net.ListenTCP("tcp", &net.TCPAddr{IP: la.IP, Zone: la.Zone})
}

// meshAuth is what a rank needs to build and check its peer connections.
type meshAuth struct {
	me, size int
	worldID  uint64 // from the welcome
	secret   string
	log      *zap.Logger
}

// testHookPeerRefused, when set (tests), is called with why each time a
// peer listener refuses a connection.
var testHookPeerRefused func(why string)

// connectMesh connects rank a.me to every other rank of the world: it
// dials every higher rank at its address in addrs and accepts every lower
// one on ln. Each connection starts with the acceptor's challenge and a
// peer hello each way naming both ranks and the world id and proving the
// secret (tcp_auth.go); a connection that does not say one, names another
// world, rank or protocol or does not prove the secret is closed (with a
// warning) and the wait goes on. It closes ln before it returns. It fails
// if a dial or hello fails or some rank is not connected by ctx's deadline
// or meshTimeout, whichever comes first; then it has closed every
// connection.
func connectMesh(ctx context.Context, ln net.Listener, a meshAuth, addrs []string) ([]*peerConn, error) {
	size, me := len(addrs), a.me
	if ln == nil {
		return nil, errors.New("this rank has no peer listener")
	}
	defer ln.Close()
	for w, addr := range addrs {
		if addr == "" {
			return nil, fmt.Errorf("rank %d advertises no peer address", w)
		}
	}
	ctx, cancel := context.WithTimeout(ctx, meshTimeout)
	defer cancel()

	type result struct {
		w    int
		conn net.Conn
		err  error
	}
	results := make(chan result, size) // at most size-1: one per peer
	var mu sync.Mutex
	claimed := make([]bool, size)
	claim := func(w int) bool {
		mu.Lock()
		defer mu.Unlock()
		ok := !claimed[w]
		claimed[w] = true
		return ok
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				w, err := acceptPeer(ctx, conn, a, claim)
				if err != nil {
					// A stray connection: drop it, wait for the real one.
					if ctx.Err() == nil { // not a handshake cut short by the end
						a.refuse(conn, err)
					}
					conn.Close()
					return
				}
				results <- result{w: w, conn: conn}
			})
		}
	})
	for w := me + 1; w < size; w++ {
		wg.Go(func() {
			conn, err := dialPeer(ctx, a, w, addrs[w])
			results <- result{w: w, conn: conn, err: err}
		})
	}

	peers := make([]*peerConn, size)
	var err error
	for n := 0; n < size-1 && err == nil; {
		select {
		case r := <-results:
			if r.err != nil {
				err = r.err
				continue
			}
			peers[r.w] = &peerConn{rank: r.w, conn: r.conn, groups: map[uint64]bool{}}
			n++
		case <-ctx.Done():
			var missing []int
			for w, pc := range peers {
				if pc == nil && w != me {
					missing = append(missing, w)
				}
			}
			err = fmt.Errorf("rank(s) %v not connected: %w", missing, ctx.Err())
		}
	}
	ln.Close()
	cancel() // ends the handshakes in flight
	wg.Wait()
	close(results)
	for r := range results {
		if r.conn != nil {
			r.conn.Close()
		}
	}
	if err != nil {
		for _, pc := range peers {
			if pc != nil {
				pc.conn.Close()
			}
		}
		return nil, err
	}
	return peers, nil
}

// refuse reports a connection the peer listener closed.
func (a meshAuth) refuse(conn net.Conn, why error) {
	if a.log != nil {
		a.log.Warn("peer listener: refused a connection that did not prove itself a rank of this world",
			zap.Int("rank", a.me), zap.Stringer("from", conn.RemoteAddr()), zap.Error(why))
	}
	if testHookPeerRefused != nil {
		testHookPeerRefused(why.Error())
	}
}

// peerHandshake bounds conn's hello exchange by ctx: it closes conn if ctx
// ends first. done reports whether the exchange finished before that.
func peerHandshake(ctx context.Context, conn net.Conn) (done func() bool) {
	if d, ok := ctx.Deadline(); ok {
		conn.SetDeadline(d)
	}
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	return func() bool {
		conn.SetDeadline(time.Time{})
		return stop()
	}
}

func tunePeer(conn net.Conn) {
	if tc, ok := conn.(*net.TCPConn); ok {
		tc.SetKeepAliveConfig(keepAlive)
		tc.SetNoDelay(true)
	}
}

// acceptPeer runs the accepting side's handshake on conn: a challenge, then
// a hello that must come from a rank below a.me of the same world, not
// connected yet, and prove the secret; then this rank's own proof.
func acceptPeer(ctx context.Context, conn net.Conn, a meshAuth, claim func(int) bool) (int, error) {
	done := peerHandshake(ctx, conn)
	from, err := acceptPeerHello(conn, a, claim)
	if ok := done(); err == nil && !ok {
		err = ctx.Err()
	}
	if err != nil {
		return 0, err
	}
	tunePeer(conn)
	return from, nil
}

func acceptPeerHello(conn net.Conn, a meshAuth, claim func(int) bool) (int, error) {
	nonce := newNonce()
	if err := writeFrame(conn, frameHeader{Type: fChallenge, Rank: int32(a.me)}, challengeMsg{Magic: tcpMagic, Version: tcpVersion, Nonce: nonce}.encode()); err != nil {
		return 0, err
	}
	h, p, err := readFrameMax(conn, maxHandshakePayload, nil)
	if err != nil {
		return 0, err
	}
	m, err := checkPeerHello(h, p, a.me, a.size, a.worldID)
	if err != nil {
		return 0, err
	}
	from := int(h.Rank)
	if from < 0 || from >= a.me {
		return 0, fmt.Errorf("peer hello from rank %d, want one below %d", from, a.me)
	}
	want := peerMAC(a.secret, "peer dial", nonce, m.Nonce, from, a.me, a.size, a.worldID)
	if !hmac.Equal(m.MAC[:], want[:]) {
		return 0, fmt.Errorf("peer hello as rank %d does not prove the world secret", from)
	}
	if !claim(from) {
		return 0, fmt.Errorf("rank %d connected twice", from)
	}
	reply := peerHello{Magic: tcpMagic, Version: tcpVersion, Size: a.size, To: from, Nonce: nonce,
		MAC: peerMAC(a.secret, "peer accept", m.Nonce, nonce, a.me, from, a.size, a.worldID)}
	if err := writeFrame(conn, frameHeader{Type: fPeerHello, Seq: a.worldID, Rank: int32(a.me)}, reply.encode()); err != nil {
		return 0, err
	}
	return from, nil
}

// dialPeer connects rank a.me to rank w at addr and runs the dialling
// side's handshake.
func dialPeer(ctx context.Context, a meshAuth, w int, addr string) (net.Conn, error) {
	d := net.Dialer{KeepAliveConfig: keepAlive}
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("dial rank %d at %s: %w", w, addr, err)
	}
	done := peerHandshake(ctx, conn)
	err = dialPeerHello(conn, a, w)
	if ok := done(); err == nil && !ok {
		err = ctx.Err()
	}
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("hello with rank %d at %s: %w", w, addr, err)
	}
	tunePeer(conn)
	return conn, nil
}

func dialPeerHello(conn net.Conn, a meshAuth, w int) error {
	h, p, err := readFrameMax(conn, maxHandshakePayload, nil)
	if err != nil {
		return err
	}
	if h.Type != fChallenge {
		return fmt.Errorf("%w: %s frame instead of a challenge", errFrame, h.Type)
	}
	ch, err := decodeChallenge(p)
	if err == nil {
		err = ch.check()
	}
	if err != nil {
		return err
	}
	nonce := newNonce()
	hello := peerHello{Magic: tcpMagic, Version: tcpVersion, Size: a.size, To: w, Nonce: nonce,
		MAC: peerMAC(a.secret, "peer dial", ch.Nonce, nonce, a.me, w, a.size, a.worldID)}
	if err := writeFrame(conn, frameHeader{Type: fPeerHello, Seq: a.worldID, Rank: int32(a.me)}, hello.encode()); err != nil {
		return err
	}
	h, p, err = readFrameMax(conn, maxHandshakePayload, nil)
	if err != nil {
		return err
	}
	m, err := checkPeerHello(h, p, a.me, a.size, a.worldID)
	switch {
	case err != nil:
		return err
	case int(h.Rank) != w:
		return fmt.Errorf("answered by rank %d", h.Rank)
	}
	want := peerMAC(a.secret, "peer accept", nonce, ch.Nonce, w, a.me, a.size, a.worldID)
	if m.Nonce != ch.Nonce || !hmac.Equal(m.MAC[:], want[:]) {
		return fmt.Errorf("rank %d's answer does not prove the world secret", w)
	}
	return nil
}

// checkPeerHello checks that a peer hello is meant for rank me of this
// world (its MAC is the caller's to check).
func checkPeerHello(h frameHeader, p []byte, me, size int, worldID uint64) (peerHello, error) {
	if h.Type != fPeerHello {
		return peerHello{}, fmt.Errorf("%w: %s frame instead of a peer hello", errFrame, h.Type)
	}
	m, err := decodePeerHello(p)
	switch {
	case err != nil:
		return m, err
	case m.Magic != tcpMagic || m.Version != tcpVersion:
		return m, fmt.Errorf("peer speaks protocol %#x version %d, this rank %#x version %d", m.Magic, m.Version, uint32(tcpMagic), tcpVersion)
	case h.Seq != worldID:
		return m, fmt.Errorf("peer is from world %#x, this rank from %#x", h.Seq, worldID)
	case m.Size != size || m.To != me:
		return m, fmt.Errorf("peer means rank %d of %d, this is rank %d of %d", m.To, m.Size, me, size)
	}
	return m, nil
}

// startMesh makes the client use mesh and starts its readers.
func (c *tcpClient) startMesh(m *tcpMesh) {
	c.mesh = m
	for _, pc := range m.peers {
		if pc != nil {
			m.readers.Add(1)
			go c.readPeer(pc)
		}
	}
}

// readPeer files pc's frames until its connection ends.
func (c *tcpClient) readPeer(pc *peerConn) {
	m := c.mesh
	defer m.readers.Done()
	defer pc.conn.Close() // after EOF: the peer is done with it too (FIN, not RST)
	for {
		h, p, err := readFrameUpfront(pc.conn, peerReadUpfront)
		if err != nil {
			c.peerDown(pc, "read: "+err.Error(), false)
			return
		}
		if int(h.Rank) != pc.rank {
			c.peerDown(pc, fmt.Sprintf("rank %d sent a %s frame as rank %d", pc.rank, h.Type, h.Rank), false)
			return
		}
		c.mu.Lock()
		switch {
		case h.Type == fPeerData && h.Op == opAllToAll:
			key := roundKey{h.GID, h.Seq}
			if h.Seq < m.next[h.GID] {
				break // the call that wanted it has ended
			}
			rd := m.roundLocked(key)
			if _, dup := rd.parts[pc.rank]; dup {
				c.mu.Unlock()
				c.peerDown(pc, fmt.Sprintf("rank %d sent its part of group %d's call %d twice", pc.rank, h.GID, h.Seq), false)
				return
			}
			if p == nil {
				p = []byte{}
			}
			rd.parts[pc.rank] = p
			select {
			case rd.wake <- struct{}{}:
			default:
			}
		case h.Type == fAbort:
			c.mu.Unlock()
			c.peerDown(pc, "aborted: "+string(p), false)
			return
		case h.Type == fPeerBye && h.GID == 0:
			pc.bye = true
			pc.byeLost = decodeDepartures(p, len(m.peers))
		case h.Type == fPeerBye:
			pc.groups[h.GID] = true
			c.changedLocked()
		default:
			c.mu.Unlock()
			c.peerDown(pc, fmt.Sprintf("rank %d sent an unexpected %s frame", pc.rank, h.Type), false)
			return
		}
		c.mu.Unlock()
	}
}

// roundLocked returns the parts of call key, making the entry if needed.
func (m *tcpMesh) roundLocked(key roundKey) *p2pRound {
	rd := m.rounds[key]
	if rd == nil {
		rd = &p2pRound{parts: map[int][]byte{}, wake: make(chan struct{}, 1)}
		m.rounds[key] = rd
	}
	return rd
}

// peerDown records that pc can no longer be used, and why; slow says that
// this rank cut it because a write to the peer timed out.
func (c *tcpClient) peerDown(pc *peerConn, cause string, slow bool) {
	c.mu.Lock()
	if pc.down == "" {
		pc.down = cause
		pc.slow = slow
		if pc.bye {
			pc.down = "closed"
		}
		c.changedLocked()
	}
	c.mu.Unlock()
}

// sendPeer writes one frame to pc within ctxWriteBound(ctx), like the
// writes to the server; cancelling ctx cuts it short. A write cut short
// leaves half a frame on the wire, so it closes the connection.
func (c *tcpClient) sendPeer(ctx context.Context, pc *peerConn, h frameHeader, p []byte) error {
	pc.wmu.Lock()
	defer pc.wmu.Unlock()
	c.mu.Lock()
	down := pc.down
	c.mu.Unlock()
	if down != "" {
		return errors.New(down)
	}
	if err := ctx.Err(); errors.Is(err, context.Canceled) {
		return err
	}
	// A cancel sets a deadline in the past, under mu, so that the deadline
	// of the next piece cannot undo it.
	var mu sync.Mutex
	cancelled := false
	b := ctxWriteBound(ctx)
	deadline := func() error {
		mu.Lock()
		defer mu.Unlock()
		if cancelled {
			return pc.conn.SetWriteDeadline(time.Unix(1, 0))
		}
		return pc.conn.SetWriteDeadline(b.next())
	}
	fired := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		defer close(fired)
		if errors.Is(ctx.Err(), context.Canceled) { // a deadline has its own, later
			mu.Lock()
			cancelled = true
			pc.conn.SetWriteDeadline(time.Unix(1, 0))
			mu.Unlock()
		}
	})
	err := writeFrameBy(pc.conn, h, p, deadline)
	if !stop() {
		<-fired // so that it cannot touch the next writer's deadline
	}
	if err != nil {
		cut := errors.Is(ctx.Err(), context.Canceled)
		c.peerDown(pc, "write: "+err.Error(), isTimeout(err) && !cut)
		pc.conn.Close()
		if cut {
			return fmt.Errorf("%w (cut short: %v)", context.Canceled, err)
		}
	}
	return err
}

// allToAllDirect is AllToAll over the peer connections.
func (g *tcpGroup) allToAllDirect(ctx context.Context, send [][]byte) ([][]byte, error) {
	c, m := g.c, g.c.mesh
	const name = "alltoall"
	op := fmt.Sprintf("%s on rank %d", name, g.rank)
	for p, b := range send {
		if limit := frameLimit(); len(b) > limit {
			return nil, fmt.Errorf("comm: %s: %d bytes for rank %d exceed the %d-byte frame limit", op, len(b), p, limit)
		}
	}
	seq := g.seq
	g.seq++
	key := roundKey{g.gid, seq}
	me := g.members[g.rank]

	c.mu.Lock()
	if err := g.directCheckLocked(name); err != nil {
		m.endLocked(key)
		c.mu.Unlock()
		return nil, err
	}
	rd := m.roundLocked(key)
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		m.endLocked(key)
		c.mu.Unlock()
	}()

	werrs := make([]error, len(g.members))
	var wg sync.WaitGroup
	for i, w := range g.members {
		if i == g.rank {
			continue
		}
		wg.Go(func() {
			h := frameHeader{Type: fPeerData, Op: opAllToAll, GID: g.gid, Seq: seq, Rank: int32(me)}
			werrs[i] = c.sendPeer(ctx, m.peers[w], h, send[i])
		})
	}
	out, err := g.awaitParts(ctx, rd, send)
	wg.Wait() // the caller owns send again once AllToAll returns
	if err != nil {
		return nil, err
	}
	var lost []int
	var causes []string
	for i, e := range werrs {
		if e != nil {
			lost = append(lost, i)
			causes = append(causes, fmt.Sprintf("rank %d: write: %v", i, e))
		}
	}
	if len(lost) > 0 {
		// Every part came, but some of this rank's did not leave: those
		// peers will not complete the call.
		c.mu.Lock()
		err := g.missingCheckLocked(name, lost)
		c.mu.Unlock()
		if err != nil {
			return nil, err
		}
		return nil, &PeerLostError{Op: op, Ranks: lost, Cause: strings.Join(causes, "; ")}
	}
	return out, nil
}

// awaitParts waits until every member's part of rd has come, and returns
// them by group rank (this rank's own a copy of send's).
func (g *tcpGroup) awaitParts(ctx context.Context, rd *p2pRound, send [][]byte) ([][]byte, error) {
	c := g.c
	const name = "alltoall"
	expired := false
	for {
		c.mu.Lock()
		notify := c.notify
		var missing []int
		for i, w := range g.members {
			if _, ok := rd.parts[w]; !ok && i != g.rank {
				missing = append(missing, i)
			}
		}
		if len(missing) == 0 {
			out := make([][]byte, len(g.members))
			for i, w := range g.members {
				out[i] = rd.parts[w]
			}
			c.mu.Unlock()
			out[g.rank] = append([]byte{}, send[g.rank]...)
			return out, nil
		}
		err := g.missingCheckLocked(name, missing)
		c.mu.Unlock()
		if err != nil {
			return nil, err
		}
		if expired {
			return nil, &TimeoutError{Op: fmt.Sprintf("%s on rank %d", name, g.rank), Missing: missing}
		}
		select {
		case <-rd.wake:
		case <-notify:
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.Canceled) {
				return nil, fmt.Errorf("comm: %s on rank %d: %w", name, g.rank, context.Canceled)
			}
			expired = true // look once more, then say who is missing
		}
	}
}

// endLocked forgets call key and drops its parts that come later.
func (m *tcpMesh) endLocked(key roundKey) {
	delete(m.rounds, key)
	if key.seq >= m.next[key.gid] {
		m.next[key.gid] = key.seq + 1
	}
}

// directCheckLocked says why g cannot start a direct AllToAll, if it
// cannot: checkLocked's reasons, or a member whose peer connection is gone.
func (g *tcpGroup) directCheckLocked(name string) error {
	all := make([]int, 0, len(g.members))
	for i := range g.members {
		if i != g.rank {
			all = append(all, i)
		}
	}
	if err := g.missingCheckLocked(name, all); err != nil {
		return err
	}
	return g.checkLocked(name)
}

// missingCheckLocked says why the members in missing (group ranks,
// ascending) will never send their parts, if one of them will not: this
// rank closed the group, or one's peer connection broke (lost), was cut by
// this rank when a write to the peer timed out (a timeout: a peer slow to
// read is not evidence that it died), or carried its bye (closed). It looks
// only at the peer connections, where a part comes before its sender's bye
// or end of stream: a rank that finished the call and then closed or died,
// as told by the server, must not fail a call whose parts from it are
// still on the way.
func (g *tcpGroup) missingCheckLocked(name string, missing []int) error {
	c := g.c
	if c.aborted != "" {
		return fmt.Errorf("comm: %s on rank %d: this rank aborted the group (%s): %w", name, g.rank, c.aborted, ErrAborted)
	}
	if c.closed || g.closed {
		return fmt.Errorf("comm: %s on rank %d: this rank closed the group: %w", name, g.rank, ErrClosed)
	}
	var lost, slow []int
	var lostCauses, slowCauses []string
	for _, i := range missing {
		pc := c.mesh.peers[g.members[i]]
		switch {
		case pc.down == "" || pc.bye:
		case pc.slow:
			slow = append(slow, i)
			slowCauses = append(slowCauses, fmt.Sprintf("rank %d: %s", i, pc.down))
		default:
			lost = append(lost, i)
			lostCauses = append(lostCauses, fmt.Sprintf("rank %d: %s", i, pc.down))
		}
	}
	if len(lost) > 0 {
		return &PeerLostError{Op: fmt.Sprintf("%s on rank %d", name, g.rank), Ranks: lost,
			Cause: "peer connection broke: " + strings.Join(lostCauses, "; ")}
	}
	if len(slow) > 0 {
		return &TimeoutError{Op: fmt.Sprintf("%s on rank %d (a write to the peer timed out and this rank closed the connection: %s)",
			name, g.rank, strings.Join(slowCauses, "; ")), Missing: slow}
	}
	for _, i := range missing {
		pc := c.mesh.peers[g.members[i]]
		if (pc.down != "" && pc.bye) || pc.groups[g.gid] {
			if err := g.lostBeforeByeLocked(name, i, pc); err != nil {
				return err
			}
			return fmt.Errorf("comm: %s on rank %d: rank %d closed the group: %w", name, g.rank, i, ErrClosed)
		}
	}
	return nil
}

// lostBeforeByeLocked blames the members of g that peer i (who closed
// the world group without sending its part) had seen lost: a rank whose
// own call failed on a lost peer closes at once, and its bye can arrive
// before this rank notices the loss itself. nil if it had seen none.
func (g *tcpGroup) lostBeforeByeLocked(name string, i int, pc *peerConn) error {
	var lost []int
	var causes []string
	for j, w := range g.members {
		if cause, ok := pc.byeLost[w]; ok && j != g.rank {
			lost = append(lost, j)
			causes = append(causes, fmt.Sprintf("rank %d: %s", j, cause))
		}
	}
	if len(lost) == 0 {
		return nil
	}
	return &PeerLostError{Op: fmt.Sprintf("%s on rank %d", name, g.rank), Ranks: lost,
		Cause: fmt.Sprintf("rank %d closed the group without its part, having seen them lost: %s", i, strings.Join(causes, "; "))}
}

// departuresLocked lists the world ranks this rank has seen lost (told by
// the server, or a broken peer connection), for its bye.
func (c *tcpClient) departuresLocked() map[int]string {
	out := map[int]string{}
	for w, cause := range c.lost {
		out[w] = cause
	}
	for _, pc := range c.mesh.peers {
		if pc != nil && pc.down != "" && !pc.bye && !pc.slow {
			if _, ok := out[pc.rank]; !ok {
				out[pc.rank] = "peer connection broke: " + pc.down
			}
		}
	}
	return out
}

// meshGroupClosedLocked drops sub-group gid's parts, now and later.
func (c *tcpClient) meshGroupClosedLocked(gid uint64) {
	m := c.mesh
	if m == nil {
		return
	}
	m.next[gid] = ^uint64(0)
	for key := range m.rounds {
		if key.gid == gid {
			delete(m.rounds, key)
		}
	}
}

// meshGroupBye tells g's other members over the peer connections that
// this rank closed g, after any part it sent them.
func (g *tcpGroup) meshGroupBye(ctx context.Context) {
	c := g.c
	if c.mesh == nil {
		return
	}
	var wg sync.WaitGroup
	for i, w := range g.members {
		if i != g.rank {
			wg.Go(func() {
				c.sendPeer(ctx, c.mesh.peers[w], frameHeader{Type: fPeerBye, GID: g.gid, Rank: int32(g.members[g.rank])}, nil)
			})
		}
	}
	wg.Wait()
}

// closeMesh ends the peer connections. Gracefully, each gets a bye and a
// FIN, and the reader reads on until the peer hangs up too (up to
// queryGrace), so that neither side resets a connection with unread bytes;
// otherwise (kill) they are cut at once.
func (c *tcpClient) closeMesh(graceful bool) {
	m := c.mesh
	if m == nil {
		return
	}
	if graceful {
		c.mu.Lock()
		news := appendDepartures(nil, c.departuresLocked())
		c.mu.Unlock()
		var wg sync.WaitGroup
		for _, pc := range m.peers {
			if pc == nil || !pc.wmu.TryLock() { // a write in flight: no bye, the peer sees a loss
				continue
			}
			wg.Go(func() {
				defer pc.wmu.Unlock()
				pc.conn.SetWriteDeadline(time.Now().Add(queryGrace))
				if writeFrame(pc.conn, frameHeader{Type: fPeerBye, Rank: int32(c.rank)}, news) == nil {
					if tc, ok := pc.conn.(*net.TCPConn); ok {
						tc.CloseWrite()
					}
				}
			})
		}
		wg.Wait()
		done := make(chan struct{})
		go func() { m.readers.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(queryGrace):
		}
	}
	for _, pc := range m.peers {
		if pc != nil {
			pc.conn.Close()
		}
	}
	m.readers.Wait()
}

// abortMesh tells every peer that this rank aborts, with cause, where no
// write to it is in flight, then cuts the peer connections.
func (c *tcpClient) abortMesh(cause string) {
	m := c.mesh
	if m == nil {
		return
	}
	var wg sync.WaitGroup
	for _, pc := range m.peers {
		if pc == nil || !pc.wmu.TryLock() { // a write in flight: the peer sees a loss
			continue
		}
		wg.Go(func() {
			defer pc.wmu.Unlock()
			pc.conn.SetWriteDeadline(time.Now().Add(abortLinger))
			if writeFrame(pc.conn, frameHeader{Type: fAbort, Rank: int32(c.rank)}, []byte(cause)) == nil {
				if tc, ok := pc.conn.(*net.TCPConn); ok {
					tc.CloseWrite()
				}
			}
		})
	}
	wg.Wait()
	c.closeMesh(false)
}

// directPeers lists the world ranks this rank has a usable peer
// connection to, for tests.
func (c *tcpClient) directPeers() []int {
	if c.mesh == nil {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []int
	for w, pc := range c.mesh.peers {
		if pc != nil && pc.down == "" {
			out = append(out, w)
		}
	}
	return slices.Clip(out)
}
