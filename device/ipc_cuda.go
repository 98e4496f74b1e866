//go:build cuda && cgo

package device

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/goep/goep/internal/cuda"
)

// GPUShareHandle names device memory that other processes can map: with
// CUDA IPC or a POSIX file descriptor on the same host, with a fabric
// handle on any host of the GPU's NVLink fabric (Kind). It carries the
// exporting process and the address there (a peer in the same process uses
// the address directly: the driver refuses to open a process's own handle).
// It is plain data, safe to send anywhere.
type GPUShareHandle struct {
	Kind ShareKind
	PID  int
	// Proc is a random number of the exporting process (PIDs repeat
	// across hosts and containers): a handle with this process's own is
	// used at its address. Gen numbers the process's allocations, so that
	// a stale handle of a reused address is refused.
	Proc, Gen uint64
	Addr      uint64
	Size      int // usable bytes
	// Mapped is the VMM allocation's size (Size rounded up to the
	// granularity); 0 for ShareIPC.
	Mapped int
	// FD is the exporter's descriptor number of a ShareFD allocation
	// (open while the memory lives); -1 otherwise.
	FD int
	// Raw is the CUipcMemHandle (ShareIPC) or the CUmemFabricHandle
	// (ShareFabric); zero for ShareFD.
	Raw [64]byte
}

// sharedRefs counts, for every live AllocShared allocation of this
// process (by address), the buffers that use it: the owner's and each
// OpenShared alias (goroutine ranks use each other's windows at their
// addresses). The memory is freed with the last of them, so a rank that
// closes early (a failed engine skips the closing barrier) never frees
// memory that a peer of the process may still write into. It also holds
// the VMM mappings of peers' allocations (opened), by address.
var sharedRefs = struct {
	mu     sync.Mutex
	m      map[uint64]*sharedRef
	opened map[uint64]*vmmRegion
}{m: map[uint64]*sharedRef{}, opened: map[uint64]*vmmRegion{}}

// thisProc is this process's GPUShareHandle.Proc; allocGen counts its
// shared allocations (GPUShareHandle.Gen).
var (
	thisProc = rand.Uint64() | 1
	allocGen atomic.Uint64
)

type sharedRef struct {
	c    *CUDA          // the owner's backend, which frees it while open
	h    GPUShareHandle // its handle: a stale handle of a reused address is refused
	vmm  *vmmRegion     // a VMM allocation's mapping; nil for ShareIPC
	refs int
}

// vmmRegion is a VMM allocation mapped at va: this process's own
// (exported) or a peer's (imported).
type vmmRegion struct {
	a  *cuda.Allocation // its Size is the mapped bytes, a multiple of the granularity
	va cuda.DevicePtr
	fd int // ShareFD, own allocation: the exported descriptor; else -1
}

// free unmaps the region, returns its address range and releases the
// allocation (the memory goes back with the last process's release).
func (v *vmmRegion) free(d *cuda.Device) error {
	var errs []error
	if v.va != 0 {
		errs = append(errs, d.Unmap(v.va, v.a.Size()), d.AddressFree(v.va, v.a.Size()))
	}
	errs = append(errs, v.a.ReleaseOn(d))
	if v.fd >= 0 {
		errs = append(errs, unix.Close(v.fd))
	}
	return errors.Join(errs...)
}

// mapVMM maps all of a at a fresh address range of this GPU; on failure
// it releases a.
func (c *CUDA) mapVMM(a *cuda.Allocation) (*vmmRegion, error) {
	va, err := c.dev.AddressReserve(a.Size(), 0)
	if err != nil {
		return nil, errors.Join(err, a.Release())
	}
	if err := c.dev.Map(va, a); err != nil {
		return nil, errors.Join(err, c.dev.AddressFree(va, a.Size()), a.Release())
	}
	return &vmmRegion{a: a, va: va, fd: -1}, nil
}

func vmmHandleType(k ShareKind) cuda.HandleType {
	if k == ShareFabric {
		return cuda.HandleFabric
	}
	return cuda.HandlePosixFD
}

