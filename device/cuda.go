//go:build cuda && cgo

package device

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/goep/goep/internal/cuda"
)

// CUDA is the CUDA backend: one GPU, through the driver layer of
// internal/cuda (its primary context, current on the OS thread of each
// call, which is locked for it: cuda.Device.Do).
// Memory is stream-ordered (cuMemAllocAsync / cuMemFreeAsync), so a free
// never hands memory under queued work to anyone else (DESIGN invariant 2).
type CUDA struct {
	dev *cuda.Device

	// mu's holders call the driver (cuda.Device.Do), so it is never taken
	// inside Device.Do, as in CUDAStream.Enqueue's f: mu, then the device.
	mu     sync.Mutex
	closed bool
	spare  *cuda.Stream // frees of buffers whose stream was closed; made on first use

	live    atomic.Int64 // buffers allocated and not yet freed
	streams atomic.Int64 // streams open

	checkPointers atomic.Bool // SetCheckPointers

	stage stagePool // pinned staging buffers of uploads and downloads

	// hostMaps are the live MapHost mappings, guarded by hostMu, which
	// Launch's pointer check takes inside Device.Do (inside Enqueue).
	hostMu   sync.Mutex
	hostMaps []*HostMapping

	delay *Kernel // goep_delay, loaded by the first Delay (its module stays in modules); guarded by mu

	// modules are the loaded modules by their PTX's SHA-256, kept until
	// Close: LoadModule of PTX already loaded returns a handle on its
	// module. Every engine on this backend (the ranks of a process, the
	// cases of a sweep) loads the same kernels, and a load JIT-compiles
	// them, which is slow. Guarded by
	// modMu, which is held across the load so that concurrent loads of
	// the same PTX compile it once, and is never taken inside Device.Do.
	modMu     sync.Mutex
	modules   map[[sha256.Size]byte]*cuda.Module
	modClosed bool // Close has unloaded the modules

	// captures counts the streams of this GPU between BeginCapture and
	// EndCapture. afterCapture are the buffers whose free was asked for
	// meanwhile, not allocated by a capture: a capture may use memory of
	// any stream (a caller's tensor, say), and a captured free must be of
	// a graph allocation, so they wait for the last capture to end
	// (flushFrees). Both are read and changed inside Device.Do only.
	captures     int
	afterCapture []*Buffer
}

// stagePool keeps the pinned staging buffers of uploads and downloads for
// reuse, by power-of-two size, until the backend closes. Allocating and
// freeing pinned memory (cuMemHostAlloc, cuMemFreeHost) serializes with the
// work of every stream of the context (CUDA's implicit synchronization),
// and the driver calls of a GPU are serialised (cuda.Device.Do): with several
// ranks of one process on one GPU, a free per copy could hold the device
// while a peer's kernel waits for a launch queued behind it, until the
// kernel's timeout. After warm-up, copies allocate nothing.
type stagePool struct {
	mu     sync.Mutex
	free   map[int][]*cuda.HostBuffer // by Len
	kept   int                        // bytes in free
	warmed int                        // bytes allocated by WarmStaging
	allocs atomic.Int64               // buffers allocated by get (tests)
}

// maxStageKept bounds the bytes the pool keeps, beyond what WarmStaging
// allocated; a buffer returned past it is freed.
const maxStageKept = 1 << 30

// stageChunk is the largest staging buffer a transfer uses: a larger
// upload or download moves in chunks of it through one buffer, so that
// after WarmStaging no transfer of any size allocates pinned memory (a
// rank downloading a large output would otherwise stall its peers' wait
// kernels, and so itself, until their timeout; see stagePool). Chunks
// cost a wait each: a few percent of a transfer of this size.
const stageChunk = 16 << 20

// TrimMemory waits for all work of the GPU's context (every stream of the
// process on this GPU), then hands the device memory that goep's
// stream-ordered pool keeps for reuse back to the driver. The pool keeps
// freed memory on purpose: a pool that handed it back at every
// synchronization (the driver's default) would map it again for the next
// call's outputs. Call TrimMemory when goep's peak use should go back to
// other users of the GPU, between phases of a job, say.
func (c *CUDA) TrimMemory() error {
	if err := c.dev.TrimPool(0); err != nil {
		return fmt.Errorf("device: CUDA trim memory: %w", closedAs(err))
	}
	return nil
}

// WarmStaging allocates one pinned staging buffer of every size class a
// transfer uses (64 KiB to stageChunk, just under 32 MiB in all), so that
// uploads and downloads allocate nothing later (a pinned allocation
// serializes with every stream of the context; see stagePool). An engine
// calls it at creation, before its peers' kernels can wait on it. Each
// call adds a set: ranks of one process sharing the backend each warm
// their own, so that their transfers at the same time allocate nothing
// either. (Transfers of one rank from several goroutines at once may.)
func (c *CUDA) WarmStaging() error {
	p := &c.stage
	for cl := stageClass(1); cl <= stageChunk; cl <<= 1 {
		h, err := c.dev.AllocHost(cl)
		if err != nil {
			return fmt.Errorf("device: warm staging buffers: %w", closedAs(err))
		}
		p.mu.Lock()
		if p.free == nil {
			p.free = map[int][]*cuda.HostBuffer{}
		}
		p.free[cl] = append(p.free[cl], h)
		p.kept += cl
		p.warmed += cl
		p.mu.Unlock()
	}
	return nil
}

// stageClass is the size a staging buffer of n bytes is allocated with.
func stageClass(n int) int {
	c := 64 << 10
	for c < n {
		c <<= 1
	}
	return c
}

func (p *stagePool) get(d *cuda.Device, n int) (*cuda.HostBuffer, error) {
	c := stageClass(n)
	p.mu.Lock()
	if l := p.free[c]; len(l) > 0 {
		h := l[len(l)-1]
		p.free[c] = l[:len(l)-1]
		p.kept -= c
		p.mu.Unlock()
		return h, nil
	}
	p.mu.Unlock()
	p.allocs.Add(1)
	return d.AllocHost(c)
}

// put returns h once no queued copy uses it.
func (p *stagePool) put(h *cuda.HostBuffer) error {
	p.mu.Lock()
	if p.kept+h.Len() > maxStageKept+p.warmed {
		p.mu.Unlock()
		return h.Free()
	}
	if p.free == nil {
		p.free = map[int][]*cuda.HostBuffer{}
	}
	p.free[h.Len()] = append(p.free[h.Len()], h)
	p.kept += h.Len()
	p.mu.Unlock()
	return nil
}

