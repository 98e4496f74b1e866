//go:build cuda && cgo

package device

import (
	"fmt"
	"os"
	"sync"

	"github.com/goep/goep/internal/cuda"
)

// GPUShareHandle names device memory that other processes on the host can
// map (CUDA IPC), with the exporting process and the address there (a peer
// in the same process uses the address directly: the driver refuses to
// open a process's own handle).
type GPUShareHandle struct {
	PID  int
	Addr uint64
	Size int
	IPC  [64]byte
}

// sharedRefs counts, for every live AllocShared allocation of this
// process (by address), the buffers that use it: the owner's and each
// OpenShared alias (goroutine ranks use each other's windows at their
// addresses). The memory is freed with the last of them, so a rank that
// closes early (a failed engine skips the closing barrier) never frees
// memory that a peer of the process may still write into.
var sharedRefs = struct {
	mu sync.Mutex
	m  map[uint64]*sharedRef
}{m: map[uint64]*sharedRef{}}

type sharedRef struct {
	c    *CUDA // the owner's backend, which frees it while open
	size int
	ipc  [64]byte // its IPC handle: a stale handle of a reused address is refused
	refs int
}

// AllocShared returns n bytes of device memory that peers can map with
// OpenShared, and its handle. The memory is not stream-ordered (cuMemAlloc,
// the only kind CUDA IPC exports); it is not zeroed. Free it with
// FreeShared once no queued work (here or at a peer) uses it; a peer in
// this process holds it until it frees its alias too.
func (c *CUDA) AllocShared(n int) (*Buffer, GPUShareHandle, error) {
	p, err := c.dev.Alloc(n)
	if err != nil {
		return nil, GPUShareHandle{}, fmt.Errorf("device: CUDA shared alloc: %w", closedAs(err))
	}
	h, err := c.dev.GetIPCHandle(p)
	if err != nil {
		_ = c.dev.Free(p)
		return nil, GPUShareHandle{}, fmt.Errorf("device: CUDA shared alloc: %w", closedAs(err))
	}
	c.live.Add(1)
	if p != 0 {
		sharedRefs.mu.Lock()
		sharedRefs.m[uint64(p)] = &sharedRef{c: c, size: n, ipc: h, refs: 1}
		sharedRefs.mu.Unlock()
	}
	return &Buffer{bufMem: &bufMem{size: n, dev: uint64(p), shared: sharedOwn}},
		GPUShareHandle{PID: os.Getpid(), Addr: uint64(p), Size: n, IPC: h}, nil
}

// OpenShared maps a peer's shared memory into this process (or, for a
// handle of this process, returns a buffer at its address, which keeps the
// allocation alive until it is freed). Close the buffer with FreeShared.
func (c *CUDA) OpenShared(h GPUShareHandle) (*Buffer, error) {
	if h.PID == os.Getpid() {
		sharedRefs.mu.Lock()
		defer sharedRefs.mu.Unlock()
		r := sharedRefs.m[h.Addr]
		if r == nil || r.size != h.Size || r.ipc != h.IPC {
			return nil, fmt.Errorf("device: CUDA open shared memory %#x of this process: no such live allocation", h.Addr)
		}
		r.refs++
		return &Buffer{bufMem: &bufMem{size: h.Size, dev: h.Addr, shared: sharedAlias}}, nil
	}
	p, err := c.dev.OpenIPCHandle(cuda.IPCHandle(h.IPC))
	if err != nil {
		return nil, fmt.Errorf("device: CUDA open shared memory of process %d: %w", h.PID, err)
	}
	return &Buffer{bufMem: &bufMem{size: h.Size, dev: uint64(p), shared: sharedOpened}}, nil
}

// FreeShared releases a buffer of AllocShared or OpenShared (cuMemFree or
// cuIpcCloseMemHandle); the caller makes sure no queued work uses it.
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
