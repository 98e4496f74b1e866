//go:build cuda && cgo

package cuda

/*
#cgo linux CFLAGS: -I/usr/local/cuda/include
#cgo linux LDFLAGS: -L/usr/local/cuda/lib64/stubs -L/usr/lib/x86_64-linux-gnu/stubs -L/usr/lib/aarch64-linux-gnu/stubs -lcuda
#include <cuda.h>

// CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED appeared in CUDA 12.3.
#if CUDA_VERSION >= 12030
#define GOEP_HAVE_ATTR_FABRIC 1
#define GOEP_ATTR_FABRIC CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED
#else
#define GOEP_HAVE_ATTR_FABRIC 0
#define GOEP_ATTR_FABRIC 0
#endif

// Attribute 122, 64-bit operations of the v2 stream memory API, is
// CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS_V2 in CUDA 11 headers
// and lost its suffix in CUDA 12.0 (the suffixed name of 11 went to the
// v1 API's attribute 93).
#if CUDA_VERSION >= 12000
#define GOEP_ATTR_STREAM_MEM_OPS_64 CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS
#else
#define GOEP_ATTR_STREAM_MEM_OPS_64 CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS_V2
#endif

// The calling thread's state for Device.Do, kept in C so that a Do reads
// it without a system call: the keys of the devices whose Do the thread
// is inside (innermost last), and the key of the device whose own
// cuCtxSetCurrent made the current context (0: another device's, another
// library's or unknown).
#define GOEP_MAX_HELD 64
static __thread unsigned long long goep_held[GOEP_MAX_HELD];
static __thread int goep_nheld;
static __thread unsigned long long goep_set_by;

static int goep_holds(unsigned long long key) {
	for (int i = 0; i < goep_nheld; i++) {
		if (goep_held[i] == key) {
			return 1;
		}
	}
	return 0;
}

// goep_enter notes that the thread is inside the Do of device key and
// makes ctx current, setting it unless this device's own set left it
// current (a primary context released and retained again by a later Open
// may come back at the same address, so a context that merely compares
// equal is set again). *prev is the context current before, *calls the
// driver calls made (0: the thread has too many devices nested, refused
// with CUDA_ERROR_NOT_SUPPORTED).
static CUresult goep_enter(unsigned long long key, CUcontext ctx, CUcontext *prev, int *calls) {
	*calls = 0;
	if (goep_nheld == GOEP_MAX_HELD) {
		return CUDA_ERROR_NOT_SUPPORTED;
	}
	*calls = 1;
	CUresult r = cuCtxGetCurrent(prev);
	if (r != CUDA_SUCCESS) {
		return r;
	}
	if (*prev != ctx || goep_set_by != key) {
		*calls = 2;
		r = cuCtxSetCurrent(ctx);
		if (r != CUDA_SUCCESS) {
			return r;
		}
		goep_set_by = key;
	}
	goep_held[goep_nheld++] = key;
	return CUDA_SUCCESS;
}

// goep_leave undoes a successful goep_enter: the device is no longer
// held, and prev, where it is another context, is made current again
// (the caller goes on with it: another device's Do, or another library).
static void goep_leave(CUcontext ctx, CUcontext prev) {
	goep_nheld--;
	if (prev != NULL && prev != ctx) {
		cuCtxSetCurrent(prev);
		goep_set_by = 0;
	}
}
*/
import "C"

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"unsafe"
)

// result is the one conversion from a CUresult to a Go error: nil for
// CUDA_SUCCESS, else an *Error naming op and the code (cuGetErrorName).
func result(op string, r C.CUresult) error {
	counts.calls.Add(1)
	if r == C.CUDA_SUCCESS {
		return nil
	}
	name := "CUDA_ERROR_UNRECOGNIZED"
	var s *C.char
	if C.cuGetErrorName(r, &s) == C.CUDA_SUCCESS && s != nil {
		name = C.GoString(s)
	}
	return &Error{Op: op, Code: int(r), Name: name}
}

// release frees the driver object *h once, inside d.Do: destroy is the
// driver call op that frees it (cgo calls are not values, hence the
// function). A zero *h is released already; *h is zero afterwards even
// when the call fails, so that a second release returns nil rather than
// freeing again.
func release[H comparable](d *Device, h *H, op string, destroy func(H) C.CUresult) error {
	return d.Do(func() error {
		var zero H
		if *h == zero {
			return nil
		}
		err := result(op, destroy(*h))
		*h = zero
		return err
	})
}

// HeaderVersion is CUDA_VERSION of the cuda.h this package was compiled
// against (e.g. 11080); features the headers lack are reported as
// ErrUnsupported even where the driver has them.
const HeaderVersion = int(C.CUDA_VERSION)

