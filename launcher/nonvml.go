//go:build !linux || !cgo

package launcher

import "errors"

// cpuSet stands in for unix.CPUSet where there is no NVML binding.
type cpuSet struct{}

func gpuCPUs(int) (cpuSet, error) {
	return cpuSet{}, errors.New("no NVML: goep was built without cgo (or not for Linux)")
}

func bindCPUs(cpuSet) (int, error) { return 0, errors.New("no CPU binding on this platform") }
