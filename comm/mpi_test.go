//go:build mpi

package comm

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/goep/goep/internal/mpi"
	"github.com/goep/goep/internal/ranktest"
)

const mpiNP = 4 // the processes of each test's world, under mpirun

func TestMPIGroup(t *testing.T) {
	if !ranktest.UnderMPI(t, mpiNP) {
		return
	}
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	g, err := NewMPI(ctx)
	if err != nil {
		t.Fatal(err)
	}
	me, n := g.Rank(), g.Size()
	if n != mpiNP {
		t.Fatalf("size %d, want %d", n, mpiNP)
	}
	if err := ranktest.CheckCollectives(ctx, groupCollectives(g), 3); err != nil {
		t.Fatal(err)
	}
	if err := checkAllToAllv(ctx, g); err != nil {
		t.Fatal(err)
	}

	// Bad input is an error on every rank, and the group stays usable.
	if _, err := g.Broadcast(ctx, n, nil); err == nil {
		t.Error("broadcast with root out of range succeeded")
	}
	if _, err := g.AllToAll(ctx, make([][]byte, n+1)); err == nil {
		t.Error("alltoall with too many buffers succeeded")
	}
	if err := g.Barrier(ctx); err != nil {
		t.Fatal(err)
	}

	// Two colors (any ints), keys reversed: the new order within a color
	// is the reverse of the old one.
	color := []int{-7, 1 << 40}[me%2]
	sub, err := g.Split(ctx, color, -me)
	if err != nil {
		t.Fatal(err)
	}
	var members []int
	for r := range n {
		if r%2 == me%2 {
			members = append(members, r)
		}
	}
	slices.Reverse(members)
	if sub.Size() != len(members) || sub.Rank() != slices.Index(members, me) {
		t.Errorf("split: rank %d of %d, want %d of %d", sub.Rank(), sub.Size(), slices.Index(members, me), len(members))
	}
	all, err := sub.AllGather(ctx, []byte{byte(me)})
	if err != nil {
		t.Fatal(err)
	}
	for r, b := range all {
		if len(b) != 1 || int(b[0]) != members[r] {
			t.Errorf("split color %d: new rank %d is old rank %v, want %d", color, r, b, members[r])
		}
	}
	// Equal keys: ordered by old rank.
	same, err := g.Split(ctx, 0, 5)
	if err != nil {
		t.Fatal(err)
	}
	if same.Rank() != me || same.Size() != n {
		t.Errorf("split with equal keys: rank %d of %d, want %d of %d", same.Rank(), same.Size(), me, n)
	}

	// Closing the world first: MPI is finalized by the last Close.
	for _, c := range []Group{g, same} {
		if err := c.Close(); err != nil {
			t.Error(err)
		}
	}
	if err := g.Barrier(ctx); !errors.Is(err, ErrClosed) {
		t.Errorf("barrier on a closed group: got %v, want ErrClosed", err)
	}
	if err := sub.Barrier(ctx); err != nil {
		t.Fatalf("barrier on a split group after the world closed: %v", err)
	}
	if done, err := mpi.Finalized(); err != nil || done {
		t.Errorf("MPI finalized while a group is open: %v, %v", done, err)
	}
	if err := sub.Close(); err != nil {
		t.Error(err)
	}
	if done, err := mpi.Finalized(); err != nil || !done {
		t.Errorf("MPI not finalized after the last Close: %v, %v", done, err)
	}
	if _, err := NewMPI(ctx); err == nil {
		t.Error("NewMPI after MPI was finalized succeeded")
	}
}