// close frees every kept buffer (streams drained).
func (p *stagePool) close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	var errs []error
	for _, l := range p.free {
		for _, h := range l {
			errs = append(errs, h.Free())
		}
	}
	p.free, p.kept, p.warmed = nil, 0, 0
	return errors.Join(errs...)
}

// SetCheckPointers turns on (or off) the debug check of DESIGN invariant 1:
// before every launch, each pointer argument is looked up with
// cuPointerGetAttribute and the launch fails unless it is device memory.
// It costs a driver call per argument; tests turn it on, and so does
// GOEP_DEBUG_POINTERS=1 when the backend is created.
func (c *CUDA) SetCheckPointers(on bool) { c.checkPointers.Store(on) }

// NewCUDA opens GPU ordinal (its primary context, shared with other
// libraries of the process). It fails, with the driver's reason, when
// there is no usable driver or GPU.
func NewCUDA(ordinal int) (*CUDA, error) {
	d, err := cuda.Open(ordinal)
	if err != nil {
		return nil, fmt.Errorf("device: CUDA backend for GPU %d: %w", ordinal, err)
	}
	c := &CUDA{dev: d}
	if v := os.Getenv("GOEP_DEBUG_POINTERS"); v != "" {
		on, err := strconv.ParseBool(v)
		if err != nil {
			return nil, errors.Join(fmt.Errorf("device: GOEP_DEBUG_POINTERS=%q: want a boolean", v), d.Close())
		}
		c.SetCheckPointers(on)
	}
	return c, nil
}

// Kind implements Backend.
func (c *CUDA) Kind() Kind { return KindCUDA }

// Driver is the backend's device in the driver layer (for goep's other
// GPU packages: IPC, VMM, stream memory operations).
func (c *CUDA) Driver() *cuda.Device { return c.dev }

// Name is the GPU's name, e.g. "NVIDIA H200".
func (c *CUDA) Name() string { return c.dev.Name() }

// Ordinal is the GPU's index among the visible devices.
func (c *CUDA) Ordinal() int { return c.dev.Ordinal() }

// LiveBuffers is the number of buffers allocated and not yet freed.
func (c *CUDA) LiveBuffers() int64 { return c.live.Load() }

// NewStream implements Backend; the stream is a *CUDAStream.
func (c *CUDA) NewStream() (Stream, error) {
	return c.NewCUDAStream()
}

// NewCUDAStream creates a stream (non-blocking with respect to the legacy
// default stream).
func (c *CUDA) NewCUDAStream() (*CUDAStream, error) {
	c.mu.Lock()
	closed := c.closed
	c.mu.Unlock()
	if closed {
		return nil, fmt.Errorf("device: CUDA new stream: %w", ErrClosed)
	}
	s, err := c.dev.NewStream()
	if err != nil {
		return nil, fmt.Errorf("device: CUDA new stream: %w", closedAs(err))
	}
	return c.adopt("new stream", s)
}

// adopt makes s, a stream of c's GPU, a CUDAStream of c, or closes it and
// fails (op names the caller). The small staging buffer is allocated now,
// not at the first download: a pinned allocation serializes with every
// stream of the context (see stagePool), and the first download may come
// while a peer's kernel waits on this rank.
func (c *CUDA) adopt(op string, s *cuda.Stream) (*CUDAStream, error) {
	small, err := c.dev.AllocHost(smallStage)
	if err != nil {
		return nil, errors.Join(fmt.Errorf("device: CUDA %s: %w", op, closedAs(err)), s.Close())
	}
	c.streams.Add(1)
	return &CUDAStream{c: c, s: s, small: small}, nil
}

// freeSpareLater frees b, whose stream was closed, with freeSpare on a
// goroutine of its own: freeSpare takes CUDA.mu, whose holders wait for
// the device (Device.Do), and the caller may hold it (a Close inside
// CUDAStream.Enqueue's f, say).
func (c *CUDA) freeSpareLater(b *Buffer) {
	go func() {
		err := c.freeSpare(b.dev)
		if err == nil && b.gended {
			// A graph allocation: the next launch may allocate it again.
			_ = c.dev.Do(func() error { b.gbacked = false; return nil })
		}
		b.stream.(*CUDAStream).freed(b, err)
	}()
}

// freeSpare frees p on the backend's spare stream: the buffer's own stream
// was closed, which drained it, so no queued work uses p.
func (c *CUDA) freeSpare(p uint64) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil // the driver frees it with the context
	}
	if c.spare == nil {
		s, err := c.dev.NewStream()
		if err != nil {
			return err
		}
		c.spare = s
	}
	return c.spare.Free(cuda.DevicePtr(p))
}

// Close releases the GPU (its primary context) and unloads every module
// loaded on it. Streams and buffers should be closed first, and no kernel
// of this backend may still run; memory still allocated goes with the
// context when its last user releases it.
func (c *CUDA) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	spare := c.spare
	c.spare = nil
	c.delay = nil
	c.mu.Unlock()
	var errs []error
	if spare != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		errs = append(errs, spare.Synchronize(ctx), spare.Close())
		cancel()
	}
	c.modMu.Lock()
	for _, m := range c.modules {
		if err := m.Close(); err != nil {
			errs = append(errs, fmt.Errorf("unload module: %w", err))
		}
	}
	c.modules, c.modClosed = nil, true
	c.modMu.Unlock()
	// Frees still waiting for a capture that never ended: the memory goes
	// with the context.
	_ = c.dev.Do(func() error {
		c.live.Add(-int64(len(c.afterCapture)))
		c.afterCapture, c.captures = nil, 0
		return nil
	})
	errs = append(errs, c.stage.close(), c.dev.Close())
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("device: CUDA close: %w", closedAs(err))
	}
	return nil
}

// Module is a handle on GPU code loaded on a CUDA backend. Every
// LoadModule of the same PTX on the backend shares the one loaded module,
// which stays loaded until the backend's Close.
type Module struct {
	c      *CUDA
	m      *cuda.Module
	closed atomic.Bool
}

// LoadModule JIT-compiles PTX for the GPU and loads it, or, when this
// backend has loaded the same PTX before, returns a handle on that module.
// The error carries the JIT compiler's log.
func (c *CUDA) LoadModule(ptx []byte) (*Module, error) {
	key := sha256.Sum256(ptx)
	c.modMu.Lock()
	defer c.modMu.Unlock()
	if c.modClosed {
		return nil, fmt.Errorf("device: CUDA load module: %w", ErrClosed)
	}
	m := c.modules[key]
	if m == nil {
		var err error
		if m, err = c.dev.LoadPTX(ptx); err != nil {
			return nil, fmt.Errorf("device: CUDA load module: %w", closedAs(err))
		}
		if c.modules == nil {
			c.modules = map[[sha256.Size]byte]*cuda.Module{}
		}
		c.modules[key] = m
	}
	return &Module{c: c, m: m}, nil
}

