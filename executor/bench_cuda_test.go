//go:build cuda && cgo

package executor_test

import (
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/goep/goep/comm"
	"github.com/goep/goep/device"
	"github.com/goep/goep/executor"
	"github.com/goep/goep/internal/cuda"
	"github.com/goep/goep/internal/ranktest"
)

var gpuBench = flag.Bool("gpu.bench", false, "run TestCUDABenchmark (needs a GPU)")

func init() { extraModes["bench"] = benchRank }

// benchShapes are the token counts per rank of TestCUDABenchmark
// (DeepSeek-V3 decode and prefill).
var benchShapes = []int{128, 4096}

// benchRank measures one rank: for each token count, dispatch, combine,
// dispatch-permute, unpermute-combine and a device-to-device copy of the
// dispatch's received bytes, then dispatch and dispatch-permute of the
// same rows as fp8 with their scales beside a copy of the fp8 rows' bytes.
// Each is timed with CUDA events on the engine's stream after warm-up,
// launched from the host (eager), as a CUDA graph of the call (one
// launch between the events) and, where the world is in this process,
// queued behind a start gate (the GPU's time alone); every iteration's
// time is the maximum over
// ranks (all-gathered). It returns, per shape, the medians and p90s in
// microseconds and the bytes moved.
func benchRank(ctx context.Context, g comm.Group, b device.Backend) ([]map[string]string, error) {
	cfg := executor.Config{NumExperts: 256, TopK: 8, Hidden: 7168, MaxTokensPerRank: slices.Max(benchShapes)}
	e, err := executor.New(ctx, g, b, cfg)
	if err != nil {
		return nil, err
	}
	defer e.Close()
	s := e.Stream().(*device.CUDAStream)
	const warm, iters = 5, 30
	// queued times the calls behind a start gate: where every rank of
	// the world is in this process (goroutine ranks share benchGate, a
	// lone rank makes its own), each iteration's call and events are
	// queued while the GPU still runs the gate's delay, so the events
	// time the GPU's work alone, without the host's enqueueing that an
	// eager call on an idle GPU adds (the way calls run when the host
	// keeps ahead of the GPU, as in a training step).
	gate := benchGate
	if gate == nil && g.Size() == 1 {
		if gate, err = newStartGate(b.(*device.CUDA)); err != nil {
			return nil, err
		}
		defer gate.Close()
	}
	hows := []string{"eager", "graph"}
	if gate != nil {
		hows = append(hows, "queued")
	}
	var res []map[string]string
	for _, T := range benchShapes {
		H := cfg.Hidden
		ti, xt, xs, err := benchInputs(ctx, e, cfg, T, g.Rank())
		if err != nil {
			return nil, err
		}
		xb := device.EncodeFloat32(device.BF16, xs)
		// The fp8 rows: the first T*H bytes of the bf16 data; their scales.
		S := H / device.FP8ScaleChannels
		x8, _ := e.NewTensor(device.FP8E4M3, T, H)
		s8, _ := e.NewTensor(device.FP32, T, S)
		if err := errors.Join(device.Upload(ctx, x8, xb[:T*H]), device.Upload(ctx, s8, device.EncodeFloat32(device.FP32, xs[:T*S]))); err != nil {
			return nil, err
		}
		in8 := executor.DispatchInput{X: x8, XScales: s8}
		h, err := e.Layout(ctx, executor.LayoutInput{TopkIdx: ti})
		if err != nil {
			return nil, err
		}
		n := h.RecvRows()
		nvlBytes := n * H * 2
		fp8Bytes := n * (H + 4*S) // DESIGN.md section 6: fp8 rows with their scales
		z, _ := e.NewTensor(device.BF16, n, H)
		cp, _ := e.NewTensor(device.BF16, max(n, 1), H)
		dpo, err := e.DispatchPermute(ctx, h, executor.DispatchInput{X: xt})
		if err != nil {
			return nil, err
		}
		calls := []struct {
			name string
			run  func() error
		}{
			{"copy", func() error { return s.Copy(cp.Buffer(), 0, z.Buffer(), 0, nvlBytes) }},
			{"dispatch", dispatchCall(ctx, e, h, xt)},
			{"combine", combineCall(ctx, e, h, z)},
			{"dispatch-permute", func() error {
				o, err := e.DispatchPermute(ctx, h, executor.DispatchInput{X: xt})
				o.Close()
				return err
			}},
			{"unpermute-combine", func() error {
				o, err := e.UnpermuteCombine(ctx, h, executor.UnpermuteInput{Y: dpo.X})
				o.Close()
				return err
			}},
			{"copy-fp8", func() error { return s.Copy(cp.Buffer(), 0, z.Buffer(), 0, fp8Bytes) }},
			{"dispatch-fp8", func() error {
				o, err := e.Dispatch(ctx, h, in8)
				o.Close()
				return err
			}},
			{"dispatch-permute-fp8", func() error {
				o, err := e.DispatchPermute(ctx, h, in8)
				o.Close()
				return err
			}},
		}
		r := map[string]string{"tokens": strconv.Itoa(T), "recv_rows": strconv.Itoa(n), "nvl_bytes": strconv.Itoa(nvlBytes),
			"nvl_bytes_fp8": strconv.Itoa(fp8Bytes)}
		for _, c := range calls {
			// Each call is timed as launched from the host (eager) and as a
			// CUDA graph of the same call (no host gaps inside it).
			graph, err := capture(s, c.run)
			if err != nil {
				return nil, fmt.Errorf("%s: capture: %w", c.name, err)
			}
			for _, how := range hows {
				run, gt := c.run, (*startGate)(nil)
				switch how {
				case "graph":
					run = func() error { return graph.Launch(s) }
				case "queued":
					gt = gate
				}
				tc, err := timeCall(ctx, g, e, s, gt, run, warm, iters)
				if err != nil {
					graph.Close()
					return nil, fmt.Errorf("%s (%s): %w", c.name, how, err)
				}
				r[c.name+"_"+how+"_us"] = strconv.FormatFloat(tc.med, 'f', 1, 64)
				r[c.name+"_"+how+"_p90_us"] = strconv.FormatFloat(tc.p90, 'f', 1, 64)
				r[c.name+"_"+how+"_host_us"] = strconv.FormatFloat(tc.host, 'f', 1, 64)
				if benchRanksInProcess == 1 {
					// The driver tallies are the process's: this rank's
					// alone only where it is the process's one rank.
					r[c.name+"_"+how+"_launches"] = strconv.FormatUint(tc.counts.Launches+tc.counts.GraphLaunches, 10)
					r[c.name+"_"+how+"_calls"] = strconv.FormatUint(tc.counts.Calls, 10)
				}
			}
			graph.Close()
		}
		dpo.Close()
		ti.Close()
		xt.Close()
		x8.Close()
		s8.Close()
		z.Close()
		cp.Close()
		h.Close()
		res = append(res, r)
	}
	return res, nil
}

