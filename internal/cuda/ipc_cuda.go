//go:build cuda && cgo

package cuda

/*
#include <stdint.h>
#include <string.h>
#include <cuda.h>

static CUresult goep_ipc_get(CUdeviceptr p, void *out) {
	CUipcMemHandle h;
	CUresult r = cuIpcGetMemHandle(&h, p);
	if (r == CUDA_SUCCESS) memcpy(out, &h, sizeof h);
	return r;
}

static CUresult goep_ipc_open(CUdeviceptr *p, const void *in) {
	CUipcMemHandle h;
	memcpy(&h, in, sizeof h);
	return cuIpcOpenMemHandle(p, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
}

// goep_alloc_prop is the allocation the granularity is asked for and
// cuMemCreate makes: pinned memory of device ordinal, exportable as
// handleTypes.
static CUmemAllocationProp goep_alloc_prop(int ordinal, int handleTypes) {
	CUmemAllocationProp prop;
	memset(&prop, 0, sizeof prop);
	prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
	prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	prop.location.id = ordinal;
	prop.requestedHandleTypes = (CUmemAllocationHandleType)handleTypes;
	return prop;
}

static CUresult goep_mem_create(CUmemGenericAllocationHandle *h, size_t size, int ordinal, int handleTypes) {
	CUmemAllocationProp prop = goep_alloc_prop(ordinal, handleTypes);
	return cuMemCreate(h, size, &prop, 0);
}

static CUresult goep_granularity(size_t *g, int ordinal, int handleTypes) {
	CUmemAllocationProp prop = goep_alloc_prop(ordinal, handleTypes);
	return cuMemGetAllocationGranularity(g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
}

static CUresult goep_set_access(CUdeviceptr p, size_t size, int ordinal) {
	CUmemAccessDesc d;
	memset(&d, 0, sizeof d);
	d.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	d.location.id = ordinal;
	d.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
	return cuMemSetAccess(p, size, &d, 1);
}

static CUresult goep_export_fd(int *fd, CUmemGenericAllocationHandle h) {
	return cuMemExportToShareableHandle(fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
}

static CUresult goep_import_fd(CUmemGenericAllocationHandle *h, int fd) {
	return cuMemImportFromShareableHandle(h, (void *)(uintptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
}

// Fabric handles (CU_MEM_HANDLE_TYPE_FABRIC, CUmemFabricHandle) appeared in
// the CUDA 12.3 headers. Older headers compile these to NOT_SUPPORTED and
// GOEP_HAVE_FABRIC 0, which the Go side reports as ErrUnsupported.
#if CUDA_VERSION >= 12030
#define GOEP_HAVE_FABRIC 1
static CUresult goep_export_fabric(void *out, CUmemGenericAllocationHandle h) {
	CUmemFabricHandle fh;
	CUresult r = cuMemExportToShareableHandle(&fh, h, CU_MEM_HANDLE_TYPE_FABRIC, 0);
	if (r == CUDA_SUCCESS) memcpy(out, &fh, sizeof fh);
	return r;
}
static CUresult goep_import_fabric(CUmemGenericAllocationHandle *h, const void *in) {
	CUmemFabricHandle fh;
	memcpy(&fh, in, sizeof fh);
	return cuMemImportFromShareableHandle(h, &fh, CU_MEM_HANDLE_TYPE_FABRIC);
}
#else
#define GOEP_HAVE_FABRIC 0
static CUresult goep_export_fabric(void *out, CUmemGenericAllocationHandle h) { return CUDA_ERROR_NOT_SUPPORTED; }
static CUresult goep_import_fabric(CUmemGenericAllocationHandle *h, const void *in) { return CUDA_ERROR_NOT_SUPPORTED; }
#endif
*/
import "C"

import (
	"fmt"
	"unsafe"
)

// IPC: memory of one process mapped by another on the same host (legacy
// CUDA IPC; NVLink peers within a node).

