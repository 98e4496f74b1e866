//go:build mpi

package comm

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/goep/goep/internal/mpi"
)

// NewMPI returns the processes of MPI_COMM_WORLD as a Group (build tag
// mpi; run the program under mpirun). It initialises MPI if nobody has
// (internal/mpi.Init: MPI_THREAD_MULTIPLE, else SERIALIZED with goep's MPI
// calls serialised) and works on a duplicate of MPI_COMM_WORLD, so that
// goep's collectives never match the application's own.
//
// Close: the Close of the last open MPI group (every group NewMPI returned
// and every group split from them) finalizes MPI, if NewMPI initialised it;
// MPI cannot be initialised again in the process, so NewMPI fails after
// that. If the application initialised MPI, it finalizes it too.
//
// Errors: a collective that misses its deadline returns a *TimeoutError
// (wrapping ErrTimeout) whose Missing is empty, as MPI cannot tell which
// ranks did not arrive. MPI cannot cancel a collective either: after a
// timeout the group is unusable (later calls fail at once with an error
// wrapping internal/mpi.ErrAbandoned) and MPI is not finalized by Close (it
// could wait forever); the process should exit. Unlike the other groups, a
// rank blocked in a collective does not learn that a peer closed the group:
// it waits until its deadline. MPI failures wrap an *internal/mpi.Error.
//
// Initialising MPI waits for every rank to initialise it (Open MPI's
// MPI_Init_thread ends in a fence of all ranks): a rank that exits 0
// before it does makes the others wait, and mpirun does not end the job
// (it ends it when a rank exits non-zero). NewMPI bounds that wait by ctx:
// past its deadline it returns a *TimeoutError (MPI cannot say who is
// missing), with MPI_Init_thread still blocked in a thread of its own, and
// the process should exit non-zero, which makes mpirun end the job.
func NewMPI(ctx context.Context) (Group, error) {
	mpiState.mu.Lock()
	defer mpiState.mu.Unlock()
	if mpiState.finalized {
		return nil, fmt.Errorf("comm: NewMPI: MPI was finalized when the last MPI group closed: %w", mpi.ErrFinalized)
	}
	if mpiState.initStuck {
		return nil, errors.New("comm: NewMPI: an earlier MPI_Init_thread never returned")
	}
	inited, err := mpi.Initialized()
	if err != nil {
		return nil, fmt.Errorf("comm: NewMPI: %w", err)
	}
	initDone := make(chan error, 1)
	go func() { initDone <- mpi.Init() }()
	select {
	case err = <-initDone:
	case <-ctx.Done():
		mpiState.initStuck = true
		if errors.Is(ctx.Err(), context.Canceled) {
			return nil, fmt.Errorf("comm: NewMPI: MPI_Init_thread: %w", ctx.Err())
		}
		return nil, &TimeoutError{Op: "NewMPI: MPI_Init_thread did not return: some rank has not called it (exited before it, or not started; MPI cannot say which)"}
	}
	if err != nil {
		return nil, fmt.Errorf("comm: NewMPI: %w", err)
	}
	if !inited {
		mpiState.ours = true
	}
	c, err := mpi.World().Dup(ctx)
	if err != nil {
		return nil, mpiError("NewMPI (duplicate MPI_COMM_WORLD)", mpi.World().Rank(), err)
	}
	mpiState.open++
	return &mpiGroup{c: c}, nil
}

// mpiState counts the open MPI groups of the process.
var mpiState struct {
	mu        sync.Mutex
	ours      bool // NewMPI initialised MPI: the last Close finalizes it
	open      int
	finalized bool
	initStuck bool   // an MPI_Init_thread outlived NewMPI's ctx
	aborted   string // non-empty: Abort was called, why
}

// abort makes every later call of every MPI group of the process fail (see
// comm.Abort); Close then frees nothing, as MPI_Finalize could wait for
// ever.
func (g *mpiGroup) abort(cause string) {
	mpiState.mu.Lock()
	defer mpiState.mu.Unlock()
	if mpiState.aborted == "" {
		mpiState.aborted = cause
	}
}

type mpiGroup struct {
	c *mpi.Comm

	mu     sync.Mutex
	closed bool
}

func (g *mpiGroup) Rank() int { return g.c.Rank() }
func (g *mpiGroup) Size() int { return g.c.Size() }

// mpiError turns an error of internal/mpi into comm's: a deadline is a
// *TimeoutError, anything else is wrapped with the operation and rank.
func mpiError(op string, rank int, err error) error {
	if errors.Is(err, context.DeadlineExceeded) {
		return &TimeoutError{Op: fmt.Sprintf("mpi %s on rank %d (MPI cannot name the missing ranks)", op, rank)}
	}
	return fmt.Errorf("comm: mpi %s on rank %d: %w", op, rank, err)
}

// check returns ErrClosed on a closed group.
func (g *mpiGroup) check(op string) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return fmt.Errorf("comm: mpi %s on rank %d: %w", op, g.c.Rank(), ErrClosed)
	}
	mpiState.mu.Lock()
	defer mpiState.mu.Unlock()
	if mpiState.aborted != "" {
		return fmt.Errorf("comm: mpi %s on rank %d: this rank aborted (%s): %w", op, g.c.Rank(), mpiState.aborted, ErrAborted)
	}
	return nil
}

