package comm

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"testing"
	"time"

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

func TestAllGatherBroadcastBarrier(t *testing.T) {
	gs := NewLocal(5)
	each(t, gs, func(g Group) error {
		ctx := t.Context()
		for round := range 20 {
			data := make([]byte, g.Rank()+round%3) // lengths differ
			for i := range data {
				data[i] = byte(g.Rank())
			}
			all, err := g.AllGather(ctx, data)
			if err != nil {
				return err
			}
			for r, d := range all {
				if len(d) != r+round%3 || (len(d) > 0 && d[0] != byte(r)) {
					return fmt.Errorf("rank %d round %d: got %v from rank %d", g.Rank(), round, d, r)
				}
			}
			b, err := g.Broadcast(ctx, round%5, []byte{byte(g.Rank())})
			if err != nil {
				return err
			}
			if len(b) != 1 || int(b[0]) != round%5 {
				return fmt.Errorf("broadcast from %d gave %v", round%5, b)
			}
			if err := g.Barrier(ctx); err != nil {
				return err
			}
		}
		return nil
	})
}

func TestSplit(t *testing.T) {
	gs := NewLocal(6)
	each(t, gs, func(g Group) error {
		ctx := t.Context()
		// Colors by parity, keys reverse the order.
		sub, err := g.Split(ctx, g.Rank()%2, -g.Rank())
		if err != nil {
			return err
		}
		if sub.Size() != 3 {
			return fmt.Errorf("sub size %d", sub.Size())
		}
		all, err := sub.AllGather(ctx, []byte{byte(g.Rank())})
		if err != nil {
			return err
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
			return fmt.Errorf("rank %d: sub ranks %v (me %d), want %v", g.Rank(), got, sub.Rank(), want)
		}
		return nil
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
	select {
	case err := <-done:
		if !errors.Is(err, ErrClosed) {
			t.Fatalf("barrier: %v, want ErrClosed", err)
		}
	case <-time.After(hang):
		t.Fatal("a closed peer left the barrier hanging")
	}
}

func TestAllToAll(t *testing.T) {
	gs := NewLocal(4)
	each(t, gs, func(g Group) error {
		send := make([][]byte, g.Size())
		for p := range send {
			send[p] = make([]byte, g.Rank()+p) // lengths differ, some empty
			for i := range send[p] {
				send[p][i] = byte(10*g.Rank() + p)
			}
		}
		got, err := g.AllToAll(t.Context(), send)
		if err != nil {
			return err
		}
		for r, b := range got {
			if len(b) != r+g.Rank() {
				return fmt.Errorf("rank %d: %d bytes from rank %d, want %d", g.Rank(), len(b), r, r+g.Rank())
			}
			for _, v := range b {
				if v != byte(10*r+g.Rank()) {
					return fmt.Errorf("rank %d: byte %d from rank %d", g.Rank(), v, r)
				}
			}
		}
		return nil
	})
}
