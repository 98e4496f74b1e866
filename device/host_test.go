package device

import (
	"context"
	"errors"
	"math"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func newStream(t *testing.T) (*Host, *HostStream) {
	t.Helper()
	h := NewHost()
	s, err := h.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		s.Close()
		h.Close()
	})
	return h, s.(*HostStream)
}

func TestStreamRunsInOrder(t *testing.T) {
	_, s := newStream(t)
	var got []int
	for i := range 100 {
		s.Go("append", func() error { got = append(got, i); return nil })
	}
	if err := s.Synchronize(t.Context()); err != nil {
		t.Fatal(err)
	}
	if len(got) != 100 || !slices.IsSorted(got) {
		t.Fatalf("tasks ran out of order: %v", got)
	}
}

func TestStreamIsAsynchronous(t *testing.T) {
	_, s := newStream(t)
	release := make(chan struct{})
	var ran atomic.Bool
	s.Go("blocked", func() error { <-release; return nil })
	s.Go("after", func() error { ran.Store(true); return nil })
	ev, _ := s.Record()
	if ev.Done() || ran.Load() {
		t.Fatal("work completed before the stream could run it")
	}
	close(release)
	if err := ev.Wait(t.Context()); err != nil {
		t.Fatal(err)
	}
	if !ran.Load() || !ev.Done() {
		t.Fatal("event completed before the work recorded before it")
	}
}

func TestStreamErrorIsStickyUntilSynchronize(t *testing.T) {
	h, s := newStream(t)
	boom := errors.New("boom")
	var skipped atomic.Bool
	skipped.Store(true)
	s.Go("fails", func() error { return boom })
	s.Go("skipped", func() error { skipped.Store(false); return nil })
	b, _ := s.Alloc(10)
	s.Free(b) // frees run even after an error
	err := s.Synchronize(t.Context())
	var te *TaskError
	if !errors.Is(err, boom) || !errors.As(err, &te) || te.Task != "fails" {
		t.Fatalf("Synchronize: %v, want the failing task's error", err)
	}
	if !skipped.Load() {
		t.Fatal("a task after the failure ran")
	}
	if h.LiveBuffers() != 0 {
		t.Fatal("the free after the failure did not run")
	}
	if err := s.Synchronize(t.Context()); err != nil {
		t.Fatalf("second Synchronize: %v, want the error cleared", err)
	}
}

func TestPanicBecomesError(t *testing.T) {
	_, s := newStream(t)
	s.Go("panics", func() error { panic("bad op") })
	if err := s.Synchronize(t.Context()); err == nil {
		t.Fatal("a panicking task reported no error")
	}
}

func TestSynchronizeHonoursContext(t *testing.T) {
	_, s := newStream(t)
	release := make(chan struct{})
	defer close(release)
	s.Go("blocked", func() error { <-release; return nil })
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	if err := s.Synchronize(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Synchronize: %v, want the context's deadline", err)
	}
}

// TestSynchronizeRunsTasksInOrder: a Synchronize whose context cannot
// end may run the queued tasks on its own goroutine (the worker idle):
// they run in order, one at a time, a failed task skips the later plain
// ones, a collective task gets the error held, the first error is
// returned; a task enqueued meanwhile is left to the worker.
func TestSynchronizeRunsTasksInOrder(t *testing.T) {
	_, s := newStream(t)
	var mu sync.Mutex
	var ran []string
	note := func(v string) {
		mu.Lock()
		ran = append(ran, v)
		mu.Unlock()
	}
	var running atomic.Int32
	step := func(v string, err error) func() error {
		return func() error {
			if running.Add(1) != 1 {
				t.Error("two tasks ran at once")
			}
			defer running.Add(-1)
			note(v)
			return err
		}
	}
	bad := errors.New("bad")
	later := make(chan struct{})
	for round := range 50 {
		ran = nil
		s.Go("a", step("a", nil))
		s.Go("b", step("b", bad))
		s.Go("skipped", step("skipped", nil))
		s.GoCollective("c", func(held error) error {
			if !errors.Is(held, bad) {
				t.Errorf("round %d: the collective task got %v, want the held error", round, held)
			}
			note("c")
			// Enqueued during the wait: left to the worker (a
			// collective task, which the error held does not skip).
			s.GoCollective("d", func(error) error { note("d"); later <- struct{}{}; return nil })
			return nil
		})
		if err := s.Synchronize(context.Background()); !errors.Is(err, bad) {
			t.Fatalf("round %d: Synchronize: %v, want the failed task's error", round, err)
		}
		<-later
		if err := s.Synchronize(context.Background()); err != nil {
			t.Fatalf("round %d: second Synchronize: %v", round, err)
		}
		if want := []string{"a", "b", "c", "d"}; !slices.Equal(ran, want) {
			t.Fatalf("round %d: tasks ran %v, want %v", round, ran, want)
		}
	}
}

