package launcher

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// helperVar tells a child started by a Spawn test what to do: a
// comma-separated list of RANK:ACTION, "*" for every other rank.
const helperVar = "GOEP_LAUNCHER_TEST_HELPER"

// helperActions are what a child can do (see TestHelperProcess).
var helperActions = map[string]func(rank int){
	"print": func(int) {
		fmt.Println("out line 1")
		fmt.Fprintln(os.Stderr, "err line")
		fmt.Print("out line 2\nno newline")
	},
	"env": func(int) {
		for _, k := range []string{"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GOEP_MASTER_ADDR", "GOEP_MASTER_PORT", "GOEP_RANKS_PER_DOMAIN",
			"GOEP_WORLD_SECRET", "GOEP_LAUNCHER_FD"} {
			v, ok := os.LookupEnv(k)
			if !ok {
				v = "<unset>"
			}
			fmt.Printf("%s=%s\n", k, v)
		}
	},
	"exit0": func(int) {},
	"exit3": func(int) { os.Exit(3) },
	// The ranks that wait do so for longer than any test runs: only
	// Spawn ends them.
	// failsoon fails once every other rank is ready.
	"failsoon": func(r int) { ready(r); waitReady(); os.Exit(3) },
	"killself": func(r int) {
		ready(r)
		waitReady()
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {}
	},
	"sleep": func(r int) { ready(r); time.Sleep(helperSleep) },
	"trap": func(r int) {
		signal.Ignore(syscall.SIGTERM)
		fmt.Println("trapping")
		ready(r)
		time.Sleep(helperSleep)
	},
	"grandchild": func(r int) {
		c := exec.Command("sleep", "60")
		if err := c.Start(); err != nil {
			fmt.Println("grandchild:", err)
			os.Exit(1)
		}
		fmt.Printf("grandchild %d\n", c.Process.Pid)
		ready(r)
		time.Sleep(helperSleep)
	},
	// stray leaves a process that holds the rank's output in a process
	// group of its own, where Spawn does not reach it, and writes its pid
	// to the file "stray" of the ready directory.
	"stray": func(int) {
		c := exec.Command("sleep", "600")
		c.Stdout = os.Stdout
		c.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		if err := c.Start(); err != nil {
			fmt.Println("stray:", err)
			os.Exit(1)
		}
		_ = os.WriteFile(os.Getenv(readyDir)+"/stray", []byte(strconv.Itoa(c.Process.Pid)), 0o644)
	},
	// lines prints 400 numbered lines of 100 bytes: 40 KB, which a pipe
	// holds whole, so that the rank exits however slowly it is read.
	"lines": func(rank int) {
		for i := range 400 {
			fmt.Printf("line %3d of rank %d %s\n", i, rank, strings.Repeat("x", 100-len("line 000 of rank 0 \n")))
		}
	},
	"spam": func(rank int) {
		tail := strings.Repeat("x", 100+rank*1000)
		for i := range 300 {
			fmt.Printf("spam %d %d %s\n", rank, i, tail)
		}
	},
}

// helperSleep is how long the waiting helpers wait: longer than any test.
const helperSleep = 10 * time.Minute

// prompt bounds how long Spawn may take to end a job that it must end at
// once (a rank failed, ctx ended): far above starting a few test binaries on
// a loaded machine, far below helperSleep.
const prompt = time.Minute

// readyDir is where helpers say they are ready (they have printed their pid
// and set up), so that a failing rank fails only once the others run, and
// tests act once they do.
const readyDir = "GOEP_LAUNCHER_TEST_READY"

func ready(rank int) {
	if dir := os.Getenv(readyDir); dir != "" {
		_ = os.WriteFile(fmt.Sprintf("%s/%d", dir, rank), nil, 0o644)
	}
}

// readyIn is the number of ranks that said they are ready in dir.
func readyIn(dir string) int {
	ents, _ := os.ReadDir(dir)
	return len(ents)
}

// awaitReady waits until n ranks have said they are ready in dir, or ctx
// ends, and says whether they have.
func awaitReady(ctx context.Context, dir string, n int) bool {
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for readyIn(dir) < n {
		select {
		case <-tick.C:
		case <-ctx.Done():
			return false
		}
	}
	return true
}

