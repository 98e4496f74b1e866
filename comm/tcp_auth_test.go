package comm

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

// stray is a local process's connection to rank 0's rendezvous that is not
// a rank of the world.
type stray struct {
	name string
	// send writes what the stray says once it has read the server's
	// challenge (nil: it sends nothing at all).
	send func(c net.Conn, ch challengeMsg)
}

// hostileHello is a hello claiming rank of a world of size, proven with
// secret against the challenge ch (the real ranks' secret is testSecret).
func hostileHello(ch challengeMsg, rank, size int, secret string) []byte {
	m := helloMsg{Magic: tcpMagic, Version: tcpVersion, Size: size, LocalSize: 1, Nonce: newNonce(), PeerAddr: "127.0.0.1:1"}
	if secret != "" {
		m.MAC = helloMAC(secret, ch.Nonce, int32(rank), m)
	}
	var b []byte
	writeFrame(writerFunc(func(p []byte) (int, error) { b = append(b, p...); return len(p), nil }), frameHeader{Type: fHello, Rank: int32(rank)}, m.encode())
	return b
}

// strays are the connections TestTCPRendezvousRefusesStrays makes, in a
// world of 4 ranks whose rank 0 is already there: every one claims a rank
// not yet joined where it claims one, which a rendezvous without the
// secret would have given it.
var strays = []stray{
	{"garbage", func(c net.Conn, _ challengeMsg) { c.Write([]byte("GET / HTTP/1.1\r\nHost: example.com\r\n\r\n")) }},
	{"no secret", func(c net.Conn, ch challengeMsg) { c.Write(hostileHello(ch, 1, 4, "")) }},
	{"wrong secret", func(c net.Conn, ch challengeMsg) { c.Write(hostileHello(ch, 3, 4, testSecret+"!")) }},
	{"replayed hello", func(c net.Conn, _ challengeMsg) {
		c.Write(hostileHello(challengeMsg{Nonce: newNonce()}, 2, 4, testSecret)) // proven for another challenge
	}},
	{"duplicate rank", func(c net.Conn, ch challengeMsg) { c.Write(hostileHello(ch, 0, 4, testSecret+"!")) }},
	{"wrong world size", func(c net.Conn, ch challengeMsg) { c.Write(hostileHello(ch, 1, 5, testSecret+"!")) }},
	{"rank -1", func(c net.Conn, ch challengeMsg) { c.Write(hostileHello(ch, -1, 4, testSecret+"!")) }},
	{"huge frame", func(c net.Conn, _ challengeMsg) {
		// 1 GiB announced, 16 MiB sent: a rank 0 that buffered frames
		// before the hello was proven held it all.
		c.Write(appendHeader(nil, frameHeader{Type: fHello, Rank: 1, Len: maxFramePayload}))
		c.Write(make([]byte, 16<<20))
	}},
	{"huge frame 2", func(c net.Conn, _ challengeMsg) {
		c.Write(appendHeader(nil, frameHeader{Type: fContrib, Op: opAllGather, Len: maxFramePayload}))
		c.Write(make([]byte, 16<<20))
	}},
}

