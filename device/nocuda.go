//go:build !cuda || !cgo

package device

import "fmt"

// CUDA is the CUDA backend; this build has none (see NewCUDA).
type CUDA struct{}

// NewCUDA fails: the package was built without the cuda tag (or without
// cgo). The error wraps ErrUnsupported and says how to build it in.
func NewCUDA(ordinal int) (*CUDA, error) {
	return nil, fmt.Errorf("device: CUDA backend for GPU %d: %w: not compiled in (build with -tags cuda and CGO_ENABLED=1)", ordinal, ErrUnsupported)
}

// Kind implements Backend.
func (c *CUDA) Kind() Kind { return KindCUDA }

// NewStream implements Backend; it always fails in this build.
func (c *CUDA) NewStream() (Stream, error) {
	return nil, fmt.Errorf("device: CUDA new stream: %w: not compiled in (build with -tags cuda)", ErrUnsupported)
}

// Close implements Backend.
func (c *CUDA) Close() error { return nil }

// CUDAStream is a stream of the CUDA backend; this build has none.
type CUDAStream struct{}
