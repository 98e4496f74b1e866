package rdma

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"
)

// TestRing pushes from several producers while one consumer pops: every
// descriptor arrives once, in each producer's order.
func TestRing(t *testing.T) {
	for _, size := range []int{2, 8, 64} {
		r, err := NewRing(size)
		if err != nil {
			t.Fatal(err)
		}
		const producers, each = 4, 2000
		var wg sync.WaitGroup
		for p := range producers {
			wg.Go(func() {
				for i := range each {
					w := Work{Peer: p, LocalOff: i, RemoteOff: 2 * i, Bytes: 3 * i, Epoch: uint64(i + 1)}
					if err := r.Push(t.Context(), w); err != nil {
						t.Error(err)
						return
					}
				}
			})
		}
		next := make([]int, producers)
		for got := 0; got < producers*each; {
			w, ok := r.TryPop()
			if !ok {
				continue
			}
			got++
			i := next[w.Peer]
			if w != (Work{Peer: w.Peer, LocalOff: i, RemoteOff: 2 * i, Bytes: 3 * i, Epoch: uint64(i + 1)}) {
				t.Fatalf("size %d: producer %d's descriptor %d is %+v", size, w.Peer, i, w)
			}
			next[w.Peer]++
		}
		wg.Wait()
		if _, ok := r.TryPop(); ok {
			t.Fatal("descriptor left over")
		}
		if r.Pushed() != producers*each || r.Popped() != producers*each {
			t.Fatalf("pushed %d popped %d", r.Pushed(), r.Popped())
		}
		if err := r.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

func TestRingFull(t *testing.T) {
	r, err := NewRing(2)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	for i := range 2 {
		if !r.TryPush(Work{Peer: i}) {
			t.Fatalf("push %d refused", i)
		}
	}
	if r.TryPush(Work{}) {
		t.Fatal("push into a full ring accepted")
	}
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Millisecond)
	defer cancel()
	if err := r.Push(ctx, Work{}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Push into a full ring: %v, want the deadline", err)
	}
	if w, ok := r.TryPop(); !ok || w.Peer != 0 {
		t.Fatalf("pop: %+v %v", w, ok)
	}
	if !r.TryPush(Work{Peer: 2}) {
		t.Fatal("push after a pop refused")
	}
	for _, n := range []int{0, 1, 3} {
		if _, err := NewRing(n); !errors.Is(err, ErrInvalidConfig) {
			t.Fatalf("NewRing(%d): %v", n, err)
		}
	}
}

func TestConfigValidate(t *testing.T) {
	for _, c := range []struct {
		cfg Config
		ok  bool
	}{
		{Config{SendBytes: 1, RecvBytes: 1}, true},
		{Config{SendBytes: 1, RecvBytes: 1, RingSize: 16}, true},
		{Config{SendBytes: 0, RecvBytes: 1}, false},
		{Config{SendBytes: 1, RecvBytes: 0}, false},
		{Config{SendBytes: 1, RecvBytes: 1, RingSize: 12}, false},
		{Config{SendBytes: 1, RecvBytes: 1, RingSize: 1}, false},
		{Config{SendBytes: 1, RecvBytes: 1, RingSize: -1}, false},
		{Config{SendBytes: 1, RecvBytes: 1, Timeout: -1}, false},
	} {
		err := c.cfg.Validate()
		if (err == nil) != c.ok || (err != nil && !errors.Is(err, ErrInvalidConfig)) {
			t.Errorf("%+v: %v", c.cfg, err)
		}
	}
}

func TestWorkCheck(t *testing.T) {
	recv := func(peer int) int { return 100 + peer }
	for _, c := range []struct {
		w  Work
		ok bool
	}{
		{Work{Peer: 1, LocalOff: 0, RemoteOff: 0, Bytes: 64}, true},
		{Work{Peer: 1, RemoteOff: 101, Epoch: 1}, true},
		{Work{Peer: 1, LocalOff: 36, RemoteOff: 37, Bytes: 64}, true},
		{Work{Peer: 1, LocalOff: 37, Bytes: 64}, false},
		{Work{Peer: 1, RemoteOff: 38, Bytes: 64}, false},
		{Work{Peer: 2, Bytes: 1}, false},
		{Work{Peer: -1, Bytes: 1}, false},
		{Work{Peer: 0}, false},
		{Work{Peer: 0, Bytes: -1, Epoch: 1}, false},
	} {
		err := c.w.check(2, 100, recv)
		if (err == nil) != c.ok || (err != nil && !errors.Is(err, ErrInvalidWork)) {
			t.Errorf("%+v: %v", c.w, err)
		}
	}
}