// TestCloseWhileSynchronizeRunsATask: Close during a task that a
// Synchronize runs waits for it, then stops the worker.
func TestCloseWhileSynchronizeRunsATask(t *testing.T) {
	h := NewHost()
	defer h.Close()
	st, err := h.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	s := st.(*HostStream)
	started, release := make(chan struct{}), make(chan struct{})
	s.Go("blocked", func() error { close(started); <-release; return nil })
	synced := make(chan error, 1)
	go func() { synced <- s.Synchronize(context.Background()) }()
	<-started
	closed := make(chan error, 1)
	go func() { closed <- s.Close() }()
	close(release)
	if err := <-synced; err != nil {
		t.Fatalf("Synchronize: %v", err)
	}
	if err := <-closed; err != nil {
		t.Fatalf("Close: %v", err)
	}
	s.Go("after close", func() error { t.Error("a task ran after Close"); return nil })
	if err := s.Synchronize(context.Background()); !errors.Is(err, ErrClosed) {
		t.Fatalf("Synchronize after Close: %v, want ErrClosed", err)
	}
}

func TestFreeIsStreamOrdered(t *testing.T) {
	h, s := newStream(t)
	b, err := s.Alloc(1000)
	if err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	s.Go("uses b", func() error { <-release; b.Host()[0] = 1; return nil })
	b.Free()
	b.Free() // twice is harmless
	// The pool must not hand b's memory out while the task is queued.
	c, err := s.Alloc(1000)
	if err != nil {
		t.Fatal(err)
	}
	if &c.region[0] == &b.region[0] {
		t.Fatal("memory freed under queued work was handed out again")
	}
	close(release)
	if err := s.Synchronize(t.Context()); err != nil {
		t.Fatal(err)
	}
	d, _ := s.Alloc(1000)
	if &d.region[0] != &b.region[0] {
		t.Fatal("freed memory was not reused once the work completed")
	}
	c.Free()
	d.Free()
	s.Synchronize(t.Context())
	if n := h.LiveBuffers(); n != 0 {
		t.Fatalf("%d buffers live", n)
	}
}

// TestFreeOnIdleStream: a free on a stream whose every task has completed
// returns the memory at once (no queued work can use it), and a free
// behind a running task waits for it.
func TestFreeOnIdleStream(t *testing.T) {
	h, s := newStream(t)
	b, _ := s.Alloc(1000)
	s.Go("uses b", func() error { b.Host()[0] = 1; return nil })
	if err := s.Synchronize(t.Context()); err != nil {
		t.Fatal(err)
	}
	b.Free()
	if n := h.LiveBuffers(); n != 0 {
		t.Fatalf("%d buffers live after a free on an idle stream, want 0", n)
	}
	c, _ := s.Alloc(1000)
	if &c.region[0] != &b.region[0] {
		t.Fatal("memory freed on an idle stream was not reused at once")
	}
	running, release := make(chan struct{}), make(chan struct{})
	s.Go("uses c", func() error { close(running); <-release; c.Host()[0] = 1; return nil })
	<-running
	c.Free()
	if n := h.LiveBuffers(); n != 1 {
		t.Fatalf("%d buffers live after a free behind a running task, want 1", n)
	}
	close(release)
	if err := s.Synchronize(t.Context()); err != nil {
		t.Fatal(err)
	}
	if n := h.LiveBuffers(); n != 0 {
		t.Fatalf("%d buffers live after the task, want 0", n)
	}
}

