package device

import (
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
	if n <= 0 {
		return
	}
	workers := runtime.GOMAXPROCS(0)
	if p.Workers > 0 {
		workers = p.Workers
	}
	if p.Chunk > 0 {
		p.dynamic(n, workers, fn)
		return
	}
	grain = max(grain, 1)
	workers = min(workers, (n+grain-1)/grain)
	if workers <= 1 {
		fn(0, n)
		return
	}
	var wg sync.WaitGroup
	chunk := (n + workers - 1) / workers
	for lo := chunk; lo < n; lo += chunk {
		wg.Go(func() { fn(lo, min(lo+chunk, n)) })
	}
	fn(0, min(chunk, n))
	wg.Wait()
}

// dynamic runs fn over chunks of p.Chunk items that up to workers
// goroutines (the caller's one of them) take in turn.
func (p Parallel) dynamic(n, workers int, fn func(lo, hi int)) {
	c := p.Chunk
	workers = min(workers, (n+c-1)/c)
	var next atomic.Int64
	work := func() {
		for {
			lo := int(next.Add(int64(c))) - c
			if lo >= n {
				return
			}
			fn(lo, min(lo+c, n))
		}
	}
	var wg sync.WaitGroup
	for range workers - 1 {
		wg.Go(work)
	}
	work()
	wg.Wait()
}