// AllocShared is AllocSharedAs(n, ShareIPC).
func (c *CUDA) AllocShared(n int) (*Buffer, GPUShareHandle, error) {
	return c.AllocSharedAs(n, ShareIPC)
}

// AllocSharedAs returns n bytes of device memory that peers can map with
// OpenShared, and its handle, shared as kind says: cuMemAlloc memory with
// an IPC handle, or a VMM allocation (n rounded up to the granularity)
// exported as a file descriptor or a fabric handle, mapped here for this
// GPU. The memory is not stream-ordered and not zeroed. Free it with
// FreeShared once no queued work (here or at a peer) uses it; a peer in
// this process holds it until it frees its alias too.
func (c *CUDA) AllocSharedAs(n int, kind ShareKind) (*Buffer, GPUShareHandle, error) {
	h := GPUShareHandle{Kind: kind, PID: os.Getpid(), Proc: thisProc, Gen: allocGen.Add(1), Size: n, FD: -1}
	var v *vmmRegion
	switch kind {
	case ShareIPC:
		p, err := c.dev.Alloc(n)
		if err != nil {
			return nil, h, fmt.Errorf("device: CUDA shared alloc: %w", closedAs(err))
		}
		ipc, err := c.dev.GetIPCHandle(p)
		if err != nil {
			_ = c.dev.Free(p)
			return nil, h, fmt.Errorf("device: CUDA shared alloc: %w", closedAs(err))
		}
		h.Addr, h.Raw = uint64(p), ipc
	case ShareFD, ShareFabric:
		var err error
		if v, err = c.allocVMM(n, kind, &h); err != nil {
			return nil, h, fmt.Errorf("device: CUDA shared alloc of %d bytes (%v): %w", n, kind, closedAs(err))
		}
	default:
		return nil, h, fmt.Errorf("device: CUDA shared alloc: %w: share kind %v", ErrUnsupported, kind)
	}
	c.live.Add(1)
	if h.Addr != 0 {
		sharedRefs.mu.Lock()
		sharedRefs.m[h.Addr] = &sharedRef{c: c, h: h, vmm: v, refs: 1}
		sharedRefs.mu.Unlock()
	}
	return &Buffer{bufMem: &bufMem{size: n, dev: h.Addr, shared: sharedOwn}}, h, nil
}

// allocVMM creates, maps and exports a VMM allocation of at least n bytes,
// filling h's address, sizes and handle.
func (c *CUDA) allocVMM(n int, kind ShareKind, h *GPUShareHandle) (*vmmRegion, error) {
	ht := vmmHandleType(kind)
	g, err := c.dev.Granularity(ht)
	if err != nil {
		return nil, err
	}
	size := (max(n, 1) + g - 1) / g * g
	a, err := c.dev.MemCreate(size, ht)
	if err != nil {
		return nil, err
	}
	v, err := c.mapVMM(a)
	if err != nil {
		return nil, err
	}
	if kind == ShareFD {
		// Not inherited by the children the process starts, which would
		// keep the memory alive after it is freed.
		if v.fd, err = a.ExportFD(); err == nil {
			unix.CloseOnExec(v.fd)
		}
	} else {
		var fh cuda.FabricHandle
		fh, err = a.ExportFabric()
		h.Raw = fh
	}
	if err != nil { // v.fd is -1: nothing was exported
		return nil, errors.Join(err, v.free(c.dev))
	}
	h.Addr, h.Mapped, h.FD = uint64(v.va), size, v.fd
	return v, nil
}

// ProbeShare allocates, exports and frees the smallest allocation of
// kind: nil when this GPU and process can share memory so (for
// ShareFabric: the driver has fabric handles and an IMEX channel is
// usable), else the driver's refusal.
func (c *CUDA) ProbeShare(kind ShareKind) error {
	b, _, err := c.AllocSharedAs(1, kind)
	if err != nil {
		return err
	}
	return c.FreeShared(b)
}

