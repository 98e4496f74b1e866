//go:build cuda && cgo

package cuda

import (
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"math"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// requireGPU turns the skips for a missing GPU into failures, for runs on a
// GPU host: .gpu/cuda.test -test.v -gpu
var requireGPU = flag.Bool("gpu", false, "fail instead of skip when no usable GPU is found")

// deadline bounds every wait of a test.
const deadline = 30 * time.Second

// openDevice opens GPU 0 for one test and closes it at the end, or skips the
// test with the reason when the driver or the GPU is missing.
func openDevice(t testing.TB) *Device {
	t.Helper()
	n, err := NumDevices()
	if err == nil && n == 0 {
		err = errors.New("cuDeviceGetCount reports no device")
	}
	if err != nil {
		if *requireGPU {
			t.Fatalf("no usable GPU: %v", err)
		}
		t.Skipf("no usable GPU (cuInit or cuDeviceGetCount failed): %v", err)
	}
	d, err := Open(0)
	if err != nil {
		t.Fatal(err)
	}
	closeAtEnd(t, d.Close)
	t.Logf("device 0: %s, sm_%d%d, driver %s, headers %d, features %+v",
		d.Name(), d.major, d.minor, driverString(), HeaderVersion, d.Features())
	return d
}

func driverString() string {
	v, err := DriverVersion()
	if err != nil {
		return err.Error()
	}
	return fmt.Sprintf("%d.%d", v/1000, v%1000/10)
}

func newStream(t *testing.T, d *Device) *Stream {
	t.Helper()
	s, err := d.NewStream()
	must(t, err)
	closeAtEnd(t, s.Close)
	return s
}

func allocHost(t *testing.T, d *Device, n int) *HostBuffer {
	t.Helper()
	h, err := d.AllocHost(n)
	must(t, err)
	closeAtEnd(t, h.Free)
	return h
}

func syncStream(t *testing.T, s *Stream) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), deadline)
	defer cancel()
	if err := s.Synchronize(ctx); err != nil {
		t.Fatal(err)
	}
}

