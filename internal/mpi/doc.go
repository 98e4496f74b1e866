// Package mpi is a thin cgo binding to Open MPI for goep's control plane
// (comm.NewMPI). It is compiled only with the build tag mpi (it needs
// libopenmpi-dev and pkg-config); without the tag the package holds only its
// error types.
//
// Every MPI call's return code is checked (MPI_ERRORS_RETURN is set on
// MPI_COMM_WORLD and on every communicator this package creates) and turned
// into an *Error by one conversion function. Collectives are started
// non-blocking (MPI_Iallgather, MPI_Ibcast, ...) and polled with MPI_Test
// until they complete or the context is done, so every wait has the caller's
// deadline. An MPI request cannot be cancelled portably: a collective that
// misses its deadline is abandoned, its C buffers are kept (leaked) because
// MPI may still write them, and the communicator fails fast from then on
// with an error wrapping ErrAbandoned. Finalize refuses to run after an
// abandonment (MPI_Finalize could wait forever for the abandoned request):
// exit the process, or call Abort.
//
// No Go memory is handed to MPI beyond the call that receives it: buffers of
// non-blocking operations are copied to and from C.malloc'd memory.
//
// Usage (under mpirun):
//
//	if err := mpi.Init(); err != nil { ... }
//	world := mpi.World()
//	all, err := world.Allgather(ctx, []byte("hello"))
//	...
//	err = mpi.Finalize()
package mpi