// TestTCPRendezvousRefusesStrays: connections from processes that are not
// ranks of the world (garbage, no secret, a wrong secret, a replayed
// hello, a duplicate or out-of-range rank, a wrong world size, frames of a
// GiB before any hello, a client that connects and says nothing) are each
// refused alone, with a warning, while the world forms and works; none
// makes rank 0 hold more than a small bounded number of bytes.
func TestTCPRendezvousRefusesStrays(t *testing.T) {
	ln, port := tcpListen(t)
	server := hookServer(t)
	core, logs := observer.New(zapcore.WarnLevel)
	ctx, cancel := context.WithTimeout(t.Context(), hang)
	defer cancel()
	cfg0 := tcpCfg(port, 0, 4)
	cfg0.Log = zap.New(core)
	var g0 Group
	var err0 error
	joined0 := make(chan struct{})
	go func() {
		defer close(joined0)
		g0, err0 = NewTCPWithListener(ctx, cfg0, ln)
	}()
	waitFor(t, "rank 0 to join", seen(server, 0))
	s := server()

	// dial connects and reads the server's challenge.
	dial := func(name string) (net.Conn, challengeMsg) {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		c.SetReadDeadline(time.Now().Add(hang))
		h, p, err := readFrameMax(c, maxHandshakePayload, nil)
		if err != nil || h.Type != fChallenge {
			t.Fatalf("%s: the server's first frame: %v, %v", name, h.Type, err)
		}
		ch, err := decodeChallenge(p)
		if err != nil {
			t.Fatal(err)
		}
		return c, ch
	}
	// A client that connects and says nothing: the world forms all the
	// same (it would take handshakeTimeout to be closed).
	silent, _ := dial("silent")
	defer silent.Close()
	for _, st := range strays {
		c, ch := dial(st.name)
		var wg sync.WaitGroup
		wg.Go(func() { st.send(c, ch) })
		// Refused: at most a short refusal, never the server's proof.
		h, p, err := readFrameMax(c, maxHandshakePayload, nil)
		switch {
		case err == nil && h.Type == fReject:
			t.Logf("%s: refused: %s", st.name, p)
			_, err = io.Copy(io.Discard, c)
			if err != nil && !errors.Is(err, syscall.ECONNRESET) {
				t.Errorf("%s: after the refusal: %v, want the connection closed", st.name, err)
			}
		case err == nil:
			t.Errorf("%s: got a %s frame, want the connection refused", st.name, h.Type)
		case !errors.Is(err, io.EOF) && !errors.Is(err, syscall.ECONNRESET):
			t.Errorf("%s: %v, want the connection closed", st.name, err)
		}
		c.Close()
		wg.Wait()
	}

	// The real ranks join, and the world works.
	cfgs := map[int]TCPConfig{1: tcpCfg(port, 1, 4), 2: tcpCfg(port, 2, 4), 3: tcpCfg(port, 3, 4)}
	gs, errs := joinTCP(ctx, nil, port, 4, cfgs)
	<-joined0
	gs[0], errs[0] = g0, err0
	defer func() {
		for r := 3; r >= 0; r-- {
			if gs[r] != nil {
				gs[r].Close()
			}
		}
	}()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	wantDirect(t, gs)
	each(t, gs, func(g Group) error {
		if _, err := g.AllGather(ctx, []byte{byte(g.Rank())}); err != nil {
			return err
		}
		return checkAllToAll(ctx, g, 3)
	})

	if n := s.refused.Load(); n != int64(len(strays)) {
		t.Errorf("%d connections refused, want %d", n, len(strays))
	}
	if n := logs.FilterMessageSnippet("refused a connection").Len(); n != len(strays) {
		t.Errorf("%d warnings of a refused connection, want %d:\n%v", n, len(strays), logs.All())
	}
	// One stray at a time: at most one header and a refused payload's
	// worth at once (the 1 GiB frames are refused from their header).
	if p, bound := s.peak.Load(), int64(frameHeaderLen+maxHandshakePayload); p > bound {
		t.Errorf("rank 0 held %d bytes of connections not yet proven, want at most %d", p, bound)
	}
	if h := s.held.Load(); h != 0 {
		t.Errorf("rank 0 still holds %d bytes of refused connections", h)
	}
}

