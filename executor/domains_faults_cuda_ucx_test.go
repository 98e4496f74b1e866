//go:build cuda && cgo && ucx

package executor_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/goep/goep/comm"
	"github.com/goep/goep/device"
	"github.com/goep/goep/executor"
)

func init() { extraModes["gpu-hier-faults"] = gpuHierFaults }

// gpuHierFaults runs, with 2 domains of 2 ranks on the CUDA backend: a
// good dispatch and combine; a combine whose input rank 1 rejects (its
// domain peer, rank 0, finds the rejection in its GPU waits and reports
// it to its rail peer, rank 2, in the headers its GPU writes: the GPU-fed
// rail); a dispatch whose input rank 1 rejects; a good dispatch and
// combine (the engines must be usable again); abandonSteps (calls that
// fail on rank 1, its input or output freed); a combine
// whose partial sums cannot allocate their temporaries on rank 1; then a
// combine that rank 1
// joins only after the 2 s deadline (rank 0's GPU waits time out, and its
// GPU-written headers tell rank 2). It reports what each step returned,
// with Synchronize, and whether the rail is GPU-fed.
func gpuHierFaults(ctx context.Context, g comm.Group, b device.Backend) ([]map[string]string, error) {
	R := g.Size()
	cfg := executor.Config{NumExperts: 4 * R, TopK: 2, Hidden: 64, MaxTokensPerRank: 16, RanksPerDomain: 2, Timeout: 2 * time.Second}
	e, err := executor.New(ctx, g, b, cfg)
	if err != nil {
		return nil, err
	}
	defer e.Close()
	_, ti, xt, bad, err := faultInputs(ctx, e, 9, g.Rank(), cfg)
	if err != nil {
		return nil, err
	}
	h, err := e.Layout(ctx, executor.LayoutInput{TopkIdx: ti})
	if err != nil {
		return nil, err
	}
	defer h.Close()
	res := map[string]string{"fed": strconv.FormatBool(e.RailFed())}
	res["good"] = errText(goodPair(ctx, e, h, xt))
	out, err := e.Dispatch(ctx, h, executor.DispatchInput{X: xt})
	if err := errors.Join(err, e.Synchronize(ctx)); err != nil {
		return nil, err
	}
	z := out.RecvX
	if g.Rank() == 1 {
		z = bad
	}
	_, err = e.Combine(ctx, h, executor.CombineInput{Z: z})
	res["reject.combine"] = errText(errors.Join(err, e.Synchronize(ctx)))
	in := xt
	if g.Rank() == 1 {
		in = bad
	}
	_, err = e.Dispatch(ctx, h, executor.DispatchInput{X: in})
	res["reject.dispatch"] = errText(errors.Join(err, e.Synchronize(ctx)))
	res["after"] = errText(goodPair(ctx, e, h, xt))
	if err := abandonSteps(ctx, e, h, b, g.Rank(), ti, xt, res); err != nil {
		return nil, err
	}
	// A combine whose second allocation on rank 1, the first temporary of
	// its partial sums (hierSum), fails: after the domain exchange, before
	// the rail round, which must still carry the failure to rank 3.
	var countdown atomic.Int32 // rank 1's own
	executor.SetAllocHook(func(rank int) error {
		if rank == 1 && countdown.Add(-1) == 0 {
			return errors.New("injected: out of memory")
		}
		return nil
	})
	defer executor.SetAllocHook(nil)
	out, err = e.Dispatch(ctx, h, executor.DispatchInput{X: xt})
	if err := errors.Join(err, e.Synchronize(ctx)); err != nil {
		return nil, err
	}
	countdown.Store(2)
	_, err = e.Combine(ctx, h, executor.CombineInput{Z: out.RecvX})
	res["alloc.combine"] = errText(errors.Join(err, e.Synchronize(ctx)))
	res["alloc.after"] = errText(goodPair(ctx, e, h, xt))
	out, err = e.Dispatch(ctx, h, executor.DispatchInput{X: xt})
	if err := errors.Join(err, e.Synchronize(ctx)); err != nil {
		return nil, err
	}
	if g.Rank() == 1 {
		time.Sleep(3 * time.Second)
	}
	_, err = e.Combine(ctx, h, executor.CombineInput{Z: out.RecvX})
	res["late.combine"] = errText(errors.Join(err, e.Synchronize(ctx)))
	return []map[string]string{res}, nil
}

// TestCUDADomainsFaults: with 2 domains of 2 processes sharing the GPU (UCX
// over shared memory), on the GPU-fed rail and host-staged: a rank that
// rejects its combine input fails every rank's combine with an error
// naming it, including the rank of the other domain that learns it only
// from its rail peer's header (written by that peer's GPU on the GPU-fed
// rail); a rejected dispatch fails every rank; the engines work again
// after; a rank whose launch fails after its call began is named at once
// (abandon); a rank late to a combine is named, as timed out, by its domain
// peer and, through that peer's header, by the other domain's rank.
func TestCUDADomainsFaults(t *testing.T) {
	needGPU(t)
	for _, staging := range []bool{false, true} {
		t.Run("staging="+strconv.FormatBool(staging), func(t *testing.T) {
			got, lerr, log := runWorldN(t, "spawn", "gpu-hier-faults", 4, 2*time.Minute,
				"GOEP_MP_BACKEND=cuda", "GOEP_RANKS_PER_DOMAIN=2", "GOEP_RDMA_SHARED_MEMORY=true", "GOEP_DEBUG_POINTERS=1",
				"GOEP_RAIL_HOST_STAGING="+strconv.FormatBool(staging))
			for r, d := range reportedSteps(t, got, lerr, log) {
				checkHierFaults(t, r, d, staging)
			}
		})
	}
}