// DriverVersion returns the CUDA version the installed driver supports, as
// 1000*major + 10*minor (cuDriverGetVersion).
func DriverVersion() (int, error) {
	var v C.int
	if err := result("cuDriverGetVersion", C.cuDriverGetVersion(&v)); err != nil {
		return 0, err
	}
	return int(v), nil
}

// NumDevices initialises the driver and returns the number of visible GPUs
// (cuInit, cuDeviceGetCount). It needs no context and may be called from
// any goroutine.
func NumDevices() (int, error) {
	if err := result("cuInit", C.cuInit(0)); err != nil {
		return 0, err
	}
	var n C.int
	if err := result("cuDeviceGetCount", C.cuDeviceGetCount(&n)); err != nil {
		return 0, err
	}
	return int(n), nil
}

// Features are the optional capabilities of a device, read once by Open
// (cuDeviceGetAttribute).
type Features struct {
	// MemoryPools: cuMemAllocAsync / cuMemFreeAsync are supported. Without
	// it Stream.Alloc falls back to cuMemAlloc and Stream.Free defers
	// cuMemFree behind an event.
	MemoryPools bool
	// VMM: cuMemCreate, cuMemMap and the rest of virtual memory management.
	VMM bool
	// PosixFD: VMM allocations can be exported as file descriptors.
	PosixFD bool
	// Fabric: VMM allocations can be exported as fabric handles (multi-node
	// NVLink). Always false when HeaderVersion < 12030.
	Fabric bool
	// Cooperative: cuLaunchCooperativeKernel is supported.
	Cooperative bool
	// StreamMemOps64: cuStreamWriteValue64 / cuStreamWaitValue64 (the v2
	// entry points this package calls) are supported. The 32-bit ones are
	// always supported by the v2 entry points.
	StreamMemOps64 bool
}

// Limits are the sizes of a device that launch shapes depend on, read once
// by Open (cuDeviceGetAttribute).
type Limits struct {
	// SMs is the number of multiprocessors.
	SMs int
	// ThreadsPerSM is the most threads resident on a multiprocessor.
	ThreadsPerSM int
	// SharedPerSM is the shared memory of a multiprocessor in bytes (what
	// all its resident blocks share, ReservedSharedPerBlock of it for each
	// block).
	SharedPerSM int
	// SharedPerBlockOptin is the most dynamic shared memory one block may
	// use once its kernel allows it (Function.SetMaxDynamicSharedMemory);
	// without that, 48 KiB.
	SharedPerBlockOptin int
	// ReservedSharedPerBlock is the shared memory the driver reserves for
	// each resident block, out of SharedPerSM.
	ReservedSharedPerBlock int
}

// Device is one GPU with its primary context retained. Every driver call
// for it is made inside Do, one at a time, on the calling goroutine's OS
// thread, locked for the call, with that context current.
type Device struct {
	ordinal int
	dev     C.CUdevice
	ctx     C.CUcontext
	name    string
	uuid    [16]byte
	major   int
	minor   int
	feat    Features
	limits  Limits

	mu     sync.Mutex  // held by the Do in progress: calls are serialised
	key    uint64      // unique in the process: the thread state's name for this Open (goep_enter)
	closed atomic.Bool // set by Close, under mu

	// deferred frees of the cuMemAlloc fallback (no memory pools), each
	// behind an event recorded on the freeing stream. Inside Do only.
	deferred []deferredFree

	// pool is Stream.Alloc's memory pool (nil without memory pools; see
	// openPool). Set in init, cleared at shutdown, both inside Do.
	pool    C.CUmemoryPool
	poolErr error // why pool is nil on a device with memory pools
}

// Open initialises the driver and retains the primary context of GPU
// ordinal (cuInit, cuDeviceGet, cuDevicePrimaryCtxRetain). Using the
// primary context lets goep share the GPU with other libraries of the
// process (PyTorch, NCCL). Close releases it.
func Open(ordinal int) (*Device, error) {
	if ordinal < 0 {
		return nil, fmt.Errorf("cuda: open device %d: negative ordinal", ordinal)
	}
	d := &Device{ordinal: ordinal, key: deviceKeys.Add(1)}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.init(); err != nil {
		return nil, fmt.Errorf("cuda: open device %d: %w", ordinal, err)
	}
	return d, nil
}

