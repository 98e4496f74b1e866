package executor

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/goep/goep/comm"
	"github.com/goep/goep/device"
	"github.com/goep/goep/nvlink"
)

// errorClasses are the sentinels whose text an error may carry; each must
// appear at most once in a message (a class wrapped twice reads
// "...: executor: invalid input: executor: invalid input").
var errorClasses = []error{
	ErrInvalidInput, ErrPeerMismatch, ErrCapacityExceeded, ErrUnsupported,
	ErrFailed, ErrClosed, ErrConcurrentCall, ErrTimeout, ErrPeerLost,
	nvlink.ErrPeerReported, device.ErrClosed, comm.ErrClosed,
}

// checkErrorText reports what is wrong with the text of err: a class named
// twice, or a run of ": "-separated parts repeated back to back.
func checkErrorText(err error) []string {
	var bad []string
	msg := err.Error()
	for _, c := range errorClasses {
		if n := strings.Count(msg, c.Error()); n > 1 {
			bad = append(bad, fmt.Sprintf("%q appears %d times", c.Error(), n))
		}
	}
	parts := strings.Split(msg, ": ")
	for n := 1; n <= 3; n++ {
		for i := 0; i+2*n <= len(parts); i++ {
			if strings.Join(parts[i:i+n], ": ") == strings.Join(parts[i+n:i+2*n], ": ") {
				bad = append(bad, fmt.Sprintf("%q repeated", strings.Join(parts[i:i+n], ": ")))
			}
		}
	}
	return bad
}

