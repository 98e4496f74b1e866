//go:build linux && cgo

package launcher

import (
	"fmt"
	"math/bits"
	"os"
	"strconv"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"golang.org/x/sys/unix"
)

// gpuCPUs asks NVML for the CPUs near GPU dev (an index among the GPUs this
// process sees: CUDA_VISIBLE_DEVICES is honoured). NVML is loaded at run
// time; without libnvidia-ml or a GPU this is an error, not a crash.
func gpuCPUs(dev int) (unix.CPUSet, error) {
	var set unix.CPUSet
	if ret := nvml.Init(); ret != nvml.SUCCESS {
		return set, fmt.Errorf("nvml: init: %v", nvml.ErrorString(ret))
	}
	defer nvml.Shutdown()
	d, err := nvmlDevice(dev)
	if err != nil {
		return set, err
	}
	const maxCPUs = 8 * 1024
	words, ret := d.GetCpuAffinity(maxCPUs)
	if ret != nvml.SUCCESS {
		return set, fmt.Errorf("nvml: cpu affinity of device %d: %v", dev, nvml.ErrorString(ret))
	}
	for w, word := range words {
		for b := range bits.UintSize {
			if word&(1<<b) != 0 {
				set.Set(w*bits.UintSize + b) // ignores CPUs beyond CPUSet
			}
		}
	}
	if set.Count() == 0 {
		return set, fmt.Errorf("nvml: device %d reports no CPUs", dev)
	}
	return set, nil
}

func nvmlDevice(dev int) (nvml.Device, error) {
	vis, ok := os.LookupEnv("CUDA_VISIBLE_DEVICES")
	if !ok {
		d, ret := nvml.DeviceGetHandleByIndex(dev)
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("nvml: device %d: %v", dev, nvml.ErrorString(ret))
		}
		return d, nil
	}
	ids := strings.Split(vis, ",")
	if dev >= len(ids) {
		return nil, fmt.Errorf("device %d: CUDA_VISIBLE_DEVICES=%q lists %d", dev, vis, len(ids))
	}
	id := strings.TrimSpace(ids[dev])
	if strings.HasPrefix(id, "GPU-") || strings.HasPrefix(id, "MIG-") {
		d, ret := nvml.DeviceGetHandleByUUID(id)
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("nvml: device %s: %v", id, nvml.ErrorString(ret))
		}
		return d, nil
	}
	i, err := strconv.Atoi(id)
	if err != nil {
		return nil, fmt.Errorf("device %d: CUDA_VISIBLE_DEVICES entry %q is neither an index nor a UUID", dev, id)
	}
	d, ret := nvml.DeviceGetHandleByIndex(i)
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("nvml: device %d (CUDA_VISIBLE_DEVICES %q): %v", i, vis, nvml.ErrorString(ret))
	}
	return d, nil
}
