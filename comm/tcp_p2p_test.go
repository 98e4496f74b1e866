package comm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
	"golang.org/x/sync/errgroup"
)

// tcpWorldOpts is tcpWorld with per-rank options; it takes a testing.TB so
// that benchmarks can use it.
func tcpWorldOpts(tb testing.TB, n int, opt func(rank int) tcpOptions) []Group {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	gs := make([]Group, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Go(func() {
			var l net.Listener
			if r == 0 {
				l = ln
			}
			gs[r], errs[r] = newTCP(ctx, tcpCfg(port, r, n), l, opt(r))
		})
	}
	wg.Wait()
	tb.Cleanup(func() {
		for r := n - 1; r >= 0; r-- {
			if gs[r] != nil {
				gs[r].Close()
			}
		}
	})
	if err := errors.Join(errs...); err != nil {
		tb.Fatal(err)
	}
	return gs
}

func noOpts(int) tcpOptions { return tcpOptions{} }

// a2aByte is byte i of what rank src sends rank dst in round: every byte
// names its source, destination and round (modulo 256, so that the bytes
// repeat every 256).
func a2aByte(src, dst, round, i int) byte { return byte(src*37 + dst*11 + round*5 + i) }

// a2aFill sets b[i] to a2aByte(src, dst, round, i) for every i: the first
// 256 bytes one by one, the rest by copying them (a few copies instead of
// a loop over every byte, which the race detector makes slow).
func a2aFill(b []byte, src, dst, round int) {
	n := min(len(b), 256)
	for i := range n {
		b[i] = a2aByte(src, dst, round, i)
	}
	for done := n; done < len(b); done *= 2 {
		copy(b[done:], b[:done])
	}
}

// a2aRound runs one AllToAll of g in which rank src sends size(src, dst)
// bytes to dst, and checks every byte that arrives.
func a2aRound(ctx context.Context, g Group, round int, size func(src, dst int) int) error {
	me := g.Rank()
	send := make([][]byte, g.Size())
	for p := range send {
		send[p] = make([]byte, size(me, p))
		a2aFill(send[p], me, p, round)
	}
	got, err := g.AllToAll(ctx, send)
	if err != nil {
		return err
	}
	if len(got) != g.Size() {
		return fmt.Errorf("rank %d round %d: %d buffers", me, round, len(got))
	}
	var want []byte
	for src, b := range got {
		if n := size(src, me); len(b) != n {
			return fmt.Errorf("rank %d round %d: %d bytes from rank %d, want %d", me, round, len(b), src, n)
		}
		want = slices.Grow(want[:0], len(b))[:len(b)]
		a2aFill(want, src, me, round)
		if !bytes.Equal(b, want) {
			i := 0
			for b[i] == want[i] {
				i++
			}
			return fmt.Errorf("rank %d round %d: byte %d from rank %d is %d, want %d", me, round, i, src, b[i], want[i])
		}
	}
	// The result is the caller's: it must not alias send.
	if len(got[me]) > 0 && &got[me][0] == &send[me][0] {
		return fmt.Errorf("rank %d: own part aliases send", me)
	}
	return nil
}

// wantDirect checks that every rank of the world has a peer connection to
// every other one.
func wantDirect(t *testing.T, gs []Group) {
	t.Helper()
	for r, g := range gs {
		var want []int
		for p := range gs {
			if p != r {
				want = append(want, p)
			}
		}
		if got := g.(*tcpGroup).c.directPeers(); !slices.Equal(got, want) {
			t.Fatalf("rank %d has peer connections to %v, want %v", r, got, want)
		}
	}
}

func TestTCPDirectAllToAll(t *testing.T) {
	gs := tcpWorldOpts(t, 5, noOpts)
	wantDirect(t, gs)
	for _, tc := range []struct {
		name string
		size func(src, dst int) int
	}{
		{"differing", func(src, dst int) int { return src + 2*dst }},
		{"empty", func(src, dst int) int { return 0 }},
		{"some empty", func(src, dst int) int { return (src + dst) % 2 * 100 }},
		{"self only", func(src, dst int) int {
			if src == dst {
				return 9
			}
			return 0
		}},
		// Two write pieces, the second of a length that differs by rank;
		// no larger, since under the race detector every byte costs.
		{"large", func(src, dst int) int { return writePiece + src*1000 + dst }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			each(t, gs, func(g Group) error {
				for round := range 3 {
					if err := a2aRound(t.Context(), g, round, tc.size); err != nil {
						return err
					}
				}
				return nil
			})
		})
	}
	// The other collectives still go through the relay in between.
	each(t, gs, func(g Group) error { return checkAllToAll(t.Context(), g, 3) })
}

