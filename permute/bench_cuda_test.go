//go:build cuda && cgo

package permute

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/goep/goep/device"
)

// BenchmarkCUDA measures permute and unpermute against a device-to-device
// copy of the permuted tensor (tokens x topk rows) in the same run: each
// op is timed with CUDA events on a busy stream (so that the host's time
// to enqueue it is not counted), the ops in turn (interleaved: a drift of
// the GPU's speed weighs on all alike) after a warm-up of at least a
// second; the median of 30 gives the memory traffic in GB/s (bytes read + bytes
// written: the copy 2 x tokens x topk rows, permute and unpermute
// (tokens + tokens x topk) rows, weights and positions not counted), and
// the ratios to the copy's are reported (the goal: >= 0.9). A permute
// writes tokens x topk rows and reads tokens rows, so its bound is the
// write bandwidth, not the copy's mixed read+write: a memset of the
// permuted tensor, timed the same way, is that bound (permute/write).
// Routing: every token picks topk distinct experts of 64 at random, no
// padding. Top-8 is the goal's shape (the most writes per read); top-4,
// 2 and 1 are the shapes a rank's permute after a dispatch sees (a token's
// top-8 of 256 experts over 4 ranks puts about 2.2 of its slots on each
// rank it reaches). Then other launch configurations of permute
// and unpermute are timed the same way, each interleaved with the copy,
// and logged, one line each (-test.v shows them), as is the permute
// without weights (pw nil), interleaved with the copy and the permute.
//
//	.gpu/permute.test -test.run '^$' -test.bench CUDA -test.benchtime 50x -test.v
func BenchmarkCUDA(b *testing.B) {
	const tokens, hidden, experts = 4096, 7168, 64
	for _, dt := range []device.DType{device.BF16, device.FP32} {
		for _, topk := range []int{8, 4, 2, 1} {
			b.Run(fmt.Sprintf("dtype=%v/tokens=%d/hidden=%d/topk=%d", dt, tokens, hidden, topk), func(b *testing.B) {
				benchCUDA(b, dt, tokens, hidden, topk, experts)
			})
		}
	}
}

// permuteSweep and unpermuteSweep are the launch configurations
// BenchmarkCUDA times besides the defaults (logged, one line each; the
// unpermute's units apply at every topk, unitsSmallTopK being 0).
var (
	permuteSweep = []launchCfg{
		{block: 128, units: 1, hints: 0, staged: stagedOff}, {block: 128, units: 1, hints: 1, staged: stagedOff},
		{block: 128, units: 1, hints: 3, staged: stagedOff}, {block: 128, units: 2, hints: 1, staged: stagedOff},
		{block: 256, units: 2, hints: 0, staged: stagedOff}, {block: 256, units: 2, hints: 1, staged: stagedOff},
		{block: 256, units: 2, hints: 3, staged: stagedOff}, {block: 128, units: 4, hints: 1, staged: stagedOff},
		{block: 256, units: 4, hints: 0, staged: stagedOff}, {block: 256, units: 4, hints: 1, staged: stagedOff},
		{block: 256, units: 4, hints: 2, staged: stagedOff}, {block: 256, units: 4, hints: 3, staged: stagedOff},
		{block: 512, units: 4, hints: 1, staged: stagedOff}, {block: 1024, units: 4, hints: 1, staged: stagedOff},
		// goep_permute_staged whatever the rule says.
		{staged: stagedOn},
	}
	unpermuteSweep = []launchCfg{
		{block: 128, units: 1}, {block: 256, units: 1}, {block: 128, units: 2},
		{block: 256, units: 2}, {block: 128, units: 4}, {block: 256, units: 4}, {block: 256, units: 8},
	}
)

// BenchmarkCUDATokens is BenchmarkCUDA for bf16 at top-8 with other
// token counts: where Permute takes goep_permute_staged (its rule:
// stagedMinRowsPerSM rows an SM) and where not, the sweep's "staged"
// line and "block 256 units 4 hints 1" line (the other kernel's default)
// side by side.
//
//	.gpu/permute.test -test.run '^$' -test.bench CUDATokens -test.benchtime 20x -test.v
func BenchmarkCUDATokens(b *testing.B) {
	const hidden, experts, topk = 7168, 64, 8
	for _, tokens := range []int{512, 1024, 2048, 8192, 16384} {
		b.Run(fmt.Sprintf("dtype=%v/tokens=%d/hidden=%d/topk=%d", device.BF16, tokens, hidden, topk), func(b *testing.B) {
			benchCUDA(b, device.BF16, tokens, hidden, topk, experts)
		})
	}
}