// benchInputs are the routing (uniform top-K of distinct experts) and
// the bf16 rows (normal values, xs as float32) of T tokens of rank, the
// same for the same T and rank in every run.
func benchInputs(ctx context.Context, e *executor.Engine, cfg executor.Config, T, rank int) (ti, xt *device.Tensor, xs []float32, err error) {
	K, H := cfg.TopK, cfg.Hidden
	rng := rand.New(rand.NewPCG(uint64(T), uint64(rank)))
	idx := make([]int32, T*K)
	for t := range T {
		for k, x := range rng.Perm(cfg.NumExperts)[:K] {
			idx[t*K+k] = int32(x)
		}
	}
	xs = make([]float32, T*H)
	for i := range xs {
		xs[i] = float32(rng.NormFloat64())
	}
	if ti, err = e.NewTensor(device.Int32, T, K); err != nil {
		return nil, nil, nil, err
	}
	if xt, err = e.NewTensor(device.BF16, T, H); err != nil {
		ti.Close()
		return nil, nil, nil, err
	}
	err = errors.Join(device.Upload(ctx, ti, device.EncodeInt32(idx)), device.Upload(ctx, xt, device.EncodeFloat32(device.BF16, xs)))
	if err != nil {
		ti.Close()
		xt.Close()
		return nil, nil, nil, err
	}
	return ti, xt, xs, nil
}

// benchGPU is the CUDA backend of GPU 0 for a benchmark (closed at its
// end), which is skipped without -gpu.
func benchGPU(b *testing.B) *device.CUDA {
	if !*gpuFlag {
		b.Skip("run the test binary with -gpu on a GPU host")
	}
	be, err := device.NewCUDA(0)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { be.Close() })
	return be
}

