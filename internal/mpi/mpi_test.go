//go:build mpi

package mpi

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Multi-process tests re-execute this test binary under mpirun: the parent
// (no OMPI_COMM_WORLD_SIZE in its environment) starts mpirun and checks
// its exit status; the children, one per rank, do the checks.

const np = 4

// underMPIRun reports whether this process was started by mpirun.
func underMPIRun() bool {
	_, ok := os.LookupEnv("OMPI_COMM_WORLD_SIZE")
	return ok
}

// mpirunEnv is the environment of mpirun and its children: root is allowed
// (CI containers run as root), oversubscription too (np exceeds the cores),
// and, unless the caller set them, the container-friendly MCA settings of
// scripts/test.sh: shared memory and loopback only (no network probing, no
// InfiniBand warnings), and no single-copy (CMA) transfers, which need
// ptrace rights a container usually lacks.
func mpirunEnv(extra ...string) []string {
	env := append(os.Environ(),
		"OMPI_ALLOW_RUN_AS_ROOT=1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1",
		"OMPI_MCA_rmaps_base_oversubscribe=1")
	for _, kv := range []string{
		"OMPI_MCA_btl=self,vader",
		"OMPI_MCA_btl_vader_single_copy_mechanism=none",
		"OMPI_MCA_pml=ob1",
	} {
		k, _, _ := strings.Cut(kv, "=")
		if _, ok := os.LookupEnv(k); !ok {
			env = append(env, kv)
		}
	}
	return append(env, extra...)
}

// mpirun runs test name of this binary in np processes under mpirun and
// returns its combined output and error (nil on exit status 0).
func mpirun(t *testing.T, name string, extraEnv ...string) ([]byte, error) {
	t.Helper()
	bin, err := exec.LookPath("mpirun")
	if err != nil {
		t.Skipf("mpirun not found (apt-get install openmpi-bin): %v", err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	args := []string{"--allow-run-as-root", "--oversubscribe", "-np", strconv.Itoa(np)}
	for _, kv := range extraEnv {
		k, _, _ := strings.Cut(kv, "=")
		args = append(args, "-x", k)
	}
	args = append(args, os.Args[0], "-test.run", "^"+name+"$", "-test.timeout", "50s", "-test.v")
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = mpirunEnv(extraEnv...)
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		t.Fatalf("mpirun %s: no result within the deadline (%v); output:\n%s", name, ctx.Err(), out)
	}
	return out, err
}

func TestCollectives(t *testing.T) {
	if !underMPIRun() {
		out, err := mpirun(t, "TestCollectives")
		if err != nil {
			t.Fatalf("mpirun: %v; output:\n%s", err, out)
		}
		t.Logf("mpirun output:\n%s", out)
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

	// payload is rank r's data for peer p in round i: it names all three.
	payload := func(i, r, p int) []byte {
		l := (r*3 + p + i) % 5 // 0 included
		b := make([]byte, l)
		for j := range b {
			b[j] = byte(100*i + 10*r + p + j)
		}
		return b
	}

	for i := range 3 {
		all, err := w.Allgather(ctx, payload(i, me, 0))
		if err != nil {
			t.Fatal(err)
		}
		for r := range n {
			if want := payload(i, r, 0); !bytes.Equal(all[r], want) {
				t.Errorf("allgather round %d: from rank %d got %v, want %v", i, r, all[r], want)
			}
		}

		send := make([][]byte, n)
		for p := range send {
			send[p] = payload(i, me, p)
		}
		recv, err := w.Alltoallv(ctx, send)
		if err != nil {
			t.Fatal(err)
		}
		for r := range n {
			if want := payload(i, r, me); !bytes.Equal(recv[r], want) {
				t.Errorf("alltoallv round %d: from rank %d got %v, want %v", i, r, recv[r], want)
			}
		}

		root := i % n
		var data []byte
		if me == root {
			data = payload(i, root, 7)
		}
		got, err := w.Bcast(ctx, root, data)
		if err != nil {
			t.Fatal(err)
		}
		if want := payload(i, root, 7); !bytes.Equal(got, want) {
			t.Errorf("bcast from %d: got %v, want %v", root, got, want)
		}

		if err := w.Barrier(ctx); err != nil {
			t.Fatal(err)
		}
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
// barrier). The children therefore cannot finalize: each writes its verdict
// to a file, waits until every rank has written one, and leaves with
// os.Exit(0) without MPI_Finalize. mpirun reports that as an abnormal end,
// so the parent judges by the files, not by mpirun's exit status.
func TestTimeout(t *testing.T) {
	if !underMPIRun() {
		dir := t.TempDir()
		out, err := mpirun(t, "TestTimeout", "GOEPTEST_MPI_DIR="+dir)
		t.Logf("mpirun: %v; output:\n%s", err, out)
		for r := range np {
			b, err := os.ReadFile(filepath.Join(dir, fmt.Sprint(r)))
			if err != nil {
				t.Errorf("rank %d wrote no verdict: %v", r, err)
			} else if string(b) != "ok" {
				t.Errorf("rank %d: %s", r, b)
			}
		}
		return
	}
	dir := os.Getenv("GOEPTEST_MPI_DIR") // set by the parent; not a goep setting
	if dir == "" {
		t.Fatal("GOEPTEST_MPI_DIR not set")
	}
	if err := Init(); err != nil {
		t.Fatal(err)
	}
	w := World()
	verdict := verdictOf(func() error { return timeoutRank(w) })
	path := filepath.Join(dir, fmt.Sprint(w.Rank()))
	if err := os.WriteFile(path+".tmp", []byte(verdict), 0o644); err == nil {
		err = os.Rename(path+".tmp", path)
	}
	// Wait for the others' verdicts: the first process to exit makes
	// mpirun kill the rest.
	for end := time.Now().Add(20 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		written := 0
		for r := range w.Size() {
			if _, err := os.Stat(filepath.Join(dir, fmt.Sprint(r))); err == nil {
				written++
			}
		}
		if written == w.Size() {
			break
		}
	}
	os.Exit(0)
}

func verdictOf(f func() error) string {
	if err := f(); err != nil {
		return err.Error()
	}
	return "ok"
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
