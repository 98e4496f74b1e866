package cuda

import "strconv"

// DevicePtr is a device virtual address (CUdeviceptr). With unified virtual
// addressing it names one location in every context of the process.
type DevicePtr uint64

// Dim3 is a grid or block shape; a zero component counts as 1.
type Dim3 struct{ X, Y, Z uint32 }

// IPCHandle is an opaque CUipcMemHandle (cuIpcGetMemHandle): 64 bytes that
// another process on the same host opens with OpenIPCHandle.
type IPCHandle [64]byte

// FabricHandle is an opaque CUmemFabricHandle: 64 bytes that a process on
// any host of the same multi-node NVLink domain (GB200/GB300) imports.
type FabricHandle [64]byte

// HandleType selects how a VMM allocation can be shared
// (CUmemAllocationHandleType).
type HandleType int

// The handle types. The values are the driver's.
const (
	HandleNone    HandleType = 0x0 // CU_MEM_HANDLE_TYPE_NONE: not shareable
	HandlePosixFD HandleType = 0x1 // CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR: same host
	HandleFabric  HandleType = 0x8 // CU_MEM_HANDLE_TYPE_FABRIC (CUDA 12.3+): NVLink fabric
)

func (h HandleType) String() string {
	switch h {
	case HandleNone:
		return "none"
	case HandlePosixFD:
		return "posix-fd"
	case HandleFabric:
		return "fabric"
	}
	return "HandleType(" + strconv.Itoa(int(h)) + ")"
}