// GetIPCHandle exports memory from Device.Alloc (cuMemAlloc) for other
// processes on the host (cuIpcGetMemHandle). Memory from Stream.Alloc (the
// device's memory pool) cannot be exported this way.
func (d *Device) GetIPCHandle(p DevicePtr) (IPCHandle, error) {
	var h IPCHandle
	// The handle is copied through C memory: cgo forbids C keeping a Go
	// pointer, and the copy is 64 bytes.
	buf := C.malloc(C.size_t(len(h)))
	defer C.free(buf)
	err := d.Do(func() error { return result("cuIpcGetMemHandle", C.goep_ipc_get(p.c(), buf)) })
	if err != nil {
		return h, fmt.Errorf("cuda: IPC handle of %#x: %w", uint64(p), err)
	}
	copy(h[:], unsafe.Slice((*byte)(buf), len(h)))
	return h, nil
}

// OpenIPCHandle maps memory exported by another process into this one
// (cuIpcOpenMemHandle with CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) and returns
// its address here. The driver refuses a handle exported by the calling
// process itself (an *Error, CUDA_ERROR_INVALID_CONTEXT on current drivers).
// Unmap it with CloseIPCHandle.
func (d *Device) OpenIPCHandle(h IPCHandle) (DevicePtr, error) {
	buf := C.CBytes(h[:])
	defer C.free(buf)
	var p C.CUdeviceptr
	err := d.Do(func() error { return result("cuIpcOpenMemHandle", C.goep_ipc_open(&p, buf)) })
	if err != nil {
		return 0, fmt.Errorf("cuda: open IPC handle: %w", err)
	}
	return DevicePtr(p), nil
}

// CloseIPCHandle unmaps memory opened with OpenIPCHandle
// (cuIpcCloseMemHandle). Queued work using it must have completed.
func (d *Device) CloseIPCHandle(p DevicePtr) error {
	if err := d.Do(func() error { return result("cuIpcCloseMemHandle", C.cuIpcCloseMemHandle(p.c())) }); err != nil {
		return fmt.Errorf("cuda: close IPC handle %#x: %w", uint64(p), err)
	}
	return nil
}

// VMM: physical allocations, shareable as file descriptors (same host) or
// fabric handles (multi-node NVLink), mapped into reserved address ranges.
// Sizes and addresses are multiples of Granularity.

// Allocation is physical device memory from cuMemCreate or imported from a
// shareable handle (CUmemGenericAllocationHandle).
type Allocation struct {
	d    *Device
	h    C.CUmemGenericAllocationHandle // 0 once released; inside Do only
	size int
	ht   HandleType
}

// Size is the allocation's size in bytes.
func (a *Allocation) Size() int { return a.size }

func (d *Device) vmm(op string, ht HandleType) error {
	if !d.feat.VMM {
		return fmt.Errorf("cuda: %s: %w: device %d has no virtual memory management", op, ErrUnsupported, d.ordinal)
	}
	switch ht {
	case HandleNone:
	case HandlePosixFD:
		if !d.feat.PosixFD {
			return fmt.Errorf("cuda: %s: %w: device %d cannot export file descriptors", op, ErrUnsupported, d.ordinal)
		}
	case HandleFabric:
		if C.GOEP_HAVE_FABRIC == 0 {
			return fmt.Errorf("cuda: %s: %w: fabric handles need CUDA 12.3+ headers, built with %d", op, ErrUnsupported, HeaderVersion)
		}
		if !d.feat.Fabric {
			return fmt.Errorf("cuda: %s: %w: device %d has no fabric handles (no multi-node NVLink, or IMEX not running)", op, ErrUnsupported, d.ordinal)
		}
	default:
		return fmt.Errorf("cuda: %s: unknown handle type %v", op, ht)
	}
	return nil
}

// Granularity is the size and alignment unit of VMM allocations with
// handle type ht (cuMemGetAllocationGranularity, minimum granularity).
func (d *Device) Granularity(ht HandleType) (int, error) {
	if err := d.vmm("granularity", ht); err != nil {
		return 0, err
	}
	var g C.size_t
	err := d.Do(func() error {
		return result("cuMemGetAllocationGranularity", C.goep_granularity(&g, C.int(d.ordinal), C.int(ht)))
	})
	if err != nil {
		return 0, fmt.Errorf("cuda: granularity: %w", err)
	}
	return int(g), nil
}

