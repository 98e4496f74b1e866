//go:build mpi

package mpi

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/goep/goep/internal/ranktest"
)

// np processes run each test, started by mpirun (ranktest.UnderMPI); each
// checks its own rank's results.
const np = 4

func TestCollectives(t *testing.T) {
	if !ranktest.UnderMPI(t, np) {
		return
	}
	if err := Init(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := Finalize(); err != nil {
			t.Error(err)
		}
	}()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	w := World()
	me, n := w.Rank(), w.Size()
	if n != np {
		t.Fatalf("size %d, want %d", n, np)
	}
	t.Logf("rank %d of %d, MPI_THREAD_MULTIPLE: %v", me, n, ThreadMultiple())

	calls := ranktest.Collectives{
		Rank: me, Size: n,
		AllGather: w.Allgather, AllToAll: w.Alltoallv, Broadcast: w.Bcast, Barrier: w.Barrier,
	}
	if err := ranktest.CheckCollectives(ctx, calls, 3); err != nil {
		t.Fatal(err)
	}

	// Large buffers: past the eager limit of shared memory, where Open
	// MPI switches to its rendezvous (and single-copy) protocol.
	big := func(r, p int) []byte {
		b := make([]byte, 1<<20+r*1000+p)
		for j := range b {
			b[j] = byte(r*31 + p*7 + j)
		}
		return b
	}
	all, err := w.Allgather(ctx, big(me, 0))
	if err != nil {
		t.Fatal(err)
	}
	for r := range n {
		if !bytes.Equal(all[r], big(r, 0)) {
			t.Errorf("large allgather: rank %d's data differs", r)
		}
	}
	send := make([][]byte, n)
	for p := range send {
		send[p] = big(me, p)
	}
	recv, err := w.Alltoallv(ctx, send)
	if err != nil {
		t.Fatal(err)
	}
	for r := range n {
		if !bytes.Equal(recv[r], big(r, me)) {
			t.Errorf("large alltoallv: rank %d's data differs", r)
		}
	}

	// Empty everywhere.
	all, err = w.Allgather(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	for r, b := range all {
		if len(b) != 0 {
			t.Errorf("empty allgather: rank %d sent %v", r, b)
		}
	}
	if got, err := w.Bcast(ctx, 0, nil); err != nil || len(got) != 0 {
		t.Errorf("empty bcast: %v, %v", got, err)
	}
	if recv, err := w.Alltoallv(ctx, make([][]byte, n)); err != nil || len(recv) != n {
		t.Errorf("empty alltoallv: %v, %v", recv, err)
	}

	// A bad call is an *Error from MPI, on every rank, and the
	// communicator stays usable.
	_, err = w.Bcast(ctx, n+3, []byte{1})
	var me2 *Error
	if !errors.As(err, &me2) {
		t.Fatalf("bcast with root %d: got %v, want an *mpi.Error", n+3, err)
	}
	if me2.Op != "MPI_Ibcast" || me2.Code == 0 || me2.Msg == "" {
		t.Errorf("bcast with a bad root: %#v", me2)
	}
	t.Logf("bad root: %v", err)
	if err := w.Barrier(ctx); err != nil {
		t.Fatalf("barrier after a failed call: %v", err)
	}

	// Split into two colors with reversed keys: new rank order is the
	// reverse of the old one within each color.
	color := me % 2
	sub, err := w.Split(ctx, color, n-me)
	if err != nil {
		t.Fatal(err)
	}
	var members []int // old ranks of my color, ascending
	for r := range n {
		if r%2 == color {
			members = append(members, r)
		}
	}
	if sub.Size() != len(members) {
		t.Fatalf("split: size %d, want %d", sub.Size(), len(members))
	}
	wantRank := len(members) - 1 - slices.Index(members, me)
	if sub.Rank() != wantRank {
		t.Errorf("split: rank %d, want %d", sub.Rank(), wantRank)
	}
	all, err = sub.Allgather(ctx, []byte{byte(me)})
	if err != nil {
		t.Fatal(err)
	}
	for r, b := range all {
		if want := members[len(members)-1-r]; len(b) != 1 || int(b[0]) != want {
			t.Errorf("split color %d: new rank %d is old rank %v, want %d", color, r, b, want)
		}
	}
	// A color-less member gets no communicator.
	none, err := w.Split(ctx, map[bool]int{true: -1, false: 0}[me == 0], 0)
	if err != nil {
		t.Fatal(err)
	}
	if (none == nil) != (me == 0) {
		t.Errorf("split with negative color on rank 0 only: got %v", none)
	}
	if none != nil {
		if none.Size() != n-1 {
			t.Errorf("split: size %d, want %d", none.Size(), n-1)
		}
		if err := none.Free(); err != nil {
			t.Error(err)
		}
	}

	dup, err := w.Dup(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if dup.Rank() != me || dup.Size() != n {
		t.Errorf("dup: rank %d size %d", dup.Rank(), dup.Size())
	}
	if err := dup.Barrier(ctx); err != nil {
		t.Fatal(err)
	}
	for _, c := range []*Comm{sub, dup} {
		if err := c.Free(); err != nil {
			t.Error(err)
		}
	}
	if err := sub.Barrier(ctx); err == nil {
		t.Error("barrier on a freed communicator succeeded")
	}
}

// TestTimeout: the last rank sleeps past the others' deadline before a
// barrier. The others must get an error wrapping context.DeadlineExceeded
// and ErrAbandoned within the deadline, later calls must fail at once, and
// Finalize must refuse to run (MPI_Finalize could hang on the abandoned
// barrier). The children therefore cannot finalize: they end with
// ranktest.ExitWithVerdict.
func TestTimeout(t *testing.T) {
	dir, under := ranktest.UnderMPIWithVerdicts(t, np)
	if !under {
		return
	}
	if err := Init(); err != nil {
		t.Fatal(err)
	}
	w := World()
	ranktest.ExitWithVerdict(t, dir, w.Rank(), w.Size(), timeoutRank(w))
}

func timeoutRank(w *Comm) error {
	const deadline = time.Second
	ctx := context.Background()
	if err := w.Barrier(ctx); err != nil { // all started
		return err
	}
	if w.Rank() == w.Size()-1 {
		time.Sleep(3 * deadline)
		// The others have gone: this one times out too.
		tctx, cancel := context.WithTimeout(ctx, deadline)
		defer cancel()
		if err := w.Barrier(tctx); err == nil {
			return nil // the abandoned barriers may complete: fine
		} else if !errors.Is(err, ErrAbandoned) {
			return fmt.Errorf("late rank: got %v, want an error wrapping ErrAbandoned", err)
		}
		return nil
	}
	tctx, cancel := context.WithTimeout(ctx, deadline)
	defer cancel()
	start := time.Now()
	err := w.Barrier(tctx)
	took := time.Since(start)
	if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, ErrAbandoned) {
		return fmt.Errorf("barrier: got %v, want an error wrapping context.DeadlineExceeded and ErrAbandoned", err)
	}
	if took > deadline+500*time.Millisecond {
		return fmt.Errorf("barrier returned %v after its %v deadline", took-deadline, deadline)
	}
	start = time.Now()
	if _, err := w.Allgather(context.Background(), []byte{1}); !errors.Is(err, ErrAbandoned) {
		return fmt.Errorf("allgather after the timeout: got %v, want ErrAbandoned", err)
	}
	if err := Finalize(); !errors.Is(err, ErrAbandoned) {
		return fmt.Errorf("finalize after the timeout: got %v, want ErrAbandoned", err)
	}
	// Generous: it only has to be far below the 1 s deadline a real wait
	// would take (loaded CI machines pause for tens of milliseconds).
	if took := time.Since(start); took > 900*time.Millisecond {
		return fmt.Errorf("failing fast took %v", took)
	}
	return nil
}