// closeAtEnd calls release, a Close or Free, when the test ends, and
// fails the test on its error.
func closeAtEnd(t testing.TB, release func() error) {
	t.Cleanup(func() {
		if err := release(); err != nil {
			t.Error(err)
		}
	})
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// TestCopyRoundTrip copies a pattern host -> device -> device -> host
// through stream-ordered memory, with guard bytes around the device copy.
func TestCopyRoundTrip(t *testing.T) {
	d := openDevice(t)
	s := newStream(t, d)
	for _, n := range []int{1, 7, 4096, 1<<20 + 3} {
		src := allocHost(t, d, n)
		dst := allocHost(t, d, n+128)
		for i, b := 0, src.Bytes(); i < n; i++ {
			b[i] = byte(i*7 + n)
		}
		a, err := s.Alloc(n)
		must(t, err)
		b, err := s.Alloc(n + 128)
		must(t, err)
		must(t, s.Memset8(b, 0xA5, n+128))
		must(t, s.CopyHtoD(a, src, 0, n))
		must(t, s.CopyDtoD(b+64, a, n))
		must(t, s.CopyDtoH(dst, 0, b, n+128))
		must(t, s.Free(a))
		must(t, s.Free(b))
		syncStream(t, s)
		got := dst.Bytes()
		for i := range n + 128 {
			want := byte(0xA5)
			if i >= 64 && i < 64+n {
				want = src.Bytes()[i-64]
			}
			if got[i] != want {
				t.Fatalf("n=%d: byte %d = %#x, want %#x", n, i, got[i], want)
			}
		}
	}
}

// TestPoolKeepsMemory: memory freed to the device's pool stays reserved
// across a synchronization (the release threshold; the context's default
// pool would hand it back there) until TrimPool.
func TestPoolKeepsMemory(t *testing.T) {
	d := openDevice(t)
	if !d.Features().MemoryPools {
		t.Skip("no memory pools")
	}
	if err := d.PoolError(); err != nil {
		t.Fatalf("the device's pool was not made: %v", err)
	}
	s := newStream(t, d)
	const n = 64 << 20
	p, err := s.Alloc(n)
	must(t, err)
	must(t, s.Free(p))
	ctx, cancel := context.WithTimeout(t.Context(), deadline)
	defer cancel()
	must(t, s.Synchronize(ctx))
	got, err := d.PoolReserved()
	must(t, err)
	if got < n {
		t.Fatalf("the pool holds %d bytes after a free and a synchronize, want at least %d", got, n)
	}
	must(t, d.TrimPool(0))
	if got, err = d.PoolReserved(); err != nil || got != 0 {
		t.Fatalf("the pool holds %d bytes after TrimPool(0) (%v), want 0", got, err)
	}
	if err := d.TrimPool(-1); err == nil {
		t.Fatal("TrimPool(-1) was accepted")
	}
}

func TestMemset32(t *testing.T) {
	d := openDevice(t)
	s := newStream(t, d)
	const words = 1000
	p, err := s.Alloc(words * 4)
	must(t, err)
	h := allocHost(t, d, words*4)
	must(t, s.Memset32(p, 0xDEADBEEF, words))
	must(t, s.Memset8(p+4, 0x11, 4))
	must(t, s.CopyDtoH(h, 0, p, words*4))
	must(t, s.Free(p))
	syncStream(t, s)
	for i := range words {
		got := binary.LittleEndian.Uint32(h.Bytes()[4*i:])
		want := uint32(0xDEADBEEF)
		if i == 1 {
			want = 0x11111111
		}
		if got != want {
			t.Fatalf("word %d = %#x, want %#x", i, got, want)
		}
	}
}

func TestHostBufferBounds(t *testing.T) {
	d := openDevice(t)
	s := newStream(t, d)
	h := allocHost(t, d, 16)
	p, err := s.Alloc(32)
	must(t, err)
	defer func() { must(t, s.Free(p)) }()
	for _, c := range []struct{ off, n int }{{-1, 4}, {0, 17}, {16, 1}, {8, -1}} {
		if err := s.CopyHtoD(p, h, c.off, c.n); err == nil {
			t.Errorf("CopyHtoD off=%d n=%d: no error", c.off, c.n)
		}
	}
}

func loadKernels(t *testing.T, d *Device) *Module {
	t.Helper()
	m, err := d.LoadPTX(kernelsPTX)
	must(t, err)
	closeAtEnd(t, m.Close)
	return m
}

// TestLaunchAdd runs goep_test_add(int32 add, int32 *x, int64 n): a 4-byte
// argument, then a pointer, then an 8-byte count. Elements past n must be
// untouched, so a count read from the wrong offset shows.
func TestLaunchAdd(t *testing.T) {
	d := openDevice(t)
	s := newStream(t, d)
	fn, err := loadKernels(t, d).Function("goep_test_add")
	must(t, err)
	for _, coop := range []bool{false, true} {
		const n, guard = 10000, 256
		h := allocHost(t, d, 4*(n+guard))
		for i := range n + guard {
			binary.LittleEndian.PutUint32(h.Bytes()[4*i:], uint32(i))
		}
		launch := Launch
		if coop {
			if !d.Features().Cooperative {
				t.Log("no cooperative launch on this device")
				continue
			}
			launch = LaunchCooperative
		}
		x, err := s.Alloc(4 * (n + guard))
		must(t, err)
		must(t, s.CopyHtoD(x, h, 0, h.Len()))
		before := ReadCounts()
		must(t, launch(fn, Dim3{X: 8}, Dim3{X: 128}, 0, s, int32(-5), x, int64(n)))
		// Other tests of this package do not run in parallel with this
		// one. The launch is a batch of its own: the context's get, its
		// set unless this thread's last Do of d left it current, then
		// the launch.
		if c := ReadCounts().Sub(before); c.Launches != 1 || c.Calls < 2 || c.Calls > 3 || c.GraphLaunches != 0 {
			t.Errorf("coop=%v: one launch counted as %+v, want 1 launch and 2 or 3 driver calls", coop, c)
		}
		must(t, s.CopyDtoH(h, 0, x, h.Len()))
		must(t, s.Free(x))
		syncStream(t, s)
		for i := range n + guard {
			got := int32(binary.LittleEndian.Uint32(h.Bytes()[4*i:]))
			want := int32(i)
			if i < n {
				want -= 5
			}
			if got != want {
				t.Fatalf("coop=%v: x[%d] = %d, want %d", coop, i, got, want)
			}
		}
	}
}

// TestLaunchArgSizes checks every supported argument type arrives intact
// through goep_test_args(int32, uint32, float32, uint64, int64, uint64 *out).
func TestLaunchArgSizes(t *testing.T) {
	d := openDevice(t)
	s := newStream(t, d)
	fn, err := loadKernels(t, d).Function("goep_test_args")
	must(t, err)
	out, err := s.Alloc(5 * 8)
	must(t, err)
	h := allocHost(t, d, 5*8)
	var (
		a = int32(-123456)
		b = uint32(0xFEEDF00D)
		c = float32(3.25)
		e = uint64(0x0123456789ABCDEF)
		f = int64(-0x1122334455667788)
	)
	must(t, Launch(fn, Dim3{X: 1}, Dim3{X: 32}, 0, s, a, b, c, e, f, out))
	must(t, s.CopyDtoH(h, 0, out, 5*8))
	must(t, s.Free(out))
	syncStream(t, s)
	got := make([]uint64, 5)
	for i := range got {
		got[i] = binary.LittleEndian.Uint64(h.Bytes()[8*i:])
	}
	want := []uint64{uint64(int64(a)), uint64(b), uint64(math.Float32bits(c)), e, uint64(f)}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("out[%d] = %#x, want %#x", i, got[i], want[i])
		}
	}
}