// TestTCPSilentClientClosed: a connection that says nothing is closed by
// rank 0 at the handshake deadline (lowered here to 100 ms; the world's
// own ranks proved themselves under the default), with a warning, and the
// world is unaffected.
func TestTCPSilentClientClosed(t *testing.T) {
	server := hookServer(t)
	core, logs := observer.New(zapcore.WarnLevel)
	ln, port := tcpListen(t)
	ctx, cancel := context.WithTimeout(t.Context(), hang)
	defer cancel()
	cfgs := map[int]TCPConfig{0: tcpCfg(port, 0, 2), 1: tcpCfg(port, 1, 2)}
	c0 := cfgs[0]
	c0.Log = zap.New(core)
	cfgs[0] = c0
	gs, errs := joinTCP(ctx, ln, port, 2, cfgs)
	defer func() {
		for r := 1; r >= 0; r-- {
			if gs[r] != nil {
				gs[r].Close()
			}
		}
	}()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	s := server()
	s.handshake.Store(int64(100 * time.Millisecond))
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(hang))
	h, _, err := readFrameMax(c, maxHandshakePayload, nil)
	if err != nil || h.Type != fChallenge {
		t.Fatalf("the server's first frame: %v, %v", h.Type, err)
	}
	if n, err := io.Copy(io.Discard, c); (err != nil && !errors.Is(err, syscall.ECONNRESET)) || n != 0 {
		t.Errorf("after the challenge: %d bytes, %v; want the connection closed by the server", n, err)
	}
	waitFor(t, "the refusal to be counted", func() bool { return s.refused.Load() == 1 })
	if logs.FilterMessageSnippet("refused a connection").FilterField(zap.String("why", "no hello within 100ms")).Len() != 1 {
		t.Errorf("no warning saying the connection sent no hello in time: %v", logs.All())
	}
	each(t, gs, func(g Group) error { return g.Barrier(ctx) })
}

// TestTCPWrongSecretRank: a rank whose secret is not the world's is
// refused, saying so, without harm to the forming world, which a rank
// with the right secret then completes.
func TestTCPWrongSecretRank(t *testing.T) {
	ln, port := tcpListen(t)
	server := hookServer(t)
	ctx, cancel := context.WithTimeout(t.Context(), hang)
	defer cancel()
	var wg sync.WaitGroup
	var gs [3]Group
	var errs [3]error
	wg.Go(func() { gs[0], errs[0] = NewTCPWithListener(ctx, tcpCfg(port, 0, 3), ln) })
	wg.Go(func() { gs[1], errs[1] = NewTCP(ctx, tcpCfg(port, 1, 3)) })
	waitFor(t, "ranks 0 and 1 to join", seen(server, 0, 1))
	bad := tcpCfg(port, 2, 3)
	bad.Secret = "another-secret-entirely"
	_, err := NewTCP(ctx, bad)
	if err == nil || !strings.Contains(err.Error(), "refused") || !strings.Contains(err.Error(), "GOEP_WORLD_SECRET") {
		t.Errorf("rank 2 with another secret: %v, want a refusal naming GOEP_WORLD_SECRET", err)
	}
	gs[2], errs[2] = NewTCP(ctx, tcpCfg(port, 2, 3))
	wg.Wait()
	defer func() {
		for r := 2; r >= 0; r-- {
			if gs[r] != nil {
				gs[r].Close()
			}
		}
	}()
	if err := errors.Join(errs[:]...); err != nil {
		t.Fatal(err)
	}
	each(t, gs[:], func(g Group) error { return g.Barrier(ctx) })
}

// TestTCPFakeRankZero: a process listening where rank 0 should, but not
// holding the world secret, is found out before a rank trusts anything it
// says, and a huge frame from it is not read.
func TestTCPFakeRankZero(t *testing.T) {
	for _, tc := range []struct {
		name, want string
		answer     func(c net.Conn, ch challengeMsg)
	}{
		{"wrong proof", "does not prove the world secret", func(c net.Conn, ch challengeMsg) {
			readFrameMax(c, maxHandshakePayload, nil)
			writeFrame(c, frameHeader{Type: fProof, Rank: 1}, make([]byte, macLen))
		}},
		{"huge frame", "before the connection proved itself", func(c net.Conn, _ challengeMsg) {
			readFrameMax(c, maxHandshakePayload, nil)
			c.Write(appendHeader(nil, frameHeader{Type: fWelcome, Len: maxFramePayload}))
			c.Write(make([]byte, 1<<20))
		}},
		{"no challenge", "not a challenge", func(c net.Conn, _ challengeMsg) {
			writeFrame(c, frameHeader{Type: fWelcome}, encodeAddrs([]string{"", ""}))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ln, port := tcpListen(t)
			defer ln.Close()
			go func() {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				defer c.Close()
				ch := challengeMsg{Magic: tcpMagic, Version: tcpVersion, Nonce: newNonce()}
				if tc.name != "no challenge" {
					writeFrame(c, frameHeader{Type: fChallenge, Rank: -1}, ch.encode())
				}
				tc.answer(c, ch)
				io.Copy(io.Discard, c)
			}()
			ctx, cancel := context.WithTimeout(t.Context(), hang)
			defer cancel()
			_, err := NewTCP(ctx, tcpCfg(port, 1, 2))
			if err == nil || !strings.Contains(err.Error(), tc.want) || errors.Is(err, ErrTimeout) {
				t.Errorf("%v, want an error saying %q", err, tc.want)
			}
		})
	}
}

