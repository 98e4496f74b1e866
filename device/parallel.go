package device

import (
	"runtime"
	"sync"
)

// ParallelFor calls fn over [0, n) split into contiguous chunks of at least
// grain items, on up to GOMAXPROCS goroutines, and returns when all are
// done. Small ranges run on the caller's goroutine.
func ParallelFor(n, grain int, fn func(lo, hi int)) {
	if grain < 1 {
		grain = 1
	}
	workers := min(runtime.GOMAXPROCS(0), (n+grain-1)/grain)
	if workers <= 1 {
		if n > 0 {
			fn(0, n)
		}
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
