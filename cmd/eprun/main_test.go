package main

import (
	"bufio"
	"bytes"
	"encoding/csv"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/goep/goep/internal/bench"
)

// eprun runs the command in-process and returns its exit status, stdout
// and stderr.
func eprun(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := run(t.Context(), args, &out, &errb)
	return code, out.String(), errb.String()
}

// eprunOK is eprun for a command that must succeed: it fails the test on
// a non-zero exit status and returns stdout and stderr.
func eprunOK(t *testing.T, args ...string) (string, string) {
	t.Helper()
	code, stdout, stderr := eprun(t, args...)
	if code != 0 {
		t.Fatalf("eprun %s: exit %d: %s\n%s", strings.Join(args, " "), code, stderr, stdout)
	}
	return stdout, stderr
}

// writeFile writes data to a file name of dir and returns its path.
func writeFile(t *testing.T, dir, name, data string) string {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// readRecord reads the JSON record eprun bench --json wrote to path.
func readRecord(t *testing.T, path string) bench.Record {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var rec bench.Record
	if err := json.Unmarshal(data, &rec); err != nil {
		t.Fatalf("JSON record %s does not parse: %v", path, err)
	}
	return rec
}

// readCSV reads the CSV eprun wrote to path and checks its header.
func readCSV(t *testing.T, path string) [][]string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	recs, err := csv.NewReader(f).ReadAll()
	if err != nil || len(recs) == 0 || !slices.Equal(recs[0], bench.CSVColumns) {
		t.Fatalf("CSV %s: %v, %d records", path, err, len(recs))
	}
	return recs
}

// tableRows reads the table of eprun bench: it checks that the column
// header ("# call ...") has cols columns, the swept ones right after dtype,
// and that every row has cols fields and #wrong 0, and returns the
// header's columns and each row's fields.
func tableRows(t *testing.T, table string, cols int, swept ...string) (header []string, rows [][]string) {
	t.Helper()
	for _, l := range strings.Split(strings.TrimSpace(table), "\n") {
		f := strings.Fields(l)
		switch {
		case strings.HasPrefix(l, "# call"):
			header = f[1:]
			if len(header) != cols || !slices.Equal(header[5:5+len(swept)], swept) {
				t.Errorf("column header %q: want %d columns, %v after dtype", l, cols, swept)
			}
		case strings.HasPrefix(l, "#"):
		case len(f) != cols || f[len(f)-1] != "0":
			t.Errorf("row %q: want %d columns, #wrong 0", l, cols)
		default:
			rows = append(rows, f)
		}
	}
	return header, rows
}

// tiny is a bench command line that runs in well under a second.
var tiny = []string{"bench", "tiny", "-q", "--iters", "2", "--warmup", "1"}