// benchLayout uploads rank 0's benchmark inputs of T tokens (benchInputs)
// and lays them out; done closes the three.
func benchLayout(b *testing.B, e *executor.Engine, cfg executor.Config, T int) (ti, xt *device.Tensor, h *executor.Handle, done func()) {
	ctx := context.Background()
	ti, xt, _, err := benchInputs(ctx, e, cfg, T, 0)
	if err != nil {
		b.Fatal(err)
	}
	if h, err = e.Layout(ctx, executor.LayoutInput{TopkIdx: ti}); err != nil {
		closeTensors(ti, xt)
		b.Fatal(err)
	}
	return ti, xt, h, func() { h.Close(); closeTensors(ti, xt) }
}

// dispatchCall and combineCall are one Dispatch of x and one Combine of
// z, their outputs closed: the timed calls of the benchmarks.
func dispatchCall(ctx context.Context, e *executor.Engine, h *executor.Handle, x *device.Tensor) func() error {
	return func() error {
		o, err := e.Dispatch(ctx, h, executor.DispatchInput{X: x})
		o.Close()
		return err
	}
}

func combineCall(ctx context.Context, e *executor.Engine, h *executor.Handle, z *device.Tensor) func() error {
	return func() error {
		o, err := e.Combine(ctx, h, executor.CombineInput{Z: z})
		o.Close()
		return err
	}
}

// capture records run's work on s into a graph.
func capture(s *device.CUDAStream, run func() error) (*device.Graph, error) {
	if err := s.BeginCapture(); err != nil {
		return nil, err
	}
	rerr := run()
	g, err := s.EndCapture()
	if err := errors.Join(rerr, err); err != nil {
		if g != nil {
			g.Close()
		}
		return nil, err
	}
	return g, nil
}

// benchRanksInProcess is how many ranks of the benchmark run in this
// process: the driver tallies (cuda.ReadCounts) are one rank's only when
// it is 1.
var benchRanksInProcess = 1

// benchGate is the start gate the goroutine ranks of TestCUDABenchmark
// share (nil: none; a lone rank makes its own).
var benchGate *startGate

// timing is what timeCall measured of one call.
type timing struct {
	med, p90 float64     // µs, the cross-rank maximum per iteration
	host     float64     // µs in run, median of the cross-rank maximum
	counts   cuda.Counts // driver tallies in run, the last iteration's
	times    []float64   // µs, the cross-rank maximum of each iteration after warm-up
}

// timeCall times run with CUDA events on s, after a barrier each
// iteration (and, with gate, behind the gate: every rank's call starts at
// one moment of the GPU), and returns the median and p90 in microseconds
// of the cross-rank maximum per iteration, warm-up excluded, the median of
// the cross-rank maximum of the host's time in run (enqueueing the call:
// on an idle GPU the events also time that, where it exceeds the GPU's),
// and the process's driver tallies during run's last iteration.
func timeCall(ctx context.Context, g comm.Group, e *executor.Engine, s *device.CUDAStream, gate *startGate, run func() error, warm, iters int) (timing, error) {
	var times, hosts []float64
	var tc timing
	for i := range warm + iters {
		if gate != nil {
			if err := gate.open(g.Rank()); err != nil {
				return tc, err
			}
		}
		if err := g.Barrier(ctx); err != nil {
			return tc, err
		}
		if gate != nil {
			if err := gate.wait(s); err != nil {
				return tc, err
			}
		}
		t0, err := s.RecordTimed()
		if err != nil {
			return tc, err
		}
		before := cuda.ReadCounts()
		start := time.Now()
		if err := run(); err != nil {
			return tc, err
		}
		h := time.Since(start)
		tc.counts = cuda.ReadCounts().Sub(before)
		t1, err := s.RecordTimed()
		if err != nil {
			return tc, err
		}
		if gate != nil {
			// Every rank has queued its wait before rank 0 queues the
			// next gate.
			if err := g.Barrier(ctx); err != nil {
				return tc, err
			}
		}
		if err := e.Synchronize(ctx); err != nil {
			return tc, err
		}
		d, err := device.Elapsed(t0, t1)
		if err != nil {
			return tc, err
		}
		if i >= warm {
			times = append(times, float64(d)/float64(time.Microsecond))
			hosts = append(hosts, float64(h)/float64(time.Microsecond))
		}
	}
	maxed, err := crossRankMax(ctx, g, times)
	if err != nil {
		return tc, err
	}
	hmax, err := crossRankMax(ctx, g, hosts)
	if err != nil {
		return tc, err
	}
	tc.times = slices.Clone(maxed)
	slices.Sort(maxed)
	slices.Sort(hmax)
	tc.med, tc.p90, tc.host = maxed[len(maxed)/2], maxed[len(maxed)*9/10], hmax[len(hmax)/2]
	return tc, nil
}

