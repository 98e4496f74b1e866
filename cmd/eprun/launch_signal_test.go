package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// mainArgsVar, set, makes this test binary run eprun's main with its
// arguments (a JSON array of strings): TestEprunMain, the tests' eprun
// process.
const mainArgsVar = "GOEP_EPRUN_TEST_ARGS"

func encodeArgs(args []string) string {
	b, _ := json.Marshal(args)
	return string(b)
}

// TestEprunMain is eprun itself, for the tests that need it as a process
// of its own (signals): it runs main with the arguments in mainArgsVar.
func TestEprunMain(t *testing.T) {
	args, ok := os.LookupEnv(mainArgsVar)
	if !ok {
		t.Skip("eprun's main for the process tests; runs only as their child")
	}
	var a []string
	if err := json.Unmarshal([]byte(args), &a); err != nil {
		t.Fatalf("%s=%q: %v", mainArgsVar, args, err)
	}
	os.Args = append([]string{"eprun"}, a...)
	main() // exits
}

// eprunProc is an eprun process started by a test, its output collected
// line by line (stdout and stderr together).
type eprunProc struct {
	cmd  *exec.Cmd
	done chan struct{} // closed once the output ended and the process was waited for
	err  error         // Wait's, after done

	mu      sync.Mutex
	lines   []string
	changed chan struct{}
}

// startEprun starts eprun with args (and extra environment variables).
func startEprun(t *testing.T, env []string, args ...string) *eprunProc {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestEprunMain$")
	cmd.Env = append(append(launchTestEnv(), env...), mainArgsVar+"="+encodeArgs(args))
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = pw, pw
	err = cmd.Start()
	pw.Close()
	if err != nil {
		pr.Close()
		t.Fatal(err)
	}
	p := &eprunProc{cmd: cmd, done: make(chan struct{}), changed: make(chan struct{})}
	go func() {
		defer close(p.done)
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			p.mu.Lock()
			p.lines = append(p.lines, sc.Text())
			close(p.changed)
			p.changed = make(chan struct{})
			p.mu.Unlock()
		}
		pr.Close()
		p.err = cmd.Wait()
	}()
	t.Cleanup(func() {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) // nothing, unless a test failed midway
		cmd.Process.Kill()
		<-p.done
	})
	return p
}

// launchTestEnv is this process's environment without any launcher's
// variables.
func launchTestEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		switch k {
		case "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GOEP_MASTER_ADDR", "GOEP_MASTER_PORT",
			"GOEP_WORLD_SECRET", "GOEP_LAUNCHER_FD", mainArgsVar:
			continue
		}
		if strings.HasPrefix(k, "OMPI_") || strings.HasPrefix(k, "PMI_") || strings.HasPrefix(k, "SLURM_") {
			continue
		}
		env = append(env, kv)
	}
	return env
}

// waitLines waits until n lines containing s have come, and fails the test
// if the output ends first or after a minute (only a hang gets there).
func (p *eprunProc) waitLines(t *testing.T, s string, n int) {
	t.Helper()
	timeout := time.After(time.Minute)
	for {
		p.mu.Lock()
		k := 0
		for _, l := range p.lines {
			if strings.Contains(l, s) {
				k++
			}
		}
		changed := p.changed
		p.mu.Unlock()
		if k >= n {
			return
		}
		select {
		case <-changed:
		case <-p.done:
			t.Fatalf("eprun ended with %d lines containing %q, want %d:\n%s", k, s, n, p.output())
		case <-timeout:
			t.Fatalf("%d lines containing %q after a minute, want %d:\n%s", k, s, n, p.output())
		}
	}
}

func (p *eprunProc) output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return strings.Join(p.lines, "\n")
}

// wait waits for the process to end (a hang fails the test after
// limit) and returns how long after since it ended, and its exit code.
func (p *eprunProc) wait(t *testing.T, since time.Time, limit time.Duration) (time.Duration, int) {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(limit):
		t.Fatalf("eprun still running %v later:\n%s", limit, p.output())
	}
	return time.Since(since), p.cmd.ProcessState.ExitCode()
}

// childrenOf lists the pids of pid's children (of all its threads: Spawn
// starts the ranks from a thread of their own).
func childrenOf(t *testing.T, pid int) []int {
	t.Helper()
	tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", pid))
	if err != nil || len(tasks) == 0 {
		t.Skipf("no /proc/%d/task/*/children here: %v", pid, err)
	}
	var out []int
	for _, f := range tasks {
		b, _ := os.ReadFile(f)
		for _, s := range strings.Fields(string(b)) {
			if c, err := strconv.Atoi(s); err == nil {
				out = append(out, c)
			}
		}
	}
	return out
}

