//go:build !linux || !cgo

package main

// nvmlDriver is "": NVML cannot be loaded in this build.
func nvmlDriver() string { return "" }

func nvmlGPUs() gpuReport {
	return gpuReport{Error: "goep was built without cgo (or not for Linux), so NVML cannot be loaded"}
}