func (d *Device) init() error {
	if err := result("cuInit", C.cuInit(0)); err != nil {
		return err
	}
	if err := result("cuDeviceGet", C.cuDeviceGet(&d.dev, C.int(d.ordinal))); err != nil {
		return err
	}
	if err := result("cuDevicePrimaryCtxRetain", C.cuDevicePrimaryCtxRetain(&d.ctx, d.dev)); err != nil {
		return err
	}
	if err := d.describe(); err != nil {
		return joinRelease(err, d.dev)
	}
	if err := result("cuCtxSetCurrent", C.cuCtxSetCurrent(d.ctx)); err != nil {
		return joinRelease(err, d.dev)
	}
	d.openPool()
	return nil
}

func joinRelease(err error, dev C.CUdevice) error {
	if rerr := result("cuDevicePrimaryCtxRelease", C.cuDevicePrimaryCtxRelease(dev)); rerr != nil {
		return fmt.Errorf("%w (and %v)", err, rerr)
	}
	return err
}

// describe reads the name, compute capability and Features.
func (d *Device) describe() error {
	var buf [256]C.char
	if err := result("cuDeviceGetName", C.cuDeviceGetName(&buf[0], C.int(len(buf)), d.dev)); err != nil {
		return err
	}
	d.name = C.GoString(&buf[0])
	var u C.CUuuid
	if err := result("cuDeviceGetUuid", C.cuDeviceGetUuid(&u, d.dev)); err != nil {
		return err
	}
	for i := range d.uuid {
		d.uuid[i] = byte(u.bytes[i])
	}
	var err error
	if d.major, err = d.attr(C.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR); err != nil {
		return err
	}
	if d.minor, err = d.attr(C.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR); err != nil {
		return err
	}
	sizes := []struct {
		attr C.CUdevice_attribute
		dst  *int
	}{
		{C.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, &d.limits.SMs},
		{C.CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR, &d.limits.ThreadsPerSM},
		{C.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR, &d.limits.SharedPerSM},
		{C.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, &d.limits.SharedPerBlockOptin},
		{C.CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK, &d.limits.ReservedSharedPerBlock},
	}
	for _, a := range sizes {
		if *a.dst, err = d.attr(a.attr); err != nil {
			return err
		}
	}
	flags := []struct {
		attr C.CUdevice_attribute
		dst  *bool
	}{
		{C.CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED, &d.feat.MemoryPools},
		{C.CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, &d.feat.VMM},
		{C.CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, &d.feat.PosixFD},
		{C.CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH, &d.feat.Cooperative},
		{C.GOEP_ATTR_STREAM_MEM_OPS_64, &d.feat.StreamMemOps64},
	}
	if C.GOEP_HAVE_ATTR_FABRIC != 0 {
		flags = append(flags, struct {
			attr C.CUdevice_attribute
			dst  *bool
		}{C.CUdevice_attribute(C.GOEP_ATTR_FABRIC), &d.feat.Fabric})
	}
	for _, f := range flags {
		v, err := d.attr(f.attr)
		if IsCode(err, CodeInvalidValue) {
			// An attribute this driver does not know: the feature is absent.
			continue
		}
		if err != nil {
			return err
		}
		*f.dst = v != 0
	}
	return nil
}

func (d *Device) attr(a C.CUdevice_attribute) (int, error) {
	var v C.int
	if err := result("cuDeviceGetAttribute", C.cuDeviceGetAttribute(&v, a, d.dev)); err != nil {
		return 0, err
	}
	return int(v), nil
}

// Ordinal is the device's index among the visible GPUs.
func (d *Device) Ordinal() int { return d.ordinal }

// Name is the GPU's marketing name (cuDeviceGetName), e.g. "NVIDIA H200".
func (d *Device) Name() string { return d.name }

// UUID is the GPU's identity (cuDeviceGetUuid): equal in every process
// that opens the same GPU, whatever its ordinal there.
func (d *Device) UUID() [16]byte { return d.uuid }

// ComputeCapability is the SM version, e.g. 9, 0 on Hopper.
func (d *Device) ComputeCapability() (major, minor int) { return d.major, d.minor }

// Features are the device's optional capabilities.
func (d *Device) Features() Features { return d.feat }

// Limits are the device's multiprocessor count, threads and shared memory
// sizes.
func (d *Device) Limits() Limits { return d.limits }

// Do runs f with the device's primary context current on the calling
// goroutine's OS thread, which stays locked to the goroutine until f
// returns, and returns f's error. Driver calls depend on the calling
// thread's current context; goroutines move between threads, so every
// driver call for the device must be made inside Do (without it the driver
// answers CUDA_ERROR_INVALID_CONTEXT at random). Every exported operation
// of this package does so itself.
//
// Calls from many goroutines are serialised (a mutex; f runs on its
// caller's goroutine, so a call costs no hand-off to another thread, which
// on a virtual machine's idle CPUs costs tens of microseconds). Do may be
// nested: called from inside f, it runs its function directly; a Do of
// another device inside f puts this device's context back when it
// returns. A panic in f unwinds through Do, which releases the device. f
// must not block for long: every other user of the device waits behind
// it.
func (d *Device) Do(f func() error) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if d.held() {
		// Inside f already (the thread is locked to its goroutine).
		return f()
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	prev, err := d.openCurrent()
	if err != nil {
		return err
	}
	defer d.leave(prev)
	return f()
}

