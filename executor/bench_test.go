package executor

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/goep/goep/comm"
	"github.com/goep/goep/device"
)

// BenchmarkCalls times each collective call on an in-process world (every
// rank in its own goroutine, one iteration = every rank's call plus its
// Synchronize). Bytes are the received rows of rank 0 (DESIGN.md section 6).
// call=copy is eprun bench's copy baseline: every rank copies its received
// rows' bytes from one buffer to another on its stream, split over the
// cores in chunks of 64 KiB at least.
func BenchmarkCalls(b *testing.B) {
	calls := []string{"copy", "dispatch", "combine", "dispatch-permute", "unpermute-combine"}
	for _, T := range []int{512, 4096} {
		benchCalls(b, 8, T, 2048, calls)
	}
}

// BenchmarkFloor times the per-call floor: one token of hidden 8 per rank,
// at 2 to 16 in-process ranks, where the exchange's waits and the call's
// fixed costs are the whole time.
func BenchmarkFloor(b *testing.B) {
	for _, R := range []int{2, 4, 8, 16} {
		benchCalls(b, R, 1, 8, []string{"dispatch", "combine"})
	}
}

// benchCalls times calls on R in-process ranks of T tokens of hidden H
// (bf16, 64 experts, top-8): one iteration releases every rank (a channel
// each) and waits for all of them to have made the call and synchronized.
func benchCalls(b *testing.B, R, T, H int, calls []string) {
	for _, call := range calls {
		b.Run(fmt.Sprintf("call=%s/ranks=%d/tokens=%d/hidden=%d/topk=%d", call, R, T, H, benchTopK), func(b *testing.B) {
			gs := comm.NewLocal(R)
			be := device.NewHost()
			defer be.Close()
			start := make([]chan bool, R)
			var done sync.WaitGroup
			var bytes int64
			var setup sync.WaitGroup
			setup.Add(R)
			for r := range R {
				start[r] = make(chan bool)
				go func() {
					br := newBenchRank(gs[r], be, T, H, call)
					defer br.close()
					if r == 0 {
						bytes = br.bytes
					}
					setup.Done()
					for range start[r] {
						br.run()
						done.Done()
					}
				}()
			}
			setup.Wait()
			b.SetBytes(bytes)
			for b.Loop() {
				done.Add(R)
				for r := range R {
					start[r] <- true
				}
				done.Wait()
			}
			for r := range R {
				close(start[r])
			}
		})
	}
}

// BenchmarkFloorLoop times the per-call floor as a decode loop sees it:
// every rank makes b.N calls back to back (each call and its Synchronize),
// with nothing between them, so the call's own rounds are the only
// synchronization among the ranks; ns/op is the wall time of all the
// ranks' calls over b.N. BenchmarkFloor's harness adds a round a call (it
// releases every rank and waits for all), which this leaves out.
func BenchmarkFloorLoop(b *testing.B) {
	for _, R := range []int{2, 4, 8, 16} {
		for _, call := range []string{"dispatch", "combine"} {
			b.Run(fmt.Sprintf("call=%s/ranks=%d/tokens=1/hidden=8/topk=%d", call, R, benchTopK), func(b *testing.B) {
				gs := comm.NewLocal(R)
				be := device.NewHost()
				defer be.Close()
				ranks := make([]*benchRank, R)
				var setup sync.WaitGroup
				setup.Add(R)
				for r := range R {
					go func() {
						defer setup.Done()
						ranks[r] = newBenchRank(gs[r], be, 1, 8, call)
					}()
				}
				setup.Wait()
				// Closing is collective (the engines' closing barrier):
				// every rank at once, off the clock.
				defer func() {
					b.StopTimer()
					var closed sync.WaitGroup
					for _, br := range ranks {
						closed.Go(br.close)
					}
					closed.Wait()
				}()
				// Every rank's calls run on its own goroutine, as in a
				// program of one goroutine a rank; the timer covers them all.
				b.ResetTimer()
				var done sync.WaitGroup
				done.Add(R)
				for _, br := range ranks {
					go func() {
						defer done.Done()
						for range b.N {
							br.run()
						}
					}()
				}
				done.Wait()
			})
		}
	}
}

// The benchmarks' routing: 64 experts, top-8.
const benchExperts, benchTopK = 64, 8