// TestClosedTensorTransfers: Upload and Download refuse a closed tensor
// (ErrClosed) instead of writing or reading memory the pool may have
// handed to another tensor (b below gets a's memory back).
func TestClosedTensorTransfers(t *testing.T) {
	_, s := newStream(t)
	a, err := NewTensor(s, BF16, 8)
	if err != nil {
		t.Fatal(err)
	}
	a.Close()
	if err := s.Synchronize(t.Context()); err != nil {
		t.Fatal(err)
	}
	b, err := NewTensor(s, BF16, 8)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if err := Upload(t.Context(), b, make([]byte, 16)); err != nil {
		t.Fatal(err)
	}
	if err := Upload(t.Context(), a, slices.Repeat([]byte{7}, 16)); !errors.Is(err, ErrClosed) {
		t.Fatalf("upload into a closed tensor: %v, want ErrClosed", err)
	}
	if _, err := Download(t.Context(), a); !errors.Is(err, ErrClosed) {
		t.Fatalf("download of a closed tensor: %v, want ErrClosed", err)
	}
	got, err := Download(t.Context(), b)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, make([]byte, 16)) {
		t.Fatalf("the tensor allocated after the close holds %v, want zeros", got)
	}
}

func TestCrossStreamWait(t *testing.T) {
	h := NewHost()
	defer h.Close()
	a, _ := h.NewStream()
	b, _ := h.NewStream()
	defer a.Close()
	defer b.Close()
	release := make(chan struct{})
	var order []string
	a.(*HostStream).Go("a", func() error { <-release; order = append(order, "a"); return nil })
	ev, _ := a.Record()
	b.Wait(ev)
	b.(*HostStream).Go("b", func() error { order = append(order, "b"); return nil })
	close(release)
	if err := b.Synchronize(t.Context()); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(order, []string{"a", "b"}) {
		t.Fatalf("order %v", order)
	}
}

func TestGuards(t *testing.T) {
	_, s := newStream(t)
	x, err := NewTensor(s, BF16, 3, 5)
	if err != nil {
		t.Fatal(err)
	}
	if err := x.CheckGuards(); err != nil {
		t.Fatal(err)
	}
	x.buf.region[guardSize+x.buf.size] = 0 // one byte past the end
	if err := x.CheckGuards(); err == nil {
		t.Fatal("an out-of-bounds write went unnoticed")
	}
}

func TestBF16Rounding(t *testing.T) {
	for _, tc := range []struct {
		in   float32
		want uint16
	}{
		{1, 0x3f80},
		{-2, 0xc000},
		{1 + 1.0/256, 0x3f80},             // tie, even stays
		{1 + 3.0/256, 0x3f82},             // tie, rounds up to even
		{1 + 1.0/256 + 1.0/65536, 0x3f81}, // above the tie
		{float32(math.Inf(1)), 0x7f80},
		{math.MaxFloat32, 0x7f80}, // overflows to infinity
		{float32(math.Copysign(0, -1)), 0x8000},
	} {
		if got := Float32ToBF16(tc.in); got != tc.want {
			t.Errorf("Float32ToBF16(%v) = %#04x, want %#04x", tc.in, got, tc.want)
		}
	}
	if nan := Float32ToBF16(float32(math.NaN())); BF16ToFloat32(nan) == BF16ToFloat32(nan) {
		t.Error("NaN did not stay NaN")
	}
	for u := range 1 << 16 {
		f := BF16ToFloat32(uint16(u))
		if f == f && Float32ToBF16(f) != uint16(u) {
			t.Fatalf("bf16 %#04x does not round-trip", u)
		}
	}
}

