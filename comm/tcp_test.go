package comm

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/goep/goep/internal/ranktest"
	"golang.org/x/sync/errgroup"
)

// tcpListen opens rank 0's listener on a free loopback port.
func tcpListen(t *testing.T) (net.Listener, int) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return ln, ln.Addr().(*net.TCPAddr).Port
}

// testSecret is the world secret of the tests' worlds.
const testSecret = "0123456789abcdef-test-world-secret"

func tcpCfg(port, rank, size int) TCPConfig {
	return TCPConfig{Addr: "127.0.0.1", Port: port, Rank: rank, Size: size, LocalRank: rank, LocalSize: size, Secret: testSecret}
}

// joinTCP calls NewTCP (NewTCPWithListener on rank 0) for the given ranks
// of a world of size n, each on its own goroutine, and returns their groups
// and errors by rank (nil for ranks not started).
func joinTCP(ctx context.Context, ln net.Listener, port, n int, cfgs map[int]TCPConfig) ([]Group, []error) {
	gs := make([]Group, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r, cfg := range cfgs {
		wg.Go(func() {
			if r == 0 && cfg.Rank == 0 {
				gs[r], errs[r] = NewTCPWithListener(ctx, cfg, ln)
			} else {
				gs[r], errs[r] = NewTCP(ctx, cfg)
			}
		})
	}
	wg.Wait()
	return gs, errs
}

// tcpWorld starts n ranks that all join; they are closed when the test ends.
func tcpWorld(t *testing.T, n int) []Group {
	t.Helper()
	ln, port := tcpListen(t)
	cfgs := map[int]TCPConfig{}
	for r := range n {
		cfgs[r] = tcpCfg(port, r, n)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	gs, errs := joinTCP(ctx, ln, port, n, cfgs)
	t.Cleanup(func() {
		for r := n - 1; r >= 0; r-- { // rank 0 (the server) last
			if gs[r] != nil {
				gs[r].Close()
			}
		}
	})
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	return gs
}

func TestTCPCollectives(t *testing.T) {
	gs := tcpWorld(t, 5)
	each(t, gs, func(g Group) error {
		ctx := t.Context()
		if err := ranktest.CheckCollectives(ctx, groupCollectives(g), 20); err != nil {
			return err
		}
		b, err := g.Broadcast(ctx, 2, nil) // an empty broadcast
		if err != nil || len(b) != 0 {
			return fmt.Errorf("empty broadcast: %v, %v", b, err)
		}
		return checkAllToAll(ctx, g, 10)
	})
}

func TestTCPSplit(t *testing.T) {
	gs := tcpWorld(t, 6)
	each(t, gs, func(g Group) error {
		ctx := t.Context()
		sub, err := paritySplit(ctx, g)
		if err != nil {
			return err
		}
		defer sub.Close()
		for range 3 {
			want, err := checkParityOrder(ctx, g, sub)
			if err != nil {
				return err
			}
			b, err := sub.Broadcast(ctx, 0, []byte{byte(g.Rank())})
			if err != nil {
				return err
			}
			if int(b[0]) != want[0] {
				return fmt.Errorf("rank %d: sub broadcast from %d gave %v", g.Rank(), want[0], b)
			}
			if err := sub.Barrier(ctx); err != nil {
				return err
			}
			if err := checkAllToAll(ctx, sub, 7); err != nil {
				return err
			}
			// The world group still works between the sub-group's rounds.
			if err := g.Barrier(ctx); err != nil {
				return err
			}
		}
		// A split of a split: each triple splits into a pair and a single.
		subsub, err := sub.Split(ctx, min(sub.Rank(), 1), sub.Rank())
		if err != nil {
			return err
		}
		defer subsub.Close()
		wantSize := 2
		if sub.Rank() == 0 {
			wantSize = 1
		}
		all, err := subsub.AllGather(ctx, []byte{byte(g.Rank())})
		if err != nil {
			return err
		}
		if subsub.Size() != wantSize || len(all) != wantSize || int(all[subsub.Rank()][0]) != g.Rank() {
			return fmt.Errorf("rank %d: sub-sub group of %d: %v", g.Rank(), subsub.Size(), all)
		}
		return nil
	})
}

// TestTCPConcurrentGroups runs the world group and a sub-group of the same
// ranks on different goroutines at once: their rounds share a connection.
func TestTCPConcurrentGroups(t *testing.T) {
	gs := tcpWorld(t, 4)
	subs := make([]Group, 4)
	each(t, gs, func(g Group) (err error) {
		subs[g.Rank()], err = g.Split(t.Context(), 0, g.Rank())
		return err
	})
	each(t, gs, func(g Group) error {
		var eg errgroup.Group
		for _, gg := range []Group{g, subs[g.Rank()]} {
			eg.Go(func() error {
				for i := range 50 {
					all, err := gg.AllGather(t.Context(), []byte{byte(i), byte(gg.Rank())})
					if err != nil {
						return err
					}
					for r, d := range all {
						if !bytes.Equal(d, []byte{byte(i), byte(r)}) {
							return fmt.Errorf("round %d: %v from rank %d", i, d, r)
						}
					}
				}
				return nil
			})
		}
		return eg.Wait()
	})
}

func TestTCPManyRounds(t *testing.T) {
	gs := tcpWorld(t, 4)
	each(t, gs, func(g Group) error {
		for i := range 300 {
			all, err := g.AllGather(t.Context(), fmt.Appendf(nil, "%d/%d", g.Rank(), i))
			if err != nil {
				return err
			}
			for r, d := range all {
				if string(d) != fmt.Sprintf("%d/%d", r, i) {
					return fmt.Errorf("rank %d round %d: %q from rank %d", g.Rank(), i, d, r)
				}
			}
		}
		return nil
	})
}

func TestTCPSingleRank(t *testing.T) {
	g, err := NewTCP(t.Context(), tcpCfg(0, 0, 1))
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	all, err := g.AllGather(t.Context(), []byte("x"))
	if err != nil || len(all) != 1 || string(all[0]) != "x" {
		t.Fatalf("allgather: %q, %v", all, err)
	}
	if _, err := NewTCP(t.Context(), tcpCfg(0, 0, 2)); err == nil || !strings.Contains(err.Error(), "port 0") {
		t.Errorf("rank 0 of 2 on port 0: %v, want an error about port 0", err)
	}
}

// wantTimeout checks err is a *TimeoutError naming missing.
func wantTimeout(t *testing.T, who string, err error, missing []int) {
	t.Helper()
	var te *TimeoutError
	if !errors.Is(err, ErrTimeout) || !errors.As(err, &te) || !slices.Equal(te.Missing, missing) {
		t.Errorf("%s: %v, want a timeout naming rank(s) %v", who, err, missing)
	}
}

// wantLost checks err is a *PeerLostError naming ranks.
func wantLost(t *testing.T, who string, err error, ranks []int) {
	t.Helper()
	var pe *PeerLostError
	if !errors.Is(err, ErrPeerLost) || !errors.As(err, &pe) || !slices.Equal(pe.Ranks, ranks) {
		t.Errorf("%s: %v, want a lost peer naming rank(s) %v", who, err, ranks)
	}
}

// killMidCall runs call on every rank of gs but victim, kills victim once
// ready (what) holds, and checks that every call fails within slack of the
// kill with victim lost.
func killMidCall(t *testing.T, gs []Group, victim int, what string, ready func() bool, call func(ctx context.Context, g Group) error) {
	t.Helper()
	errs := make([]error, len(gs))
	var wg sync.WaitGroup
	for r, g := range gs {
		if r != victim {
			wg.Go(func() {
				ctx, cancel := context.WithTimeout(t.Context(), hang)
				defer cancel()
				errs[r] = call(ctx, g)
			})
		}
	}
	waitFor(t, what, ready)
	start := time.Now()
	gs[victim].(*tcpGroup).kill()
	wg.Wait()
	if d := time.Since(start); d > slack {
		t.Errorf("lost rank %d found %v after it was killed", victim, d)
	}
	for r, err := range errs {
		if r != victim {
			wantLost(t, fmt.Sprintf("rank %d", r), err, []int{victim})
		}
	}
}

func TestTCPNeverJoins(t *testing.T) {
	ln, port := tcpListen(t)
	cfgs := map[int]TCPConfig{}
	for r := range 3 { // rank 3 of 4 never comes
		cfgs[r] = tcpCfg(port, r, 4)
	}
	// The deadline comes once the server has heard from ranks 0 to 2.
	ctx := expireWhen(t, seen(hookServer(t), 0, 1, 2))
	gs, errs := joinTCP(ctx, ln, port, 4, cfgs)
	if d := time.Since(ctx.expiredAt()); d > 2*queryGrace+slack {
		t.Errorf("NewTCP returned %v after its deadline", d)
	}
	for r := range 3 {
		if gs[r] != nil {
			gs[r].Close()
		}
		wantTimeout(t, fmt.Sprintf("rank %d", r), errs[r], []int{3})
	}
}

func TestTCPNoServer(t *testing.T) {
	silent, port := tcpListen(t) // open...
	defer silent.Close()         // (and kept from the garbage collector, which would close it)
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	_, err := NewTCP(ctx, tcpCfg(port, 1, 2)) // ...but nobody accepts: the dial succeeds, the hello goes unanswered
	wantTimeout(t, "rank 1 with a silent rank 0", err, []int{0})

	ln, port := tcpListen(t)
	ln.Close() // nobody listens
	ctx, cancel = context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	_, err = NewTCP(ctx, tcpCfg(port, 1, 2))
	wantTimeout(t, "rank 1 without rank 0", err, []int{0})
}

func TestTCPLateRankZero(t *testing.T) {
	ln, port := tcpListen(t)
	ctx, cancel := context.WithTimeout(t.Context(), hang)
	defer cancel()
	ln.Close() // rank 0 is not there yet: the others must keep dialling
	// Rank 0 starts once ranks 1 and 2 have each been refused.
	var mu sync.Mutex
	refused := map[int]bool{}
	testHookDialFailed = func(rank int) {
		mu.Lock()
		refused[rank] = true
		mu.Unlock()
	}
	defer func() { testHookDialFailed = nil }()
	var gs [3]Group
	var errs [3]error
	var wg sync.WaitGroup
	for r := 1; r < 3; r++ {
		wg.Go(func() { gs[r], errs[r] = NewTCP(ctx, tcpCfg(port, r, 3)) })
	}
	waitFor(t, "ranks 1 and 2 to be refused by the absent rank 0", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return refused[1] && refused[2]
	})
	gs[0], errs[0] = NewTCP(ctx, tcpCfg(port, 0, 3))
	wg.Wait()
	defer func() {
		for r := 2; r >= 0; r-- { // rank 0 (the server) last
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

func TestTCPCollectiveTimeout(t *testing.T) {
	gs := tcpWorld(t, 4)
	errs := make([]error, 4)
	var wg sync.WaitGroup
	// The deadline comes once ranks 0 and 1 are both in the barrier.
	ctx := expireWhen(t, arrived(serverOf(gs[0]), 0, 0, 1))
	for r := range 2 { // ranks 2 and 3 never call the barrier
		wg.Go(func() { errs[r] = gs[r].Barrier(ctx) })
	}
	wg.Wait()
	if d := time.Since(ctx.expiredAt()); d > queryGrace+slack {
		t.Errorf("barrier returned %v after its deadline", d)
	}
	for r := range 2 {
		wantTimeout(t, fmt.Sprintf("rank %d", r), errs[r], []int{2, 3})
	}
}

func TestTCPPeerKilled(t *testing.T) {
	gs := tcpWorld(t, 4)
	killMidCall(t, gs, 3, "ranks 0 to 2 to enter the barrier", arrived(serverOf(gs[0]), 0, 0, 1, 2),
		func(ctx context.Context, g Group) error { return g.Barrier(ctx) })
	// Later rounds fail at once too, and so do rounds of sub-groups that
	// include the lost rank; rounds without it still work.
	each(t, gs[:3], func(g Group) error {
		ctx, cancel := context.WithTimeout(t.Context(), hang)
		defer cancel()
		_, err := g.AllGather(ctx, nil)
		wantLost(t, fmt.Sprintf("rank %d, next round", g.Rank()), err, []int{3})
		return nil
	})
}

func TestTCPPeerKilledInSubgroup(t *testing.T) {
	gs := tcpWorld(t, 4)
	subs := make([]Group, 4)
	each(t, gs, func(g Group) (err error) {
		subs[g.Rank()], err = g.Split(t.Context(), g.Rank()/2, 0) // {0,1} and {2,3}
		return err
	})
	gs[3].(*tcpGroup).kill()
	each(t, gs[:3], func(g Group) error {
		ctx, cancel := context.WithTimeout(t.Context(), hang)
		defer cancel()
		sub := subs[g.Rank()]
		err := sub.Barrier(ctx)
		if g.Rank() == 2 {
			wantLost(t, "rank 2 in {2,3}", err, []int{1}) // rank 3 is rank 1 there
		} else if err != nil {
			t.Errorf("rank %d in {0,1}: %v", g.Rank(), err)
		}
		return nil
	})
}

// TestTCPLostBeforeContrib: a peer is lost after a round's checks and
// before its contribution reaches the server, which then drops the
// contribution (the group is stopped). The round must fail at once with the
// lost peer, not wait for its deadline and time out naming nobody (the
// news came between the round's check and its wait: CI once saw this).
func TestTCPLostBeforeContrib(t *testing.T) {
	gs := tcpWorld(t, 3)
	c2 := gs[2].(*tcpGroup).c
	testHookBeforeContrib = func(g *tcpGroup) {
		if g.c != c2 {
			return
		}
		gs[1].(*tcpGroup).kill()
		for {
			c2.mu.Lock()
			_, heard := c2.lost[1]
			changed := c2.notify
			c2.mu.Unlock()
			if heard {
				return
			}
			<-changed
		}
	}
	defer func() { testHookBeforeContrib = nil }()
	ctx, cancel := context.WithTimeout(t.Context(), hang)
	defer cancel()
	start := time.Now()
	err := gs[2].Barrier(ctx)
	wantLost(t, "rank 2", err, []int{1})
	if d := time.Since(start); d > slack {
		t.Errorf("lost peer reported after %v", d)
	}
}

func TestTCPRankZeroKilled(t *testing.T) {
	gs := tcpWorld(t, 3)
	killMidCall(t, gs, 0, "ranks 1 and 2 to enter the barrier", arrived(serverOf(gs[0]), 0, 1, 2),
		func(ctx context.Context, g Group) error { return g.Barrier(ctx) })
	for r := 1; r < 3; r++ {
		_, err := gs[r].AllGather(t.Context(), nil)
		wantLost(t, fmt.Sprintf("rank %d, next round", r), err, []int{0})
	}
}

func TestTCPCloseReleasesWaiters(t *testing.T) {
	for _, closer := range []int{1, 0} {
		t.Run(fmt.Sprintf("closer=%d", closer), func(t *testing.T) {
			gs := tcpWorld(t, 3)
			done := make(chan error, 3)
			var waiting []int
			for r := range 3 {
				if r != closer {
					waiting = append(waiting, r)
					go func() { done <- gs[r].Barrier(t.Context()) }()
				}
			}
			waitFor(t, fmt.Sprintf("ranks %v to enter the barrier", waiting), arrived(serverOf(gs[0]), 0, waiting...))
			gs[closer].Close()
			for range 2 {
				wantClosed(t, "barrier", done)
			}
			if err := gs[closer].Barrier(t.Context()); !errors.Is(err, ErrClosed) {
				t.Errorf("barrier on the closed rank: %v, want ErrClosed", err)
			}
		})
	}
}

func TestTCPSubgroupClose(t *testing.T) {
	gs := tcpWorld(t, 3)
	subs := make([]Group, 3)
	each(t, gs, func(g Group) (err error) {
		subs[g.Rank()], err = g.Split(t.Context(), 0, 0)
		return err
	})
	done := make(chan error, 1)
	go func() { done <- subs[0].Barrier(t.Context()) }()
	waitFor(t, "rank 0 to enter the sub-group's barrier", arrived(serverOf(gs[0]), subs[0].(*tcpGroup).gid, 0))
	subs[2].Close()
	wantClosed(t, "sub-group's barrier", done)
	// The world group is unaffected.
	each(t, gs, func(g Group) error { return g.Barrier(t.Context()) })
}

func TestTCPMismatchedCalls(t *testing.T) {
	gs := tcpWorld(t, 3)
	ctx, cancel := context.WithTimeout(t.Context(), hang)
	defer cancel()
	errs := make([]error, 3)
	var wg sync.WaitGroup
	wg.Go(func() { errs[0] = gs[0].Barrier(ctx) })
	wg.Go(func() { _, errs[1] = gs[1].AllGather(ctx, []byte("x")) })
	wg.Go(func() { _, errs[2] = gs[2].Broadcast(ctx, 1, nil) })
	wg.Wait()
	for r, err := range errs {
		if err == nil || errors.Is(err, ErrTimeout) || !strings.Contains(err.Error(), "same collectives") {
			t.Errorf("rank %d: %v, want an error about mismatched collectives", r, err)
		}
	}
	// Broadcasts that disagree on the root.
	for r := range 3 {
		wg.Go(func() { _, errs[r] = gs[r].Broadcast(ctx, min(r, 1), nil) })
	}
	wg.Wait()
	for r, err := range errs {
		if err == nil || !strings.Contains(err.Error(), "root") {
			t.Errorf("rank %d: %v, want an error about the root", r, err)
		}
	}
}

func TestTCPBadRendezvous(t *testing.T) {
	for _, tc := range []struct {
		name string
		// By goroutine; each entry's Port is filled in. The last one, the
		// offender, starts once the others wait for the welcome.
		cfgs []TCPConfig
	}{
		{"size mismatch", []TCPConfig{tcpCfg(0, 0, 3), tcpCfg(0, 2, 3), tcpCfg(0, 1, 4)}},
		{"duplicate rank", []TCPConfig{tcpCfg(0, 0, 4), tcpCfg(0, 1, 4), tcpCfg(0, 2, 4), tcpCfg(0, 1, 4)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ln, port := tcpListen(t)
			server := hookServer(t)
			ctx, cancel := context.WithTimeout(t.Context(), hang)
			defer cancel()
			errs := make([]error, len(tc.cfgs))
			var wg sync.WaitGroup
			var start time.Time
			for i, cfg := range tc.cfgs {
				cfg.Port = port
				if i == len(tc.cfgs)-1 {
					waitFor(t, "the others to join", func() bool {
						s := server()
						if s == nil {
							return false
						}
						s.mu.Lock()
						defer s.mu.Unlock()
						return s.joined == len(tc.cfgs)-1
					})
					start = time.Now()
				}
				wg.Go(func() {
					var g Group
					if i == 0 {
						g, errs[i] = NewTCPWithListener(ctx, cfg, ln)
					} else {
						g, errs[i] = NewTCP(ctx, cfg)
					}
					if g != nil {
						g.Close()
					}
				})
			}
			wg.Wait()
			if d := time.Since(start); d > slack {
				t.Errorf("errors took %v after the offender started", d)
			}
			for i, err := range errs {
				if err == nil || errors.Is(err, ErrTimeout) || !strings.Contains(err.Error(), "refused") {
					t.Errorf("rank %d (goroutine %d): %v, want a refusal", tc.cfgs[i].Rank, i, err)
				}
			}
		})
	}
}

func TestTCPConfigFromEnv(t *testing.T) {
	full := map[string]string{"GOEP_MASTER_ADDR": "10.0.0.1", "GOEP_MASTER_PORT": "29500", "RANK": "3", "WORLD_SIZE": "8",
		"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "GOEP_WORLD_SECRET": testSecret}
	with := func(kv ...string) map[string]string {
		m := map[string]string{}
		for k, v := range full {
			m[k] = v
		}
		for i := 0; i < len(kv); i += 2 {
			if kv[i+1] == "<unset>" {
				delete(m, kv[i])
			} else {
				m[kv[i]] = kv[i+1]
			}
		}
		return m
	}
	for _, tc := range []struct {
		name string
		env  map[string]string
		want TCPConfig
		err  string // substring of the error; "" = no error
	}{
		{"full", full, TCPConfig{Addr: "10.0.0.1", Port: 29500, Rank: 3, Size: 8, LocalRank: 1, LocalSize: 2, Secret: testSecret}, ""},
		{"no local", with("LOCAL_RANK", "<unset>", "LOCAL_WORLD_SIZE", "<unset>"), TCPConfig{Addr: "10.0.0.1", Port: 29500, Rank: 3, Size: 8, LocalRank: 3, LocalSize: 8, Secret: testSecret}, ""},
		{"single process", map[string]string{}, TCPConfig{Addr: "127.0.0.1", Port: 0, Rank: 0, Size: 1, LocalRank: 0, LocalSize: 1}, ""},
		{"ipv6 host", with("GOEP_MASTER_ADDR", "::1"), TCPConfig{Addr: "::1", Port: 29500, Rank: 3, Size: 8, LocalRank: 1, LocalSize: 2, Secret: testSecret}, ""},
		{"no addr", with("GOEP_MASTER_ADDR", "<unset>"), TCPConfig{}, "GOEP_MASTER_ADDR is not set"},
		{"no port", with("GOEP_MASTER_PORT", "<unset>"), TCPConfig{}, "GOEP_MASTER_PORT is not set"},
		{"no rank", with("RANK", "<unset>"), TCPConfig{}, "RANK is not set"},
		{"no size", with("WORLD_SIZE", "<unset>"), TCPConfig{}, "WORLD_SIZE is not set"},
		{"empty addr", with("GOEP_MASTER_ADDR", ""), TCPConfig{}, `GOEP_MASTER_ADDR=""`},
		{"spaced addr", with("GOEP_MASTER_ADDR", " host"), TCPConfig{}, `GOEP_MASTER_ADDR=" host"`},
		{"port text", with("GOEP_MASTER_PORT", "http"), TCPConfig{}, `GOEP_MASTER_PORT="http"`},
		{"port zero", with("GOEP_MASTER_PORT", "0"), TCPConfig{}, `GOEP_MASTER_PORT="0"`},
		{"port big", with("GOEP_MASTER_PORT", "65536"), TCPConfig{}, `GOEP_MASTER_PORT="65536"`},
		{"rank negative", with("RANK", "-1"), TCPConfig{}, `RANK="-1"`},
		{"rank too big", with("RANK", "8"), TCPConfig{}, `RANK="8"`},
		{"rank float", with("RANK", "1.0"), TCPConfig{}, `RANK="1.0"`},
		{"size zero", with("WORLD_SIZE", "0"), TCPConfig{}, `WORLD_SIZE="0"`},
		{"size spaced", with("WORLD_SIZE", "8 "), TCPConfig{}, `WORLD_SIZE="8 "`},
		{"local rank alone", with("LOCAL_WORLD_SIZE", "<unset>"), TCPConfig{}, "LOCAL_WORLD_SIZE is not"},
		{"local size alone", with("LOCAL_RANK", "<unset>"), TCPConfig{}, "LOCAL_RANK is not"},
		{"local rank too big", with("LOCAL_RANK", "2"), TCPConfig{}, `LOCAL_RANK="2"`},
		{"local size too big", with("LOCAL_WORLD_SIZE", "9"), TCPConfig{}, `LOCAL_WORLD_SIZE="9"`},
		{"single process, bad port", map[string]string{"GOEP_MASTER_PORT": "x"}, TCPConfig{}, `GOEP_MASTER_PORT="x"`},
		{"no secret", with("GOEP_WORLD_SECRET", "<unset>"), TCPConfig{}, "GOEP_WORLD_SECRET is not set"},
		{"short secret", with("GOEP_WORLD_SECRET", "hunter2"), TCPConfig{}, "GOEP_WORLD_SECRET of 7 bytes: want at least 16"},
		{"one rank, no secret", with("GOEP_WORLD_SECRET", "<unset>", "RANK", "0", "WORLD_SIZE", "1", "LOCAL_RANK", "0", "LOCAL_WORLD_SIZE", "1"),
			TCPConfig{Addr: "10.0.0.1", Port: 29500, Rank: 0, Size: 1, LocalRank: 0, LocalSize: 1}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tcpConfigFrom(func(k string) (string, bool) { v, ok := tc.env[k]; return v, ok })
			if tc.err == "" {
				if err != nil || got != tc.want {
					t.Errorf("got %+v, %v; want %+v", got, err, tc.want)
				}
				if err := got.Validate(); err != nil {
					t.Errorf("Validate: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("got %+v, %v; want an error containing %q", got, err, tc.err)
			}
		})
	}
	// Through the real environment once.
	for k, v := range full {
		t.Setenv(k, v)
	}
	if got, err := TCPConfigFromEnv(); err != nil || got.Rank != 3 {
		t.Errorf("TCPConfigFromEnv: %+v, %v", got, err)
	}
}

func TestTCPFrameLimits(t *testing.T) {
	// A header that claims a huge payload is refused before any allocation.
	hdr := appendHeader(nil, frameHeader{Type: fContrib, Op: opAllGather, Len: maxFramePayload + 1})
	if _, _, err := readFrame(bytes.NewReader(hdr)); !errors.Is(err, errFrame) {
		t.Errorf("oversized frame: %v", err)
	}
	// A header that claims 1 GiB but sends 10 bytes allocates little.
	hdr = appendHeader(nil, frameHeader{Type: fContrib, Op: opAllGather, Len: maxFramePayload})
	var ms1, ms2 runtime.MemStats
	runtime.ReadMemStats(&ms1)
	_, _, err := readFrame(bytes.NewReader(append(slices.Clip(hdr), make([]byte, 10)...)))
	runtime.ReadMemStats(&ms2)
	if err == nil {
		t.Error("truncated frame read without error")
	}
	if d := ms2.TotalAlloc - ms1.TotalAlloc; d > 1<<20 {
		t.Errorf("a truncated 1 GiB frame allocated %d bytes", d)
	}
	// Round trip.
	var buf bytes.Buffer
	h := frameHeader{Type: fResult, Op: opSplit, GID: 7, Seq: 1 << 40, Rank: 5}
	if err := writeFrame(&buf, h, []byte("payload")); err != nil {
		t.Fatal(err)
	}
	got, p, err := readFrame(&buf)
	h.Len = 7
	if err != nil || got != h || string(p) != "payload" {
		t.Errorf("round trip: %+v %q %v", got, p, err)
	}
}

// slowConn is the writing end of a connection to a slow reader, on
// virtual time: its reader takes perByte for each byte (and no real time
// passes), and with stopAt > 0 reads nothing past byte stopAt. A write
// fails, as at its deadline, once the virtual time since the last
// SetWriteDeadline exceeds that deadline's distance from when it was set.
type slowConn struct {
	net.Conn // nil: only the methods below are used
	perByte  time.Duration
	stopAt   int

	mu      sync.Mutex
	budget  time.Duration // from the last SetWriteDeadline
	elapsed time.Duration // virtual time since then
	got     int           // bytes read by the reader
	closed  bool
}

func (c *slowConn) SetWriteDeadline(d time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.budget, c.elapsed = time.Until(d), 0
	if d.IsZero() {
		c.budget = 1<<63 - 1
	}
	return nil
}

func (c *slowConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return 0, net.ErrClosed
	}
	for n := range p {
		if (c.stopAt > 0 && c.got >= c.stopAt) || c.elapsed+c.perByte > c.budget {
			return n, fmt.Errorf("slow reader: %w", os.ErrDeadlineExceeded)
		}
		c.elapsed += c.perByte
		c.got++
	}
	return len(p), nil
}

func (c *slowConn) SetReadDeadline(time.Time) error { return nil }

func (c *slowConn) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	return nil
}

// TestTCPWriteBound: a write to a reader that goes on reading, however
// slowly, succeeds however long the whole frame takes; one to a reader
// that stops fails at its deadline and is reported as a timeout. Each
// writer is driven on a slowConn whose reader takes 40% of the writer's
// stall bound for every piece of a frame of 8 pieces (3.2 bounds in all).
func TestTCPWriteBound(t *testing.T) {
	const frame = 8 * writePiece
	for _, tc := range []struct {
		name  string
		stall time.Duration
		// write sends a frame of p on conn and returns the error it
		// reports, and whether it marked the connection cut for a timeout.
		write func(conn net.Conn, p []byte) (error, bool)
	}{
		{"rank to rendezvous server", DefaultTCPTimeout, func(conn net.Conn, p []byte) (error, bool) {
			c := &tcpClient{conn: conn, notify: make(chan struct{})}
			err := c.send(context.Background(), frameHeader{Type: fContrib, Op: opAllGather}, p)
			return err, c.deadWrite
		}},
		{"rank to peer", DefaultTCPTimeout, func(conn net.Conn, p []byte) (error, bool) {
			c := &tcpClient{notify: make(chan struct{})}
			pc := &peerConn{rank: 1, conn: conn}
			err := c.sendPeer(context.Background(), pc, frameHeader{Type: fPeerData, Op: opAllToAll, Rank: 0}, p)
			return err, pc.slow
		}},
		{"rendezvous server to rank", serverWriteTimeout, func(conn net.Conn, p []byte) (error, bool) {
			s := &tcpServer{}
			sc := &srvConn{c: conn, rank: 1, wake: make(chan struct{}, 1)}
			sc.send(frameHeader{Type: fResult, Op: opAllGather}, p)
			sc.finish()
			s.wg.Add(1)
			s.write(sc)
			if sc.cut != "" {
				return fmt.Errorf("%s: %w", sc.cut, os.ErrDeadlineExceeded), true
			}
			return nil, false
		}},
	} {
		perByte := tc.stall * 4 / 10 / writePiece
		t.Run(tc.name+"/slow reader", func(t *testing.T) {
			conn := &slowConn{perByte: perByte}
			err, cut := tc.write(conn, make([]byte, frame))
			if err != nil || cut || conn.got != frameHeaderLen+frame {
				t.Errorf("%v, cut %v, %d of %d bytes read; want the whole frame written: a slow reader is not a stuck one",
					err, cut, conn.got, frameHeaderLen+frame)
			}
		})
		t.Run(tc.name+"/stopped reader", func(t *testing.T) {
			conn := &slowConn{perByte: perByte, stopAt: 3 * writePiece}
			err, cut := tc.write(conn, make([]byte, frame))
			if !isTimeout(err) || !cut || !conn.closed {
				t.Errorf("%v, cut %v, closed %v; want a timeout, the connection cut and closed", err, cut, conn.closed)
			}
		})
	}
}

// FuzzTCPFrame feeds arbitrary bytes to the frame reader and every payload
// decoder: they must return errors, never panic, and never allocate much
// more than the input.
func FuzzTCPFrame(f *testing.F) {
	var buf bytes.Buffer
	writeFrame(&buf, frameHeader{Type: fChallenge, Rank: -1}, challengeMsg{Magic: tcpMagic, Version: tcpVersion, Nonce: newNonce()}.encode())
	writeFrame(&buf, frameHeader{Type: fHello, Rank: 1}, helloMsg{Magic: tcpMagic, Version: tcpVersion, Size: 4, LocalSize: 1, PeerAddr: "127.0.0.1:1"}.encode())
	writeFrame(&buf, frameHeader{Type: fProof, Rank: 1}, make([]byte, macLen))
	writeFrame(&buf, frameHeader{Type: fResult, Op: opAllGather, GID: 0, Seq: 3}, appendChunks(nil, [][]byte{{1}, nil, {2, 3}}))
	writeFrame(&buf, frameHeader{Type: fResult, Op: opSplit, GID: 0, Seq: 4}, splitReply{GID: 2, Index: 1, Members: []int{3, 1}}.encode())
	writeFrame(&buf, frameHeader{Type: fWelcome}, encodeAddrs([]string{"a:1", "", "b:2"}))
	writeFrame(&buf, frameHeader{Type: fPeerHello, Seq: 9, Rank: 1}, peerHello{Magic: tcpMagic, Version: tcpVersion, Size: 4, To: 2}.encode())
	writeFrame(&buf, frameHeader{Type: fPeerData, Op: opAllToAll, GID: 1, Seq: 2, Rank: 1}, []byte("part"))
	f.Add(buf.Bytes())
	f.Add(appendHeader(nil, frameHeader{Type: fContrib, Len: maxFramePayload}))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		r := bytes.NewReader(data)
		for {
			h, p, err := readFrame(r)
			if err != nil {
				return
			}
			if len(p) != int(h.Len) || len(p) > len(data) {
				t.Fatalf("payload of %d bytes for header %+v from %d bytes", len(p), h, len(data))
			}
			decodeHello(p)
			decodePeerHello(p)
			decodeChallenge(p)
			for n := range 5 {
				splitChunks(p, n)
				decodeAddrs(p, n)
			}
			splitChunks(p, int(h.Rank))
			decodeAddrs(p, int(h.Rank))
			decodeRanks(p, 4)
			decodeSplitReply(p, 4)
			checkContrib(h.Op, p, 3)
		}
	})
}

// tcpChild is a rank of TestTCPChildProcess running in a child process
// (this test binary re-executed), its output collected line by line.
type tcpChild struct {
	cmd *exec.Cmd

	mu      sync.Mutex
	lines   []string
	ended   bool
	changed chan struct{} // closed (and replaced) at each line and at the end
}

// startTCPChild starts rank of a world of n whose rank 0 listens on port;
// victim and op are the child's instructions (see TestTCPChildProcess). The
// child is killed when the test ends.
func startTCPChild(t *testing.T, port, rank, n, victim int, op string) *tcpChild {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Skipf("cannot re-execute the test binary: %v", err)
	}
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^TestTCPChildProcess$")
	cmd.Env = append(os.Environ(), "GOEP_TCP_TEST_CHILD=1", "GOEP_MASTER_ADDR=127.0.0.1", "GOEP_WORLD_SECRET="+testSecret,
		fmt.Sprintf("GOEP_MASTER_PORT=%d", port), fmt.Sprintf("RANK=%d", rank), fmt.Sprintf("WORLD_SIZE=%d", n),
		fmt.Sprintf("GOEP_TCP_TEST_VICTIM=%d", victim), "GOEP_TCP_TEST_OP="+op)
	cmd.Stdout, cmd.Stderr = pw, pw
	err = cmd.Start()
	pw.Close() // the child has its copy
	if err != nil {
		pr.Close()
		t.Fatal(err)
	}
	c := &tcpChild{cmd: cmd, changed: make(chan struct{})}
	go func() {
		defer pr.Close()
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			c.mu.Lock()
			c.lines = append(c.lines, sc.Text())
			close(c.changed)
			c.changed = make(chan struct{})
			c.mu.Unlock()
		}
		c.mu.Lock()
		c.ended = true
		close(c.changed)
		c.mu.Unlock()
	}()
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	return c
}

