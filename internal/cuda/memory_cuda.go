//go:build cuda && cgo

package cuda

/*
#include <cuda.h>
#include <string.h>

// goep_pool_create makes a stream-ordered memory pool of device ordinal
// whose freed memory stays reserved for reuse (release threshold: all of
// it) until trimmed or destroyed.
static CUresult goep_pool_create(CUmemoryPool *pool, int ordinal) {
	CUmemPoolProps props;
	memset(&props, 0, sizeof props);
	props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
	props.handleTypes = CU_MEM_HANDLE_TYPE_NONE;
	props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	props.location.id = ordinal;
	CUresult r = cuMemPoolCreate(pool, &props);
	if (r != CUDA_SUCCESS) {
		return r;
	}
	cuuint64_t all = ~(cuuint64_t)0;
	r = cuMemPoolSetAttribute(*pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &all);
	if (r != CUDA_SUCCESS) {
		cuMemPoolDestroy(*pool);
	}
	return r;
}

static CUresult goep_pool_reserved(CUmemoryPool pool, unsigned long long *n) {
	cuuint64_t v = 0;
	CUresult r = cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &v);
	*n = v;
	return r;
}
*/
import "C"

import (
	"errors"
	"fmt"
	"runtime"
	"unsafe"
)

// deferredFree is a cuMemAlloc'd block whose free waits for an event.
type deferredFree struct {
	ptr DevicePtr
	ev  C.CUevent
}

func checkSize(op string, n int) error {
	if n < 0 {
		return fmt.Errorf("cuda: %s: negative size %d", op, n)
	}
	return nil
}

// Alloc returns n bytes of device memory usable by work enqueued on s after
// this call (cuMemAllocFromPoolAsync from the device's pool, see
// Device.TrimPool). On a
// device without memory pools (Features.MemoryPools false) it falls back to
// cuMemAlloc, which is not stream-ordered but returns memory that no queued
// work uses. n == 0 returns the null pointer, which Free accepts.
//
// Memory from Alloc cannot be exported with GetIPCHandle (the pool is not
// IPC-capable); use Device.Alloc for that.
func (s *Stream) Alloc(n int) (DevicePtr, error) {
	if err := checkSize("alloc", n); err != nil || n == 0 {
		return 0, err
	}
	var p C.CUdeviceptr
	err := s.do(func(cs C.CUstream) error {
		if err := s.d.reapDeferred(false); err != nil {
			return err
		}
		if s.d.pool != nil {
			return result("cuMemAllocFromPoolAsync", C.cuMemAllocFromPoolAsync(&p, C.size_t(n), s.d.pool, cs))
		}
		if s.d.feat.MemoryPools { // the pool could not be made (PoolError)
			return result("cuMemAllocAsync", C.cuMemAllocAsync(&p, C.size_t(n), cs))
		}
		return result("cuMemAlloc", C.cuMemAlloc(&p, C.size_t(n)))
	})
	if err != nil {
		return 0, fmt.Errorf("cuda: alloc %d bytes: %w", n, err)
	}
	return DevicePtr(p), nil
}

// Free returns p, from Alloc on any stream of the device, once the work
// enqueued on s before this call is done (cuMemFreeAsync). Without memory
// pools it records an event on s and calls cuMemFree when the event has
// completed (checked on later allocations and at Device.Close). Work on
// other streams that uses p must be ordered before s's current work (an
// event and WaitEvent), as for cuMemFreeAsync.
func (s *Stream) Free(p DevicePtr) error {
	if p == 0 {
		return nil
	}
	err := s.do(func(cs C.CUstream) error {
		if s.d.feat.MemoryPools {
			return result("cuMemFreeAsync", C.cuMemFreeAsync(p.c(), cs))
		}
		var ev C.CUevent
		if err := result("cuEventCreate", C.cuEventCreate(&ev, C.CU_EVENT_DISABLE_TIMING)); err != nil {
			return err
		}
		if err := result("cuEventRecord", C.cuEventRecord(ev, cs)); err != nil {
			return errors.Join(err, result("cuEventDestroy", C.cuEventDestroy(ev)))
		}
		s.d.deferred = append(s.d.deferred, deferredFree{ptr: p, ev: ev})
		return nil
	})
	if err != nil {
		return fmt.Errorf("cuda: free %#x: %w", uint64(p), err)
	}
	return nil
}

