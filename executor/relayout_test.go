package executor

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/goep/goep/device"
)

// TestRelayoutInto runs DispatchPermuteInto and UnpermuteCombineInto on one
// capacity-mode handle and one set of outputs while Relayout changes the
// routing under them (the pattern of a replayed CUDA graph), and checks
// every output bit for bit against fresh handles and fresh outputs.
func TestRelayoutInto(t *testing.T) {
	for _, ov := range []Overflow{OverflowDrop, OverflowError} {
		t.Run(fmt.Sprint(ov), func(t *testing.T) {
			cfg := Config{NumExperts: 16, TopK: 4, Hidden: 40, MaxTokensPerRank: 32, PadMultiple: 4,
				Mode: Capacity, Overflow: ov, MaxRecvTokens: 90, MaxPermutedTokens: 200}
			if ov == OverflowDrop {
				cfg.MaxRecvTokens, cfg.MaxPermutedTokens = 60, 150 // some seeds drop rows
			}
			const R, T = 4, 32
			K, E, H := cfg.TopK, cfg.NumExperts, cfg.Hidden
			errs := runRanks(t, R, cfg, func(ctx context.Context, e *Engine) error {
				r := e.Rank()
				var h *Handle
				var dp DispatchPermuteOutput
				var out *device.Tensor
				for i, seed := range []uint64{1, 2, 3, 4} {
					dt := device.BF16
					idx, x, w := rankInputs(seed, r, T, K, E, H, dt)
					ti, xt, wt, err := uploadInputs(ctx, e, idx, x, w, T, dt)
					if err != nil {
						return err
					}
					hf, err := e.Layout(ctx, LayoutInput{TopkIdx: ti})
					if err != nil {
						return err
					}
					want, err := e.DispatchPermute(ctx, hf, DispatchInput{X: xt, TopkWeights: wt})
					if err != nil {
						return err
					}
					wantC, err := e.UnpermuteCombine(ctx, hf, UnpermuteInput{Y: want.X, RecvWeights: want.RecvWeights})
					if err != nil {
						return err
					}
					if i == 0 {
						if h, err = e.Layout(ctx, LayoutInput{TopkIdx: ti}); err != nil {
							return err
						}
						o, err, _ := e.newOutputs(nil,
							matrix(dt, h.PermutedRows(), H),
							vector(device.FP32, h.PermutedRows()),
							matrix(device.Int32, h.RecvRows(), K),
							matrix(device.FP32, h.RecvRows(), K),
							matrix(dt, T, H))
						if err != nil {
							return err
						}
						dp = DispatchPermuteOutput{X: o[0], Weights: o[1], RecvIdx: o[2], RecvWeights: o[3]}
						out = o[4]
					} else if err := e.Relayout(ctx, h, LayoutInput{TopkIdx: ti}); err != nil {
						return err
					}
					if err := e.DispatchPermuteInto(ctx, h, DispatchInput{X: xt, TopkWeights: wt}, dp); err != nil {
						return err
					}
					if err := e.UnpermuteCombineInto(ctx, h, UnpermuteInput{Y: dp.X, RecvWeights: dp.RecvWeights}, out); err != nil {
						return err
					}
					serr := e.Synchronize(ctx)
					var ce *CapacityError
					if errors.As(serr, &ce) {
						// Over capacity under OverflowError: every rank says so,
						// for the fresh handle and the relaid one alike.
						continue
					}
					if serr != nil {
						return serr
					}
					for _, c := range []struct {
						name      string
						got, want *device.Tensor
					}{{"X", dp.X, want.X}, {"Weights", dp.Weights, want.Weights}, {"RecvIdx", dp.RecvIdx, want.RecvIdx},
						{"RecvWeights", dp.RecvWeights, want.RecvWeights}, {"combine", out, wantC}} {
						if !bytes.Equal(c.got.Bytes(), c.want.Bytes()) {
							return fmt.Errorf("seed %d: %s of the relaid handle differs from a fresh handle's", seed, c.name)
						}
					}
					gc, err := h.Counts(ctx)
					if err != nil {
						return err
					}
					wc, err := hf.Counts(ctx)
					if err != nil {
						return err
					}
					if fmt.Sprint(gc) != fmt.Sprint(wc) {
						return fmt.Errorf("seed %d: counts %+v after relayout, %+v fresh", seed, gc, wc)
					}
					hf.Close()
				}
				// Wrong token count: refused on every rank (each sees its own).
				ti, err := e.NewTensor(device.Int32, T-1, K)
				if err != nil {
					return err
				}
				if err := e.Relayout(ctx, h, LayoutInput{TopkIdx: ti}); !errors.Is(err, ErrInvalidInput) {
					return fmt.Errorf("relayout with %d tokens: %v, want ErrInvalidInput", T-1, err)
				}
				return nil
			})
			for r, err := range errs {
				if err != nil {
					t.Errorf("rank %d: %v", r, err)
				}
			}
		})
	}
}

// TestRelayoutBlocking: Relayout needs capacity mode.
func TestRelayoutBlocking(t *testing.T) {
	cfg := Config{NumExperts: 4, TopK: 2, Hidden: 8, MaxTokensPerRank: 4}
	errs := runRanks(t, 1, cfg, func(ctx context.Context, e *Engine) error {
		ti, err := upload(ctx, e, device.Int32, device.EncodeInt32([]int32{0, 1, 2, 3}), 2, 2)
		if err != nil {
			return err
		}
		h, err := e.Layout(ctx, LayoutInput{TopkIdx: ti})
		if err != nil {
			return err
		}
		if err := e.Relayout(ctx, h, LayoutInput{TopkIdx: ti}); !errors.Is(err, ErrInvalidInput) {
			return fmt.Errorf("relayout in blocking mode: %v, want ErrInvalidInput", err)
		}
		return e.Synchronize(ctx)
	})
	if errs[0] != nil {
		t.Fatal(errs[0])
	}
}
