package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/goep/goep/internal/bench"
)

// childArgsVar, set, makes this test binary run eprun's main with its
// arguments (a JSON array): TestEprunChild, the eprun process of the tests
// below.
const childArgsVar = "GOEP_EPRUN_CHILD_ARGS"

// TestEprunChild is eprun itself, as a process of its own.
func TestEprunChild(t *testing.T) {
	args, ok := os.LookupEnv(childArgsVar)
	if !ok {
		t.Skip("eprun's main for the process tests; runs only as their child")
	}
	var a []string
	if err := json.Unmarshal([]byte(args), &a); err != nil {
		t.Fatalf("%s=%q: %v", childArgsVar, args, err)
	}
	os.Args = append([]string{"eprun"}, a...)
	main() // exits
}

// eprunChild is the command of an eprun process running args, through sh
// with redirections redirect (e.g. ">&-"); its environment has no
// launcher's variables.
func eprunChild(t *testing.T, redirect string, args ...string) *exec.Cmd {
	t.Helper()
	if _, err := exec.LookPath("sh"); err != nil {
		t.Skip("no sh:", err)
	}
	a, _ := json.Marshal(args)
	cmd := exec.Command("sh", "-c", `exec "$0" -test.run='^TestEprunChild$' `+redirect, os.Args[0])
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		switch k {
		case "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GOEP_MASTER_ADDR", "GOEP_MASTER_PORT":
			continue
		}
		if strings.HasPrefix(k, "OMPI_") || strings.HasPrefix(k, "PMI_") || strings.HasPrefix(k, "SLURM_") {
			continue
		}
		cmd.Env = append(cmd.Env, kv)
	}
	cmd.Env = append(cmd.Env, childArgsVar+"="+string(a))
	return cmd
}

// TestFailedCaseKeepsRows: a run whose second case fails (its permuted
// rows overflow the capacity: 4 ranks x 32 tokens x top-6 cannot fit 128
// rows a rank, top-1 always does) prints the first case's rows, writes
// them to --json and --csv, then the error, once, on one line, naming the
// case and the cause; and exits 1. The table's footer and the JSON record
// say the run is incomplete, and how much of it was measured.
func TestFailedCaseKeepsRows(t *testing.T) {
	dir := t.TempDir()
	js, cs := filepath.Join(dir, "r.json"), filepath.Join(dir, "r.csv")
	var out bytes.Buffer // stdout and stderr together, in order
	code := run(t.Context(), append(tiny, "--mode", "capacity", "--topk", "1,6", "--max-permuted-tokens", "128", "--json", js, "--csv", cs), &out, &out)
	text := out.String()
	if code != 1 {
		t.Fatalf("exit %d, want 1:\n%s", code, text)
	}
	lines := strings.Split(strings.TrimSpace(text), "\n")
	last := lines[len(lines)-1]
	if !strings.HasPrefix(last, "eprun: bench: rank ") || !strings.Contains(last, ": mode=capacity topk=6 tokens=32 hidden=64 dtype=bf16: ") || strings.Count(last, "capacity exceeded") != 1 {
		t.Errorf("last line %q: want the error naming the case and the overflow", last)
	}
	if n := strings.Count(text, "eprun: "); n != 1 {
		t.Errorf("%d lines of eprun's own, want 1 (the error):\n%s", n, text)
	}
	if !strings.Contains(text, "# check: INCOMPLETE, 4 of 8 rows measured (") || strings.Index(text, "# call") > strings.Index(text, last) {
		t.Errorf("no table before the error, or it does not say it is incomplete:\n%s", text)
	}
	table := strings.Join(lines[:len(lines)-1], "\n")
	if _, rows := tableRows(t, table, 11); len(rows) != len(bench.AllCalls) {
		t.Errorf("%d rows in the table, want the first case's %d:\n%s", len(rows), len(bench.AllCalls), text)
	}
	checkWidth(t, table)
	rec := readRecord(t, js)
	if len(rec.Rows) != len(bench.AllCalls) || rec.Rows[0].TopK != 1 || !strings.Contains(rec.Error, "topk=6") || !rec.Incomplete {
		t.Errorf("--json: %d rows, error %q, incomplete %v; want the first case's rows, the error, incomplete", len(rec.Rows), rec.Error, rec.Incomplete)
	}
	if recs := readCSV(t, cs); len(recs) != 1+len(bench.AllCalls) {
		t.Errorf("--csv: %d records, want a header and %d rows", len(recs), len(bench.AllCalls))
	}
}

