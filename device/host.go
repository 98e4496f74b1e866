package device

import (
	"context"
	"fmt"
	"math"
	"math/bits"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// guardSize is the number of guard bytes on each side of every host buffer.
// They are filled with guardByte at allocation and checked by CheckGuards, so
// an out-of-bounds write by any op shows up in tests.
const (
	guardSize = 64
	guardByte = 0xA5
	// maxPoolLimit bounds the bytes the host pool keeps for reuse, and
	// poolShare the share of the host memory available it may keep
	// (pooled pages stay resident, taken from everything else the process
	// and the machine do). The share follows the memory available,
	// re-read at most every limitRefresh when a large region is freed.
	maxPoolLimit = 8 << 30
	poolShare    = 8
	limitRefresh = 100 * time.Millisecond
	// poolIdle is how long a pooled region may wait for reuse: a size no
	// call has asked for since is given back to the system.
	poolIdle = 10 * time.Second
)

// Host is the host (CPU) backend. Its memory is mmap'd and pooled by size
// class; its streams run tasks on worker goroutines.
//
// The pool keeps freed regions for reuse by size class (sizeClass: at most
// an eighth more than asked for), up to poolLimit bytes: when a freed
// region does not fit, the regions pooled longest ago are given back
// first, and a region not reused within poolIdle (plus idleScan at most)
// is given back, so what stays resident follows what the calls use.
type Host struct {
	mu sync.Mutex
	// pool holds the free regions of each size class, oldest first.
	pool      map[int][]*region
	pooled    int
	poolLimit int // the most pooled may reach
	limitAt   time.Time
	scannedAt time.Time // the last look for idle regions (evict)
	closed    bool
	live      atomic.Int64 // regions handed out and not yet returned
	streams   atomic.Int64
}

// NewHost returns a host backend. Its pool keeps at most an eighth of the
// host memory available now (HostMemoryAvailable), and at most 8 GiB.
func NewHost() *Host {
	limit := maxPoolLimit
	if n, ok := hostMemoryAvailable(); ok {
		limit = int(min(int64(limit), n/poolShare))
	}
	return &Host{pool: map[int][]*region{}, poolLimit: limit, limitAt: now()}
}

// now is the pool's clock; tests replace it.
var now = time.Now

// Kind implements Backend.
func (h *Host) Kind() Kind { return KindHost }

// LiveBuffers is the number of buffers allocated and not yet freed (tests use
// it to check that Close frees everything).
func (h *Host) LiveBuffers() int64 { return h.live.Load() }

// sizeClass rounds n up to a whole number of pages: to one of eight
// evenly spaced sizes between consecutive powers of two (at most an eighth
// more than n), so that buffers of close sizes share regions while the
// memory a region wastes stays small.
func sizeClass(n int) int {
	const page = 4096
	if n <= page {
		return page
	}
	step := max(page, 1<<max(bits.Len(uint(n-1))-4, 0))
	return (n + step - 1) / step * step
}

// region is one mapping of host "device memory": a memfd mapped shared, so
// that ranks in other processes can map it too (ShareHandle).
type region struct {
	mem []byte
	fd  int    // memfd, or -1 for a private anonymous mapping
	ino uint64 // the memfd's inode, naming it across processes
	// discard sends the region back to the system when freed, never to
	// the pool (Buffer.FreeToSystem).
	discard atomic.Bool
	// pooledAt is when the region went back to the pool (guarded by
	// Host.mu).
	pooledAt time.Time
}

// idleScan is how often, at most, the pool looks for regions idle for
// poolIdle: a look visits every size class, too much for every free.
const idleScan = poolIdle / 10

func (r *region) release() error {
	err := unix.Munmap(r.mem)
	if r.fd >= 0 {
		if cerr := unix.Close(r.fd); err == nil {
			err = cerr
		}
	}
	return err
}

func (h *Host) get(n int) (*region, error) {
	c := sizeClass(n + 2*guardSize)
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return nil, fmt.Errorf("device: host alloc: %w", ErrClosed)
	}
	if l := h.pool[c]; len(l) > 0 {
		r := l[len(l)-1]
		if h.pool[c] = l[:len(l)-1]; len(h.pool[c]) == 0 {
			delete(h.pool, c)
		}
		h.pooled -= c
		h.mu.Unlock()
		h.live.Add(1)
		return r, nil
	}
	free := h.evict(now(), 0)
	h.mu.Unlock()
	for _, f := range free {
		_ = f.release()
	}
	if err := h.roomFor(n + 2*guardSize); err != nil {
		return nil, err
	}
	r, err := newRegion(c)
	if err != nil {
		return nil, err
	}
	h.live.Add(1)
	return r, nil
}