// TestTCPDepartures: a launcher's news that a rank's process ended fails
// the join at once on every rank still joining, with a *PeerLostError
// naming it: on ranks told directly, and through rank 0 on ranks told
// nothing (a launcher that reached only rank 0).
func TestTCPDepartures(t *testing.T) {
	const cause = "its process exited with status 0"
	for _, tc := range []struct {
		name string
		told []int // the ranks that hear the news
	}{
		{"every rank told", []int{0, 1}},
		{"rank 0 told", []int{0}},
		{"rank 1 told", []int{1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ln, port := tcpListen(t)
			server := hookServer(t)
			ctx, cancel := context.WithTimeout(t.Context(), hang)
			defer cancel()
			news := map[int]chan Departure{}
			cfgs := map[int]TCPConfig{}
			for r := range 2 { // rank 2 of 3 never comes
				cfgs[r] = tcpCfg(port, r, 3)
			}
			for _, r := range tc.told {
				news[r] = make(chan Departure, 1)
				c := cfgs[r]
				c.Departures = news[r]
				cfgs[r] = c
			}
			done := make(chan struct{})
			var gs []Group
			var errs []error
			go func() {
				defer close(done)
				gs, errs = joinTCP(ctx, ln, port, 3, cfgs)
			}()
			waitFor(t, "ranks 0 and 1 to join", seen(server, 0, 1))
			start := time.Now()
			for _, ch := range news {
				ch <- Departure{Rank: 2, Cause: cause}
			}
			<-done
			if d := time.Since(start); d > slack {
				t.Errorf("the joins failed %v after the news", d)
			}
			for r := range 2 {
				if gs[r] != nil {
					gs[r].Close()
				}
				wantLost(t, fmt.Sprintf("rank %d", r), errs[r], []int{2})
				if errs[r] == nil || !strings.Contains(errs[r].Error(), cause) {
					t.Errorf("rank %d: %v, want the cause %q", r, errs[r], cause)
				}
			}
		})
	}
	// Rank 0 itself never came: the others, dialling, fail on the news.
	t.Run("rank 0 gone", func(t *testing.T) {
		port := freeTCPPort(t)
		ctx, cancel := context.WithTimeout(t.Context(), hang)
		defer cancel()
		ch := make(chan Departure, 1)
		cfg := tcpCfg(port, 1, 2)
		cfg.Departures = ch
		dialled := make(chan struct{})
		var once sync.Once
		testHookDialFailed = func(int) { once.Do(func() { close(dialled) }) }
		defer func() { testHookDialFailed = nil }()
		errc := make(chan error, 1)
		go func() { _, err := NewTCP(ctx, cfg); errc <- err }()
		<-dialled
		ch <- Departure{Rank: 0, Cause: "its process was killed by signal 9"}
		wantLost(t, "rank 1", <-errc, []int{0})
	})
	// Rank 0 stopped on a departure before it could tell this rank (its
	// connection is cut mid-handshake): the launcher's news of that
	// departure, not the broken connection, is the cause.
	for _, news := range []bool{true, false} {
		t.Run(fmt.Sprintf("server cut, news=%v", news), func(t *testing.T) {
			ln, port := tcpListen(t)
			go func() {
				if c, err := ln.Accept(); err == nil {
					c.Close()
				}
			}()
			ctx, cancel := context.WithTimeout(t.Context(), hang)
			defer cancel()
			ch := make(chan Departure, 1)
			if news {
				// The news comes after the cut, as when this rank's
				// launcher is slower to tell it than rank 0's.
				testHookHandshakeBroke = func(int) { ch <- Departure{Rank: 2, Cause: "its process exited with status 3"} }
				defer func() { testHookHandshakeBroke = nil }()
			}
			cfg := tcpCfg(port, 1, 3)
			cfg.Departures = ch
			_, err := NewTCP(ctx, cfg)
			if news {
				wantLost(t, "rank 1", err, []int{2})
				if err == nil || !strings.Contains(err.Error(), "status 3") {
					t.Errorf("rank 1: %v, want the launcher's cause", err)
				}
			} else {
				wantLost(t, "rank 1", err, []int{0})
			}
		})
	}
}

