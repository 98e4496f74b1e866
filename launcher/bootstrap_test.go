package launcher

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/goep/goep/comm"
)

func init() { helperActions["bootstrap"] = bootstrapHelper }

// bootstrapHelper is a rank that bootstraps, all-gathers "rank:GOEP_DEVICE"
// and prints what it got.
func bootstrapHelper(rank int) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	g, env, err := Bootstrap(ctx)
	if err != nil {
		fmt.Println("bootstrap:", err)
		os.Exit(1)
	}
	defer g.Close()
	all, err := g.AllGather(ctx, fmt.Appendf(nil, "%d:%s", g.Rank(), os.Getenv("GOEP_DEVICE")))
	if err != nil {
		fmt.Println("allgather:", err)
		os.Exit(1)
	}
	if err := g.Barrier(ctx); err != nil {
		fmt.Println("barrier:", err)
		os.Exit(1)
	}
	fmt.Printf("%v group %d of %d gathered %s\n", env, g.Rank(), g.Size(), strings.Join(strings.Fields(fmt.Sprintf("%s", all)), " "))
}

// TestBootstrapSpawned runs 3 processes under Spawn (2 domains would need
// an even count, so one domain) that each Bootstrap over TCP and
// all-gather, and a 4-rank job in 2 domains.
func TestBootstrapSpawned(t *testing.T) {
	for _, tc := range []struct{ n, domains int }{{3, 1}, {4, 2}} {
		t.Run(fmt.Sprintf("n=%d/domains=%d", tc.n, tc.domains), func(t *testing.T) {
			err, stdout, stderr, _ := spawnHelper(t, t.Context(), SpawnConfig{N: tc.n, Domains: tc.domains, Timeout: time.Minute}, "*:bootstrap")
			if err != nil {
				t.Fatalf("%v\nstdout:\n%s\nstderr:\n%s", err, stdout, stderr)
			}
			per := tc.n / tc.domains
			var want []string
			for r := range tc.n {
				want = append(want, fmt.Sprintf("%d:%d", r, r%per))
			}
			for r := range tc.n {
				line := fmt.Sprintf("[rank %d] torchrun rank %d of %d (local %d of %d) group %d of %d gathered [%s]\n", r, r, tc.n, r%per, per, r, tc.n, strings.Join(want, " "))
				if !strings.Contains(stdout, line) {
					t.Errorf("stdout lacks %q:\n%s\nstderr:\n%s", line, stdout, stderr)
				}
			}
		})
	}
}

// launcherVars are every variable Detect and Bootstrap read.
var launcherVars = []string{
	"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GOEP_MASTER_ADDR", "GOEP_MASTER_PORT", "GOEP_DEVICE",
	"GOEP_RENDEZVOUS_TIMEOUT", "GOEP_WORLD_SECRET", "GOEP_LAUNCHER_FD", ompiJobKey,
	"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE",
	"PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS", "PMI_LOCAL_RANK", "PMI_LOCAL_SIZE",
	"SLURM_PROCID", "SLURM_NTASKS", "SLURM_NPROCS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE",
	"SLURM_STEP_TASKS_PER_NODE", "SLURM_NODEID", "SLURM_STEP_NODEID",
}

// setLauncherEnv clears the launcher variables for the test and sets env.
func setLauncherEnv(t *testing.T, env map[string]string) {
	t.Helper()
	for _, k := range launcherVars {
		t.Setenv(k, "") // restored after the test
		os.Unsetenv(k)
	}
	for k, v := range env {
		t.Setenv(k, v)
	}
}

// with returns a copy of a with the pairs kv added.
func with(a map[string]string, kv ...string) map[string]string {
	m := map[string]string{}
	for k, v := range a {
		m[k] = v
	}
	for i := 0; i < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return m
}

func freePortString(t *testing.T) string {
	t.Helper()
	p, err := FreePort()
	if err != nil {
		t.Fatal(err)
	}
	return strconv.Itoa(p)
}