// OpenShared maps a peer's shared memory into this process (or, for a
// handle of this process, returns a buffer at its address, which keeps the
// allocation alive until it is freed). Close the buffer with FreeShared.
func (c *CUDA) OpenShared(h GPUShareHandle) (*Buffer, error) {
	if h.Proc == thisProc {
		sharedRefs.mu.Lock()
		defer sharedRefs.mu.Unlock()
		r := sharedRefs.m[h.Addr]
		if r == nil || r.h != h {
			return nil, fmt.Errorf("device: CUDA open shared memory %#x of this process: no such live allocation", h.Addr)
		}
		r.refs++
		return &Buffer{bufMem: &bufMem{size: h.Size, dev: h.Addr, shared: sharedAlias}}, nil
	}
	switch h.Kind {
	case ShareIPC:
		p, err := c.dev.OpenIPCHandle(cuda.IPCHandle(h.Raw))
		if err != nil {
			return nil, fmt.Errorf("device: CUDA open shared memory of process %d: %w", h.PID, err)
		}
		return &Buffer{bufMem: &bufMem{size: h.Size, dev: uint64(p), shared: sharedOpened}}, nil
	case ShareFD, ShareFabric:
		v, err := c.importVMM(h)
		if err != nil {
			return nil, fmt.Errorf("device: CUDA open shared memory (%v) of process %d: %w", h.Kind, h.PID, closedAs(err))
		}
		sharedRefs.mu.Lock()
		sharedRefs.opened[uint64(v.va)] = v
		sharedRefs.mu.Unlock()
		return &Buffer{bufMem: &bufMem{size: h.Size, dev: uint64(v.va), shared: sharedVMMOpened}}, nil
	}
	return nil, fmt.Errorf("device: CUDA open shared memory of process %d: %w: share kind %v", h.PID, ErrUnsupported, h.Kind)
}

// importVMM imports and maps a peer's VMM allocation.
func (c *CUDA) importVMM(h GPUShareHandle) (*vmmRegion, error) {
	if h.Mapped < max(h.Size, 1) {
		return nil, fmt.Errorf("bad handle: %d usable bytes in an allocation of %d", h.Size, h.Mapped)
	}
	var a *cuda.Allocation
	if h.Kind == ShareFD {
		fd, err := takeFD(h.PID, h.FD)
		if err != nil {
			return nil, err
		}
		// The import holds the memory: this copy of the descriptor is done.
		a, err = c.dev.ImportFD(fd, h.Mapped)
		unix.Close(fd)
		if err != nil {
			return nil, err
		}
	} else {
		var err error
		if a, err = c.dev.ImportFabric(cuda.FabricHandle(h.Raw), h.Mapped); err != nil {
			return nil, err
		}
	}
	return c.mapVMM(a)
}

// takeFD duplicates descriptor fd of process pid into this one
// (pidfd_getfd(2), Linux 5.6+). The kernel allows it where this process
// may ptrace the other: the same user with kernel.yama.ptrace_scope 0, or
// CAP_SYS_PTRACE.
func takeFD(pid, fd int) (int, error) {
	pfd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return -1, fmt.Errorf("pidfd_open(%d): %w", pid, err)
	}
	defer unix.Close(pfd)
	n, err := unix.PidfdGetfd(pfd, fd, 0)
	if err != nil {
		if errors.Is(err, unix.EPERM) {
			return -1, fmt.Errorf("pidfd_getfd(process %d, fd %d): %w (this process may not ptrace it: run the ranks as one user with kernel.yama.ptrace_scope 0, or share with ipc)", pid, fd, err)
		}
		return -1, fmt.Errorf("pidfd_getfd(process %d, fd %d): %w", pid, fd, err)
	}
	return n, nil
}

