package executor

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/goep/goep/device"
	"github.com/goep/goep/executor/internal/plan"
	"github.com/goep/goep/internal/view"
	"github.com/goep/goep/permute"
)

// capResult is what one rank produced in one run.
type capResult struct {
	lay                 *plan.Layout
	counts              Counts
	recvX, px, pw, comb []byte
	recvIdx             []int32
	recvW               []float32
	unperm              []byte
	err                 error
}

// runCapacity runs layout, dispatch, dispatch-permute, unpermute and combine
// on every rank with one config and returns each rank's results. Outputs'
// guard bytes are checked.
func runCapacity(t *testing.T, R int, cfg Config, T int, dt device.DType) []capResult {
	t.Helper()
	res := make([]capResult, R)
	errs := runRanks(t, R, cfg, func(ctx context.Context, e *Engine) error {
		r := e.Rank()
		K, E, H := cfg.TopK, cfg.NumExperts, cfg.Hidden
		idx, x, w := rankInputs(11, r, T, K, E, H, dt)
		ti, xt, wt, err := uploadInputs(ctx, e, idx, x, w, T, dt)
		if err != nil {
			return err
		}
		h, err := e.Layout(ctx, LayoutInput{TopkIdx: ti})
		if err != nil {
			return err
		}
		defer h.Close()
		d, err := e.Dispatch(ctx, h, DispatchInput{X: xt, TopkWeights: wt})
		if err != nil {
			return err
		}
		dp, err := e.DispatchPermute(ctx, h, DispatchInput{X: xt, TopkWeights: wt})
		if err != nil {
			return err
		}
		u, err := e.Unpermute(ctx, h, UnpermuteInput{Y: dp.X, RecvWeights: dp.RecvWeights})
		if err != nil {
			return err
		}
		c, err := e.Combine(ctx, h, CombineInput{Z: d.RecvX})
		if err != nil {
			return err
		}
		if err := e.Synchronize(ctx); err != nil {
			res[r].err = err
			return nil
		}
		for _, o := range []*device.Tensor{d.RecvX, d.RecvIdx, d.RecvWeights, dp.X, dp.Weights, dp.RecvIdx, dp.RecvWeights, u, c} {
			if err := o.CheckGuards(); err != nil {
				return fmt.Errorf("output %v: %w", o, err)
			}
		}
		res[r] = capResult{
			lay: h.st.Lay, recvX: d.RecvX.Bytes(), recvIdx: slices.Clone(view.Int32s(d.RecvIdx.Bytes())),
			recvW: slices.Clone(view.Float32s(d.RecvWeights.Bytes())),
			px:    slices.Clone(dp.X.Bytes()), pw: slices.Clone(dp.Weights.Bytes()),
			unperm: slices.Clone(u.Bytes()), comb: slices.Clone(c.Bytes()),
		}
		res[r].recvX = slices.Clone(res[r].recvX)
		res[r].counts, err = h.Counts(ctx)
		return err
	})
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	return res
}

// TestCapacityMode checks capacity mode against blocking mode on the same
// routing: exact and larger capacities give the blocking results plus zero
// tails; smaller capacities error on every rank (OverflowError) or drop
// rows deterministically (OverflowDrop), never writing out of bounds.
func TestCapacityMode(t *testing.T) {
	const R, E, K, H, T = 4, 16, 4, 24, 30
	for _, dt := range []device.DType{device.BF16, device.FP32} {
		base := Config{NumExperts: E, TopK: K, Hidden: H, MaxTokensPerRank: T, PadMultiple: 8}
		blk := runCapacity(t, R, base, T, dt)
		maxN, maxP := 0, 0
		for _, b := range blk {
			maxN, maxP = max(maxN, b.lay.RecvCount), max(maxP, b.lay.PermutedCount)
		}
		for _, tc := range []struct {
			name       string
			capN, capP int
			policy     Overflow
		}{
			{"exact", maxN, maxP, OverflowError},
			{"under", maxN + 7, maxP + 9, OverflowError},
			{"exact-drop", maxN, maxP, OverflowDrop},
			{"overflow-error-recv", maxN - 1, maxP, OverflowError},
			{"overflow-error-permuted", maxN, maxP - 1, OverflowError},
			{"overflow-drop", maxN - 5, maxP - 11, OverflowDrop},
			{"overflow-drop-tiny", 1, 1, OverflowDrop},
		} {
			t.Run(fmt.Sprintf("%v/%s", dt, tc.name), func(t *testing.T) {
				cfg := base
				cfg.Mode, cfg.MaxRecvTokens, cfg.MaxPermutedTokens, cfg.Overflow = Capacity, tc.capN, tc.capP, tc.policy
				got := runCapacity(t, R, cfg, T, dt)
				over := tc.capN < maxN || tc.capP < maxP
				for r := range R {
					if over && tc.policy == OverflowError {
						var ce *CapacityError
						if !errors.Is(got[r].err, ErrCapacityExceeded) || !errors.As(got[r].err, &ce) || len(ce.Ranks) == 0 {
							t.Fatalf("rank %d: error %v, want a CapacityError", r, got[r].err)
						}
						continue
					}
					if got[r].err != nil {
						t.Fatalf("rank %d: %v", r, got[r].err)
					}
					checkCapacityRank(t, r, dt, H, K, cfg, blk, got)
				}
			})
		}
	}
}

