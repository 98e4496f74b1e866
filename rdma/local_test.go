package rdma

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/goep/goep/comm"
)

// runLocal runs f on the R goroutine ranks of comm.NewLocal(R), each with
// the transport newT makes; the first error cancels the others.
func runLocal(t *testing.T, R int, cfg Config, newT func(context.Context, comm.Group, Config) (Transport, error),
	f func(ctx context.Context, g comm.Group, tr Transport) error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	eg, ctx := errgroup.WithContext(ctx)
	var mu sync.Mutex
	keys := map[uint64]bool{}
	for r, g := range comm.NewLocal(R) {
		eg.Go(func() (err error) {
			defer g.Close()
			tr, err := newT(ctx, g, cfg)
			if err != nil {
				return fmt.Errorf("rank %d: %w", r, err)
			}
			lt, ok := tr.(*localTransport)
			if !ok {
				tr.Close()
				return fmt.Errorf("rank %d: got %T, want the in-process transport", r, tr)
			}
			mu.Lock()
			keys[lt.key] = true
			mu.Unlock()
			defer func() {
				err = errors.Join(err, tr.Close())
				if ts, ok := registryEntry(lt.key); ok && ts[r] == lt {
					err = errors.Join(err, fmt.Errorf("rank %d: still registered under %#x after Close", r, lt.key))
				}
			}()
			if err := f(ctx, g, tr); err != nil {
				return fmt.Errorf("rank %d: %w", r, err)
			}
			return nil
		})
	}
	if err := eg.Wait(); err != nil {
		t.Fatal(err)
	}
	if len(keys) != 1 {
		t.Fatalf("the ranks met under %d registry keys, want 1", len(keys))
	}
	for k := range keys {
		if _, ok := registryEntry(k); ok {
			t.Fatalf("registry key %#x still there after every rank closed", k)
		}
	}
}

func registryEntry(key uint64) ([]*localTransport, bool) {
	registry.mu.Lock()
	defer registry.mu.Unlock()
	ts, ok := registry.m[key]
	return ts, ok
}

// ChunkWord is the self-checking word at byte offset off of what src sends
// to dst at epoch e.
func ChunkWord(src, dst int, e uint64, off int) uint64 {
	return uint64(src)<<56 | uint64(dst)<<48 | (e&0xffff)<<32 | uint64(off)
}

// FillChunks writes rank me's self-describing chunk for every one of the
// ranks into send (chunk bytes each, at dst*chunk) for epoch e; the
// all-to-all tests of both transports use it (exported for rdma_test).
func FillChunks(send []byte, me, ranks, chunk int, e uint64) {
	for p := range ranks {
		for off := 0; off < chunk; off += 8 {
			binary.LittleEndian.PutUint64(send[p*chunk+off:], ChunkWord(me, p, e, off))
		}
	}
}

// ChunkWorks are the descriptors that put rank me's chunk for p (at
// p*chunk of the send region) to me*chunk of p's receive region at epoch
// e: one put with the signal at odd epochs; at even ones two puts (split
// at an 8-byte boundary) and a signal-only descriptor, which must be
// ordered after them.
func ChunkWorks(me, p, chunk int, e uint64) []Work {
	if e%2 == 1 {
		return []Work{{Peer: p, LocalOff: p * chunk, RemoteOff: me * chunk, Bytes: chunk, Epoch: e}}
	}
	h := chunk / 2 &^ 7
	return []Work{
		{Peer: p, LocalOff: p * chunk, RemoteOff: me * chunk, Bytes: h},
		{Peer: p, LocalOff: p*chunk + h, RemoteOff: me*chunk + h, Bytes: chunk - h},
		{Peer: p, Epoch: e},
	}
}

// CheckChunks checks that recv holds, at src*chunk, the chunk every one of
// the ranks put to rank me at epoch e (FillChunks).
func CheckChunks(recv []byte, me, ranks, chunk int, e uint64) error {
	for s := range ranks {
		for off := 0; off < chunk; off += 8 {
			if got, want := binary.LittleEndian.Uint64(recv[s*chunk+off:]), ChunkWord(s, me, e, off); got != want {
				return fmt.Errorf("epoch %d: word %d of rank %d's chunk is %#x, want %#x (src %d dst %d epoch %d off %d)",
					e, off, s, got, want, got>>56, got>>48&0xff, got>>32&0xffff, got&0xffffffff)
			}
		}
	}
	return nil
}