// waitLine waits until the child prints a line starting with prefix.
func (c *tcpChild) waitLine(t *testing.T, prefix string) {
	t.Helper()
	timeout := time.After(hang)
	for {
		c.mu.Lock()
		for _, l := range c.lines {
			if strings.HasPrefix(l, prefix) {
				c.mu.Unlock()
				return
			}
		}
		changed, ended := c.changed, c.ended
		c.mu.Unlock()
		if ended {
			t.Fatalf("child rank printed no %q line before its output ended:\n%s", prefix, c.output())
		}
		select {
		case <-changed:
		case <-timeout:
			t.Fatalf("child rank printed no %q line in %v:\n%s", prefix, hang, c.output())
		}
	}
}

// waitEnd waits until the child's output has ended.
func (c *tcpChild) waitEnd(t *testing.T) {
	t.Helper()
	timeout := time.After(hang)
	for {
		c.mu.Lock()
		changed, ended := c.changed, c.ended
		c.mu.Unlock()
		if ended {
			return
		}
		select {
		case <-changed:
		case <-timeout:
			t.Fatalf("the child's output did not end in %v:\n%s", hang, c.output())
		}
	}
}

// output is what the child printed so far.
func (c *tcpChild) output() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return strings.Join(c.lines, "\n")
}

// freeTCPPort is a loopback port that was free a moment ago (for a child
// rank 0 to listen on; the race for it is harmless here).
func freeTCPPort(t *testing.T) int {
	ln, port := tcpListen(t)
	ln.Close()
	return port
}

