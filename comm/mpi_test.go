//go:build mpi

package comm

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

	"github.com/goep/goep/internal/mpi"
)

// The MPI tests re-execute this test binary under mpirun: the parent (no
// OMPI_COMM_WORLD_SIZE in its environment) starts mpirun and checks the
// result; the children, one per rank, do the checks. (internal/mpi's tests
// do the same; the helper is small enough to repeat.)

const mpiNP = 4

func underMPIRun() bool {
	_, ok := os.LookupEnv("OMPI_COMM_WORLD_SIZE")
	return ok
}

// mpirun runs test name of this binary in mpiNP processes and returns
// mpirun's combined output and error. Root and oversubscription are
// allowed; unless set by the caller, the MCA settings of scripts/test.sh
// keep Open MPI to shared memory and loopback (no network or InfiniBand
// probing) without single-copy CMA transfers (containers often forbid the
// ptrace they need).
func mpirun(t *testing.T, name string, extraEnv ...string) ([]byte, error) {
	t.Helper()
	bin, err := exec.LookPath("mpirun")
	if err != nil {
		t.Skipf("mpirun not found (apt-get install openmpi-bin): %v", err)
	}
	env := append(os.Environ(),
		"OMPI_ALLOW_RUN_AS_ROOT=1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1",
		"OMPI_MCA_rmaps_base_oversubscribe=1")
	for _, kv := range []string{
		"OMPI_MCA_btl=self,vader",
		"OMPI_MCA_btl_vader_single_copy_mechanism=none",
		"OMPI_MCA_pml=ob1",
	} {
		if k, _, _ := strings.Cut(kv, "="); os.Getenv(k) == "" {
			env = append(env, kv)
		}
	}
	args := []string{"--allow-run-as-root", "--oversubscribe", "-np", strconv.Itoa(mpiNP)}
	for _, kv := range extraEnv {
		k, _, _ := strings.Cut(kv, "=")
		args = append(args, "-x", k)
	}
	args = append(args, os.Args[0], "-test.run", "^"+name+"$", "-test.timeout", "50s", "-test.v")
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(env, extraEnv...)
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		t.Fatalf("mpirun %s: no result within the deadline (%v); output:\n%s", name, ctx.Err(), out)
	}
	return out, err
}

func TestMPIGroup(t *testing.T) {
	if !underMPIRun() {
		out, err := mpirun(t, "TestMPIGroup")
		if err != nil {
			t.Fatalf("mpirun: %v; output:\n%s", err, out)
		}
		t.Logf("mpirun output:\n%s", out)
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
	// payload is rank r's data for peer p in round i; lengths differ and
	// include 0.
	payload := func(i, r, p int) []byte {
		b := make([]byte, (r*3+p+i)%5)
		for j := range b {
			b[j] = byte(100*i + 10*r + p + j)
		}
		return b
	}
	for i := range 3 {
		all, err := g.AllGather(ctx, payload(i, me, 0))
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
		recv, err := g.AllToAll(ctx, send)
		if err != nil {
			t.Fatal(err)
		}
		for r := range n {
			if want := payload(i, r, me); !bytes.Equal(recv[r], want) {
				t.Errorf("alltoall round %d: from rank %d got %v, want %v", i, r, recv[r], want)
			}
		}
		root := (i + 1) % n
		got, err := g.Broadcast(ctx, root, payload(i, me, 9))
		if err != nil {
			t.Fatal(err)
		}
		if want := payload(i, root, 9); !bytes.Equal(got, want) {
			t.Errorf("broadcast from %d: got %v, want %v", root, got, want)
		}
		if err := g.Barrier(ctx); err != nil {
			t.Fatal(err)
		}
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
// with os.Exit(0) after writing their verdicts to files; mpirun calls that
// an abnormal end, so the parent judges by the files.
func TestMPITimeout(t *testing.T) {
	if !underMPIRun() {
		dir := t.TempDir()
		out, err := mpirun(t, "TestMPITimeout", "GOEPTEST_MPI_DIR="+dir)
		t.Logf("mpirun: %v; output:\n%s", err, out)
		for r := range mpiNP {
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
	g, err := NewMPI(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	// verdicts waits (at most 40 s, within mpirun's minute) until the
	// given ranks have written their verdicts, and says whether they have.
	verdicts := func(ranks ...int) bool {
		for end := time.Now().Add(40 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
			written := 0
			for _, r := range ranks {
				if _, err := os.Stat(filepath.Join(dir, fmt.Sprint(r))); err == nil {
					written++
				}
			}
			if written == len(ranks) {
				return true
			}
		}
		return false
	}
	verdict := "ok"
	if err := mpiTimeoutRank(g, verdicts); err != nil {
		verdict = err.Error()
	}
	path := filepath.Join(dir, fmt.Sprint(g.Rank()))
	if err := os.WriteFile(path+".tmp", []byte(verdict), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path+".tmp", path); err != nil {
		t.Fatal(err)
	}
	// The first process to exit makes mpirun end the others: wait for
	// every verdict.
	all := make([]int, g.Size())
	for r := range all {
		all[r] = r
	}
	verdicts(all...)
	os.Exit(0)
}

// mpiTimeoutRank is one rank of TestMPITimeout. verdicts waits until the
// given ranks have written their verdicts and says whether they have.
func mpiTimeoutRank(g Group, verdicts func(ranks ...int) bool) error {
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
		if !verdicts(others...) {
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
