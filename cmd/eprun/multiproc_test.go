package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/goep/goep/internal/bench"
)

// TestLaunchedWorld builds eprun and runs bench and check as 3 processes
// under eprun launch (TCP rendezvous): the JSON must parse, record the
// launcher and the a2a transport, and have no wrong row; check must exit 0.
func TestLaunchedWorld(t *testing.T) {
	if testing.Short() {
		t.Skip("builds eprun and starts processes; skipped with -short")
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "eprun")
	// Only a hang reaches this (a loaded machine may take a minute or two
	// to build eprun and run its processes), and before go test's own
	// ten-minute timeout, which would say less.
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	if out, err := exec.CommandContext(ctx, "go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	if out, err := exec.CommandContext(ctx, bin, "launch", "--help").CombinedOutput(); err != nil || !strings.Contains(string(out), "eprun launch") {
		t.Skipf("eprun has no launch subcommand yet (launcher.Spawn / cmd/eprun/launch.go): %v: %s", err, strings.TrimSpace(string(out)))
	}
	// Keep the children out of the test's own launcher environment.
	env := []string{}
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		switch k {
		case "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GOEP_MASTER_ADDR", "GOEP_MASTER_PORT":
			continue
		}
		if strings.HasPrefix(k, "OMPI_COMM_WORLD_") || strings.HasPrefix(k, "PMI_") || strings.HasPrefix(k, "SLURM_") {
			continue
		}
		env = append(env, kv)
	}
	launch := func(args ...string) (string, error) {
		cmd := exec.CommandContext(ctx, bin, append([]string{"launch", "-n", "3", "--", bin}, args...)...)
		cmd.Env = env
		out, err := cmd.CombinedOutput()
		return string(out), err
	}

	js := filepath.Join(dir, "out.json")
	out, err := launch("bench", "tiny", "-q", "--json", js)
	if err != nil {
		t.Fatalf("eprun launch -n 3 -- eprun bench tiny: %v\n%s", err, out)
	}
	rec := readRecord(t, js)
	if rec.Config.Ranks != 3 || rec.Processes != 3 || rec.Launcher != "torchrun" || rec.Timing != bench.TimingRankMax || rec.BaselineA2ATransport != "tcp" {
		t.Errorf("ranks %d, processes %d, launcher %q, timing %q, a2a transport %q; want 3, 3, torchrun, rank_max, tcp",
			rec.Config.Ranks, rec.Processes, rec.Launcher, rec.Timing, rec.BaselineA2ATransport)
	}
	if rec.Wrong != 0 || rec.CheckedRows == 0 || rec.Error != "" || len(rec.Rows) != len(bench.AllCalls) {
		t.Errorf("%d rows, %d of %d wrong, error %q", len(rec.Rows), rec.Wrong, rec.CheckedRows, rec.Error)
	}
	for _, r := range rec.Rows {
		if len(r.RecvRows) != 3 || r.A2A == nil || r.A2ACheckedRows == 0 {
			t.Errorf("row %s: recv rows %v, a2a %v, %d a2a rows checked", r.Call, r.RecvRows, r.A2A, r.A2ACheckedRows)
		}
	}
	if n := strings.Count(out, "# check: OK"); n != 1 {
		t.Errorf("%d tables printed, want 1 (rank 0's):\n%s", n, out)
	}
	// Three ranks on this node share its CPUs (shareCPUs).
	if want := max(1, runtime.GOMAXPROCS(0)/3); os.Getenv("GOMAXPROCS") == "" && rec.Env.GOMAXPROCS != want {
		t.Errorf("rank 0 ran with GOMAXPROCS %d, want %d (%d CPUs shared by 3 ranks)", rec.Env.GOMAXPROCS, want, runtime.GOMAXPROCS(0))
	}

	out, err = launch("check", "tiny", "-q")
	if err != nil {
		t.Fatalf("eprun launch -n 3 -- eprun check tiny: %v\n%s", err, out)
	}
	if strings.Count(out, "# check: OK") != 1 {
		t.Errorf("check output:\n%s", out)
	}

	// fp8 across processes: the fp8 rows, their scales and the bf16
	// combines, goep's and the a2a baseline's over TCP, all check.
	js8 := filepath.Join(dir, "fp8.json")
	out, err = launch("bench", "tiny", "-q", "--dtype", "fp8", "--hidden", "128", "--iters", "2", "--json", js8)
	if err != nil {
		t.Fatalf("eprun launch -n 3 -- eprun bench tiny --dtype fp8: %v\n%s", err, out)
	}
	rec = readRecord(t, js8)
	if rec.Wrong != 0 || rec.CheckedRows == 0 || rec.Error != "" || len(rec.Rows) != len(bench.AllCalls) {
		t.Errorf("fp8: %d rows, %d of %d wrong, error %q", len(rec.Rows), rec.Wrong, rec.CheckedRows, rec.Error)
	}
	for _, r := range rec.Rows {
		if r.CaseDType != "fp8" || r.A2A == nil || r.A2ACheckedRows == 0 {
			t.Errorf("fp8 row %s: case dtype %q, a2a %v, %d a2a rows checked", r.Call, r.CaseDType, r.A2A, r.A2ACheckedRows)
		}
	}

	// A --ranks that is not the number of processes is refused on every rank.
	out, err = launch("check", "tiny", "-q", "--ranks", "4")
	if err == nil || !strings.Contains(out, "--ranks 4, but torchrun started 3 processes") {
		t.Errorf("--ranks 4 under 3 processes: %v\n%s", err, out)
	}
}