// TestFailedCheckKeepsRows: eprun check, repeated, whose second case
// fails in its first repetition, as bench's: the summary of the rows
// checked before, marked incomplete, then the error naming the case and
// the repetition; --json has those rows and says it is incomplete; exit
// 1.
func TestFailedCheckKeepsRows(t *testing.T) {
	js := filepath.Join(t.TempDir(), "r.json")
	code, stdout, stderr := eprun(t, "check", "tiny", "-q", "--count", "2", "--mode", "capacity", "--topk", "1,6", "--max-permuted-tokens", "128", "--json", js)
	if code != 1 || !strings.Contains(stderr, ": mode=capacity topk=6 tokens=32 hidden=64 dtype=bf16 rep=1/2: ") || strings.Count(stderr, "\n") != 1 {
		t.Fatalf("exit %d, stderr %q; want 1 and one line naming the case and the repetition", code, stderr)
	}
	n := len(bench.AllCalls)
	if !strings.Contains(stdout, fmt.Sprintf("# check: INCOMPLETE, %d of %d rows measured (", n, 2*2*n)) {
		t.Errorf("the summary does not say it is incomplete:\n%s", stdout)
	}
	rec := readRecord(t, js)
	if len(rec.Rows) != n || !rec.Incomplete || rec.Rows[0].TopK != 1 || rec.Rows[0].Rep != 1 || rec.Rows[0].CheckedRows == 0 {
		t.Errorf("--json: %d rows, incomplete %v, first %+v; want the first case's %d rows, incomplete", len(rec.Rows), rec.Incomplete, rec.Rows[0], n)
	}
}

// TestOutputErrors: an output that cannot be written fails the command
// (exit 1, or 2 when refused before the run), naming the output; a stdout
// that was closed when eprun started is refused before the run (the Go
// runtime put /dev/null, read-write, in its place), a stdout sent to
// /dev/null on purpose (write-only) is not.
func TestOutputErrors(t *testing.T) {
	dir := t.TempDir()
	openFile := func(name string, flag int) *os.File {
		f, err := os.OpenFile(name, flag, 0)
		if err != nil {
			t.Skipf("no %s here: %v", name, err)
		}
		t.Cleanup(func() { f.Close() })
		return f
	}
	missing := filepath.Join(dir, "no-such-dir", "out")
	for _, tc := range []struct {
		name   string
		stdout func() io.Writer
		args   []string
		code   int
		want   string
	}{
		{"--json to a full device", nil, []string{"--json", "/dev/full"}, 1, "writing the results: --json /dev/full: write /dev/full: no space left on device"},
		{"--csv to a full device", nil, []string{"--csv", "/dev/full"}, 1, "writing the results: --csv /dev/full: write /dev/full: no space left on device"},
		{"--json to a missing directory", nil, []string{"--json", missing}, 2, "--json: open " + missing},
		{"--csv to a missing directory", nil, []string{"--csv", missing}, 2, "--csv: open " + missing},
		{"stdout full", func() io.Writer { return openFile("/dev/full", os.O_WRONLY) }, nil, 1, "writing the results: stdout: write /dev/full: no space left on device"},
		{"--json - to a full stdout", func() io.Writer { return openFile("/dev/full", os.O_WRONLY) }, []string{"--json", "-"}, 1, "--json - (stdout): write /dev/full"},
		{"stdout closed at start", func() io.Writer { return openFile(os.DevNull, os.O_RDWR) }, nil, 1, "stdout is closed"},
		{"stdout to /dev/null", func() io.Writer { return openFile(os.DevNull, os.O_WRONLY) }, nil, 0, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, cmd := range []string{"bench", "check"} {
				args := append([]string{cmd, "tiny", "-q", "--iters", "1", "--warmup", "0"}, tc.args...)
				var stdout io.Writer = new(bytes.Buffer)
				if tc.stdout != nil {
					stdout = tc.stdout()
				}
				var stderr bytes.Buffer
				code := run(t.Context(), args, stdout, &stderr)
				lines := strings.Split(strings.TrimSpace(stderr.String()), "\n")
				last := lines[len(lines)-1] // --json - puts the table on stderr
				if code != tc.code || !strings.Contains(last, tc.want) || strings.Count(stderr.String(), "eprun: ") > 1 {
					t.Errorf("%v: exit %d, stderr %q; want %d and %q", args, code, stderr.String(), tc.code, tc.want)
				}
			}
		})
	}
}

