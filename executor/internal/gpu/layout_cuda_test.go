//go:build cuda && cgo

package gpu

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/goep/goep/comm"
	"github.com/goep/goep/device"
	"github.com/goep/goep/executor/internal/datapath"
	"github.com/goep/goep/executor/internal/plan"
	"github.com/goep/goep/executor/internal/plan/plantest"
	"github.com/goep/goep/internal/ranktest"
	"github.com/goep/goep/internal/view"
)

var (
	gpuFlag   = flag.Bool("gpu", false, "run the tests that need a GPU (on a GPU host)")
	gpuBench  = flag.Bool("gpu.bench", false, "with -gpu: time the GPU layout against the host's")
	layoutDim = 16 // Hidden of the layout tests' paths
)

// gpuHere returns the GPU when the test binary runs with -gpu, else skips.
func gpuHere(t *testing.T) *device.CUDA {
	t.Helper()
	if !*gpuFlag {
		t.Skip("needs a GPU: run the test binary with -gpu on a GPU host")
	}
	b, err := device.NewCUDA(0)
	if err != nil {
		t.Fatalf("-gpu given but: %v", err)
	}
	t.Cleanup(func() { b.Close() })
	b.SetCheckPointers(true)
	return b
}

// layoutWorld is one world of the layout tests: R ranks' routing and the
// layout's parameters.
type layoutWorld struct {
	R       int
	p       plan.Params
	routing [][]int32
}

func (w *layoutWorld) String() string {
	return fmt.Sprintf("R=%d E=%d K=%d maxT=%d pad=%d capacity=%v maxRecv=%d", w.R, w.p.NumExperts, w.p.TopK,
		w.p.MaxTokensPerRank, w.p.PadMultiple, w.p.Capacity, w.p.MaxRecvTokens)
}

// drawWorld draws a world of R ranks: 1-4 experts each, up to 300 tokens
// per rank, blocking or capacity mode (capacities often below the counts,
// so that rows are dropped), and in one seed of four a fault (an expert
// out of range, or one repeated in a token).
func drawWorld(R int, seed uint64) *layoutWorld {
	rng := rand.New(rand.NewPCG(seed, uint64(R)))
	L := 1 + rng.IntN(4)
	E := R * L
	K := 1 + rng.IntN(min(E, 6))
	maxT := 1 + rng.IntN(300)
	w := &layoutWorld{R: R, p: plan.Params{NumExperts: E, TopK: K, MaxTokensPerRank: maxT, RanksPerDomain: R, PadMultiple: 1 + rng.IntN(3)}}
	if rng.IntN(2) == 0 {
		w.p.Capacity = true
		w.p.MaxRecvTokens = 1 + rng.IntN(R*maxT)
		w.p.MaxPermutedTokens = 1 + rng.IntN(R*maxT*K)
	}
	for range R {
		w.routing = append(w.routing, plantest.Routing(rng, rng.IntN(maxT+1), E, K, nil))
	}
	if seed%4 == 3 {
		s := rng.IntN(R)
		if idx := w.routing[s]; len(idx) > 0 {
			i := rng.IntN(len(idx))
			if seed%8 == 3 || K == 1 {
				idx[i] = int32(E + rng.IntN(3))
			} else {
				t := i / K
				idx[t*K], idx[t*K+1] = 0, 0
			}
		}
	}
	return w
}

// TestCUDALayoutKernels runs the GPU layout in worlds of 1, 3 and 4
// goroutine ranks sharing the GPU and checks, on every rank, the tables in
// device memory against plan.BuildTables of plan.ComputeLayout, the counts
// against the host layout's and a routing at fault against ComputeLayout's
// error, bit for bit; in capacity mode also a Relayout into the same
// tables. With -gpu.bench it then times DeepSeek-V3-sized layouts (256
// experts, top-8, 128 and 4096 tokens per rank) on the GPU and on the
// host.
func TestCUDALayoutKernels(t *testing.T) {
	b := gpuHere(t)
	for _, R := range []int{1, 3, 4} {
		for seed := range uint64(12) {
			w := drawWorld(R, seed)
			t.Run(fmt.Sprintf("R=%d/seed=%d", R, seed), func(t *testing.T) {
				errs := onRanks(t.Context(), w.R, func(ctx context.Context, g comm.Group) error {
					return layoutRank(ctx, g, b, w)
				})
				for r, err := range errs {
					if err != nil {
						t.Errorf("%s, rank %d: %v", w, r, err)
					}
				}
			})
		}
	}
	if *gpuBench {
		timeLayouts(t, b)
	}
}

// onRanks runs fn on R goroutine ranks of an in-process group.
func onRanks(ctx context.Context, R int, fn func(ctx context.Context, g comm.Group) error) []error {
	gs := comm.NewLocal(R)
	return ranktest.Run(R, func(r int) error { return fn(ctx, gs[r]) })
}