func TestLaunchBadArgs(t *testing.T) {
	d := openDevice(t)
	s := newStream(t, d)
	fn, err := loadKernels(t, d).Function("goep_test_add")
	must(t, err)
	for _, arg := range []any{7, uintptr(0), &struct{}{}, []int32{1}, float64(1)} {
		if err := Launch(fn, Dim3{X: 1}, Dim3{X: 1}, 0, s, int32(0), arg, int64(0)); err == nil {
			t.Errorf("Launch with %T: no error", arg)
		}
	}
}

func TestLoadPTXError(t *testing.T) {
	d := openDevice(t)
	_, err := d.LoadPTX([]byte(".version 7.8\n.target sm_90\n.address_size 64\nthis is not ptx\n"))
	var e *Error
	if !errors.As(err, &e) {
		t.Fatalf("LoadPTX of bad PTX: %v, want an *Error", err)
	}
	t.Logf("bad PTX: %v", err)
	m := loadKernels(t, d)
	if _, err := m.Function("goep_no_such_kernel"); !IsCode(err, CodeNotFound) {
		t.Errorf("missing function: %v, want CUDA_ERROR_NOT_FOUND", err)
	}
}

func TestEventsElapsed(t *testing.T) {
	d := openDevice(t)
	s := newStream(t, d)
	start, err := d.NewEvent(true)
	must(t, err)
	defer func() { must(t, start.Close()) }()
	end, err := d.NewEvent(true)
	must(t, err)
	defer func() { must(t, end.Close()) }()
	const n = 64 << 20
	p, err := s.Alloc(n)
	must(t, err)
	must(t, s.Record(start))
	for range 10 {
		must(t, s.Memset8(p, 1, n))
	}
	must(t, s.Record(end))
	must(t, s.Free(p))
	ctx, cancel := context.WithTimeout(t.Context(), deadline)
	defer cancel()
	must(t, end.Synchronize(ctx))
	done, err := end.Query()
	if err != nil || !done {
		t.Fatalf("Query after Synchronize = %v, %v", done, err)
	}
	el, err := end.Elapsed(start)
	must(t, err)
	if el <= 0 || el > deadline {
		t.Errorf("elapsed %v", el)
	}
	t.Logf("10 memsets of %d MiB: %v", n>>20, el)

	// An event without timing cannot give elapsed time: a typed error.
	nt, err := d.NewEvent(false)
	must(t, err)
	defer func() { must(t, nt.Close()) }()
	must(t, s.Record(nt))
	syncStream(t, s)
	var e *Error
	if _, err := nt.Elapsed(start); !errors.As(err, &e) {
		t.Errorf("Elapsed of an event without timing: %v, want *Error", err)
	}
}

// TestWaitEventAcrossStreams orders a copy on s2 after a memset on s1.
func TestWaitEventAcrossStreams(t *testing.T) {
	d := openDevice(t)
	s1, s2 := newStream(t, d), newStream(t, d)
	ev, err := d.NewEvent(false)
	must(t, err)
	defer func() { must(t, ev.Close()) }()
	const n = 32 << 20
	p, err := d.Alloc(n)
	must(t, err)
	defer func() { must(t, d.Free(p)) }()
	h := allocHost(t, d, 4096)
	must(t, s1.Memset8(p, 0, n))
	must(t, s1.Memset8(p, 0x5A, n))
	must(t, s1.Record(ev))
	must(t, s2.WaitEvent(ev))
	must(t, s2.CopyDtoH(h, 0, p+n-4096, 4096))
	syncStream(t, s2)
	for i, b := range h.Bytes() {
		if b != 0x5A {
			t.Fatalf("byte %d = %#x: the copy ran before the memset", i, b)
		}
	}
	syncStream(t, s1)
}