func TestTCPDirectManyRounds(t *testing.T) {
	gs := tcpWorldOpts(t, 4, noOpts)
	each(t, gs, func(g Group) error {
		for round := range 300 {
			size := func(src, dst int) int { return (src*7 + dst*3 + round) % 50 }
			if err := a2aRound(t.Context(), g, round, size); err != nil {
				return err
			}
			if round%50 == 0 { // relayed rounds between direct ones share the sequence
				if err := g.Barrier(t.Context()); err != nil {
					return err
				}
			}
		}
		return nil
	})
}

func TestTCPDirectSubgroups(t *testing.T) {
	gs := tcpWorldOpts(t, 6, noOpts)
	each(t, gs, func(g Group) error {
		ctx := t.Context()
		sub, err := g.Split(ctx, g.Rank()%2, -g.Rank()) // {4,2,0} and {5,3,1}
		if err != nil {
			return err
		}
		defer sub.Close()
		subsub, err := sub.Split(ctx, min(sub.Rank(), 1), sub.Rank()) // a single and a pair
		if err != nil {
			return err
		}
		defer subsub.Close()
		for round := range 20 {
			size := func(src, dst int) int { return (src+1)*(dst+2)*round%700 + round/19*(1<<20) } // large in the last round
			for _, gg := range []Group{sub, g, subsub} {
				if err := a2aRound(ctx, gg, round, size); err != nil {
					return fmt.Errorf("group of %d: %w", gg.Size(), err)
				}
			}
		}
		return nil
	})
}

// TestTCPDirectConcurrentGroups runs AllToAlls of the world and of two
// sub-groups on different goroutines at once: they share the peer
// connections.
func TestTCPDirectConcurrentGroups(t *testing.T) {
	gs := tcpWorldOpts(t, 4, noOpts)
	subs := make([][]Group, 4)
	each(t, gs, func(g Group) error {
		same, err := g.Split(t.Context(), 0, -g.Rank()) // every rank, reversed
		if err != nil {
			return err
		}
		pair, err := g.Split(t.Context(), g.Rank()/2, 0) // {0,1} and {2,3}
		if err != nil {
			return err
		}
		subs[g.Rank()] = []Group{g, same, pair}
		return nil
	})
	each(t, gs, func(g Group) error {
		var eg errgroup.Group
		for k, gg := range subs[g.Rank()] {
			eg.Go(func() error {
				for round := range 60 {
					size := func(src, dst int) int { return (src+k+1)*(dst+1)*(round%5)*3000 + k }
					if err := a2aRound(t.Context(), gg, round, size); err != nil {
						return fmt.Errorf("group %d: %w", k, err)
					}
				}
				return nil
			})
		}
		return eg.Wait()
	})
}

func TestTCPDirectTimeout(t *testing.T) {
	gs := tcpWorldOpts(t, 4, noOpts)
	subs := make([]Group, 4)
	each(t, gs, func(g Group) (err error) {
		subs[g.Rank()], err = g.Split(t.Context(), 0, -g.Rank()) // world rank 3 is rank 0 there
		return err
	})
	for _, tc := range []struct {
		name    string
		groups  []Group
		missing []int
	}{
		{"world", gs, []int{3}},
		{"sub-group", subs, []int{0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			errs := make([]error, 3)
			var wg sync.WaitGroup
			for r := range 3 { // world rank 3 never calls
				// Each rank's deadline comes once it holds the parts of
				// the other two that call.
				var others []int
				for p := range 3 {
					if p != r {
						others = append(others, tc.groups[p].Rank())
					}
				}
				ctx := expireWhen(t, hasParts(tc.groups[r], others...))
				wg.Go(func() {
					errs[r] = a2aRound(ctx, tc.groups[r], 0, func(src, dst int) int { return 1000 })
					if d := time.Since(ctx.expiredAt()); d > slack {
						t.Errorf("world rank %d: alltoall returned %v after its deadline", r, d)
					}
				})
			}
			wg.Wait()
			for r := range 3 {
				wantTimeout(t, fmt.Sprintf("world rank %d", r), errs[r], tc.missing)
			}
		})
	}
}