// testPath is a rank's GPU path outside an engine, as executor.New makes
// it: its env, and Close, which waits for the other ranks first.
type testPath struct {
	*Path
	env datapath.Env
	g   comm.Group
}

func newTestPath(ctx context.Context, g comm.Group, b *device.CUDA, p plan.Params) (*testPath, error) {
	tp := &testPath{g: g}
	tp.env = datapath.Env{P: p, Rank: g.Rank(), NumRanks: g.Size(), Hidden: layoutDim, Drop: true,
		Timeout: 20 * time.Second, Fate: &datapath.Fate{}, Log: zap.NewNop(),
		Alloc: func(dt device.DType, shape ...int) (*device.Tensor, error) {
			return device.NewTensor(tp.s, dt, shape...)
		}}
	var err error
	tp.Path, err = New(ctx, g, b, &tp.env, nil, Options{})
	return tp, err
}

func (tp *testPath) Close(ctx context.Context) error {
	return errors.Join(tp.Drain(ctx), tp.g.Barrier(ctx), tp.Path.Close())
}

// upload is routing as a [T, TopK] tensor.
func (tp *testPath) upload(ctx context.Context, routing []int32) (*device.Tensor, error) {
	K := tp.env.P.TopK
	idx, err := tp.env.Alloc(device.Int32, len(routing)/K, K)
	if err != nil {
		return nil, err
	}
	if err := device.Upload(ctx, idx, device.EncodeInt32(routing)); err != nil {
		idx.Close()
		return nil, err
	}
	return idx, nil
}

// layout runs a layout of idx into h (a new handle when h is nil), as
// executor's Layout (and Relayout) does.
func (tp *testPath) layout(ctx context.Context, h *datapath.Handle, idx *device.Tensor, sig uint64) (*datapath.Handle, error) {
	if h == nil {
		counts, err := tp.env.Alloc(device.Int32, plan.CountsHeader+tp.env.NumLocalExperts())
		if err != nil {
			return nil, err
		}
		h = &datapath.Handle{ID: sig, NumTokens: idx.Rows(), Counts: counts}
	}
	return h, tp.Layout(ctx, h, idx, [4]uint64{sig})
}

func closeHandle(h *datapath.Handle) {
	if h.Tables != nil {
		h.Tables.Close()
	}
	h.Counts.Close()
}

// layoutRank runs w's layout on one rank (a Relayout too in capacity
// mode) and checks it.
func layoutRank(ctx context.Context, g comm.Group, b *device.CUDA, w *layoutWorld) (err error) {
	tp, err := newTestPath(ctx, g, b, w.p)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, tp.Close(ctx)) }()
	f, ok := tp.cross.(*flat)
	if !ok || f.lk == nil {
		return errors.New("no GPU layout kernels in one domain")
	}
	me, P := g.Rank(), w.p
	routing := w.routing
	var h *datapath.Handle
	defer func() {
		if h != nil {
			closeHandle(h)
		}
	}()
	for round := range 2 {
		want, werr := plan.ComputeLayout(me, P, routing)
		idx, err := tp.upload(ctx, routing[me])
		if err != nil {
			return err
		}
		defer idx.Close()
		h, err = tp.layout(ctx, h, idx, uint64(round+1))
		if werr != nil || err != nil {
			if werr == nil || err == nil || werr.Error() != err.Error() {
				return fmt.Errorf("round %d: layout error %v, want %v", round, err, werr)
			}
			return nil
		}
		if err := tp.Synchronize(ctx); err != nil {
			return err
		}
		if err := checkDeviceLayout(ctx, tp, h, want, routing); err != nil {
			return fmt.Errorf("round %d: %w", round, err)
		}
		if !P.Capacity {
			return nil
		}
		// The second round: other routing, the same token counts.
		rng := rand.New(rand.NewPCG(uint64(round), 99))
		next := make([][]int32, len(routing))
		for s := range routing {
			next[s] = plantest.Routing(rng, len(routing[s])/P.TopK, P.NumExperts, P.TopK, nil)
		}
		routing = next
	}
	return nil
}

