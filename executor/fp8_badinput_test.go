package executor

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/goep/goep/device"
)

// TestBadInputFP8 is invariant 5 for fp8 rows: each fault, made on one
// rank only, gives a clear error on every rank of a collective call (the
// caller's rank alone for a local one), and the engine still dispatches
// fp8 afterwards.
func TestBadInputFP8(t *testing.T) {
	const E, K, H, T = 12, 2, 256, 4
	const S = H / device.FP8ScaleChannels
	const bad = 1 // the rank that misbehaves
	mk := zeros
	// onBad returns faulty on the bad rank, good elsewhere.
	onBad := func(e *Engine, good, faulty *device.Tensor) *device.Tensor {
		if e.Rank() == bad {
			return faulty
		}
		return good
	}
	type call func(ctx context.Context, e *Engine, h *Handle) error
	sync := func(ctx context.Context, e *Engine, err error) error {
		if err == nil {
			err = e.Synchronize(ctx)
		}
		return err
	}
	dispatch := func(in func(e *Engine) DispatchInput) call {
		return func(ctx context.Context, e *Engine, h *Handle) error {
			out, err := e.Dispatch(ctx, h, in(e))
			if err == nil {
				defer out.Close()
			}
			return sync(ctx, e, err)
		}
	}
	fp8 := func(e *Engine) DispatchInput {
		return DispatchInput{X: mk(e, device.FP8E4M3, T, H), XScales: mk(e, device.FP32, T, S)}
	}
	cases := []struct {
		name  string
		call  call
		local bool   // a local call: only the bad rank errs
		want  error  // sentinel the errors wrap
		text  string // text the errors contain
	}{
		{"scales missing", dispatch(func(e *Engine) DispatchInput {
			in := fp8(e)
			in.XScales = onBad(e, in.XScales, nil)
			return in
		}), false, ErrInvalidInput, "XScales is nil"},
		{"scales with bf16 rows", dispatch(func(e *Engine) DispatchInput {
			return DispatchInput{X: mk(e, device.BF16, T, H), XScales: onBad(e, nil, mk(e, device.FP32, T, S))}
		}), false, ErrInvalidInput, "scales come with fp8 rows only"},
		{"scales shape", dispatch(func(e *Engine) DispatchInput {
			in := fp8(e)
			in.XScales = onBad(e, in.XScales, mk(e, device.FP32, T, S+1))
			return in
		}), false, ErrInvalidInput, "XScales has shape"},
		{"scales dtype", dispatch(func(e *Engine) DispatchInput {
			in := fp8(e)
			in.XScales = onBad(e, in.XScales, mk(e, device.BF16, T, S))
			return in
		}), false, ErrInvalidInput, "XScales has dtype bf16"},
		{"fp8 on one rank only", dispatch(func(e *Engine) DispatchInput {
			if e.Rank() == bad {
				return DispatchInput{X: mk(e, device.BF16, T, H)}
			}
			return fp8(e)
		}), false, ErrPeerMismatch, "dtype must be equal on all ranks"},
		{"dispatch-permute output scales missing", func(ctx context.Context, e *Engine, h *Handle) error {
			N, P := h.RecvRows(), h.PermutedRows()
			out := DispatchPermuteOutput{X: mk(e, device.FP8E4M3, P, H), RecvIdx: mk(e, device.Int32, N, K), Scales: onBad(e, mk(e, device.FP32, P, S), nil)}
			defer out.Close()
			return sync(ctx, e, e.DispatchPermuteInto(ctx, h, fp8(e), out))
		}, false, ErrInvalidInput, "output Scales is nil"},
		{"combine of fp8 rows", func(ctx context.Context, e *Engine, h *Handle) error {
			N := h.RecvRows()
			out, err := e.Combine(ctx, h, CombineInput{Z: onBad(e, mk(e, device.BF16, N, H), mk(e, device.FP8E4M3, N, H))})
			if err == nil {
				defer out.Close()
			}
			return sync(ctx, e, err)
		}, false, ErrInvalidInput, "fp8 rows are only moved"},
		{"combine backward of fp8 rows", func(ctx context.Context, e *Engine, h *Handle) error {
			out, err := e.CombineBackward(ctx, h, onBad(e, mk(e, device.BF16, T, H), mk(e, device.FP8E4M3, T, H)))
			if err == nil {
				defer out.Close()
			}
			return sync(ctx, e, err)
		}, false, ErrInvalidInput, "fp8 rows are only moved"},
		{"unpermute of fp8 rows", func(ctx context.Context, e *Engine, h *Handle) error {
			if e.Rank() != bad {
				return nil
			}
			_, err := e.Unpermute(ctx, h, UnpermuteInput{Y: mk(e, device.FP8E4M3, h.PermutedRows(), H)})
			return err
		}, true, ErrInvalidInput, "fp8 rows are only moved"},
		{"permute of fp8 rows without scales", func(ctx context.Context, e *Engine, h *Handle) error {
			if e.Rank() != bad {
				return nil
			}
			_, err := e.Permute(ctx, h, PermuteInput{RecvX: mk(e, device.FP8E4M3, h.RecvRows(), H)})
			return err
		}, true, ErrInvalidInput, "RecvScales is nil"},
	}
	routing := func(ctx context.Context, e *Engine) (*Handle, error) {
		v := make([]int32, T*K)
		for i := range v {
			v[i] = int32((i + e.Rank()) % E)
		}
		idx, err := upload(ctx, e, device.Int32, device.EncodeInt32(v), T, K)
		if err != nil {
			return nil, err
		}
		return e.Layout(ctx, LayoutInput{TopkIdx: idx})
	}
	for _, world := range []struct{ R, D int }{{3, 0}, {4, 2}} {
		for _, tc := range cases {
			t.Run(fmt.Sprintf("R=%d D=%d/%s", world.R, world.D, tc.name), func(t *testing.T) {
				cfg := Config{NumExperts: E, TopK: K, Hidden: H, MaxTokensPerRank: T, Timeout: 5e9, RanksPerDomain: world.D}
				errs := runRanks(t, world.R, cfg, func(ctx context.Context, e *Engine) error {
					h, err := routing(ctx, e)
					if err != nil {
						return fmt.Errorf("setup layout: %w", err)
					}
					defer h.Close()
					err = tc.call(ctx, e, h)
					// The engine still dispatches fp8 afterwards.
					out, derr := e.Dispatch(ctx, h, fp8(e))
					if derr == nil {
						derr = e.Synchronize(ctx)
						out.Close()
					}
					if derr != nil {
						return fmt.Errorf("fp8 dispatch after the fault: %v (fault's error: %v)", derr, err)
					}
					return err
				})
				for r, err := range errs {
					if tc.local && r != bad {
						if err != nil {
							t.Errorf("rank %d: error %v from a local call on another rank", r, err)
						}
						continue
					}
					if err == nil || !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.text) {
						t.Errorf("rank %d: error %v; want %v containing %q", r, err, tc.want, tc.text)
					}
				}
			})
		}
	}
	t.Run("hidden not a multiple of 128", func(t *testing.T) {
		cfg := Config{NumExperts: E, TopK: K, Hidden: 96, MaxTokensPerRank: T, Timeout: 5e9}
		errs := runRanks(t, 2, cfg, func(ctx context.Context, e *Engine) error {
			h, err := routing(ctx, e)
			if err != nil {
				return err
			}
			defer h.Close()
			_, err = e.Dispatch(ctx, h, DispatchInput{X: mk(e, device.FP8E4M3, T, 96), XScales: mk(e, device.FP32, T, 1)})
			return sync(ctx, e, err)
		})
		for r, err := range errs {
			if !errors.Is(err, ErrInvalidInput) || !strings.Contains(err.Error(), "multiple of 128") {
				t.Errorf("rank %d: error %v; want ErrInvalidInput about a multiple of 128", r, err)
			}
		}
	})
}