// checkRoomFrom is the smallest new region whose size get compares with
// the host memory available (reading it costs tens of microseconds).
const checkRoomFrom = 1 << 20

// roomFor returns an error when n bytes (at least checkRoomFrom) are more
// than the host memory available (HostMemoryAvailable), after giving the
// pooled regions back if that is what it takes. Regions are mapped lazily,
// so without this an allocation that can never be backed would succeed and
// the process would be killed by the kernel when it touched the pages; with
// it the caller gets an error. It cannot foresee a shortage that later
// allocations and touches together make.
func (h *Host) roomFor(n int) error {
	if n < checkRoomFrom {
		return nil
	}
	avail, ok := hostMemoryAvailable()
	if !ok || int64(n) <= avail {
		return nil
	}
	if freed, _ := h.drainPool(); freed > 0 {
		if avail, ok = hostMemoryAvailable(); !ok || int64(n) <= avail {
			return nil
		}
	}
	return fmt.Errorf("device: host alloc of %s: only %s of host memory is available (MemAvailable, or the cgroup's limit less its usage)",
		formatBytes(int64(n)), formatBytes(avail))
}

// drainPool unmaps the pooled regions. It returns how many bytes they held
// and the first error of an unmap.
func (h *Host) drainPool() (int, error) {
	h.mu.Lock()
	var free []*region
	for c, l := range h.pool {
		free = append(free, l...)
		delete(h.pool, c)
	}
	n := h.pooled
	h.pooled = 0
	h.mu.Unlock()
	var first error
	for _, r := range free {
		if err := r.release(); err != nil && first == nil {
			first = err
		}
	}
	return n, first
}