// TestStreamMemOps: s1 waits on a flag that s2 writes later; the work after
// the wait must see the flag, and a Synchronize with a short deadline must
// return before the flag is written.
func TestStreamMemOps(t *testing.T) {
	d := openDevice(t)
	for _, bits := range []int{32, 64} {
		if bits == 64 && !d.Features().StreamMemOps64 {
			t.Log("no 64-bit stream memory operations on this device")
			continue
		}
		s1, s2 := newStream(t, d), newStream(t, d)
		flag, err := d.Alloc(8)
		must(t, err)
		out, err := d.Alloc(8)
		must(t, err)
		h := allocHost(t, d, 8)
		must(t, s2.Memset8(flag, 0, 8))
		must(t, s2.Memset8(out, 0, 8))
		syncStream(t, s2)
		wait, write := s1.WaitValue32, s2.WriteValue32
		if bits == 64 {
			wait = func(p DevicePtr, v uint32) error { return s1.WaitValue64(p, uint64(v)) }
			write = func(p DevicePtr, v uint32) error { return s2.WriteValue64(p, uint64(v)) }
		}
		must(t, wait(flag, 3))
		must(t, s1.CopyDtoD(out, flag, 8))
		must(t, s1.CopyDtoH(h, 0, out, 8))

		ctx, cancel := context.WithTimeout(t.Context(), 20*time.Millisecond)
		err = s1.Synchronize(ctx)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("%d-bit: Synchronize before the flag: %v, want deadline exceeded", bits, err)
		}
		must(t, write(flag, 2)) // not yet: 2 < 3
		must(t, write(flag, 3))
		syncStream(t, s1)
		got := binary.LittleEndian.Uint64(h.Bytes())
		if got != 3 {
			t.Errorf("%d-bit: flag seen after the wait = %d, want 3", bits, got)
		}
		must(t, d.Free(flag))
		must(t, d.Free(out))
	}
}

// TestIPCSameProcess: exporting works; opening one's own handle is refused
// by the driver and must come back as a typed error. Cross-process IPC is
// tested with the nvlink transport.
func TestIPCSameProcess(t *testing.T) {
	d := openDevice(t)
	p, err := d.Alloc(1 << 20)
	must(t, err)
	defer func() { must(t, d.Free(p)) }()
	h, err := d.GetIPCHandle(p)
	must(t, err)
	if h == (IPCHandle{}) {
		t.Fatal("IPC handle is all zeros")
	}
	q, err := d.OpenIPCHandle(h)
	if err == nil {
		t.Logf("driver opened the process's own IPC handle at %#x", uint64(q))
		must(t, d.CloseIPCHandle(q))
		return
	}
	var e *Error
	if !errors.As(err, &e) || e.Op != "cuIpcOpenMemHandle" {
		t.Fatalf("opening own IPC handle: %v, want an *Error from cuIpcOpenMemHandle", err)
	}
	t.Logf("opening own IPC handle: %v", err)

	// Stream-ordered memory (the device's pool) is not exportable: a typed error.
	s := newStream(t, d)
	a, err := s.Alloc(4096)
	must(t, err)
	defer func() { must(t, s.Free(a)) }()
	// The driver documents IPC handles for cuMemAlloc memory only; what it
	// answers for pool memory is recorded, not asserted.
	_, err = d.GetIPCHandle(a)
	t.Logf("IPC handle of stream-ordered (pool) memory: err = %v", err)
}

