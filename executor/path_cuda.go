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

// fabrics caches NVML's fabric answer by GPU: a GPU's fabric clique does
// not change while the process runs, and NVML's initialization is slow to
// pay per engine.
var fabrics sync.Map // [16]byte -> nvlink.Fabric

// fabricKey is this rank's GPU's domain key as a member of a multi-node
// NVLink fabric clique (nvlink.Fabric.Key), once its driver has shared a
// probe allocation by fabric handle (each time: a refusal may pass); else
// "" and why not.
func fabricKey(b *device.CUDA) (key, why string) {
	uuid := b.Driver().UUID()
	v, ok := fabrics.Load(uuid)
	if !ok {
		v, _ = fabrics.LoadOrStore(uuid, nvlink.QueryFabric(uuid))
	}
	key, why = v.(nvlink.Fabric).Key()
	if key != "" {
		if err := b.ProbeShare(device.ShareFabric); err != nil {
			key, why = "", "fabric handles refused: "+err.Error()
		}
	}
	return key, why
}
