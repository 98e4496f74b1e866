//go:build !ucx || !cgo

package rdma

import (
	"context"
	"fmt"

	"github.com/goep/goep/comm"
)

// NewUCX needs the build tag ucx (cgo and UCX: Debian's libucx-dev);
// without it, it returns an error wrapping ErrUnsupported that names the
// tag.
func NewUCX(ctx context.Context, g comm.Group, cfg Config) (Transport, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return nil, fmt.Errorf("rdma: NewUCX: %s: %w", notCompiled, ErrUnsupported)
}

// Devices needs the build tag ucx, as NewUCX does; without it, it returns
// an error wrapping ErrUnsupported that names the tag.
func Devices() (Resources, error) {
	return Resources{}, fmt.Errorf("rdma: devices: %s: %w", notCompiled, ErrUnsupported)
}

// notCompiled says what a binary without UCX lacks and how to build one.
const notCompiled = "UCX support is not compiled in (build with -tags ucx and cgo; needs libucx-dev)"