// TestTCPProcesses runs three ranks as child processes and SIGKILLs one of
// them while the others wait in a barrier (relayed through rank 0) or an
// AllToAll (over the direct peer connections): the others must return a
// *PeerLostError naming it, long before their deadline.
func TestTCPProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("starts child processes; skipped with -short")
	}
	for _, tc := range []struct {
		op     string
		victim int
	}{{"barrier", 2}, {"barrier", 0}, {"alltoall", 2}, {"alltoall", 0}} {
		victim := tc.victim
		t.Run(fmt.Sprintf("op=%s/kill=%d", tc.op, victim), func(t *testing.T) {
			port := freeTCPPort(t)
			const n = 3
			children := make([]*tcpChild, n)
			for r := range n {
				children[r] = startTCPChild(t, port, r, n, victim, tc.op)
			}
			// Once the others are calling, every rank has joined (the
			// victim included), and the victim dies while they wait.
			for r, c := range children {
				if r != victim {
					c.waitLine(t, "calling")
				}
			}
			start := time.Now()
			if err := children[victim].cmd.Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			for r, c := range children {
				if r == victim {
					continue
				}
				err := c.cmd.Wait()
				c.waitEnd(t)
				want := fmt.Sprintf("RESULT lost=[%d]", victim)
				if out := c.output(); err != nil || !strings.Contains(out, want) {
					t.Errorf("rank %d: exit %v; want %q in its output:\n%s", r, err, want, out)
				}
			}
			if d := time.Since(start); d > childDeadline/3 {
				t.Errorf("the others took %v to notice (their deadline is %v)", d, childDeadline)
			}
		})
	}
}