// reapDeferred frees the deferred blocks whose events have completed
// (cuEventQuery, cuMemFree, cuEventDestroy); with wait it waits for each
// (cuEventSynchronize). Worker only.
func (d *Device) reapDeferred(wait bool) error {
	var errs []error
	keep := d.deferred[:0]
	for _, f := range d.deferred {
		var r C.CUresult
		if wait {
			r = C.cuEventSynchronize(f.ev)
		} else {
			r = C.cuEventQuery(f.ev)
		}
		if r == C.CUDA_ERROR_NOT_READY {
			keep = append(keep, f)
			continue
		}
		if err := result("cuEventQuery", r); err != nil {
			// The stream failed; the memory may still be in use by
			// nothing, but the safe choice is to leak it.
			errs = append(errs, err)
		} else {
			errs = append(errs, result("cuMemFree", C.cuMemFree(f.ptr.c())))
		}
		errs = append(errs, result("cuEventDestroy", C.cuEventDestroy(f.ev)))
	}
	clear(d.deferred[len(keep):])
	d.deferred = keep
	return errors.Join(errs...)
}

// Alloc returns n bytes of device memory that is not stream-ordered
// (cuMemAlloc): for long-lived buffers, and for memory exported with
// GetIPCHandle. Free it with Device.Free after the work using it is done.
func (d *Device) Alloc(n int) (DevicePtr, error) {
	if err := checkSize("alloc", n); err != nil || n == 0 {
		return 0, err
	}
	var p C.CUdeviceptr
	if err := d.Do(func() error { return result("cuMemAlloc", C.cuMemAlloc(&p, C.size_t(n))) }); err != nil {
		return 0, fmt.Errorf("cuda: alloc %d bytes: %w", n, err)
	}
	return DevicePtr(p), nil
}

// Free releases memory from Device.Alloc (cuMemFree). The caller makes sure
// no queued work still uses it (synchronize the streams first).
func (d *Device) Free(p DevicePtr) error {
	if p == 0 {
		return nil
	}
	if err := d.Do(func() error { return result("cuMemFree", C.cuMemFree(p.c())) }); err != nil {
		return fmt.Errorf("cuda: free %#x: %w", uint64(p), err)
	}
	return nil
}

// Memset8 sets n bytes at p to v, in stream order (cuMemsetD8Async).
func (s *Stream) Memset8(p DevicePtr, v byte, n int) error {
	if err := checkSize("memset", n); err != nil || n == 0 {
		return err
	}
	return s.do(func(cs C.CUstream) error {
		return result("cuMemsetD8Async", C.cuMemsetD8Async(p.c(), C.uchar(v), C.size_t(n), cs))
	})
}

// Memset32 sets n 32-bit words at p (4-byte aligned) to v, in stream order
// (cuMemsetD32Async).
func (s *Stream) Memset32(p DevicePtr, v uint32, n int) error {
	if err := checkSize("memset", n); err != nil || n == 0 {
		return err
	}
	return s.do(func(cs C.CUstream) error {
		return result("cuMemsetD32Async", C.cuMemsetD32Async(p.c(), C.uint(v), C.size_t(n), cs))
	})
}

// CopyHtoD copies n bytes from src[off:] to dst, in stream order
// (cuMemcpyHtoDAsync). src is pinned host memory, so the copy is
// asynchronous; keep it alive until the stream has passed the copy.
func (s *Stream) CopyHtoD(dst DevicePtr, src *HostBuffer, off, n int) error {
	p, err := src.at("copy host to device", off, n)
	if err != nil || n == 0 {
		return err
	}
	return s.do(func(cs C.CUstream) error {
		return result("cuMemcpyHtoDAsync", C.cuMemcpyHtoDAsync(dst.c(), p, C.size_t(n), cs))
	})
}

// CopyDtoH copies n bytes from src to dst[off:], in stream order
// (cuMemcpyDtoHAsync). Read dst after synchronizing the stream.
func (s *Stream) CopyDtoH(dst *HostBuffer, off int, src DevicePtr, n int) error {
	p, err := dst.at("copy device to host", off, n)
	if err != nil || n == 0 {
		return err
	}
	return s.do(func(cs C.CUstream) error {
		return result("cuMemcpyDtoHAsync", C.cuMemcpyDtoHAsync(p, src.c(), C.size_t(n), cs))
	})
}

// CopyDtoD copies n bytes from src to dst, in stream order
// (cuMemcpyDtoDAsync). Both may be on any device of a peer-capable set,
// including IPC- or VMM-mapped peer memory (unified addressing).
func (s *Stream) CopyDtoD(dst, src DevicePtr, n int) error {
	if err := checkSize("copy device to device", n); err != nil || n == 0 {
		return err
	}
	return s.do(func(cs C.CUstream) error {
		return result("cuMemcpyDtoDAsync", C.cuMemcpyDtoDAsync(dst.c(), src.c(), C.size_t(n), cs))
	})
}