// waitReady waits until every rank is ready. Past helperSleep it gives up
// loudly (exit status 101), rather than fail as its action says.
func waitReady() {
	dir := os.Getenv(readyDir)
	n, _ := strconv.Atoi(os.Getenv("WORLD_SIZE"))
	if dir == "" {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), helperSleep)
	defer cancel()
	if !awaitReady(ctx, dir, n) {
		fmt.Fprintf(os.Stderr, "helper: %d of %d ranks ready after %v\n", readyIn(dir), n, helperSleep)
		os.Exit(101)
	}
}

// TestHelperProcess is the child of the Spawn tests: run with helperVar
// set, it prints its pid, does what helperVar says for its RANK and exits.
func TestHelperProcess(t *testing.T) {
	spec, ok := os.LookupEnv(helperVar)
	if !ok {
		t.Skip("the child process of the Spawn tests; runs only under Spawn")
	}
	rank, err := strconv.Atoi(os.Getenv("RANK"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "helper: RANK:", err)
		os.Exit(100)
	}
	action := ""
	for _, item := range strings.Split(spec, ",") {
		r, a, _ := strings.Cut(item, ":")
		if r == strconv.Itoa(rank) || (r == "*" && action == "") {
			action = a
		}
	}
	f, ok := helperActions[action]
	if !ok {
		fmt.Fprintf(os.Stderr, "helper: no action %q for rank %d in %q\n", action, rank, spec)
		os.Exit(100)
	}
	fmt.Printf("pid %d\n", os.Getpid())
	f(rank)
	os.Exit(0)
}

// spawnHelper runs n ranks of the test binary doing spec, and returns
// Spawn's error, the output and how long it took.
func spawnHelper(t *testing.T, ctx context.Context, cfg SpawnConfig, spec string) (err error, stdout, stderr string, took time.Duration) {
	t.Helper()
	return spawnHelperIn(t, ctx, cfg, spec, t.TempDir())
}

// spawnHelperIn is spawnHelper whose ranks say they are ready in dir.
func spawnHelperIn(t *testing.T, ctx context.Context, cfg SpawnConfig, spec, dir string) (err error, stdout, stderr string, took time.Duration) {
	t.Helper()
	var out, errb bytes.Buffer
	cfg.Command = []string{os.Args[0], "-test.run=^TestHelperProcess$"}
	cfg.Stdout, cfg.Stderr = &out, &errb
	cfg.Env = append(os.Environ(), helperVar+"="+spec, readyDir+"="+dir)
	start := time.Now()
	err = Spawn(ctx, cfg)
	took = time.Since(start)
	t.Logf("Spawn took %v, returned %v", took, err)
	return err, out.String(), errb.String(), took
}

var pidLine = regexp.MustCompile(`(?m)^\[rank (\d+)\] (pid|grandchild) (\d+)$`)

// pids returns the pids the ranks printed, by rank, and grandchildren's.
func pids(t *testing.T, n int, stdout string) (ranks map[int]int, grandchildren []int) {
	t.Helper()
	ranks = map[int]int{}
	for _, m := range pidLine.FindAllStringSubmatch(stdout, -1) {
		r, _ := strconv.Atoi(m[1])
		pid, _ := strconv.Atoi(m[3])
		if m[2] == "pid" {
			ranks[r] = pid
		} else {
			grandchildren = append(grandchildren, pid)
		}
	}
	if len(ranks) != n {
		t.Fatalf("%d ranks printed their pid, want %d:\n%s", len(ranks), n, stdout)
	}
	return ranks, grandchildren
}

// checkReaped checks that each of the n ranks printed its pid to stdout
// and has been reaped: its pid is gone. It returns the pids of the
// grandchildren the ranks printed.
func checkReaped(t *testing.T, n int, stdout string) (grandchildren []int) {
	t.Helper()
	ranks, grandchildren := pids(t, n, stdout)
	for r, pid := range ranks {
		if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
			t.Errorf("rank %d (pid %d) still exists after Spawn returned: kill 0: %v", r, pid, err)
		}
	}
	return grandchildren
}