func TestBadUsage(t *testing.T) {
	dir := t.TempDir()
	badYAML := writeFile(t, dir, "bad.yaml", "ranks: 4\nbogus: 1\n")
	fp8YAML := writeFile(t, dir, "fp8.yaml", "ranks: 4\nexperts: 8\ndtype: [bf16, fp8]\nhidden: 96\n")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"bench", "--no-such-flag"}, "unknown flag: --no-such-flag"},
		{[]string{"bench", "--ranks", "two"}, `invalid argument "two"`},
		{[]string{"bench", "--ranks", "3"}, "not a multiple of ranks 3"},
		{[]string{"bench", "--dtype", "fp16"}, `dtype "fp16": want bf16, fp32 or fp8`},
		// fp8 has one fp32 scale per 128 channels: every hidden of the
		// sweep must be a multiple of 128, in a YAML config too.
		{[]string{"bench", "tiny", "--dtype", "fp8"}, "the case dtype=fp8 hidden=64: fp8 needs hidden to be a multiple of 128"},
		{[]string{"bench", "--dtype", "bf16,fp8", "--hidden", "100,128"}, "the case dtype=fp8 hidden=100: "},
		{[]string{"check", "--dtype", "fp8", "--hidden", "128,200"}, "the case dtype=fp8 hidden=200: "},
		{[]string{"bench", fp8YAML}, "the case dtype=fp8 hidden=96: "},
		{[]string{"bench", "--format", "xml"}, `--format "xml"`},
		{[]string{"bench", "--sms=-1"}, "sms -1: cannot be negative"},
		{[]string{"bench", "--sms", "2,-4"}, "sms -4: cannot be negative"},
		{[]string{"bench", "--sms", "many"}, `invalid argument "many"`},
		{[]string{"bench", "--chunk-rows=-8"}, "chunk_rows -8: cannot be negative"},
		{[]string{"bench", "--chunk-rows", "4,x"}, `invalid argument "4,x"`},
		{[]string{"check", "--chunk-rows", "0,-1"}, "chunk_rows -1: cannot be negative"},
		// Sizes no machine's memory holds: refused before anything is
		// allocated (a Go allocation beyond memory is a fatal error).
		{[]string{"bench", "--tokens", "100000", "--hidden", "1073741824"}, "of host memory for its 8 rank(s) in this process"},
		{[]string{"check", "tiny", "--tokens", "100000", "--hidden", "1073741824"}, "needs at least"},
		// Every size in the estimate, pad and the capacities too; a flag
		// runs it anyway.
		{[]string{"check", "tiny", "--tokens", "64", "--hidden", "1048576", "--pad", "1000000"}, "permuted rows a rank"},
		{[]string{"bench", "tiny", "--hidden", "1048576", "--mode", "capacity", "--max-permuted-tokens", "100000000"}, "outputs of capacity 128 and 100000000 rows"},
		{[]string{"check", "tiny", "--tokens", "64", "--hidden", "1048576", "--pad", "1000000"}, "(--force-memory runs it anyway, --scale-to-fit runs it scaled down)"},
		// Values that cannot work, refused with their reason by bench and
		// check alike.
		{[]string{"bench", "tiny", "--max-recv-tokens", "5"}, "max_recv_tokens 5: the capacities size the outputs of capacity mode, and no case runs in it"},
		{[]string{"check", "tiny", "--max-recv-tokens", "5"}, "max_recv_tokens 5: the capacities size the outputs of capacity mode, and no case runs in it"},
		{[]string{"check", "tiny", "--max-permuted-tokens", "5", "--mode", "blocking"}, "max_permuted_tokens 5: the capacities size"},
		{[]string{"bench", "tiny", "--pad", "1000000000"}, "pad=1000000000 may permute 6000000250 rows a rank"},
		{[]string{"check", "tiny", "--pad", "1000000000"}, "pad=1000000000 may permute 6000000250 rows a rank"},
		{[]string{"check", "tiny", "--pad", "1073741825"}, "a size is 1073741825"},
		{[]string{"bench", "tiny", "--tokens", "300000000"}, "ranks 4 x tokens 300000000 = 1200000000 rows a rank may receive"},
		{[]string{"check", "tiny", "--pad", "0"}, "pad is 0"},
		{[]string{"check", "tiny", "--pad=-3"}, "pad is -3"},
		{[]string{"bench", "tiny", "--ranks", "0"}, "ranks is 0"},
		{[]string{"check", "tiny", "--experts", "0"}, "experts is 0"},
		{[]string{"check", "tiny", "--topk", "0"}, "topk is 0"},
		{[]string{"bench", "tiny", "--hidden", "0"}, "hidden 0: need at least 1"},
		{[]string{"check", "tiny", "--tokens=-1"}, "tokens -1: cannot be negative"},
		{[]string{"bench", "tiny", "--iters", "0"}, "iters is 0"},
		{[]string{"bench", "tiny", "--count", "0"}, "count is 0; need at least 1"},
		{[]string{"check", "tiny", "--count=-2"}, "count is -2; need at least 1"},
		{[]string{"bench", "tiny", "--count", "10001"}, "count is 10001; at most 10000 (every repetition's rows are kept)"},
		{[]string{"bench", "tiny", "--count", "5000", "--tokens", "1,2,3"}, "the sweep's 3 cases run count 5000 times, more than 10000 case runs"},
		{[]string{"bench", "tiny", "--count", "many"}, `invalid argument "many"`},
		{[]string{"bench", "tiny", "--wide", "--format", "gobench"}, "--wide is for --format table"},
		{[]string{"check", "tiny", "--warmup=-1"}, "warmup is -1"},
		{[]string{"check", "tiny", "--mode", "capacity", "--max-recv-tokens=-1"}, "cannot be negative"},
		{[]string{"bench", "tiny", "--routing", "zipf", "--zipf-s=-1"}, "zipf_s > 0"},
		{[]string{"check", "tiny", "--calls="}, "calls is empty"},
		{[]string{"bench", "no/such/config.yaml"}, "no such file"},
		{[]string{"bench", badYAML}, "field bogus not found"},
		{[]string{"bench", "a.yaml", "b.yaml"}, "accepts at most 1 arg"},
		{[]string{"frobnicate"}, "unknown command"},
		{[]string{"bench", "tiny", "--cpuprofile", filepath.Join(dir, "no-such-dir", "cpu.prof")}, "--cpuprofile: open " + dir},
	} {
		code, stdout, stderr := eprun(t, tc.args...)
		if code != 2 {
			t.Errorf("%v: exit %d, want 2", tc.args, code)
		}
		if stdout != "" {
			t.Errorf("%v: wrote to stdout: %q", tc.args, stdout)
		}
		if !strings.HasPrefix(stderr, "eprun: ") || strings.Count(stderr, "\n") != 1 || !strings.Contains(stderr, tc.want) {
			t.Errorf("%v: stderr %q, want one line \"eprun: ...%s...\"", tc.args, stderr, tc.want)
		}
		if strings.Contains(stderr, "goroutine ") || strings.Contains(stderr, "Usage:") {
			t.Errorf("%v: stderr has a stack trace or usage: %q", tc.args, stderr)
		}
	}
}