// crossRankMax all-gathers every rank's times and returns the maximum of
// each iteration.
func crossRankMax(ctx context.Context, g comm.Group, times []float64) ([]float64, error) {
	buf := make([]byte, 8*len(times))
	for i, v := range times {
		binary.LittleEndian.PutUint64(buf[8*i:], math.Float64bits(v))
	}
	all, err := g.AllGather(ctx, buf)
	if err != nil {
		return nil, err
	}
	out := make([]float64, len(times))
	for _, raw := range all {
		for i := range out {
			out[i] = max(out[i], math.Float64frombits(binary.LittleEndian.Uint64(raw[8*i:])))
		}
	}
	return out, nil
}

// TestCUDABenchmark runs benchRank with 4 ranks on the one GPU and
// prints, for 128 and 4096 tokens per rank (hidden 7168, 256 experts,
// top-8, bf16, and fp8 for dispatch and dispatch-permute, blocking mode),
// each call's median and p90 time (the
// cross-rank maximum per iteration) and its NVLink GB/s (received rows x
// hidden x 2 bytes per rank, DESIGN.md section 6), beside a device-to-device
// copy of the same bytes timed the same way in the same run, and where a
// process holds one rank (processes, -gpu.spread), the kernels launched
// and driver calls made by one call (internal/cuda's tallies). Ranks are
// processes (the GPU time-slices between their contexts, which dominates
// every time) and goroutines of one process (one context: the ranks'
// streams run concurrently, as separate GPUs would). With -gpu.spread G
// (a multi-GPU host) it runs G processes instead, one on each GPU, the
// pushes crossing NVLink.
func TestCUDABenchmark(t *testing.T) {
	if !*gpuBench {
		t.Skip("run the test binary with -gpu.bench on a GPU host")
	}
	const n = 4
	// processes runs benchRank on p spawned processes.
	processes := func(t *testing.T, p int, where string, env ...string) {
		got, lerr, log := runWorldN(t, "spawn", "bench", p, 8*time.Minute, append([]string{"GOEP_MP_BACKEND=cuda"}, env...)...)
		if lerr != nil {
			t.Fatalf("launcher: %v\n%s", lerr, log)
		}
		if got[0].Err != "" {
			t.Fatalf("rank 0: %s\n%s", got[0].Err, log)
		}
		logBench(t, p, where, got[0].Digests)
	}
	if g := *gpuSpread; g > 0 {
		// One process per GPU, the shape of a cluster's node.
		t.Run(fmt.Sprintf("processes=%d/gpus=%d", g, g), func(t *testing.T) {
			processes(t, g, "GPUs, one process each", "GOEP_MP_GPU=local", fmt.Sprintf("GOEP_MP_GPUS=%d", g))
		})
		return
	}
	t.Run("processes", func(t *testing.T) { processes(t, n, "ranks on one GPU") })
	t.Run("goroutines", func(t *testing.T) {
		b, err := device.NewCUDA(0)
		if err != nil {
			t.Fatal(err)
		}
		defer b.Close()
		benchRanksInProcess = n
		defer func() { benchRanksInProcess = 1 }()
		if benchGate, err = newStartGate(b); err != nil {
			t.Fatal(err)
		}
		defer func() { benchGate.Close(); benchGate = nil }()
		gs := comm.NewLocal(n)
		res := make([][]map[string]string, n)
		// A rank that fails leaves the others in a collective: bound them.
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
		defer cancel()
		errs := ranktest.Run(n, func(r int) (err error) {
			res[r], err = benchRank(ctx, gs[r], b)
			return err
		})
		if err := ranktest.Err(errs); err != nil {
			t.Fatal(err)
		}
		logBench(t, n, "ranks on one GPU", res[0])
	})
}

