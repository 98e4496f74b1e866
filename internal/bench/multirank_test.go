package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"golang.org/x/sync/errgroup"

	"github.com/goep/goep/comm"
	"github.com/goep/goep/device"
	"github.com/goep/goep/executor"
	"github.com/goep/goep/internal/ranktest"
)

// TestRunRankWorld runs RunRank on 4 in-process groups, one goroutine and
// one host backend per rank, exactly as 4 processes under a launcher would
// (no shared clock: Timing is rank_max), and checks the aggregated rows:
// every rank returns the same rows, every output checks, and the a2a
// baseline ran over the group and checked too; in bf16, and in fp8 (its
// calls that combine in bf16).
func TestRunRankWorld(t *testing.T) {
	for _, tc := range []struct {
		dtype  string
		hidden int
	}{{"bf16", 32}, {"fp8", 128}} {
		t.Run(tc.dtype, func(t *testing.T) { runRankWorld(t, tc.dtype, tc.hidden) })
	}
}

func runRankWorld(t *testing.T, dtype string, hidden int) {
	c := Defaults()
	c.Ranks, c.Experts, c.TopK, c.Hidden, c.Tokens, c.Iters, c.Warmup = 4, 8, Ints{3}, Ints{hidden}, Ints{0, 24}, 3, 1
	c.DType = Strings{dtype}
	groups := comm.NewLocal(c.Ranks)
	defer func() {
		for _, g := range groups {
			g.Close()
		}
	}()
	results := make([]*Result, c.Ranks)
	steps := 0
	eg, ctx := errgroup.WithContext(t.Context())
	for r, g := range groups {
		eg.Go(func() error {
			opt := Options{}
			if r == 0 {
				opt.Progress = func(p Progress) { steps = p.Done }
			} else {
				opt.Progress = func(Progress) { panic("progress on a rank other than 0") }
			}
			res, err := RunRank(ctx, c, g, opt)
			results[r] = res
			return err
		})
	}
	if err := eg.Wait(); err != nil {
		t.Fatal(err)
	}
	if want := (Options{}).Steps(c); steps != want {
		t.Errorf("progress reached %d steps, want %d", steps, want)
	}
	res := results[0]
	if res.Timing != TimingRankMax || res.A2ATransport != "local" {
		t.Errorf("timing %q, a2a transport %q; want rank_max, local", res.Timing, res.A2ATransport)
	}
	if len(res.Rows) != 2*len(AllCalls) {
		t.Fatalf("%d rows, want %d", len(res.Rows), 2*len(AllCalls))
	}
	if res.Wrong() != 0 || res.Checked() == 0 {
		t.Errorf("%d of %d rows wrong", res.Wrong(), res.Checked())
	}
	want, _ := json.Marshal(res)
	for r := 1; r < c.Ranks; r++ {
		if got, _ := json.Marshal(results[r]); !bytes.Equal(got, want) {
			t.Errorf("rank %d's aggregated result differs from rank 0's", r)
		}
	}
	for _, row := range res.Rows {
		what := fmt.Sprintf("%s tokens=%d", row.Call, row.Tokens)
		if want := c.Cases()[0].CallDType(row.Call).String(); row.DType != want || row.CaseDType != dtype {
			t.Errorf("%s: dtype %s, case dtype %s; want %s, %s", what, row.DType, row.CaseDType, want, dtype)
		}
		if len(row.RecvRows) != c.Ranks || row.Time.N != c.Iters || row.A2A == nil || row.A2A.N != c.Iters {
			t.Errorf("%s: recv rows %v, time %+v, a2a %+v", what, row.RecvRows, row.Time, row.A2A)
			continue
		}
		if row.Time != row.RankMaxTime {
			t.Errorf("%s: time %+v is not the rank maximum %+v", what, row.Time, row.RankMaxTime)
		}
		if row.Tokens == 0 {
			continue
		}
		if row.CheckedRows == 0 || row.A2ACheckedRows != row.CheckedRows {
			t.Errorf("%s: %d rows checked, a2a %d", what, row.CheckedRows, row.A2ACheckedRows)
		}
		if row.NVLGBps <= 0 || row.BaselineGBps <= 0 || row.A2AGBps <= 0 || row.A2ASpeedup <= 0 {
			t.Errorf("%s: nvl %v, baseline %v, a2a %v GB/s, speedup %v", what, row.NVLGBps, row.BaselineGBps, row.A2AGBps, row.A2ASpeedup)
		}
	}
}

