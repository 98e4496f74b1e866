package cuda

import "sync/atomic"

// Counts are process-wide tallies of this package's use of the driver, to
// measure what a call costs the host: kernels launched and driver calls
// made per collective call (a benchmark reads them before and after). They
// only grow.
type Counts struct {
	// Calls are driver calls whose status this package read: all but
	// the releases, the error-name lookups and the restoring of another
	// context after a batch. Each batch of calls (Device.Do) begins with
	// cuCtxGetCurrent, then cuCtxSetCurrent unless the thread's last Do of
	// the device left its context current; both are counted.
	Calls uint64
	// Launches are kernels enqueued (cuLaunchKernel and
	// cuLaunchCooperativeKernel), counted when the driver accepted them.
	Launches uint64
	// GraphLaunches are CUDA graphs enqueued (cuGraphLaunch).
	GraphLaunches uint64
}

var counts struct{ calls, launches, graphLaunches atomic.Uint64 }

// ReadCounts returns the tallies so far; without the cuda tag they stay 0.
func ReadCounts() Counts {
	return Counts{Calls: counts.calls.Load(), Launches: counts.launches.Load(), GraphLaunches: counts.graphLaunches.Load()}
}

// Sub is c minus an earlier reading.
func (c Counts) Sub(earlier Counts) Counts {
	return Counts{Calls: c.Calls - earlier.Calls, Launches: c.Launches - earlier.Launches, GraphLaunches: c.GraphLaunches - earlier.GraphLaunches}
}
