//go:build cuda && cgo

package executor_test

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/goep/goep/comm"
	"github.com/goep/goep/device"
	"github.com/goep/goep/executor"
	"github.com/goep/goep/executor/internal/gpu"
	"github.com/goep/goep/internal/ranktest"
)

// pacedRates are the link rates per rank (GB/s) of TestCUDALinkPaced: low
// enough that the HBM of one GPU, which every rank's stores, copies and
// sums share, never limits them (at 4 ranks, a dispatch's HBM traffic is
// about 4 bytes a remote byte and 2 an own). 0 is the same run unpaced
// (GOEP_GPU_PROBE alone), for reference: HBM-bound.
var pacedRates = []float64{0, 50, 100}

// pacedRanks is how many goroutine ranks share the GPU in
// TestCUDALinkPaced.
const pacedRanks = 4

// pacedCall is what one rank measured of one call under pacing: the
// call's time per iteration (the cross-rank maximum, µs) and the probes
// of the same iterations.
type pacedCall struct {
	times  []float64
	probes []gpu.Probe
}

// pacedRank measures Dispatch and Combine of T tokens (DeepSeek-V3's
// shape) on one rank as CUDA graphs, returning per call the iterations'
// times and this rank's probes of them.
func pacedRank(ctx context.Context, g comm.Group, b device.Backend, gate *startGate, T int) (map[string]pacedCall, error) {
	cfg := executor.Config{NumExperts: 256, TopK: 8, Hidden: 7168, MaxTokensPerRank: T}
	e, err := executor.New(ctx, g, b, cfg)
	if err != nil {
		return nil, err
	}
	defer e.Close()
	s := e.Stream().(*device.CUDAStream)
	ti, xt, _, err := benchInputs(ctx, e, cfg, T, g.Rank())
	if err != nil {
		return nil, err
	}
	defer ti.Close()
	defer xt.Close()
	h, err := e.Layout(ctx, executor.LayoutInput{TopkIdx: ti})
	if err != nil {
		return nil, err
	}
	defer h.Close()
	z, err := e.NewTensor(device.BF16, h.RecvRows(), cfg.Hidden)
	if err != nil {
		return nil, err
	}
	defer z.Close()
	const warm, iters = 5, 20
	calls := []struct {
		name string
		run  func() error
	}{
		{"dispatch", dispatchCall(ctx, e, h, xt)},
		{"combine", combineCall(ctx, e, h, z)},
	}
	res := map[string]pacedCall{}
	for _, c := range calls {
		graph, err := capture(s, c.run)
		if err != nil {
			return nil, fmt.Errorf("%s: capture: %w", c.name, err)
		}
		tc, err := timeCall(ctx, g, e, s, gate, func() error { return graph.Launch(s) }, warm, iters)
		graph.Close()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", c.name, err)
		}
		probes, err := e.Probes(ctx)
		if err != nil {
			return nil, fmt.Errorf("%s: probes: %w", c.name, err)
		}
		if len(probes) < iters {
			return nil, fmt.Errorf("%s: %d probe records, want at least %d (GOEP_GPU_LINK_PACE unset, or the call took several launches?)", c.name, len(probes), iters)
		}
		res[c.name] = pacedCall{times: tc.times, probes: probes[len(probes)-iters:]}
	}
	return res, nil
}

// startGate starts the goroutine ranks' timed calls at one moment of the
// GPU: launched from several host threads, their kernels would start tens
// of microseconds apart, and a call that waits for its peers would time
// their lateness. Each iteration, rank 0 queues a delay kernel and an
// event on a stream of its own (open); every rank's stream waits for that
// event (wait) before its timing event and its call, all of which the
// host has queued well before the delay ends (timeCall).
type startGate struct {
	s     *device.CUDAStream
	event *device.Event // set by rank 0 before the iteration's barrier
}

// newStartGate is a start gate on a stream of its own on b (Close stops
// the stream).
func newStartGate(b *device.CUDA) (*startGate, error) {
	s, err := b.NewCUDAStream()
	if err != nil {
		return nil, err
	}
	return &startGate{s: s}, nil
}

// Close stops the gate's stream.
func (gt *startGate) Close() error { return gt.s.Close() }

// gateDelay is how long the gate holds the ranks: far longer than the
// host takes to queue every rank's call.
const gateDelay = 2 * time.Millisecond

// open queues the iteration's gate: on rank 0 only.
func (gt *startGate) open(rank int) error {
	if rank != 0 {
		return nil
	}
	if err := gt.s.Delay(gateDelay); err != nil {
		return err
	}
	ev, err := gt.s.Record()
	gt.event = ev
	return err
}

// wait makes s's next work wait for the gate (after the barrier that
// follows open).
func (gt *startGate) wait(s *device.CUDAStream) error { return s.Wait(gt.event) }

// pacedStats are one iteration's link-paced figures across the ranks.
type pacedStats struct {
	time, ideal, head, tail float64 // µs
	bytes                   float64 // the busiest rank's bytes to peers
}

