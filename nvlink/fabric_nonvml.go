//go:build !linux || !cgo

package nvlink

// QueryFabric cannot ask NVML in this build (NVML is loaded through cgo
// on Linux).
func QueryFabric(uuid [16]byte) Fabric {
	return Fabric{Err: "no NVML in this build (it needs cgo on Linux)"}
}