// dead reports whether pid is gone or a zombie (an orphan waiting for
// init to reap it, which is not Spawn's to do).
func dead(pid int) bool {
	if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
		return true
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	s := string(stat)
	if i := strings.LastIndexByte(s, ')'); i >= 0 && len(s) > i+2 {
		return s[i+2] == 'Z' || s[i+2] == 'X'
	}
	return false
}

func TestSpawnOutput(t *testing.T) {
	err, stdout, stderr, _ := spawnHelper(t, t.Context(), SpawnConfig{N: 3}, "*:print")
	if err != nil {
		t.Fatal(err)
	}
	checkReaped(t, 3, stdout)
	for r := range 3 {
		for _, want := range []string{"out line 1", "out line 2", "no newline"} {
			if !strings.Contains(stdout, fmt.Sprintf("[rank %d] %s\n", r, want)) {
				t.Errorf("stdout lacks rank %d's %q:\n%s", r, want, stdout)
			}
		}
		if !strings.Contains(stderr, fmt.Sprintf("[rank %d] err line\n", r)) {
			t.Errorf("stderr lacks rank %d's line:\n%s", r, stderr)
		}
	}
	if n := strings.Count(stdout, "\n"); n != 3*4 {
		t.Errorf("stdout has %d lines, want 12:\n%s", n, stdout)
	}
	if n := strings.Count(stderr, "\n"); n != 3 {
		t.Errorf("stderr has %d lines, want 3:\n%s", n, stderr)
	}
}

// TestSpawnLines checks that lines of concurrent ranks never mix, whatever
// their length, on a destination shared by stdout and stderr.
func TestSpawnLines(t *testing.T) {
	var out bytes.Buffer
	cfg := SpawnConfig{N: 4, Command: []string{os.Args[0], "-test.run=^TestHelperProcess$"}, Stdout: &out, Stderr: &out,
		Env: append(os.Environ(), helperVar+"=*:spam")}
	if err := Spawn(t.Context(), cfg); err != nil {
		t.Fatal(err)
	}
	line := regexp.MustCompile(`^\[rank (\d)\] (pid \d+|spam (\d) (\d+) (x+))$`)
	next := map[string]int{}
	for _, l := range strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n") {
		m := line.FindStringSubmatch(l)
		if m == nil {
			t.Fatalf("mixed or malformed line %.200q", l)
		}
		if m[3] == "" {
			continue
		}
		r, _ := strconv.Atoi(m[1])
		if m[3] != m[1] || m[4] != strconv.Itoa(next[m[1]]) || len(m[5]) != 100+r*1000 {
			t.Fatalf("rank %s: line %.80q out of order or cut (want line %d)", m[1], l, next[m[1]])
		}
		next[m[1]]++
	}
	for r := range 4 {
		if n := next[strconv.Itoa(r)]; n != 300 {
			t.Errorf("rank %d: %d lines, want 300", r, n)
		}
	}
}