// FreeShared releases a buffer of AllocShared or OpenShared (cuMemFree,
// cuIpcCloseMemHandle, or a VMM unmap and release); the caller makes sure
// no queued work uses it.
func (c *CUDA) FreeShared(b *Buffer) error {
	if b == nil || !b.freed.CompareAndSwap(false, true) {
		return nil
	}
	switch b.shared {
	case sharedOwn:
		if b.dev == 0 {
			c.live.Add(-1)
			return nil
		}
		return releaseShared(c, b.dev)
	case sharedAlias:
		return releaseShared(c, b.dev)
	case sharedOpened:
		return c.dev.CloseIPCHandle(cuda.DevicePtr(b.dev))
	case sharedVMMOpened:
		sharedRefs.mu.Lock()
		v := sharedRefs.opened[b.dev]
		delete(sharedRefs.opened, b.dev)
		sharedRefs.mu.Unlock()
		if v == nil {
			return fmt.Errorf("device: CUDA free shared: no VMM mapping at %#x", b.dev)
		}
		return v.free(c.dev)
	}
	return fmt.Errorf("device: CUDA free shared: %w: not a shared buffer", ErrUnsupported)
}

// releaseShared drops one use of the AllocShared allocation at p and frees
// it with the last: through its owner's backend, or, once that is closed
// (goroutine ranks with a backend each), through c, the caller's, which
// shares the GPU's primary context.
func releaseShared(c *CUDA, p uint64) error {
	sharedRefs.mu.Lock()
	r := sharedRefs.m[p]
	if r != nil {
		r.refs--
		if r.refs > 0 {
			r = nil
		} else {
			delete(sharedRefs.m, p)
		}
	}
	sharedRefs.mu.Unlock()
	if r == nil {
		return nil
	}
	r.c.live.Add(-1)
	by := r.c
	r.c.mu.Lock()
	if r.c.closed {
		by = c
	}
	r.c.mu.Unlock()
	if r.vmm != nil {
		return r.vmm.free(by.dev)
	}
	return by.dev.Free(cuda.DevicePtr(p))
}

// IsDevicePointer reports whether p is device memory of this backend's GPU
// (cuPointerGetAttribute), for debug checks of kernel arguments.
func (c *CUDA) IsDevicePointer(p uint64) (bool, error) {
	return c.dev.IsDevicePointer(cuda.DevicePtr(p))
}

// WrapStream returns a stream of this backend over a CUstream that another
// library created on this GPU's primary context (handle as that library
// reports it, e.g. torch.cuda.current_stream().cuda_stream), so that goep's
// work runs in order with the caller's. Close drains it and forgets it; the
// owner destroys it.
func (c *CUDA) WrapStream(handle uintptr) (*CUDAStream, error) {
	s, err := c.dev.WrapStream(handle)
	if err != nil {
		return nil, fmt.Errorf("device: CUDA wrap stream: %w", closedAs(err))
	}
	return c.adopt("wrap stream", s)
}

// WrapDeviceMemory returns a buffer over n bytes of device memory that the
// caller owns at address p (another framework's tensor): goep reads and
// writes it like its own but never frees it, and the caller keeps it alive
// until the work that uses it has completed. p must be device memory of
// this GPU's context (checked with cuPointerGetAttribute).
func (c *CUDA) WrapDeviceMemory(p uint64, n int) (*Buffer, error) {
	if n < 0 {
		return nil, fmt.Errorf("device: CUDA wrap memory: %d bytes", n)
	}
	if n > 0 {
		ok, err := c.dev.IsDevicePointer(cuda.DevicePtr(p))
		if err != nil {
			return nil, fmt.Errorf("device: CUDA wrap memory %#x: %w", p, err)
		}
		if !ok {
			return nil, fmt.Errorf("device: CUDA wrap memory %#x: not device memory (DESIGN invariant 1)", p)
		}
	}
	return &Buffer{bufMem: &bufMem{size: n, dev: p}}, nil
}

// Handle is the stream's CUstream as an integer, for other libraries of the
// process (e.g. to make a framework's stream wait for goep's work).
func (s *CUDAStream) Handle() uintptr { return s.s.Handle() }
