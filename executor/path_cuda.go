//go:build cuda && cgo

package executor

import (
	"context"

	"github.com/goep/goep/comm"
	"github.com/goep/goep/device"
	"github.com/goep/goep/executor/internal/datapath"
	"github.com/goep/goep/executor/internal/gpu"
)

type gpuOptions = gpu.Options

// newGPUPath creates the CUDA data path (package gpu).
func newGPUPath(ctx context.Context, g comm.Group, b *device.CUDA, env *datapath.Env, s device.Stream, opts gpuOptions) (datapath.Path, error) {
	return gpu.New(ctx, g, b, env, s, opts)
}