// MemCreate allocates size bytes (a multiple of Granularity(ht)) of
// physical memory on the device, exportable as ht (cuMemCreate).
func (d *Device) MemCreate(size int, ht HandleType) (*Allocation, error) {
	if err := d.vmm("mem create", ht); err != nil {
		return nil, err
	}
	if size <= 0 {
		return nil, fmt.Errorf("cuda: mem create: size %d, want > 0", size)
	}
	a := &Allocation{d: d, size: size, ht: ht}
	err := d.Do(func() error {
		return result("cuMemCreate", C.goep_mem_create(&a.h, C.size_t(size), C.int(d.ordinal), C.int(ht)))
	})
	if err != nil {
		return nil, fmt.Errorf("cuda: mem create %d bytes (%v): %w", size, ht, err)
	}
	return a, nil
}

func (a *Allocation) do(f func(C.CUmemGenericAllocationHandle) error) error {
	return a.d.Do(func() error {
		if a.h == 0 {
			return fmt.Errorf("cuda: allocation: %w", ErrClosed)
		}
		return f(a.h)
	})
}

// ExportFD exports the allocation as a new file descriptor, to be passed to
// another process on the host (over a Unix socket, or pidfd_getfd) and
// imported with ImportFD (cuMemExportToShareableHandle,
// CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR). The caller closes it.
func (a *Allocation) ExportFD() (int, error) {
	if a.ht != HandlePosixFD {
		return -1, fmt.Errorf("cuda: export fd: allocation created with handle type %v", a.ht)
	}
	var fd C.int
	err := a.do(func(h C.CUmemGenericAllocationHandle) error {
		return result("cuMemExportToShareableHandle", C.goep_export_fd(&fd, h))
	})
	if err != nil {
		return -1, fmt.Errorf("cuda: export fd: %w", err)
	}
	return int(fd), nil
}

// ImportFD imports an allocation of size bytes exported by ExportFD, in this
// or another process (cuMemImportFromShareableHandle). fd stays the
// caller's to close.
func (d *Device) ImportFD(fd, size int) (*Allocation, error) {
	if err := d.vmm("import fd", HandlePosixFD); err != nil {
		return nil, err
	}
	a := &Allocation{d: d, size: size, ht: HandlePosixFD}
	err := d.Do(func() error {
		return result("cuMemImportFromShareableHandle", C.goep_import_fd(&a.h, C.int(fd)))
	})
	if err != nil {
		return nil, fmt.Errorf("cuda: import fd %d: %w", fd, err)
	}
	return a, nil
}

// ExportFabric exports the allocation as a fabric handle, valid on every
// host of the NVLink domain (cuMemExportToShareableHandle,
// CU_MEM_HANDLE_TYPE_FABRIC; CUDA 12.3+ headers, IMEX on GB200/GB300).
func (a *Allocation) ExportFabric() (FabricHandle, error) {
	var fh FabricHandle
	if err := a.d.vmm("export fabric handle", HandleFabric); err != nil {
		return fh, err
	}
	if a.ht != HandleFabric {
		return fh, fmt.Errorf("cuda: export fabric handle: allocation created with handle type %v", a.ht)
	}
	buf := C.malloc(C.size_t(len(fh)))
	defer C.free(buf)
	err := a.do(func(h C.CUmemGenericAllocationHandle) error {
		return result("cuMemExportToShareableHandle", C.goep_export_fabric(buf, h))
	})
	if err != nil {
		return fh, fmt.Errorf("cuda: export fabric handle: %w", err)
	}
	copy(fh[:], unsafe.Slice((*byte)(buf), len(fh)))
	return fh, nil
}

