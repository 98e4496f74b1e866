//go:build ucx

package executor_test

import (
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"
)

// Several NVLink domains across processes (tag ucx): the ranks of a world
// are split into emulated domains with GOEP_RANKS_PER_DOMAIN, and the
// inter-domain rail runs over UCX, on TCP (GOEP_RDMA_SHARED_MEMORY unset)
// and on shared memory. The in-process runs of the same worlds use the
// in-process transport, and the property tests check those against the
// reference model, so equal digests mean every output is bit-exact.

// domainShapes are the (ranks, ranks per domain) worlds: 2 domains x 2 and
// 2 domains x 4.
var domainShapes = []struct{ n, d int }{{4, 2}, {8, 4}}

func TestMultiProcessDomains(t *testing.T) {
	if os.Getenv("GOEP_MP_MODE") != "" {
		t.Skip("child")
	}
	for _, sh := range domainShapes {
		t.Run(fmt.Sprintf("%dx%d", sh.n/sh.d, sh.d), func(t *testing.T) {
			t.Setenv("GOEP_RANKS_PER_DOMAIN", strconv.Itoa(sh.d))
			want := inProcessDigestsN(t, sh.n)
			for _, tr := range []string{"tcp", "shm"} {
				for _, how := range []string{"spawn", "mpirun"} {
					t.Run(tr+"/"+how, func(t *testing.T) {
						got, lerr, log := runWorldN(t, how, "cases", sh.n, 3*time.Minute,
							"GOEP_RANKS_PER_DOMAIN="+strconv.Itoa(sh.d), "GOEP_RDMA_SHARED_MEMORY="+strconv.FormatBool(tr == "shm"))
						compareDigests(t, want, reportedDigests(t, got, lerr, log), "across processes", "in-process")
					})
				}
			}
		})
	}
}

// TestMultiProcessDomainsKill kills rank 2 (domain 1) in the middle of a
// dispatch of a 2 x 2 world: every other rank, in both domains, must return
// an error naming it well within GOEP_TIMEOUT. Rank 0 hears it from its rail
// (rank 2 is its peer there), rank 3 from its domain, and rank 1 from rank
// 0, which publishes the failure in their domain's exchange.
func TestMultiProcessDomainsKill(t *testing.T) {
	if os.Getenv("GOEP_MP_MODE") != "" {
		t.Skip("child")
	}
	for _, tr := range []string{"tcp", "shm"} {
		t.Run(tr, func(t *testing.T) {
			got, lerr, log := runWorldN(t, "spawn", "kill", 4, time.Minute,
				"GOEP_RANKS_PER_DOMAIN=2", "GOEP_RDMA_SHARED_MEMORY="+strconv.FormatBool(tr == "shm"))
			checkKilled(t, got, lerr, log)
		})
	}
}
