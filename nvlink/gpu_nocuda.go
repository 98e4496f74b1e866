//go:build !cuda || !cgo

package nvlink

import (
	"context"
	"fmt"

	"github.com/goep/goep/comm"
	"github.com/goep/goep/device"
)

// GPUWindows are a domain's GPU memory windows; this build has no CUDA
// (see MapGPU).
type GPUWindows struct {
	Own      []*device.Buffer
	Peers    [][]*device.Buffer
	Share    device.ShareKind
	Fallback string
}

// MapGPU fails: the package was built without the cuda tag (or cgo).
func MapGPU(ctx context.Context, g comm.Group, s *device.CUDAStream, sizes []int, share device.ShareKind, crossHost bool) (*GPUWindows, error) {
	return nil, fmt.Errorf("nvlink: GPU windows: %w: not compiled in (build with -tags cuda)", device.ErrUnsupported)
}

// Close does nothing in this build.
func (w *GPUWindows) Close() error { return nil }