// ImportFabric imports an allocation of size bytes from a fabric handle
// (cuMemImportFromShareableHandle, CU_MEM_HANDLE_TYPE_FABRIC).
func (d *Device) ImportFabric(fh FabricHandle, size int) (*Allocation, error) {
	if err := d.vmm("import fabric handle", HandleFabric); err != nil {
		return nil, err
	}
	buf := C.CBytes(fh[:])
	defer C.free(buf)
	a := &Allocation{d: d, size: size, ht: HandleFabric}
	err := d.Do(func() error {
		return result("cuMemImportFromShareableHandle", C.goep_import_fabric(&a.h, buf))
	})
	if err != nil {
		return nil, fmt.Errorf("cuda: import fabric handle: %w", err)
	}
	return a, nil
}

// Release drops this handle to the physical memory (cuMemRelease); the
// memory is freed when it is also unmapped everywhere. A second Release
// returns nil.
func (a *Allocation) Release() error { return a.ReleaseOn(a.d) }

// ReleaseOn is Release through d, another Device of the same GPU (the one
// that created or imported a may be closed by now: goroutine ranks of one
// process each open the GPU's primary context).
func (a *Allocation) ReleaseOn(d *Device) error {
	if d.ordinal != a.d.ordinal {
		return fmt.Errorf("cuda: release: allocation of device %d through device %d", a.d.ordinal, d.ordinal)
	}
	return release(d, &a.h, "cuMemRelease", func(h C.CUmemGenericAllocationHandle) C.CUresult { return C.cuMemRelease(h) })
}

// AddressReserve reserves size bytes of virtual address space, aligned to
// align (0: the granularity) (cuMemAddressReserve).
func (d *Device) AddressReserve(size, align int) (DevicePtr, error) {
	if err := d.vmm("address reserve", HandleNone); err != nil {
		return 0, err
	}
	var p C.CUdeviceptr
	err := d.Do(func() error {
		return result("cuMemAddressReserve", C.cuMemAddressReserve(&p, C.size_t(size), C.size_t(align), 0, 0))
	})
	if err != nil {
		return 0, fmt.Errorf("cuda: reserve %d bytes: %w", size, err)
	}
	return DevicePtr(p), nil
}

// AddressFree returns a range from AddressReserve (cuMemAddressFree); it
// must be unmapped.
func (d *Device) AddressFree(p DevicePtr, size int) error {
	if err := d.Do(func() error {
		return result("cuMemAddressFree", C.cuMemAddressFree(p.c(), C.size_t(size)))
	}); err != nil {
		return fmt.Errorf("cuda: free address range %#x: %w", uint64(p), err)
	}
	return nil
}

// Map maps all of a at p, inside a reserved range, and makes it readable and
// writable by this device (cuMemMap, cuMemSetAccess); a belongs to d (an
// imported allocation belongs to the device that imported it). A failed
// access grant unmaps again.
func (d *Device) Map(p DevicePtr, a *Allocation) error {
	if a.d != d {
		return fmt.Errorf("cuda: map: allocation of device %d on device %d", a.d.ordinal, d.ordinal)
	}
	err := a.do(func(h C.CUmemGenericAllocationHandle) error {
		if err := result("cuMemMap", C.cuMemMap(p.c(), C.size_t(a.size), 0, h, 0)); err != nil {
			return err
		}
		if err := result("cuMemSetAccess", C.goep_set_access(p.c(), C.size_t(a.size), C.int(d.ordinal))); err != nil {
			if uerr := result("cuMemUnmap", C.cuMemUnmap(p.c(), C.size_t(a.size))); uerr != nil {
				return fmt.Errorf("%w (and %v)", err, uerr)
			}
			return err
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("cuda: map %d bytes at %#x: %w", a.size, uint64(p), err)
	}
	return nil
}

// Unmap unmaps size bytes at p (cuMemUnmap). Queued work using the range
// must have completed.
func (d *Device) Unmap(p DevicePtr, size int) error {
	if err := d.Do(func() error { return result("cuMemUnmap", C.cuMemUnmap(p.c(), C.size_t(size))) }); err != nil {
		return fmt.Errorf("cuda: unmap %#x: %w", uint64(p), err)
	}
	return nil
}
