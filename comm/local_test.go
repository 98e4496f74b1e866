package comm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/goep/goep/internal/ranktest"
	"golang.org/x/sync/errgroup"
)

func each(t *testing.T, gs []Group, fn func(g Group) error) {
	t.Helper()
	var eg errgroup.Group
	for _, g := range gs {
		eg.Go(func() error { return fn(g) })
	}
	if err := eg.Wait(); err != nil {
		t.Fatal(err)
	}
}

// groupCollectives hands g's collectives to ranktest.CheckCollectives.
func groupCollectives(g Group) ranktest.Collectives {
	return ranktest.Collectives{
		Rank: g.Rank(), Size: g.Size(),
		AllGather: g.AllGather, AllToAll: g.AllToAll, Broadcast: g.Broadcast, Barrier: g.Barrier,
	}
}

// checkAllToAll sends rank-and-destination-tagged buffers of differing
// lengths (some empty) and checks what arrives.
func checkAllToAll(ctx context.Context, g Group, tag int) error {
	send := make([][]byte, g.Size())
	for p := range send {
		send[p] = make([]byte, g.Rank()+p)
		for i := range send[p] {
			send[p][i] = byte(tag*g.Rank() + p)
		}
	}
	got, err := g.AllToAll(ctx, send)
	if err != nil {
		return err
	}
	if len(got) != g.Size() {
		return fmt.Errorf("rank %d: alltoall gave %d buffers", g.Rank(), len(got))
	}
	for r, b := range got {
		if len(b) != r+g.Rank() {
			return fmt.Errorf("rank %d: %d bytes from rank %d, want %d", g.Rank(), len(b), r, r+g.Rank())
		}
		for _, v := range b {
			if v != byte(tag*r+g.Rank()) {
				return fmt.Errorf("rank %d: byte %d from rank %d", g.Rank(), v, r)
			}
		}
	}
	return nil
}

// paritySplit splits g, a world of 6 ranks, by rank parity with keys that
// reverse the order.
func paritySplit(ctx context.Context, g Group) (Group, error) {
	return g.Split(ctx, g.Rank()%2, -g.Rank())
}

// checkParityOrder checks sub, g's group of paritySplit, with an
// AllGather: its size and its members' order. It returns the members'
// world ranks by new rank.
func checkParityOrder(ctx context.Context, g, sub Group) ([]int, error) {
	if sub.Size() != 3 {
		return nil, fmt.Errorf("sub size %d", sub.Size())
	}
	all, err := sub.AllGather(ctx, []byte{byte(g.Rank())})
	if err != nil {
		return nil, err
	}
	var got []int
	for _, d := range all {
		got = append(got, int(d[0]))
	}
	want := []int{4, 2, 0}
	if g.Rank()%2 == 1 {
		want = []int{5, 3, 1}
	}
	if !slices.Equal(got, want) || got[sub.Rank()] != g.Rank() {
		return nil, fmt.Errorf("rank %d: sub ranks %v (me %d), want %v", g.Rank(), got, sub.Rank(), want)
	}
	return want, nil
}

func TestAllGatherBroadcastBarrier(t *testing.T) {
	each(t, NewLocal(5), func(g Group) error {
		return ranktest.CheckCollectives(t.Context(), groupCollectives(g), 20)
	})
}

func TestSplit(t *testing.T) {
	each(t, NewLocal(6), func(g Group) error {
		sub, err := paritySplit(t.Context(), g)
		if err != nil {
			return err
		}
		_, err = checkParityOrder(t.Context(), g, sub)
		return err
	})
}

// TestSplitExtremeKeys: keys at the ends of int's range order the new
// ranks by key (a subtraction once overflowed and misordered them).
func TestSplitExtremeKeys(t *testing.T) {
	gs := NewLocal(3)
	keys := []int{math.MaxInt, -2, math.MinInt}
	each(t, gs, func(g Group) error {
		sub, err := g.Split(t.Context(), 0, keys[g.Rank()])
		if err != nil {
			return err
		}
		if want := []int{2, 1, 0}[g.Rank()]; sub.Rank() != want {
			return fmt.Errorf("rank %d (key %d): new rank %d, want %d", g.Rank(), keys[g.Rank()], sub.Rank(), want)
		}
		return nil
	})
}

// localArrived reports whether the given ranks of an in-process world have
// all entered its collective number seq.
func localArrived(g Group, seq uint64, ranks ...int) func() bool {
	w := g.(*localGroup).w
	return func() bool {
		w.mu.Lock()
		defer w.mu.Unlock()
		rd := w.rounds[seq]
		if rd == nil {
			return false
		}
		for _, r := range ranks {
			if !rd.arrived[r] {
				return false
			}
		}
		return true
	}
}

func TestTimeoutNamesMissingRanks(t *testing.T) {
	gs := NewLocal(4)
	errs := make([]error, 2)
	var eg errgroup.Group
	// The deadline comes once ranks 0 and 1 are both in the collective.
	ctx := expireWhen(t, localArrived(gs[0], 0, 0, 1))
	for r := range 2 { // ranks 2 and 3 never come
		eg.Go(func() error {
			_, errs[r] = gs[r].AllGather(ctx, nil)
			return nil
		})
	}
	eg.Wait()
	for r, err := range errs {
		var te *TimeoutError
		if !errors.Is(err, ErrTimeout) || !errors.As(err, &te) || !slices.Equal(te.Missing, []int{2, 3}) {
			t.Errorf("rank %d: %v, want a timeout naming ranks 2 and 3", r, err)
		}
	}
}

