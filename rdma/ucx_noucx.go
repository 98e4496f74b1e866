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
	return nil, fmt.Errorf("rdma: NewUCX: UCX support is not compiled in (build with -tags ucx and cgo; needs libucx-dev): %w", ErrUnsupported)
}
