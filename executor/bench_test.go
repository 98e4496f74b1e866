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
// (bf16, 64 experts, top-8).
func benchCalls(b *testing.B, R, T, H int, calls []string) {
	const E, K = 64, 8
	dt := device.BF16
	for _, call := range calls {
		b.Run(fmt.Sprintf("call=%s/ranks=%d/tokens=%d/hidden=%d/topk=%d", call, R, T, H, K), func(b *testing.B) {
			gs := comm.NewLocal(R)
			be := device.NewHost()
			defer be.Close()
			cfg := Config{NumExperts: E, TopK: K, Hidden: H, MaxTokensPerRank: T}
			start := make([]chan bool, R)
			var done sync.WaitGroup
			var bytes int64
			var setup sync.WaitGroup
			setup.Add(R)
			for r := range R {
				start[r] = make(chan bool)
				go func() {
					ctx := context.Background()
					e, err := New(ctx, gs[r], be, cfg)
					if err != nil {
						panic(err)
					}
					defer e.Close()
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
					if r == 0 {
						bytes = int64(h.RecvRows() * H * dt.Size())
					}
					// Realistic operands: z and y hold dispatched rows
					// (uninitialised memory could hold subnormals, which
					// are slow on CPUs), and the unpermute is weighted.
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
					setup.Done()
					for range start[r] {
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