// HostBuffer is page-locked (pinned) host memory, for asynchronous copies
// (staging). It is C memory, never the Go heap, so the GPU may use it after
// a call returns (DESIGN invariant 6).
type HostBuffer struct {
	d *Device
	p unsafe.Pointer // nil once freed
	n int
}

// AllocHost returns n bytes of pinned host memory, portable to every
// context (cuMemHostAlloc with CU_MEMHOSTALLOC_PORTABLE).
func (d *Device) AllocHost(n int) (*HostBuffer, error) {
	if n <= 0 {
		return nil, fmt.Errorf("cuda: alloc host: size %d, want > 0", n)
	}
	var p unsafe.Pointer
	err := d.Do(func() error {
		return result("cuMemHostAlloc", C.cuMemHostAlloc(&p, C.size_t(n), C.CU_MEMHOSTALLOC_PORTABLE))
	})
	if err != nil {
		return nil, fmt.Errorf("cuda: alloc host %d bytes: %w", n, err)
	}
	return &HostBuffer{d: d, p: p, n: n}, nil
}

// Len is the buffer's size in bytes.
func (h *HostBuffer) Len() int { return h.n }

// Bytes is the buffer's memory as a slice (nil once freed). It must not be
// used after Free.
func (h *HostBuffer) Bytes() []byte {
	if h.p == nil {
		return nil
	}
	return unsafe.Slice((*byte)(h.p), h.n)
}

// DevicePtr is the buffer's address as the GPU sees it (the same address,
// with unified addressing): a host pointer, so IsDevicePointer reports false.
func (h *HostBuffer) DevicePtr() DevicePtr { return DevicePtr(uintptr(h.p)) }

func (h *HostBuffer) at(op string, off, n int) (unsafe.Pointer, error) {
	if h == nil || h.p == nil {
		return nil, fmt.Errorf("cuda: %s: host buffer: %w", op, ErrClosed)
	}
	if off < 0 || n < 0 || off > h.n || n > h.n-off {
		return nil, fmt.Errorf("cuda: %s: range [%d, %d+%d) outside host buffer of %d bytes", op, off, off, n, h.n)
	}
	return unsafe.Add(h.p, off), nil
}

// Free releases the buffer (cuMemFreeHost). No queued copy may still use
// it: synchronize the streams that do first. A second Free returns nil.
func (h *HostBuffer) Free() error {
	return release(h.d, &h.p, "cuMemFreeHost", func(p unsafe.Pointer) C.CUresult { return C.cuMemFreeHost(p) })
}

// IsDevicePointer reports whether p is device memory (cuPointerGetAttribute
// with CU_POINTER_ATTRIBUTE_MEMORY_TYPE is CU_MEMORYTYPE_DEVICE): memory
// from Alloc, an opened IPC handle or a VMM mapping, in any context of the
// process. Pinned host memory and addresses the driver does not know
// (CUDA_ERROR_INVALID_VALUE) give false with a nil error. The debug check of
// DESIGN invariant 1 calls it for every pointer argument of a kernel.
func (d *Device) IsDevicePointer(p DevicePtr) (bool, error) {
	var mt C.uint
	err := d.Do(func() error {
		return result("cuPointerGetAttribute", C.cuPointerGetAttribute(unsafe.Pointer(&mt), C.CU_POINTER_ATTRIBUTE_MEMORY_TYPE, p.c()))
	})
	if IsCode(err, CodeInvalidValue) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("cuda: pointer %#x: %w", uint64(p), err)
	}
	return mt == C.CU_MEMORYTYPE_DEVICE, nil
}

// HostRegistration is host memory the caller owns (mmap'd, never the Go
// heap: DESIGN invariant 6), page-locked and mapped into the GPU's address
// space (cuMemHostRegister with CU_MEMHOSTREGISTER_DEVICEMAP and
// PORTABLE), so that kernels can store into it, for example the rail's send
// region and descriptor ring, which a host proxy reads.
type HostRegistration struct {
	d   *Device
	p   unsafe.Pointer // nil once unregistered
	n   int
	dev DevicePtr
}