func TestParallelForCoversRange(t *testing.T) {
	for _, p := range []Parallel{{}, {Workers: 1}, {Workers: 3}, {Chunk: 1}, {Chunk: 7}, {Workers: 2, Chunk: 5}, {Workers: 64, Chunk: 2}} {
		for _, n := range []int{0, 1, 7, 100, 1001} {
			hits := make([]int32, n)
			var busy, most atomic.Int32
			p.For(n, 3, func(lo, hi int) {
				now := busy.Add(1)
				defer busy.Add(-1)
				for m := most.Load(); now > m && !most.CompareAndSwap(m, now); m = most.Load() {
				}
				if p.Chunk > 0 && hi-lo != p.Chunk && hi != n {
					t.Errorf("%+v n=%d: chunk [%d, %d) is not %d items", p, n, lo, hi, p.Chunk)
				}
				for i := lo; i < hi; i++ {
					atomic.AddInt32(&hits[i], 1)
				}
				time.Sleep(100 * time.Microsecond) // let the workers overlap
			})
			for i, h := range hits {
				if h != 1 {
					t.Fatalf("%+v n=%d: index %d visited %d times", p, n, i, h)
				}
			}
			if p.Workers > 0 && int(most.Load()) > p.Workers {
				t.Errorf("%+v n=%d: %d calls ran at once, more than the %d workers", p, n, most.Load(), p.Workers)
			}
		}
	}
	ParallelFor(10, 3, func(lo, hi int) {
		if hi-lo < 3 && hi != 10 {
			t.Errorf("ParallelFor: [%d, %d) is shorter than the grain", lo, hi)
		}
	})
}

// TestFreeRacesClose frees buffers from other goroutines (as garbage
// collector finalizers do) while the stream closes: Close must not fail
// and no memory may be lost.
func TestFreeRacesClose(t *testing.T) {
	for range 50 {
		h := NewHost()
		s, err := h.NewStream()
		if err != nil {
			t.Fatal(err)
		}
		bufs := make([]*Buffer, 64)
		for i := range bufs {
			if bufs[i], err = s.Alloc(64); err != nil {
				t.Fatal(err)
			}
		}
		var wg sync.WaitGroup
		for _, b := range bufs {
			wg.Go(func() { s.Free(b) })
		}
		if err := s.Close(); err != nil {
			t.Fatalf("Close: %v", err)
		}
		wg.Wait()
		if n := h.LiveBuffers(); n != 0 {
			t.Fatalf("%d buffers live after every Free", n)
		}
		h.Close()
	}
}

// TestForScratch: every index once, a scratch value per worker made at most
// once and never used by two ranges at the same time.
func TestForScratch(t *testing.T) {
	for _, p := range []Parallel{{}, {Workers: 1}, {Workers: 3, Chunk: 1}, {Chunk: 4}} {
		type scratch struct{ busy atomic.Bool }
		var made atomic.Int32
		hits := make([]int32, 500)
		ForScratch(p, len(hits), 7, func() *scratch { made.Add(1); return &scratch{} }, func(s *scratch, lo, hi int) {
			if !s.busy.CompareAndSwap(false, true) {
				t.Errorf("%+v: a scratch value used by two ranges at once", p)
			}
			for i := lo; i < hi; i++ {
				atomic.AddInt32(&hits[i], 1)
			}
			time.Sleep(50 * time.Microsecond)
			s.busy.Store(false)
		})
		for i, h := range hits {
			if h != 1 {
				t.Fatalf("%+v: index %d visited %d times", p, i, h)
			}
		}
		if w := p.workers(len(hits), 7); int(made.Load()) > w {
			t.Errorf("%+v: %d scratch values for %d workers", p, made.Load(), w)
		}
	}
}

