// Package cuda is goep's thin layer over the CUDA driver API (libcuda), for
// the CUDA backend of package device and the GPU transports of nvlink. It is
// compiled with the build tag cuda (and cgo); without the tag only Open,
// NumDevices and DriverVersion exist, and they return errors wrapping
// ErrNotCompiled.
//
// # Threads and contexts
//
// The driver keeps the current context per OS thread, and goroutines move
// between threads. Open retains the device's primary context (shared with
// any other library of the process); every driver call of this package is
// made through Device.Do, which locks the calling goroutine to its OS
// thread for the call and makes that context current there. Calls from
// many goroutines are serialised (a mutex, no hand-off to another thread);
// Do may be nested. A thread's own record in C thread-local storage says
// which devices' Do it is inside (a nested Do runs its function at once)
// and which device last set its context, so that a Do makes no system
// call and sets the context only where it is not already this device's
// own. Waits never hold the device: Stream and
// Event Synchronize poll cuStreamQuery / cuEventQuery from the caller's
// goroutine with short sleeps, bounded by a context.
//
// # Errors
//
// Every CUresult is checked and turned, by one function, into an *Error
// naming the driver call, the code and its name (cuGetErrorName). Wrapping
// errors add the operation. ErrUnsupported marks what the device, driver or
// headers lack; ErrClosed a use after Close.
//
// # Memory and lifetimes
//
// Stream.Alloc and Stream.Free are stream-ordered (cuMemAllocAsync,
// cuMemFreeAsync), so memory read by queued work is never reused before
// that work is done (DESIGN invariant 2). Device.Alloc (cuMemAlloc) is for
// long-lived and IPC-exported buffers. Host memory the GPU touches comes from
// AllocHost (pinned, C memory); no Go pointer is kept by the driver after a
// call returns (invariant 6): kernel arguments, PTX images and handles are
// copied through C memory.
//
// # Kernels
//
// LoadPTX JIT-compiles PTX (kernels are CUDA C++ built to PTX by go
// generate and embedded). Launch passes each argument at its own size
// (int32, uint32, float32: 4 bytes; int64, uint64, DevicePtr: 8), so an int32
// parameter followed by a pointer is laid out as the kernel expects.
//
// # Sharing memory between processes and nodes
//
// GetIPCHandle / OpenIPCHandle (legacy IPC, same host), and VMM allocations
// (MemCreate, Map) exported as POSIX file descriptors (same host) or fabric
// handles (multi-node NVLink on GB200/GB300; needs CUDA 12.3+ headers at
// build time, else ErrUnsupported). Stream.WriteValue32/64 and
// WaitValue32/64 signal between streams and processes without a kernel.
//
// # Building
//
// cgo needs cuda.h and a libcuda.so to link against; the driver's stub
// (stubs/libcuda.so) is enough, and the loader finds the real libcuda.so.1
// at run time. On Debian 12: contrib and non-free enabled, then
// apt-get install nvidia-cuda-dev nvidia-cuda-toolkit (scripts/cuda-check.sh
// does it). Test binaries for a GPU host are built anywhere:
//
//	go test -c -tags cuda -o .gpu/cuda.test ./internal/cuda
//	.gpu/cuda.test -test.v -gpu   # on the GPU host; -gpu: fail, not skip, without one
//
// # Usage
//
//	dev, err := cuda.Open(0)
//	if err != nil { ... }          // wraps ErrNotCompiled without the tag
//	defer dev.Close()
//	s, err := dev.NewStream()
//	defer s.Close()
//	x, err := s.Alloc(n * 4)       // stream-ordered
//	mod, err := dev.LoadPTX(ptx)   // //go:embed kernels/foo.ptx
//	fn, err := mod.Function("goep_add")
//	err = cuda.Launch(fn, cuda.Dim3{X: 128}, cuda.Dim3{X: 256}, 0, s,
//		int32(7), x, int64(n))
//	err = s.Free(x)
//	err = s.Synchronize(ctx)       // bounded by ctx's deadline
package cuda

//go:generate go run github.com/goep/goep/internal/ptxgen testdata/kernels.cu testdata/kernels.ptx