func TestTCPDirectPeerKilled(t *testing.T) {
	gs := tcpWorldOpts(t, 4, noOpts)
	pairs := make([]Group, 4)
	each(t, gs, func(g Group) (err error) {
		pairs[g.Rank()], err = g.Split(t.Context(), g.Rank()/2, 0) // {0,1} and {2,3}
		return err
	})
	// Rank 3 dies once the others wait for its parts only.
	killMidCall(t, gs, 3, "ranks 0 to 2 to hold each other's parts",
		func() bool { return hasParts(gs[0], 1, 2)() && hasParts(gs[1], 0, 2)() && hasParts(gs[2], 0, 1)() },
		func(ctx context.Context, g Group) error {
			return a2aRound(ctx, g, 0, func(src, dst int) int { return 1 << 20 })
		})
	// Later calls fail at once, in the world and in {2,3} (where rank 3
	// is rank 1); {0,1} still works.
	each(t, gs[:3], func(g Group) error {
		ctx, cancel := context.WithTimeout(t.Context(), hang)
		defer cancel()
		_, err := g.AllToAll(ctx, make([][]byte, 4))
		wantLost(t, fmt.Sprintf("rank %d, next call", g.Rank()), err, []int{3})
		pair := pairs[g.Rank()]
		err = a2aRound(ctx, pair, 1, func(src, dst int) int { return 10 })
		if g.Rank() == 2 {
			wantLost(t, "rank 2 in {2,3}", err, []int{1})
		} else if err != nil {
			t.Errorf("rank %d in {0,1}: %v", g.Rank(), err)
		}
		return nil
	})
}

func TestTCPDirectCloseReleasesWaiters(t *testing.T) {
	gs := tcpWorldOpts(t, 3, noOpts)
	subs := make([]Group, 3)
	each(t, gs, func(g Group) (err error) {
		subs[g.Rank()], err = g.Split(t.Context(), 0, 0)
		return err
	})
	for _, tc := range []struct {
		name   string
		groups []Group
	}{{"sub-group", subs}, {"world", gs}} {
		t.Run(tc.name, func(t *testing.T) {
			done := make(chan error, 2)
			for r := range 2 {
				go func() { done <- a2aRound(t.Context(), tc.groups[r], 0, func(int, int) int { return 5 }) }()
			}
			// Rank 2 closes once the others wait for its parts only.
			g0, g1 := tc.groups[0], tc.groups[1]
			waitFor(t, "ranks 0 and 1 to hold each other's parts", func() bool {
				return hasParts(g0, g1.Rank())() && hasParts(g1, g0.Rank())()
			})
			tc.groups[2].Close()
			for range 2 {
				wantClosed(t, "alltoall", done)
			}
			if _, err := tc.groups[2].AllToAll(t.Context(), make([][]byte, 3)); !errors.Is(err, ErrClosed) {
				t.Errorf("alltoall on the closed rank: %v, want ErrClosed", err)
			}
		})
	}
}

// TestTCPDirectLastCallThenClose: ranks that finish the last call and
// close at once must not fail a slower rank whose parts from them, or from
// others, are still on the way.
func TestTCPDirectLastCallThenClose(t *testing.T) {
	for range 3 {
		gs := tcpWorldOpts(t, 4, noOpts)
		subs := make([]Group, 4)
		each(t, gs, func(g Group) (err error) {
			subs[g.Rank()], err = g.Split(t.Context(), 0, 0)
			return err
		})
		each(t, gs, func(g Group) error {
			size := func(src, dst int) int { return (src + 1) << 19 }
			if err := a2aRound(t.Context(), subs[g.Rank()], 0, size); err != nil {
				return err
			}
			subs[g.Rank()].Close()
			if err := a2aRound(t.Context(), g, 0, size); err != nil {
				return err
			}
			return g.Close()
		})
	}
}

func TestTCPDirectCancel(t *testing.T) {
	gs := tcpWorldOpts(t, 3, noOpts)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { _, err := gs[0].AllToAll(ctx, make([][]byte, 3)); done <- err }()
	waitFor(t, "rank 0 to start its alltoall", inCall(gs[0]))
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("cancelled alltoall: %v, want context.Canceled", err)
		}
	case <-time.After(hang):
		t.Fatal("cancel left the alltoall hanging")
	}
}