// checkDeviceLayout compares h's device tables and counts with want.
func checkDeviceLayout(ctx context.Context, tp *testPath, h *datapath.Handle, want *plan.Layout, routing [][]int32) error {
	P := tp.env.P
	t := tbl(h)
	raw, err := tp.s.DownloadBuffer(ctx, t.all.Buffer())
	if err != nil {
		return err
	}
	got := view.Int32s(raw)
	wt := plan.BuildTables(want, P, routing, tp.W, h.RecvRows)
	if len(wt) == 0 {
		wt = []int32{-1} // the tensor holds at least one entry
	}
	if !slices.Equal(got, wt) {
		for i := range min(len(got), len(wt)) {
			if got[i] != wt[i] {
				return fmt.Errorf("tables differ first at %d of %d: %d, want %d", i, len(wt), got[i], wt[i])
			}
		}
		return fmt.Errorf("tables of %d entries, want %d", len(got), len(wt))
	}
	lay := h.Lay
	if lay.RecvCount != want.RecvCount || lay.PermutedCount != want.PermutedCount ||
		!slices.Equal(lay.RecvCounts, want.RecvCounts) || !slices.Equal(lay.PermutedCounts, want.PermutedCounts) ||
		!slices.Equal(lay.TokensPerExpert, want.TokensPerExpert) || !slices.Equal(lay.ExpertOffsets, want.ExpertOffsets) {
		return fmt.Errorf("counts differ from the host layout's")
	}
	if n := tp.env.ValidRecv(want, tp.env.Rank); t.n != n {
		return fmt.Errorf("valid rows %d, want %d", t.n, n)
	}
	// The device counts (written from the GPU summary on the stream).
	rc, err := device.Download(ctx, h.Counts)
	if err != nil {
		return err
	}
	if gc, wc := device.DecodeInt32(rc), plan.Counts(want, P); !slices.Equal(gc, wc) {
		return fmt.Errorf("device counts %v, want %v", gc, wc)
	}
	return nil
}

// timeLayouts logs the median layout time (host wall clock: the layout
// waits for its summary) of DeepSeek-V3 decode/prefill-sized worlds (1 and
// 4 goroutine ranks sharing the GPU) on the GPU and on the host.
func timeLayouts(t *testing.T, b *device.CUDA) {
	for _, check := range []bool{true, false} {
		// Pointer checks (GOEP_DEBUG_POINTERS, on in the tests) cost one
		// driver call per pointer argument of every launch.
		b.SetCheckPointers(check)
		t.Logf("pointer checks %v:", check)
		timeLayoutWorlds(t, b)
	}
	b.SetCheckPointers(true)
}

func timeLayoutWorlds(t *testing.T, b *device.CUDA) {
	for _, c := range []struct{ R, T int }{{1, 128}, {4, 128}, {4, 4096}} {
		for _, host := range []bool{false, true} {
			R, T, E, K := c.R, c.T, 256, 8
			P := plan.Params{NumExperts: E, TopK: K, MaxTokensPerRank: T, RanksPerDomain: R, PadMultiple: 1}
			times := make([][]time.Duration, R)
			var phases [4]time.Duration
			errs := onRanks(t.Context(), R, func(ctx context.Context, g comm.Group) error {
				var p [4]time.Duration
				var err error
				times[g.Rank()], p, err = timeLayoutRank(ctx, g, b, P, host)
				if g.Rank() == 0 {
					phases = p
				}
				return err
			})
			if err := errors.Join(errs...); err != nil {
				t.Fatal(err)
			}
			// The slowest rank of each iteration, then the median.
			its := make([]time.Duration, len(times[0]))
			for r := range R {
				for i, d := range times[r] {
					its[i] = max(its[i], d)
				}
			}
			sort.Slice(its, func(i, j int) bool { return its[i] < its[j] })
			where := "GPU"
			if host {
				where = "host"
			}
			t.Logf("layout on the %s: %d ranks, %d tokens each, %d experts, top-%d: median %v (of %d, p90 %v)",
				where, R, T, E, K, its[len(its)/2], len(its), its[len(its)*9/10])
			if !host {
				t.Logf("  rank 0's last GPU layout: enqueued %v, summary read %v, tables enqueued %v, counts written %v", phases[0], phases[1], phases[2], phases[3])
			}
		}
	}
}

func timeLayoutRank(ctx context.Context, g comm.Group, b *device.CUDA, P plan.Params, host bool) (out []time.Duration, phases [4]time.Duration, err error) {
	tp, err := newTestPath(ctx, g, b, P)
	if err != nil {
		return nil, phases, err
	}
	defer func() { err = errors.Join(err, tp.Close(ctx)) }()
	f := tp.cross.(*flat)
	f.hostLayout = host
	rng := rand.New(rand.NewPCG(uint64(g.Rank()), 5))
	idx, err := tp.upload(ctx, plantest.FullRows(rng, P.MaxTokensPerRank, P.NumExperts, P.TopK))
	if err != nil {
		return nil, phases, err
	}
	defer idx.Close()
	for i := range 25 {
		if err := tp.Synchronize(ctx); err != nil {
			return nil, phases, err
		}
		start := time.Now()
		h, err := tp.layout(ctx, nil, idx, uint64(i+1))
		if err != nil {
			return nil, phases, err
		}
		if err := tp.Synchronize(ctx); err != nil {
			return nil, phases, err
		}
		if i >= 5 { // warm-up
			out = append(out, time.Since(start))
		}
		closeHandle(h)
	}
	if !host {
		phases = f.lk.phases
	}
	return out, phases, nil
}