func TestBenchTable(t *testing.T) {
	stdout, stderr := eprunOK(t, tiny...)
	if stderr != "" {
		t.Errorf("-q still wrote to stderr: %q", stderr)
	}
	for _, want := range []string{"# call", "time_us", "p99_us", "nvl_GBps", "ratio", "vs_a2a", "#wrong", "launcher in-process", "a2a over local", "dispatch", "combine", "dispatch-permute", "unpermute-combine", "# check: OK",
		"\n# --wide adds baseline_GBps, a2a_us, a2a_GBps; --json and --csv have every field\n"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("table lacks %q:\n%s", want, stdout)
		}
	}
	if header, rows := tableRows(t, stdout, 11); len(rows) != 4 || slices.Contains(header, "a2a_us") {
		t.Errorf("%d rows, columns %v; want 4, without the wide table's:\n%s", len(rows), header, stdout)
	}
	checkWidth(t, stdout)

	// --wide: every column, as the table had them all before it had a
	// default narrower than them.
	stdout, _ = eprunOK(t, append(slices.Clone(tiny), "--wide")...)
	header, rows := tableRows(t, stdout, 15)
	if want := []string{"call", "tokens", "hidden", "topk", "dtype", "time_us", "p99_us", "nvl_GBps", "rdma_GBps", "baseline_GBps", "ratio", "a2a_us", "a2a_GBps", "vs_a2a", "#wrong"}; !slices.Equal(header, want) || len(rows) != 4 {
		t.Errorf("--wide: columns %v, %d rows; want %v, 4 rows", header, len(rows), want)
	}
	if strings.Contains(stdout, "--wide adds") || strings.Contains(stdout, "\n#   ") {
		t.Errorf("--wide: the footer is folded or names columns left out:\n%s", stdout)
	}
}

// unfold joins each continuation line ("#   ...") of a folded comment
// line to the line it continues, with the two spaces that separate the
// fields of a header line (where the fold of a long header line breaks).
func unfold(s string) string { return strings.ReplaceAll(s, "\n#   ", "  ") }

// checkWidth fails t if a line of out is wider than the default table's
// width.
func checkWidth(t *testing.T, out string) {
	t.Helper()
	for _, l := range strings.Split(strings.TrimSuffix(out, "\n"), "\n") {
		if n := utf8.RuneCountInString(l); n > bench.TableWidth {
			t.Errorf("a line of %d columns, more than %d: %q", n, bench.TableWidth, l)
		}
	}
}