// TestTCPDirectFallback: a rank without a peer listener makes the whole
// world relay AllToAll, which must still be right.
func TestTCPDirectFallback(t *testing.T) {
	gs := tcpWorldOpts(t, 4, func(r int) tcpOptions { return tcpOptions{relay: r == 2} })
	for r, g := range gs {
		if g.(*tcpGroup).c.mesh != nil {
			t.Fatalf("rank %d uses direct AllToAll though rank 2 has no peer address", r)
		}
	}
	each(t, gs, func(g Group) error {
		for round := range 3 {
			// Up to 768 KiB a part: frames of several write pieces and
			// read-buffer growths through the relay.
			if err := a2aRound(t.Context(), g, round, func(src, dst int) int { return src*(256<<10) + dst }); err != nil {
				return err
			}
		}
		return checkAllToAll(t.Context(), g, 5)
	})
}

// TestTCPPeerHelloRejectsStrays: the peer listener drops connections that
// do not open with a hello of this world for this rank that proves the
// world secret for this connection's challenge, each with a warning, and
// keeps waiting for the real peer, which a silent connection does not
// hold up either.
func TestTCPPeerHelloRejectsStrays(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	const world = 0x1234
	core, logs := observer.New(zapcore.WarnLevel)
	me := meshAuth{me: 1, size: 2, worldID: world, secret: testSecret, log: zap.New(core)}
	type res struct {
		peers []*peerConn
		err   error
	}
	done := make(chan res, 1)
	go func() {
		ctx, cancel := context.WithTimeout(t.Context(), hang) // meshTimeout bounds it too
		defer cancel()
		peers, err := connectMesh(ctx, ln, me, []string{"unused:1", addr}) // rank 1 of 2
		done <- res{peers, err}
	}()
	frame := func(h frameHeader, p []byte) []byte {
		var b []byte
		w := writerFunc(func(p []byte) (int, error) { b = append(b, p...); return len(p), nil })
		writeFrame(w, h, p)
		return b
	}
	// hello is rank's hello to rank `to`, answering challenge ch, with the
	// given secret and world.
	hello := func(ch challengeMsg, rank, to, size int, id uint64, secret string) []byte {
		m := peerHello{Magic: tcpMagic, Version: tcpVersion, Size: size, To: to, Nonce: newNonce()}
		m.MAC = peerMAC(secret, "peer dial", ch.Nonce, m.Nonce, rank, to, size, id)
		return frame(frameHeader{Type: fPeerHello, Seq: id, Rank: int32(rank)}, m.encode())
	}
	// dial connects to the listener and reads its challenge.
	dial := func(name string) (net.Conn, challengeMsg) {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		c.SetReadDeadline(time.Now().Add(hang))
		h, p, err := readFrameMax(c, maxHandshakePayload, nil)
		if err != nil || h.Type != fChallenge {
			t.Fatalf("%s: the listener's first frame: %v %v", name, h.Type, err)
		}
		ch, err := decodeChallenge(p)
		if err != nil {
			t.Fatal(err)
		}
		return c, ch
	}
	// A connection that says nothing stays open while the real peer comes.
	silent, _ := dial("silent")
	defer silent.Close()
	strays := []struct {
		name string
		data func(ch challengeMsg) []byte
	}{
		{"garbage", func(challengeMsg) []byte { return []byte("GET / HTTP/1.1\r\nHost: example.com\r\n\r\n") }},
		{"huge frame", func(challengeMsg) []byte {
			return append(appendHeader(nil, frameHeader{Type: fPeerHello, Rank: 0, Seq: world, Len: maxFramePayload}), make([]byte, 64<<10)...)
		}},
		{"no secret", func(ch challengeMsg) []byte { return hello(ch, 0, 1, 2, world, "") }},
		{"wrong secret", func(ch challengeMsg) []byte { return hello(ch, 0, 1, 2, world, testSecret+"x") }},
		{"replayed", func(challengeMsg) []byte { return hello(challengeMsg{Nonce: newNonce()}, 0, 1, 2, world, testSecret) }},
		{"another world", func(ch challengeMsg) []byte { return hello(ch, 0, 1, 2, world+1, testSecret) }},
		{"wrong rank", func(ch challengeMsg) []byte { return hello(ch, 0, 0, 2, world, testSecret) }},
		{"wrong size", func(ch challengeMsg) []byte { return hello(ch, 0, 1, 3, world, testSecret) }},
		{"higher rank", func(ch challengeMsg) []byte { return hello(ch, 1, 1, 2, world, testSecret) }},
	}
	for _, stray := range strays {
		c, ch := dial(stray.name)
		c.Write(stray.data(ch))
		if n, err := io.Copy(io.Discard, c); (err != nil && !errors.Is(err, syscall.ECONNRESET)) || n != 0 {
			t.Errorf("%s: got %d bytes back after the challenge, %v; want the connection closed without an answer", stray.name, n, err)
		}
		c.Close()
	}
	// The real rank 0.
	dialer := meshAuth{me: 0, size: 2, worldID: world, secret: testSecret}
	conn, err := dialPeer(t.Context(), dialer, 1, addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	r := <-done
	if r.err != nil || r.peers[0] == nil {
		t.Fatalf("connectMesh: %v, %v", r.peers, r.err)
	}
	r.peers[0].conn.Close()
	if n := logs.FilterMessageSnippet("refused a connection").Len(); n != len(strays) {
		t.Errorf("%d warnings of a refused connection, want %d: %v", n, len(strays), logs.All())
	}
	// The silent connection is closed once the mesh is built.
	silent.SetReadDeadline(time.Now().Add(hang))
	if n, err := io.Copy(io.Discard, silent); (err != nil && !errors.Is(err, syscall.ECONNRESET)) || n != 0 {
		t.Errorf("silent: got %d bytes, %v; want the connection closed", n, err)
	}

	// A dialler answered by a rank of another world, or by one that does
	// not prove the secret, gives up.
	for _, tc := range []struct {
		name, want string
		id         uint64
		secret     string
	}{
		{"another world", "world", world + 1, testSecret},
		{"wrong secret", "does not prove the world secret", world, testSecret + "x"},
	} {
		ln2, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			c, err := ln2.Accept()
			if err != nil {
				return
			}
			defer c.Close()
			ch := challengeMsg{Magic: tcpMagic, Version: tcpVersion, Nonce: newNonce()}
			c.Write(frame(frameHeader{Type: fChallenge, Rank: 1}, ch.encode()))
			h, p, err := readFrameMax(c, maxHandshakePayload, nil)
			if err != nil {
				return
			}
			m, _ := decodePeerHello(p)
			reply := peerHello{Magic: tcpMagic, Version: tcpVersion, Size: 2, To: 0, Nonce: ch.Nonce,
				MAC: peerMAC(tc.secret, "peer accept", m.Nonce, ch.Nonce, 1, int(h.Rank), 2, tc.id)}
			c.Write(frame(frameHeader{Type: fPeerHello, Seq: tc.id, Rank: 1}, reply.encode()))
			io.Copy(io.Discard, c)
		}()
		if _, err := dialPeer(t.Context(), dialer, 1, ln2.Addr().String()); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("dialPeer answered by %s: %v, want an error saying %q", tc.name, err, tc.want)
		}
		ln2.Close()
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// BenchmarkTCPAllToAll compares the relayed AllToAll with the direct one:
// 4 ranks (goroutines of this process, over loopback), each sending bytes
// to every rank. SetBytes counts what one rank sends to the others per
// call, so MB/s is per-rank send bandwidth.
func BenchmarkTCPAllToAll(b *testing.B) {
	const ranks = 4
	gs := tcpWorldOpts(b, ranks, noOpts)
	for _, size := range []int{4 << 10, 256 << 10, 4 << 20} {
		for _, impl := range []string{"relay", "direct"} {
			b.Run(fmt.Sprintf("impl=%s/ranks=%d/bytes=%d", impl, ranks, size), func(b *testing.B) {
				sends := make([][][]byte, ranks)
				for r := range sends {
					sends[r] = make([][]byte, ranks)
					for p := range sends[r] {
						sends[r][p] = make([]byte, size)
					}
				}
				b.SetBytes(int64((ranks - 1) * size))
				for b.Loop() {
					var eg errgroup.Group
					for r, g := range gs {
						eg.Go(func() error {
							tg := g.(*tcpGroup)
							var err error
							if impl == "relay" {
								_, err = tg.allToAllRelay(context.Background(), sends[r])
							} else {
								_, err = tg.AllToAll(context.Background(), sends[r])
							}
							return err
						})
					}
					if err := eg.Wait(); err != nil {
						b.Fatal(err)
					}
				}
				secs := b.Elapsed().Seconds()
				b.ReportMetric(float64(b.N)*float64(ranks*(ranks-1)*size)/secs/1e9, "GB/s")
			})
		}
	}
}
