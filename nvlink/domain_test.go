package nvlink

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
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
				err := ds[r].Exchange(Call{Op: 7, Sig: [4]uint64{uint64(epoch)}, Buffers: []*device.Buffer{b}}, func(peers [][][]byte) error {
					for p := range peers {
						got = append(got, peers[p][0][0])
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
		return ds[r].Exchange(Call{Op: 1, Sig: sig}, func([][][]byte) error { t.Error("fn ran despite a mismatch"); return nil })
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
	for stateOf(ds[r].ctrl).epoch.Load() < e {
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
	ctrl := make([]byte, blockSize)
	// No rank counts its stores here: the phase's count (1) is never
	// reached, and the wait looks at the flags after the liveness interval.
	d := &Domain{rank: 0, global: []int{0, 1}, pids: []int{myPID, gone}, ctrl: ctrl, peers: [][]byte{ctrl, make([]byte, blockSize)}, count: 1}
	// The peer's flag is missing at the first look (which finds it pending,
	// before the process check) and there from the second: the look wait
	// takes after finding the process gone.
	looks := 0
	err := d.wait("done", &deadline{after: 10 * time.Second}, func(p int) bool {
		if p != 1 {
			return true
		}
		looks++
		return looks > 1
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
		return ds[r].Exchange(Call{Op: 1}, func([][][]byte) error {
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
	ds, ss := domains(t, n, 300*time.Millisecond)
	b, err := ss[0].Alloc(8)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Free()
	errs := make([]error, n)
	returned := make(chan struct{}) // rank 0 is back with its caller
	var wg sync.WaitGroup
	wg.Go(func() {
		defer close(returned)
		errs[0] = ds[0].Exchange(Call{Op: 1, Buffers: []*device.Buffer{b}}, func([][][]byte) error { return nil })
	})
	// Rank 1 starts once rank 0 has published, so that it sees rank 0 and
	// runs its work however late it starts; the work reads until rank 0
	// has returned.
	published(t, ds, 0, 1)
	wg.Go(func() {
		errs[1] = ds[1].Exchange(Call{Op: 1}, func([][][]byte) error {
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

// TestExchangeLateStageReaderFails: an exchange in which every rank
// staged ends at the publish wait, so a rank may go on while a slow peer
// still reads its stage; it stages its next exchange in the other half,
// and only the one after that, which it reaches once the peer has moved
// on, writes the half the peer reads. If it gets there by timing out (the
// peer never published), the peer's reads cannot be trusted: the peer
// fails the exchange it was reading, naming the rank that stopped waiting.
func TestExchangeLateStageReaderFails(t *testing.T) {
	const n = 2
	ds, _ := domains(t, n, 300*time.Millisecond)
	errs := make([]error, 3)
	returned := make(chan struct{}) // rank 0 is past its second exchange
	var wg sync.WaitGroup
	wg.Go(func() {
		defer close(returned)
		for e := range 2 {
			c := Call{Op: 1}
			if !ds[0].Stage(&c, []byte{byte(10 + e)}) {
				errs[0] = fmt.Errorf("exchange %d: one byte did not stage", e+1)
				return
			}
			if errs[e] = ds[0].Exchange(c, func([][][]byte) error { return nil }); errs[e] != nil {
				return
			}
		}
	})
	published(t, ds, 0, 1)
	var read byte
	wg.Go(func() {
		c := Call{Op: 1}
		ds[1].Stage(&c, nil)
		errs[2] = ds[1].Exchange(c, func(peers [][][]byte) error {
			<-returned // reading rank 0's stage, slowly
			read = peers[0][0][0]
			return nil
		})
	})
	wg.Wait()
	if errs[0] != nil {
		t.Errorf("rank 0's first exchange (staged everywhere, no done phase): %v, want success", errs[0])
	}
	if !errors.Is(errs[1], comm.ErrTimeout) {
		t.Errorf("rank 0's second exchange (rank 1 never publishes it): %v, want a timeout", errs[1])
	}
	if !errors.Is(errs[2], comm.ErrTimeout) || !strings.Contains(fmt.Sprint(errs[2]), "stopped waiting") {
		t.Errorf("rank 1 (read rank 0's stage past rank 0's deadline): %v, want a failure saying rank 0 stopped waiting", errs[2])
	}
	if read != 10 {
		t.Errorf("rank 1 read %d from rank 0's stage of exchange 1, want 10 (the next exchange stages in the other half)", read)
	}
}

// TestArriveWakesAtTheLastStore: a store that does not complete the
// phase wakes nobody; the one that does wakes every rank asleep in it, and
// no other.
func TestArriveWakesAtTheLastStore(t *testing.T) {
	const n = 4
	ds, _ := domains(t, n, 5*time.Second)
	ds[1].box.asleep.Store(true)
	ds[2].box.asleep.Store(true)
	for r := range n - 1 {
		ds[r].arrive()
	}
	for r := range n {
		if k := len(ds[r].box.ch); k != 0 {
			t.Fatalf("rank %d has %d wake-ups pending before the phase's last store", r, k)
		}
	}
	ds[n-1].arrive()
	for r, woken := range []bool{false, true, true, false} {
		if k := len(ds[r].box.ch); (k == 1) != woken || (ds[r].box.peerWakes.Load() == 1) != woken {
			t.Errorf("rank %d: %d wake-ups pending, %d sent; want woken = %v", r, k, ds[r].box.peerWakes.Load(), woken)
		}
	}

	// A rank that got past the next phase at its periodic look (every
	// flag there, one rank's count not yet) counts its store of the phase
	// after: that store completes the count of the phase the others sleep
	// in, and wakes them; the late rank's store then wakes nobody.
	for r := range n {
		for len(ds[r].box.ch) > 0 {
			<-ds[r].box.ch
		}
		ds[r].box.peerWakes.Store(0)
	}
	ds[1].box.asleep.Store(true)
	ds[2].box.asleep.Store(true)
	for r := range n - 1 {
		ds[r].arrive() // phase 2: ranks 0, 1, 2; rank 3's store is late
	}
	ds[0].arrive() // rank 0's store of phase 3
	if k := len(ds[1].box.ch) + len(ds[2].box.ch); k != 2 {
		t.Errorf("the store that completed phase 2's count (rank 0's of phase 3) left %d wake-ups pending at ranks 1 and 2, want 2", k)
	}
	ds[3].arrive() // rank 3's store of phase 2, late
	if w := ds[0].box.peerWakes.Load() + ds[3].box.peerWakes.Load(); w != 0 {
		t.Errorf("ranks 0 and 3, not asleep, got %d wake-ups", w)
	}
}

// TestExchangeWakeups: in exchanges of in-process ranks a rank is woken
// by its peers at most once a phase, by the store that completes it,
// never by every store, whatever the order the peers come in; and no
// futex system call is made. Even exchanges are staged (one phase), odd
// ones expose a buffer (two).
func TestExchangeWakeups(t *testing.T) {
	const n, rounds = 8, 200
	ds, ss := domains(t, n, time.Minute)
	calls := futexCalls.Load()
	for r, err := range onEach(n, func(r int) error {
		b, err := ss[r].Alloc(8)
		if err != nil {
			return err
		}
		defer b.Free()
		for e := range rounds {
			c := Call{Op: 1, Buffers: []*device.Buffer{b}}
			if e%2 == 0 {
				c = Call{Op: 1}
				ds[r].Stage(&c, []byte{1})
			}
			if err := ds[r].Exchange(c, func([][][]byte) error { return nil }); err != nil {
				return err
			}
		}
		return nil
	}) {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	const phases = rounds/2 + 2*rounds/2
	for r := range n {
		if w := ds[r].box.peerWakes.Load(); w > phases {
			t.Errorf("rank %d was woken %d times by its peers in %d phases, want at most once a phase", r, w, phases)
		}
	}
	if c := futexCalls.Load() - calls; c != 0 {
		t.Errorf("%d futex calls among in-process ranks, want none", c)
	}
}

// TestExchangeWaitsForEveryRank: a phase's wait is over only once every
// rank has made its store of the phase, however far ahead some ranks run
// (the domain's count of stores holds every rank's, of this phase and the
// next): in an exchange's work every peer has published it, and after a
// done phase every peer has reached it.
func TestExchangeWaitsForEveryRank(t *testing.T) {
	const n, rounds = 6, 300
	ds, ss := domains(t, n, time.Minute)
	for r, err := range onEach(n, func(r int) error {
		b, err := ss[r].Alloc(8)
		if err != nil {
			return err
		}
		defer b.Free()
		for e := uint64(1); e <= rounds; e++ {
			for range (r*7 + int(e)) % 5 { // ranks come in in changing orders
				runtime.Gosched()
			}
			c := Call{Op: 1, Buffers: []*device.Buffer{b}}
			if e%3 != 0 {
				c = Call{Op: 1}
				ds[r].Stage(&c, []byte{1})
			}
			err := ds[r].Exchange(c, func([][][]byte) error {
				for p := range n {
					if got := stateOf(ds[r].peers[p]).epoch.Load(); got < e {
						return fmt.Errorf("exchange %d: rank %d's work began before rank %d published (its epoch %d)", e, r, p, got)
					}
				}
				return nil
			})
			if err != nil {
				return err
			}
			if e%3 != 0 {
				continue
			}
			for p := range n {
				if got := stateOf(ds[r].peers[p]).done.Load(); got < e {
					return fmt.Errorf("exchange %d: rank %d left before rank %d's done (its done %d)", e, r, p, got)
				}
			}
		}
		return nil
	}) {
		if err != nil {
			t.Errorf("rank %d: %v", r, err)
		}
	}
}

// TestExchangeStaged: staged buffers reach every peer byte for byte (a nil
// item as a nil buffer, an empty one as empty bytes), alone or beside
// ranks that expose buffers; an exchange in which every rank staged has no
// done phase, one in which any rank exposed a buffer has it on every rank;
// items that do not fit are refused, leaving the call as it was.
func TestExchangeStaged(t *testing.T) {
	const n, rounds = 4, 40
	ds, ss := domains(t, n, time.Minute)
	item := func(r, e, i int) []byte {
		switch i {
		case 1:
			return nil
		case 2:
			return []byte{}
		}
		b := make([]byte, 1+(r*7+e*13)%300)
		for j := range b {
			b[j] = byte(r + 3*e + j)
		}
		return b
	}
	for r, err := range onEach(n, func(r int) error {
		buf, err := ss[r].Alloc(300)
		if err != nil {
			return err
		}
		defer buf.Free()
		for e := range rounds {
			// Every third exchange, rank e%n exposes buffers instead.
			exposes := e%3 == 2
			c := Call{Op: 5, Sig: [4]uint64{uint64(e)}}
			if exposes && r == e%n {
				it := item(r, e, 0)
				copy(buf.Host(), it)
				c.Buffers = []*device.Buffer{buf, nil, nil}
			} else if !ds[r].Stage(&c, item(r, e, 0), item(r, e, 1), item(r, e, 2)) {
				return fmt.Errorf("exchange %d: %d bytes did not stage", e+1, len(item(r, e, 0)))
			}
			err := ds[r].Exchange(c, func(peers [][][]byte) error {
				for p := range peers {
					want := item(p, e, 0)
					got := peers[p][0]
					if exposes && p == e%n {
						got = got[:len(want)]
					}
					if !bytes.Equal(got, want) || peers[p][1] != nil || (peers[p][2] == nil) != (exposes && p == e%n) || len(peers[p][2]) != 0 {
						return fmt.Errorf("exchange %d: rank %d's buffers %v, %v, %v; want %v, nil, empty", e+1, p, peers[p][0], peers[p][1], peers[p][2], want)
					}
				}
				return nil
			})
			if err != nil {
				return err
			}
			// A done phase stores this rank's done word; without one its
			// last value stays.
			var last uint64
			for k := e; k >= 0; k-- {
				if k%3 == 2 {
					last = uint64(k + 1)
					break
				}
			}
			if got := stateOf(ds[r].ctrl).done.Load(); got != last {
				return fmt.Errorf("after exchange %d: rank %d's done word is %d, want %d", e+1, r, got, last)
			}
		}
		var c Call
		if ds[r].Stage(&c, make([]byte, StageBytes-63), []byte{1}) || c.staged || c.nspans != 0 {
			return fmt.Errorf("%d bytes on two 64-byte boundaries staged in a stage of %d", StageBytes-62, StageBytes)
		}
		if !ds[r].Stage(&c, make([]byte, StageBytes-64), []byte{1}) {
			return fmt.Errorf("%d bytes on two 64-byte boundaries did not stage in a stage of %d", StageBytes-63, StageBytes)
		}
		return nil
	}) {
		if err != nil {
			t.Errorf("rank %d: %v", r, err)
		}
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
			err := ds[r].Exchange(Call{Op: 3, Buffers: exposed[r]}, func(peers [][][]byte) error {
				if k := registered(); k != 0 {
					return fmt.Errorf("rank %d epoch %d: %d buffers registered during the exchange", r, epoch, k)
				}
				for p := range peers {
					if len(peers[p]) != len(exposed[p]) {
						return fmt.Errorf("rank %d epoch %d: rank %d exposed %d buffers, %d seen", r, epoch, p, len(exposed[p]), len(peers[p]))
					}
					for i, b := range exposed[p] {
						if !sameBytes(peers[p][i], b) {
							return fmt.Errorf("rank %d epoch %d: rank %d's buffer %d is not the one it exposed", r, epoch, p, i)
						}
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

// sameBytes reports whether got is b's bytes themselves (nil for nil).
func sameBytes(got []byte, b *device.Buffer) bool {
	if b == nil {
		return got == nil
	}
	want := b.Host()
	return len(got) == len(want) && &got[0] == &want[0]
}
