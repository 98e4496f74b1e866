//go:build !cuda || !cgo

package executor

import (
	"context"
	"fmt"

	"github.com/goep/goep/comm"
	"github.com/goep/goep/device"
	"github.com/goep/goep/executor/internal/datapath"
)

// newGPUPath fails: the CUDA data path (package gpu) is compiled in with
// the cuda tag (and cgo) only.
func newGPUPath(ctx context.Context, g comm.Group, b *device.CUDA, env *datapath.Env, s device.Stream, opts gpuOptions) (datapath.Path, error) {
	return nil, fmt.Errorf("executor: CUDA path: %w: not compiled in (build with -tags cuda)", ErrUnsupported)
}

// gpuOptions are package gpu's Options (the environment's choices for the
// CUDA path), which the engine reads with or without the cuda tag.
type gpuOptions struct {
	SharedMemory, HostStaging, MultiKernel, Probe bool
	LinkPace                                      float64
	Share                                         device.ShareKind
	CrossHost                                     string
}

// fabricKey: without CUDA no GPU memory is shared.
func fabricKey(b *device.CUDA) (key, why string) {
	return "", "the CUDA path is not compiled in"
}