func TestSpawnEnv(t *testing.T) {
	for _, tc := range []struct {
		n, domains, perDomain int
	}{
		{n: 3, domains: 0, perDomain: 3},
		{n: 4, domains: 1, perDomain: 4},
		{n: 4, domains: 2, perDomain: 2},
		{n: 6, domains: 3, perDomain: 2},
	} {
		t.Run(fmt.Sprintf("n=%d/domains=%d", tc.n, tc.domains), func(t *testing.T) {
			var out bytes.Buffer
			env := slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "GOEP_RANKS_PER_DOMAIN=") })
			// Stale values of an outer launcher are replaced.
			env = append(env, helperVar+"=*:env", "RANK=99", "WORLD_SIZE=100", "GOEP_MASTER_PORT=1", "GOEP_WORLD_SECRET=stale-secret-of-an-outer-job", "GOEP_LAUNCHER_FD=7")
			cfg := SpawnConfig{N: tc.n, Domains: tc.domains, Command: []string{os.Args[0], "-test.run=^TestHelperProcess$"}, Stdout: &out, Env: env}
			if err := Spawn(t.Context(), cfg); err != nil {
				t.Fatal(err)
			}
			got := map[int]map[string]string{}
			for _, l := range strings.Split(strings.TrimSpace(out.String()), "\n") {
				var r int
				var kv string
				if _, err := fmt.Sscanf(l, "[rank %d] %s", &r, &kv); err != nil {
					t.Fatalf("line %q: %v", l, err)
				}
				k, v, _ := strings.Cut(kv, "=")
				if got[r] == nil {
					got[r] = map[string]string{}
				}
				got[r][k] = v
			}
			port := got[0]["GOEP_MASTER_PORT"]
			if p, err := strconv.Atoi(port); err != nil || p <= 1 || p > 65535 {
				t.Errorf("GOEP_MASTER_PORT=%q", port)
			}
			// A fresh secret, 32 random bytes in hex, the same for every rank.
			secret := got[0]["GOEP_WORLD_SECRET"]
			if !regexp.MustCompile(`^[0-9a-f]{64}$`).MatchString(secret) {
				t.Errorf("GOEP_WORLD_SECRET=%q, want 64 hex digits", secret)
			}
			perDomain := "<unset>"
			if tc.domains > 1 {
				perDomain = strconv.Itoa(tc.perDomain)
			}
			for r := range tc.n {
				want := map[string]string{
					"pid":                   got[r]["pid"],
					"RANK":                  strconv.Itoa(r),
					"WORLD_SIZE":            strconv.Itoa(tc.n),
					"LOCAL_RANK":            strconv.Itoa(r % tc.perDomain),
					"LOCAL_WORLD_SIZE":      strconv.Itoa(tc.perDomain),
					"GOEP_MASTER_ADDR":      "127.0.0.1",
					"GOEP_MASTER_PORT":      port,
					"GOEP_RANKS_PER_DOMAIN": perDomain,
					"GOEP_WORLD_SECRET":     secret,
					"GOEP_LAUNCHER_FD":      "3",
				}
				if fmt.Sprint(got[r]) != fmt.Sprint(want) {
					t.Errorf("rank %d sees %v, want %v", r, got[r], want)
				}
			}
			// What the ranks see is what Detect reads.
			e, err := detect(func(k string) (string, bool) { v, ok := got[tc.n-1][k]; return v, ok && v != "<unset>" })
			if want := (Env{KindTorchrun, tc.n - 1, tc.n, (tc.n - 1) % tc.perDomain, tc.perDomain}); err != nil || e != want {
				t.Errorf("Detect in the last rank: %+v, %v; want %+v", e, err, want)
			}
		})
	}
}

func TestSpawnAllSucceed(t *testing.T) {
	err, stdout, _, _ := spawnHelper(t, t.Context(), SpawnConfig{N: 4}, "*:exit0")
	if err != nil {
		t.Fatal(err)
	}
	checkReaped(t, 4, stdout)
}

// TestSpawnFailure checks that a failing rank is named and that the others,
// which would sleep for helperSleep, are terminated at once.
func TestSpawnFailure(t *testing.T) {
	for _, tc := range []struct {
		name, spec string
		want       RankError
		msg        string
	}{
		{"exit", "2:failsoon,*:sleep", RankError{Rank: 2, ExitCode: 3}, "rank 2 exited with status 3"},
		{"exit at once", "1:exit3,*:sleep", RankError{Rank: 1, ExitCode: 3}, "rank 1 exited with status 3"},
		{"signal", "3:killself,*:sleep", RankError{Rank: 3, ExitCode: -1, Signal: syscall.SIGKILL}, "rank 3 killed by signal 9 (killed)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err, stdout, stderr, took := spawnHelper(t, t.Context(), SpawnConfig{N: 4}, tc.spec)
			var re *RankError
			if !errors.As(err, &re) || *re != tc.want || !strings.Contains(err.Error(), tc.msg) {
				t.Fatalf("error %v, want %q (%+v)\nstdout:\n%s\nstderr:\n%s", err, tc.msg, tc.want, stdout, stderr)
			}
			if took > prompt {
				t.Errorf("Spawn took %v: the sleeping ranks were not terminated promptly", took)
			}
			if tc.name == "exit at once" {
				return // the others may be terminated before they print their pid
			}
			checkReaped(t, 4, stdout)
		})
	}
}