// TestStdoutClosedProcess: eprun bench with its stdout closed by the
// shell (>&-) exits 1 naming stdout; with >/dev/null it runs.
func TestStdoutClosedProcess(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes; skipped with -short")
	}
	for _, tc := range []struct {
		redirect string
		code     int
		want     string
	}{
		{">&-", 1, "stdout is closed"},
		{">/dev/null", 0, ""},
	} {
		cmd := eprunChild(t, tc.redirect, "check", "tiny", "-q", "--iters", "1")
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		err := cmd.Run()
		var ee *exec.ExitError
		code := 0
		if errors.As(err, &ee) {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		if code != tc.code || !strings.Contains(stderr.String(), tc.want) {
			t.Errorf("eprun check tiny %s: exit %d, stderr %q; want %d, %q", tc.redirect, code, stderr.String(), tc.code, tc.want)
		}
	}
}

// TestSignalEndsRun: SIGTERM to eprun bench in its course ends it at once
// (the bound, 30 s, only catches a hang: the run would take an hour), with
// the status of a process the signal ended (143) and one line saying so.
func TestSignalEndsRun(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes; skipped with -short")
	}
	cmd := eprunChild(t, "", "bench", "tiny", "--iters", "1000000")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill() })
	var lines []string
	sc := bufio.NewScanner(stderr)
	for sc.Scan() { // the first progress line: the timed loop has begun
		lines = append(lines, sc.Text())
		if strings.Contains(sc.Text(), "eprun: case 1/1 dispatch") {
			break
		}
	}
	start := time.Now()
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	err = cmd.Wait()
	took := time.Since(start)
	out := strings.Join(lines, "\n")
	if took > 30*time.Second {
		t.Errorf("eprun ended %v after SIGTERM:\n%s", took, out)
	}
	if code := cmd.ProcessState.ExitCode(); code != 128+int(syscall.SIGTERM) || !strings.Contains(out, "eprun: stopped by SIGTERM") {
		t.Errorf("exit %d (%v), stderr:\n%s\nwant 143 and a line saying SIGTERM stopped it", code, err, out)
	}
}

// TestUntilSignal: the first signal cancels the command's context with a
// cause naming it; the command then has the grace to return, after which
// eprun exits all the same (a config being parsed, a wait that ignores the
// context), or at a second signal; the status is 128 + the signal. With a
// negative grace (eprun launch, which ends its ranks itself) it waits for
// the command and returns its status.
func TestUntilSignal(t *testing.T) {
	for _, tc := range []struct {
		name    string
		signals int
		grace   time.Duration
		obeys   bool // the command returns when its context is cancelled
		want    int
		stderr  string
	}{
		{"no signal", 0, time.Second, true, 7, ""},
		{"SIGTERM, the command returns", 1, time.Minute, true, 143, ""},
		{"SIGTERM, the command hangs", 1, time.Second, false, 143, "eprun: stopped by SIGTERM (without waiting for the command to return)"},
		{"two signals", 2, time.Hour, false, 143, "eprun: stopped by SIGTERM, then SIGTERM"},
		{"launch", 1, -1, true, 7, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sigs := make(chan os.Signal, 2)
			release := make(chan struct{})
			defer close(release)
			started := make(chan struct{})
			var cause error
			var mu sync.Mutex
			f := func(ctx context.Context) int {
				close(started)
				if tc.signals == 0 {
					return 7
				}
				if tc.obeys {
					<-ctx.Done()
					mu.Lock()
					cause = context.Cause(ctx)
					mu.Unlock()
					return 7
				}
				<-release // hangs until the test ends
				return 7
			}
			var stderr syncBuffer
			done := make(chan int, 1)
			go func() { done <- untilSignal(sigs, &stderr, tc.grace, f) }()
			<-started
			for range tc.signals {
				sigs <- syscall.SIGTERM
			}
			select {
			case code := <-done:
				if code != tc.want {
					t.Errorf("status %d, want %d", code, tc.want)
				}
			case <-time.After(time.Minute): // only a hang gets here
				t.Fatal("untilSignal did not return")
			}
			if got := stderr.String(); !strings.Contains(got, tc.stderr) || (tc.stderr == "" && got != "") {
				t.Errorf("stderr %q, want %q", got, tc.stderr)
			}
			mu.Lock()
			defer mu.Unlock()
			if tc.obeys && tc.signals > 0 && (cause == nil || cause.Error() != "stopped by SIGTERM") {
				t.Errorf("the context's cause %v, want the signal", cause)
			}
		})
	}
}

