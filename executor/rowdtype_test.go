package executor

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/goep/goep/device"
)

// TestRowDType: an engine whose Config.RowDType is bf16 refuses fp32 rows in
// every call that moves rows between ranks, on every rank, naming the call
// and the setting; bf16 and fp8 rows still go, and the local calls take
// fp32. RowDType must be bf16 or fp32, and bf16 halves the GPU windows'
// rows (NewGPUFootprint).
func TestRowDType(t *testing.T) {
	const E, K, H, T = 4, 2, 256, 3
	cfg := Config{NumExperts: E, TopK: K, Hidden: H, MaxTokensPerRank: T, RowDType: device.BF16}
	type call struct {
		name string
		run  func(ctx context.Context, e *Engine, h *Handle, dt device.DType) error
	}
	calls := []call{
		{"dispatch: X", func(ctx context.Context, e *Engine, h *Handle, dt device.DType) error {
			o, err := e.Dispatch(ctx, h, DispatchInput{X: zeros(e, dt, T, H)})
			o.Close()
			return err
		}},
		{"combine: Z", func(ctx context.Context, e *Engine, h *Handle, dt device.DType) error {
			o, err := e.Combine(ctx, h, CombineInput{Z: zeros(e, dt, h.RecvRows(), H)})
			o.Close()
			return err
		}},
		{"dispatch: X", func(ctx context.Context, e *Engine, h *Handle, dt device.DType) error { // DispatchPermute
			o, err := e.DispatchPermute(ctx, h, DispatchInput{X: zeros(e, dt, T, H)})
			o.Close()
			return err
		}},
		{"unpermute-combine: Y", func(ctx context.Context, e *Engine, h *Handle, dt device.DType) error {
			o, err := e.UnpermuteCombine(ctx, h, UnpermuteInput{Y: zeros(e, dt, h.PermutedRows(), H)})
			o.Close()
			return err
		}},
		{"dispatch backward: GradRecvX", func(ctx context.Context, e *Engine, h *Handle, dt device.DType) error {
			o, err := e.DispatchBackward(ctx, h, DispatchBackwardInput{GradRecvX: zeros(e, dt, h.RecvRows(), H)})
			o.GradX.Close()
			return err
		}},
		{"dispatch: X", func(ctx context.Context, e *Engine, h *Handle, dt device.DType) error { // CombineBackward
			o, err := e.CombineBackward(ctx, h, zeros(e, dt, T, H))
			o.Close()
			return err
		}},
	}
	errs := runRanks(t, 2, cfg, func(ctx context.Context, e *Engine) error {
		idx, err := upload(ctx, e, device.Int32, device.EncodeInt32([]int32{0, 1, 2, 3, 1, 2}), T, K)
		if err != nil {
			return err
		}
		h, err := e.Layout(ctx, LayoutInput{TopkIdx: idx})
		if err != nil {
			return err
		}
		for i, c := range calls {
			err := c.run(ctx, e, h, device.FP32)
			if !errors.Is(err, ErrInvalidInput) || !strings.Contains(err.Error(), c.name+" has fp32 rows, wider than Config.RowDType bf16") {
				return fmt.Errorf("call %d with fp32 rows: %v; want ErrInvalidInput naming %s and RowDType", i, err, c.name)
			}
			if err := c.run(ctx, e, h, device.BF16); err != nil {
				return err
			}
		}
		o, err := e.Dispatch(ctx, h, DispatchInput{X: zeros(e, device.FP8E4M3, T, H), XScales: zeros(e, device.FP32, T, H/device.FP8ScaleChannels)})
		if err != nil {
			return err
		}
		o.Close()
		// A local call takes fp32 rows whatever RowDType says.
		p, err := e.Permute(ctx, h, PermuteInput{RecvX: zeros(e, device.FP32, h.RecvRows(), H)})
		if err != nil {
			return err
		}
		p.Close()
		return e.Synchronize(ctx)
	})
	for r, err := range errs {
		if err != nil {
			t.Errorf("rank %d: %v", r, err)
		}
	}

	for _, dt := range []device.DType{device.FP8E4M3, device.Int32} {
		bad := cfg
		bad.RowDType = dt
		if err := bad.Validate(); err == nil || !strings.Contains(err.Error(), "RowDType is") {
			t.Errorf("RowDType %v: %v, want an error naming RowDType", dt, err)
		}
	}
	f32, err := NewGPUFootprint(Config{NumExperts: 256, TopK: 8, Hidden: 7168, MaxTokensPerRank: 4096}, 8)
	if err != nil {
		t.Fatal(err)
	}
	bf16, err := NewGPUFootprint(Config{NumExperts: 256, TopK: 8, Hidden: 7168, MaxTokensPerRank: 4096, RowDType: device.BF16}, 8)
	if err != nil {
		t.Fatal(err)
	}
	// The rows are 7168 x 4 or x 2 bytes; weights (8 x 4) and flags (8)
	// a row stay.
	if rows := f32.RecvRows; f32.Recv-bf16.Recv != rows*7168*2 || f32.Combine-bf16.Combine != f32.CombineRows*7168*2 {
		t.Errorf("bf16 windows: receive %d, combine %d bytes; fp32 %d, %d: want each smaller by its rows x 7168 x 2", bf16.Recv, bf16.Combine, f32.Recv, f32.Combine)
	}
}