func (g *mpiGroup) AllGather(ctx context.Context, data []byte) ([][]byte, error) {
	if err := g.check("allgather"); err != nil {
		return nil, err
	}
	all, err := g.c.Allgather(ctx, data)
	if err != nil {
		return nil, mpiError("allgather", g.c.Rank(), err)
	}
	return all, nil
}

func (g *mpiGroup) AllToAll(ctx context.Context, send [][]byte) ([][]byte, error) {
	if err := g.check("alltoall"); err != nil {
		return nil, err
	}
	if len(send) != g.c.Size() {
		return nil, fmt.Errorf("comm: mpi alltoall on rank %d: %d buffers for %d ranks", g.c.Rank(), len(send), g.c.Size())
	}
	recv, err := g.c.Alltoallv(ctx, send)
	if err != nil {
		return nil, mpiError("alltoall", g.c.Rank(), err)
	}
	return recv, nil
}

// AllToAllv (see the function AllToAllv) is one MPI_Ialltoallv on the
// caller's buffers, pinned for the call.
func (g *mpiGroup) AllToAllv(ctx context.Context, send []byte, sendCounts []int, recv []byte, recvCounts []int) error {
	if err := g.check("alltoallv"); err != nil {
		return err
	}
	if err := checkV(g.c.Rank(), g.c.Size(), send, sendCounts, recv, recvCounts); err != nil {
		return err
	}
	if err := g.c.AlltoallvInto(ctx, send, sendCounts, recv, recvCounts); err != nil {
		return mpiError("alltoallv", g.c.Rank(), err)
	}
	return nil
}

func (g *mpiGroup) Broadcast(ctx context.Context, root int, data []byte) ([]byte, error) {
	if err := g.check("broadcast"); err != nil {
		return nil, err
	}
	if root < 0 || root >= g.c.Size() {
		return nil, fmt.Errorf("comm: mpi broadcast root %d out of range [0, %d)", root, g.c.Size())
	}
	b, err := g.c.Bcast(ctx, root, data)
	if err != nil {
		return nil, mpiError("broadcast", g.c.Rank(), err)
	}
	return b, nil
}

func (g *mpiGroup) Barrier(ctx context.Context) error {
	if err := g.check("barrier"); err != nil {
		return err
	}
	if err := g.c.Barrier(ctx); err != nil {
		return mpiError("barrier", g.c.Rank(), err)
	}
	return nil
}

// Split all-gathers every rank's (color, key), works out the new groups as
// the other implementations do (by key, then by rank), and passes MPI a
// dense color and the new rank as key, so that any int color and key work.
func (g *mpiGroup) Split(ctx context.Context, color, key int) (Group, error) {
	if err := g.check("split"); err != nil {
		return nil, err
	}
	var b [16]byte
	binary.LittleEndian.PutUint64(b[:], uint64(int64(color)))
	binary.LittleEndian.PutUint64(b[8:], uint64(int64(key)))
	all, err := g.c.Allgather(ctx, b[:])
	if err != nil {
		return nil, mpiError("split", g.c.Rank(), err)
	}
	colors := make([]int, len(all))
	keys := make([]int, len(all))
	for r, d := range all {
		if len(d) != 16 {
			return nil, fmt.Errorf("comm: mpi split on rank %d: rank %d sent %d bytes, want 16", g.c.Rank(), r, len(d))
		}
		colors[r] = int(int64(binary.LittleEndian.Uint64(d)))
		keys[r] = int(int64(binary.LittleEndian.Uint64(d[8:])))
	}
	_, index := splitMembers(g.c.Rank(), colors, keys)
	distinct := slices.Compact(slices.Sorted(slices.Values(colors)))
	dense := slices.Index(distinct, color)
	sub, err := g.c.Split(ctx, dense, index)
	if err != nil {
		return nil, mpiError("split", g.c.Rank(), err)
	}
	mpiState.mu.Lock()
	mpiState.open++
	mpiState.mu.Unlock()
	return &mpiGroup{c: sub}, nil
}

// Close frees the communicator; the last open MPI group's Close finalizes
// MPI if NewMPI initialised it (see NewMPI).
func (g *mpiGroup) Close() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return nil
	}
	g.closed = true
	mpiState.mu.Lock()
	aborted := mpiState.aborted != ""
	mpiState.mu.Unlock()
	if aborted {
		return nil // the process is about to exit; MPI_Finalize could wait for ranks that are gone
	}
	var errs []error
	if err := g.c.Free(); err != nil {
		errs = append(errs, mpiError("close", g.c.Rank(), err))
	}
	mpiState.mu.Lock()
	defer mpiState.mu.Unlock()
	mpiState.open--
	if mpiState.open == 0 && mpiState.ours && !mpiState.finalized {
		if err := mpi.Finalize(); err != nil {
			errs = append(errs, fmt.Errorf("comm: mpi close on rank %d: %w", g.c.Rank(), err))
		} else {
			mpiState.finalized = true
		}
	}
	return errors.Join(errs...)
}