// pacedIteration is iteration i's figures: the call's time, the time the
// busiest rank's remote bytes take at rate GB/s (0 when unpaced), the
// head latency (from
// the moment every rank's kernel has started to the first remote row or
// sum in its final place on the receiver that got one last) and the tail
// latency (from the last store into any peer's window to the last remote
// row or sum in its final place on any rank; 0 when the final place came
// first).
func pacedIteration(ranks []map[string]pacedCall, call string, i int, rate float64) pacedStats {
	st := pacedStats{time: ranks[0][call].times[i]}
	var start, sent, last uint64
	for _, r := range ranks {
		p := r[call].probes[i]
		start = max(start, p.Start)
		sent = max(sent, p.Sent)
		last = max(last, p.Last)
		if rate > 0 {
			st.ideal = max(st.ideal, float64(p.Bytes)/rate/1e3)
		}
		st.bytes = max(st.bytes, float64(p.Bytes))
	}
	for _, r := range ranks {
		if p := r[call].probes[i]; p.First > start {
			st.head = max(st.head, float64(p.First-start)/1e3)
		}
	}
	if last > sent {
		st.tail = float64(last-sent) / 1e3
	}
	return st
}

// TestCUDALinkPaced measures, on one GPU, how well the one-launch Dispatch
// and Combine keep a link busy: 4 goroutine ranks in one context (each
// rank's grid at most a quarter of the SMs, every call started at one
// moment by a startGate), every rank's stores into its
// peers' windows paced to a link rate (GOEP_GPU_LINK_PACE, pacedRates)
// low enough that HBM does not limit them, so that the call's time over
// the time its remote bytes take at that rate predicts the share of a
// multi-GPU link the kernels use. It logs, for 128 and 4096 tokens per
// rank (DeepSeek-V3's shape, as CUDA graphs), medians over 20 iterations
// of the time, that ideal time and their ratio, and the head and tail
// latencies from in-kernel timestamps (pacedIteration).
func TestCUDALinkPaced(t *testing.T) {
	if !*gpuBench {
		t.Skip("run the test binary with -gpu.bench on a GPU host")
	}
	b, err := device.NewCUDA(0)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	gate, err := newStartGate(b)
	if err != nil {
		t.Fatal(err)
	}
	defer gate.Close()
	for _, rate := range pacedRates {
		for _, T := range []int{128, 4096} {
			t.Run(fmt.Sprintf("pace=%gGBps/tokens=%d", rate, T), func(t *testing.T) {
				if rate > 0 {
					t.Setenv("GOEP_GPU_LINK_PACE", strconv.FormatFloat(rate, 'g', -1, 64))
				} else {
					t.Setenv("GOEP_GPU_PROBE", "1")
				}
				groups := comm.NewLocal(pacedRanks)
				res := make([]map[string]pacedCall, pacedRanks)
				ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
				defer cancel()
				errs := ranktest.Run(pacedRanks, func(r int) (err error) {
					res[r], err = pacedRank(ctx, groups[r], b, gate, T)
					return err
				})
				if err := ranktest.Err(errs); err != nil {
					t.Fatal(err)
				}
				for _, call := range []string{"dispatch", "combine"} {
					var its []pacedStats
					for i := range res[0][call].times {
						its = append(its, pacedIteration(res, call, i, rate))
					}
					med := func(f func(pacedStats) float64) float64 {
						v := make([]float64, len(its))
						for i, s := range its {
							v[i] = f(s)
						}
						slices.Sort(v)
						return v[len(v)/2]
					}
					tm, ideal := med(func(s pacedStats) float64 { return s.time }), med(func(s pacedStats) float64 { return s.ideal })
					head, tail := med(func(s pacedStats) float64 { return s.head }), med(func(s pacedStats) float64 { return s.tail })
					if rate == 0 {
						bytes := med(func(s pacedStats) float64 { return s.bytes })
						t.Logf("%d ranks, %d tokens a rank, unpaced: %-8s %8.1f us, %.1f GB/s a rank to peers; head %.1f us, tail %.1f us (medians of %d)",
							pacedRanks, T, call, tm, bytes/tm/1e3, head, tail, len(its))
					} else {
						t.Logf("%d ranks, %d tokens a rank, paced %g GB/s a rank: %-8s %8.1f us, remote bytes at the paced rate %8.1f us: %.2f of the link; head %.1f us, tail %.1f us (medians of %d)",
							pacedRanks, T, rate, call, tm, ideal, ideal/tm, head, tail, len(its))
					}
					logProbes(t, res, call, len(its)/2)
				}
			})
		}
	}
}

// logProbes logs each rank's probe of iteration i, in µs from the last
// rank's start: its start, when its last block had the offsets by source,
// its first and last store into a peer's window, and its first and last
// remote row or sum in its final place.
func logProbes(t *testing.T, ranks []map[string]pacedCall, call string, i int) {
	var start uint64
	for _, r := range ranks {
		start = max(start, r[call].probes[i].Start)
	}
	at := func(v uint64) float64 {
		if v == 0 {
			return math.NaN()
		}
		return (float64(v) - float64(start)) / 1e3
	}
	for q, r := range ranks {
		p := r[call].probes[i]
		t.Logf("    iteration %d, rank %d: start %.1f, offsets %.1f, first store %.1f, last store %.1f, first in place %.1f, last in place %.1f us; %.1f MB to peers",
			i, q, at(p.Start), at(p.Found), at(p.FirstSent), at(p.Sent), at(p.First), at(p.Last), float64(p.Bytes)/1e6)
	}
}