// newRegion maps c bytes backed by a memfd. If no memfd can be made (out of
// file descriptors, say) it falls back to private memory, which works for
// ranks in this process only.
func newRegion(c int) (*region, error) {
	fd, err := unix.MemfdCreate("goep", unix.MFD_CLOEXEC)
	if err == nil {
		if err = unix.Ftruncate(fd, int64(c)); err == nil {
			var st unix.Stat_t
			if err = unix.Fstat(fd, &st); err == nil {
				m, err := unix.Mmap(fd, 0, c, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
				if err == nil {
					return &region{mem: m, fd: fd, ino: st.Ino}, nil
				}
			}
		}
		unix.Close(fd)
	}
	m, err := unix.Mmap(-1, 0, c, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		return nil, fmt.Errorf("device: host alloc of %d bytes: mmap: %w", c, err)
	}
	return &region{mem: m, fd: -1}, nil
}

func (h *Host) put(r *region) {
	h.live.Add(-1)
	t := now()
	h.mu.Lock()
	if len(r.mem) >= checkRoomFrom && t.Sub(h.limitAt) >= limitRefresh {
		h.limitAt = t
		if avail, ok := hostMemoryAvailable(); ok {
			// Pooled pages count as used in what is available.
			h.poolLimit = int(min(maxPoolLimit, (avail+int64(h.pooled))/poolShare))
		}
	}
	free := h.evict(t, 0)
	if h.closed || r.discard.Load() || len(r.mem) > h.poolLimit {
		free = append(free, r)
	} else {
		free = append(free, h.evict(t, h.pooled+len(r.mem)-h.poolLimit)...)
		r.pooledAt = t
		h.pool[len(r.mem)] = append(h.pool[len(r.mem)], r)
		h.pooled += len(r.mem)
	}
	h.mu.Unlock()
	for _, f := range free {
		_ = f.release() // cannot fail for a region we mapped
	}
}

// evict takes out of the pool, for the caller to release outside the
// lock, the regions pooled before t - poolIdle (looking at most every
// idleScan), then the regions pooled longest ago until at least need more
// bytes are out.
func (h *Host) evict(t time.Time, need int) []*region {
	if need <= 0 {
		if t.Sub(h.scannedAt) < idleScan {
			return nil
		}
		h.scannedAt = t
	}
	var out []*region
	for {
		oldest := -1
		for c, l := range h.pool {
			if len(l) > 0 && (oldest < 0 || l[0].pooledAt.Before(h.pool[oldest][0].pooledAt)) {
				oldest = c
			}
		}
		if oldest < 0 {
			return out
		}
		r := h.pool[oldest][0]
		if need <= 0 && t.Sub(r.pooledAt) < poolIdle {
			return out
		}
		if h.pool[oldest] = h.pool[oldest][1:]; len(h.pool[oldest]) == 0 {
			delete(h.pool, oldest)
		}
		h.pooled -= len(r.mem)
		need -= len(r.mem)
		out = append(out, r)
	}
}

// Close unmaps the pooled memory. Buffers still live are unmapped when freed.
func (h *Host) Close() error {
	h.mu.Lock()
	h.closed = true
	h.mu.Unlock()
	if _, err := h.drainPool(); err != nil {
		return fmt.Errorf("device: host close: %w", err)
	}
	return nil
}

// NewStream implements Backend.
func (h *Host) NewStream() (Stream, error) {
	h.mu.Lock()
	closed := h.closed
	h.mu.Unlock()
	if closed {
		return nil, fmt.Errorf("device: new stream: %w", ErrClosed)
	}
	s := &HostStream{host: h}
	s.work = sync.NewCond(&s.mu)
	h.streams.Add(1)
	go s.run()
	return s, nil
}

// Buffer is a region of device memory. On the host backend Host() is its
// bytes; guard bytes surround it. On the CUDA backend DevicePtr() is its
// address and Host() is nil.
//
// A tensor's memory is freed when its Buffer can no longer be reached (or
// at Close), not its Tensor: queued work, another tensor over the same
// buffer and a view of it keep the Buffer, and so the memory, alive. A CUDA
// graph whose work uses the memory puts its free off until the graph's
// Close (Graph).
type Buffer struct {
	*bufMem
	// parent is the buffer a view is a window on: the view keeps it
	// reachable, and so its memory allocated.
	parent *Buffer
}

// bufMem is a Buffer's state, apart from the Buffer so that the cleanup
// that frees a dropped buffer's memory can hold it without keeping the
// Buffer reachable.
type bufMem struct {
	size   int
	region []byte  // whole mapping, guards included (host)
	reg    *region // nil for a peer's buffer mapped from a ShareHandle
	dev    uint64  // device address (CUDA backend), else 0
	stream Stream
	freed  atomic.Bool
	shared int8 // CUDA shared memory: sharedOwn, sharedOpened, sharedAlias, sharedVMMOpened; else 0
	graph  bool // CUDA: allocated during a stream capture (a graph allocation)
	// CUDA graph allocations, guarded by Device.Do. gended: the capture
	// ended (or was discarded) without freeing the memory, which the
	// graph then allocates at each launch (Graph.Launch); gbacked: a
	// launch allocated it and no free has succeeded since; gfreed: goep's
	// free of the buffer has run (in the capture, or after it); glaunch:
	// the stream of the last launch, whose work the free must follow.
	gended, gbacked, gfreed bool
	glaunch                 Stream
	// xfer is read-held by a CUDA upload or download of the buffer (or of
	// a view of it), which may span several copies and waits: a free (Close
	// on another goroutine, say) waits for it instead of handing the memory
	// back under it.
	xfer sync.RWMutex
	// graphs counts the CUDA graphs (Graph) whose captured work uses the
	// buffer; a free asked for while it is not zero (freeLater) waits for
	// the last of them to be closed. Guarded by gmu.
	gmu       sync.Mutex
	graphs    int
	freeLater bool
	// users are the CUDA streams other than the buffer's own on which work
	// using it was enqueued (a launch, copy or memset): its free waits for
	// the work enqueued on them before it (CUDAStream.waitUsers), as the
	// caching allocators' record_stream. Guarded by gmu.
	users []Stream
}

// freeByCleanup is the cleanup NewTensor attaches to a tensor's Buffer: it
// frees the memory of a buffer dropped without Close, in stream order (so
// after the work already queued on it).
func freeByCleanup(m *bufMem) { m.stream.Free(&Buffer{bufMem: m}) }

// root is the buffer that owns b's memory: b, or the buffer b is a view of.
func (b *Buffer) root() *Buffer {
	for b.parent != nil {
		b = b.parent
	}
	return b
}

// useInGraph counts a graph that uses b's memory.
func (m *bufMem) useInGraph() {
	m.gmu.Lock()
	m.graphs++
	m.gmu.Unlock()
}

// deferToGraphs reports whether a graph uses the memory, and if so notes
// that the last graph's Close (graphClosed) must free it.
func (m *bufMem) deferToGraphs() bool {
	m.gmu.Lock()
	defer m.gmu.Unlock()
	if m.graphs == 0 {
		return false
	}
	m.freeLater = true
	return true
}

// graphClosed drops a graph's use of the memory and reports whether the
// memory must be freed now (the last graph is gone and a free was asked
// for while it lived).
func (m *bufMem) graphClosed() bool {
	m.gmu.Lock()
	defer m.gmu.Unlock()
	m.graphs--
	if m.graphs > 0 || !m.freeLater {
		return false
	}
	m.freeLater = false
	return true
}

// Kinds of CUDA shared buffers (AllocShared, OpenShared).
const (
	sharedOwn       = 1 // exported by this process (cuMemAlloc, or a VMM allocation)
	sharedOpened    = 2 // a peer's, mapped by cuIpcOpenMemHandle
	sharedAlias     = 3 // a peer's in this process, used at its address
	sharedVMMOpened = 4 // a peer's VMM allocation, imported and mapped here
)

// DevicePtr is the buffer's device address on the CUDA backend (0 on the
// host backend, and for an empty CUDA buffer).
func (b *Buffer) DevicePtr() uint64 { return b.dev }

// Size is the usable size in bytes.
func (b *Buffer) Size() int { return b.size }

// Freed reports whether the buffer's memory was handed back (Free, its
// tensor's Close; for a view, that of the buffer it is a window on). Work
// enqueued after that must not use it: the memory may belong to another
// buffer by then.
func (b *Buffer) Freed() bool { return b != nil && b.root().freed.Load() }

// Host returns the buffer's bytes on the host backend (nil elsewhere). Read
// them only after the work that writes them has completed.
func (b *Buffer) Host() []byte {
	if b.region == nil {
		return nil
	}
	return b.region[guardSize : guardSize+b.size : guardSize+b.size]
}

// CheckGuards reports an error if anything wrote outside the buffer.
func (b *Buffer) CheckGuards() error {
	if b.region == nil {
		return nil
	}
	for i, v := range b.region[:guardSize] {
		if v != guardByte {
			return fmt.Errorf("device: guard byte %d before a %d-byte buffer was overwritten (0x%02x)", guardSize-i, b.size, v)
		}
	}
	for i, v := range b.region[guardSize+b.size : guardSize+b.size+guardSize] {
		if v != guardByte {
			return fmt.Errorf("device: guard byte %d after a %d-byte buffer was overwritten (0x%02x)", i, b.size, v)
		}
	}
	return nil
}

// FreeToSystem is Free, except that the memory is unmapped instead of
// going back to the pool: for memory that another process may still write
// through its own mapping after this one is done with it (a failed
// domain's control block). Those mappings stay valid; nothing of this
// process gets the memory again.
func (b *Buffer) FreeToSystem() {
	if b != nil && b.reg != nil {
		b.reg.discard.Store(true)
	}
	b.Free()
}

// Free returns the buffer to its stream's pool in stream order. It is safe
// to call more than once.
func (b *Buffer) Free() {
	if b == nil || b.stream == nil {
		return
	}
	b.stream.Free(b)
}

type task struct {
	name   string
	fn     func() error
	always bool // run even after an earlier task failed (frees, event waits)
	// prior, when set, is run instead of fn, always, with the error the
	// stream holds when it starts (nil if none): GoCollective.
	prior func(held error) error
}

// HostStream is a Stream of the host backend: a FIFO of Go functions run by
// one worker goroutine (or, while it is idle, by a Synchronize whose
// context cannot end: waitFor). The first error a task returns is kept; later tasks
// are skipped (except frees) until Synchronize reports and clears it, as a
// GPU stream's error would be.
type HostStream struct {
	host *Host

	mu sync.Mutex
	// work wakes the worker when a task is queued or the stream closes.
	work *sync.Cond
	// queue holds the tasks not yet run from index head on; it is empty
	// (head 0) once they have all run, so that its array is used again
	// from the start and push appends without allocating. The array
	// keeps the size of the largest backlog the stream has had (its
	// slots cleared as they run).
	queue    []task
	head     int
	enqueued uint64 // tasks ever enqueued
	done     uint64 // tasks completed
	err      error
	closed   bool
	stopped  bool
	// running: a task is being run, by the worker or by a goroutine
	// waiting for it (waitFor runs the queued tasks itself while the
	// worker is idle, which spares two goroutine hand-offs a call).
	running bool
	// waiting are the goroutines waiting for done to reach a task: each
	// is woken once, when it has (or the worker stops), not at every task
	// that completes before it (a call's output frees, say).
	waiting []streamWaiter
}

// streamWaiter waits for the task numbered seq; ch is closed when it
// completes.
type streamWaiter struct {
	seq uint64
	ch  chan struct{}
}

// release wakes the waiters whose task has completed (all of them once
// the worker has stopped). Called with s.mu held.
func (s *HostStream) release() {
	kept := s.waiting[:0]
	for _, w := range s.waiting {
		if w.seq <= s.done || s.stopped {
			close(w.ch)
		} else {
			kept = append(kept, w)
		}
	}
	clear(s.waiting[len(kept):])
	s.waiting = kept
}

// Backend implements Stream.
func (s *HostStream) Backend() Backend { return s.host }

// Go enqueues fn. The name appears in the error if fn fails.
func (s *HostStream) Go(name string, fn func() error) {
	s.enqueue(task{name: name, fn: fn})
}

// GoCollective enqueues fn like Go, except that it runs even after an
// earlier task failed, and gets the error the stream holds when it starts
// (nil if none; Synchronize clears it). It is for the task of a collective
// call, which must join its exchange with the peers whatever failed
// before it on this rank (then telling them, so that they fail the call
// too): a task skipped on one rank would pair the peers' exchanges with
// this rank's next call. The stream keeps its first error.
func (s *HostStream) GoCollective(name string, fn func(held error) error) {
	s.enqueue(task{name: name, always: true, prior: fn})
}

func (s *HostStream) enqueue(t task) uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		if s.err == nil {
			s.err = &TaskError{Task: t.name, Err: ErrClosed}
		}
		return s.enqueued
	}
	s.push(t)
	return s.enqueued
}