// TestBufferGraphUses: a free asked for while graphs use a buffer's memory
// is put off until the last of them is closed, and happens once.
func TestBufferGraphUses(t *testing.T) {
	m := &bufMem{size: 8}
	if m.deferToGraphs() {
		t.Fatal("a free was put off with no graph using the memory")
	}
	m.useInGraph()
	m.useInGraph()
	if m.graphClosed() {
		t.Fatal("closing a graph asked for a free nobody asked for")
	}
	m.useInGraph()
	if !m.deferToGraphs() {
		t.Fatal("a free was not put off while two graphs use the memory")
	}
	if m.graphClosed() {
		t.Fatal("the memory was freed while a graph still uses it")
	}
	if !m.graphClosed() {
		t.Fatal("the last graph's Close did not free the memory whose free was put off")
	}
	m.useInGraph()
	if m.graphClosed() {
		t.Fatal("a free was done twice")
	}
	root := &Buffer{bufMem: m}
	v := &Buffer{bufMem: &bufMem{size: 4}, parent: &Buffer{bufMem: &bufMem{size: 6}, parent: root}}
	if v.root() != root || root.root() != root {
		t.Fatal("root of a view of a view is not the buffer that owns the memory")
	}
}

// TestParallelWorkerPanic: a panic in a worker goroutine of a parallel
// loop is raised again on the caller's goroutine after every worker
// returned (where a stream task turns it into an error), instead of
// taking the process down.
func TestParallelWorkerPanic(t *testing.T) {
	for _, p := range []Parallel{{Workers: 4}, {Workers: 4, Chunk: 3}} {
		var raised any
		func() {
			defer func() { raised = recover() }()
			p.For(64, 1, func(lo, hi int) {
				if lo > 0 && lo <= 40 && 40 < hi {
					panic("row 40")
				}
			})
		}()
		if s, _ := raised.(string); !strings.Contains(s, "row 40") {
			t.Errorf("%+v: recovered %v, want the worker's panic", p, raised)
		}
	}
	st, err := NewHost().NewStream()
	if err != nil {
		t.Fatal(err)
	}
	st.(*HostStream).Go("loop", func() error {
		ParallelFor(64, 1, func(lo, hi int) {
			if lo > 0 {
				panic("in a worker")
			}
		})
		return nil
	})
	if err := st.Synchronize(t.Context()); err == nil || !strings.Contains(err.Error(), "in a worker") {
		t.Errorf("stream after a task's worker panicked: %v, want the panic as its error", err)
	}
}

// TestSizeClass: a class holds its size, is a whole number of pages,
// wastes at most an eighth beyond a page, and grows with the size.
func TestSizeClass(t *testing.T) {
	prev := 0
	for _, n := range []int{1, 4096, 4097, 8191, 65536, 65537, 100_000, 1 << 20, 6<<20 + 128, 63<<20 + 1, 1<<30 + 5} {
		c := sizeClass(n)
		if c < n || c%4096 != 0 || (n > 4096 && c-n > n/8+4096) || c < prev {
			t.Errorf("sizeClass(%d) = %d", n, c)
		}
		prev = c
	}
}

