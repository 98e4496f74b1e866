//go:build !mpi

package comm

import (
	"context"
	"fmt"
)

// NewMPI needs the build tag mpi (and Open MPI); without it, it returns an
// error wrapping ErrUnsupported.
func NewMPI(ctx context.Context) (Group, error) {
	return nil, fmt.Errorf("comm: NewMPI: MPI support is not compiled in (build with -tags mpi): %w", ErrUnsupported)
}