// push queues t, with s.mu held, and wakes the worker. A full array whose
// first half has run is compacted instead of grown: the tasks left, half
// the array at most, move to its start, and half of it is then free, so
// that a queue that never drains still appends in amortized constant time
// and keeps its array.
func (s *HostStream) push(t task) {
	if len(s.queue) == cap(s.queue) && s.head >= len(s.queue)/2 && s.head > 0 {
		n := copy(s.queue, s.queue[s.head:])
		clear(s.queue[n:])
		s.queue, s.head = s.queue[:n], 0
	}
	s.queue = append(s.queue, t)
	s.enqueued++
	s.work.Signal()
}

func (s *HostStream) run() {
	s.mu.Lock()
	for {
		for !s.closed && (len(s.queue) == 0 || s.running) {
			s.work.Wait()
		}
		if s.running { // closing while a waiter runs a task: it wakes us
			s.work.Wait()
			continue
		}
		if len(s.queue) == 0 { // closed and drained
			s.stopped = true
			s.release()
			s.mu.Unlock()
			s.host.streams.Add(-1)
			return
		}
		s.runNext()
	}
}

// runNext runs the first queued task, with s.mu held (it is released
// while the task runs) and no task running.
func (s *HostStream) runNext() {
	t := s.queue[s.head]
	s.queue[s.head] = task{}
	s.head++
	if s.head == len(s.queue) {
		s.queue, s.head = s.queue[:0], 0
	}
	skip := s.err != nil && !t.always
	held := s.err
	s.running = true
	s.mu.Unlock()

	var err error
	if !skip {
		err = runTask(t, held)
	}

	s.mu.Lock()
	s.running = false
	if err != nil && s.err == nil {
		s.err = &TaskError{Task: t.name, Err: err}
	}
	s.done++
	if len(s.waiting) > 0 {
		s.release()
	}
}