// TestLocalAllToAll: 4 goroutine ranks, several epochs; every rank puts a
// self-describing chunk to every rank (itself included), each peer from its
// own goroutine, signals, waits for everyone and checks every received
// byte and the untouched guard bytes past the chunks.
func TestLocalAllToAll(t *testing.T) {
	for _, name := range []string{"NewInProcess", "New"} {
		t.Run(name, func(t *testing.T) {
			newT := NewInProcess
			if name == "New" {
				newT = New
			}
			const R, chunk, guard = 4, 4 << 10, 256
			runLocal(t, R, Config{SendBytes: R * chunk, RecvBytes: R*chunk + guard}, newT, func(ctx context.Context, g comm.Group, tr Transport) error {
				me := tr.Rank()
				all := []int{0, 1, 2, 3}
				for e := uint64(1); e <= 6; e++ {
					FillChunks(tr.SendBuffer(), me, R, chunk, e)
					// Odd epochs put whole chunks with the signal; even ones
					// split them in two puts and signal separately.
					var eg errgroup.Group
					for p := range R {
						eg.Go(func() error {
							for _, w := range ChunkWorks(me, p, chunk, e) {
								if err := tr.Put(ctx, w); err != nil {
									return fmt.Errorf("epoch %d: %w", e, err)
								}
							}
							return nil
						})
					}
					if err := eg.Wait(); err != nil {
						return err
					}
					if err := tr.WaitAll(ctx, all, e); err != nil {
						return fmt.Errorf("epoch %d: %w", e, err)
					}
					recv := tr.RecvBuffer()
					if err := CheckChunks(recv, me, R, chunk, e); err != nil {
						return err
					}
					for i, b := range recv[R*chunk:] {
						if b != 0 {
							return fmt.Errorf("epoch %d: guard byte %d past the chunks is %#x, want 0", e, i, b)
						}
					}
					if err := tr.Flush(ctx); err != nil {
						return fmt.Errorf("epoch %d: %w", e, err)
					}
					// Peers overwrite the receive region at the next epoch.
					if err := g.Barrier(ctx); err != nil {
						return fmt.Errorf("epoch %d: %w", e, err)
					}
				}
				return nil
			})
		})
	}
}

// TestLocalBadWork: descriptors out of bounds and signals whose epoch does
// not grow are refused by Put, which then has no effect.
func TestLocalBadWork(t *testing.T) {
	runLocal(t, 2, Config{SendBytes: 64, RecvBytes: 128}, NewInProcess, func(ctx context.Context, g comm.Group, tr Transport) error {
		for _, w := range []Work{
			{Peer: 2, Bytes: 8}, {Peer: 1, Bytes: 65}, {Peer: 1, LocalOff: 60, Bytes: 8}, {Peer: 1, RemoteOff: 121, Bytes: 8},
			{Peer: 1}, {Peer: -1, Epoch: 1}, {Peer: 1, Bytes: -1, Epoch: 1},
		} {
			if err := tr.Put(ctx, w); !errors.Is(err, ErrInvalidWork) {
				return fmt.Errorf("Put(%+v): %v, want ErrInvalidWork", w, err)
			}
		}
		for _, peers := range [][]int{{5}, {0, -1}} {
			if err := tr.WaitAll(ctx, peers, 1); !errors.Is(err, ErrInvalidWork) {
				return fmt.Errorf("WaitAll(%v): %v, want ErrInvalidWork", peers, err)
			}
		}
		if tr.Rank() == 0 {
			send := tr.SendBuffer()
			copy(send, "good")
			copy(send[8:], "bad!")
			if err := tr.Put(ctx, Work{Peer: 1, Bytes: 4, Epoch: 3}); err != nil {
				return err
			}
			for _, e := range []uint64{3, 2} {
				if err := tr.Put(ctx, Work{Peer: 1, LocalOff: 8, Bytes: 4, Epoch: e}); !errors.Is(err, ErrInvalidWork) || !strings.Contains(err.Error(), "epochs must grow") {
					return fmt.Errorf("Put of epoch %d after 3: %v, want ErrInvalidWork", e, err)
				}
			}
			// Epochs are per (sender, receiver): epoch 1 to rank 0 is fine.
			if err := tr.Put(ctx, Work{Peer: 0, Epoch: 1}); err != nil {
				return err
			}
			if err := tr.Flush(ctx); err != nil {
				return fmt.Errorf("flush after refused puts: %v", err)
			}
		}
		if err := g.Barrier(ctx); err != nil {
			return err
		}
		if tr.Rank() == 1 {
			if err := tr.Wait(ctx, 0, 3); err != nil {
				return err
			}
			if got := string(tr.RecvBuffer()[:4]); got != "good" {
				return fmt.Errorf("receive region holds %q, want %q (a refused put wrote)", got, "good")
			}
		}
		return nil
	})
}