func logBench(t *testing.T, n int, where string, rows []map[string]string) {
	t.Logf("%d %s; times are the cross-rank maximum per iteration, median (p90) of 30 after 5", n, where)
	for _, r := range rows {
		bytes, _ := strconv.Atoi(r["nvl_bytes"])
		bytes8, _ := strconv.Atoi(r["nvl_bytes_fp8"])
		t.Logf("tokens %s per rank, %s rows received by rank 0, %.1f MB (fp8 with scales: %.1f MB)", r["tokens"], r["recv_rows"], float64(bytes)/1e6, float64(bytes8)/1e6)
		for _, how := range []string{"eager", "graph", "queued"} {
			if _, ok := r["copy_"+how+"_us"]; !ok {
				continue
			}
			for _, set := range []struct {
				copy  string
				bytes int
				calls []string
			}{
				{"copy", bytes, []string{"copy", "dispatch", "combine", "dispatch-permute", "unpermute-combine"}},
				{"copy-fp8", bytes8, []string{"copy-fp8", "dispatch-fp8", "dispatch-permute-fp8"}},
			} {
				copyUs, _ := strconv.ParseFloat(r[set.copy+"_"+how+"_us"], 64)
				for _, c := range set.calls {
					us, _ := strconv.ParseFloat(r[c+"_"+how+"_us"], 64)
					driver := ""
					if l, ok := r[c+"_"+how+"_launches"]; ok {
						driver = fmt.Sprintf("  launches %s, driver calls %s", l, r[c+"_"+how+"_calls"])
					}
					t.Logf("  %-5s %-20s %9.1f us (p90 %8s, host %7s)  %7.1f GB/s per rank  %.2f of copy%s", how, c, us, r[c+"_"+how+"_p90_us"], r[c+"_"+how+"_host_us"], float64(set.bytes)/us/1e3, copyUs/us, driver)
				}
			}
		}
	}
}

// BenchmarkCUDAEager times eager calls on one rank, DeepSeek-V3 shape:
// each iteration one Dispatch (or Combine) with its outputs closed, or a
// device-to-device copy of the received rows' bytes (the baseline), the
// stream synchronized every 64 calls. At 128 tokens the GPU is faster
// than the enqueueing, so ns/op is the host's time a call (plus a 64th of
// a Synchronize); at 4096 it is the GPU's. driver-calls/op and
// launches/op are internal/cuda's tallies. Run the test binary with -gpu
// -test.bench CUDAEager (with -test.cpuprofile to see where the host's
// time goes; -test.benchtime Nx makes the launches countable for ncu:
// 8 warm-up calls, then N).
func BenchmarkCUDAEager(b *testing.B) {
	be := benchGPU(b)
	ctx := context.Background()
	for _, T := range benchShapes {
		cfg := executor.Config{NumExperts: 256, TopK: 8, Hidden: 7168, MaxTokensPerRank: T}
		e, err := executor.New(ctx, comm.NewLocal(1)[0], be, cfg)
		if err != nil {
			b.Fatal(err)
		}
		benchEager(b, e, cfg, T)
		if err := e.Close(); err != nil {
			b.Fatal(err)
		}
	}
}

// benchEager is BenchmarkCUDAEager's calls on e at T tokens.
func benchEager(b *testing.B, e *executor.Engine, cfg executor.Config, T int) {
	ctx := context.Background()
	_, xt, h, done := benchLayout(b, e, cfg, T)
	defer done()
	if h.RecvRows() == 0 {
		b.Fatal("no rows received")
	}
	z, err := e.NewTensor(device.BF16, h.RecvRows(), cfg.Hidden)
	if err != nil {
		b.Fatal(err)
	}
	defer z.Close()
	cp, err := e.NewTensor(device.BF16, h.RecvRows(), cfg.Hidden)
	if err != nil {
		b.Fatal(err)
	}
	defer cp.Close()
	s := e.Stream().(*device.CUDAStream)
	bytes := h.RecvRows() * cfg.Hidden * 2
	for _, c := range []struct {
		name string
		run  func() error
	}{
		// The baseline: a device-to-device copy of the received rows'
		// bytes (DESIGN.md section 6).
		{"copy", func() error { return s.Copy(cp.Buffer(), 0, z.Buffer(), 0, bytes) }},
		{"dispatch", dispatchCall(ctx, e, h, xt)},
		{"combine", combineCall(ctx, e, h, z)},
	} {
		b.Run(fmt.Sprintf("call=%s/tokens=%d/hidden=%d/topk=%d", c.name, T, cfg.Hidden, cfg.TopK), func(b *testing.B) {
			backToBack(b, e, c.run)
			b.SetBytes(int64(bytes))
		})
	}
}

