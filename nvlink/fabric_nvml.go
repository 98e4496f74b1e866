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
	id := NVMLUUID(uuid)
	d, ret := lib.DeviceGetHandleByUUID(id)
	if ret != nvml.SUCCESS {
		return Fabric{Err: fmt.Sprintf("nvml: device %s: %v", id, lib.ErrorString(ret))}
	}
	f := DeviceFabric(lib, d)
	if f.Err != "" {
		f.Err = fmt.Sprintf("nvml: fabric info of %s: %s", id, f.Err)
	}
	return f
}

// DeviceFabric is NVML's fabric answer for device d of lib (initialized);
// where NVML cannot say, Err says why (GPUs and drivers without the query
// answer NOT_SUPPORTED).
func DeviceFabric(lib nvml.Interface, d nvml.Device) Fabric {
	// go-nvml binds symbols lazily: calling one an older libnvidia-ml
	// lacks would end the process.
	if err := lib.Extensions().LookupSymbol("nvmlDeviceGetGpuFabricInfo"); err != nil {
		return Fabric{Err: "no fabric query in this driver's NVML (" + err.Error() + ")"}
	}
	f, ret := d.GetGpuFabricInfo()
	if ret != nvml.SUCCESS {
		return Fabric{Err: lib.ErrorString(ret)}
	}
	out := Fabric{Clique: f.CliqueId, State: fabricState(f.State)}
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

// fabricState names an NVML GPU_FABRIC_STATE value.
func fabricState(s uint8) string {
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