func checkHierFaults(t *testing.T, r int, d map[string]string, staging bool) {
	t.Helper()
	if want := strconv.FormatBool(!staging); d["fed"] != want {
		t.Errorf("rank %d: GPU-fed rail %s, want %s", r, d["fed"], want)
	}
	if d["good"] != "nil" || d["after"] != "nil" {
		t.Errorf("rank %d: good calls before and after the faults: %q, %q", r, d["good"], d["after"])
	}
	rc, rd, late := d["reject.combine"], d["reject.dispatch"], d["late.combine"]
	switch r {
	case 1:
		if !strings.Contains(rc, "shape") || !strings.Contains(rd, "shape") {
			t.Errorf("rank 1 combine and dispatch with a bad input: %q, %q; want shape errors", rc, rd)
		}
	case 3: // rank 1's rail peer: rank 1's own failure header
		if !strings.Contains(rc, "rank 1 reported") {
			t.Errorf("rank 3 combine after rank 1 rejected its input: %q, want rank 1's report", rc)
		}
		// Rank 1's own waits succeed when it comes: rank 3 may get its
		// partials in time; if not, the error names rank 1.
		if late != "nil" && !strings.Contains(late, "[1]") && !strings.Contains(late, "rank 1 ") {
			t.Errorf("rank 3 combine with rank 1 late: %q, want success or rank 1 named", late)
		}
	default: // rank 0 from its GPU waits, rank 2 from rank 0's header
		if !strings.Contains(rc, "rank(s) [1] rejected") {
			t.Errorf("rank %d combine after rank 1 rejected its input: %q, want an error naming rank 1", r, rc)
		}
		if !strings.Contains(late, "timed out") || !strings.Contains(late, "[1]") {
			t.Errorf("rank %d combine with rank 1 late: %q, want a timeout naming rank 1", r, late)
		}
		if r == 2 && (!strings.Contains(rc, "rank 0 reported") || !strings.Contains(late, "rank 0 reported")) {
			t.Errorf("rank 2: %q, %q; want both through rank 0's rail header", rc, late)
		}
	}
	// Rank 1 failed its partial sums' allocation; rank 3 hears it in the
	// rail round, ranks 0 and 2 need nothing of rank 1 after the domain
	// exchange.
	switch ac := d["alloc.combine"]; {
	case r == 1 && !strings.Contains(ac, "injected: out of memory"),
		r == 3 && !strings.Contains(ac, "rank 1 reported: injected: out of memory"),
		(r == 0 || r == 2) && ac != "nil":
		t.Errorf("rank %d combine with rank 1's partial sums not allocated: %q", r, ac)
	}
	if d["alloc.after"] != "nil" {
		t.Errorf("rank %d: dispatch and combine after that: %s", r, d["alloc.after"])
	}
	// Rank 1's launches fail the pointer check (its staged dispatch, the
	// download of its rows first); rank 0 sees its abandon in the domain,
	// rank 3 in its rail round, rank 2 through rank 0's rail header
	// (combine) or through rank 3 (dispatch, whose rail round comes first).
	checkAbandon(t, r, d, func(step string) string {
		if step == "abandon.layout" {
			// The layout runs on the host with several domains: rank
			// 1's download of its routing fails, and it rejects the
			// call in its rail round (rank 3) and domain exchange (rank
			// 0); rank 2 hears it from either.
			switch r {
			case 1:
				return "cuMemcpyDtoHAsync: CUDA_ERROR_INVALID_VALUE"
			case 0, 3:
				return "rank 1 reported"
			default:
				return "reported"
			}
		}
		switch {
		case r == 1 && staging && step == "abandon.dispatch":
			return "cuMemcpyDtoHAsync: CUDA_ERROR_INVALID_VALUE"
		case r == 1:
			return "is not device memory"
		case r == 0:
			return "rank(s) [1] rejected"
		case r == 3:
			return "rank 1 reported"
		case step == "abandon.combine":
			return "rank 0 reported: nvlink: rank(s) [1] rejected"
		default:
			// Rank 3 rejected the call for rank 1's report in its
			// rail round; its report relays rank 1's.
			return "rank 1 reported"
		}
	})
	if r != 1 && rd == "nil" {
		t.Errorf("rank %d dispatch after rank 1 rejected its input: no error", r)
	}
}

// TestCUDAFaultMatrix is the fault matrix of TestMultiProcessFaults
// (runFaultWorld's rules) on the CUDA backend: 4 processes sharing the
// GPU in one domain (the GPU's flags), in 2 domains of 2 and in 4 domains
// of 1 joined by the rail over UCX shared memory. With 2 domains, a hang
// is the world where a rank's rail round times out on the hung rank while
// its domain peer waits on the GPU: the peer must relay the timeout
// (ErrTimeout naming the hung rank, from the rejecting rank's report),
// not blame the rank that reported it; a death is named lost by the rank
// whose GPU wait timed out on the dead process too.
func TestCUDAFaultMatrix(t *testing.T) {
	needGPU(t)
	for _, d := range []int{mpRanks, 2, 1} {
		for _, fault := range faultNames {
			t.Run(fmt.Sprintf("D=%d/%s", d, fault), func(t *testing.T) {
				runFaultWorld(t, "spawn", fault, mpRanks, "GOEP_MP_BACKEND=cuda",
					"GOEP_RANKS_PER_DOMAIN="+strconv.Itoa(d), "GOEP_RDMA_SHARED_MEMORY=true")
			})
		}
	}
}