// deviceKeys numbers the Opens of the process (Device.key).
var deviceKeys atomic.Uint64

// held reports whether the calling thread, which must be locked, is
// inside d's Do. It makes no system call: the thread's state is C's
// (goep_holds).
func (d *Device) held() bool { return C.goep_holds(C.ulonglong(d.key)) != 0 }

// openCurrent is makeCurrent for a device not closed.
func (d *Device) openCurrent() (prev C.CUcontext, err error) {
	if d.closed.Load() {
		return prev, fmt.Errorf("cuda: device %d: %w", d.ordinal, ErrClosed)
	}
	return d.makeCurrent()
}

// makeCurrent notes the calling thread, which must be locked, as inside
// d's Do and makes the device's context current (goep_enter), and returns
// the context current before, for leave.
func (d *Device) makeCurrent() (prev C.CUcontext, err error) {
	var calls C.int
	r := C.goep_enter(C.ulonglong(d.key), d.ctx, &prev, &calls)
	switch calls {
	case 0:
		return prev, fmt.Errorf("cuda: device %d: more than %d devices' Do nested on one thread: %w", d.ordinal, C.GOEP_MAX_HELD, ErrUnsupported)
	case 1:
		err = result("cuCtxGetCurrent", r)
	default:
		counts.calls.Add(1) // the cuCtxGetCurrent before
		err = result("cuCtxSetCurrent", r)
	}
	if err != nil {
		return prev, fmt.Errorf("cuda: device %d: %w", d.ordinal, err)
	}
	return prev, nil
}

// leave undoes a successful makeCurrent (goep_leave): the thread is no
// longer inside d's Do, and prev, the context current before, is current
// again where it was another: another device's, when this Do ran inside
// that device's (the caller's f goes on using its own device), or another
// library's.
func (d *Device) leave(prev C.CUcontext) { C.goep_leave(d.ctx, prev) }

// current reports whether the device's context is current on the calling
// thread (tests, inside Do).
func (d *Device) current() bool {
	var c C.CUcontext
	return C.cuCtxGetCurrent(&c) == C.CUDA_SUCCESS && c == d.ctx
}

// Close waits for the memory whose free was deferred (no memory pools) to
// be released and releases the primary context (cuDevicePrimaryCtxRelease). Streams, events, modules and memory should be released
// first; the driver frees what is left when the last user of the primary
// context releases it. Later calls return errors wrapping ErrClosed; a
// second Close returns nil. Close must not be called from inside Do.
func (d *Device) Close() error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if d.held() {
		return fmt.Errorf("cuda: close device %d: called from inside Do", d.ordinal)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.closed.CompareAndSwap(false, true) {
		return nil
	}
	prev, err := d.makeCurrent()
	if err != nil {
		return fmt.Errorf("cuda: close: %w", err)
	}
	defer d.leave(prev)
	return d.shutdown()
}

// shutdown runs inside Close, with the device held.
func (d *Device) shutdown() error {
	err := errors.Join(d.reapDeferred(true), d.closePool())
	if rerr := result("cuDevicePrimaryCtxRelease", C.cuDevicePrimaryCtxRelease(d.dev)); rerr != nil {
		err = errors.Join(err, rerr)
	}
	if err != nil {
		return fmt.Errorf("cuda: close device %d: %w", d.ordinal, err)
	}
	return nil
}

// c converts a DevicePtr to the driver's type.
func (p DevicePtr) c() C.CUdeviceptr { return C.CUdeviceptr(p) }

// dims returns the three components of a Dim3, zeros counted as 1.
func (g Dim3) dims() (C.uint, C.uint, C.uint) {
	one := func(v uint32) C.uint {
		if v == 0 {
			return 1
		}
		return C.uint(v)
	}
	return one(g.X), one(g.Y), one(g.Z)
}

// cbytes copies b to C memory with a trailing NUL; the caller frees it.
func cbytes(b []byte) unsafe.Pointer {
	p := C.malloc(C.size_t(len(b) + 1))
	s := unsafe.Slice((*byte)(p), len(b)+1)
	copy(s, b)
	s[len(b)] = 0
	return p
}

// resultOf is result for a code given as an int (tests).
func resultOf(op string, code int) error { return result(op, C.CUresult(code)) }
