//go:build cuda && cgo

package executor_test

import (
	"fmt"
	"strconv"
	"testing"

	"github.com/goep/goep/comm"
	"github.com/goep/goep/internal/ranktest"
)

// TestCUDADomains runs the whole API with several NVLink domains on the
// CUDA backend (the domain's windows on the GPU, the rail in host memory
// fed by the GPU, or staged through the host with GOEP_RAIL_HOST_STAGING)
// and compares every output bit for bit with the
// host backend's run of the same worlds: 2 domains x 2 ranks, 4 x 1 and one
// domain of 4 (the one-domain path), as
// goroutines of this process sharing the GPU (the in-process rail).
// domains_cuda_ucx_test.go runs them as processes over UCX.
func TestCUDADomains(t *testing.T) {
	b := needGPU(t)
	for _, d := range []int{2, 1, 4} {
		t.Run(fmt.Sprintf("4 ranks, D=%d", d), func(t *testing.T) {
			t.Setenv("GOEP_RANKS_PER_DOMAIN", strconv.Itoa(d))
			want := inProcessDigestsN(t, 4)
			gs := comm.NewLocal(4)
			got := make([][]map[string]string, 4)
			errs := ranktest.Run(4, func(r int) error {
				for _, seed := range seeds() {
					dg, err := mpPipeline(t.Context(), gs[r], b, seed)
					if err != nil {
						return fmt.Errorf("seed %d: %w", seed, err)
					}
					got[r] = append(got[r], dg)
				}
				return nil
			})
			if err := ranktest.Err(errs); err != nil {
				t.Fatal(err)
			}
			compareDigests(t, want, got, "on CUDA", "on the host")
		})
	}
}
