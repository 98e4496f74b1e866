package nvlink

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/goep/goep/comm"
	"github.com/goep/goep/device"
	"github.com/goep/goep/internal/ranktest"
)

// domains builds n in-process domain members on one host backend.
func domains(t *testing.T, n int, timeout time.Duration) ([]*Domain, []device.Stream) {
	t.Helper()
	gs := comm.NewLocal(n)
	b := device.NewHost()
	ds := make([]*Domain, n)
	ss := make([]device.Stream, n)
	global := make([]int, n)
	for i := range global {
		global[i] = 10 + i
	}
	var eg errgroup.Group
	for r := range n {
		eg.Go(func() error {
			s, err := b.NewStream()
			if err != nil {
				return err
			}
			ss[r] = s
			ds[r], err = New(t.Context(), gs[r], s, global, timeout)
			return err
		})
	}
	if err := eg.Wait(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for r := range n {
			ds[r].Close()
			ss[r].Close()
		}
	})
	return ds, ss
}

func TestExchangeMovesData(t *testing.T) {
	const n = 4
	ds, ss := domains(t, n, 5*time.Second)
	var eg errgroup.Group
	for r := range n {
		eg.Go(func() error {
			for epoch := range 50 {
				b, _ := ss[r].Alloc(8)
				b.Host()[0] = byte(r*100 + epoch%100)
				var got []byte
				err := ds[r].Exchange(Call{Op: 7, Sig: [4]uint64{uint64(epoch)}, Buffers: []*device.Buffer{b}}, func(peers [][]*device.Buffer) error {
					for p := range peers {
						got = append(got, peers[p][0].Host()[0])
					}
					return nil
				})
				if err != nil {
					return err
				}
				for p, v := range got {
					if v != byte(p*100+epoch%100) {
						return fmt.Errorf("rank %d epoch %d: read %d from rank %d", r, epoch, v, p)
					}
				}
				b.Free()
			}
			return nil
		})
	}
	if err := eg.Wait(); err != nil {
		t.Fatal(err)
	}
}

// onEach runs call(r) for every rank r at once and returns their errors.
func onEach(n int, call func(r int) error) []error { return ranktest.Run(n, call) }

func TestExchangeMismatchAndPeerStatus(t *testing.T) {
	const n = 3
	ds, _ := domains(t, n, 5*time.Second)
	errs := onEach(n, func(r int) error {
		sig := [4]uint64{1}
		if r == 2 {
			sig[0] = 2
		}
		return ds[r].Exchange(Call{Op: 1, Sig: sig}, func([][]*device.Buffer) error { t.Error("fn ran despite a mismatch"); return nil })
	})
	for r, err := range errs {
		if !errors.Is(err, ErrPeerMismatch) {
			t.Errorf("rank %d: %v, want ErrPeerMismatch", r, err)
		}
	}
	// A rank that rejects its input makes every rank fail with its reason.
	errs = onEach(n, func(r int) error {
		var status error
		if r == 1 {
			status = errors.New("x has the wrong shape")
		}
		return ds[r].Exchange(Call{Op: 1, Status: status}, nil)
	})
	for r, err := range errs {
		var pe *PeerError
		if !errors.As(err, &pe) || pe.Rank != 11 || !strings.Contains(err.Error(), "wrong shape") {
			t.Errorf("rank %d: %v, want rank 11's report", r, err)
		}
	}
}

// TestExchangeRelaysBlame: a rank that publishes a fatal failure (a
// timeout, a lost peer) makes every rank fail with the same class and the
// same named ranks, never another: relaying does not turn a timeout into
// a loss, nor blame the rank that relays.
func TestExchangeRelaysBlame(t *testing.T) {
	const n = 3
	ds, _ := domains(t, n, 5*time.Second)
	for _, c := range []struct {
		name  string
		cause error
		named []int
	}{
		{"timeout", &comm.TimeoutError{Op: "rail round 2", Missing: []int{7, 9}}, []int{7, 9}},
		{"lost", &comm.PeerLostError{Op: "rail round 3", Ranks: []int{8}, Cause: "process exited"}, []int{8}},
	} {
		errs := onEach(n, func(r int) error {
			var status error
			if r == 1 {
				status = fmt.Errorf("executor: %w", c.cause)
			}
			return ds[r].Exchange(Call{Op: 1, Status: status}, nil)
		})
		for r, err := range errs {
			if r == 1 {
				continue
			}
			var te *comm.TimeoutError
			var le *comm.PeerLostError
			switch c.name {
			case "timeout":
				if !errors.As(err, &te) || errors.Is(err, comm.ErrPeerLost) || !slices.Equal(te.Missing, c.named) {
					t.Errorf("%s, rank %d: %v, want a timeout naming %v and no loss", c.name, r, err, c.named)
				}
			case "lost":
				if !errors.As(err, &le) || !slices.Equal(le.Ranks, c.named) {
					t.Errorf("%s, rank %d: %v, want a loss naming %v", c.name, r, err, c.named)
				}
			}
		}
	}
}