// TestHostPoolEviction: a freed region that does not fit under the pool's
// limit makes room by giving back the regions pooled longest ago; a region
// no call reuses within poolIdle is given back at the next free or alloc.
func TestHostPoolEviction(t *testing.T) {
	const mib = 1 << 20
	clock := time.Unix(1000, 0)
	oldNow := now
	t.Cleanup(func() { now = oldNow })
	now = func() time.Time { return clock }
	oldAvail := hostMemoryAvailable
	t.Cleanup(func() { hostMemoryAvailable = oldAvail })
	hostMemoryAvailable = func() (int64, bool) { return 0, false } // the limit stays as set
	h, s := newStream(t)
	h.poolLimit = 10 * mib
	c3, c4, c5 := sizeClass(3*mib+2*guardSize), sizeClass(4*mib+2*guardSize), sizeClass(5*mib+2*guardSize)
	allocFree(t, s, 3*mib) // pooled first
	clock = clock.Add(time.Second)
	allocFree(t, s, 4*mib)
	if h.pooled != c3+c4 {
		t.Fatalf("pool holds %d bytes, want %d", h.pooled, c3+c4)
	}
	clock = clock.Add(time.Second)
	allocFree(t, s, 5*mib) // needs room: the 3 MiB region, the oldest, goes
	if h.pooled != c4+c5 || len(h.pool[c3]) != 0 {
		t.Fatalf("pool holds %d bytes (%d regions of the oldest class), want %d without the oldest", h.pooled, len(h.pool[c3]), c4+c5)
	}
	clock = clock.Add(poolIdle + time.Second)
	allocFree(t, s, 4*mib) // reuses the 4 MiB region; the idle 5 MiB one goes
	if h.pooled != c4 || len(h.pool[c5]) != 0 {
		t.Fatalf("pool holds %d bytes, want only the reused %d-byte region", h.pooled, c4)
	}
}

// TestHostPoolLimitFollowsMemory: the pool's limit is an eighth of the
// host memory available, re-read when a large region is freed (at most
// every limitRefresh), pooled pages counted as available.
func TestHostPoolLimitFollowsMemory(t *testing.T) {
	const mib = 1 << 20
	clock := time.Unix(1000, 0)
	oldNow, oldAvail := now, hostMemoryAvailable
	t.Cleanup(func() { now, hostMemoryAvailable = oldNow, oldAvail })
	now = func() time.Time { return clock }
	avail := int64(800 * mib)
	hostMemoryAvailable = func() (int64, bool) { return avail, true }
	h, s := newStream(t)
	if h.poolLimit != 100*mib {
		t.Fatalf("pool limit %d, want 100 MiB", h.poolLimit)
	}
	avail = 160 * mib // the machine's other work took memory
	allocFree(t, s, 2*mib)
	if h.poolLimit != 100*mib {
		t.Fatalf("pool limit %d re-read within limitRefresh", h.poolLimit)
	}
	clock = clock.Add(limitRefresh)
	allocFree(t, s, 2*mib) // reuses the pooled region (the pool is empty as it goes back)
	if h.poolLimit != 20*mib {
		t.Fatalf("pool limit %d, want 20 MiB: an eighth of what is available now", h.poolLimit)
	}
}

// TestHostTensorCleanup: a tensor dropped without Close is freed by its
// cleanup once collected; a closed one is freed at once, its cleanup
// stopped (Close, then the collector: nothing is freed twice, and the
// pool's count of live buffers never goes below what is live).
func TestHostTensorCleanup(t *testing.T) {
	h := NewHost()
	defer h.Close()
	s, err := h.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	keep, err := NewTensor(s, FP32, 16)
	if err != nil {
		t.Fatal(err)
	}
	for range 64 {
		c, err := NewTensor(s, FP32, 16)
		if err != nil {
			t.Fatal(err)
		}
		c.Close()
		if _, err := NewTensor(s, FP32, 16); err != nil { // dropped
			t.Fatal(err)
		}
	}
	// Cleanups run on their own goroutine after a collection: collect
	// until they have (each round waits for the stream's frees too).
	for i := 0; h.LiveBuffers() > 1; i++ {
		if i == 1000 {
			t.Fatalf("%d buffers live after 1000 collections, want 1 (the kept tensor)", h.LiveBuffers())
		}
		runtime.GC()
		if err := s.Synchronize(context.Background()); err != nil {
			t.Fatal(err)
		}
		runtime.Gosched()
	}
	if got := h.LiveBuffers(); got != 1 {
		t.Fatalf("%d buffers live, want 1", got)
	}
	keep.Close()
	if got := h.LiveBuffers(); got != 0 {
		t.Fatalf("%d buffers live after closing the last, want 0", got)
	}
}