// TestRunRankCheckOnly: no baselines, the checks still run.
func TestRunRankCheckOnly(t *testing.T) {
	c := Defaults()
	c.Ranks, c.Experts, c.TopK, c.Hidden, c.Tokens, c.Iters, c.Warmup = 2, 4, Ints{2}, Ints{16}, Ints{8}, 1, 0
	res, err := Run(t.Context(), c, Options{CheckOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, row := range res.Rows {
		if row.A2A != nil || row.BaselineGBps != 0 || row.CheckedRows == 0 || row.Wrong != 0 {
			t.Errorf("%s: a2a %v, baseline %v GB/s, %d of %d wrong", row.Call, row.A2A, row.BaselineGBps, row.Wrong, row.CheckedRows)
		}
	}
	if res.A2ATransport != "" {
		t.Errorf("a2a transport %q without an a2a run", res.A2ATransport)
	}
}

// TestA2AMatchesEngine runs goep's four calls and the a2a baseline on the
// same inputs: the received rows, slots, weights, permuted layout and both
// combines must be identical byte for byte; with fp8 rows, the two
// dispatch calls, the rows and their scales (the a2a's unpacked).
func TestA2AMatchesEngine(t *testing.T) {
	for _, tc := range []struct {
		name                  string
		experts, topk, hidden int
		pad                   int
		dt                    device.DType
		tokens                []int
	}{
		{"bf16", 8, 3, 40, 1, device.BF16, []int{17, 0, 9, 23}},
		// 82-byte rows: the messages' ids and weights at odd offsets.
		{"bf16-odd", 8, 3, 41, 2, device.BF16, []int{17, 3, 9, 23}},
		{"fp32-pad4", 16, 4, 24, 4, device.FP32, []int{5, 12, 30, 1}},
		{"fp8-pad4", 16, 4, 256, 4, device.FP8E4M3, []int{5, 12, 30, 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const R = 4
			w := NewWorld(7, R, R, tc.experts, tc.topk, tc.hidden, tc.dt, tc.tokens)
			groups := comm.NewLocal(R)
			a2aGroups := comm.NewLocal(R)
			backend := device.NewHost()
			defer backend.Close()
			eg, ctx := errgroup.WithContext(t.Context())
			for r := range R {
				eg.Go(func() error {
					defer groups[r].Close()
					defer a2aGroups[r].Close()
					if err := compareA2A(ctx, w, groups[r], a2aGroups[r], backend, tc.pad); err != nil {
						return fmt.Errorf("rank %d: %w", r, err)
					}
					return nil
				})
			}
			if err := eg.Wait(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func compareA2A(ctx context.Context, w *World, g, ag comm.Group, backend *device.Host, pad int) error {
	r := g.Rank()
	e, err := executor.New(ctx, g, backend, executor.Config{
		NumExperts: w.Experts, TopK: w.TopK, Hidden: w.Hidden, MaxTokensPerRank: 64, PadMultiple: pad,
	})
	if err != nil {
		return err
	}
	defer e.Close()
	x, idx, wts := w.Inputs(r)
	t := w.Tokens[r]
	xt, err := upload(ctx, e, w.DType, x, t, w.Hidden)
	if err != nil {
		return err
	}
	it, err := upload(ctx, e, device.Int32, device.EncodeInt32(idx), t, w.TopK)
	if err != nil {
		return err
	}
	wt, err := upload(ctx, e, device.FP32, device.EncodeFloat32(device.FP32, wts), t, w.TopK)
	if err != nil {
		return err
	}
	hd, err := e.Layout(ctx, executor.LayoutInput{TopkIdx: it})
	if err != nil {
		return err
	}
	defer hd.Close()
	in := executor.DispatchInput{X: xt, TopkWeights: wt}
	fp8 := w.DType == device.FP8E4M3
	if fp8 {
		if in.XScales, err = upload(ctx, e, device.FP32, w.InputScales(r), t, w.ScaleCols()); err != nil {
			return err
		}
	}
	disp, err := e.Dispatch(ctx, hd, in)
	if err != nil {
		return err
	}
	dp, err := e.DispatchPermute(ctx, hd, in)
	if err != nil {
		return err
	}
	get := func(t *device.Tensor) []byte {
		b, derr := device.Download(ctx, t)
		err = errors.Join(err, derr)
		return b
	}
	want := map[string][]byte{
		"RecvX": get(disp.RecvX), "RecvIdx": get(disp.RecvIdx), "RecvWeights": get(disp.RecvWeights),
		"PermutedX": get(dp.X), "PermutedWeights": get(dp.Weights),
	}
	if fp8 {
		want["RecvScales"], want["PermutedScales"] = get(disp.RecvScales), get(dp.Scales)
	} else {
		comb, cerr := e.Combine(ctx, hd, executor.CombineInput{Z: disp.RecvX})
		uc, uerr := e.UnpermuteCombine(ctx, hd, executor.UnpermuteInput{Y: dp.X, RecvWeights: dp.RecvWeights})
		if err := errors.Join(cerr, uerr); err != nil {
			return err
		}
		want["Combine"], want["UnpermuteCombine"] = get(comb), get(uc)
	}
	if err != nil {
		return err
	}

	a := NewA2A(w, ag, pad)
	defer a.Close()
	got := map[string][]byte{}
	if err := a.Dispatch(ctx); err != nil {
		return err
	}
	z := a.RecvX()
	got["RecvX"], got["RecvScales"] = a.Unpack(z)
	got["RecvIdx"], got["RecvWeights"] = device.EncodeInt32(a.RecvIdx), device.EncodeFloat32(device.FP32, a.RecvWeights)
	if !fp8 {
		if err := a.Combine(ctx, z); err != nil {
			return err
		}
		got["Combine"] = bytes.Clone(a.Out)
	} else if err := a.Combine(ctx, z); err == nil {
		return fmt.Errorf("a2a Combine of fp8 rows: no error")
	}
	if err := a.Dispatch(ctx); err != nil {
		return err
	}
	if err := a.Permute(); err != nil {
		return err
	}
	rb := RowBytes(w.DType, w.Hidden)
	got["PermutedX"], got["PermutedScales"] = a.Unpack(a.X[:a.P*rb])
	got["PermutedWeights"] = device.EncodeFloat32(device.FP32, a.Weights[:a.P])
	if !fp8 {
		if err := a.UnpermuteCombine(ctx, bytes.Clone(got["PermutedX"])); err != nil {
			return err
		}
		got["UnpermuteCombine"] = a.Out
	}
	if len(got["RecvScales"]) != len(want["RecvScales"]) || len(got["PermutedScales"]) != len(want["PermutedScales"]) {
		return fmt.Errorf("a2a scales: %d and %d bytes, goep's %d and %d", len(got["RecvScales"]), len(got["PermutedScales"]), len(want["RecvScales"]), len(want["PermutedScales"]))
	}
	for k, wb := range want {
		if !bytes.Equal(got[k], wb) {
			return fmt.Errorf("a2a %s differs from goep's (%d bytes, goep %d)", k, len(got[k]), len(wb))
		}
	}
	return nil
}

// TestRunRankConfigMismatch: ranks started with different (valid)
// configs fail at once on every rank, naming the rank and the field,
// under a context without deadline. (They once ran into each other's
// barriers in different cases: under mpirun, a hang.)
func TestRunRankConfigMismatch(t *testing.T) {
	c := Defaults()
	c.Ranks, c.Experts, c.TopK, c.Hidden, c.Tokens, c.Iters, c.Warmup = 3, 6, Ints{2}, Ints{8}, Ints{4}, 2, 0
	groups := comm.NewLocal(c.Ranks)
	errs := ranktest.Run(c.Ranks, func(r int) error {
		g := groups[r]
		defer g.Close()
		cr := c
		switch r {
		case 1:
			cr.Iters = 3
		case 2:
			cr.Warmup = 1
		}
		_, err := RunRank(context.Background(), cr, g, Options{})
		return err
	})
	for r, want := range []string{"rank 1 runs another config than rank 0: iters 2 here, 3 there", "rank 0 runs another config than rank 1: iters 3 here, 2 there", "rank 0 runs another config than rank 2: warmup 1 here, 0 there"} {
		if errs[r] == nil || !strings.Contains(errs[r].Error(), want) {
			t.Errorf("rank %d: %v, want an error saying %q", r, errs[r], want)
		}
	}
}
