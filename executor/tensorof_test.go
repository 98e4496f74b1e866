package executor

import (
	"bytes"
	"context"
	"fmt"
	"testing"

	"github.com/goep/goep/device"
)

// overBuffer returns a tensor of shape [rows, cols] whose buffer holds
// data and then as many bytes again of fill (device.TensorOf over a larger
// buffer, as a caller's wrapped tensor may be).
func overBuffer(ctx context.Context, e *Engine, dt device.DType, data, fill []byte, rows, cols int) (*device.Tensor, error) {
	big, err := upload(ctx, e, dt, append(append([]byte(nil), data...), fill...), 2*rows, cols)
	if err != nil {
		return nil, err
	}
	return device.TensorOf(big.Buffer(), dt, rows, cols)
}

// TestTensorsOverLargerBuffers: inputs that are TensorOf views of the
// start of larger buffers, whose rest holds other valid routing and rows,
// give exactly the results of tensors of their own (the layout once read
// the whole buffer as routing: wrong counts, and a crash in a later
// call), and Upload and Download move exactly the tensor's bytes.
func TestTensorsOverLargerBuffers(t *testing.T) {
	const R, E, K, H, T = 2, 8, 2, 16, 64
	dt := device.FP32
	cfg := Config{NumExperts: E, TopK: K, Hidden: H, MaxTokensPerRank: 2 * T}
	want := make([][]byte, R)
	runRanks(t, R, cfg, func(ctx context.Context, e *Engine) (err error) {
		idx, x, w := rankInputs(11, e.Rank(), T, K, E, H, dt)
		want[e.Rank()], err = pipeline(ctx, e, idx, x, w, T, dt, false)
		return err
	})
	errs := runRanks(t, R, cfg, func(ctx context.Context, e *Engine) error {
		r := e.Rank()
		idx, x, w := rankInputs(11, r, T, K, E, H, dt)
		// The rest of each buffer: other tokens, all routed to expert 0,
		// which would change every rank's counts if read.
		other := make([]int32, T*K)
		for i := range other {
			other[i] = int32(i % K * (E / 2))
		}
		ti, err := overBuffer(ctx, e, device.Int32, device.EncodeInt32(idx), device.EncodeInt32(other), T, K)
		if err != nil {
			return err
		}
		xt, err := overBuffer(ctx, e, dt, x, bytes.Repeat([]byte{0x7f}, len(x)), T, H)
		if err != nil {
			return err
		}
		wt, err := overBuffer(ctx, e, device.FP32, device.EncodeFloat32(device.FP32, w), make([]byte, T*K*4), T, K)
		if err != nil {
			return err
		}
		got, err := device.Download(ctx, ti)
		if err != nil {
			return err
		}
		if !bytes.Equal(got, device.EncodeInt32(idx)) {
			return fmt.Errorf("rank %d: Download of a [%d, %d] tensor over a larger buffer: %d bytes, want its %d", r, T, K, len(got), T*K*4)
		}
		whole := device.EncodeInt32(append(append([]int32(nil), idx...), other...))
		if err := device.Upload(ctx, ti, whole); err == nil {
			return fmt.Errorf("rank %d: Upload of the whole buffer's bytes into a tensor of half of it succeeded", r)
		}
		h, err := e.Layout(ctx, LayoutInput{TopkIdx: ti})
		if err != nil {
			return err
		}
		if h.NumTokens() != T {
			return fmt.Errorf("rank %d: layout of %d tokens over a larger buffer: handle has %d", r, T, h.NumTokens())
		}
		dp, err := e.DispatchPermute(ctx, h, DispatchInput{X: xt, TopkWeights: wt})
		if err != nil {
			return err
		}
		y, err := e.Unpermute(ctx, h, UnpermuteInput{Y: dp.X, RecvWeights: dp.RecvWeights})
		if err != nil {
			return err
		}
		out, err := e.Combine(ctx, h, CombineInput{Z: y})
		if err != nil {
			return err
		}
		got, err = device.Download(ctx, out)
		if err != nil {
			return err
		}
		if !bytes.Equal(got, want[r]) {
			return fmt.Errorf("rank %d: combined output differs from the run with tensors of their own buffers", r)
		}
		return nil
	})
	for _, err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
}