// TestVMMPosixFD maps one physical allocation twice, once through its own
// handle and once through an exported and re-imported file descriptor, and
// checks both addresses see the same bytes.
func TestVMMPosixFD(t *testing.T) {
	d := openDevice(t)
	if !d.Features().VMM || !d.Features().PosixFD {
		t.Skip("device has no VMM with POSIX file descriptor handles")
	}
	g, err := d.Granularity(HandlePosixFD)
	must(t, err)
	size := 2 * g
	a, err := d.MemCreate(size, HandlePosixFD)
	must(t, err)
	defer func() { must(t, a.Release()) }()
	fd, err := a.ExportFD()
	must(t, err)
	defer unix.Close(fd)
	b, err := d.ImportFD(fd, size)
	must(t, err)
	defer func() { must(t, b.Release()) }()

	va, err := d.AddressReserve(2*size, 0)
	must(t, err)
	defer func() { must(t, d.AddressFree(va, 2*size)) }()
	must(t, d.Map(va, a))
	defer func() { must(t, d.Unmap(va, size)) }()
	must(t, d.Map(va+DevicePtr(size), b))
	defer func() { must(t, d.Unmap(va+DevicePtr(size), size)) }()

	if ok, err := d.IsDevicePointer(va); err != nil || !ok {
		t.Errorf("IsDevicePointer(VMM mapping) = %v, %v", ok, err)
	}
	s := newStream(t, d)
	h := allocHost(t, d, 4096)
	must(t, s.Memset8(va, 0x3C, size))
	must(t, s.CopyDtoH(h, 0, va+DevicePtr(2*size-4096), 4096))
	syncStream(t, s)
	for i, c := range h.Bytes() {
		if c != 0x3C {
			t.Fatalf("byte %d through the imported handle = %#x, want 0x3c", i, c)
		}
	}
}

// TestFabricHandle: where fabric handles exist (CUDA 12.3+ headers, a
// multi-node NVLink system) export and import work; elsewhere the error
// wraps ErrUnsupported, or the driver refuses the allocation
// (CUDA_ERROR_NOT_PERMITTED) and the test is skipped.
func TestFabricHandle(t *testing.T) {
	d := openDevice(t)
	if !d.Features().VMM {
		t.Skip("device has no VMM")
	}
	g, err := d.Granularity(HandleFabric)
	if errors.Is(err, ErrUnsupported) {
		t.Logf("fabric handles unsupported: %v", err)
		if _, err := d.MemCreate(1<<21, HandleFabric); !errors.Is(err, ErrUnsupported) {
			t.Errorf("MemCreate(fabric): %v, want ErrUnsupported", err)
		}
		return
	}
	must(t, err)
	a, err := d.MemCreate(g, HandleFabric)
	if IsCode(err, CodeNotPermitted) {
		// The device offers fabric handles but this process may not
		// create them: no IMEX channel is open to it (a GPU outside a
		// multi-node NVLink system, or a container without the channel's
		// device file). The engine falls back to CUDA IPC there.
		t.Skipf("fabric handles offered but not permitted here: %v", err)
	}
	must(t, err)
	defer func() { must(t, a.Release()) }()
	fh, err := a.ExportFabric()
	must(t, err)
	b, err := d.ImportFabric(fh, g)
	must(t, err)
	must(t, b.Release())
}

func TestIsDevicePointer(t *testing.T) {
	d := openDevice(t)
	s := newStream(t, d)
	p, err := s.Alloc(256)
	must(t, err)
	defer func() { must(t, s.Free(p)) }()
	q, err := d.Alloc(256)
	must(t, err)
	defer func() { must(t, d.Free(q)) }()
	h := allocHost(t, d, 256)
	var local int
	for _, c := range []struct {
		name string
		p    DevicePtr
		want bool
	}{
		{"stream alloc", p, true},
		{"stream alloc + 100", p + 100, true},
		{"device alloc", q, true},
		{"pinned host", h.DevicePtr(), false},
		{"Go stack", DevicePtr(uintptr(unsafe.Pointer(&local))), false},
		{"null", 0, false},
	} {
		got, err := d.IsDevicePointer(c.p)
		if err != nil || got != c.want {
			t.Errorf("%s: IsDevicePointer = %v, %v; want %v", c.name, got, err, c.want)
		}
	}
}

// TestDoConcurrent: many goroutines share one device; the calls of Do
// never overlap (a nested Do runs inside its caller's), each runs with
// its goroutine locked to one OS thread, and their data stays their own.
func TestDoConcurrent(t *testing.T) {
	d := openDevice(t)
	const workers, rounds = 16, 20
	var inside, overlaps, moved atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- func() error {
				s, err := d.NewStream()
				if err != nil {
					return err
				}
				defer s.Close()
				h, err := d.AllocHost(4096)
				if err != nil {
					return err
				}
				defer h.Free()
				for r := range rounds {
					if err := d.Do(func() error {
						if inside.Add(1) != 1 {
							overlaps.Add(1)
						}
						defer inside.Add(-1)
						tid := unix.Gettid()
						// A chance to move, were the thread not locked.
						runtime.Gosched()
						return d.Do(func() error { // nested
							if unix.Gettid() != tid {
								moved.Add(1)
							}
							return nil
						})
					}); err != nil {
						return err
					}
					p, err := s.Alloc(4096)
					if err != nil {
						return err
					}
					v := byte(w*rounds + r)
					ctx, cancel := context.WithTimeout(context.Background(), deadline)
					err = errors.Join(
						s.Memset8(p, v, 4096),
						s.CopyDtoH(h, 0, p, 4096),
						s.Free(p),
						s.Synchronize(ctx))
					cancel()
					if err != nil {
						return err
					}
					for i, b := range h.Bytes() {
						if b != v {
							return fmt.Errorf("worker %d round %d: byte %d = %#x, want %#x", w, r, i, b, v)
						}
					}
				}
				return nil
			}()
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	if n := overlaps.Load(); n > 0 {
		t.Errorf("%d calls of Do ran while another was running", n)
	}
	if n := moved.Load(); n > 0 {
		t.Errorf("%d calls of Do changed OS thread while running", n)
	}
}

