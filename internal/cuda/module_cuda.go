//go:build cuda && cgo

package cuda

/*
#include <stdint.h>
#include <stdlib.h>
#include <cuda.h>

// goep_module_load JIT-compiles a NUL-terminated PTX image, leaving the
// compiler's error log in log (cuModuleLoadDataEx). image and log are C
// memory.
static CUresult goep_module_load(CUmodule *m, const void *image, char *log, size_t logSize) {
	CUjit_option opts[2] = {CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
	void *vals[2] = {log, (void *)(uintptr_t)logSize};
	return cuModuleLoadDataEx(m, image, 2, opts, vals);
}
*/
import "C"

import (
	"fmt"
	"math"
	"strings"
	"unsafe"
)

// jitLogSize bounds the JIT error log kept in a load error.
const jitLogSize = 16 << 10

// Module is loaded GPU code (CUmodule).
type Module struct {
	d *Device
	m C.CUmodule // nil once closed; inside Do only
}

// LoadPTX JIT-compiles PTX text for the device and loads it
// (cuModuleLoadDataEx with CU_JIT_ERROR_LOG_BUFFER). On failure the error
// wraps the *Error and carries the JIT compiler's log. PTX loads on any
// driver new enough for its .version and on any GPU at least as new as its
// .target.
func (d *Device) LoadPTX(ptx []byte) (*Module, error) {
	if len(ptx) == 0 {
		return nil, fmt.Errorf("cuda: load PTX: empty image")
	}
	image := cbytes(ptx)
	defer C.free(image)
	log := (*C.char)(C.calloc(jitLogSize, 1))
	defer C.free(unsafe.Pointer(log))
	m := &Module{d: d}
	err := d.Do(func() error {
		return result("cuModuleLoadDataEx", C.goep_module_load(&m.m, image, log, jitLogSize))
	})
	if err != nil {
		if l := strings.TrimSpace(C.GoString(log)); l != "" {
			return nil, fmt.Errorf("cuda: load PTX: %w; JIT log:\n%s", err, l)
		}
		return nil, fmt.Errorf("cuda: load PTX: %w", err)
	}
	return m, nil
}

// Function is a kernel of a module (CUfunction), valid until the module is
// closed.
type Function struct {
	m    *Module
	f    C.CUfunction
	name string
}

// Function looks up a kernel by its (extern "C") name (cuModuleGetFunction).
func (m *Module) Function(name string) (*Function, error) {
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	fn := &Function{m: m, name: name}
	err := m.d.Do(func() error {
		if m.m == nil {
			return fmt.Errorf("cuda: module: %w", ErrClosed)
		}
		return result("cuModuleGetFunction", C.cuModuleGetFunction(&fn.f, m.m, cname))
	})
	if err != nil {
		return nil, fmt.Errorf("cuda: function %q: %w", name, err)
	}
	return fn, nil
}

// Close unloads the module (cuModuleUnload); its functions become invalid.
// Kernels already queued must have completed. A second Close returns nil.
func (m *Module) Close() error {
	return release(m.d, &m.m, "cuModuleUnload", func(m C.CUmodule) C.CUresult { return C.cuModuleUnload(m) })
}

// Name is the kernel's name.
func (f *Function) Name() string { return f.name }

// SetMaxDynamicSharedMemory lets launches of f use up to bytes of dynamic
// shared memory (cuFuncSetAttribute with
// CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES); without it a launch
// asking for more than 48 KiB fails. bytes may be at most the device's
// Limits().SharedPerBlockOptin less the kernel's static shared memory.
func (f *Function) SetMaxDynamicSharedMemory(bytes int) error {
	if bytes < 0 || bytes > math.MaxInt32 {
		return fmt.Errorf("cuda: function %s: dynamic shared memory %d out of range", f.name, bytes)
	}
	err := f.m.d.Do(func() error {
		if f.m.m == nil {
			return fmt.Errorf("module: %w", ErrClosed)
		}
		return result("cuFuncSetAttribute", C.cuFuncSetAttribute(f.f,
			C.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, C.int(bytes)))
	})
	if err != nil {
		return fmt.Errorf("cuda: function %s: set max dynamic shared memory %d: %w", f.name, bytes, err)
	}
	return nil
}