// TestPeerFailure: a rank that has not joined exchange e yet sees the
// fatal failure a peer published for e (a timeout keeps its class and
// names), nothing before the peer publishes, and nothing for a rejection
// or for another exchange.
func TestPeerFailure(t *testing.T) {
	const n = 2
	ds, _ := domains(t, n, 30*time.Second)
	for _, c := range []struct {
		name  string
		cause error
		fatal bool
	}{
		{"timeout", &comm.TimeoutError{Op: "rail round 2", Missing: []int{7}}, true},
		{"lost", &comm.PeerLostError{Op: "rail round 3", Ranks: []int{8}, Cause: "process exited"}, true},
		{"rejected", errors.New("X has shape [3 64], want [2 64]"), false},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := ds[1].Epoch() + 1
			if err := ds[1].PeerFailure(e); err != nil {
				t.Fatalf("before rank 0 published: %v", err)
			}
			done := make(chan error, 1)
			go func() { done <- ds[0].Exchange(Call{Op: 1, Status: c.cause}, nil) }()
			published(t, ds, 0, e)
			err := ds[1].PeerFailure(e)
			switch {
			case !c.fatal && err != nil:
				t.Errorf("a rejection published: %v, want nil (the exchange reports it)", err)
			case c.fatal && (!errors.Is(err, ErrPeerReported) || !slices.Equal(Named(err), Named(c.cause)) || StatusOf(err) != StatusOf(c.cause)):
				t.Errorf("%v: want rank 0's %v with its class and names", err, c.cause)
			}
			if err := ds[1].PeerFailure(e + 1); err != nil {
				t.Errorf("exchange %d: %v, want nil", e+1, err)
			}
			_ = ds[1].Exchange(Call{Op: 1}, nil) // rank 0's waits for it
			<-done
		})
	}
}

