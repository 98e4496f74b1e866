package main

import (
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/perf/benchfmt"

	"github.com/goep/goep/internal/bench"
)

// TestTableWidth runs bench tiny as a new user might, sweeping every
// field the table has a column for, and checks that every line of the
// default output, the header and footer included, fits bench.TableWidth,
// and that --wide of the same run keeps every column.
func TestTableWidth(t *testing.T) {
	measured := []string{"time_us", "p99_us", "nvl_GBps", "rdma_GBps", "baseline_GBps", "ratio", "a2a_us", "a2a_GBps", "vs_a2a", "#wrong"}
	for _, tc := range []struct {
		name  string
		args  []string
		swept []string // the columns after dtype
	}{
		{"tiny", nil, nil},
		{"every call, two domains", []string{"--calls", strings.Join(bench.KnownCalls, ","), "--ranks-per-domain", "2"}, nil},
		{"fp8 sweep", []string{"--dtype", "bf16,fp8", "--hidden", "128", "--tokens", "8,16"}, nil},
		{"every field", []string{"--mode", "blocking,capacity", "--topk", "2,4", "--sms", "0,2", "--chunk-rows", "0,8", "--count", "2",
			"--ranks-per-domain", "2", "--calls", "dispatch,dispatch-combine", "--routing", "zipf", "--zipf-s", "1.1"}, []string{"mode", "sms", "chunk", "rep"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append(append(slices.Clone(tiny), "--iters", "1", "--warmup", "0"), tc.args...)
			stdout, _ := eprunOK(t, args...)
			checkWidth(t, stdout)
			if !strings.Contains(stdout, "# check: OK") {
				t.Errorf("no check line:\n%s", stdout)
			}
			stdout, _ = eprunOK(t, append(args, "--wide")...)
			header, _ := tableRows(t, stdout, 15+len(tc.swept), tc.swept...)
			for _, col := range measured {
				if !slices.Contains(header, col) {
					t.Errorf("--wide lacks %s: %v", col, header)
				}
			}
		})
	}
}

// TestBenchCount: --count N runs the whole sweep N times: --format=gobench
// has N results of every benchmark, which benchstat reads as N samples;
// the table a rep column; the JSON a row per call, case and repetition;
// the progress lines say which repetition runs, and -q silences them.
func TestBenchCount(t *testing.T) {
	stdout, stderr := eprunOK(t, append(slices.Clone(tiny), "--count", "6", "--format=gobench")...)
	if stderr != "" {
		t.Errorf("-q still wrote to stderr: %q", stderr)
	}
	r := benchfmt.NewReader(strings.NewReader(stdout), "eprun.txt")
	count := map[string]int{}
	for r.Scan() {
		switch res := r.Result().(type) {
		case *benchfmt.SyntaxError:
			t.Errorf("benchfmt: %v", res)
		case *benchfmt.Result:
			count[res.GetConfig("mode")+" "+res.Name.String()]++
		}
	}
	if err := r.Err(); err != nil {
		t.Fatal(err)
	}
	if len(count) != 2*len(bench.AllCalls)+1 {
		t.Errorf("%d benchmarks, want each call, its a2a and the baseline: %v", len(count), count)
	}
	for name, n := range count {
		if n != 6 {
			t.Errorf("%s: %d results, want 6 (one per repetition)", name, n)
		}
	}

	js := filepath.Join(t.TempDir(), "r.json")
	args := []string{"bench", "tiny", "--iters", "2", "--warmup", "0", "--count", "2", "--calls", "dispatch", "--tokens", "8,16", "--json", js}
	stdout, stderr = eprunOK(t, args...)
	var reps []string
	_, rows := tableRows(t, stdout, 12, "rep")
	for _, f := range rows {
		reps = append(reps, f[1]+"/"+f[5])
	}
	if want := []string{"8/1", "16/1", "8/2", "16/2"}; !slices.Equal(reps, want) {
		t.Errorf("table rows (tokens/rep) %v, want %v:\n%s", reps, want, stdout)
	}
	if !strings.Contains(unfold(stdout), "  count 2  ") {
		t.Errorf("the header line does not give the count:\n%s", stdout)
	}
	rec := readRecord(t, js)
	reps = nil
	for _, row := range rec.Rows {
		reps = append(reps, fmt.Sprintf("%d/%d", row.Tokens, row.Rep))
	}
	if want := []string{"8/1", "16/1", "8/2", "16/2"}; !slices.Equal(reps, want) || rec.Config.Count != 2 || rec.Incomplete {
		t.Errorf("JSON rows (tokens/rep) %v, count %d, incomplete %v; want %v, 2, false", reps, rec.Config.Count, rec.Incomplete, want)
	}
	for _, want := range []string{"eprun: rep 1/2 case 1/2 setup (", "eprun: rep 2/2 case 2/2 dispatch ("} {
		if !strings.Contains(stderr, want) {
			t.Errorf("progress lacks %q:\n%s", want, stderr)
		}
	}
}