// childDeadline bounds every wait of a TestTCPChildProcess.
const childDeadline = hang

// TestTCPChildProcess is one rank of TestTCPProcesses and TestTCPStoppedPeer.
// GOEP_TCP_TEST_VICTIM names the rank that joins and then only waits (to be
// killed or stopped); the others print "calling" and call
// GOEP_TCP_TEST_OP, expecting a lost peer.
func TestTCPChildProcess(t *testing.T) {
	if os.Getenv("GOEP_TCP_TEST_CHILD") != "1" {
		t.Skip("a child of TestTCPProcesses")
	}
	cfg, err := TCPConfigFromEnv()
	if err != nil {
		t.Fatal(err)
	}
	victim, _ := strconv.Atoi(os.Getenv("GOEP_TCP_TEST_VICTIM"))
	ctx, cancel := context.WithTimeout(context.Background(), childDeadline)
	defer cancel()
	g, err := NewTCP(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	fmt.Printf("joined rank %d\n", cfg.Rank)
	if cfg.Rank == victim {
		<-ctx.Done() // killed before the deadline
		t.Fatal("the victim was not killed")
	}
	op := os.Getenv("GOEP_TCP_TEST_OP")
	fmt.Printf("calling %s\n", op)
	if op == "alltoall" {
		if g.(*tcpGroup).c.mesh == nil {
			t.Fatal("alltoall: no direct peer connections")
		}
		send := make([][]byte, g.Size())
		for p := range send {
			send[p] = make([]byte, 1<<20)
		}
		_, err = g.AllToAll(ctx, send)
	} else {
		err = g.Barrier(ctx)
	}
	var pe *PeerLostError
	if !errors.As(err, &pe) {
		t.Fatalf("%s: %v, want a lost peer", op, err)
	}
	fmt.Printf("RESULT lost=%v: %v\n", pe.Ranks, err)
}

// TestTCPStoppedPeer: a rank whose process is stopped (SIGSTOP: alive but
// reading nothing, like a process descheduled for long on a loaded
// machine) makes a large write to it time out. That is a *TimeoutError
// naming it, not a lost peer, both for the call whose write timed out and
// for the calls after it, which fail at once (the connection, left with
// half a frame, is given up): only a broken connection means a lost peer.
func TestTCPStoppedPeer(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a child process; skipped with -short")
	}
	// Far more than the kernel buffers for a reader that reads nothing.
	big := make([]byte, 64<<20)
	for _, tc := range []struct {
		name string
		me   int // this process's rank of 2; the child is the other
		call func(context.Context, Group) error
	}{
		{"relayed to a stopped rank 0", 1, func(ctx context.Context, g Group) error { _, err := g.AllGather(ctx, big); return err }},
		{"direct to a stopped peer", 0, func(ctx context.Context, g Group) error { _, err := g.AllToAll(ctx, [][]byte{nil, big}); return err }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			peer := 1 - tc.me
			ctx, cancel := context.WithTimeout(t.Context(), childDeadline)
			defer cancel()
			var g Group
			var child *tcpChild
			var err error
			if tc.me == 0 {
				ln, port := tcpListen(t)
				child = startTCPChild(t, port, peer, 2, peer, "")
				g, err = NewTCPWithListener(ctx, tcpCfg(port, 0, 2), ln)
			} else {
				port := freeTCPPort(t)
				child = startTCPChild(t, port, peer, 2, peer, "")
				g, err = NewTCP(ctx, tcpCfg(port, 1, 2))
			}
			if err != nil {
				t.Fatal(err)
			}
			// Killed before the close, which then need not wait for a
			// stopped peer to answer its goodbyes.
			defer g.Close()
			defer child.cmd.Process.Kill()
			child.waitLine(t, "joined")
			if err := child.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
				t.Fatal(err)
			}
			if g.(*tcpGroup).c.mesh == nil {
				t.Fatal("no direct peer connections")
			}

			short, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
			defer cancel()
			err = tc.call(short, g)
			wantTimeout(t, "the call that wrote", err, []int{peer})
			if errors.Is(err, ErrPeerLost) {
				t.Errorf("the call that wrote: %v: a stopped peer reported lost", err)
			}
			// The next call fails at once, the same way.
			start := time.Now()
			err = tc.call(ctx, g)
			wantTimeout(t, "the next call", err, []int{peer})
			if err == nil || errors.Is(err, ErrPeerLost) || !strings.Contains(err.Error(), "closed the connection") {
				t.Errorf("the next call: %v, want a timeout saying this rank closed the connection", err)
			}
			if d := time.Since(start); d > slack {
				t.Errorf("the next call took %v, want it to fail at once", d)
			}
		})
	}
}