// TestSpawnGrace checks that ranks ignoring SIGTERM get SIGKILL after the
// grace period.
func TestSpawnGrace(t *testing.T) {
	err, stdout, _, took := spawnHelper(t, t.Context(), SpawnConfig{N: 3, Grace: 500 * time.Millisecond}, "0:failsoon,*:trap")
	if re := (*RankError)(nil); !errors.As(err, &re) || re.Rank != 0 {
		t.Fatalf("error %v, want rank 0's", err)
	}
	if took < 500*time.Millisecond || took > prompt {
		t.Errorf("Spawn took %v, want at least the 500 ms grace period and at most %v", took, prompt)
	}
	if n := strings.Count(stdout, "trapping"); n != 2 {
		t.Errorf("%d ranks trapped SIGTERM, want 2", n)
	}
	checkReaped(t, 3, stdout)
}

// TestSpawnGrandchild checks that a rank's own children die with the job.
func TestSpawnGrandchild(t *testing.T) {
	if _, err := exec.LookPath("sleep"); err != nil {
		t.Skip("no sleep command:", err)
	}
	err, stdout, _, took := spawnHelper(t, t.Context(), SpawnConfig{N: 2}, "0:grandchild,1:failsoon")
	if re := (*RankError)(nil); !errors.As(err, &re) || re.Rank != 1 {
		t.Fatalf("error %v, want rank 1's", err)
	}
	if took > prompt {
		t.Errorf("Spawn took %v", took)
	}
	gc := checkReaped(t, 2, stdout)
	if len(gc) != 1 {
		t.Fatalf("grandchild pids %v:\n%s", gc, stdout)
	}
	// Killed with its group; the kernel may take a moment to show it.
	deadline := time.Now().Add(prompt)
	for !dead(gc[0]) {
		if time.Now().After(deadline) {
			t.Fatalf("grandchild %d still alive %v after Spawn returned", gc[0], prompt)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestSpawnCancel cancels ctx once every rank runs: Spawn must end them
// all, reap them, and say it was interrupted.
func TestSpawnCancel(t *testing.T) {
	dir := t.TempDir()
	ctx, cancel := context.WithCancel(t.Context())
	var cancelled time.Time
	go func() {
		if awaitReady(ctx, dir, 3) {
			cancelled = time.Now()
			cancel()
		}
	}()
	err, stdout, _, _ := spawnHelperIn(t, ctx, SpawnConfig{N: 3}, "*:sleep", dir)
	if !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "interrupted") {
		t.Fatalf("error %v, want an interruption", err)
	}
	if took := time.Since(cancelled); took > prompt {
		t.Errorf("Spawn returned %v after the cancel", took)
	}
	checkReaped(t, 3, stdout)
}

// TestSpawnTimeout: a job still running at SpawnConfig.Timeout is ended,
// its ranks reaped, and the error says it timed out. A timeout that came
// before every rank ran (a loaded machine starts test binaries slowly)
// shows nothing about ending running ranks: the run is repeated with
// twice the timeout.
func TestSpawnTimeout(t *testing.T) {
	for timeout := 300 * time.Millisecond; ; timeout *= 2 {
		dir := t.TempDir()
		err, stdout, _, took := spawnHelperIn(t, t.Context(), SpawnConfig{N: 2, Timeout: timeout}, "*:sleep", dir)
		if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), fmt.Sprintf("timed out after %v", timeout)) {
			t.Fatalf("error %v, want a timeout after %v", err, timeout)
		}
		if n := readyIn(dir); n < 2 {
			if timeout > prompt {
				t.Fatalf("%d of 2 ranks ran before a %v timeout", n, timeout)
			}
			t.Logf("%d of 2 ranks ran before the %v timeout; again with twice the timeout", n, timeout)
			continue
		}
		if took > timeout+prompt {
			t.Errorf("Spawn took %v with a %v timeout", took, timeout)
		}
		checkReaped(t, 2, stdout)
		return
	}
}