// backToBack is the loop of BenchmarkCUDAEager and BenchmarkCUDADecodeStep:
// 8 runs of warm-up (modules loaded, pools grown), then run back to back,
// e's stream synchronized every 64 runs; it reports internal/cuda's
// tallies a run.
func backToBack(b *testing.B, e *executor.Engine, run func() error) {
	ctx := context.Background()
	for range 8 {
		if err := run(); err != nil {
			b.Fatal(err)
		}
	}
	if err := e.Synchronize(ctx); err != nil {
		b.Fatal(err)
	}
	before := cuda.ReadCounts()
	n := 0
	for b.Loop() {
		if err := run(); err != nil {
			b.Fatal(err)
		}
		if n++; n%64 == 0 {
			if err := e.Synchronize(ctx); err != nil {
				b.Fatal(err)
			}
		}
	}
	if err := e.Synchronize(ctx); err != nil {
		b.Fatal(err)
	}
	d := cuda.ReadCounts().Sub(before)
	b.ReportMetric(float64(d.Launches)/float64(n), "launches/op")
	b.ReportMetric(float64(d.Calls)/float64(n), "driver-calls/op")
}

// BenchmarkCUDADecodeStep times a decode step on one rank, DeepSeek-V3's
// shape at 128 tokens in capacity mode: the Relayout of the step's
// routing, DispatchPermuteInto and UnpermuteCombineInto (the experts'
// output stood in for by the permuted rows themselves), run eagerly
// (step=eager: the Relayout waits for the GPU layout's summary) and as
// one CUDA graph that holds the Relayout too (step=graph), the stream
// synchronized every 64 steps. ns/op is a step's time; driver-calls/op
// and launches/op are internal/cuda's tallies. Run the test binary with
// -gpu -test.bench CUDADecodeStep.
func BenchmarkCUDADecodeStep(b *testing.B) {
	be := benchGPU(b)
	ctx := context.Background()
	const T = 128
	cfg := executor.Config{NumExperts: 256, TopK: 8, Hidden: 7168, MaxTokensPerRank: T, PadMultiple: 1,
		Mode: executor.Capacity, Overflow: executor.OverflowDrop, MaxRecvTokens: T, MaxPermutedTokens: T * 8}
	e, err := executor.New(ctx, comm.NewLocal(1)[0], be, cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer e.Close()
	ti, xt, h, done := benchLayout(b, e, cfg, T)
	defer done()
	px, err1 := e.NewTensor(device.BF16, h.PermutedRows(), cfg.Hidden)
	ri, err2 := e.NewTensor(device.Int32, h.RecvRows(), cfg.TopK)
	out, err3 := e.NewTensor(device.BF16, T, cfg.Hidden)
	if err := errors.Join(err1, err2, err3); err != nil {
		b.Fatal(err)
	}
	defer closeTensors(px, ri, out)
	step := func() error {
		if err := e.Relayout(ctx, h, executor.LayoutInput{TopkIdx: ti}); err != nil {
			return err
		}
		if err := e.DispatchPermuteInto(ctx, h, executor.DispatchInput{X: xt}, executor.DispatchPermuteOutput{X: px, RecvIdx: ri}); err != nil {
			return err
		}
		return e.UnpermuteCombineInto(ctx, h, executor.UnpermuteInput{Y: px}, out)
	}
	s := e.Stream().(*device.CUDAStream)
	if err := s.BeginCapture(); err != nil {
		b.Fatal(err)
	}
	cerr := step()
	graph, err := s.EndCapture()
	if err := errors.Join(cerr, err); err != nil {
		b.Fatal(err)
	}
	defer graph.Close()
	for _, c := range []struct {
		name string
		run  func() error
	}{
		{"eager", step},
		{"graph", func() error { return graph.Launch(s) }},
	} {
		b.Run(fmt.Sprintf("step=%s/tokens=%d/hidden=%d/topk=%d", c.name, T, cfg.Hidden, cfg.TopK), func(b *testing.B) {
			backToBack(b, e, c.run)
		})
	}
}

func closeTensors(ts ...*device.Tensor) {
	for _, t := range ts {
		if t != nil {
			t.Close()
		}
	}
}