// TestLocalTimeout: rank 1 never signals; rank 0's wait for ranks 0, 1 and
// 2 ends at its deadline with a *comm.TimeoutError naming rank 1 alone,
// and a wait with a canceled context is not a timeout.
func TestLocalTimeout(t *testing.T) {
	runLocal(t, 3, Config{SendBytes: 8, RecvBytes: 8}, NewInProcess, func(ctx context.Context, g comm.Group, tr Transport) error {
		if tr.Rank() != 1 {
			if err := tr.Put(ctx, Work{Peer: 0, Epoch: 1}); err != nil {
				return err
			}
		}
		if err := g.Barrier(ctx); err != nil {
			return err
		}
		if tr.Rank() == 0 {
			// Started before the deadline is set: a goroutine descheduled
			// between the two would otherwise see less than 200ms.
			start := time.Now()
			wctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
			defer cancel()
			err := tr.WaitAll(wctx, []int{2, 1, 0, 1}, 1)
			var te *comm.TimeoutError
			if !errors.As(err, &te) || !errors.Is(err, comm.ErrTimeout) || fmt.Sprint(te.Missing) != "[1]" {
				return fmt.Errorf("wait: %v, want a *comm.TimeoutError naming rank 1 alone", err)
			}
			if d := time.Since(start); d < 200*time.Millisecond || d > 10*time.Second {
				return fmt.Errorf("timeout after %v, want about 200ms", d)
			}
			cctx, ccancel := context.WithCancel(ctx)
			ccancel()
			if err := tr.Wait(cctx, 1, 1); err == nil || errors.Is(err, comm.ErrTimeout) || !errors.Is(err, context.Canceled) {
				return fmt.Errorf("wait with a canceled context: %v, want context.Canceled", err)
			}
			// What has arrived is reported even after the deadline.
			if err := tr.WaitAll(wctx, []int{0, 2}, 1); err != nil {
				return fmt.Errorf("wait for signalled peers after the deadline: %v", err)
			}
		}
		return g.Barrier(ctx)
	})
}

// TestLocalWakeup: a waiter that sleeps before the signal arrives is woken
// by it, long before its deadline.
func TestLocalWakeup(t *testing.T) {
	runLocal(t, 2, Config{SendBytes: 8, RecvBytes: 8}, NewInProcess, func(ctx context.Context, g comm.Group, tr Transport) error {
		if tr.Rank() == 0 {
			time.Sleep(50 * time.Millisecond)
			return tr.Put(ctx, Work{Peer: 1, Epoch: 7})
		}
		start := time.Now()
		if err := tr.Wait(ctx, 0, 7); err != nil {
			return err
		}
		if d := time.Since(start); d > 10*time.Second {
			return fmt.Errorf("woken after %v", d)
		}
		return nil
	})
}