// blockedWriter takes nothing until release is closed.
type blockedWriter struct {
	release chan struct{}
	mu      sync.Mutex
	buf     bytes.Buffer
}

func (w *blockedWriter) Write(p []byte) (int, error) {
	<-w.release
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.Write(p)
}

// TestSpawnSlowOutput: what a rank wrote before it exited is not lost when
// its output is read slowly. Here Stdout takes nothing until drain's bound
// has passed, so the ranks' lines are still in their pipes then; every
// line must come out all the same.
func TestSpawnSlowOutput(t *testing.T) {
	grace := drainGrace
	drainGrace = 0 // the wait is on the hook below, not on the bound
	w := &blockedWriter{release: make(chan struct{})}
	testHookDrained = func() { close(w.release) }
	t.Cleanup(func() { drainGrace, testHookDrained = grace, nil })
	cfg := SpawnConfig{N: 2, Command: []string{os.Args[0], "-test.run=^TestHelperProcess$"}, Stdout: w,
		Env: append(os.Environ(), helperVar+"=*:lines")}
	if err := Spawn(t.Context(), cfg); err != nil {
		t.Fatal(err)
	}
	out := w.buf.String()
	for r := range 2 {
		for i := range 400 {
			if want := fmt.Sprintf("[rank %d] line %3d of rank %d ", r, i, r); !strings.Contains(out, want) {
				t.Fatalf("stdout lacks %q: %d bytes of output in all", want, len(out))
			}
		}
	}
}

// TestSpawnStrayHoldsOutput: a descendant that left its rank's process
// group and holds the rank's output does not keep Spawn waiting past
// drain's bound.
func TestSpawnStrayHoldsOutput(t *testing.T) {
	if _, err := exec.LookPath("sleep"); err != nil {
		t.Skip("no sleep command:", err)
	}
	grace := drainGrace
	drainGrace = 0
	t.Cleanup(func() { drainGrace = grace })
	dir := t.TempDir()
	t.Cleanup(func() {
		if b, err := os.ReadFile(dir + "/stray"); err == nil {
			if pid, err := strconv.Atoi(string(b)); err == nil {
				syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	})
	done := make(chan error, 1)
	go func() {
		err, _, _, _ := spawnHelperIn(t, t.Context(), SpawnConfig{N: 1}, "*:stray", dir)
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(prompt):
		t.Fatalf("Spawn still waits %v after a rank left a stray holding its output", prompt)
	}
	if _, err := os.Stat(dir + "/stray"); err != nil {
		t.Fatalf("the rank left no stray: %v", err)
	}
}

func TestSpawnBadConfig(t *testing.T) {
	for _, tc := range []struct {
		cfg  SpawnConfig
		want string
	}{
		{SpawnConfig{N: 0, Command: []string{"true"}}, "0 ranks"},
		{SpawnConfig{N: 4, Domains: 3, Command: []string{"true"}}, "4 ranks do not split into 3 domains"},
		{SpawnConfig{N: 4, Domains: -1, Command: []string{"true"}}, "-1 domains"},
		{SpawnConfig{N: 1}, "no command"},
		{SpawnConfig{N: 1, Command: []string{"true"}, Grace: -time.Second}, "negative"},
		{SpawnConfig{N: 2, Command: []string{"/no/such/program"}}, "/no/such/program"},
	} {
		err := Spawn(t.Context(), tc.cfg)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: error %v, want %q", tc.cfg, err, tc.want)
		}
	}
}

func TestLineWriter(t *testing.T) {
	var out bytes.Buffer
	w := &lineWriter{prefix: "[rank 7] ", dst: &out, out: &lockedWriter{}}
	for _, s := range []string{"a", "b\nc", "\n\nd", strings.Repeat("y", maxLine+5)} {
		w.Write([]byte(s))
	}
	w.flush()
	want := "[rank 7] ab\n[rank 7] c\n[rank 7] \n[rank 7] d" + strings.Repeat("y", maxLine-1) + "\n[rank 7] yyyyyy\n"
	if out.String() != want {
		t.Errorf("got %.200q, want %.200q", out.String(), want)
	}
}
