package executor_test

import (
	"context"
	"fmt"

	"golang.org/x/sync/errgroup"

	"github.com/goep/goep/comm"
	"github.com/goep/goep/device"
	"github.com/goep/goep/executor"
)

// The hand-checkable example of docs/EXAMPLE.md on four in-process ranks:
// R=4, E=8 (experts 0,1 on rank 0, 2,3 on rank 1, 4,5 on rank 2, 6,7 on rank
// 3), K=2, H=2, fp32, weighted. Token t of rank s carries [10s+t, 100+10s+t].
// Each rank dispatches and permutes its tokens, applies an identity
// "expert" (y = the permuted rows), then unpermutes and combines: each
// token comes back as x times the sum of the weights of its non-empty
// slots, which is 1 except for token 1 of rank 1 (slot 0 empty: 0.9375) and
// token 2 of rank 0 (routed nowhere: a zero row).
func Example_small() {
	const R, E, K, H = 4, 8, 2, 2
	routing := [R][]int32{
		{1, 4, 5, 2, -1, -1}, // rank 0: t0 -> 1,4; t1 -> 5,2; t2 -> nowhere
		{3, 0, -1, 7},        // rank 1: t0 -> 3,0; t1 -> 7
		{},                   // rank 2: no tokens
		{4, 5, 2, 1, 6, 0},   // rank 3: t0 -> 4,5 (both on rank 2); t1 -> 2,1; t2 -> 6,0
	}
	weights := [R][]float32{
		{0.75, 0.25, 0.5, 0.5, 0.125, 0.125},
		{0.625, 0.375, 0.0625, 0.9375},
		{},
		{0.5, 0.5, 0.25, 0.75, 0.875, 0.125},
	}
	type result struct {
		counts executor.Counts
		recvX  []float32
		recvW  []float32
		px, pw []float32
		out    []float32
	}
	var res [R]result

	ctx := context.Background()
	groups := comm.NewLocal(R)
	b := device.NewHost()
	defer b.Close()
	cfg := executor.Config{NumExperts: E, TopK: K, Hidden: H, MaxTokensPerRank: 3, PadMultiple: 1}
	var g errgroup.Group
	for r := range R {
		g.Go(func() error {
			e, err := executor.New(ctx, groups[r], b, cfg)
			if err != nil {
				return err
			}
			defer e.Close()
			T := len(routing[r]) / K
			x := make([]float32, 0, T*H)
			for t := range T {
				x = append(x, float32(10*r+t), float32(100+10*r+t))
			}
			upload := func(dt device.DType, data []byte, shape ...int) (*device.Tensor, error) {
				t, err := e.NewTensor(dt, shape...)
				if err != nil {
					return nil, err
				}
				return t, device.Upload(ctx, t, data)
			}
			idxT, err := upload(device.Int32, device.EncodeInt32(routing[r]), T, K)
			if err != nil {
				return err
			}
			xT, err := upload(device.FP32, device.EncodeFloat32(device.FP32, x), T, H)
			if err != nil {
				return err
			}
			wT, err := upload(device.FP32, device.EncodeFloat32(device.FP32, weights[r]), T, K)
			if err != nil {
				return err
			}

			h, err := e.Layout(ctx, executor.LayoutInput{TopkIdx: idxT})
			if err != nil {
				return err
			}
			defer h.Close()
			if res[r].counts, err = h.Counts(ctx); err != nil {
				return err
			}
			d, err := e.Dispatch(ctx, h, executor.DispatchInput{X: xT, TopkWeights: wT})
			if err != nil {
				return err
			}
			p, err := e.DispatchPermute(ctx, h, executor.DispatchInput{X: xT, TopkWeights: wT})
			if err != nil {
				return err
			}
			// The experts: identity, so y is the permuted rows themselves.
			out, err := e.UnpermuteCombine(ctx, h, executor.UnpermuteInput{Y: p.X, RecvWeights: p.RecvWeights})
			if err != nil {
				return err
			}
			for _, o := range []struct {
				dst *[]float32
				t   *device.Tensor
			}{{&res[r].recvX, d.RecvX}, {&res[r].recvW, d.RecvWeights}, {&res[r].px, p.X}, {&res[r].pw, p.Weights}, {&res[r].out, out}} {
				bs, err := device.Download(ctx, o.t)
				if err != nil {
					return err
				}
				*o.dst = device.DecodeFloat32(device.FP32, bs)
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		fmt.Println("error:", err)
		return
	}
	pairs := func(v []float32, n int) string {
		if len(v) == 0 {
			return "(none)"
		}
		s := ""
		for i := 0; i < len(v); i += n {
			s += fmt.Sprint(v[i : i+n])
		}
		return s
	}
	for r, o := range res {
		fmt.Printf("rank %d: N=%d P=%d TokensPerExpert=%v\n", r, o.counts.RecvCount, o.counts.PermutedCount, o.counts.TokensPerExpert)
		fmt.Printf("  recvX %s\n  recvWeights %s\n", pairs(o.recvX, H), pairs(o.recvW, K))
		fmt.Printf("  permuted %s weights %v\n", pairs(o.px, H), o.pw)
		fmt.Printf("  combined %s\n", pairs(o.out, H))
	}
	// Output:
	// rank 0: N=4 P=4 TokensPerExpert=[2 2]
	//   recvX [0 100][10 110][31 131][32 132]
	//   recvWeights [0.75 0][0 0.375][0 0.75][0 0.125]
	//   permuted [10 110][32 132][0 100][31 131] weights [0.375 0.125 0.75 0.75]
	//   combined [0 100][1 101][0 0]
	// rank 1: N=3 P=3 TokensPerExpert=[2 1]
	//   recvX [1 101][10 110][31 131]
	//   recvWeights [0 0.5][0.625 0][0.25 0]
	//   permuted [1 101][31 131][10 110] weights [0.5 0.25 0.625]
	//   combined [10 110][10.3125 104.0625]
	// rank 2: N=3 P=4 TokensPerExpert=[2 2]
	//   recvX [0 100][1 101][30 130]
	//   recvWeights [0 0.25][0.5 0][0.5 0.5]
	//   permuted [0 100][30 130][1 101][30 130] weights [0.25 0.5 0.5 0.5]
	//   combined (none)
	// rank 3: N=2 P=2 TokensPerExpert=[1 1]
	//   recvX [11 111][32 132]
	//   recvWeights [0 0.9375][0.875 0]
	//   permuted [32 132][11 111] weights [0.875 0.9375]
	//   combined [30 130][31 131][32 132]
}
