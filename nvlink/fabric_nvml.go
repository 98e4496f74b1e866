//go:build linux && cgo

package nvlink

import (
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// QueryFabric asks NVML, loaded at run time, for the fabric of the GPU
// with this UUID (the CUDA driver's cuDeviceGetUuid). Without libnvidia-ml
// or the GPU, Err says why.
func QueryFabric(uuid [16]byte) Fabric { return queryFabric(nvml.New(), uuid) }

func queryFabric(lib nvml.Interface, uuid [16]byte) Fabric {
	if ret := lib.Init(); ret != nvml.SUCCESS {
		return Fabric{Err: fmt.Sprintf("nvml: init: %v", lib.ErrorString(ret))}
	}
	defer lib.Shutdown()
	// go-nvml binds symbols lazily: calling one an older libnvidia-ml
	// lacks would end the process.
	if err := lib.Extensions().LookupSymbol("nvmlDeviceGetGpuFabricInfo"); err != nil {
		return Fabric{State: "not supported", Err: "nvml: no fabric query in this driver's NVML (" + err.Error() + ")"}
	}
	id := NVMLUUID(uuid)
	d, ret := lib.DeviceGetHandleByUUID(id)
	if ret != nvml.SUCCESS {
		return Fabric{Err: fmt.Sprintf("nvml: device %s: %v", id, lib.ErrorString(ret))}
	}
	f, ret := d.GetGpuFabricInfo()
	if ret != nvml.SUCCESS {
		// Drivers and GPUs without the query answer NOT_SUPPORTED.
		return Fabric{State: "not supported", Err: fmt.Sprintf("nvml: fabric info of %s: %v", id, lib.ErrorString(ret))}
	}
	out := Fabric{Clique: f.CliqueId, State: FabricState(f.State)}
	if f.ClusterUuid != [16]uint8{} {
		out.Cluster = fmt.Sprintf("%x", f.ClusterUuid[:])
	}
	return out
}

// NVMLUUID formats a CUDA device UUID as NVML names the GPU
// ("GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx").
func NVMLUUID(u [16]byte) string {
	return fmt.Sprintf("GPU-%x-%x-%x-%x-%x", u[0:4], u[4:6], u[6:8], u[8:10], u[10:16])
}

// FabricState names an NVML GPU_FABRIC_STATE value.
func FabricState(s uint8) string {
	switch s {
	case nvml.GPU_FABRIC_STATE_NOT_SUPPORTED:
		return "not supported"
	case nvml.GPU_FABRIC_STATE_NOT_STARTED:
		return "not started"
	case nvml.GPU_FABRIC_STATE_IN_PROGRESS:
		return "in progress"
	case nvml.GPU_FABRIC_STATE_COMPLETED:
		return "completed"
	}
	return fmt.Sprintf("state %d", s)
}
