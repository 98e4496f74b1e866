//go:build mpi

package bench

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/goep/goep/device"
)

// TestCMPIDispatch builds scripts/a2a_mpi.c, the hand-written C MPI
// dispatch the a2a baseline is measured against, and runs it under mpirun
// in 4 processes at two sizes: it must check every row and pass, and its
// counts of received and permuted rows must be those of eprun's routing
// for the same seed (World's layout), so that it runs the same shape as
// eprun bench. Run with --corrupt, its check must fail.
func TestCMPIDispatch(t *testing.T) {
	mpicc, err := exec.LookPath("mpicc")
	if err != nil {
		t.Skipf("mpicc not found (apt-get install libopenmpi-dev): %v", err)
	}
	mpirun, err := exec.LookPath("mpirun")
	if err != nil {
		t.Skipf("mpirun not found (apt-get install openmpi-bin): %v", err)
	}
	_, file, _, _ := runtime.Caller(0)
	src := filepath.Join(filepath.Dir(file), "..", "..", "scripts", "a2a_mpi.c")
	bin := filepath.Join(t.TempDir(), "a2a_mpi")
	if out, err := exec.CommandContext(t.Context(), mpicc, "-O2", "-Wall", "-Werror", "-o", bin, src).CombinedOutput(); err != nil {
		t.Fatalf("mpicc %s: %v\n%s", src, err, out)
	}
	const np, experts, topk, hidden = 4, 16, 4, 256
	run := func(extra ...string) (string, error) {
		args := append([]string{"--allow-run-as-root", "--oversubscribe", "-np", fmt.Sprint(np), bin,
			"--tokens", "37,64", "--hidden", fmt.Sprint(hidden), "--experts", fmt.Sprint(experts), "--topk", fmt.Sprint(topk),
			"--iters", "2", "--warmup", "1", "--seed", "5", "--counts"}, extra...)
		cmd := exec.CommandContext(t.Context(), mpirun, args...)
		cmd.Env = append(os.Environ(), "OMPI_ALLOW_RUN_AS_ROOT=1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1", "OMPI_MCA_rmaps_base_oversubscribe=1")
		for _, kv := range []string{"OMPI_MCA_btl=self,vader", "OMPI_MCA_btl_vader_single_copy_mechanism=none", "OMPI_MCA_pml=ob1"} {
			if k, _, _ := strings.Cut(kv, "="); os.Getenv(k) == "" {
				cmd.Env = append(cmd.Env, kv)
			}
		}
		cmd.WaitDelay = 5 * time.Second
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	out, err := run()
	if err != nil {
		t.Fatalf("a2a_mpi: %v\n%s", err, out)
	}
	if !strings.Contains(out, "# check: OK") {
		t.Errorf("a2a_mpi: no check line saying OK:\n%s", out)
	}
	for _, tokens := range []int{37, 64} {
		w := NewWorld(5, np, np, experts, topk, hidden, device.BF16, []int{tokens, tokens, tokens, tokens})
		m := w.routing()
		for r := range np {
			lay := m.Layout(r)
			p := 0
			for _, n := range lay.TokensPerExpert {
				p += n
			}
			want := fmt.Sprintf("# rank %d tokens %d recv %d permuted %d\n", r, tokens, lay.RecvCount, p)
			if !strings.Contains(out, want) {
				t.Errorf("a2a_mpi: no line %q: its routing is not eprun's\n%s", strings.TrimSpace(want), out)
			}
		}
	}
	if out, err := run("--corrupt"); err == nil || !strings.Contains(out, "# check: FAILED") {
		t.Errorf("a2a_mpi --corrupt: %v, want exit 1 and a failed check:\n%s", err, out)
	}
}
