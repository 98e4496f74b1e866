//go:build cuda && cgo && ucx

package executor_test

import (
	"context"
	"errors"
	"strings"
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
// rail); a dispatch whose input rank 1 rejects; then a good dispatch and
// combine (the engines must be usable again). It reports what each step
// returned, with Synchronize.
func gpuHierFaults(ctx context.Context, g comm.Group, b device.Backend) ([]map[string]string, error) {
	R := g.Size()
	cfg := executor.Config{NumExperts: 4 * R, TopK: 2, Hidden: 64, MaxTokensPerRank: 16, RanksPerDomain: 2, Timeout: 20 * time.Second}
	e, err := executor.New(ctx, g, b, cfg)
	if err != nil {
		return nil, err
	}
	defer e.Close()
	idx, x, _ := graphInputs(9, g.Rank(), cfg, 16)
	ti, err1 := e.NewTensor(device.Int32, 16, 2)
	xt, err2 := e.NewTensor(device.BF16, 16, 64)
	bad, err3 := e.NewTensor(device.BF16, 16, 32)
	if err := errors.Join(err1, err2, err3, device.Upload(ctx, ti, device.EncodeInt32(idx)), device.Upload(ctx, xt, x)); err != nil {
		return nil, err
	}
	h, err := e.Layout(ctx, executor.LayoutInput{TopkIdx: ti})
	if err != nil {
		return nil, err
	}
	defer h.Close()
	str := func(err error) string {
		if err == nil {
			return "nil"
		}
		return err.Error()
	}
	res := map[string]string{}
	pair := func() error {
		out, err := e.Dispatch(ctx, h, executor.DispatchInput{X: xt})
		if err != nil {
			return err
		}
		_, err = e.Combine(ctx, h, executor.CombineInput{Z: out.RecvX})
		return errors.Join(err, e.Synchronize(ctx))
	}
	res["good"] = str(pair())
	out, err := e.Dispatch(ctx, h, executor.DispatchInput{X: xt})
	if err := errors.Join(err, e.Synchronize(ctx)); err != nil {
		return nil, err
	}
	z := out.RecvX
	if g.Rank() == 1 {
		z = bad
	}
	_, err = e.Combine(ctx, h, executor.CombineInput{Z: z})
	res["reject.combine"] = str(errors.Join(err, e.Synchronize(ctx)))
	in := xt
	if g.Rank() == 1 {
		in = bad
	}
	_, err = e.Dispatch(ctx, h, executor.DispatchInput{X: in})
	res["reject.dispatch"] = str(errors.Join(err, e.Synchronize(ctx)))
	res["after"] = str(pair())
	return []map[string]string{res}, nil
}

// TestCUDADomainsFaults: with 2 domains of 2 processes sharing the GPU (UCX
// over shared memory), a rank that rejects its combine input fails every
// rank's combine with an error naming it, including the rank of the other
// domain that learns it only from the header its rail peer's GPU wrote; a
// rejected dispatch fails every rank; the engines work again after.
func TestCUDADomainsFaults(t *testing.T) {
	needGPU(t)
	got, lerr, log := runWorldN(t, "spawn", "gpu-hier-faults", 4, 2*time.Minute,
		"GOEP_MP_BACKEND=cuda", "GOEP_RANKS_PER_DOMAIN=2", "GOEP_RDMA_SHARED_MEMORY=true", "GOEP_DEBUG_POINTERS=1")
	if lerr != nil {
		t.Fatalf("launcher: %v\n%s", lerr, log)
	}
	for r, res := range got {
		if res.Err != "" || len(res.Digests) != 1 {
			t.Fatalf("rank %d: %q\n%s", r, res.Err, log)
		}
		d := res.Digests[0]
		t.Logf("rank %d: %v", r, d)
		if d["good"] != "nil" || d["after"] != "nil" {
			t.Errorf("rank %d: good calls before and after the faults: %q, %q", r, d["good"], d["after"])
		}
		rc, rd := d["reject.combine"], d["reject.dispatch"]
		switch r {
		case 1:
			if !strings.Contains(rc, "shape") || !strings.Contains(rd, "shape") {
				t.Errorf("rank 1 combine and dispatch with a bad input: %q, %q; want shape errors", rc, rd)
			}
		case 3: // rank 1's rail peer: rank 1's own failure header
			if !strings.Contains(rc, "rank 1 reported") {
				t.Errorf("rank 3 combine after rank 1 rejected its input: %q, want rank 1's report", rc)
			}
		default: // rank 0 from its GPU waits, rank 2 from rank 0's GPU-written header
			if !strings.Contains(rc, "rank(s) [1] rejected") {
				t.Errorf("rank %d combine after rank 1 rejected its input: %q, want an error naming rank 1", r, rc)
			}
			if r == 2 && !strings.Contains(rc, "rank 0 reported") {
				t.Errorf("rank 2: %q, want it through rank 0's rail header", rc)
			}
		}
		if r != 1 && rd == "nil" {
			t.Errorf("rank %d dispatch after rank 1 rejected its input: no error", r)
		}
	}
}
