//go:build cuda && cgo

package executor

import (
	"context"
	"sync"

	"github.com/goep/goep/comm"
	"github.com/goep/goep/device"
	"github.com/goep/goep/executor/internal/datapath"
	"github.com/goep/goep/executor/internal/gpu"
	"github.com/goep/goep/nvlink"
)

type gpuOptions = gpu.Options

// newGPUPath creates the CUDA data path (package gpu).
func newGPUPath(ctx context.Context, g comm.Group, b *device.CUDA, env *datapath.Env, s device.Stream, opts gpuOptions) (datapath.Path, error) {
	return gpu.New(ctx, g, b, env, s, opts)
}

// fabricKeys caches fabricKey by GPU: a GPU's fabric clique, and whether
// its driver shares memory by fabric handles, do not change while the
// process runs, and NVML's initialization is slow to pay per engine.
var fabricKeys sync.Map // [16]byte -> [2]string

// fabricKey is this rank's GPU's domain key as a member of a multi-node
// NVLink fabric clique (nvlink.Fabric.Key), once its driver has shared a
// probe allocation by fabric handle; else "" and why not.
func fabricKey(b *device.CUDA) (key, why string) {
	uuid := b.Driver().UUID()
	if v, ok := fabricKeys.Load(uuid); ok {
		kw := v.([2]string)
		return kw[0], kw[1]
	}
	key, why = nvlink.QueryFabric(uuid).Key()
	if key != "" {
		if err := b.ProbeShare(device.ShareFabric); err != nil {
			key, why = "", "fabric handles refused: "+err.Error()
		}
	}
	fabricKeys.Store(uuid, [2]string{key, why})
	return key, why
}