// Kernel looks up an extern "C" kernel of the module by name.
func (m *Module) Kernel(name string) (*Kernel, error) {
	if m.closed.Load() {
		return nil, fmt.Errorf("device: CUDA kernel %q: module: %w", name, ErrClosed)
	}
	f, err := m.m.Function(name)
	if err != nil {
		return nil, fmt.Errorf("device: CUDA kernel: %w", closedAs(err))
	}
	return &Kernel{c: m.c, mod: m, f: f, task: "launch " + name}, nil
}

// Close closes the handle: its kernels refuse later launches (work
// already queued runs). The module stays loaded for the backend's other
// handles and later loads, until the backend's Close. A second Close does
// nothing.
func (m *Module) Close() error {
	m.closed.Store(true)
	return nil
}

// Kernel is a kernel of a loaded Module, launchable until that Module
// handle is closed.
type Kernel struct {
	c    *CUDA
	mod  *Module
	f    *cuda.Function
	task string // "launch NAME", its launches' task in errors (built once)
}

// Name is the kernel's name.
func (k *Kernel) Name() string { return k.f.Name() }

// SetMaxDynamicSharedMemory lets launches of the kernel ask for up to
// bytes of dynamic shared memory (more than the default 48 KiB; at most
// the GPU's Driver().Limits().SharedPerBlockOptin). It applies to the
// loaded kernel, for every handle of its module.
func (k *Kernel) SetMaxDynamicSharedMemory(bytes int) error {
	if k.mod.closed.Load() {
		return fmt.Errorf("device: CUDA kernel %s: module: %w", k.Name(), ErrClosed)
	}
	if err := k.f.SetMaxDynamicSharedMemory(bytes); err != nil {
		return fmt.Errorf("device: CUDA kernel: %w", closedAs(err))
	}
	return nil
}

// CUDAStream is a Stream of the CUDA backend (a CUstream). Enqueueing
// methods return the error of the enqueue itself and also keep the first
// one, which the next Synchronize returns (as HostStream does with the
// errors of its tasks); unlike HostStream's tasks, GPU work queued after a
// failure still runs.
type CUDAStream struct {
	c *CUDA
	s *cuda.Stream

	mu     sync.Mutex
	err    error // first error since the last Synchronize
	closed bool
	held   []any // what queued work uses; dropped (funcs called) when it is done

	captureFrom int         // len(held) when the current capture began
	capturing   atomic.Bool // between BeginCapture and EndCapture
	// capAllocs are the graph allocations of the capture in progress
	// (Device.Do): those it has not freed at EndCapture outlive it.
	capAllocs []*bufMem

	// small is pinned staging memory kept for small downloads (counts,
	// status words), which would otherwise pay a cuMemHostAlloc each.
	smallMu sync.Mutex
	small   *cuda.HostBuffer
}

// smallStage is the largest download staged through the stream's kept
// pinned buffer.
const smallStage = 4096

// downloadSmall is download of n <= smallStage bytes, through the
// stream's kept staging buffer.
func (s *CUDAStream) downloadSmall(ctx context.Context, b *Buffer, n int) ([]byte, error) {
	s.smallMu.Lock()
	defer s.smallMu.Unlock()
	if s.small == nil {
		h, err := s.c.dev.AllocHost(smallStage)
		if err != nil {
			return nil, fmt.Errorf("device: CUDA download: %w", closedAs(err))
		}
		s.small = h
	}
	if err := s.s.CopyDtoH(s.small, 0, cuda.DevicePtr(b.dev), n); err != nil {
		return nil, s.fail("download", err)
	}
	if err := s.Synchronize(ctx); err != nil {
		if ctx.Err() != nil {
			// The copy may still be in flight: never reuse this buffer.
			st := s.small
			s.small = nil
			s.hold(func() { _ = st.Free() })
		}
		return nil, fmt.Errorf("device: CUDA download: %w", closedAs(err))
	}
	return append([]byte(nil), s.small.Bytes()[:n]...), nil
}

// Backend implements Stream.
func (s *CUDAStream) Backend() Backend { return s.c }

// CUDA is the stream's backend.
func (s *CUDAStream) CUDA() *CUDA { return s.c }

// closedAs makes an error of the driver layer's use after Close
// (cuda.ErrClosed: the backend was closed) match this package's ErrClosed
// too, its text unchanged.
func closedAs(err error) error {
	if err == nil || !errors.Is(err, cuda.ErrClosed) || errors.Is(err, ErrClosed) {
		return err
	}
	return backendClosed{err}
}

// backendClosed is closedAs's error.
type backendClosed struct{ err error }

func (e backendClosed) Error() string   { return e.err.Error() }
func (e backendClosed) Unwrap() []error { return []error{ErrClosed, e.err} }

// fail keeps err as the stream's first error, naming the task, and returns
// it.
func (s *CUDAStream) fail(task string, err error) error {
	if err == nil {
		return nil
	}
	te := &TaskError{Task: task, Err: closedAs(err)}
	s.mu.Lock()
	if s.err == nil {
		s.err = te
	}
	s.mu.Unlock()
	return te
}

// hold keeps v reachable until the work enqueued so far has completed (the
// next Synchronize that sees it done); a func() in v is called then.
func (s *CUDAStream) hold(v ...any) {
	s.mu.Lock()
	s.held = append(s.held, v...)
	s.mu.Unlock()
}

// release drops the first n held objects, calling the funcs among them.
func (s *CUDAStream) release(n int) {
	s.mu.Lock()
	done := s.held[:n:n]
	s.held = append([]any(nil), s.held[n:]...)
	s.mu.Unlock()
	for _, v := range done {
		if f, ok := v.(func()); ok {
			f()
		}
	}
}

