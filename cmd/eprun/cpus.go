package main

import (
	"os"
	"runtime"

	"github.com/goep/goep/launcher"
)

// shareCPUs gives this process its share of the node's CPUs when a
// launcher put several ranks on the node: GOMAXPROCS becomes the CPUs Go
// sees (runtime.GOMAXPROCS's default) divided by the local ranks, at least
// 1, unless the GOMAXPROCS variable is set. It returns the value set and
// whether it changed anything.
//
// Each rank's Go runtime otherwise runs as many threads as the node has
// CPUs, and with more ranks than CPUs those threads take the CPUs from
// the ranks that move the data: a rank polling a transfer (MPI_Test under
// comm's MPI group, the host path's waits) yields to the scheduler, which
// wakes another of its threads to take the goroutine. With one thread a
// rank on a CPU's share runs as an MPI program does (docs/PERFORMANCE.md:
// the a2a baseline against a C MPI program, 4 processes on 2 CPUs).
func shareCPUs(env launcher.Env) (int, bool) {
	have := runtime.GOMAXPROCS(0)
	if env.Kind == launcher.KindSingle || env.LocalSize <= 1 || os.Getenv("GOMAXPROCS") != "" {
		return have, false
	}
	n := max(1, have/env.LocalSize)
	if n == have {
		return have, false
	}
	runtime.GOMAXPROCS(n)
	return n, true
}