func benchCUDA(b *testing.B, dt device.DType, tokens, hidden, topk, experts int) {
	_, s, k := gpu(b)
	c := fullCase(rand.New(rand.NewPCG(7, 8)), dt, hidden, tokens, topk, experts)
	pos, p := c.m.Pos, c.m.PermCap
	rb := hidden * dt.Size()
	alloc := func(n int) *device.Tensor {
		t, err := device.NewTensor(s, device.BF16, n/2)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { t.Close() })
		return t
	}
	tpos := alloc(4 * len(pos))
	if err := device.Upload(b.Context(), tpos, device.EncodeInt32(pos)); err != nil {
		b.Fatal(err)
	}
	x, w, px, pw := alloc(tokens*rb), alloc(4*tokens*topk), alloc(p*rb), alloc(4*p)
	y, out, dst := alloc(p*rb), alloc(tokens*rb), alloc(p*rb)
	for _, t := range []*device.Tensor{x, w, y} {
		if err := s.Memset(t.Buffer(), 0, t.Buffer().Size(), 0x3c); err != nil {
			b.Fatal(err)
		}
	}
	m := DeviceMap{Rows: tokens, TopK: topk, Pos: tpos.Buffer(), RowCap: tokens, PermCap: p}
	ops := []struct {
		name string
		run  func() error
	}{
		{"copy", func() error { return s.Copy(dst.Buffer(), 0, y.Buffer(), 0, p*rb) }},
		{"permute", func() error {
			return k.Permute(s, dt, hidden, px.Buffer(), pw.Buffer(), x.Buffer(), w.Buffer(), m)
		}},
		{"unpermute", func() error { return k.Unpermute(s, dt, hidden, out.Buffer(), y.Buffer(), w.Buffer(), m) }},
		// The write-only bound of a permute: a memset of the permuted
		// tensor (cuMemsetD8Async), which writes what a permute writes and
		// reads nothing.
		{"write", func() error { return s.Memset(dst.Buffer(), 0, p*rb, 0) }},
	}
	run := func(f func() error) {
		if err := f(); err != nil {
			b.Fatal(err)
		}
	}
	sync := func() {
		ctx, cancel := context.WithTimeout(b.Context(), time.Minute)
		defer cancel()
		if err := s.Synchronize(ctx); err != nil {
			b.Fatal(err)
		}
	}
	// medians enqueues iters rounds of the runs, one of each in turn
	// (interleaved: a drift of the GPU's speed weighs on every run alike),
	// back to back with a timed event between every two, behind one
	// leading run, then synchronizes once, and returns each run's median
	// GPU time. Each event pair must time its run alone: on an idle stream
	// the start event fires when the host enqueues it, and the pair would
	// also time the host's enqueueing (about 20 µs an op when goep handed
	// every driver call to a worker thread, which made every op here look
	// that much slower, and
	// ops shorter than that twice as slow). So the stream first waits
	// (Delay) for longer than the host takes to enqueue everything, and
	// the GPU finds every run queued; a wait that proves too short is
	// doubled and the rounds run again.
	const iters = 30
	lead := time.Millisecond
	medians := func(runs ...func() error) []time.Duration {
		var evs []*device.Event
		for {
			if err := s.Delay(lead); err != nil {
				b.Fatal(err)
			}
			t0 := time.Now()
			run(runs[0])
			evs = make([]*device.Event, 0, 1+iters*len(runs))
			record := func() {
				ev, err := s.RecordTimed()
				if err != nil {
					b.Fatal(err)
				}
				evs = append(evs, ev)
			}
			record()
			for range iters {
				for _, f := range runs {
					run(f)
					record()
				}
			}
			queued := time.Since(t0)
			sync()
			if queued < lead {
				break
			}
			if lead *= 2; lead > device.MaxDelay {
				b.Fatalf("enqueueing %d runs took %v", iters*len(runs), queued)
			}
		}
		times := make([][]time.Duration, len(runs))
		for i := 1; i < len(evs); i++ {
			d, err := device.Elapsed(evs[i-1], evs[i])
			if err != nil {
				b.Fatal(err)
			}
			times[(i-1)%len(runs)] = append(times[(i-1)%len(runs)], d)
		}
		m := make([]time.Duration, len(runs))
		for i, t := range times {
			slices.Sort(t)
			m[i] = t[len(t)/2]
		}
		return m
	}
	// Warm-up: every op in turn for at least warmupTime (and 5 rounds),
	// so that clocks and caches are as in the timed rounds.
	const warmupTime = time.Second
	for round, t0 := 0, time.Now(); round < 5 || time.Since(t0) < warmupTime; round++ {
		for _, op := range ops {
			run(op.run)
		}
		sync()
	}
	runs := make([]func() error, len(ops))
	for i, op := range ops {
		runs[i] = op.run
	}
	median := map[string]time.Duration{}
	for i, d := range medians(runs...) {
		median[ops[i].name] = d
	}
	traffic := map[string]float64{"copy": float64(2 * p * rb), "permute": float64((tokens + p) * rb), "unpermute": float64((tokens + p) * rb),
		"write": float64(p * rb)}
	gb := func(op string) float64 { return traffic[op] / median[op].Seconds() / 1e9 }
	// Other launch configurations (no result changes with them; the tests
	// run the defaults): each timed interleaved with the copy, as a
	// fraction of that copy's GB/s, to choose defaultPermute and
	// defaultUnpermute.
	copyRun := ops[0].run
	// The weights' share of the permute: the same permute without pw.
	{
		t := medians(copyRun, ops[1].run, func() error {
			return k.Permute(s, dt, hidden, px.Buffer(), nil, x.Buffer(), w.Buffer(), m)
		})
		ratio := func(d time.Duration) float64 {
			return traffic["permute"] / traffic["copy"] * t[0].Seconds() / d.Seconds()
		}
		b.Logf("%v top-%d: permute with weights %v (%.3f of copy), without %v (%.3f of copy)",
			dt, topk, t[1], ratio(t[1]), t[2], ratio(t[2]))
	}
	for _, cfg := range permuteSweep {
		k.permuteCfg = cfg
		m := medians(copyRun, ops[1].run)
		g := traffic["permute"] / m[1].Seconds() / 1e9
		name := fmt.Sprintf("block %d units %d hints %d", cfg.block, cfg.units, cfg.hints)
		if cfg.staged == stagedOn {
			name = "staged"
		}
		b.Logf("%v top-%d: permute %s: %v, %.0f GB/s, %.3f of copy",
			dt, topk, name, m[1], g, g/(traffic["copy"]/m[0].Seconds()/1e9))
	}
	k.permuteCfg = defaultPermute
	for _, cfg := range unpermuteSweep {
		k.unpermuteCfg = cfg
		m := medians(copyRun, ops[2].run)
		g := traffic["unpermute"] / m[1].Seconds() / 1e9
		b.Logf("%v top-%d: unpermute block %d units %d: %v, %.0f GB/s, %.3f of copy",
			dt, topk, cfg.block, cfg.units, m[1], g, g/(traffic["copy"]/m[0].Seconds()/1e9))
	}
	k.unpermuteCfg = defaultUnpermute
	b.SetBytes(int64(2 * (tokens + p) * rb)) // one permute and one unpermute per iteration
	for b.Loop() {
		if err := ops[1].run(); err != nil {
			b.Fatal(err)
		}
		if err := ops[2].run(); err != nil {
			b.Fatal(err)
		}
	}
	if err := s.Synchronize(b.Context()); err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(gb("copy"), "copy_GB/s")
	b.ReportMetric(gb("permute"), "permute_GB/s")
	b.ReportMetric(gb("unpermute"), "unpermute_GB/s")
	b.ReportMetric(gb("permute")/gb("copy"), "permute/copy")
	b.ReportMetric(gb("unpermute")/gb("copy"), "unpermute/copy")
	// permute/write: the write-only memset's time over the permute's, the
	// fraction of the write bound the permute reaches (it writes the same
	// bytes and reads tokens rows more).
	b.ReportMetric(median["write"].Seconds()/median["permute"].Seconds(), "permute/write")
	b.Logf("%v top-%d: medians over %d runs: copy %v (%.0f GB/s), permute %v (%.0f GB/s, %.2f of copy), unpermute %v (%.0f GB/s, %.2f of copy); permuted tensor %d MB",
		dt, topk, iters, median["copy"], gb("copy"), median["permute"], gb("permute"), gb("permute")/gb("copy"),
		median["unpermute"], gb("unpermute"), gb("unpermute")/gb("copy"), p*rb>>20)
	b.Logf("%v top-%d: write-only bound: a memset of the permuted tensor takes %v (%.0f GB/s written); the permute reaches %.2f of it (memset time / permute time)",
		dt, topk, median["write"], gb("write"), median["write"].Seconds()/median["permute"].Seconds())
}