// published waits until rank r of ds has published its exchange number e
// (a minute at most: it publishes first thing).
func published(t *testing.T, ds []*Domain, r int, e uint64) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for hdr(ds[r].ctrl).epoch.Load() < e {
		if time.Now().After(deadline) {
			t.Fatalf("rank %d has not published exchange %d after a minute", r, e)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestExchangeTimeoutNamesMissingRank(t *testing.T) {
	const n = 3
	ds, _ := domains(t, n, 150*time.Millisecond)
	errs := make([]error, n-1)
	var eg errgroup.Group
	// The last rank never comes. Rank 1 starts once rank 0 has published,
	// so that it sees rank 0 whenever it starts: it must name rank 12 only.
	// Rank 0 names rank 11 too if rank 1 started after rank 0's deadline
	// (a loaded machine).
	eg.Go(func() error { errs[0] = ds[0].Exchange(Call{Op: 1}, nil); return nil })
	published(t, ds, 0, 1)
	eg.Go(func() error { errs[1] = ds[1].Exchange(Call{Op: 1}, nil); return nil })
	eg.Wait()
	for r, err := range errs {
		var te *comm.TimeoutError
		switch {
		case !errors.As(err, &te):
			t.Errorf("rank %d: %v, want a timeout naming rank 12", r, err)
		case r == 1 && !slices.Equal(te.Missing, []int{12}):
			t.Errorf("rank 1: %v, want a timeout naming rank 12", err)
		case r == 0 && !slices.Equal(te.Missing, []int{12}) && !slices.Equal(te.Missing, []int{11, 12}):
			t.Errorf("rank 0: %v, want a timeout naming rank 12 (and 11, if it came late)", err)
		}
		// Failed for good: the next exchange returns the stored failure
		// without waiting (a wait would time out afresh, naming no
		// "failed earlier").
		if err := ds[r].Exchange(Call{Op: 1}, nil); err == nil || !strings.Contains(err.Error(), "failed earlier") || !errors.As(err, &te) {
			t.Errorf("rank %d: exchange after a timeout: %v, want the earlier failure", r, err)
		}
	}
}

// TestLostPeers: a peer whose process has exited is named (by global
// rank); live processes and this process are not.
func TestLostPeers(t *testing.T) {
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Skipf("cannot run a child process: %v", err)
	}
	gone := cmd.Process.Pid // exited and reaped
	d := &Domain{rank: 0, global: []int{4, 5, 6}, pids: []int{myPID, os.Getppid(), myPID}}
	if err := d.LostPeers(); err != nil {
		t.Fatalf("live peers reported lost: %v", err)
	}
	d.pids[2] = gone
	err := d.LostPeers()
	var pe *comm.PeerLostError
	if !errors.As(err, &pe) || !slices.Equal(pe.Ranks, []int{6}) || !errors.Is(err, comm.ErrPeerLost) {
		t.Fatalf("LostPeers = %v, want a *comm.PeerLostError naming rank 6", err)
	}
}

// TestWaitPeerDoneThenExited: a peer that stored what this rank waits for
// and then exited, between this rank's look at the flags and its look at
// the processes, is not lost: wait looks at a dead peer's flag again.
func TestWaitPeerDoneThenExited(t *testing.T) {
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Skipf("cannot run a child process: %v", err)
	}
	gone := cmd.Process.Pid // exited and reaped
	ctrl := make([]byte, doneOffset+16)
	d := &Domain{rank: 0, global: []int{0, 1}, pids: []int{myPID, gone}, ctrl: ctrl, peers: [][]byte{ctrl, make([]byte, doneOffset+16)}}
	// The peer's flag is missing at the first two looks (the second one
	// comes after the liveness interval, with the process check) and there
	// from the third: the look wait takes after finding the process gone.
	looks := 0
	// No peer counts its stores here: the count's target is never reached.
	err := d.wait("done", time.Now().Add(10*time.Second), 1, func(p int) bool {
		if p != 1 {
			return true
		}
		looks++
		return looks > 2
	})
	if err != nil {
		t.Fatalf("wait = %v, want success: the peer's flag was there when its exit was seen", err)
	}
}

// TestExchangeWorkPanics: a panic in one rank's work fails that rank's
// exchange with an error naming it, and the done phase still completes:
// the peers return at once (not at their deadline), and the next
// exchange runs on every rank.
func TestExchangeWorkPanics(t *testing.T) {
	const n = 3
	ds, _ := domains(t, n, 30*time.Second)
	start := time.Now()
	errs := onEach(n, func(r int) error {
		return ds[r].Exchange(Call{Op: 1}, func([][]*device.Buffer) error {
			if r == 1 {
				var s []int
				_ = s[r] // index out of range
			}
			return nil
		})
	})
	for r, err := range onEach(n, func(r int) error { return ds[r].Exchange(Call{Op: 2}, nil) }) {
		if err != nil {
			t.Fatalf("rank %d, the exchange after the panic: %v", r, err)
		}
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("exchanges took %v: the peers waited for the panicking rank", d)
	}
	for r, err := range errs {
		switch {
		case r == 1 && (err == nil || !strings.Contains(err.Error(), "panicked")):
			t.Errorf("rank 1 (panicked): %v, want an error saying its work panicked", err)
		case r != 1 && err != nil:
			t.Errorf("rank %d: %v", r, err)
		}
	}
}

// TestExchangeLateReaderFails: a rank whose work runs past a peer's
// deadline fails the exchange (wrapping comm.ErrTimeout), since that peer
// has returned to its caller, which may reuse the buffers being read.
// (The late rank once found the peer's done stored and succeeded.)
func TestExchangeLateReaderFails(t *testing.T) {
	const n = 2
	ds, _ := domains(t, n, 300*time.Millisecond)
	errs := make([]error, n)
	returned := make(chan struct{}) // rank 0 is back with its caller
	var wg sync.WaitGroup
	wg.Go(func() {
		defer close(returned)
		errs[0] = ds[0].Exchange(Call{Op: 1}, func([][]*device.Buffer) error { return nil })
	})
	// Rank 1 starts once rank 0 has published, so that it sees rank 0 and
	// runs its work however late it starts; the work reads until rank 0
	// has returned.
	published(t, ds, 0, 1)
	wg.Go(func() {
		errs[1] = ds[1].Exchange(Call{Op: 1}, func([][]*device.Buffer) error {
			<-returned // reading rank 0's buffers, slowly
			return nil
		})
	})
	wg.Wait()
	if !errors.Is(errs[0], comm.ErrTimeout) {
		t.Errorf("rank 0 (its deadline passed while rank 1 read): %v, want a timeout", errs[0])
	}
	if !errors.Is(errs[1], comm.ErrTimeout) || !strings.Contains(fmt.Sprint(errs[1]), "stopped waiting") {
		t.Errorf("rank 1 (read past rank 0's deadline): %v, want a failure saying rank 0 stopped waiting", errs[1])
	}
}

