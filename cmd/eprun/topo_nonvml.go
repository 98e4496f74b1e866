//go:build !linux || !cgo

package main

func nvmlGPUs() gpuReport {
	return gpuReport{Error: "goep was built without cgo (or not for Linux), so NVML cannot be loaded"}
}