// TestLaunchSignal: eprun launch, sent SIGINT or SIGTERM, forwards SIGTERM
// to the ranks and exits within their exit time, or its --grace and a
// little when they ignore SIGTERM (then SIGKILL ends them). The bounds
// (5 s above what it must take) only catch a wait that ignores the signal.
func TestLaunchSignal(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes; skipped with -short")
	}
	if _, err := exec.LookPath("sh"); err != nil {
		t.Skip("no sh:", err)
	}
	for _, tc := range []struct {
		name  string
		sig   syscall.Signal
		trap  bool // the ranks ignore SIGTERM
		grace time.Duration
	}{
		{"SIGINT", syscall.SIGINT, false, 30 * time.Second},
		{"SIGTERM", syscall.SIGTERM, false, 30 * time.Second},
		{"SIGINT, ranks ignore SIGTERM", syscall.SIGINT, true, time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			script := `echo ready; exec sleep 600`
			if tc.trap {
				script = `trap "" TERM; echo ready; exec sleep 600`
			}
			p := startEprun(t, nil, "launch", "-n", "2", "--grace", tc.grace.String(), "--", "sh", "-c", script)
			p.waitLines(t, "] ready", 2)
			start := time.Now()
			if err := p.cmd.Process.Signal(tc.sig); err != nil {
				t.Fatal(err)
			}
			took, code := p.wait(t, start, time.Minute)
			bound := 5 * time.Second
			if tc.trap {
				bound += tc.grace
			}
			if took > bound {
				t.Errorf("eprun launch exited %v after %v, want within %v", took, tc.sig, bound)
			}
			// 1 (the launcher's error: interrupted), or 128 + the
			// signal (eprun stopped by it).
			if code != 1 && code != 128+int(tc.sig) {
				t.Errorf("exit %d, want 1 or %d:\n%s", code, 128+int(tc.sig), p.output())
			}
		})
	}
}

// rankCmd is the command line of ranks that run eprun with args (this
// test binary as eprun, through sh so that each rank gets its own
// mainArgsVar); pre is shell run first.
func rankCmd(pre string, args ...string) []string {
	return []string{"sh", "-c", pre + mainArgsVar + `='` + encodeArgs(args) + `' exec "$0" -test.run='^TestEprunMain$'`, os.Args[0]}
}

// TestLaunchSignalRanks: SIGTERM to every rank of a running benchmark ends
// each within a second (the bound, 5 s, is far above that, and below the
// 10 s that a graceful shutdown waited for its peers before Bootstrap
// aborted the group on the signal). Three trials: the wait depended on
// where each rank was when the signal came.
func TestLaunchSignalRanks(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes; skipped with -short")
	}
	if _, err := exec.LookPath("sh"); err != nil {
		t.Skip("no sh:", err)
	}
	for trial := range 3 {
		args := append([]string{"launch", "-n", "4", "--grace", "30s", "--"}, rankCmd("", "bench", "tiny", "--iters", "1000000")...)
		p := startEprun(t, nil, args...)
		// Rank 0's progress: every rank is in the timed loop.
		p.waitLines(t, "[rank 0] eprun: case 1/1 dispatch", 1)
		ranks := childrenOf(t, p.cmd.Process.Pid)
		if len(ranks) != 4 {
			t.Fatalf("eprun launch has %d children, want 4", len(ranks))
		}
		start := time.Now()
		for _, pid := range ranks {
			syscall.Kill(pid, syscall.SIGTERM)
		}
		took, code := p.wait(t, start, time.Minute)
		t.Logf("trial %d: every rank ended %v after SIGTERM", trial, took)
		if took > 5*time.Second {
			t.Errorf("trial %d: the ranks ended %v after SIGTERM, want within a second:\n%s", trial, took, p.output())
		}
		if code == 0 {
			t.Errorf("trial %d: exit 0 after SIGTERM", trial)
		}
	}
}

// TestLaunchEarlyExit is the case: rank 2 of 4 exits 0 before it
// joins; the other ranks fail at once naming it (a lost peer), and so does
// eprun launch, instead of waiting for GOEP_RENDEZVOUS_TIMEOUT.
func TestLaunchEarlyExit(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes; skipped with -short")
	}
	if _, err := exec.LookPath("sh"); err != nil {
		t.Skip("no sh:", err)
	}
	args := append([]string{"launch", "-n", "4", "--"}, rankCmd(`if [ "$RANK" = 2 ]; then exit 0; fi; `, "bench", "tiny", "-q")...)
	start := time.Now()
	// Without the launcher's news the others would wait 2 minutes.
	p := startEprun(t, []string{"GOEP_RENDEZVOUS_TIMEOUT=2m"}, args...)
	took, code := p.wait(t, start, 3*time.Minute)
	out := p.output()
	t.Logf("eprun launch ended after %v:\n%s", took, out)
	if took > time.Minute {
		t.Errorf("eprun launch took %v", took)
	}
	if code != 1 || !strings.Contains(out, "after rank 2 exited with status 0") {
		t.Errorf("exit %d, want 1 and an error naming rank 2", code)
	}
	// The ranks that report (eprun may leave it to the lowest) name rank
	// 2 lost.
	if !strings.Contains(out, "lost rank(s) [2]: its process exited with status 0") {
		t.Errorf("no rank fails naming rank 2 lost")
	}
}