// TestMPITimeout: the last rank enters a barrier only once the others have
// given up on it; they must get a *TimeoutError (wrapping ErrTimeout) at
// their deadline, and then fail fast. MPI_Finalize could hang on the
// abandoned barrier, so Close skips it (and says so) and the children end
// with ranktest.ExitWithVerdict.
func TestMPITimeout(t *testing.T) {
	dir, under := ranktest.UnderMPIWithVerdicts(t, mpiNP)
	if !under {
		return
	}
	g, err := NewMPI(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	ranktest.ExitWithVerdict(t, dir, g.Rank(), g.Size(), mpiTimeoutRank(g, dir))
}

// mpiTimeoutRank is one rank of TestMPITimeout; dir holds the ranks'
// verdicts.
func mpiTimeoutRank(g Group, dir string) error {
	const deadline = 500 * time.Millisecond
	// A promptness bound a loaded machine meets, far below the minute a
	// hang runs into (mpirun's bound).
	const slack = 5 * time.Second
	if err := g.Barrier(context.Background()); err != nil { // all started
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	if last := g.Size() - 1; g.Rank() == last {
		// Late for good: the others have returned from the barrier.
		others := make([]int, last)
		for r := range others {
			others[r] = r
		}
		if !ranktest.WaitVerdicts(dir, others...) {
			return errors.New("late rank: the others wrote no verdicts")
		}
		if err := g.Barrier(ctx); err != nil && !errors.Is(err, ErrTimeout) {
			return fmt.Errorf("late rank: got %v, want nil or ErrTimeout", err)
		}
		return nil
	}
	start := time.Now()
	err := g.Barrier(ctx)
	took := time.Since(start)
	var te *TimeoutError
	if !errors.As(err, &te) || !errors.Is(err, ErrTimeout) {
		return fmt.Errorf("barrier: got %v, want a *TimeoutError", err)
	}
	if took > deadline+slack {
		return fmt.Errorf("barrier returned %v after its %v deadline", took-deadline, deadline)
	}
	start = time.Now()
	if _, err := g.AllGather(context.Background(), []byte{1}); !errors.Is(err, mpi.ErrAbandoned) {
		return fmt.Errorf("allgather after the timeout: got %v, want mpi.ErrAbandoned", err)
	}
	if err := g.Close(); !errors.Is(err, mpi.ErrAbandoned) {
		return fmt.Errorf("close after the timeout: got %v, want an error saying MPI_Finalize was skipped", err)
	}
	// A real wait would never end: the late rank calls no AllGather.
	if took := time.Since(start); took > slack {
		return fmt.Errorf("failing fast took %v", took)
	}
	return nil
}

// TestMPIInitRankGone: the last rank exits (status 0) before any rank
// calls MPI_Init, which leaves the others waiting in MPI_Init_thread:
// mpirun (Open MPI 4) ends the job when a rank exits without MPI_Init
// after another called it, not before. NewMPI returns a *TimeoutError at
// its ctx's deadline all the same, and a later NewMPI fails at once, so
// that the process can exit (non-zero, in a real program: mpirun then ends
// the job).
func TestMPIInitRankGone(t *testing.T) {
	dir, under := ranktest.UnderMPIWithVerdicts(t, mpiNP)
	if !under {
		return
	}
	rank, _ := strconv.Atoi(os.Getenv("OMPI_COMM_WORLD_RANK"))
	size, _ := strconv.Atoi(os.Getenv("OMPI_COMM_WORLD_SIZE"))
	gone := filepath.Join(dir, "gone")
	if rank == size-1 {
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprint(rank)), []byte("ok"), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(gone+".tmp", []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
			t.Fatal(err)
		}
		os.Rename(gone+".tmp", gone)
		os.Exit(0)
	}
	// Wait until the last rank's process is gone and mpirun has reaped
	// it: a zombie is not enough, for mpirun would then learn of its exit
	// after a rank here called MPI_Init and end the job.
	verdict := func() error {
		for end := time.Now().Add(time.Minute); ; time.Sleep(10 * time.Millisecond) {
			if time.Now().After(end) {
				return errors.New("the last rank did not exit and was not reaped")
			}
			b, err := os.ReadFile(gone)
			if err != nil {
				continue
			}
			if _, err := os.Stat(fmt.Sprintf("/proc/%s", b)); err != nil {
				break
			}
		}
		const deadline = 2 * time.Second
		ctx, cancel := context.WithTimeout(context.Background(), deadline)
		defer cancel()
		start := time.Now()
		g, err := NewMPI(ctx)
		took := time.Since(start)
		var te *TimeoutError
		switch {
		case err == nil:
			g.Close()
			return errors.New("NewMPI succeeded without the last rank")
		case !errors.As(err, &te) || !strings.Contains(err.Error(), "MPI_Init_thread"):
			return fmt.Errorf("NewMPI: %v, want a *TimeoutError naming MPI_Init_thread", err)
		case took > deadline+5*time.Second:
			return fmt.Errorf("NewMPI returned %v after its %v deadline", took-deadline, deadline)
		}
		if _, err := NewMPI(context.Background()); err == nil || !strings.Contains(err.Error(), "never returned") {
			return fmt.Errorf("the next NewMPI: %v, want an error at once", err)
		}
		return nil
	}()
	ranktest.ExitWithVerdict(t, dir, rank, size-1, verdict) // waits for the ranks still there
}
