//go:build linux && cgo

package main

import (
	"fmt"
	"slices"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/goep/goep/nvlink"
)

// topoNVML is the NVML topo asks (a fake in tests).
var topoNVML nvml.Interface = nvml.New()

// nvmlGPUs asks NVML, loaded at run time, for the GPUs, their NVLinks and
// fabric; without libnvidia-ml or a GPU the report says why.
func nvmlGPUs() gpuReport {
	lib := topoNVML
	var rep gpuReport
	if ret := lib.Init(); ret != nvml.SUCCESS {
		rep.Error = fmt.Sprintf("nvml: init: %v", lib.ErrorString(ret))
		return rep
	}
	defer lib.Shutdown()
	rep.Driver, _ = lib.SystemGetDriverVersion()
	n, ret := lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		rep.Error = fmt.Sprintf("nvml: device count: %v", lib.ErrorString(ret))
		return rep
	}
	for i := range n {
		d, ret := lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			rep.Devices = append(rep.Devices, gpuDev{Index: i, Name: "(" + lib.ErrorString(ret) + ")"})
			continue
		}
		g := gpuDev{Index: i}
		g.Name, _ = d.GetName()
		g.UUID, _ = d.GetUUID()
		if pci, ret := d.GetPciInfo(); ret == nvml.SUCCESS {
			g.BusID = busID(pci)
		}
		if m, ret := d.GetMemoryInfo(); ret == nvml.SUCCESS {
			g.MemBytes = m.Total
		}
		for link := range nvml.NVLINK_MAX_LINKS {
			st, ret := d.GetNvLinkState(link)
			if ret != nvml.SUCCESS || st != nvml.FEATURE_ENABLED {
				continue
			}
			g.NVLinks++
			if pci, ret := d.GetNvLinkRemotePciInfo(link); ret == nvml.SUCCESS {
				if id := busID(pci); !slices.Contains(g.NVLinkPeers, id) {
					g.NVLinkPeers = append(g.NVLinkPeers, id)
				}
			}
		}
		if f := nvlink.DeviceFabric(lib, d); f.Err != "" {
			g.FabricState = "not reported (" + f.Err + ")"
		} else {
			g.FabricCluster, g.FabricClique, g.FabricState = f.Cluster, f.Clique, f.State
		}
		rep.Devices = append(rep.Devices, g)
	}
	return rep
}

// nvmlDriver is the driver version NVML reports ("580.159.04"), or ""
// when NVML cannot be loaded.
func nvmlDriver() string {
	lib := topoNVML
	if ret := lib.Init(); ret != nvml.SUCCESS {
		return ""
	}
	defer lib.Shutdown()
	v, ret := lib.SystemGetDriverVersion()
	if ret != nvml.SUCCESS {
		return ""
	}
	return v
}

func busID(p nvml.PciInfo) string {
	b := make([]byte, 0, len(p.BusId))
	for _, c := range p.BusId {
		if c == 0 {
			break
		}
		b = append(b, byte(c))
	}
	return string(b)
}
