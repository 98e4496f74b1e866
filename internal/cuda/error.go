package cuda

import (
	"errors"
	"fmt"
)

// Error is a failed CUDA driver call: the operation, the CUresult code and
// its name from cuGetErrorName. Every driver status in this package becomes
// one of these through a single conversion function.
type Error struct {
	Op   string // the driver function, e.g. "cuMemAllocAsync"
	Code int    // the CUresult
	Name string // cuGetErrorName(Code), e.g. "CUDA_ERROR_OUT_OF_MEMORY"
}

func (e *Error) Error() string {
	return fmt.Sprintf("cuda: %s: %s (%d)", e.Op, e.Name, e.Code)
}

// CUresult codes that callers and tests of this package look for.
const (
	CodeInvalidValue   = 1   // CUDA_ERROR_INVALID_VALUE
	CodeOutOfMemory    = 2   // CUDA_ERROR_OUT_OF_MEMORY
	CodeNotInitialized = 3   // CUDA_ERROR_NOT_INITIALIZED
	CodeStubLibrary    = 34  // CUDA_ERROR_STUB_LIBRARY: the link-time stub libcuda was loaded
	CodeNoDevice       = 100 // CUDA_ERROR_NO_DEVICE
	CodeInvalidContext = 201 // CUDA_ERROR_INVALID_CONTEXT
	CodeInvalidPTX     = 218 // CUDA_ERROR_INVALID_PTX
	CodeInvalidHandle  = 400 // CUDA_ERROR_INVALID_HANDLE
	CodeNotFound       = 500 // CUDA_ERROR_NOT_FOUND
	CodeNotReady       = 600 // CUDA_ERROR_NOT_READY
	CodeNotPermitted   = 800 // CUDA_ERROR_NOT_PERMITTED
	CodeNotSupported   = 801 // CUDA_ERROR_NOT_SUPPORTED
)

// IsCode reports whether err is (or wraps) an *Error with the given code.
func IsCode(err error, code int) bool {
	var e *Error
	return errors.As(err, &e) && e.Code == code
}

// ErrNotCompiled is wrapped by the error of every constructor of a build
// without the cuda tag (or without cgo).
var ErrNotCompiled = errors.New("cuda: not compiled in (build with -tags cuda and CGO_ENABLED=1)")

// ErrUnsupported is wrapped by the error of an operation that this device,
// driver or build does not offer (for example fabric handles when the
// package was compiled against CUDA headers older than 12.3).
var ErrUnsupported = errors.New("cuda: unsupported")

// ErrClosed is wrapped by the error of an operation on a closed Device,
// Stream, Event, Module or host buffer.
var ErrClosed = errors.New("cuda: closed")