// TestDoOtherDevice: a Do of GPU 1 inside a Do of GPU 0 runs with GPU 1's
// context current, and GPU 0's is current again after it returns (needs
// two GPUs).
func TestDoOtherDevice(t *testing.T) {
	d0 := openDevice(t)
	if n, err := NumDevices(); err != nil || n < 2 {
		t.Skipf("needs two GPUs (%d, %v)", n, err)
	}
	d1, err := Open(1)
	must(t, err)
	defer d1.Close()
	must(t, d0.Do(func() error {
		if !d0.current() {
			return errors.New("GPU 0's context is not current inside its Do")
		}
		if err := d1.Do(func() error {
			if !d1.current() {
				return errors.New("GPU 1's context is not current inside its Do, nested in GPU 0's")
			}
			return nil
		}); err != nil {
			return err
		}
		if !d0.current() {
			return errors.New("GPU 0's context is not current after a nested Do of GPU 1")
		}
		return nil
	}))
}

// TestDoReopen: on one OS thread, a Do after the device was closed and
// opened again (its primary context released and retained anew, maybe at
// the same address) has the new context current and working, and a Do
// nested in it runs its function at once; Close refuses to run inside Do.
func TestDoReopen(t *testing.T) {
	openDevice(t).Close() // skips without a GPU
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	for round := range 3 {
		d, err := Open(0)
		must(t, err)
		must(t, d.Do(func() error {
			if !d.current() {
				return fmt.Errorf("round %d: the context is not current inside Do", round)
			}
			return d.Do(func() error { // nested: no deadlock on the device's lock
				if !d.held() {
					return fmt.Errorf("round %d: a nested Do does not see the device held", round)
				}
				return nil
			})
		}))
		if d.held() {
			t.Fatalf("round %d: the device is still held after Do returned", round)
		}
		s, err := d.NewStream()
		must(t, err)
		p, err := s.Alloc(256)
		must(t, err)
		must(t, s.Memset8(p, 1, 256))
		must(t, s.Free(p))
		syncStream(t, s)
		must(t, s.Close())
		if err := d.Do(func() error { return d.Close() }); err == nil {
			t.Fatalf("round %d: Close inside Do succeeded", round)
		}
		must(t, d.Close())
	}
}

func TestClose(t *testing.T) {
	openDevice(t) // skips without a GPU
	d, err := Open(0)
	must(t, err)
	s, err := d.NewStream()
	must(t, err)
	must(t, s.Close())
	must(t, s.Close()) // twice is fine
	if _, err := s.Alloc(16); !errors.Is(err, ErrClosed) {
		t.Errorf("Alloc on a closed stream: %v, want ErrClosed", err)
	}
	if err := d.Do(func() error { return d.Close() }); err == nil {
		t.Error("Close inside Do: no error")
	}
	must(t, d.Close())
	must(t, d.Close())
	if err := d.Do(func() error { return nil }); !errors.Is(err, ErrClosed) {
		t.Errorf("Do after Close: %v, want ErrClosed", err)
	}
	if _, err := d.NewStream(); !errors.Is(err, ErrClosed) {
		t.Errorf("NewStream after Close: %v, want ErrClosed", err)
	}
}

func TestDoPanic(t *testing.T) {
	d := openDevice(t)
	func() {
		defer func() {
			if p := recover(); p != "boom" {
				t.Errorf("recovered %v, want boom", p)
			}
		}()
		_ = d.Do(func() error { panic("boom") })
	}()
	// The device was released.
	if err := d.Do(func() error { return nil }); err != nil {
		t.Fatal(err)
	}
}
