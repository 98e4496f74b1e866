package ranktest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The MPI tests of comm and internal/mpi run their ranks as processes: the
// test binary re-executes itself under mpirun. The parent (no
// OMPI_COMM_WORLD_SIZE in its environment) starts mpirun and judges the
// result; the children, one per rank, do the checks.

// InMPI reports whether this process is one of mpirun's ranks.
func InMPI() bool {
	_, ok := os.LookupEnv("OMPI_COMM_WORLD_SIZE")
	return ok
}

// mpiTimeout bounds a whole mpirun. The children's -test.timeout is ten
// seconds shorter, so that a hung rank prints its stacks before mpirun is
// killed.
const mpiTimeout = 60 * time.Second

// MPIRun runs the test t (a top-level test) of this binary in np processes
// under mpirun and returns mpirun's combined output and error (nil on exit
// status 0). extraEnv (KEY=value) reaches every rank. t is skipped when
// mpirun is not installed.
//
// Root and oversubscription are allowed (CI containers run as root, with
// fewer cores than ranks) and, unless the caller's environment sets them,
// the MCA settings of scripts/test.sh keep Open MPI to shared memory and
// loopback (no network or InfiniBand probing) without single-copy (CMA)
// transfers, whose ptrace rights containers usually lack.
func MPIRun(t *testing.T, np int, extraEnv ...string) ([]byte, error) {
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
	args := []string{"--allow-run-as-root", "--oversubscribe", "-np", strconv.Itoa(np)}
	for _, kv := range extraEnv {
		k, _, _ := strings.Cut(kv, "=")
		args = append(args, "-x", k)
	}
	args = append(args, os.Args[0], "-test.run", "^"+t.Name()+"$",
		"-test.timeout", (mpiTimeout - 10*time.Second).String(), "-test.v")
	ctx, cancel := context.WithTimeout(t.Context(), mpiTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(env, extraEnv...)
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		t.Fatalf("mpirun %s: no result within the deadline (%v); output:\n%s", t.Name(), ctx.Err(), out)
	}
	return out, err
}

// UnderMPI reports whether this process is one of mpirun's ranks, the
// place for the test's checks. In the parent it first runs the test under
// mpirun in np processes and fails t unless mpirun exits with status 0.
func UnderMPI(t *testing.T, np int) bool {
	t.Helper()
	if InMPI() {
		return true
	}
	out, err := MPIRun(t, np)
	if err != nil {
		t.Fatalf("mpirun: %v; output:\n%s", err, out)
	}
	t.Logf("mpirun output:\n%s", out)
	return false
}

// Verdict files serve the tests whose ranks cannot end cleanly: a rank
// that abandoned a collective must not call MPI_Finalize (it could hang),
// so it leaves with os.Exit(0), which mpirun reports as an abnormal end.
// Each rank writes its verdict ("ok" or its error) to a file of a
// directory the parent chose, and the parent judges by the files.

// verdictDirEnv names the parent's directory for the children; it is the
// tests' own variable, not a goep setting.
const verdictDirEnv = "GOEPTEST_MPI_DIR"

// verdictWait bounds a rank's wait for the others' verdicts, well within
// mpirun's minute.
const verdictWait = 40 * time.Second

// UnderMPIWithVerdicts is UnderMPI for a test whose ranks end with
// ExitWithVerdict: in the parent it runs the test under mpirun in np
// processes and fails t for every rank whose verdict is missing or not
// "ok", whatever mpirun's exit status; in a child it returns the verdict
// directory.
func UnderMPIWithVerdicts(t *testing.T, np int) (dir string, under bool) {
	t.Helper()
	if InMPI() {
		dir := os.Getenv(verdictDirEnv)
		if dir == "" {
			t.Fatal(verdictDirEnv + " not set")
		}
		return dir, true
	}
	dir = t.TempDir()
	out, err := MPIRun(t, np, verdictDirEnv+"="+dir)
	t.Logf("mpirun: %v; output:\n%s", err, out)
	for r := range np {
		b, err := os.ReadFile(filepath.Join(dir, fmt.Sprint(r)))
		if err != nil {
			t.Errorf("rank %d wrote no verdict: %v", r, err)
		} else if string(b) != "ok" {
			t.Errorf("rank %d: %s", r, b)
		}
	}
	return dir, false
}

// WaitVerdicts waits until the given ranks have written their verdicts to
// dir, at most verdictWait, and reports whether they have.
func WaitVerdicts(dir string, ranks ...int) bool {
	for end := time.Now().Add(verdictWait); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
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

// ExitWithVerdict writes rank's verdict on err (nil is "ok") to dir, waits
// for the verdicts of all size ranks (the first process to exit makes
// mpirun end the others) and exits the process with status 0, without
// MPI_Finalize.
func ExitWithVerdict(t *testing.T, dir string, rank, size int, err error) {
	t.Helper()
	verdict := "ok"
	if err != nil {
		verdict = err.Error()
	}
	// Written whole, then renamed: a rank polling the directory never
	// reads half a verdict.
	path := filepath.Join(dir, fmt.Sprint(rank))
	if err := os.WriteFile(path+".tmp", []byte(verdict), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path+".tmp", path); err != nil {
		t.Fatal(err)
	}
	all := make([]int, size)
	for r := range all {
		all[r] = r
	}
	WaitVerdicts(dir, all...)
	os.Exit(0)
}
