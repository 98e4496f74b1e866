package executor

import (
	"fmt"

	"github.com/goep/goep/device"
)

// checkTopk validates the routing tensor's shape and dtype on the host.
// Values are checked by the layout on every rank.
func (e *Engine) checkTopk(t *device.Tensor) error {
	if err := checkTensor("TopkIdx", t, device.Int32, -1, e.cfg.TopK); err != nil {
		return err
	}
	if t.Rows() > e.cfg.MaxTokensPerRank {
		return fmt.Errorf("executor: layout: %d tokens exceed MaxTokensPerRank %d: %w", t.Rows(), e.cfg.MaxTokensPerRank, ErrInvalidInput)
	}
	return nil
}

// checkTensor checks a tensor's presence, that it was not closed, its
// dtype (0: BF16 or FP32) and 2-D shape (-1: any rows).
func checkTensor(name string, t *device.Tensor, dt device.DType, rows, cols int) error {
	if t == nil {
		return fmt.Errorf("executor: %s is nil: %w", name, ErrInvalidInput)
	}
	if t.Closed() {
		return fmt.Errorf("executor: %s was closed (its memory is freed): %w", name, ErrInvalidInput)
	}
	switch {
	case dt == 0 && t.DType() == device.FP8E4M3:
		return fmt.Errorf("executor: %s has dtype fp8, want bf16 or fp32: fp8 rows are only moved (Dispatch, DispatchPermute, Permute), never summed or scaled: %w", name, ErrInvalidInput)
	case dt == 0 && t.DType() != device.BF16 && t.DType() != device.FP32:
		return fmt.Errorf("executor: %s has dtype %v, want bf16 or fp32: %w", name, t.DType(), ErrInvalidInput)
	case dt != 0 && t.DType() != dt:
		return fmt.Errorf("executor: %s has dtype %v, want %v: %w", name, t.DType(), dt, ErrInvalidInput)
	}
	// Kernels access elements at their own size (a caller's wrapped
	// device memory may start anywhere).
	if p, n := t.Buffer().DevicePtr(), t.DType().Size(); p%uint64(n) != 0 {
		return fmt.Errorf("executor: %s starts at address %#x, not a multiple of its %v elements' %d bytes: %w", name, p, t.DType(), n, ErrInvalidInput)
	}
	s := t.Shape()
	if len(s) != 2 || (rows >= 0 && s[0] != rows) || s[1] != cols {
		want := fmt.Sprintf("[%d %d]", rows, cols)
		if rows < 0 {
			want = fmt.Sprintf("[T %d]", cols)
		}
		return fmt.Errorf("executor: %s has shape %v, want %s: %w", name, s, want, ErrInvalidInput)
	}
	return nil
}

// checkMoved is checkTensor for rows that are only moved (dispatch and
// permute): bf16, fp32 or fp8.
func checkMoved(name string, t *device.Tensor, rows, cols int) error {
	if t != nil && t.DType() == device.FP8E4M3 {
		return checkTensor(name, t, device.FP8E4M3, rows, cols)
	}
	return checkTensor(name, t, 0, rows, cols)
}

// checkScales checks the scales s of rows x: [rows, Hidden/128] FP32 given
// exactly when x is FP8E4M3 (whose Hidden must then be a multiple of 128).
// x itself was checked before.
func (e *Engine) checkScales(name string, x, s *device.Tensor, rows int) error {
	fp8 := x.DType() == device.FP8E4M3
	switch {
	case !fp8 && s != nil:
		return fmt.Errorf("executor: %s given with %v rows: scales come with fp8 rows only: %w", name, x.DType(), ErrInvalidInput)
	case !fp8:
		return nil
	case e.cfg.Hidden%device.FP8ScaleChannels != 0:
		return fmt.Errorf("executor: %s: fp8 rows need Hidden to be a multiple of %d (one fp32 scale per %d channels), and Hidden is %d: %w",
			name, device.FP8ScaleChannels, device.FP8ScaleChannels, e.cfg.Hidden, ErrInvalidInput)
	case s == nil:
		return fmt.Errorf("executor: %s is nil: fp8 rows need their scales ([rows, Hidden/%d] fp32): %w", name, device.FP8ScaleChannels, ErrInvalidInput)
	}
	return checkTensor(name, s, device.FP32, rows, e.scaleCols())
}

// checkRowDType refuses rows wider than Config.RowDType in a call that
// moves them between ranks (the GPU windows, allocated once, hold rows of
// it); t was checked before.
func (e *Engine) checkRowDType(name string, t *device.Tensor) error {
	if t.DType().Size() > e.cfg.rowDType().Size() {
		return fmt.Errorf("executor: %s has %v rows, wider than Config.RowDType %v (the windows between ranks hold %v rows): %w",
			name, t.DType(), e.cfg.rowDType(), e.cfg.rowDType(), ErrInvalidInput)
	}
	return nil
}

// scaleCols is the number of fp32 scales of an fp8 row.
func (e *Engine) scaleCols() int { return e.cfg.Hidden / device.FP8ScaleChannels }

// checkOptional checks a 2-D output that must be given exactly when want.
func checkOptional(name string, t *device.Tensor, want bool, dt device.DType, rows, cols int) error {
	switch {
	case !want && t != nil:
		return fmt.Errorf("executor: %s given without weights: %w", name, ErrInvalidInput)
	case !want:
		return nil
	}
	return checkTensor(name, t, dt, rows, cols)
}

// checkOptional1 checks a 1-D FP32 output of rows elements that must be
// given exactly when want.
func checkOptional1(name string, t *device.Tensor, want bool, rows int) error {
	switch {
	case !want && t != nil:
		return fmt.Errorf("executor: %s given without weights: %w", name, ErrInvalidInput)
	case !want:
		return nil
	case t == nil:
		return fmt.Errorf("executor: %s is nil: %w", name, ErrInvalidInput)
	case t.Closed():
		return fmt.Errorf("executor: %s was closed (its memory is freed): %w", name, ErrInvalidInput)
	case t.DType() != device.FP32 || len(t.Shape()) != 1 || t.Shape()[0] != rows:
		return fmt.Errorf("executor: %s is %v, want fp32[%d]: %w", name, t, rows, ErrInvalidInput)
	}
	return nil
}
