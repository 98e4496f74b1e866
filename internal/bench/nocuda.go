//go:build !cuda || !cgo

package bench

import (
	"context"

	"github.com/goep/goep/device"
	"github.com/goep/goep/executor"
)

// CUDACompiled reports whether this binary has the cuda backend.
const CUDACompiled = false

func newEventClock(*executor.Engine) (clock, error) { return nil, ErrNoCUDA }

func (st *rankState) runCUDABaseline(context.Context, *executor.Engine, string, device.DType) error {
	return ErrNoCUDA
}