// runTask runs t, turning a panic into an error so a bug in one op cannot
// take the process down from a worker goroutine.
func runTask(t task, held error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("panic: %v", r)
		}
	}()
	if t.prior != nil {
		return t.prior(held)
	}
	return t.fn()
}

// Alloc implements Stream. The bytes are not zeroed.
func (s *HostStream) Alloc(n int) (*Buffer, error) {
	if n < 0 {
		return nil, fmt.Errorf("device: alloc of %d bytes", n)
	}
	r, err := s.host.get(n)
	if err != nil {
		return nil, err
	}
	m := r.mem
	for i := 0; i < guardSize; i++ {
		m[i] = guardByte
		m[guardSize+n+i] = guardByte
	}
	return &Buffer{bufMem: &bufMem{size: n, region: m, reg: r, stream: s}}, nil
}

// Free implements Stream.
func (s *HostStream) Free(b *Buffer) {
	if b == nil || b.reg == nil || !b.freed.CompareAndSwap(false, true) {
		return
	}
	m := b.reg
	// Checked and queued under one lock: a Free racing Close (a garbage
	// collector finalizer, say) must neither fail the stream nor lose m.
	s.mu.Lock()
	if s.closed || s.done == s.enqueued {
		// The stream has drained, or is idle (every task enqueued has
		// completed): no queued work can still use b, and a task
		// enqueued from now on runs after this free, as it would behind
		// a free task. This spares an idle stream's worker a wake-up
		// for every output a caller closes after Synchronize.
		s.mu.Unlock()
		s.host.put(m)
		return
	}
	s.push(task{name: "free", always: true, fn: func() error {
		s.host.put(m)
		return nil
	}})
	s.mu.Unlock()
}

