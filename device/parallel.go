package device

import (
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
)

// ParallelFor calls fn over [0, n) split into contiguous chunks of at least
// grain items, on up to GOMAXPROCS goroutines, and returns when all are
// done. Small ranges run on the caller's goroutine. It is Parallel{}.For.
func ParallelFor(n, grain int, fn func(lo, hi int)) {
	Parallel{}.For(n, grain, fn)
}

// Parallel is how a host loop over rows spreads over goroutines: the
// host backend's side of the engine's tuning knobs (executor.Config's SMs
// and ChunkRows). The zero value is ParallelFor's split.
type Parallel struct {
	// Workers bounds the goroutines of one loop, the caller's included
	// (0: GOMAXPROCS).
	Workers int
	// Chunk, when positive, is the number of consecutive items of one work
	// item: the workers take chunks in turn from a shared counter until
	// none is left (dynamic balance, one atomic add per chunk). 0 splits
	// the range into one contiguous part per worker, each at least grain
	// items.
	Chunk int
}

// For calls fn over [0, n) as p says and returns when every call has
// returned. fn's ranges are disjoint and cover [0, n); a range that would
// need only one worker runs on the caller's goroutine.
func (p Parallel) For(n, grain int, fn func(lo, hi int)) {
	p.forWorkers(n, grain, func(_, lo, hi int) { fn(lo, hi) })
}

// ForScratch is p.For with a scratch value per worker (buffers a loop
// reuses from range to range): newScratch runs at most once per worker,
// before its first range, so small chunks do not allocate per chunk.
func ForScratch[S any](p Parallel, n, grain int, newScratch func() S, fn func(s S, lo, hi int)) {
	scratch := make([]S, p.workers(n, grain))
	made := make([]bool, len(scratch))
	p.forWorkers(n, grain, func(w, lo, hi int) {
		if !made[w] {
			scratch[w], made[w] = newScratch(), true
		}
		fn(scratch[w], lo, hi)
	})
}

// workers is the number of workers forWorkers uses for n items (at least
// 1).
func (p Parallel) workers(n, grain int) int {
	w := runtime.GOMAXPROCS(0)
	if p.Workers > 0 {
		w = p.Workers
	}
	per := max(grain, 1)
	if p.Chunk > 0 {
		per = p.Chunk
	}
	return max(1, min(w, (n+per-1)/per))
}

// forWorkers runs fn(w, lo, hi) over [0, n), w the index of the worker
// (0 is the caller's goroutine).
func (p Parallel) forWorkers(n, grain int, fn func(w, lo, hi int)) {
	if n <= 0 {
		return
	}
	workers := p.workers(n, grain)
	if p.Chunk > 0 {
		p.dynamic(n, workers, fn)
		return
	}
	if workers <= 1 {
		fn(0, 0, n)
		return
	}
	chunk := (n + workers - 1) / workers
	runWorkers(workers, func(w int) {
		if lo := w * chunk; lo < n {
			fn(w, lo, min(lo+chunk, n))
		}
	})
}

// runWorkers runs body(w) for w < workers, worker 0 on the caller's
// goroutine and the others on goroutines of their own, and returns when
// all have. A worker's panic is raised again here, on the caller's
// goroutine (firstPanic).
func runWorkers(workers int, body func(w int)) {
	var wg sync.WaitGroup
	var pv firstPanic
	for w := 1; w < workers; w++ {
		wg.Go(func() {
			defer pv.catch()
			body(w)
		})
	}
	func() {
		defer pv.catch()
		body(0)
	}()
	wg.Wait()
	pv.raise()
}

// firstPanic keeps the first panic of a loop's workers, so that it is
// raised again on the caller's goroutine once every worker has returned
// (where a host stream task turns it into an error) instead of taking the
// process down from a worker goroutine.
type firstPanic struct {
	mu    sync.Mutex
	value any
	stack []byte
}

// catch is deferred by every worker.
func (f *firstPanic) catch() {
	r := recover()
	if r == nil {
		return
	}
	buf := make([]byte, 8<<10)
	buf = buf[:runtime.Stack(buf, false)]
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.value == nil {
		f.value, f.stack = r, buf
	}
}

// raise panics with the first worker's panic, if any, and its stack.
func (f *firstPanic) raise() {
	if f.value != nil {
		panic(fmt.Sprintf("%v [in a worker goroutine:\n%s]", f.value, f.stack))
	}
}

// dynamic runs fn over chunks of p.Chunk items that workers goroutines
// (the caller's one of them, worker 0) take in turn.
func (p Parallel) dynamic(n, workers int, fn func(w, lo, hi int)) {
	c := p.Chunk
	var next atomic.Int64
	work := func(w int) {
		for {
			lo := int(next.Add(int64(c))) - c
			if lo >= n {
				return
			}
			fn(w, lo, min(lo+c, n))
		}
	}
	runWorkers(workers, work)
}