// TestArriveWakesOnlyTheWaiterDone: a store wakes the peer whose wait it
// completes (its arrivals count reaches the peer's want), and no other:
// not a peer waiting for more stores, nor one waiting for none.
func TestArriveWakesOnlyTheWaiterDone(t *testing.T) {
	const n = 4
	ds, _ := domains(t, n, 5*time.Second)
	want(ds[1].ctrl).Store(arrivals(ds[1].ctrl).Load() + 1) // waits for one more store
	want(ds[2].ctrl).Store(arrivals(ds[2].ctrl).Load() + 2) // waits for two more
	for p := 1; p < n; p++ {
		ds[0].arrive(p)
	}
	for p, woken := range []bool{1: true, 2: false, 3: false} {
		if p == 0 {
			continue
		}
		got := ds[0].boxes[p].peerWakes.Load()
		if pending := len(ds[p].box.ch); (got == 1) != woken || (pending == 1) != woken {
			t.Errorf("rank %d: %d wake-ups sent, %d pending; want woken = %v", p, got, pending, woken)
		}
	}
}

// TestExchangeWakeups: in exchanges of in-process ranks every rank is
// woken by its peers at most once per phase (by the store that completes
// its wait), whatever the order the peers come in, and no futex system
// call is made.
func TestExchangeWakeups(t *testing.T) {
	const n, rounds = 8, 200
	ds, _ := domains(t, n, time.Minute)
	calls := futexCalls.Load()
	for r, err := range onEach(n, func(r int) error {
		for range rounds {
			if err := ds[r].Exchange(Call{Op: 1}, func([][]*device.Buffer) error { return nil }); err != nil {
				return err
			}
		}
		return nil
	}) {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	for r := range n {
		if w := ds[r].box.peerWakes.Load(); w > 2*rounds {
			t.Errorf("rank %d was woken %d times by its peers in %d exchanges, want at most 2 a exchange", r, w, rounds)
		}
	}
	if c := futexCalls.Load() - calls; c != 0 {
		t.Errorf("%d futex calls among in-process ranks, want none", c)
	}
}

// registered counts the buffers in the handle registry.
func registered() int {
	n := 0
	for i := range registry.shards {
		sh := &registry.shards[i]
		sh.mu.Lock()
		n += len(sh.bufs)
		sh.mu.Unlock()
	}
	return n
}

// TestExchangeInProcessRegistersNothing: in a domain whose members are
// all in this process, an exchange hands every peer the very buffers each
// rank exposed (nil where it exposed none) without registering them.
func TestExchangeInProcessRegistersNothing(t *testing.T) {
	const n = 4
	ds, ss := domains(t, n, 5*time.Second)
	exposed := make([][]*device.Buffer, n)
	for r := range n {
		for i := range 3 {
			var b *device.Buffer
			if i != 1 || r%2 == 0 { // odd ranks expose no buffer 1
				var err error
				if b, err = ss[r].Alloc(8); err != nil {
					t.Fatal(err)
				}
				defer b.Free()
			}
			exposed[r] = append(exposed[r], b)
		}
	}
	errs := onEach(n, func(r int) error {
		for epoch := range 20 {
			err := ds[r].Exchange(Call{Op: 3, Buffers: exposed[r]}, func(peers [][]*device.Buffer) error {
				if k := registered(); k != 0 {
					return fmt.Errorf("rank %d epoch %d: %d buffers registered during the exchange", r, epoch, k)
				}
				for p := range peers {
					if !slices.Equal(peers[p], exposed[p]) {
						return fmt.Errorf("rank %d epoch %d: rank %d's buffers %v, it exposed %v", r, epoch, p, peers[p], exposed[p])
					}
				}
				return nil
			})
			if err != nil {
				return err
			}
		}
		return nil
	})
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
}