// TestTCPAbort: a rank that aborts (a signal: comm.Abort) fails its own
// calls at once with ErrAborted, and every other rank's with a lost peer
// naming it, with its reason; rank 0 too, whose server then stops.
func TestTCPAbort(t *testing.T) {
	for _, victim := range []int{2, 0} {
		t.Run(fmt.Sprintf("rank=%d", victim), func(t *testing.T) {
			gs := tcpWorld(t, 3)
			ctx, cancel := context.WithTimeout(t.Context(), hang)
			defer cancel()
			errs := make([]error, 3)
			var others []int
			var wg sync.WaitGroup
			for r, g := range gs {
				if r != victim {
					others = append(others, r)
				}
				wg.Go(func() {
					if r == victim {
						// A call of its own in flight (over the peer
						// connections, which the others do not call): it
						// fails at once.
						_, errs[r] = g.AllToAll(ctx, make([][]byte, 3))
					} else {
						errs[r] = g.Barrier(ctx)
					}
				})
			}
			waitFor(t, "the others to wait in a barrier", arrived(serverOf(gs[0]), 0, others...))
			start := time.Now()
			if !Abort(gs[victim], "interrupted by SIGTERM") {
				t.Fatal("Abort: not supported by a TCP group")
			}
			wg.Wait()
			if d := time.Since(start); d > slack {
				t.Errorf("calls failed %v after the abort", d)
			}
			for r, err := range errs {
				if r == victim {
					if !errors.Is(err, ErrAborted) || !strings.Contains(err.Error(), "interrupted by SIGTERM") {
						t.Errorf("rank %d (aborted): %v, want ErrAborted with the reason", r, err)
					}
					continue
				}
				wantLost(t, fmt.Sprintf("rank %d", r), err, []int{victim})
				if err == nil || !strings.Contains(err.Error(), "interrupted by SIGTERM") {
					t.Errorf("rank %d: %v, want the reason", r, err)
				}
			}
			// Later calls of the aborted rank fail at once too.
			if err := gs[victim].Barrier(ctx); !errors.Is(err, ErrAborted) {
				t.Errorf("rank %d's next call: %v, want ErrAborted", victim, err)
			}
			Abort(gs[victim], "again") // nothing
		})
	}
	if Abort(NewLocal(1)[0], "x") {
		t.Error("Abort: an in-process group says it supports it")
	}
}