// Event marks a point in a stream.
type Event struct {
	stream *HostStream
	seq    uint64
	ext    eventExt // another backend's event (CUDA), else nil
}

// eventExt is an event of a backend other than the host's.
type eventExt interface {
	done() bool
	wait(ctx context.Context) error
}

// Done reports whether the work before the event has completed.
func (e *Event) Done() bool {
	if e.ext != nil {
		return e.ext.done()
	}
	e.stream.mu.Lock()
	defer e.stream.mu.Unlock()
	return e.stream.done >= e.seq || e.stream.stopped
}

// Wait blocks until the event completes or ctx ends.
func (e *Event) Wait(ctx context.Context) error {
	if e.ext != nil {
		return e.ext.wait(ctx)
	}
	return e.stream.waitFor(ctx, e.seq)
}

// Record implements Stream.
func (s *HostStream) Record() (*Event, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return &Event{stream: s, seq: s.enqueued}, nil
}

// Wait implements Stream.
func (s *HostStream) Wait(ev *Event) error {
	if ev == nil {
		return fmt.Errorf("device: wait on nil event")
	}
	if ev.stream == s {
		return nil
	}
	s.enqueue(task{name: "wait event", always: true, fn: func() error {
		if ev.ext != nil {
			return ev.ext.wait(context.Background())
		}
		return ev.stream.waitFor(context.Background(), ev.seq)
	}})
	return nil
}

func (s *HostStream) waitFor(ctx context.Context, seq uint64) error {
	s.mu.Lock()
	// While the worker is idle, a wait that cannot be cancelled runs the
	// tasks up to seq itself: it would otherwise wake the worker and
	// sleep until the worker wakes it back (two hand-offs, most of a
	// small call's time when many ranks share few cores). The worker
	// takes over what is left. A wait whose context can end leaves the
	// tasks to the worker, so that it returns when the context ends.
	for ctx.Done() == nil && s.done < seq && !s.running && len(s.queue) > 0 && !s.stopped {
		s.runNext()
		if len(s.queue) > 0 || s.closed {
			s.work.Broadcast()
		}
	}
	if s.done >= seq || s.stopped {
		s.mu.Unlock()
		return nil
	}
	if err := ctx.Err(); err != nil {
		s.mu.Unlock()
		return fmt.Errorf("device: stream wait: %w", err)
	}
	w := streamWaiter{seq: seq, ch: make(chan struct{})}
	s.waiting = append(s.waiting, w)
	s.mu.Unlock()
	select {
	case <-w.ch:
		return nil
	case <-ctx.Done():
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	select {
	case <-w.ch: // the task completed too
		return nil
	default:
	}
	for i := range s.waiting {
		if s.waiting[i].ch == w.ch {
			s.waiting = slices.Delete(s.waiting, i, i+1)
			break
		}
	}
	return fmt.Errorf("device: stream wait: %w", ctx.Err())
}

// Synchronize implements Stream.
func (s *HostStream) Synchronize(ctx context.Context) error {
	s.mu.Lock()
	seq := s.enqueued
	s.mu.Unlock()
	if err := s.waitFor(ctx, seq); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	err := s.err
	s.err = nil
	return err
}

// Close implements Stream: it lets queued work finish, then stops the
// worker. Work enqueued after Close fails with ErrClosed.
func (s *HostStream) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.work.Signal()
	var stopped chan struct{}
	if !s.stopped {
		stopped = make(chan struct{})
		s.waiting = append(s.waiting, streamWaiter{seq: math.MaxUint64, ch: stopped})
	}
	s.mu.Unlock()
	if stopped != nil {
		<-stopped
	}
	s.mu.Lock()
	err := s.err
	s.err = nil
	s.mu.Unlock()
	return err
}