// TestErrorTexts walks bad inputs (on one rank, or on every rank) through
// the host backend on in-process ranks, in one domain and in several, and
// checks every rank's message: each class once, no part repeated, and a
// mismatch between ranks named in words (the call, and which of its
// dtype, weights or handle differs), as the caller wrote it.
func TestErrorTexts(t *testing.T) {
	const E, K, H, T, bad = 12, 2, 8, 4, 1
	type call func(ctx context.Context, e *Engine, h *Handle, x *device.Tensor) error
	onBad := func(e *Engine, good, faulty *device.Tensor) *device.Tensor {
		return pick(e.Rank() == bad, faulty, good)
	}
	onBadDT := func(e *Engine, good, faulty device.DType) device.DType { return pick(e.Rank() == bad, faulty, good) }
	routing := func(ctx context.Context, e *Engine, vals ...int32) *device.Tensor {
		return badRouting(ctx, e, bad, T, K, E, vals)
	}
	sync := func(ctx context.Context, e *Engine, err error, outs ...interface{ Close() error }) error {
		for _, o := range outs {
			defer o.Close()
		}
		if err != nil {
			return err
		}
		return e.Synchronize(ctx)
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
	dispatch := func(in func(e *Engine, x *device.Tensor) DispatchInput) call {
		return func(ctx context.Context, e *Engine, h *Handle, x *device.Tensor) error {
			out, err := e.Dispatch(ctx, h, in(e, x))
			return sync(ctx, e, err, out)
		}
	}
	closed := func(t *device.Tensor) *device.Tensor {
		t.Close()
		return t
	}
	cases := []struct {
		name string
		mode Mode // Capacity: MaxRecvTokens and MaxPermutedTokens 1
		call call
		want error // the class of the bad rank's error, and of every rank's unless local or wantPeers
		// wantPeers is the other ranks' class where it differs; local: they
		// succeed (the call touches this rank only).
		wantPeers error
		local     bool
		timeout   time.Duration // Config.Timeout, when not 5 s
		words     []string      // a mismatch: what every rank's message must say
	}{
		{name: "too many tokens", call: layout(func(ctx context.Context, e *Engine) *device.Tensor {
			return onBad(e, routing(ctx, e), zeros(e, device.Int32, T+1, K))
		}), want: ErrInvalidInput},
		{name: "routing dtype", call: layout(func(ctx context.Context, e *Engine) *device.Tensor {
			return onBad(e, routing(ctx, e), zeros(e, device.FP32, T, K))
		}), want: ErrInvalidInput},
		{name: "nil routing", call: layout(func(ctx context.Context, e *Engine) *device.Tensor {
			return onBad(e, routing(ctx, e), nil)
		}), want: ErrInvalidInput},
		{name: "expert out of range", call: layout(func(ctx context.Context, e *Engine) *device.Tensor { return routing(ctx, e, 0, E) }), want: ErrInvalidInput},
		{name: "repeated expert", call: layout(func(ctx context.Context, e *Engine) *device.Tensor { return routing(ctx, e, 3, 3) }), want: ErrInvalidInput},
		{name: "too many tokens, capacity mode", mode: Capacity, call: func(ctx context.Context, e *Engine, _ *Handle, _ *device.Tensor) error {
			h, err := e.Layout(ctx, LayoutInput{TopkIdx: onBad(e, routing(ctx, e), zeros(e, device.Int32, T+1, K))})
			if err == nil {
				defer h.Close()
				err = e.Synchronize(ctx)
			}
			return err
		}, want: ErrInvalidInput},
		{name: "relayout in blocking mode", call: func(ctx context.Context, e *Engine, h *Handle, _ *device.Tensor) error {
			return e.Relayout(ctx, h, LayoutInput{TopkIdx: routing(ctx, e)})
		}, want: ErrInvalidInput},
		{name: "over capacity", mode: Capacity, call: func(ctx context.Context, e *Engine, h *Handle, x *device.Tensor) error {
			out, err := e.Dispatch(ctx, h, DispatchInput{X: x})
			return sync(ctx, e, err, out)
		}, want: ErrCapacityExceeded},
		{name: "x shape", call: dispatch(func(e *Engine, x *device.Tensor) DispatchInput {
			return DispatchInput{X: onBad(e, x, zeros(e, device.BF16, T, H+1))}
		}), want: ErrInvalidInput},
		{name: "x dtype", call: dispatch(func(e *Engine, x *device.Tensor) DispatchInput {
			return DispatchInput{X: onBad(e, x, zeros(e, device.Int32, T, H))}
		}), want: ErrInvalidInput},
		{name: "closed x", call: dispatch(func(e *Engine, x *device.Tensor) DispatchInput {
			return DispatchInput{X: onBad(e, x, closed(zeros(e, device.BF16, T, H)))}
		}), want: ErrInvalidInput},
		{name: "weights shape", call: dispatch(func(e *Engine, x *device.Tensor) DispatchInput {
			return DispatchInput{X: x, TopkWeights: onBad(e, zeros(e, device.FP32, T, K), zeros(e, device.FP32, T, K+1))}
		}), want: ErrInvalidInput},
		{name: "fp8 without scales", call: dispatch(func(e *Engine, x *device.Tensor) DispatchInput {
			return DispatchInput{X: onBad(e, x, zeros(e, device.FP8E4M3, T, H))}
		}), want: ErrInvalidInput},
		{name: "dtype differs between ranks", call: dispatch(func(e *Engine, x *device.Tensor) DispatchInput {
			return DispatchInput{X: onBad(e, x, zeros(e, device.FP32, T, H))}
		}), want: ErrPeerMismatch, words: []string{"dispatch", "bf16", "fp32", "dtype"}},
		{name: "weights on one rank only", call: dispatch(func(e *Engine, x *device.Tensor) DispatchInput {
			return DispatchInput{X: x, TopkWeights: onBad(e, nil, zeros(e, device.FP32, T, K))}
		}), want: ErrPeerMismatch, words: []string{"dispatch", "with weights", "without"}},
		{name: "another call", call: func(ctx context.Context, e *Engine, h *Handle, x *device.Tensor) error {
			if e.Rank() == bad {
				out, err := e.Combine(ctx, h, CombineInput{Z: zeros(e, device.BF16, h.RecvRows(), H)})
				return sync(ctx, e, err, out)
			}
			out, err := e.Dispatch(ctx, h, DispatchInput{X: x})
			return sync(ctx, e, err, out)
		}, want: ErrPeerMismatch, words: []string{"dispatch", "combine"}},
		{name: "another handle", call: func(ctx context.Context, e *Engine, h *Handle, x *device.Tensor) error {
			h2, err := e.Layout(ctx, LayoutInput{TopkIdx: routing(ctx, e)})
			if err != nil {
				return err
			}
			defer h2.Close()
			out, err := e.Dispatch(ctx, pick(e.Rank() == bad, h, h2), DispatchInput{X: x})
			return sync(ctx, e, err, out)
		}, want: ErrPeerMismatch, words: []string{"dispatch", "handle"}},
		{name: "combine rows", call: func(ctx context.Context, e *Engine, h *Handle, _ *device.Tensor) error {
			out, err := e.Combine(ctx, h, CombineInput{Z: zeros(e, device.BF16, h.RecvRows()+pick(e.Rank() == bad, 1, 0), H)})
			return sync(ctx, e, err, out)
		}, want: ErrInvalidInput},
		{name: "unpermute-combine weights", call: func(ctx context.Context, e *Engine, h *Handle, _ *device.Tensor) error {
			w := onBad(e, zeros(e, device.FP32, h.RecvRows(), K), zeros(e, device.FP32, h.RecvRows(), K+1))
			out, err := e.UnpermuteCombine(ctx, h, UnpermuteInput{Y: zeros(e, device.BF16, h.PermutedRows(), H), RecvWeights: w})
			return sync(ctx, e, err, out)
		}, want: ErrInvalidInput},
		{name: "unpermute-combine weights on one rank only", call: func(ctx context.Context, e *Engine, h *Handle, _ *device.Tensor) error {
			w := onBad(e, nil, zeros(e, device.FP32, h.RecvRows(), K))
			out, err := e.UnpermuteCombine(ctx, h, UnpermuteInput{Y: zeros(e, device.BF16, h.PermutedRows(), H), RecvWeights: w})
			return sync(ctx, e, err, out)
		}, want: ErrPeerMismatch, words: []string{"unpermute-combine", "with weights", "without"}},
		{name: "closed output", call: func(ctx context.Context, e *Engine, h *Handle, x *device.Tensor) error {
			out := DispatchPermuteOutput{X: zeros(e, device.BF16, h.PermutedRows(), H), RecvIdx: zeros(e, device.Int32, h.RecvRows(), K)}
			if e.Rank() == bad {
				out.X.Close()
			}
			return sync(ctx, e, e.DispatchPermuteInto(ctx, h, DispatchInput{X: x}, out), out)
		}, want: ErrInvalidInput},
		{name: "nil handle", call: func(ctx context.Context, e *Engine, h *Handle, x *device.Tensor) error {
			out, err := e.Dispatch(ctx, pick(e.Rank() == bad, nil, h), DispatchInput{X: x})
			return sync(ctx, e, err, out)
		}, want: ErrInvalidInput},
		{name: "closed handle", call: func(ctx context.Context, e *Engine, h *Handle, x *device.Tensor) error {
			h2, err := e.Layout(ctx, LayoutInput{TopkIdx: routing(ctx, e)})
			if err != nil {
				return err
			}
			if e.Rank() == bad {
				h2.Close()
			}
			defer h2.Close()
			out, err := e.Dispatch(ctx, h2, DispatchInput{X: x})
			return sync(ctx, e, err, out)
		}, want: ErrClosed, wantPeers: ErrInvalidInput},
		{name: "late rank, then a call on the failed engine", timeout: 300 * time.Millisecond, call: func(ctx context.Context, e *Engine, h *Handle, x *device.Tensor) error {
			if e.Rank() == bad {
				time.Sleep(time.Second)
			}
			out, err := e.Dispatch(ctx, h, DispatchInput{X: x})
			if err = sync(ctx, e, err, out); err == nil {
				return errors.New("the dispatch with a late rank succeeded")
			}
			out, err = e.Dispatch(ctx, h, DispatchInput{X: x})
			return sync(ctx, e, err, out)
		}, want: ErrFailed},
		{name: "permute rows", local: true, call: func(ctx context.Context, e *Engine, h *Handle, _ *device.Tensor) error {
			out, err := e.Permute(ctx, h, PermuteInput{RecvX: zeros(e, device.BF16, h.RecvRows()+pick(e.Rank() == bad, 1, 0), H)})
			return sync(ctx, e, err, out)
		}, want: ErrInvalidInput},
		{name: "unpermute backward dtype", local: true, call: func(ctx context.Context, e *Engine, h *Handle, _ *device.Tensor) error {
			out, err := e.UnpermuteBackward(ctx, h, UnpermuteBackwardInput{
				GradOut: zeros(e, device.BF16, h.RecvRows(), H), Y: zeros(e, onBadDT(e, device.BF16, device.FP32), h.PermutedRows(), H)})
			return sync(ctx, e, err, out)
		}, want: ErrInvalidInput},
	}
	for _, world := range []struct{ R, D int }{{3, 0}, {4, 2}, {4, 1}} {
		for _, tc := range cases {
			t.Run(fmt.Sprintf("R=%d D=%d/%s", world.R, world.D, tc.name), func(t *testing.T) {
				cfg := Config{NumExperts: E, TopK: K, Hidden: H, MaxTokensPerRank: T, Timeout: 5e9, RanksPerDomain: world.D, Mode: tc.mode}
				if tc.timeout != 0 {
					cfg.Timeout = tc.timeout
				}
				if tc.mode == Capacity {
					cfg.MaxRecvTokens, cfg.MaxPermutedTokens = 1, 1
				}
				errs := runRanks(t, world.R, cfg, func(ctx context.Context, e *Engine) error {
					h, err := e.Layout(ctx, LayoutInput{TopkIdx: routing(ctx, e)})
					if err != nil {
						return fmt.Errorf("setup layout: %w", err)
					}
					defer h.Close()
					return tc.call(ctx, e, h, zeros(e, device.BF16, T, H))
				})
				for r, err := range errs {
					want := tc.want
					switch {
					case r != bad && tc.local:
						if err != nil {
							t.Errorf("rank %d: %v; want no error (the fault is rank %d's own)", r, err, bad)
						}
						continue
					case r != bad && tc.wantPeers != nil:
						want = tc.wantPeers
					}
					if err == nil || !errors.Is(err, want) {
						t.Errorf("rank %d: %v; want %v", r, err, want)
						continue
					}
					if bad := checkErrorText(err); len(bad) > 0 {
						t.Errorf("rank %d: %q: %s", r, err, strings.Join(bad, "; "))
					}
					for _, w := range tc.words {
						if !strings.Contains(err.Error(), w) {
							t.Errorf("rank %d: %q does not say %q", r, err, w)
						}
					}
					if testing.Verbose() {
						t.Logf("rank %d: %v", r, err)
					}
				}
			})
		}
	}
}

// TestErrorTextsNew: New's errors, for a config bad on one rank or on
// every rank, name their class once.
func TestErrorTextsNew(t *testing.T) {
	good := Config{NumExperts: 4, TopK: 2, Hidden: 8, MaxTokensPerRank: 4}
	for _, tc := range []struct {
		name string
		cfg  func(r int) Config
		want error
		says string // what every rank's message says
	}{
		{"hidden differs", func(r int) Config {
			c := good
			c.Hidden += 8 * r
			return c
		}, ErrPeerMismatch, "Hidden="},
		{"invalid on every rank", func(int) Config {
			c := good
			c.TopK = 0
			return c
		}, ErrInvalidInput, "TopK is 0"},
		{"invalid on one rank", func(r int) Config {
			c := good
			if r == 1 {
				c.TopK = 0
			}
			return c
		}, nil, "TopK is 0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for r, err := range newEach(t, 2, tc.cfg) {
				if err == nil || (tc.want != nil && !errors.Is(err, tc.want)) {
					t.Errorf("rank %d: %v; want %v", r, err, tc.want)
					continue
				}
				if bad := checkErrorText(err); len(bad) > 0 {
					t.Errorf("rank %d: %q: %s", r, err, strings.Join(bad, "; "))
				}
				if !strings.Contains(err.Error(), tc.says) {
					t.Errorf("rank %d: %q does not say %q", r, err, tc.says)
				}
				if testing.Verbose() {
					t.Logf("rank %d: %v", r, err)
				}
			}
		})
	}
}

// pick is a when cond, else b.
func pick[T any](cond bool, a, b T) T {
	if cond {
		return a
	}
	return b
}