// TestTCPAbortThenClose: a rank whose call fails on its own abort closes
// its group at once, as a program shutting down on a signal does; that
// Close must not overtake the abort, or a peer would hear a bye before the
// abort notice and take the rank for one that exited cleanly. The others
// wait in an AllToAll over the peer connections, where both would arrive.
// A hook holds the abort's notices until the Close has begun.
func TestTCPAbortThenClose(t *testing.T) {
	testHookAbortRecorded = func(c *tcpClient) {
		waitFor(t, "the aborted rank to close", func() bool {
			c.mu.Lock()
			defer c.mu.Unlock()
			return c.closed
		})
	}
	defer func() { testHookAbortRecorded = nil }()
	for round := range 3 {
		gs := tcpWorld(t, 3)
		ctx, cancel := context.WithTimeout(t.Context(), hang)
		errs := make([]error, 3)
		var wg sync.WaitGroup
		for _, r := range []int{0, 2} {
			wg.Go(func() { _, errs[r] = gs[r].AllToAll(ctx, make([][]byte, 3)) })
		}
		victimDone := make(chan struct{})
		go func() {
			defer close(victimDone)
			errs[1] = gs[1].Barrier(ctx) // fails once the abort is recorded
			gs[1].Close()
		}()
		waitFor(t, "rank 1 to wait in a barrier", arrived(serverOf(gs[0]), 0, 1))
		Abort(gs[1], "interrupted by SIGTERM")
		wg.Wait()
		<-victimDone
		cancel()
		if !errors.Is(errs[1], ErrAborted) {
			t.Errorf("round %d: rank 1 (aborted): %v, want ErrAborted", round, errs[1])
		}
		for _, r := range []int{0, 2} {
			wantLost(t, fmt.Sprintf("round %d: rank %d", round, r), errs[r], []int{1})
			if errs[r] == nil || !strings.Contains(errs[r].Error(), "interrupted by SIGTERM") {
				t.Errorf("round %d: rank %d: %v, want the abort's reason", round, r, errs[r])
			}
		}
	}
}

// TestTCPByeNamesTheLost: a rank whose call failed on a lost peer closes
// at once, and its bye can reach a rank still waiting for its part before
// that rank sees the loss itself; the bye carries the ranks it had seen
// lost, so the waiting call blames them, not the rank that closed. Rank 1
// is told of rank 2's loss (as the server would tell it) while rank 2,
// alive, only waits: rank 0 can learn of it from rank 1's bye alone.
func TestTCPByeNamesTheLost(t *testing.T) {
	gs := tcpWorld(t, 3)
	ctx, cancel := context.WithTimeout(t.Context(), hang)
	defer cancel()
	errc := make(chan error, 1)
	go func() { _, err := gs[0].AllToAll(ctx, make([][]byte, 3)); errc <- err }()
	c1 := gs[1].(*tcpGroup).c
	c1.mu.Lock()
	c1.lost[2] = "its process was killed by signal 9"
	c1.mu.Unlock()
	gs[1].Close()
	err := <-errc
	wantLost(t, "rank 0", err, []int{2})
	if err == nil || !strings.Contains(err.Error(), "killed by signal 9") || !strings.Contains(err.Error(), "rank 1 closed the group") {
		t.Errorf("rank 0: %v, want rank 2's loss as rank 1 saw it", err)
	}
}

// TestDeparturesEncoding: a bye's news decodes to what was encoded, and
// what is malformed or out of range is dropped, keeping what came before.
func TestDeparturesEncoding(t *testing.T) {
	d := map[int]string{0: "", 3: "peer connection broke: read: EOF", 7: "aborted: SIGTERM"}
	if got := decodeDepartures(appendDepartures(nil, d), 8); !maps.Equal(got, d) {
		t.Errorf("round trip: %v, want %v", got, d)
	}
	if got := decodeDepartures(appendDepartures(nil, d), 5); !maps.Equal(got, map[int]string{0: "", 3: d[3]}) {
		t.Errorf("limit 5: %v, want ranks 0 and 3", got)
	}
	b := appendDepartures(nil, map[int]string{1: "x"})
	b = binary.LittleEndian.AppendUint32(b, 2)
	b = binary.LittleEndian.AppendUint32(b, 1<<30) // longer than what follows
	if got := decodeDepartures(b, 8); !maps.Equal(got, map[int]string{1: "x"}) {
		t.Errorf("truncated: %v, want rank 1 only", got)
	}
	if got := decodeDepartures(nil, 8); len(got) != 0 {
		t.Errorf("empty: %v", got)
	}
}