// checkCapacityRank compares rank r's capacity-mode outputs with the
// blocking run: kept rows equal, dropped and tail rows zero.
func checkCapacityRank(t *testing.T, r int, dt device.DType, H, K int, cfg Config, blk, got []capResult) {
	t.Helper()
	rb := H * dt.Size()
	b, g := blk[r], got[r]
	N, P := b.lay.RecvCount, b.lay.PermutedCount
	n := min(N, cfg.MaxRecvTokens)
	if g.counts.RecvCount != N || g.counts.PermutedCount != P || g.counts.Overflow != (N > cfg.MaxRecvTokens || P > cfg.MaxPermutedTokens) {
		t.Errorf("rank %d: counts %+v, want N=%d P=%d", r, g.counts, N, P)
	}
	zeroRow := make([]byte, rb)
	for i := range cfg.MaxRecvTokens {
		want, wantIdx := zeroRow, slices.Repeat([]int32{-1}, K)
		wantW := make([]float32, K)
		if i < n {
			want, wantIdx, wantW = b.recvX[i*rb:(i+1)*rb], b.recvIdx[i*K:(i+1)*K], b.recvW[i*K:(i+1)*K]
		}
		if !bytes.Equal(g.recvX[i*rb:(i+1)*rb], want) || !slices.Equal(g.recvIdx[i*K:(i+1)*K], wantIdx) || !slices.Equal(g.recvW[i*K:(i+1)*K], wantW) {
			t.Fatalf("rank %d: received row %d differs from blocking mode (kept rows: %d)", r, i, n)
		}
	}
	// Permuted row p is kept iff p < capacity and the row it copies was
	// kept.
	kept := make([]bool, cfg.MaxPermutedTokens)
	for i := range n {
		for k := range K {
			if p := int(b.lay.Pos[i*K+k]); p >= 0 && p < len(kept) {
				kept[p] = true
			}
		}
	}
	for p := range cfg.MaxPermutedTokens {
		want, wantW := zeroRow, []byte{0, 0, 0, 0}
		if kept[p] {
			want, wantW = b.px[p*rb:(p+1)*rb], b.pw[4*p:4*p+4]
		}
		if !bytes.Equal(g.px[p*rb:(p+1)*rb], want) || !bytes.Equal(g.pw[4*p:4*p+4], wantW) {
			t.Fatalf("rank %d: permuted row %d (kept %v) differs from blocking mode", r, p, kept[p])
		}
	}
	if n == N && P <= cfg.MaxPermutedTokens {
		// Nothing dropped on this rank: unpermute equals blocking mode.
		if !bytes.Equal(g.unperm[:N*rb], b.unperm) || !bytes.Equal(g.unperm[N*rb:], make([]byte, len(g.unperm)-N*rb)) {
			t.Errorf("rank %d: unpermute differs from blocking mode", r)
		}
	}
	// Combine: token t sums the z rows that were kept on their
	// destinations; z here is the received x, so the expectation is the
	// blocking combine when nothing was dropped anywhere, else computed
	// from the kept rows.
	T := b.lay.NumTokens
	acc := make([]float32, H)
	want := make([]byte, T*rb)
	for tk := range T {
		first := true
		for j := b.lay.SendOffsets[tk]; j < b.lay.SendOffsets[tk+1]; j++ {
			d, row := int(b.lay.SendDest[j]), int(b.lay.SendRow[j])
			if row >= min(blk[d].lay.RecvCount, cfg.MaxRecvTokens) {
				continue
			}
			permute.Accumulate(dt, acc, blk[d].recvX[row*rb:(row+1)*rb], 1, first)
			first = false
		}
		if !first {
			permute.Store(dt, want[tk*rb:(tk+1)*rb], acc)
		}
	}
	if !bytes.Equal(g.comb, want) {
		t.Errorf("rank %d: combine differs from the sum of kept rows", r)
	}
}