// syncBuffer is a bytes.Buffer safe for concurrent use.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// lineWriter sends every write on a channel.
type lineWriter chan string

func (w lineWriter) Write(p []byte) (int, error) {
	w <- string(p)
	return len(p), nil
}

// TestProgressHeartbeat: while one step runs long, progress says so every
// heartbeat (10 s), naming the step and the iterations done, and says
// nothing more often; finish stops it.
func TestProgressHeartbeat(t *testing.T) {
	w := make(lineWriter, 16)
	ticks := make(chan time.Time) // unbuffered: a send returns once the heartbeat took it
	stopped := make(chan struct{})
	p := newProgressEvery(w, ticks, func() { close(stopped) })
	p.update(bench.Progress{Case: 1, Cases: 2, Step: "a2a/dispatch", Done: 3, Total: 40})
	if got := <-w; !strings.HasPrefix(got, "eprun: case 1/2 a2a/dispatch (") {
		t.Fatalf("first line %q", got)
	}
	now := time.Now()
	ticks <- now.Add(heartbeat / 2) // too soon: nothing
	ticks <- now.Add(heartbeat + time.Second)
	ticks <- now.Add(heartbeat + 2*time.Second) // the beat above has been written
	select {
	case got := <-w:
		if !strings.Contains(got, "eprun: still in case 1/2 a2a/dispatch, 3 of 40 iterations done (") {
			t.Errorf("heartbeat %q", got)
		}
	default:
		t.Fatal("no heartbeat after a step ran longer than one")
	}
	select {
	case got := <-w:
		t.Errorf("a second line %q within a heartbeat of the first", got)
	default:
	}
	p.finish()
	<-stopped
	p.finish() // twice is fine
	p.update(bench.Progress{Case: 2, Cases: 2, Step: "dispatch"})
	select {
	case got := <-w:
		t.Errorf("a line after finish: %q", got)
	default:
	}
}

// TestPlotRefusesBadTokens: a record whose rows have null, missing, zero or
// negative tokens per rank is refused, naming the file, the row and the
// value, before anything is drawn.
func TestPlotRefusesBadTokens(t *testing.T) {
	dir := t.TempDir()
	rec := filepath.Join(dir, "good.json")
	eprunOK(t, append(tiny, "--tokens", "8,16", "--json", rec)...)
	data, err := os.ReadFile(rec)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, value, want string
	}{
		{"null", "null", `row 1 (call "combine"): tokens is 0 (null, missing or zero)`},
		{"zero", "0", `row 1 (call "combine"): tokens is 0 (null, missing or zero)`},
		{"negative", "-16", `row 1 (call "combine"): tokens is -16`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var raw map[string]any
			if err := json.Unmarshal(data, &raw); err != nil {
				t.Fatal(err)
			}
			raw["rows"].([]any)[1].(map[string]any)["tokens"] = json.RawMessage(tc.value)
			bad, _ := json.Marshal(raw)
			path := writeFile(t, dir, tc.name+".json", string(bad))
			out := filepath.Join(dir, tc.name+".png")
			code, _, stderr := eprun(t, "plot", path, "-o", out)
			if code == 0 || !strings.Contains(stderr, "plot: "+path+": "+tc.want) {
				t.Errorf("exit %d, stderr %q; want an error %q", code, stderr, tc.want)
			}
			if _, err := os.Stat(out); err == nil {
				t.Errorf("%s was drawn", out)
			}
		})
	}
}