// TestLocalClosed: after Close every call fails with ErrClosed, a second
// Close is nil, and the registry entry is gone.
func TestLocalClosed(t *testing.T) {
	g := comm.NewLocal(1)[0]
	defer g.Close()
	tr, err := NewInProcess(t.Context(), g, Config{SendBytes: 64, RecvBytes: 64})
	if err != nil {
		t.Fatal(err)
	}
	key := tr.(*localTransport).key
	if _, ok := registryEntry(key); !ok {
		t.Fatalf("registry key %#x missing while open", key)
	}
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	if err := tr.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, ok := registryEntry(key); ok {
		t.Fatalf("registry key %#x still there after Close", key)
	}
	for name, err := range map[string]error{
		"Put":     tr.Put(t.Context(), Work{Peer: 0, Epoch: 1}),
		"Wait":    tr.Wait(t.Context(), 0, 1),
		"WaitAll": tr.WaitAll(t.Context(), []int{0}, 1),
		"Flush":   tr.Flush(t.Context()),
	} {
		if !errors.Is(err, ErrClosed) {
			t.Errorf("%s after Close: %v, want ErrClosed", name, err)
		}
	}
}

// TestLocalPeerFreed: rank 1's Close gives up waiting for rank 0 and frees
// its regions; rank 0's puts to it and waits for it then report it lost
// instead of writing freed memory or hanging.
func TestLocalPeerFreed(t *testing.T) {
	runLocal(t, 2, Config{SendBytes: 8, RecvBytes: 8, Timeout: 50 * time.Millisecond}, NewInProcess, func(ctx context.Context, g comm.Group, tr Transport) error {
		if tr.Rank() == 1 {
			if err := tr.Close(); !errors.Is(err, comm.ErrTimeout) {
				return fmt.Errorf("Close with a peer that does not close: %v, want a timeout", err)
			}
			return nil
		}
		lt := tr.(*localTransport)
		for !lt.peers[1].freed.Load() {
			time.Sleep(time.Millisecond)
		}
		var pl *comm.PeerLostError
		if err := tr.Put(ctx, Work{Peer: 1, Bytes: 8, Epoch: 1}); !errors.As(err, &pl) || fmt.Sprint(pl.Ranks) != "[1]" {
			return fmt.Errorf("Put to a freed peer: %v, want a *comm.PeerLostError naming rank 1", err)
		}
		if err := tr.WaitAll(ctx, []int{0, 1}, 1); !errors.As(err, &pl) || fmt.Sprint(pl.Ranks) != "[1]" {
			return fmt.Errorf("Wait for a freed peer: %v, want a *comm.PeerLostError naming rank 1", err)
		}
		return nil
	})
}

// TestLocalWaitSignalledThenFreed: rank 1 signals epoch 1 and is then
// freed (its Close gives up on rank 0) right between rank 0's look at the
// signals and its check for lost peers (testHookWaitLooked): the wait
// for epoch 1 succeeds, since the signal came first; the wait for epoch
// 2, which rank 1 never signalled, reports it lost.
func TestLocalWaitSignalledThenFreed(t *testing.T) {
	goAhead, freed := make(chan struct{}), make(chan struct{})
	var once sync.Once
	testHookWaitLooked = func() {
		once.Do(func() {
			close(goAhead)
			select {
			case <-freed:
			case <-time.After(10 * time.Second): // rank 1 failed: the test reports why
			}
		})
	}
	defer func() { testHookWaitLooked = nil }()
	runLocal(t, 2, Config{SendBytes: 8, RecvBytes: 8, Timeout: 50 * time.Millisecond}, NewInProcess, func(ctx context.Context, g comm.Group, tr Transport) error {
		if tr.Rank() == 1 {
			select {
			case <-goAhead:
			case <-ctx.Done():
				return fmt.Errorf("rank 0's wait never reached testHookWaitLooked: %w", ctx.Err())
			}
			defer close(freed)
			if err := tr.Put(ctx, Work{Peer: 0, Bytes: 8, Epoch: 1}); err != nil {
				return fmt.Errorf("Put: %v", err)
			}
			if err := tr.Close(); !errors.Is(err, comm.ErrTimeout) {
				return fmt.Errorf("Close with a peer that does not close: %v, want a timeout", err)
			}
			return nil
		}
		if err := tr.WaitAll(ctx, []int{1}, 1); err != nil {
			return fmt.Errorf("wait for epoch 1, which rank 1 signalled before it was freed: %v, want nil", err)
		}
		var pl *comm.PeerLostError
		if err := tr.WaitAll(ctx, []int{1}, 2); !errors.As(err, &pl) || fmt.Sprint(pl.Ranks) != "[1]" {
			return fmt.Errorf("wait for epoch 2 of a freed peer: %v, want a *comm.PeerLostError naming rank 1", err)
		}
		return nil
	})
}

