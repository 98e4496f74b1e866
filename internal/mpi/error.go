package mpi

import (
	"errors"
	"fmt"
)

// Error is a failed MPI call: the operation, the MPI error code and the
// text MPI_Error_string gives for it.
type Error struct {
	Op   string // the MPI function, e.g. "MPI_Ibcast"
	Code int    // the MPI return code (an error class or an error code)
	Msg  string // MPI_Error_string(Code)
}

func (e *Error) Error() string {
	return fmt.Sprintf("mpi: %s: %s (code %d)", e.Op, e.Msg, e.Code)
}

// ErrAbandoned is wrapped by the error of a collective that was left
// unfinished (its context ended first, or MPI_Test failed), and by every
// later call on the same communicator, which is unusable from then on: MPI
// cannot cancel a collective, and the ranks no longer agree on which
// collective comes next.
var ErrAbandoned = errors.New("mpi: communicator unusable after an abandoned collective")

// ErrFinalized is returned by calls made after Finalize (MPI cannot be
// initialised twice in one process).
var ErrFinalized = errors.New("mpi: finalized")