// TestTCPOverFrameLimit: a collective whose contribution or result does
// not fit a frame fails on every rank with an error saying so, and the
// group stays usable. The limit is lowered to 1 MiB so that the test moves
// MBs, not GBs.
func TestTCPOverFrameLimit(t *testing.T) {
	const limit = 1 << 20
	frameLimitBytes.Store(limit)
	t.Cleanup(func() { frameLimitBytes.Store(maxFramePayload) })
	gs := tcpWorld(t, 2)
	for _, tc := range []struct {
		name string
		size func(r int) int
		want string
	}{
		{"result", func(int) int { return limit * 6 / 10 }, "the result for rank 0 is"},
		{"contribution", func(r int) int { return (limit + 1) * (1 - r) }, "rank 0 cannot take part in collective"},
	} {
		errs := make([]error, len(gs))
		var wg sync.WaitGroup
		for r, g := range gs {
			wg.Go(func() {
				_, errs[r] = g.AllGather(t.Context(), make([]byte, tc.size(r)))
			})
		}
		wg.Wait()
		for r, err := range errs {
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "frame limit") {
				t.Errorf("%s: rank %d: %v, want an error saying %q and naming the frame limit", tc.name, r, err, tc.want)
			}
		}
		each(t, gs, func(g Group) error { return g.Barrier(t.Context()) }) // the group still works
	}
}