// TestLocalNewSplit: New on groups split from one world (as the executor's
// rails are) picks the in-process transport, and the two groups' meetings
// do not mix.
func TestLocalNewSplit(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	var eg errgroup.Group
	var mu sync.Mutex
	keys := map[uint64]bool{}
	for r, w := range comm.NewLocal(4) {
		eg.Go(func() error {
			defer w.Close()
			g, err := w.Split(ctx, r%2, r)
			if err != nil {
				return err
			}
			defer g.Close()
			tr, err := New(ctx, g, Config{SendBytes: 8, RecvBytes: 8})
			if err != nil {
				return err
			}
			defer tr.Close()
			lt, ok := tr.(*localTransport)
			if !ok || !strings.Contains(fmt.Sprint(tr), "InProcess") {
				return fmt.Errorf("rank %d: New picked %v (%T), want the in-process transport", r, tr, tr)
			}
			mu.Lock()
			keys[lt.key] = true
			mu.Unlock()
			binary.LittleEndian.PutUint64(tr.SendBuffer(), uint64(r))
			peer := 1 - g.Rank()
			if err := tr.Put(ctx, Work{Peer: peer, Bytes: 8, Epoch: 1}); err != nil {
				return err
			}
			if err := tr.Wait(ctx, peer, 1); err != nil {
				return err
			}
			if got, want := binary.LittleEndian.Uint64(tr.RecvBuffer()), uint64(r^2); got != want {
				return fmt.Errorf("rank %d got rank %d's bytes, want rank %d's", r, got, want)
			}
			return nil
		})
	}
	if err := eg.Wait(); err != nil {
		t.Fatal(err)
	}
	if len(keys) != 2 {
		t.Fatalf("%d registry keys for two groups, want 2", len(keys))
	}
}

// TestLocalOtherProcess: the decision between the in-process transport
// and UCX, and NewInProcess's error when a rank is in another process.
func TestLocalOtherProcess(t *testing.T) {
	me := processID()
	other := bytes.Clone(me)
	other[15] ^= 1 // same pid, another process's nonce (another container)
	for _, c := range []struct {
		ids  [][]byte
		want int
	}{
		{[][]byte{me}, -1},
		{[][]byte{me, me, me, me}, -1},
		{[][]byte{me, me, other, me}, 2},
		{[][]byte{other, me}, 1},
		{[][]byte{me, {}}, 1},
	} {
		if got := otherProcess(c.ids); got != c.want {
			t.Errorf("otherProcess(%x) = %d, want %d", c.ids, got, c.want)
		}
	}
	g := comm.NewLocal(2)[0] // the check comes before any collective
	defer g.Close()
	tr, err := newInProcess(t.Context(), g, Config{SendBytes: 8, RecvBytes: 8}, [][]byte{me, other})
	if tr != nil || !errors.Is(err, ErrUnsupported) || !strings.Contains(err.Error(), "different processes") || !strings.Contains(err.Error(), "-tags ucx") {
		t.Fatalf("newInProcess with ranks in two processes: %v, %v; want ErrUnsupported naming -tags ucx", tr, err)
	}
	if _, err := NewInProcess(t.Context(), g, Config{SendBytes: 0, RecvBytes: 8}); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("NewInProcess with SendBytes 0: %v, want ErrInvalidConfig", err)
	}
	if _, err := New(t.Context(), g, Config{SendBytes: 8, RecvBytes: 8, RingSize: 3}); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("New with RingSize 3: %v, want ErrInvalidConfig", err)
	}
}

// TestLocalGPUMemory: the in-process transport moves host memory only,
// and says so.
func TestLocalGPUMemory(t *testing.T) {
	runLocal(t, 2, Config{SendBytes: 64, RecvBytes: 64}, NewInProcess, func(ctx context.Context, g comm.Group, tr Transport) error {
		if ok, why := GPUMemory(tr); ok || !strings.Contains(why, "in-process") {
			return fmt.Errorf("rank %d: GPUMemory = %v, %q", g.Rank(), ok, why)
		}
		return nil
	})
}
