//go:build mpi

package bench

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/goep/goep/comm"
	"github.com/goep/goep/device"
	"github.com/goep/goep/internal/ranktest"
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

// TestA2AOverMPI runs the bench as 4 processes under mpirun on comm.NewMPI:
// the a2a baseline's exchanges are then MPI_Ialltoallv on its own buffers
// (comm.AllToAllv), and every row of every call, goep's and the
// baseline's, must check, with the baseline's transport recorded as mpi.
func TestA2AOverMPI(t *testing.T) {
	if !ranktest.UnderMPI(t, 4) {
		return
	}
	ctx, cancel := context.WithTimeout(t.Context(), 40*time.Second)
	defer cancel()
	g, err := comm.NewMPI(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	c := Defaults()
	c.Ranks, c.Experts, c.TopK, c.Hidden, c.Tokens, c.Iters, c.Warmup = 4, 8, Ints{3}, Ints{32}, Ints{0, 24}, 2, 1
	c.Calls = append(c.Calls, CallDispatchCombine)
	res, err := RunRank(ctx, c, g, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if res.A2ATransport != "mpi" {
		t.Errorf("a2a transport %q, want mpi", res.A2ATransport)
	}
	if len(res.Rows) != len(c.Cases())*len(c.Calls) {
		t.Fatalf("%d rows, want %d", len(res.Rows), len(c.Cases())*len(c.Calls))
	}
	for _, r := range res.Rows {
		if r.A2A == nil || r.A2ACheckedRows == 0 && r.Tokens > 0 || r.A2AWrong != 0 || r.Wrong != 0 {
			t.Errorf("%s tokens=%d: a2a %v, %d a2a rows checked, %d wrong; %d of goep's wrong", r.Call, r.Tokens, r.A2A, r.A2ACheckedRows, r.A2AWrong, r.Wrong)
		}
	}
}