// Alloc implements Stream: n bytes of device memory (cuMemAllocAsync),
// usable by work enqueued on s after this call. The bytes are not zeroed.
func (s *CUDAStream) Alloc(n int) (*Buffer, error) {
	if n < 0 {
		return nil, fmt.Errorf("device: CUDA alloc of %d bytes", n)
	}
	// Inside Device.Do, so that the capture state cannot change
	// between reading it and allocating.
	var m *bufMem
	err := s.c.dev.Do(func() error {
		p, err := s.s.Alloc(n)
		if err != nil {
			return err
		}
		m = &bufMem{size: n, dev: uint64(p), stream: s, graph: s.capturing.Load()}
		if m.graph && p != 0 {
			s.capAllocs = append(s.capAllocs, m)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("device: CUDA alloc: %w", closedAs(err))
	}
	if m.dev != 0 {
		s.c.live.Add(1)
	}
	return &Buffer{bufMem: m}, nil
}

// Free implements Stream: the memory goes back to the pool once the work
// enqueued on s before this call is done (cuMemFreeAsync). After s was
// closed (which drained it) the free goes through the backend. During a
// capture (BeginCapture) the free of a buffer allocated inside it is
// captured into the graph, and that of any other buffer waits for
// EndCapture. The free of a buffer that a graph's work uses waits for the
// Close of the last such graph. A graph allocation that outlived its
// capture is freed on the driver only while a launch of its graph has
// allocated it (Graph.Launch). A failure is kept as the stream's error.
// Safe to call more than once, and from any goroutine (a dropped buffer's
// cleanup calls it).
func (s *CUDAStream) Free(b *Buffer) {
	if b == nil || b.stream == nil || !b.freed.CompareAndSwap(false, true) {
		return
	}
	if b.dev == 0 {
		return
	}
	s.freeUnused(b)
}

// freeUnused frees b (freed already marked) once no transfer uses it.
func (s *CUDAStream) freeUnused(b *Buffer) {
	if !b.xfer.TryLock() {
		// A transfer of b is in progress: b is freed when it ends, without
		// blocking the caller, which may hold the device (Device.Do) the
		// transfer needs. (Later than asked is still after the queued work.)
		go func() {
			b.xfer.Lock()
			b.xfer.Unlock()
			s.free(b)
		}()
		return
	}
	b.xfer.Unlock()
	s.free(b)
}

// free is Free once no transfer uses b. The checks run inside Device.Do,
// where captures begin and end and graphs count the memory they
// use, so that neither can happen between a check and the free.
func (s *CUDAStream) free(b *Buffer) {
	spare := false
	err := s.c.dev.Do(func() error {
		if s.c.captures > 0 && !b.inCapture() {
			s.c.afterCapture = append(s.c.afterCapture, b)
			return nil
		}
		spare = s.freeOnDriver(b)
		return nil
	})
	switch {
	case err != nil:
		s.freed(b, err) // the device is closed
	case spare:
		s.c.freeSpareLater(b)
	}
}

// freeOnDriver, inside Device.Do, with no capture in progress or b a
// graph allocation of the capture in progress (whose free is captured),
// frees b on s, its stream, unless a graph uses b (the last graph's Close
// frees it). A graph allocation that outlived its capture is freed on
// the stream of its graph's last launch, after that launch's work; with
// no memory behind it (its graph not launched since its last free, or
// never) it is only accounted for: a later launch frees what it
// allocates. It reports whether the stream to free on was closed (which
// drained it): the caller then frees b on the spare stream, outside
// Device.Do (freeSpareLater).
func (s *CUDAStream) freeOnDriver(b *Buffer) (spare bool) {
	if b.deferToGraphs() {
		return false
	}
	b.gfreed = true
	if b.gended && !b.gbacked {
		s.c.live.Add(-1)
		return false
	}
	on := s
	if b.glaunch != nil {
		on = b.glaunch.(*CUDAStream)
	}
	if on.isClosed() {
		// Drained; a user stream still open may have work on b queued:
		// the free goes there, after it.
		if on = b.openUser(); on == nil {
			return true
		}
	}
	inCapture := b.inCapture()
	err := s.waitUsers(b, on)
	if err == nil {
		err = on.s.Free(cuda.DevicePtr(b.dev))
	}
	switch {
	case err == nil:
		b.gbacked = false
	case inCapture:
		// A captured free that failed: the capture is broken, and its
		// allocation never gets memory behind it.
		_ = s.fail("free", fmt.Errorf("%#x: %w", b.dev, err))
		s.c.live.Add(-1)
		return false
	}
	s.freed(b, err)
	return false
}

// inCapture reports whether m is a graph allocation of a capture still in
// progress (Device.Do).
func (m *bufMem) inCapture() bool { return m.graph && !m.gended }

func (s *CUDAStream) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

// checkBacked refuses a graph allocation (memory allocated during a
// capture) with no memory behind it now: its capture is still in
// progress, or no launch of its graph has allocated it since the capture
// (or since its last free). A kernel,
// copy or memset touching it would fault, and the fault would end the
// context for every user of the GPU. Other buffers cost one flag read
// (graph, fixed at allocation). Work captured on s is not checked: it
// runs when the graph is launched, after the launch of the graph that
// allocates the memory, maybe.
func (s *CUDAStream) checkBacked(bs ...*Buffer) error {
	if s.capturing.Load() {
		return nil
	}
	graph := false
	for _, b := range bs {
		graph = graph || b != nil && b.root().graph
	}
	if !graph {
		return nil
	}
	return s.c.dev.Do(func() error {
		for _, b := range bs {
			if b == nil {
				continue
			}
			if m := b.root().bufMem; !m.gbacked {
				return fmt.Errorf("%w: the buffer %#x is memory of a CUDA graph that no launch of the graph has allocated (it is being captured, or was not launched since its capture or its last free)", ErrClosed, b.dev)
			}
		}
		return nil
	})
}

// flushFrees, inside Device.Do when the last capture has ended, frees
// the buffers whose free waited for it (freeOnDriver). It returns those
// whose stream was closed meanwhile, for freeSpare outside Device.Do.
func (c *CUDA) flushFrees() (spare []*Buffer) {
	later := c.afterCapture
	c.afterCapture = nil
	for _, b := range later {
		if b.stream.(*CUDAStream).freeOnDriver(b) {
			spare = append(spare, b)
		}
	}
	return spare
}

// freed accounts for the free of b that returned err: on failure the
// memory is leaked rather than reused under queued work, and the error is
// kept as the stream's.
func (s *CUDAStream) freed(b *Buffer, err error) {
	if err != nil {
		_ = s.fail("free", fmt.Errorf("%#x: %w", b.dev, err))
		return
	}
	s.c.live.Add(-1)
}

// View returns n bytes of a CUDA buffer from byte off, as a buffer that
// cannot be freed (it is a window on b's memory). The view keeps b
// reachable, so work that holds the view (a launch, a graph) keeps b's
// memory allocated too; Close of b's tensor still frees it.
func (b *Buffer) View(off, n int) (*Buffer, error) {
	if b.dev == 0 && b.size > 0 || b.region != nil {
		return nil, fmt.Errorf("device: view: %w on host buffers", ErrUnsupported)
	}
	if off < 0 || n < 0 || off > b.size || n > b.size-off {
		return nil, fmt.Errorf("device: view [%d, %d+%d) of a %d-byte buffer", off, off, n, b.size)
	}
	return &Buffer{bufMem: &bufMem{size: n, dev: b.dev + uint64(off)}, parent: b}, nil
}

// cudaEvent is the CUDA backend's Event.
type cudaEvent struct {
	ev *cuda.Event
}

func (e *cudaEvent) done() bool {
	ok, err := e.ev.Query()
	return ok || err != nil
}

func (e *cudaEvent) wait(ctx context.Context) error {
	if err := e.ev.Synchronize(ctx); err != nil {
		return fmt.Errorf("device: CUDA event wait: %w", closedAs(err))
	}
	return nil
}

// Record implements Stream (cuEventRecord of an event without timing).
func (s *CUDAStream) Record() (*Event, error) { return s.record(false) }

// RecordTimed is Record with an event that Elapsed can time.
func (s *CUDAStream) RecordTimed() (*Event, error) { return s.record(true) }

func (s *CUDAStream) record(timing bool) (*Event, error) {
	ev, err := s.c.dev.NewEvent(timing)
	if err != nil {
		return nil, fmt.Errorf("device: CUDA record: %w", closedAs(err))
	}
	if err := s.s.Record(ev); err != nil {
		return nil, errors.Join(fmt.Errorf("device: CUDA record: %w", closedAs(err)), ev.Close())
	}
	e := &Event{ext: &cudaEvent{ev: ev}}
	runtime.AddCleanup(e, func(ev *cuda.Event) { _ = ev.Close() }, ev)
	return e, nil
}

// Elapsed is the GPU time between two completed events recorded with
// RecordTimed (resolution about 0.5 µs).
func Elapsed(start, end *Event) (time.Duration, error) {
	a, ok1 := start.ext.(*cudaEvent)
	b, ok2 := end.ext.(*cudaEvent)
	if !ok1 || !ok2 {
		return 0, fmt.Errorf("device: elapsed: %w for events that are not CUDA events", ErrUnsupported)
	}
	d, err := b.ev.Elapsed(a.ev)
	runtime.KeepAlive(start)
	runtime.KeepAlive(end)
	if err != nil {
		return 0, fmt.Errorf("device: elapsed: %w", closedAs(err))
	}
	return d, nil
}

// Wait implements Stream: work enqueued on s after this call waits for ev,
// an event of this GPU (cuStreamWaitEvent). Host events are not supported.
func (s *CUDAStream) Wait(ev *Event) error {
	if ev == nil {
		return fmt.Errorf("device: wait on nil event")
	}
	ce, ok := ev.ext.(*cudaEvent)
	if !ok {
		return fmt.Errorf("device: CUDA stream wait: %w: not a CUDA event", ErrUnsupported)
	}
	err := s.s.WaitEvent(ce.ev)
	runtime.KeepAlive(ev)
	return s.fail("wait event", err)
}

// Synchronize implements Stream: it waits until the work enqueued so far
// has completed (polling, bounded by ctx) and returns the first error kept
// since the last Synchronize, clearing it, or the error the GPU reported
// for the work. If ctx ends first the work stays queued and the kept error
// stays too.
func (s *CUDAStream) Synchronize(ctx context.Context) error {
	s.mu.Lock()
	n := len(s.held)
	s.mu.Unlock()
	werr := s.s.Synchronize(ctx)
	if werr != nil && ctx.Err() != nil {
		return fmt.Errorf("device: CUDA synchronize: %w", closedAs(werr))
	}
	s.release(n)
	s.mu.Lock()
	err := s.err
	s.err = nil
	s.mu.Unlock()
	if werr != nil {
		werr = fmt.Errorf("device: CUDA synchronize: %w", closedAs(werr))
		if err == nil {
			return werr
		}
		return errors.Join(err, werr)
	}
	return err
}

// Close implements Stream: it waits for the queued work, destroys the
// stream and returns the kept error. Buffers of the stream freed later go
// back through the backend. A capture in progress on s is ended and its
// graph discarded.
func (s *CUDAStream) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.mu.Unlock()
	var gerr error
	if s.capturing.Load() {
		// A failed EndCapture keeps its error for the Synchronize below.
		if g, err := s.EndCapture(); err == nil {
			gerr = g.Close()
		}
	}
	serr := s.Synchronize(context.Background())
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	cerr := errors.Join(gerr, s.s.Close())
	s.c.streams.Add(-1)
	s.smallMu.Lock()
	if s.small != nil {
		cerr = errors.Join(cerr, s.small.Free())
		s.small = nil
	}
	s.smallMu.Unlock()
	if err := errors.Join(serr, cerr); err != nil {
		return fmt.Errorf("device: CUDA close stream: %w", closedAs(err))
	}
	return nil
}

// checkRange checks that [off, off+n) lies inside b.
func checkRange(op string, b *Buffer, off, n int) error {
	if b == nil {
		return fmt.Errorf("device: %s: nil buffer", op)
	}
	if b.region != nil {
		return fmt.Errorf("device: %s: %w: host buffer on a CUDA stream", op, ErrUnsupported)
	}
	if b.Freed() {
		return fmt.Errorf("device: %s: %w: the buffer %#x was freed", op, ErrClosed, b.dev)
	}
	if off < 0 || n < 0 || off > b.size || n > b.size-off {
		return fmt.Errorf("device: %s: range [%d, %d+%d) outside a %d-byte buffer", op, off, off, n, b.size)
	}
	return nil
}

// Memset enqueues setting n bytes of b from byte off to v.
func (s *CUDAStream) Memset(b *Buffer, off, n int, v byte) error {
	if err := checkRange("memset", b, off, n); err != nil {
		return s.fail("memset", err)
	}
	if err := s.checkBacked(b); err != nil {
		return s.fail("memset", err)
	}
	if err := s.s.Memset8(cuda.DevicePtr(b.dev+uint64(off)), v, n); err != nil {
		return s.fail("memset", err)
	}
	s.holdCaptured(b)
	s.noteUse(b)
	return nil
}

// holdCaptured holds the buffers of a memset or copy recorded by a
// capture, as Launch holds its arguments always: the graph keeps what its
// work uses (EndCapture). Eager copies and memsets hold nothing (a free
// after them is stream-ordered).
func (s *CUDAStream) holdCaptured(b ...*Buffer) {
	if !s.capturing.Load() {
		return
	}
	for _, v := range b {
		s.hold(v)
	}
}

// Copy enqueues a device-to-device copy of n bytes from src[srcOff:] to
// dst[dstOff:] (cuMemcpyDtoDAsync).
func (s *CUDAStream) Copy(dst *Buffer, dstOff int, src *Buffer, srcOff, n int) error {
	if err := checkRange("copy", dst, dstOff, n); err != nil {
		return s.fail("copy", err)
	}
	if err := checkRange("copy", src, srcOff, n); err != nil {
		return s.fail("copy", err)
	}
	if err := s.checkBacked(dst, src); err != nil {
		return s.fail("copy", err)
	}
	if err := s.s.CopyDtoD(cuda.DevicePtr(dst.dev+uint64(dstOff)), cuda.DevicePtr(src.dev+uint64(srcOff)), n); err != nil {
		return s.fail("copy", err)
	}
	s.holdCaptured(dst, src)
	s.noteUse(dst, src)
	return nil
}

// Enqueue runs f inside one Device.Do of s's GPU, so that the driver calls
// f makes (launches, copies and memsets on s, stream-ordered allocations
// and frees) hold the device once instead of once each, and the ranks of
// one process sharing the GPU take turns once per call. f must only
// enqueue work: it must not wait for the GPU (Synchronize, uploads,
// downloads) nor for another goroutine, since every stream of the GPU
// waits for the device while f runs.
func (s *CUDAStream) Enqueue(f func() error) error { return s.c.dev.Do(f) }

// Launch enqueues kernel k on s with the given grid and block shapes (zero
// components count as 1) and dynamic shared memory bytes. Arguments are
// passed at their own sizes, as the kernel declares them: int32, uint32,
// float32 (4 bytes); int64, uint64 (8); *Buffer and *Tensor as their device
// address (8; a nil one as 0), refused once freed. Other types are refused. Pointers reach the
// kernel only as buffers of this backend, so a kernel never receives host
// memory goep does not own (DESIGN invariant 1: the only host memory is a
// HostMapping's, which goep owns and keeps mapped); counts go by value. The buffers and
// tensors are kept alive until a Synchronize sees the work done.
func (s *CUDAStream) Launch(k *Kernel, grid, block [3]uint32, shared uint32, args ...any) error {
	task := k.task
	if k.c.dev != s.c.dev {
		return s.fail(task, errors.New("kernel of another GPU"))
	}
	if k.mod.closed.Load() {
		return s.fail(task, fmt.Errorf("module: %w", ErrClosed))
	}
	cargs := make([]any, len(args))
	var graphArgs []*Buffer // arguments whose memory is a graph allocation (checkBacked)
	for i, a := range args {
		switch v := a.(type) {
		case int32, uint32, float32, int64, uint64:
			cargs[i] = v
		case *Buffer:
			if v == nil {
				cargs[i] = cuda.DevicePtr(0)
				continue
			}
			if v.region != nil {
				return s.fail(task, fmt.Errorf("argument %d: %w: a host buffer", i, ErrUnsupported))
			}
			if v.Freed() {
				return s.fail(task, fmt.Errorf("argument %d: %w: the buffer %#x was freed", i, ErrClosed, v.dev))
			}
			if v.root().graph {
				graphArgs = append(graphArgs, v)
			}
			cargs[i] = cuda.DevicePtr(v.dev)
		case *Tensor:
			if v == nil {
				cargs[i] = cuda.DevicePtr(0)
				continue
			}
			if v.buf.region != nil {
				return s.fail(task, fmt.Errorf("argument %d: %w: a host tensor", i, ErrUnsupported))
			}
			if v.Closed() {
				return s.fail(task, fmt.Errorf("argument %d: %w: the tensor %v at %#x was closed", i, ErrClosed, v, v.buf.dev))
			}
			if v.buf.root().graph {
				graphArgs = append(graphArgs, v.buf)
			}
			cargs[i] = cuda.DevicePtr(v.buf.dev)
		default:
			return s.fail(task, fmt.Errorf("argument %d: type %T unsupported (use int32, uint32, int64, uint64, float32, *Buffer or *Tensor)", i, a))
		}
	}
	if len(graphArgs) > 0 {
		if err := s.checkBacked(graphArgs...); err != nil {
			return s.fail(task, err)
		}
	}
	// Memory allocated during a capture (graph memory nodes) is not mapped
	// until the graph runs, so captured launches are not checked.
	if s.c.checkPointers.Load() && !s.capturing.Load() {
		for i, a := range cargs {
			p, ok := a.(cuda.DevicePtr)
			if !ok || p == 0 {
				continue
			}
			dev, err := s.c.dev.IsDevicePointer(p)
			if err != nil {
				return s.fail(task, fmt.Errorf("argument %d: pointer check: %w", i, err))
			}
			if !dev && !s.c.hostMapped(uint64(p)) {
				return s.fail(task, fmt.Errorf("argument %d: %#x is not device memory (DESIGN invariant 1)", i, uint64(p)))
			}
		}
	}
	g := cuda.Dim3{X: grid[0], Y: grid[1], Z: grid[2]}
	b := cuda.Dim3{X: block[0], Y: block[1], Z: block[2]}
	if err := cuda.Launch(k.f, g, b, int(shared), s.s, cargs...); err != nil {
		return s.fail(task, err)
	}
	for _, a := range args {
		switch v := a.(type) {
		case *Buffer:
			s.hold(a)
			s.noteUse(v)
		case *Tensor:
			s.hold(a)
			if v != nil {
				s.noteUse(v.buf)
			}
		}
	}
	return nil
}

// Capturing reports whether a capture (BeginCapture) is in progress on s.
func (s *CUDAStream) Capturing() bool { return s.capturing.Load() }

// noteUse records s as a user of the memory of bufs allocated on another
// stream (Tensor.Close or a cleanup frees it on that stream, which then
// waits for s's work first: waitUsers). Memory of no goep stream (wrapped)
// is never freed by goep.
func (s *CUDAStream) noteUse(bufs ...*Buffer) {
	for _, b := range bufs {
		if b == nil {
			continue
		}
		r := b.root()
		if r.stream == nil || r.stream == Stream(s) {
			continue
		}
		r.gmu.Lock()
		if !slices.Contains(r.users, Stream(s)) {
			r.users = append(r.users, s)
		}
		r.gmu.Unlock()
	}
}

// openUser is a user stream of b (noteUse) not closed yet, or nil.
func (b *Buffer) openUser() *CUDAStream {
	b.gmu.Lock()
	defer b.gmu.Unlock()
	for _, u := range b.users {
		if us, ok := u.(*CUDAStream); ok && !us.isClosed() {
			return us
		}
	}
	return nil
}

// waitUsers, inside Device.Do before b's free on stream on, makes on wait
// for the work enqueued so far on b's other users (noteUse): the free
// returns the memory to the pool, for on's next allocations, only after
// that work. A closed user stream was drained. On an error b must not be
// freed.
func (s *CUDAStream) waitUsers(b *Buffer, on *CUDAStream) error {
	b.gmu.Lock()
	users := b.users
	b.users = nil
	b.gmu.Unlock()
	for _, u := range users {
		us, ok := u.(*CUDAStream)
		if !ok || us == on || us.isClosed() {
			continue
		}
		ev, err := s.c.dev.NewEvent(false)
		if err != nil {
			return err
		}
		err = errors.Join(us.s.Record(ev), on.s.WaitEvent(ev))
		if err = errors.Join(err, ev.Close()); err != nil {
			return err
		}
	}
	return nil
}

// upload copies data into b through pinned staging memory and waits. Data
// larger than stageChunk moves in chunks through one staging buffer.
func (s *CUDAStream) upload(ctx context.Context, b *Buffer, data []byte) error {
	if len(data) == 0 {
		return s.Synchronize(ctx)
	}
	// A view's transfer holds the buffer that owns the memory.
	owner := b.root()
	owner.xfer.RLock()
	defer owner.xfer.RUnlock()
	if owner.freed.Load() {
		return fmt.Errorf("device: CUDA upload: %w: the buffer was freed", ErrClosed)
	}
	if err := s.checkBacked(b); err != nil {
		return fmt.Errorf("device: CUDA upload: %w", err)
	}
	stage, err := s.c.stage.get(s.c.dev, min(len(data), stageChunk))
	if err != nil {
		return fmt.Errorf("device: CUDA upload: %w", closedAs(err))
	}
	for off := 0; off < len(data); off += stageChunk {
		n := min(len(data)-off, stageChunk)
		copy(stage.Bytes(), data[off:off+n])
		if err := s.s.CopyHtoD(cuda.DevicePtr(b.dev+uint64(off)), stage, 0, n); err != nil {
			return errors.Join(fmt.Errorf("device: CUDA upload: %w", closedAs(err)), s.c.stage.put(stage))
		}
		// The staging buffer is reused once the copy is done.
		if err := s.syncStaged(ctx, stage, "upload", true); err != nil {
			return err
		}
	}
	if err := s.c.stage.put(stage); err != nil {
		return fmt.Errorf("device: CUDA upload: %w", closedAs(err))
	}
	return nil
}

// download copies b to the host through pinned staging memory, after the
// work queued before it. A buffer larger than stageChunk moves in chunks
// through one staging buffer.
// download is DownloadBuffer of the first n bytes of b (copier).
func (s *CUDAStream) download(ctx context.Context, b *Buffer, n int) ([]byte, error) {
	if n < 0 || n > b.size {
		return nil, fmt.Errorf("device: CUDA download of %d bytes of a %d-byte buffer", n, b.size)
	}
	if n == 0 {
		return []byte{}, s.Synchronize(ctx)
	}
	// A view's transfer holds the buffer that owns the memory.
	owner := b.root()
	owner.xfer.RLock()
	defer owner.xfer.RUnlock()
	if owner.freed.Load() {
		return nil, fmt.Errorf("device: CUDA download: %w: the buffer was freed", ErrClosed)
	}
	if err := s.checkBacked(b); err != nil {
		return nil, fmt.Errorf("device: CUDA download: %w", err)
	}
	if n <= smallStage {
		return s.downloadSmall(ctx, b, n)
	}
	stage, err := s.c.stage.get(s.c.dev, min(n, stageChunk))
	if err != nil {
		return nil, fmt.Errorf("device: CUDA download: %w", closedAs(err))
	}
	out := make([]byte, n)
	for off := 0; off < n; off += stageChunk {
		m := min(n-off, stageChunk)
		if err := s.s.CopyDtoH(stage, 0, cuda.DevicePtr(b.dev+uint64(off)), m); err != nil {
			return nil, errors.Join(fmt.Errorf("device: CUDA download: %w", closedAs(err)), s.c.stage.put(stage))
		}
		if err := s.syncStaged(ctx, stage, "download", true); err != nil {
			return nil, err
		}
		copy(out[off:], stage.Bytes()[:m])
	}
	if err := s.c.stage.put(stage); err != nil {
		return nil, fmt.Errorf("device: CUDA download: %w", closedAs(err))
	}
	return out, nil
}

// syncStaged synchronizes s and returns stage to the pool (unless keep,
// when the copy succeeded: the caller reads and returns it). If ctx ends
// with the copy possibly in flight, the return waits behind the stream's
// work (a later Synchronize).
func (s *CUDAStream) syncStaged(ctx context.Context, stage *cuda.HostBuffer, op string, keep bool) error {
	err := s.Synchronize(ctx)
	switch {
	case err != nil && ctx.Err() != nil:
		s.hold(func() { _ = s.c.stage.put(stage) })
		return fmt.Errorf("device: CUDA %s: %w", op, err)
	case err != nil:
		return errors.Join(fmt.Errorf("device: CUDA %s: %w", op, err), s.c.stage.put(stage))
	case !keep:
		if err := s.c.stage.put(stage); err != nil {
			return fmt.Errorf("device: CUDA %s: %w", op, err)
		}
	}
	return nil
}

// DownloadBuffer copies b (which may be a View) to the host through pinned
// staging memory, after the work queued before it, and waits.
func (s *CUDAStream) DownloadBuffer(ctx context.Context, b *Buffer) ([]byte, error) {
	return s.download(ctx, b, b.size)
}

// UploadBuffer copies data into b (which may be a View) through pinned
// staging memory, after the work queued before it, and waits.
func (s *CUDAStream) UploadBuffer(ctx context.Context, b *Buffer, data []byte) error {
	if len(data) > b.size {
		return fmt.Errorf("device: CUDA upload of %d bytes into a %d-byte buffer", len(data), b.size)
	}
	return s.upload(ctx, b, data)
}

// Graph is GPU work captured from a CUDA stream, replayable with Launch.
// The memory its work uses stays allocated while it lives: a tensor freed
// (closed or dropped) after the capture is freed at the graph's Close, or
// once the graph itself is dropped.
type Graph struct{ *graphState }

// graphState is a Graph's state, apart from it for the cleanup that closes
// a dropped graph.
type graphState struct {
	c    *CUDA // the backend of the captured stream
	g    *cuda.Graph
	once sync.Once
	err  error
	// mems is the memory the captured work uses (the buffers of goep's
	// streams that the capture did not allocate): each counts the graph in
	// its graphs until Close.
	mems []*bufMem
	// allocs are the graph allocations the capture did not free: each
	// launch allocates their memory (Launch). Set once at EndCapture.
	allocs []*bufMem
}

// BeginCapture starts recording the work enqueued on s into a graph
// instead of running it (stream capture). Only work that needs no host
// synchronization can be captured: kernels, copies between device
// buffers, memsets, stream-ordered allocations and frees.
//
// Memory allocated during the capture is a graph allocation (a memory node
// of the graph): free it in the same capture, as the fused calls do with
// their temporaries, or pass the outputs in (the Into calls). One that the
// capture does not free has memory behind it only from a launch of the
// graph to its free (Graph.Launch); before the first launch, or when the
// capture is discarded, its free only does the bookkeeping. Frees asked
// for during the capture of memory allocated outside it, by Close or by a
// dropped tensor's cleanup on another goroutine, are not captured: they
// are enqueued when the last capture of the GPU ends. Only work enqueued
// on s itself is captured and tracked: a stream that joins the capture
// through Wait on an event of s is not (its work with the capture's
// allocations is refused as eager work on memory with nothing behind it).
func (s *CUDAStream) BeginCapture() error {
	return s.c.dev.Do(func() error {
		if err := s.s.BeginCapture(); err != nil {
			// (Also on a stream capturing already: that capture goes on.)
			return s.fail("begin capture", err)
		}
		s.mu.Lock()
		s.captureFrom = len(s.held)
		s.mu.Unlock()
		s.capturing.Store(true)
		s.c.captures++
		return nil
	})
}

// EndCapture ends the capture and returns the graph. The memory the
// captured work uses stays allocated until the graph is closed (or
// dropped). When no other capture of the GPU is in progress, the frees put
// off meanwhile are enqueued now (also when the capture failed), except
// those of memory a graph uses, which the graph's Close frees.
func (s *CUDAStream) EndCapture() (*Graph, error) {
	var g *cuda.Graph
	var err error
	var mems, allocs []*bufMem
	var spare []*Buffer
	derr := s.c.dev.Do(func() error {
		g, err = s.s.EndCapture()
		if s.capturing.Swap(false) {
			s.c.captures--
		}
		s.mu.Lock()
		held := s.held[min(s.captureFrom, len(s.held)):]
		if err == nil {
			mems = capturedMemory(held)
		}
		s.mu.Unlock()
		for _, m := range mems {
			m.useInGraph()
		}
		// The capture's allocations that it did not free outlive it; a
		// failed capture's never have memory behind them.
		for _, m := range s.capAllocs {
			if !m.gfreed {
				m.gended = true
				if err == nil {
					allocs = append(allocs, m)
				}
			}
		}
		s.capAllocs = nil
		if s.c.captures == 0 {
			spare = s.c.flushFrees()
		}
		return nil
	})
	for _, b := range spare {
		s.c.freeSpareLater(b)
	}
	if err = errors.Join(err, derr); err != nil {
		return nil, s.fail("end capture", err)
	}
	st := &graphState{c: s.c, g: g, mems: mems, allocs: allocs}
	graph := &Graph{st}
	runtime.AddCleanup(graph, func(st *graphState) { _ = st.close() }, st)
	return graph, nil
}

// capturedMemory is the memory that captured work holds (held: buffers,
// tensors, views), once each: memory of goep's streams, not allocated by
// the capture (graph allocations are the graph's own).
func capturedMemory(held []any) []*bufMem {
	var mems []*bufMem
	seen := map[*bufMem]bool{}
	for _, v := range held {
		var b *Buffer
		switch v := v.(type) {
		case *Buffer:
			b = v
		case *Tensor:
			if v != nil {
				b = v.buf
			}
		}
		if b == nil {
			continue
		}
		m := b.root().bufMem
		if m.stream == nil || m.inCapture() || m.dev == 0 || seen[m] {
			continue
		}
		seen[m] = true
		mems = append(mems, m)
	}
	return mems
}

// Launch enqueues the graph's work on s. The graph's allocations that its
// capture did not free are allocated by the launch: their buffers must be
// freed before the next launch (the driver refuses it otherwise, and so
// does Launch, naming the buffer). Those whose buffers were freed already
// are freed again right after the launch, in stream order, since nothing
// can reach them.
func (g *Graph) Launch(s *CUDAStream) error {
	if s.c != g.c {
		return s.fail("graph launch", errors.New("the graph was captured on another backend's stream"))
	}
	launched := false
	err := s.c.dev.Do(func() error {
		for _, m := range g.allocs {
			switch {
			case m.gbacked && m.gfreed:
				return fmt.Errorf("the graph's allocation %#x (%d bytes) from its last launch: its free has not reached the driver (it failed, or waits for the spare stream)", m.dev, m.size)
			case m.gbacked:
				return fmt.Errorf("the graph's allocation %#x (%d bytes) from its last launch is not freed yet: free it before launching the graph again (a free asked for during a capture, or of memory another graph uses, waits for that capture's end or that graph's Close)", m.dev, m.size)
			}
		}
		if err := g.g.Launch(s.s); err != nil {
			return err
		}
		launched = true
		var errs []error
		for _, m := range g.allocs {
			m.gbacked, m.glaunch = true, s
			if m.gfreed {
				// Nothing can reach this memory: free it after the launch.
				if err := s.s.Free(cuda.DevicePtr(m.dev)); err != nil {
					errs = append(errs, fmt.Errorf("free of the graph's allocation %#x after the launch: %w", m.dev, err))
					continue
				}
				m.gbacked = false
			}
		}
		return errors.Join(errs...)
	})
	if launched {
		s.hold(g)
	}
	return s.fail("graph launch", err)
}

// Close destroys the graph; its launches must have completed. Memory the
// graph used whose free was asked for while it lived is freed now (on its
// own stream), unless another graph still uses it. Safe to call more than
// once.
func (g *Graph) Close() error { return g.close() }

func (st *graphState) close() error {
	st.once.Do(func() {
		st.err = closedAs(st.g.Close())
		for _, m := range st.mems {
			if m.graphClosed() {
				m.stream.(*CUDAStream).freeUnused(&Buffer{bufMem: m})
			}
		}
		st.mems = nil
	})
	return st.err
}