func TestCloseReleasesWaiters(t *testing.T) {
	gs := NewLocal(2)
	done := make(chan error)
	go func() { done <- gs[0].Barrier(t.Context()) }()
	waitFor(t, "rank 0 to enter the barrier", localArrived(gs[0], 0, 0))
	gs[1].Close()
	wantClosed(t, "barrier", done)
}

func TestAllToAll(t *testing.T) {
	each(t, NewLocal(4), func(g Group) error { return checkAllToAll(t.Context(), g, 10) })
}

// TestLocalAllToAllOwnership: what an in-process AllToAll returns is the
// receiver's: the sender may reuse its send buffers at once, and a
// receiver appending to a received part changes no other rank's parts
// (they share one deposit per sender).
func TestLocalAllToAllOwnership(t *testing.T) {
	const n = 3
	gs := NewLocal(n)
	recv := make([][][]byte, n)
	var eg errgroup.Group
	for r, g := range gs {
		eg.Go(func() error {
			send := make([][]byte, n)
			for d := range send {
				send[d] = []byte{byte(10*r + d), byte(10*r + d)}
			}
			out, err := g.AllToAll(t.Context(), send)
			if err != nil {
				return err
			}
			for d := range send {
				send[d][0], send[d][1] = 0xff, 0xff // reused at once
			}
			recv[r] = out
			// Every rank holds its parts before any appends.
			if err := g.Barrier(t.Context()); err != nil {
				return err
			}
			for s := range out {
				// Past its part, over where the next one's header and
				// rows are in the deposit.
				_ = append(out[s], bytes.Repeat([]byte{0xee}, 16)...)
			}
			return g.Barrier(t.Context())
		})
	}
	if err := eg.Wait(); err != nil {
		t.Fatal(err)
	}
	for r := range n {
		for s := range n {
			if want := []byte{byte(10*s + r), byte(10*s + r)}; !slices.Equal(recv[r][s], want) {
				t.Errorf("rank %d's part from rank %d is %v, want %v", r, s, recv[r][s], want)
			}
		}
	}
}

// TestLocalCompletedRoundStands: a member whose context has ended by the
// time it arrives last still gets the round's data, as every other member
// does: the round is complete, and a completed round wins over the
// context (before, the wait chose at random between the two).
func TestLocalCompletedRoundStands(t *testing.T) {
	for i := range 200 {
		gs := NewLocal(2)
		first := make(chan error, 1)
		go func() {
			_, err := gs[0].AllGather(t.Context(), []byte{0})
			first <- err
		}()
		// Rank 1 arrives last with an ended context: once rank 0 has
		// deposited, rank 1's deposit completes the round.
		waitArrived(gs[0])
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		got, err := gs[1].AllGather(ctx, []byte{1})
		if err != nil || len(got) != 2 || got[0][0] != 0 || got[1][0] != 1 {
			t.Fatalf("iteration %d: rank 1 arriving last with an ended context: %v, %v; want the round's data", i, got, err)
		}
		if err := <-first; err != nil {
			t.Fatalf("iteration %d: rank 0: %v", i, err)
		}
	}
}

// TestLocalAllToAllvLeftVoids: a member that leaves an AllToAllv before
// every member has arrived (its context ended) voids the round: the member
// that completes it later gets an error naming the one that left, and
// reads nothing from its send buffer (which its owner may have freed).
func TestLocalAllToAllvLeftVoids(t *testing.T) {
	gs := NewLocal(2)
	ctx, cancel := context.WithCancel(t.Context())
	left := make(chan error, 1)
	go func() {
		left <- AllToAllv(ctx, gs[0], []byte{1, 2}, []int{1, 1}, make([]byte, 2), []int{1, 1})
	}()
	waitArrived(gs[0])
	cancel()
	if err := <-left; !errors.Is(err, context.Canceled) {
		t.Fatalf("rank 0 leaving: %v; want context.Canceled", err)
	}
	recv := []byte{7, 7}
	err := AllToAllv(t.Context(), gs[1], []byte{3, 4}, []int{1, 1}, recv, []int{1, 1})
	if !errors.Is(err, ErrPeerLost) || !strings.Contains(err.Error(), "rank 0 left") {
		t.Fatalf("rank 1 completing the round: %v; want ErrPeerLost naming rank 0", err)
	}
	if recv[0] != 7 || recv[1] != 7 {
		t.Errorf("rank 1's recv %v: want it untouched", recv)
	}
}

// waitArrived returns once member g of a fresh in-process group has
// deposited in its first round.
func waitArrived(g Group) {
	lg := g.(*localGroup)
	for {
		lg.w.mu.Lock()
		rd := lg.w.rounds[0]
		in := rd != nil && rd.arrived[lg.rank]
		lg.w.mu.Unlock()
		if in {
			return
		}
		runtime.Gosched()
	}
}
