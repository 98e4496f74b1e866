//go:build cuda && cgo && ucx

package executor_test

import (
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestCUDADomainsProcesses is TestCUDADomains with 2 emulated domains of 2
// processes sharing the GPU (CUDA IPC within a domain), the rail over UCX
// on shared memory and on TCP, GPU rows staged through pinned host memory.
func TestCUDADomainsProcesses(t *testing.T) {
	needGPU(t)
	t.Setenv("GOEP_RANKS_PER_DOMAIN", "2")
	want := inProcessDigestsN(t, 4)
	for _, shm := range []bool{true, false} {
		t.Run("shm="+strconv.FormatBool(shm), func(t *testing.T) {
			env := []string{"GOEP_MP_BACKEND=cuda", "GOEP_RANKS_PER_DOMAIN=2", "GOEP_RDMA_SHARED_MEMORY=" + strconv.FormatBool(shm), "GOEP_DEBUG_POINTERS=1"}
			// The children see only what runWorldN passes: hand on the
			// UCX settings of this run (UCX_TLS, UCX_PROTO_ENABLE, ...).
			for _, kv := range os.Environ() {
				if strings.HasPrefix(kv, "UCX_") {
					env = append(env, kv)
				}
			}
			res, lerr, log := runWorldN(t, "spawn", "cases", 4, 4*time.Minute, env...)
			compareDigests(t, want, reportedDigests(t, res, lerr, log), "on CUDA across processes", "on the host")
		})
	}
}