// benchRank is one rank of a benchmark's in-process world, set up for one
// call: run makes the call and synchronizes (it panics on an error, as a
// benchmark cannot go on); bytes are the rank's received rows.
type benchRank struct {
	run   func()
	bytes int64
	close func()
}

// newBenchRank builds rank g.Rank()'s engine, inputs and layout for call
// (T tokens of hidden H, bf16, 64 experts, top-8, every token using all
// 8 slots): "copy" is eprun bench's copy baseline, every rank copying its
// received rows' bytes from one buffer to another on its stream, split
// over the cores in chunks of 64 KiB at least.
func newBenchRank(g comm.Group, be device.Backend, T, H int, call string) *benchRank {
	const E, K = benchExperts, benchTopK
	dt := device.BF16
	r := g.Rank()
	ctx := context.Background()
	cfg := Config{NumExperts: E, TopK: K, Hidden: H, MaxTokensPerRank: T}
	e, err := New(ctx, g, be, cfg)
	if err != nil {
		panic(err)
	}
	idx, x, w := rankInputs(3, r, T, K, E, H, dt)
	for i := range idx { // every token uses all K slots
		if idx[i] < 0 {
			idx[i] = int32((int(idx[i-i%K]) + 1 + i%K) % E)
		}
	}
	ti, _ := upload(ctx, e, device.Int32, device.EncodeInt32(dedupe(idx, K, E)), T, K)
	xt, _ := upload(ctx, e, dt, x, T, H)
	wt, _ := upload(ctx, e, device.FP32, device.EncodeFloat32(device.FP32, w), T, K)
	h, err := e.Layout(ctx, LayoutInput{TopkIdx: ti})
	if err != nil {
		panic(err)
	}
	// Realistic operands: z and y hold dispatched rows (uninitialised
	// memory could hold subnormals, which are slow on CPUs), and the
	// unpermute is weighted.
	d, err := e.DispatchPermute(ctx, h, DispatchInput{X: xt, TopkWeights: wt})
	if err != nil {
		panic(err)
	}
	z, _ := e.Unpermute(ctx, h, UnpermuteInput{Y: d.X})
	y, rw := d.X, d.RecvWeights
	var src, dst *device.Tensor
	if call == "copy" {
		src, _ = e.NewTensor(dt, h.RecvRows(), H)
		dst, _ = e.NewTensor(dt, h.RecvRows(), H)
		clear(src.Bytes())
		clear(dst.Bytes())
	}
	run := func() {
		var outs []*device.Tensor
		switch call {
		case "copy":
			hs := e.Stream().(*device.HostStream)
			rb := H * dt.Size()
			hs.Go("copy", func() error {
				sb, db := src.Bytes(), dst.Bytes()
				device.ParallelFor(len(sb)/rb, max(1, (64<<10)/rb), func(lo, hi int) {
					copy(db[lo*rb:hi*rb], sb[lo*rb:hi*rb])
				})
				return nil
			})
		case "dispatch":
			o, _ := e.Dispatch(ctx, h, DispatchInput{X: xt, TopkWeights: wt})
			outs = append(outs, o.RecvX, o.RecvIdx, o.RecvWeights)
		case "combine":
			o, _ := e.Combine(ctx, h, CombineInput{Z: z})
			outs = append(outs, o)
		case "dispatch-permute":
			o, _ := e.DispatchPermute(ctx, h, DispatchInput{X: xt})
			outs = append(outs, o.X, o.RecvIdx)
		case "unpermute-combine":
			o, _ := e.UnpermuteCombine(ctx, h, UnpermuteInput{Y: y, RecvWeights: rw})
			outs = append(outs, o)
		}
		if err := e.Synchronize(ctx); err != nil {
			panic(err)
		}
		closeAll(outs...)
	}
	return &benchRank{run: run, bytes: int64(h.RecvRows() * H * dt.Size()), close: func() { e.Close() }}
}

// dedupe replaces repeated experts in a row by the next unused ones.
func dedupe(idx []int32, K, E int) []int32 {
	for t := 0; t < len(idx)/K; t++ {
		used := map[int32]bool{}
		for k := range K {
			v := idx[t*K+k]
			for used[v] {
				v = (v + 1) % int32(E)
			}
			used[v] = true
			idx[t*K+k] = v
		}
	}
	return idx
}