// HostRegister page-locks mem and maps it for the GPU. mem must stay mapped
// until Unregister, and no queued work may use it after that.
func (d *Device) HostRegister(mem []byte) (*HostRegistration, error) {
	if len(mem) == 0 {
		return nil, fmt.Errorf("cuda: host register: empty range")
	}
	p := unsafe.Pointer(unsafe.SliceData(mem))
	var dev C.CUdeviceptr
	err := d.Do(func() error {
		flags := C.uint(C.CU_MEMHOSTREGISTER_DEVICEMAP | C.CU_MEMHOSTREGISTER_PORTABLE)
		if err := result("cuMemHostRegister", C.cuMemHostRegister(p, C.size_t(len(mem)), flags)); err != nil {
			return err
		}
		if err := result("cuMemHostGetDevicePointer", C.cuMemHostGetDevicePointer(&dev, p, 0)); err != nil {
			return errors.Join(err, result("cuMemHostUnregister", C.cuMemHostUnregister(p)))
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("cuda: host register %d bytes at %p: %w", len(mem), p, err)
	}
	return &HostRegistration{d: d, p: p, n: len(mem), dev: DevicePtr(dev)}, nil
}

// DevicePtr is the registered memory's address as kernels see it.
func (h *HostRegistration) DevicePtr() DevicePtr { return h.dev }

// Len is the registered size in bytes.
func (h *HostRegistration) Len() int { return h.n }

// Unregister unpins and unmaps the memory (cuMemHostUnregister); the
// caller has synchronized the streams whose work used it. A second call
// returns nil.
func (h *HostRegistration) Unregister() error {
	return release(h.d, &h.p, "cuMemHostUnregister", func(p unsafe.Pointer) C.CUresult { return C.cuMemHostUnregister(p) })
}

// The device's pool (Features.MemoryPools): Stream.Alloc's memory comes
// from a pool of this package's own, not the context's default pool, so
// that its settings stay goep's and do not change those of other users of
// the process (a framework's cudaMallocAsync). Its release threshold keeps
// freed memory reserved for the next allocations: with the default
// threshold (0) the driver hands unused pool memory back at every
// synchronization, and the next allocation of that size maps it again.

// openPool creates the pool; inside Open, in init. A device whose driver
// refuses it keeps working with the context's default pool (PoolError
// says why): the pool only spares the driver work.
func (d *Device) openPool() {
	if !d.feat.MemoryPools {
		return
	}
	if err := result("cuMemPoolCreate", C.goep_pool_create(&d.pool, C.int(d.ordinal))); err != nil {
		d.pool, d.poolErr = nil, err
	}
}

// PoolError is why the device's pool could not be made (nil: it was, or
// the device has no memory pools); Stream.Alloc then uses the context's
// default pool.
func (d *Device) PoolError() error { return d.poolErr }

// closePool destroys the pool; inside Close, at shutdown. Memory still
// allocated from it is released when it is freed (cuMemPoolDestroy).
func (d *Device) closePool() error {
	if d.pool == nil {
		return nil
	}
	p := d.pool
	d.pool = nil
	return result("cuMemPoolDestroy", C.cuMemPoolDestroy(p))
}

// TrimPool waits for all work of the context (cuCtxSynchronize: the pool
// releases only memory whose frees it has seen complete), then hands the
// memory the pool keeps reserved, beyond keep bytes, back to the driver
// (cuMemPoolTrimTo). Without memory pools it does nothing. The wait runs
// outside Do, with the context current on this locked thread: Do's lock
// held through it would stop every other goroutine's launches while a
// kernel may wait for one of them (goroutine ranks sharing the GPU).
func (d *Device) TrimPool(keep int) error {
	if err := checkSize("trim pool", keep); err != nil {
		return err
	}
	if err := d.syncUnlocked(); err != nil {
		return err
	}
	return d.Do(func() error {
		if d.pool == nil {
			return nil
		}
		return result("cuMemPoolTrimTo", C.cuMemPoolTrimTo(d.pool, C.size_t(keep)))
	})
}

// syncUnlocked is cuCtxSynchronize without Do's lock (inside a Do of this
// device, under it: the thread holds it already).
func (d *Device) syncUnlocked() error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if d.held() {
		return result("cuCtxSynchronize", C.cuCtxSynchronize())
	}
	prev, err := d.openCurrent()
	if err != nil {
		return err
	}
	defer d.leave(prev)
	return result("cuCtxSynchronize", C.cuCtxSynchronize())
}

// PoolReserved is the device memory the pool holds, in use or kept for
// reuse (CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT); 0 without memory pools.
func (d *Device) PoolReserved() (int64, error) {
	var n C.ulonglong
	err := d.Do(func() error {
		if d.pool == nil {
			return nil
		}
		return result("cuMemPoolGetAttribute", C.goep_pool_reserved(d.pool, &n))
	})
	return int64(n), err
}
