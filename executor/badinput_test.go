package executor

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/goep/goep/device"
)

// TestBadInput is DESIGN.md invariant 5: each fault, made on one rank only,
// gives a clear error on every rank, nothing hangs, and the engine still
// works afterwards.
func TestBadInput(t *testing.T) {
	const E, K, H, T = 12, 2, 8, 4
	const bad = 1 // the rank that misbehaves
	type call func(ctx context.Context, e *Engine, h *Handle, x *device.Tensor) error
	mk := func(ctx context.Context, e *Engine, dt device.DType, shape ...int) *device.Tensor {
		return zeros(e, dt, shape...)
	}
	layout := func(idx func(ctx context.Context, e *Engine) *device.Tensor) call {
		return func(ctx context.Context, e *Engine, _ *Handle, _ *device.Tensor) error {
			h, err := e.Layout(ctx, LayoutInput{TopkIdx: idx(ctx, e)})
			if err == nil {
				h.Close()
			}
			return err
		}
	}
	routing := func(vals ...int32) func(ctx context.Context, e *Engine) *device.Tensor {
		return func(ctx context.Context, e *Engine) *device.Tensor {
			return badRouting(ctx, e, bad, T, K, E, vals)
		}
	}
	onBad := func(good, faulty func(ctx context.Context, e *Engine) *device.Tensor) func(ctx context.Context, e *Engine) *device.Tensor {
		return func(ctx context.Context, e *Engine) *device.Tensor {
			if e.Rank() == bad {
				return faulty(ctx, e)
			}
			return good(ctx, e)
		}
	}
	dispatchWith := func(x func(ctx context.Context, e *Engine, x *device.Tensor) *device.Tensor, w func(ctx context.Context, e *Engine) *device.Tensor) call {
		return func(ctx context.Context, e *Engine, h *Handle, xt *device.Tensor) error {
			in := DispatchInput{X: x(ctx, e, xt)}
			if w != nil {
				in.TopkWeights = w(ctx, e)
			}
			out, err := e.Dispatch(ctx, h, in)
			if err == nil {
				defer out.Close()
				err = e.Synchronize(ctx)
			}
			return err
		}
	}
	xOnBad := func(f func(ctx context.Context, e *Engine) *device.Tensor) func(ctx context.Context, e *Engine, x *device.Tensor) *device.Tensor {
		return func(ctx context.Context, e *Engine, x *device.Tensor) *device.Tensor {
			if e.Rank() == bad {
				return f(ctx, e)
			}
			return x
		}
	}
	closed := func(t *device.Tensor) *device.Tensor {
		t.Close()
		return t
	}
	cases := []struct {
		name string
		call call
		want error  // sentinel every rank's error wraps
		text string // the text every rank's error contains
	}{
		{"expert out of range", layout(routing(0, E)), ErrInvalidInput, "rank 1, token 0, slot 1: expert 12 out of range"},
		{"expert below -1", layout(routing(-2)), ErrInvalidInput, "expert -2 out of range"},
		{"repeated expert", layout(routing(3, 3)), ErrInvalidInput, "expert 3 repeated"},
		{"too many tokens", layout(onBad(routing(), func(ctx context.Context, e *Engine) *device.Tensor { return mk(ctx, e, device.Int32, T+5, K) })), ErrInvalidInput, "exceed MaxTokensPerRank"},
		{"routing dtype", layout(onBad(routing(), func(ctx context.Context, e *Engine) *device.Tensor { return mk(ctx, e, device.FP32, T, K) })), ErrInvalidInput, "TopkIdx has dtype fp32"},
		{"routing columns", layout(onBad(routing(), func(ctx context.Context, e *Engine) *device.Tensor { return mk(ctx, e, device.Int32, T, K+1) })), ErrInvalidInput, "TopkIdx has shape"},
		{"nil routing", layout(onBad(routing(), func(ctx context.Context, e *Engine) *device.Tensor { return nil })), ErrInvalidInput, "TopkIdx is nil"},
		{"x hidden", dispatchWith(xOnBad(func(ctx context.Context, e *Engine) *device.Tensor { return mk(ctx, e, device.BF16, T, H+1) }), nil), ErrInvalidInput, "X has shape"},
		{"x rows", dispatchWith(xOnBad(func(ctx context.Context, e *Engine) *device.Tensor { return mk(ctx, e, device.BF16, T-1, H) }), nil), ErrInvalidInput, "X has shape"},
		{"x dtype", dispatchWith(xOnBad(func(ctx context.Context, e *Engine) *device.Tensor { return mk(ctx, e, device.Int32, T, H) }), nil), ErrInvalidInput, "want bf16 or fp32"},
		{"nil x", dispatchWith(xOnBad(func(ctx context.Context, e *Engine) *device.Tensor { return nil }), nil), ErrInvalidInput, "X is nil"},
		{"closed x", dispatchWith(xOnBad(func(ctx context.Context, e *Engine) *device.Tensor { return closed(mk(ctx, e, device.BF16, T, H)) }), nil), ErrInvalidInput, "X was closed"},
		{"closed routing", layout(onBad(routing(), func(ctx context.Context, e *Engine) *device.Tensor { return closed(routing()(ctx, e)) })), ErrInvalidInput, "TopkIdx was closed"},
		{"closed weights", dispatchWith(func(ctx context.Context, e *Engine, x *device.Tensor) *device.Tensor { return x },
			func(ctx context.Context, e *Engine) *device.Tensor {
				w := mk(ctx, e, device.FP32, T, K)
				if e.Rank() == bad {
					w.Close()
				}
				return w
			}), ErrInvalidInput, "TopkWeights was closed"},
		{"weights on one rank only", dispatchWith(func(ctx context.Context, e *Engine, x *device.Tensor) *device.Tensor { return x },
			func(ctx context.Context, e *Engine) *device.Tensor {
				if e.Rank() == bad {
					return mk(ctx, e, device.FP32, T, K)
				}
				return nil
			}), ErrPeerMismatch, "TopkWeights must be given on every rank or on none"},
		{"dtype differs between ranks", dispatchWith(xOnBad(func(ctx context.Context, e *Engine) *device.Tensor { return mk(ctx, e, device.FP32, T, H) }), nil), ErrPeerMismatch, "dtype must be equal on all ranks"},
		{"weights shape", dispatchWith(func(ctx context.Context, e *Engine, x *device.Tensor) *device.Tensor { return x },
			func(ctx context.Context, e *Engine) *device.Tensor { return mk(ctx, e, device.FP32, T, K+1) }), ErrInvalidInput, "TopkWeights has shape"},
		{"combine rows", func(ctx context.Context, e *Engine, h *Handle, x *device.Tensor) error {
			rows := h.RecvRows()
			if e.Rank() == bad {
				rows++
			}
			out, err := e.Combine(ctx, h, CombineInput{Z: mk(ctx, e, device.BF16, rows, H)})
			if err == nil {
				defer out.Close()
				err = e.Synchronize(ctx)
			}
			return err
		}, ErrInvalidInput, "Z has shape"},
		{"closed combine input", func(ctx context.Context, e *Engine, h *Handle, x *device.Tensor) error {
			z := mk(ctx, e, device.BF16, h.RecvRows(), H)
			if e.Rank() == bad {
				z.Close()
			}
			out, err := e.Combine(ctx, h, CombineInput{Z: z})
			if err == nil {
				defer out.Close()
				err = e.Synchronize(ctx)
			}
			return err
		}, ErrInvalidInput, "Z was closed"},
		{"closed output", func(ctx context.Context, e *Engine, h *Handle, x *device.Tensor) error {
			out := DispatchPermuteOutput{X: mk(ctx, e, device.BF16, h.PermutedRows(), H), RecvIdx: mk(ctx, e, device.Int32, h.RecvRows(), K)}
			defer out.Close()
			if e.Rank() == bad {
				out.X.Close()
			}
			err := e.DispatchPermuteInto(ctx, h, DispatchInput{X: x}, out)
			if err == nil {
				err = e.Synchronize(ctx)
			}
			return err
		}, ErrInvalidInput, "output X was closed"},
		{"handle's counts closed", func(ctx context.Context, e *Engine, _ *Handle, x *device.Tensor) error {
			h, err := e.Layout(ctx, LayoutInput{TopkIdx: routing()(ctx, e)})
			if err != nil {
				return err
			}
			defer h.Close()
			if e.Rank() == bad {
				h.DeviceCounts().Close()
				if _, err := h.Counts(ctx); !errors.Is(err, ErrInvalidInput) {
					return fmt.Errorf("Counts: %v, want ErrInvalidInput", err)
				}
			}
			out, err := e.Dispatch(ctx, h, DispatchInput{X: x})
			if err == nil {
				defer out.Close()
				err = e.Synchronize(ctx)
			}
			return err
		}, ErrInvalidInput, "DeviceCounts tensor was closed"},
		{"nil handle", func(ctx context.Context, e *Engine, h *Handle, x *device.Tensor) error {
			if e.Rank() == bad {
				h = nil
			}
			_, err := e.Dispatch(ctx, h, DispatchInput{X: x})
			if err == nil {
				err = e.Synchronize(ctx)
			}
			return err
		}, ErrInvalidInput, "nil handle"},
	}
	// One domain of 3 ranks; 2 domains of 2 (the bad rank's rail peer is
	// rank 3); 4 domains of 1.
	for _, world := range []struct{ R, D int }{{3, 0}, {4, 2}, {4, 1}} {
		R, D := world.R, world.D
		for _, tc := range cases {
			t.Run(fmt.Sprintf("R=%d D=%d/%s", R, D, tc.name), func(t *testing.T) {
				cfg := Config{NumExperts: E, TopK: K, Hidden: H, MaxTokensPerRank: T, Timeout: 5 * 1e9, RanksPerDomain: D}
				errs := runRanks(t, R, cfg, func(ctx context.Context, e *Engine) error {
					h, err := e.Layout(ctx, LayoutInput{TopkIdx: routing()(ctx, e)})
					if err != nil {
						return fmt.Errorf("setup layout: %w", err)
					}
					defer h.Close()
					x := mk(ctx, e, device.BF16, T, H)
					err = tc.call(ctx, e, h, x)
					// The engine still works afterwards.
					out, derr := e.Dispatch(ctx, h, DispatchInput{X: x})
					if derr == nil {
						derr = e.Synchronize(ctx)
						out.Close()
					}
					if derr != nil {
						return fmt.Errorf("call after the fault: %v (fault's error: %v)", derr, err)
					}
					return err
				})
				for r, err := range errs {
					if err == nil || !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.text) {
						t.Errorf("rank %d: error %v; want %v containing %q", r, err, tc.want, tc.text)
					}
				}
			})
		}
	}
}

// badRouting is a [T, K] routing over E experts on e (token t's first slot
// expert t mod E, its second empty), with vals over its first values on
// rank bad.
func badRouting(ctx context.Context, e *Engine, bad, T, K, E int, vals []int32) *device.Tensor {
	v := make([]int32, T*K)
	for i := range v {
		v[i] = int32(i % E)
		if i%K == 1 {
			v[i] = -1
		}
	}
	if e.Rank() == bad {
		copy(v, vals)
	}
	t, _ := upload(ctx, e, device.Int32, device.EncodeInt32(v), T, K)
	return t
}
