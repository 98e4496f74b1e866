//go:build !cuda || !cgo

package executor

import (
	"context"
	"fmt"

	"github.com/goep/goep/device"
)

// The CUDA data path (cuda.go) is not compiled in this build: New refuses
// a CUDA backend before anything below is called, so these methods exist
// only to keep the shared code building.

type gpuEngine struct{ s device.Stream }

type gpuTables struct{}

func (t *gpuTables) close() {}

func newGPUEngine(ctx context.Context, e *Engine, b *device.CUDA, s device.Stream) (*gpuEngine, error) {
	return nil, fmt.Errorf("executor: CUDA path: %w: not compiled in (build with -tags cuda)", ErrUnsupported)
}

func (g *gpuEngine) layout(ctx context.Context, h *Handle, idx *device.Tensor, sig [4]uint64) error {
	return ErrUnsupported
}
func (g *gpuEngine) reject()                               {}
func (g *gpuEngine) layoutOnGPU() bool                     { return false }
func (g *gpuEngine) hierReject(uint64, error)              {}
func (g *gpuEngine) synchronize(ctx context.Context) error { return ErrUnsupported }
func (g *gpuEngine) close() error                          { return nil }
func (g *gpuEngine) dispatch(*Handle, *device.Tensor, *device.Tensor, *device.Tensor, DispatchOutput) error {
	return ErrUnsupported
}
func (g *gpuEngine) dispatchPermute(*Handle, *device.Tensor, *device.Tensor, *device.Tensor, DispatchPermuteOutput) error {
	return ErrUnsupported
}
func (g *gpuEngine) combine(*Handle, *device.Tensor, *device.Tensor, DispatchBackwardOutput, uint32) error {
	return ErrUnsupported
}
func (g *gpuEngine) unpermuteCombine(*Handle, *device.Tensor, *device.Tensor, *device.Tensor) error {
	return ErrUnsupported
}
func (g *gpuEngine) permute(*Handle, *device.Tensor, *device.Tensor, *device.Tensor, PermuteOutput) error {
	return ErrUnsupported
}
func (g *gpuEngine) unpermuteBackward(*Handle, *device.Tensor, *device.Tensor, *device.Tensor, UnpermuteBackwardOutput) error {
	return ErrUnsupported
}
func (g *gpuEngine) unpermute(*Handle, *device.Tensor, *device.Tensor, *device.Tensor) error {
	return ErrUnsupported
}

func (g *gpuEngine) enqueue(f func() error) error { return f() }