// Launch enqueues fn on s with the given grid, block and dynamic shared
// memory bytes (cuLaunchKernel). Each argument is passed at its own size,
// as the kernel's parameter list declares it:
//
//	int32, uint32, float32   4 bytes
//	int64, uint64, DevicePtr 8 bytes
//
// Other types (int, uintptr, pointers, slices) are refused: their size on
// the GPU side would be a guess. The arguments are copied into C memory for
// the call and freed after it (the driver copies them at launch), so no Go
// pointer reaches the driver.
func Launch(fn *Function, grid, block Dim3, sharedMem int, s *Stream, args ...any) error {
	return launch(false, fn, grid, block, sharedMem, s, args)
}

// LaunchCooperative is Launch through cuLaunchCooperativeKernel: all blocks
// of the grid are resident at once and may synchronise with each other
// (cooperative groups' grid.sync). The grid must fit on the device at once
// (Features.Cooperative, occupancy times SMs), else the driver answers
// CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE.
func LaunchCooperative(fn *Function, grid, block Dim3, sharedMem int, s *Stream, args ...any) error {
	if !s.d.feat.Cooperative {
		return fmt.Errorf("cuda: launch %s: %w: device %d has no cooperative launch", fn.name, ErrUnsupported, s.d.ordinal)
	}
	return launch(true, fn, grid, block, sharedMem, s, args)
}

func launch(coop bool, fn *Function, grid, block Dim3, sharedMem int, s *Stream, args []any) error {
	if fn.m.d != s.d {
		return fmt.Errorf("cuda: launch %s: function of device %d on stream of device %d", fn.name, fn.m.d.ordinal, s.d.ordinal)
	}
	if sharedMem < 0 {
		return fmt.Errorf("cuda: launch %s: negative shared memory %d", fn.name, sharedMem)
	}
	params, free, err := packArgs(args)
	if err != nil {
		return fmt.Errorf("cuda: launch %s: %w", fn.name, err)
	}
	defer free()
	gx, gy, gz := grid.dims()
	bx, by, bz := block.dims()
	err = s.do(func(cs C.CUstream) error {
		if fn.m.m == nil {
			return fmt.Errorf("module: %w", ErrClosed)
		}
		if coop {
			return result("cuLaunchCooperativeKernel",
				C.cuLaunchCooperativeKernel(fn.f, gx, gy, gz, bx, by, bz, C.uint(sharedMem), cs, params))
		}
		return result("cuLaunchKernel",
			C.cuLaunchKernel(fn.f, gx, gy, gz, bx, by, bz, C.uint(sharedMem), cs, params, nil))
	})
	if err != nil {
		return fmt.Errorf("cuda: launch %s: %w", fn.name, err)
	}
	counts.launches.Add(1)
	return nil
}

// argSize is the size (and alignment) of a kernel argument, or 0 for a type
// Launch refuses.
func argSize(a any) int {
	switch a.(type) {
	case int32, uint32, float32:
		return 4
	case int64, uint64, DevicePtr:
		return 8
	}
	return 0
}

// packArgs builds the kernelParams array in one C block: len(args)
// pointers, then each value at its own size and alignment. The caller calls
// free after the launch.
func packArgs(args []any) (*unsafe.Pointer, func(), error) {
	if len(args) == 0 {
		return nil, func() {}, nil
	}
	const ptrSize = int(unsafe.Sizeof(unsafe.Pointer(nil)))
	off := len(args) * ptrSize
	offs := make([]int, len(args))
	for i, a := range args {
		n := argSize(a)
		if n == 0 {
			return nil, nil, fmt.Errorf("argument %d: type %T unsupported (use int32, uint32, int64, uint64, float32 or DevicePtr)", i, a)
		}
		off = (off + n - 1) &^ (n - 1)
		offs[i] = off
		off += n
	}
	block := C.calloc(C.size_t(off), 1)
	if block == nil {
		return nil, nil, fmt.Errorf("calloc %d bytes for kernel arguments failed", off)
	}
	ptrs := unsafe.Slice((*unsafe.Pointer)(block), len(args))
	for i, a := range args {
		p := unsafe.Add(block, offs[i])
		ptrs[i] = p
		switch v := a.(type) {
		case int32:
			*(*int32)(p) = v
		case uint32:
			*(*uint32)(p) = v
		case float32:
			*(*float32)(p) = v
		case int64:
			*(*int64)(p) = v
		case uint64:
			*(*uint64)(p) = v
		case DevicePtr:
			*(*uint64)(p) = uint64(v)
		}
	}
	return (*unsafe.Pointer)(block), func() { C.free(block) }, nil
}
