//go:build mpi

package mpi

/*
#cgo pkg-config: ompi
#include <stdlib.h>
#include <mpi.h>

// Open MPI's handles are macros that take addresses of its globals; cgo
// cannot use them directly.
static MPI_Comm goep_comm_world(void) { return MPI_COMM_WORLD; }
static MPI_Comm goep_comm_null(void) { return MPI_COMM_NULL; }
static MPI_Datatype goep_byte(void) { return MPI_BYTE; }
static MPI_Datatype goep_int(void) { return MPI_INT; }
static MPI_Datatype goep_int64(void) { return MPI_INT64_T; }
static int goep_max_error_string(void) { return MPI_MAX_ERROR_STRING; }
static int goep_errors_return(MPI_Comm c) { return MPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN); }
static int goep_test(MPI_Request *r, int *flag) { return MPI_Test(r, flag, MPI_STATUS_IGNORE); }
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	"math"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/goep/goep/internal/poll"
)

// result is the one conversion from an MPI return code to a Go error.
func result(op string, rc C.int) error {
	if rc == C.MPI_SUCCESS {
		return nil
	}
	n := C.goep_max_error_string()
	buf := (*C.char)(C.malloc(C.size_t(n)))
	defer C.free(unsafe.Pointer(buf))
	var l C.int
	msg := "unknown error"
	if C.MPI_Error_string(rc, buf, &l) == C.MPI_SUCCESS && l > 0 {
		msg = C.GoStringN(buf, l)
	}
	return &Error{Op: op, Code: int(rc), Msg: msg}
}

// Thread safety. Init asks for MPI_THREAD_MULTIPLE. When the library grants
// it, MPI calls are made concurrently without a lock; when it grants only
// MPI_THREAD_SERIALIZED, every MPI call of this package takes one process-
// wide mutex (held for the call only, never across a wait). A lower level
// (FUNNELED, SINGLE) is refused: goroutines move between OS threads.
var (
	callMu    sync.Mutex
	serialize atomic.Bool
	finalized atomic.Bool
	abandons  atomic.Int64 // collectives abandoned in this process
)

func lock() {
	if serialize.Load() {
		callMu.Lock()
	}
}

func unlock() {
	if serialize.Load() {
		callMu.Unlock()
	}
}

// initState is the thread that initialised MPI: MPI_Finalize must run on
// the thread that called MPI_Init_thread, so Init locks a goroutine to its
// OS thread and that goroutine later runs MPI_Finalize.
var initState struct {
	mu       sync.Mutex
	ours     bool          // Init called MPI_Init_thread
	finalize chan chan int // to the init thread; it answers with MPI_Finalize's code
	world    *Comm
}

// Init initialises MPI with MPI_Init_thread, asking for
// MPI_THREAD_MULTIPLE and accepting MPI_THREAD_SERIALIZED (then this package
// serialises its MPI calls with a mutex), and sets MPI_ERRORS_RETURN on
// MPI_COMM_WORLD. If MPI is already initialised (by this package or by
// other code in the process) Init only checks the thread level and sets the
// error handler. (Open MPI leaves signals that already have a handler, as
// the Go runtime's do, alone: a nil dereference stays a Go panic.)
func Init() error {
	initState.mu.Lock()
	defer initState.mu.Unlock()
	if finalized.Load() {
		return ErrFinalized
	}
	if initState.world != nil {
		return nil
	}
	var flag C.int
	if err := result("MPI_Initialized", C.MPI_Initialized(&flag)); err != nil {
		return err
	}
	var provided C.int
	if flag == 0 {
		done := make(chan error)
		fin := make(chan chan int)
		go func() {
			runtime.LockOSThread() // kept until MPI_Finalize has run
			var p C.int
			if err := result("MPI_Init_thread", C.MPI_Init_thread(nil, nil, C.MPI_THREAD_MULTIPLE, &p)); err != nil {
				done <- err
				return // the locked thread exits with this goroutine
			}
			provided = p
			done <- nil
			reply := <-fin
			reply <- int(C.MPI_Finalize())
		}()
		if err := <-done; err != nil {
			return err
		}
		initState.ours = true
		initState.finalize = fin
	} else {
		if err := result("MPI_Query_thread", C.MPI_Query_thread(&provided)); err != nil {
			return err
		}
	}
	if provided < C.MPI_THREAD_SERIALIZED {
		return fmt.Errorf("mpi: the MPI library grants thread level %d; goep needs MPI_THREAD_SERIALIZED (%d) or MPI_THREAD_MULTIPLE (%d)",
			int(provided), int(C.MPI_THREAD_SERIALIZED), int(C.MPI_THREAD_MULTIPLE))
	}
	serialize.Store(provided < C.MPI_THREAD_MULTIPLE)
	w := C.goep_comm_world()
	if err := result("MPI_Comm_set_errhandler", C.goep_errors_return(w)); err != nil {
		return err
	}
	c, err := newComm(w, true)
	if err != nil {
		return err
	}
	initState.world = c
	return nil
}

// ThreadMultiple reports whether MPI granted MPI_THREAD_MULTIPLE (false
// means calls are serialised by this package). Valid after Init.
func ThreadMultiple() bool { return !serialize.Load() }

// Initialized reports whether MPI_Init has been called (by anyone), as
// MPI_Initialized does.
func Initialized() (bool, error) {
	var flag C.int
	if err := result("MPI_Initialized", C.MPI_Initialized(&flag)); err != nil {
		return false, err
	}
	return flag != 0, nil
}

// Finalized reports whether MPI_Finalize has been called, as MPI_Finalized
// does.
func Finalized() (bool, error) {
	var flag C.int
	if err := result("MPI_Finalized", C.MPI_Finalized(&flag)); err != nil {
		return false, err
	}
	return flag != 0, nil
}

// Finalize runs MPI_Finalize, on the thread that initialised MPI when Init
// did. Every communicator but the world should have been freed. After a
// collective was abandoned Finalize does not call MPI_Finalize (it could
// wait forever for the abandoned request) and returns an error wrapping
// ErrAbandoned: the process should exit, or call Abort.
func Finalize() error {
	initState.mu.Lock()
	defer initState.mu.Unlock()
	if finalized.Load() {
		return nil
	}
	if initState.world == nil {
		return errors.New("mpi: Finalize before Init")
	}
	if n := abandons.Load(); n > 0 {
		return fmt.Errorf("mpi: MPI_Finalize skipped after %d abandoned collective(s); exit the process or call Abort: %w", n, ErrAbandoned)
	}
	finalized.Store(true)
	initState.world = nil
	if initState.ours {
		reply := make(chan int)
		initState.finalize <- reply
		return result("MPI_Finalize", C.int(<-reply))
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	return result("MPI_Finalize", C.MPI_Finalize())
}

// World returns MPI_COMM_WORLD (nil before Init). Its Free marks it freed
// without freeing MPI_COMM_WORLD.
func World() *Comm {
	initState.mu.Lock()
	defer initState.mu.Unlock()
	return initState.world
}

// Comm is an MPI communicator. Collectives must be called by every member
// in the same order; a Comm is meant to be used by one goroutine at a time
// (concurrent calls are safe but their order across ranks is undefined).
type Comm struct {
	h          C.MPI_Comm
	world      bool
	rank, size int

	mu        sync.Mutex
	freed     bool
	broken    error      // the first abandonment; later calls fail fast
	abandoned []*pending // requests left running, with their buffers
}

// pending is an abandoned request and the C memory it may still use.
type pending struct {
	req C.MPI_Request
	mem *cmem
}

func newComm(h C.MPI_Comm, world bool) (*Comm, error) {
	c := &Comm{h: h, world: world}
	var v C.int
	if err := result("MPI_Comm_rank", C.MPI_Comm_rank(h, &v)); err != nil {
		return nil, err
	}
	c.rank = int(v)
	if err := result("MPI_Comm_size", C.MPI_Comm_size(h, &v)); err != nil {
		return nil, err
	}
	c.size = int(v)
	return c, nil
}

// Rank is this process's rank in c.
func (c *Comm) Rank() int { return c.rank }

// Size is the number of processes in c.
func (c *Comm) Size() int { return c.size }

// usable returns why c cannot be used, if it cannot.
func (c *Comm) usable(op string) error {
	if finalized.Load() {
		return fmt.Errorf("mpi: %s: %w", op, ErrFinalized)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.freed {
		return fmt.Errorf("mpi: %s: communicator freed", op)
	}
	if c.broken != nil {
		return fmt.Errorf("mpi: %s: after %v: %w", op, c.broken, ErrAbandoned)
	}
	return nil
}

// cmem is the C memory of one operation. Its buffers are at least one byte
// long, so that MPI always gets a valid pointer, even for zero counts.
type cmem struct {
	ptrs []unsafe.Pointer
	// pin holds the Go buffers MPI uses during the operation
	// (AlltoallvInto), unpinned by free.
	pin  runtime.Pinner
	kept bool // handed to an abandoned request: never freed
}

func (m *cmem) alloc(n int) unsafe.Pointer {
	p := C.malloc(C.size_t(max(n, 1)))
	m.ptrs = append(m.ptrs, p)
	return p
}

// ints allocates n C ints.
func (m *cmem) ints(n int) []C.int {
	return unsafe.Slice((*C.int)(m.alloc(n*C.sizeof_int)), max(n, 1))[:n]
}

// bytes allocates a C copy of b.
func (m *cmem) bytes(b []byte) unsafe.Pointer {
	p := m.alloc(len(b))
	if len(b) > 0 {
		copy(unsafe.Slice((*byte)(p), len(b)), b)
	}
	return p
}

func (m *cmem) free() {
	if m.kept {
		return
	}
	for _, p := range m.ptrs {
		C.free(p)
	}
	m.ptrs = nil
	m.pin.Unpin()
}

// goBytes copies n bytes of C memory at p+off.
func goBytes(p unsafe.Pointer, off, n int) []byte {
	out := make([]byte, n)
	if n > 0 {
		copy(out, unsafe.Slice((*byte)(unsafe.Add(p, off)), n))
	}
	return out
}

// goParts copies the ranks' parts of the C buffer p, part r counts[r]
// bytes at displs[r], as the receive side of a v-collective lays them out.
func goParts(p unsafe.Pointer, displs, counts []C.int) [][]byte {
	out := make([][]byte, len(counts))
	for r := range out {
		out[r] = goBytes(p, int(displs[r]), int(counts[r]))
	}
	return out
}

// run starts a non-blocking operation and polls it until it completes or
// ctx ends. If it does not complete, the request is abandoned: c becomes
// unusable and m is kept alive (never freed) since MPI may still use it.
func (c *Comm) run(ctx context.Context, op string, m *cmem, start func(req *C.MPI_Request) C.int) error {
	if err := c.usable(op); err != nil {
		return err
	}
	var req C.MPI_Request
	lock()
	rc := start(&req)
	unlock()
	if err := result(op, rc); err != nil {
		return err // not started: nothing pending, c stays usable
	}
	err := poll.Until(ctx, testPolicy, func() (bool, error) {
		var flag C.int
		lock()
		rc := C.goep_test(&req, &flag)
		unlock()
		return flag != 0, result("MPI_Test", rc)
	})
	if err != nil {
		return c.abandon(op, req, m, fmt.Errorf("%s: %w", op, err))
	}
	return nil
}

// testPolicy is how run polls MPI_Test. Open MPI advances a non-blocking
// collective only inside MPI_Test, so polling must not sleep while data
// moves: it tests back to back (yielding the processor to other
// goroutines) for a second, as a blocking MPI call would spin; only a
// collective still waiting after that (a peer that is late, not a
// transfer in progress) backs off to sleeps from 10µs doubling to a
// millisecond.
var testPolicy = poll.Policy{Spin: time.Second, First: 10 * time.Microsecond, Most: time.Millisecond}

func (c *Comm) abandon(op string, req C.MPI_Request, m *cmem, cause error) error {
	m.kept = true
	abandons.Add(1)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.broken == nil {
		c.broken = cause
	}
	c.abandoned = append(c.abandoned, &pending{req: req, mem: m})
	return fmt.Errorf("mpi: %w (rank %d; the collective cannot be cancelled: %w)", cause, c.rank, ErrAbandoned)
}

// count converts a Go length to an MPI count.
func count(what string, n int) (C.int, error) {
	if n < 0 || n > math.MaxInt32 {
		return 0, fmt.Errorf("mpi: %s: %d bytes does not fit an MPI count (at most %d)", what, n, math.MaxInt32)
	}
	return C.int(n), nil
}

// Barrier returns once every member has entered it (MPI_Ibarrier).
func (c *Comm) Barrier(ctx context.Context) error {
	var m cmem
	defer m.free()
	return c.run(ctx, "MPI_Ibarrier", &m, func(req *C.MPI_Request) C.int {
		return C.MPI_Ibarrier(c.h, req)
	})
}

// Allgather returns every member's data, indexed by rank; lengths may
// differ (MPI_Iallgather of the lengths, then MPI_Iallgatherv). The total
// must be under 2 GiB.
func (c *Comm) Allgather(ctx context.Context, data []byte) ([][]byte, error) {
	var m cmem
	defer m.free()
	n := len(data)
	if n > math.MaxInt32 {
		n = -1 // tell the others, so that every rank fails alike
	}
	mine := m.ints(1)
	mine[0] = C.int(n)
	lens := m.ints(c.size)
	err := c.run(ctx, "MPI_Iallgather", &m, func(req *C.MPI_Request) C.int {
		return C.MPI_Iallgather(unsafe.Pointer(&mine[0]), 1, C.goep_int(), unsafe.Pointer(unsafe.SliceData(lens)), 1, C.goep_int(), c.h, req)
	})
	if err != nil {
		return nil, err
	}
	displs := m.ints(c.size)
	total := 0
	for r, l := range lens {
		if l < 0 || total+int(l) > math.MaxInt32 {
			return nil, fmt.Errorf("mpi: allgather: rank %d's data brings the total past %d bytes", r, math.MaxInt32)
		}
		displs[r] = C.int(total)
		total += int(l)
	}
	send := m.bytes(data)
	recv := m.alloc(total)
	err = c.run(ctx, "MPI_Iallgatherv", &m, func(req *C.MPI_Request) C.int {
		return C.MPI_Iallgatherv(send, C.int(len(data)), C.goep_byte(), recv,
			unsafe.SliceData(lens), unsafe.SliceData(displs), C.goep_byte(), c.h, req)
	})
	if err != nil {
		return nil, err
	}
	return goParts(recv, displs, lens), nil
}

// Bcast returns root's data on every member (data is ignored elsewhere):
// MPI_Ibcast of the length, then of the bytes. An invalid root is an MPI
// error on every rank.
func (c *Comm) Bcast(ctx context.Context, root int, data []byte) ([]byte, error) {
	var m cmem
	defer m.free()
	n := m.alloc(8)
	l := (*int64)(n)
	*l = int64(len(data))
	if len(data) > math.MaxInt32 {
		*l = -1
	}
	err := c.run(ctx, "MPI_Ibcast", &m, func(req *C.MPI_Request) C.int {
		return C.MPI_Ibcast(n, 1, C.goep_int64(), C.int(root), c.h, req)
	})
	if err != nil {
		return nil, err
	}
	size := int(*l)
	if size < 0 {
		return nil, fmt.Errorf("mpi: bcast: root %d's data does not fit an MPI count (at most %d bytes)", root, math.MaxInt32)
	}
	var buf unsafe.Pointer
	if c.rank == root {
		buf = m.bytes(data)
	} else {
		buf = m.alloc(size)
	}
	err = c.run(ctx, "MPI_Ibcast", &m, func(req *C.MPI_Request) C.int {
		return C.MPI_Ibcast(buf, C.int(size), C.goep_byte(), C.int(root), c.h, req)
	})
	if err != nil {
		return nil, err
	}
	return goBytes(buf, 0, size), nil
}

// Alltoallv sends send[p] to rank p and returns what every rank sent to
// this one, indexed by rank; lengths may differ (MPI_Ialltoall of the
// lengths, then MPI_Ialltoallv). len(send) must be Size(), and what a rank
// sends, and receives, must each total under 2 GiB: a rank whose send
// buffers are too large returns an error before communicating (its peers
// then time out), one whose receive total is too large abandons the call.
func (c *Comm) Alltoallv(ctx context.Context, send [][]byte) ([][]byte, error) {
	if len(send) != c.size {
		return nil, fmt.Errorf("mpi: alltoallv: %d buffers for %d ranks", len(send), c.size)
	}
	sendTotal := 0
	for _, b := range send {
		sendTotal += len(b)
	}
	if _, err := count("alltoallv send total", sendTotal); err != nil {
		return nil, err
	}
	var m cmem
	defer m.free()
	scounts, sdispls := m.ints(c.size), m.ints(c.size)
	sbuf := m.alloc(sendTotal)
	off := 0
	for p, b := range send {
		scounts[p], sdispls[p] = C.int(len(b)), C.int(off)
		if len(b) > 0 {
			copy(unsafe.Slice((*byte)(unsafe.Add(sbuf, off)), len(b)), b)
		}
		off += len(b)
	}
	rcounts := m.ints(c.size)
	err := c.run(ctx, "MPI_Ialltoall", &m, func(req *C.MPI_Request) C.int {
		return C.MPI_Ialltoall(unsafe.Pointer(unsafe.SliceData(scounts)), 1, C.goep_int(),
			unsafe.Pointer(unsafe.SliceData(rcounts)), 1, C.goep_int(), c.h, req)
	})
	if err != nil {
		return nil, err
	}
	rdispls := m.ints(c.size)
	total := 0
	for r, n := range rcounts {
		rdispls[r] = C.int(total)
		total += int(n)
		if total > math.MaxInt32 {
			// The senders are already on their way into the
			// exchange: this rank cannot follow them.
			c.mu.Lock()
			if c.broken == nil {
				c.broken = fmt.Errorf("alltoallv: receive total past %d bytes", math.MaxInt32)
			}
			c.mu.Unlock()
			abandons.Add(1)
			return nil, fmt.Errorf("mpi: alltoallv: rank %d's data brings the receive total past %d bytes: %w", r, math.MaxInt32, ErrAbandoned)
		}
	}
	rbuf := m.alloc(total)
	err = c.run(ctx, "MPI_Ialltoallv", &m, func(req *C.MPI_Request) C.int {
		return C.MPI_Ialltoallv(sbuf, unsafe.SliceData(scounts), unsafe.SliceData(sdispls), C.goep_byte(),
			rbuf, unsafe.SliceData(rcounts), unsafe.SliceData(rdispls), C.goep_byte(), c.h, req)
	})
	if err != nil {
		return nil, err
	}
	return goParts(rbuf, rdispls, rcounts), nil
}

// AlltoallvInto is MPI_Ialltoallv over the caller's buffers: this rank
// sends rank p the scounts[p] bytes of send after those of the ranks
// before p, and receives rank p's rcounts[p] bytes into recv after those
// of the ranks before p. The counts must match across ranks (MPI's rule);
// they must each total under 2 GiB and fit in their buffers. send and
// recv are pinned (runtime.Pinner) while MPI holds them: until the call
// returns, or, if the request is abandoned, for the life of the process
// (MPI may still write recv).
func (c *Comm) AlltoallvInto(ctx context.Context, send []byte, scounts []int, recv []byte, rcounts []int) error {
	if len(scounts) != c.size || len(rcounts) != c.size {
		return fmt.Errorf("mpi: alltoallv: %d send and %d receive counts for %d ranks", len(scounts), len(rcounts), c.size)
	}
	var m cmem
	defer m.free()
	sc, sd, rc, rd := m.ints(c.size), m.ints(c.size), m.ints(c.size), m.ints(c.size)
	for _, v := range [...]struct {
		what     string
		counts   []int
		cnt, dsp []C.int
		n        int
	}{{"send", scounts, sc, sd, len(send)}, {"receive", rcounts, rc, rd, len(recv)}} {
		total := 0
		for p, n := range v.counts {
			if n < 0 {
				return fmt.Errorf("mpi: alltoallv: %s count %d for rank %d", v.what, n, p)
			}
			v.cnt[p], v.dsp[p] = C.int(n), C.int(total)
			if total += n; total > math.MaxInt32 {
				return fmt.Errorf("mpi: alltoallv: %s counts past %d bytes", v.what, math.MaxInt32)
			}
		}
		if total > v.n {
			return fmt.Errorf("mpi: alltoallv: %s counts total %d bytes, the buffer has %d", v.what, total, v.n)
		}
	}
	// MPI wants a valid pointer even for no bytes.
	sp, rp := m.alloc(1), m.alloc(1)
	if len(send) > 0 {
		sp = unsafe.Pointer(unsafe.SliceData(send))
		m.pin.Pin(sp)
	}
	if len(recv) > 0 {
		rp = unsafe.Pointer(unsafe.SliceData(recv))
		m.pin.Pin(rp)
	}
	return c.run(ctx, "MPI_Ialltoallv", &m, func(req *C.MPI_Request) C.int {
		return C.MPI_Ialltoallv(sp, unsafe.SliceData(sc), unsafe.SliceData(sd), C.goep_byte(),
			rp, unsafe.SliceData(rc), unsafe.SliceData(rd), C.goep_byte(), c.h, req)
	})
}

// Dup returns a new communicator with the same members (MPI_Comm_idup), so
// that a library's collectives never match the application's own.
func (c *Comm) Dup(ctx context.Context) (*Comm, error) {
	var m cmem
	defer m.free()
	// MPI writes the new handle when the request completes: C memory.
	h := (*C.MPI_Comm)(m.alloc(C.sizeof_MPI_Comm))
	err := c.run(ctx, "MPI_Comm_idup", &m, func(req *C.MPI_Request) C.int {
		return C.MPI_Comm_idup(c.h, h, req)
	})
	if err != nil {
		return nil, err
	}
	return c.adopt(*h)
}

// adopt sets MPI_ERRORS_RETURN on a new communicator and wraps it.
func (c *Comm) adopt(h C.MPI_Comm) (*Comm, error) {
	err := result("MPI_Comm_set_errhandler", C.goep_errors_return(h))
	var nc *Comm
	if err == nil {
		nc, err = newComm(h, false)
	}
	if err != nil {
		lock()
		ferr := result("MPI_Comm_free", C.MPI_Comm_free(&h))
		unlock()
		return nil, errors.Join(err, ferr)
	}
	return nc, nil
}

// Split partitions c (MPI_Comm_split): members passing the same color form
// a new communicator, ordered by key, then by rank in c. A negative color
// gives (nil, nil): this member joins no new communicator.
//
// MPI_Comm_split blocks and has no non-blocking form, so Split first meets
// the other members in a barrier that honours ctx; a member that dies after
// that barrier and before MPI_Comm_split can still make it wait forever.
func (c *Comm) Split(ctx context.Context, color, key int) (*Comm, error) {
	if color > math.MaxInt32 || key < math.MinInt32 || key > math.MaxInt32 {
		return nil, fmt.Errorf("mpi: split: color %d or key %d does not fit a C int", color, key)
	}
	if err := c.Barrier(ctx); err != nil {
		return nil, err
	}
	if err := c.usable("MPI_Comm_split"); err != nil {
		return nil, err
	}
	cc := C.int(color)
	if color < 0 {
		cc = C.MPI_UNDEFINED
	}
	var h C.MPI_Comm
	lock()
	rc := C.MPI_Comm_split(c.h, cc, C.int(key), &h)
	unlock()
	if err := result("MPI_Comm_split", rc); err != nil {
		return nil, err
	}
	if h == C.goep_comm_null() {
		return nil, nil
	}
	return c.adopt(h)
}

// Free releases c (MPI_Comm_free; for MPI_COMM_WORLD it only marks c
// freed). Buffers of an abandoned collective are freed if the request has
// completed since, else leaked. Free is local: it does not wait for the
// other members.
func (c *Comm) Free() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.freed {
		return nil
	}
	c.freed = true
	if finalized.Load() {
		return fmt.Errorf("mpi: MPI_Comm_free: %w", ErrFinalized)
	}
	lock()
	defer unlock()
	for _, p := range c.abandoned {
		var flag C.int
		if C.goep_test(&p.req, &flag) == C.MPI_SUCCESS && flag != 0 {
			p.mem.kept = false
			p.mem.free()
		}
	}
	c.abandoned = nil
	if c.world {
		return nil
	}
	return result("MPI_Comm_free", C.MPI_Comm_free(&c.h))
}

// Abort asks MPI to end every process of c with the given exit code
// (MPI_Abort). It returns only if MPI_Abort fails.
func (c *Comm) Abort(code int) error {
	lock()
	defer unlock()
	return result("MPI_Abort", C.MPI_Abort(c.h, C.int(code)))
}