// TestCheckCount: eprun check --count N checks every case N times, and
// its summary counts the cases once and the rows of every repetition.
func TestCheckCount(t *testing.T) {
	one, _ := eprunOK(t, "check", "tiny", "-q", "--tokens", "0,16")
	three, _ := eprunOK(t, "check", "tiny", "-q", "--tokens", "0,16", "--count", "3")
	rows := func(s string) map[string][]string {
		out := map[string][]string{}
		for _, l := range strings.Split(strings.TrimSpace(s), "\n") {
			if f := strings.Fields(l); !strings.HasPrefix(l, "#") && len(f) == 4 {
				out[f[0]] = f[1:]
			}
		}
		return out
	}
	r1, r3 := rows(one), rows(three)
	if len(r3) != len(bench.AllCalls) || !strings.Contains(three, "  count 3  ") {
		t.Fatalf("check --count 3: %v:\n%s", r3, three)
	}
	for call, f := range r3 {
		n1, _ := strconv.Atoi(r1[call][1])
		n3, _ := strconv.Atoi(f[1])
		if f[0] != "2" || n1 == 0 || n3 != 3*n1 || f[2] != "0" {
			t.Errorf("%s: cases %s, rows %d, wrong %s; want 2 cases, 3 x %d rows, 0 wrong", call, f[0], n3, f[2], n1)
		}
	}
	checkWidth(t, three)
}

// TestProgressETA: once an iteration is done, every progress line (a new
// step's and the heartbeat's) says how long the run has left: the time
// spent scaled by the work left to the work done; before that, none does.
// With several repetitions the line names the repetition.
func TestProgressETA(t *testing.T) {
	w := make(lineWriter, 16)
	ticks := make(chan time.Time)
	stopped := make(chan struct{})
	p := newProgressEvery(w, ticks, func() { close(stopped) })
	defer func() { p.finish(); <-stopped }()
	p.mu.Lock()
	p.start = time.Now().Add(-10 * time.Second) // 10 s spent
	p.mu.Unlock()
	p.update(bench.Progress{Case: 1, Cases: 4, Rep: 1, Reps: 1, Step: "setup", TotalWork: 400})
	if got := <-w; !strings.HasPrefix(got, "eprun: case 1/4 setup (1") || strings.Contains(got, "eta") {
		t.Errorf("before any work: %q, want no eta", got)
	}
	// A quarter done in 10 s: 30 s left.
	p.update(bench.Progress{Case: 2, Cases: 4, Rep: 2, Reps: 6, Step: "dispatch", Done: 10, Total: 40, Work: 100, TotalWork: 400})
	if got := <-w; !strings.HasPrefix(got, "eprun: rep 2/6 case 2/4 dispatch (1") || !strings.HasSuffix(got, "s, eta 30s)\n") {
		t.Errorf("a quarter done: %q, want rep 2/6 and eta 30s", got)
	}
	ticks <- time.Now().Add(heartbeat + time.Second)
	ticks <- time.Now().Add(heartbeat + 2*time.Second)
	if got := <-w; !strings.Contains(got, "eprun: still in rep 2/6 case 2/4 dispatch, 10 of 40 iterations done (") || !strings.Contains(got, ", eta ") {
		t.Errorf("heartbeat %q, want the step and an eta", got)
	}
	for _, tc := range []struct {
		d    time.Duration
		want string
	}{
		{400 * time.Millisecond, "0s"}, {59 * time.Second, "59s"}, {59600 * time.Millisecond, "1m00s"},
		{4*time.Minute + 5*time.Second, "4m05s"}, {2*time.Hour + 10*time.Minute + 20*time.Second, "2h10m"},
	} {
		if got := shortDuration(tc.d); got != tc.want {
			t.Errorf("shortDuration(%v) = %q, want %q", tc.d, got, tc.want)
		}
	}
}