// TestBootstrap runs Bootstrap in this process for one-rank jobs of every
// kind; the groups they pick must work.
func TestBootstrap(t *testing.T) {
	slurm := map[string]string{"SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_LOCALID": "0", "SLURM_TASKS_PER_NODE": "1"}
	for _, tc := range []struct {
		name   string
		env    map[string]string
		kind   string
		device string // GOEP_DEVICE afterwards
	}{
		{"single", nil, KindSingle, "0"},
		{"single keeps GOEP_DEVICE", map[string]string{"GOEP_DEVICE": "3"}, KindSingle, "3"},
		{"torchrun", map[string]string{"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1", "GOEP_MASTER_ADDR": "127.0.0.1", "GOEP_MASTER_PORT": "*"}, KindTorchrun, "0"},
		{"slurm over tcp", with(slurm, "GOEP_MASTER_ADDR", "127.0.0.1", "GOEP_MASTER_PORT", "*"), KindSlurm, "0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := with(tc.env)
			if env["GOEP_MASTER_PORT"] == "*" {
				env["GOEP_MASTER_PORT"] = freePortString(t)
			}
			setLauncherEnv(t, env)
			g, e, err := Bootstrap(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			defer g.Close()
			if e.Kind != tc.kind || g.Rank() != 0 || g.Size() != 1 {
				t.Errorf("env %v, group rank %d of %d; want %s, 0 of 1", e, g.Rank(), g.Size(), tc.kind)
			}
			all, err := g.AllGather(t.Context(), []byte("x"))
			if err != nil || len(all) != 1 || string(all[0]) != "x" {
				t.Errorf("AllGather: %q, %v", all, err)
			}
			if d := os.Getenv("GOEP_DEVICE"); d != tc.device {
				t.Errorf("GOEP_DEVICE=%q, want %q", d, tc.device)
			}
		})
	}
}

func TestBootstrapErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  map[string]string
		want []string
	}{
		{"bad GOEP_DEVICE", map[string]string{"GOEP_DEVICE": "gpu0"}, []string{`GOEP_DEVICE="gpu0"`}},
		{"bad launcher env", map[string]string{"RANK": "1", "WORLD_SIZE": "1"}, []string{"RANK=1 is not below WORLD_SIZE=1"}},
		{"slurm without master", map[string]string{"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_LOCALID": "0", "SLURM_NTASKS_PER_NODE": "2"},
			[]string{"srun", "GOEP_MASTER_ADDR"}},
		{"slurm without port", map[string]string{"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_LOCALID": "0", "SLURM_NTASKS_PER_NODE": "2", "GOEP_MASTER_ADDR": "127.0.0.1"},
			[]string{"GOEP_MASTER_PORT is not set"}},
		{"torchrun without master", map[string]string{"RANK": "0", "WORLD_SIZE": "2"}, []string{"GOEP_MASTER_ADDR is not set"}},
		{"bad rendezvous timeout", map[string]string{"GOEP_RENDEZVOUS_TIMEOUT": "soon"}, []string{`GOEP_RENDEZVOUS_TIMEOUT="soon"`, "30s"}},
		{"negative rendezvous timeout", map[string]string{"RANK": "0", "WORLD_SIZE": "2", "GOEP_RENDEZVOUS_TIMEOUT": "-1s"},
			[]string{`GOEP_RENDEZVOUS_TIMEOUT="-1s"`}},
		{"torchrun without secret", map[string]string{"RANK": "0", "WORLD_SIZE": "2", "GOEP_MASTER_ADDR": "127.0.0.1", "GOEP_MASTER_PORT": "29500"},
			[]string{"GOEP_WORLD_SECRET is not set"}},
		{"short secret", map[string]string{"RANK": "0", "WORLD_SIZE": "2", "GOEP_MASTER_ADDR": "127.0.0.1", "GOEP_MASTER_PORT": "29500", "GOEP_WORLD_SECRET": "short"},
			[]string{"GOEP_WORLD_SECRET of 5 bytes"}},
		{"slurm without secret", map[string]string{"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_LOCALID": "0", "SLURM_NTASKS_PER_NODE": "2", "GOEP_MASTER_ADDR": "127.0.0.1", "GOEP_MASTER_PORT": "29500"},
			[]string{"GOEP_WORLD_SECRET is not set", "-x GOEP_WORLD_SECRET"}},
		{"launcher fd not a number", map[string]string{"GOEP_LAUNCHER_FD": "pipe"}, []string{`GOEP_LAUNCHER_FD="pipe"`}},
		{"launcher fd stdout", map[string]string{"GOEP_LAUNCHER_FD": "1"}, []string{`GOEP_LAUNCHER_FD="1"`}},
		{"launcher fd closed", map[string]string{"GOEP_LAUNCHER_FD": "999"}, []string{"GOEP_LAUNCHER_FD=999: not the pipe from eprun launch"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			setLauncherEnv(t, tc.env)
			g, _, err := Bootstrap(t.Context())
			if err == nil {
				g.Close()
				t.Fatal("no error")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
}

// TestBootstrapTimeout checks that a rank whose peers never come returns
// by the context's deadline.
func TestBootstrapTimeout(t *testing.T) {
	setLauncherEnv(t, map[string]string{"RANK": "0", "WORLD_SIZE": "2", "GOEP_MASTER_ADDR": "127.0.0.1", "GOEP_MASTER_PORT": freePortString(t),
		"GOEP_WORLD_SECRET": comm.NewWorldSecret()})
	ctx, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
	defer cancel()
	start := time.Now()
	g, _, err := Bootstrap(ctx)
	if err == nil {
		g.Close()
		t.Fatal("no error")
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("took %v", took)
	}
	if !strings.Contains(err.Error(), "torchrun rank 0 of 2") {
		t.Errorf("error %q does not say who timed out", err)
	}
}

// TestBootstrapRendezvousTimeout checks that a rank whose rank 0 never
// comes, called with a context without a deadline, returns after
// GOEP_RENDEZVOUS_TIMEOUT with a timeout naming rank 0 and the variable.
func TestBootstrapRendezvousTimeout(t *testing.T) {
	setLauncherEnv(t, map[string]string{"RANK": "1", "WORLD_SIZE": "2", "GOEP_MASTER_ADDR": "127.0.0.1",
		"GOEP_MASTER_PORT": freePortString(t), "GOEP_RENDEZVOUS_TIMEOUT": "300ms", "GOEP_WORLD_SECRET": comm.NewWorldSecret()})
	start := time.Now()
	g, _, err := Bootstrap(context.Background())
	if err == nil {
		g.Close()
		t.Fatal("no error")
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("took %v", took)
	}
	var te *comm.TimeoutError
	if !errors.As(err, &te) || !slices.Equal(te.Missing, []int{0}) {
		t.Errorf("error %q: want a *comm.TimeoutError naming rank 0", err)
	}
	if !strings.Contains(err.Error(), "GOEP_RENDEZVOUS_TIMEOUT=300ms") {
		t.Errorf("error %q does not name the bound", err)
	}
}

// TestWorldSecret: the secret of a TCP world that a launcher other than
// eprun launch started: GOEP_WORLD_SECRET, else under Open MPI mpirun's job
// key, else (more than one rank) an error.
func TestWorldSecret(t *testing.T) {
	const key = "81a4acabd3e03489-50a35c256d9e266d"
	ompi := Env{KindOpenMPI, 0, 4, 0, 4}
	for _, tc := range []struct {
		name string
		env  Env
		vars map[string]string
		want string // "": none; "err: ..." an error containing it
	}{
		{"set", ompi, map[string]string{"GOEP_WORLD_SECRET": "0123456789abcdef", ompiJobKey: key}, "0123456789abcdef"},
		{"ompi job key", ompi, map[string]string{ompiJobKey: key}, "goep/ompi/" + key},
		{"job key outside ompi", Env{KindSlurm, 0, 4, 0, 4}, map[string]string{ompiJobKey: key}, "err: GOEP_WORLD_SECRET is not set"},
		{"short job key", ompi, map[string]string{ompiJobKey: "abc"}, "err: GOEP_WORLD_SECRET is not set"},
		{"none", ompi, nil, "err: GOEP_WORLD_SECRET is not set"},
		{"none, one rank", Env{KindSlurm, 0, 1, 0, 1}, nil, ""},
		{"short", ompi, map[string]string{"GOEP_WORLD_SECRET": "abc", ompiJobKey: key}, "err: GOEP_WORLD_SECRET of 3 bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := worldSecret(tc.env, func(k string) (string, bool) { v, ok := tc.vars[k]; return v, ok })
			if w, ok := strings.CutPrefix(tc.want, "err: "); ok {
				if err == nil || !strings.Contains(err.Error(), w) {
					t.Errorf("%q, %v; want an error containing %q", got, err, w)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Errorf("%q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

// TestBindDeviceWithoutNVML checks that a machine without NVML gets
// GOEP_DEVICE and a debug line, not an error.
func TestBindDeviceWithoutNVML(t *testing.T) {
	if _, err := gpuCPUs(0); err == nil {
		t.Skip("NVML answers on this machine: binding is tested by TestBindDeviceNVML")
	}
	setLauncherEnv(t, nil)
	core, logs := observer.New(zapcore.DebugLevel)
	if err := bindDevice(Env{KindTorchrun, 5, 8, 1, 4}, zap.New(core)); err != nil {
		t.Fatal(err)
	}
	if d := os.Getenv("GOEP_DEVICE"); d != "1" {
		t.Errorf("GOEP_DEVICE=%q, want the local rank 1", d)
	}
	for _, e := range logs.All() {
		if e.Level > zapcore.DebugLevel {
			t.Errorf("logged above debug: %s %v", e.Message, e.Context)
		}
	}
	if logs.FilterMessage("no CPU binding").Len() != 1 {
		t.Errorf("no debug line says why there is no binding: %v", logs.All())
	}
}

func TestGPUCPUs(t *testing.T) {
	set, err := gpuCPUs(0)
	if err != nil {
		t.Skipf("no NVML here: %v", err)
	}
	t.Logf("GPU 0's CPUs: %v", set)
}
