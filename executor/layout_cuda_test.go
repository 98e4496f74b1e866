//go:build cuda && cgo

package executor

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/goep/goep/comm"
	"github.com/goep/goep/device"
	"github.com/goep/goep/permute"
)

// gpuHere returns the GPU when the test binary runs with -gpu (the flag of
// the external tests, cuda_test.go), else skips.
func gpuHere(t *testing.T) *device.CUDA {
	t.Helper()
	if f := flag.Lookup("gpu"); f == nil || f.Value.String() != "true" {
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

// TestCUDALayoutKernels runs the GPU layout (layout_cuda.go) in worlds of
// 1, 3 and 4 goroutine ranks sharing the GPU and checks, on every rank, the
// tables in device memory against buildTables of ComputeLayout, the counts
// against the host layout's and a routing at fault against ComputeLayout's
// error, bit for bit; in capacity mode also a Relayout into the same
// tables. With -gpu.bench it then times DeepSeek-V3-sized layouts (256
// experts, top-8, 128 and 4096 tokens per rank) on the GPU and on the
// host.
func TestCUDALayoutKernels(t *testing.T) {
	b := gpuHere(t)
	for _, R := range []int{1, 3, 4} {
		for seed := range uint64(12) {
			c := genLayoutCase(seed*7 + uint64(R))
			c.regen(R, seed)
			t.Run(fmt.Sprintf("R=%d/seed=%d", R, seed), func(t *testing.T) {
				runLayoutWorld(t, b, c, false)
			})
		}
	}
	if f := flag.Lookup("gpu.bench"); f != nil && f.Value.String() == "true" {
		timeLayouts(t, b)
	}
}

// regen redraws c for R ranks (genLayoutCase draws its own R), keeping
// the draw's shape.
func (c *layoutCase) regen(R int, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, uint64(R)))
	L := 1 + rng.IntN(4)
	c.R = R
	c.cfg.NumExperts, c.cfg.RanksPerDomain = R*L, R
	c.cfg.TopK = 1 + rng.IntN(min(R*L, 6))
	c.cfg.MaxTokensPerRank = 1 + rng.IntN(300)
	if c.cfg.Mode == Capacity {
		c.cfg.MaxRecvTokens = 1 + rng.IntN(R*c.cfg.MaxTokensPerRank)
		c.cfg.MaxPermutedTokens = 1 + rng.IntN(R*c.cfg.MaxTokensPerRank*c.cfg.TopK)
		c.cfg.Overflow = OverflowDrop
	}
	c.routing = nil
	for range R {
		c.routing = append(c.routing, genLayoutRouting(rng, rng.IntN(c.cfg.MaxTokensPerRank+1), c.cfg.NumExperts, c.cfg.TopK, nil))
	}
	if seed%4 == 3 {
		// A fault: an expert out of range, or one repeated in a token.
		s := rng.IntN(R)
		if idx := c.routing[s]; len(idx) > 0 {
			i, K := rng.IntN(len(idx)), c.cfg.TopK
			if seed%8 == 3 || K == 1 {
				idx[i] = int32(c.cfg.NumExperts + rng.IntN(3))
			} else {
				t := i / K
				idx[t*K], idx[t*K+1] = 0, 0
			}
		}
	}
}

// runLayoutWorld runs c's layout on every rank (a Relayout too in
// capacity mode) and checks it; hostLayout runs the host layout instead.
func runLayoutWorld(t *testing.T, b *device.CUDA, c *layoutCase, hostLayout bool) {
	cfg := c.cfg
	cfg.Hidden, cfg.Timeout = 16, 20*time.Second
	gs := comm.NewLocal(c.R)
	errs := make([]error, c.R)
	var wg sync.WaitGroup
	for r := range c.R {
		wg.Go(func() { errs[r] = layoutRank(t.Context(), gs[r], b, cfg, c, hostLayout) })
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Errorf("%s, rank %d: %v", c, r, err)
		}
	}
}

func layoutRank(ctx context.Context, g comm.Group, b *device.CUDA, cfg Config, c *layoutCase, hostLayout bool) error {
	e, err := New(ctx, g, b, cfg)
	if err != nil {
		return err
	}
	defer e.Close()
	if e.gpu.lk == nil {
		return errors.New("no GPU layout kernels in one domain")
	}
	e.gpu.hostLayout = hostLayout
	me := g.Rank()
	routing := c.routing
	var h *Handle
	for round := range 2 {
		want, werr := ComputeLayout(me, cfg, routing)
		idx, err := e.NewTensor(device.Int32, len(routing[me])/cfg.TopK, cfg.TopK)
		if err != nil {
			return err
		}
		defer idx.Close()
		if err := device.Upload(ctx, idx, device.EncodeInt32(routing[me])); err != nil {
			return err
		}
		if h == nil {
			h, err = e.Layout(ctx, LayoutInput{TopkIdx: idx})
		} else {
			err = e.Relayout(ctx, h, LayoutInput{TopkIdx: idx})
		}
		if werr != nil || err != nil {
			if werr == nil || err == nil || werr.Error() != err.Error() {
				return fmt.Errorf("round %d: layout error %v, want %v", round, err, werr)
			}
			return nil
		}
		if err := e.Synchronize(ctx); err != nil {
			return err
		}
		if err := checkDeviceLayout(ctx, e, h, want, cfg, routing); err != nil {
			return fmt.Errorf("round %d: %w", round, err)
		}
		if cfg.Mode != Capacity {
			return h.Close()
		}
		// The second round: other routing, the same token counts.
		rng := rand.New(rand.NewPCG(uint64(round), 99))
		next := make([][]int32, len(routing))
		for s := range routing {
			next[s] = genLayoutRouting(rng, len(routing[s])/cfg.TopK, cfg.NumExperts, cfg.TopK, nil)
		}
		routing = next
	}
	return h.Close()
}