// TestCPUProfile: --cpuprofile writes a Go CPU profile (gzip-compressed
// protobuf) of the command, also when the command fails.
func TestCPUProfile(t *testing.T) {
	if f := flag.Lookup("test.cpuprofile"); f != nil && f.Value.String() != "" {
		t.Skip("go test's own -cpuprofile holds the process's one CPU profile")
	}
	dir := t.TempDir()
	for _, tc := range []struct {
		args []string
		code int
	}{
		{tiny, 0},
		{[]string{"bench", "tiny", "-q", "--iters", "0"}, 2},
	} {
		path := filepath.Join(dir, fmt.Sprintf("cpu%d.prof", tc.code))
		code, _, stderr := eprun(t, append(tc.args, "--cpuprofile", path)...)
		if code != tc.code {
			t.Fatalf("%v: exit %d, want %d: %s", tc.args, code, tc.code, stderr)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if len(b) < 2 || b[0] != 0x1f || b[1] != 0x8b {
			t.Fatalf("%v: the profile (%d bytes) is not gzip data", tc.args, len(b))
		}
	}
}

func TestBenchJSON(t *testing.T) {
	path := filepath.Join(t.TempDir(), "out.json")
	_, stderr := eprunOK(t, append(tiny, "--json", path, "--tokens", "8,16", "--calls", "dispatch,combine")...)
	rec := readRecord(t, path)
	if rec.Env.Backend != "host" || rec.Env.GoVersion == "" || rec.Env.GOMAXPROCS < 1 || rec.Env.GoepVersion == "" {
		t.Errorf("env %+v", rec.Env)
	}
	if rec.Config.Ranks != 4 || len(rec.Config.Tokens) != 2 || rec.Config.Iters != 2 {
		t.Errorf("config %+v: flags were not applied", rec.Config)
	}
	if len(rec.Rows) != 4 || rec.Wrong != 0 || rec.CheckedRows == 0 || rec.Error != "" {
		t.Errorf("%d rows, %d of %d wrong, error %q", len(rec.Rows), rec.Wrong, rec.CheckedRows, rec.Error)
	}
	for _, r := range rec.Rows {
		if r.Time.N != 2 || r.Time.Median <= 0 || r.NVLGBps <= 0 || r.A2A == nil || r.A2AGBps <= 0 {
			t.Errorf("row %+v", r)
		}
	}
	if rec.Launcher != "in-process" || rec.Processes != 1 || rec.Timing != bench.TimingSpan || rec.BaselineA2ATransport != "local" {
		t.Errorf("launcher %q, processes %d, timing %q, a2a transport %q", rec.Launcher, rec.Processes, rec.Timing, rec.BaselineA2ATransport)
	}

	// --json - puts the JSON on stdout and the table on stderr.
	stdout, stderr := eprunOK(t, append(tiny, "--json", "-")...)
	if err := json.Unmarshal([]byte(stdout), &rec); err != nil {
		t.Errorf("--json -: stdout is not JSON: %v", err)
	}
	if !strings.Contains(stderr, "# check: OK") {
		t.Errorf("--json -: table not on stderr: %q", stderr)
	}
}

// TestBenchGoBench checks that every result line follows the Go benchmark
// format benchstat reads: Benchmark<name> <iterations> (<value> <unit>)+.
func TestBenchGoBench(t *testing.T) {
	stdout, _ := eprunOK(t, append(tiny, "--format=gobench")...)
	var names []string
	sc := bufio.NewScanner(strings.NewReader(stdout))
	for sc.Scan() {
		l := sc.Text()
		if !strings.HasPrefix(l, "Benchmark") {
			if k, _, ok := strings.Cut(l, ": "); !ok || strings.ContainsAny(k, " \t") {
				t.Errorf("line %q is neither a result nor a key: value line", l)
			}
			continue
		}
		f := strings.Fields(l)
		if len(f) < 4 || len(f)%2 != 0 {
			t.Errorf("line %q: want name, iterations and value-unit pairs", l)
			continue
		}
		if n, err := strconv.Atoi(f[1]); err != nil || n != 2 {
			t.Errorf("line %q: iterations %q, want 2", l, f[1])
		}
		units := map[string]float64{}
		for i := 2; i < len(f); i += 2 {
			v, err := strconv.ParseFloat(f[i], 64)
			if err != nil {
				t.Errorf("line %q: value %q: %v", l, f[i], err)
			}
			units[f[i+1]] = v
		}
		if units["ns/op"] <= 0 || units["MB/s"] <= 0 {
			t.Errorf("line %q: want positive ns/op and MB/s", l)
		}
		names = append(names, strings.SplitN(f[0], "/", 2)[0])
	}
	want := []string{"BenchmarkDispatch", "BenchmarkA2ADispatch", "BenchmarkCombine", "BenchmarkA2ACombine", "BenchmarkDispatchPermute", "BenchmarkA2ADispatchPermute", "BenchmarkUnpermuteCombine", "BenchmarkA2AUnpermuteCombine", "BenchmarkBaseline"}
	if strings.Join(names, " ") != strings.Join(want, " ") {
		t.Errorf("benchmarks %v, want %v", names, want)
	}
	if !strings.Contains(stdout, "BenchmarkDispatch/ranks=4/tokens=32/hidden=64/topk=2/dtype=bf16/routing=uniform-") {
		t.Errorf("names lack the case keys:\n%s", stdout)
	}
}

func TestEmbeddedConfigsValid(t *testing.T) {
	for _, name := range embeddedNames() {
		c, err := loadConfig(name)
		if err == nil {
			err = c.Validate()
		}
		if err != nil {
			t.Errorf("embedded config %s: %v", name, err)
		}
	}
	if c, err := loadConfig(""); err != nil || c.Ranks != 8 {
		t.Errorf("default config: %+v, %v", c, err)
	}
	// The copy in configs/ is what is embedded, and is found by path too.
	if _, err := loadConfig("configs/tiny.yaml"); err != nil {
		t.Error(err)
	}
}

func TestVersion(t *testing.T) {
	code, stdout, stderr := eprun(t, "version")
	if code != 0 || !strings.HasPrefix(stdout, "goep ") || !strings.Contains(stdout, "go1.") {
		t.Errorf("exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
}