// checkDeviceLayout compares h's device tables and counts with want.
func checkDeviceLayout(ctx context.Context, e *Engine, h *Handle, want *Layout, cfg Config, routing [][]int32) error {
	raw, err := e.gpu.s.DownloadBuffer(ctx, h.gpu.all.Buffer())
	if err != nil {
		return err
	}
	got := permute.Int32s(raw)
	wt := buildTables(want, cfg, routing, e.gpu.W, h.recvRows)
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
	lay := h.lay
	if lay.RecvCount != want.RecvCount || lay.PermutedCount != want.PermutedCount ||
		!slices.Equal(lay.RecvCounts, want.RecvCounts) || !slices.Equal(lay.PermutedCounts, want.PermutedCounts) ||
		!slices.Equal(lay.TokensPerExpert, want.TokensPerExpert) || !slices.Equal(lay.ExpertOffsets, want.ExpertOffsets) {
		return fmt.Errorf("counts differ from the host layout's")
	}
	if h.gpu.n != e.validRecv(want, e.rank) {
		return fmt.Errorf("valid rows %d, want %d", h.gpu.n, e.validRecv(want, e.rank))
	}
	// The device counts (written from the GPU summary on the stream).
	dc, err := h.Counts(ctx)
	if err != nil {
		return err
	}
	overflow := cfg.Mode == Capacity && (want.RecvCount > cfg.MaxRecvTokens || want.PermutedCount > cfg.MaxPermutedTokens)
	wantTPE := make([]int, len(want.TokensPerExpert))
	for i, n := range want.TokensPerExpert {
		wantTPE[i] = int(n)
	}
	if dc.RecvCount != want.RecvCount || dc.PermutedCount != want.PermutedCount || dc.Overflow != overflow || !slices.Equal(dc.TokensPerExpert, wantTPE) {
		return fmt.Errorf("device counts %+v, want recv %d permuted %d overflow %v tokens per expert %v",
			dc, want.RecvCount, want.PermutedCount, overflow, wantTPE)
	}
	return nil
}

// timeLayouts logs the median Layout time (host wall clock: the layout
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
			cfg := Config{NumExperts: E, TopK: K, Hidden: 16, MaxTokensPerRank: T, Timeout: 20 * time.Second}
			gs := comm.NewLocal(R)
			times := make([][]time.Duration, R)
			errs := make([]error, R)
			var phases [4]time.Duration
			var wg sync.WaitGroup
			for r := range R {
				wg.Go(func() {
					var p [4]time.Duration
					times[r], p, errs[r] = timeLayoutRank(t.Context(), gs[r], b, cfg, host)
					if r == 0 {
						phases = p
					}
				})
			}
			wg.Wait()
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

func timeLayoutRank(ctx context.Context, g comm.Group, b *device.CUDA, cfg Config, host bool) (out []time.Duration, phases [4]time.Duration, err error) {
	e, err := New(ctx, g, b, cfg)
	if err != nil {
		return nil, phases, err
	}
	defer e.Close()
	e.gpu.hostLayout = host
	rng := rand.New(rand.NewPCG(uint64(g.Rank()), 5))
	T, K := cfg.MaxTokensPerRank, cfg.TopK
	idx, err := e.NewTensor(device.Int32, T, K)
	if err != nil {
		return nil, phases, err
	}
	defer idx.Close()
	routing := make([]int32, 0, T*K)
	for range T {
		routing = append(routing, genUniqueRow(rng, cfg.NumExperts, K)...)
	}
	if err := device.Upload(ctx, idx, device.EncodeInt32(routing)); err != nil {
		return nil, phases, err
	}
	for i := range 25 {
		if err := e.Synchronize(ctx); err != nil {
			return nil, phases, err
		}
		start := time.Now()
		h, err := e.Layout(ctx, LayoutInput{TopkIdx: idx})
		if err != nil {
			return nil, phases, err
		}
		if err := e.Synchronize(ctx); err != nil {
			return nil, phases, err
		}
		if i >= 5 { // warm-up
			out = append(out, time.Since(start))
		}
		if err := h.Close(); err != nil {
			return nil, phases, err
		}
	}
	if !host {
		phases = e.gpu.lk.phases
	}
	return out, phases, nil
}

func genUniqueRow(rng *rand.Rand, E, K int) []int32 {
	row := make([]int32, 0, K)
	for _, e := range rng.Perm(E)[:K] {
		row = append(row, int32(e))
	}
	return row
}
