package bench

import (
	"bytes"
	"encoding/csv"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"
)

// TestRDMALines: with several domains the table's footer has one rdma line
// per case, with the bytes of a one-way call (dispatch-combine's halved),
// none for a case of 0 tokens, and none at all with one domain.
func TestRDMALines(t *testing.T) {
	c := Defaults()
	c.Ranks, c.RanksPerDomain = 8, 4
	rows := []Row{
		// tokens 256: dispatch-combine first, its bytes count twice.
		{Call: CallDispatchCombine, Tokens: 256, Hidden: 2048, DType: "bf16", RDMABytes: 4e6, RDMAGBps: 1, RDMACrossBytes: 2e6, RDMAFlatBytes: 5.5e6},
		{Call: CallDispatch, Tokens: 256, Hidden: 2048, DType: "bf16", RDMABytes: 2e6, RDMAGBps: 1, RDMACrossBytes: 1e6, RDMAFlatBytes: 2.75e6},
		// tokens 0: nothing to count, no line.
		{Call: CallDispatch, Tokens: 0, Hidden: 2048, DType: "bf16"},
		// every token stays in its domain.
		{Call: CallDispatch, Tokens: 4, Hidden: 16, DType: "fp32", RDMABytes: 256, RDMAGBps: 1},
	}
	want := "# rdma tokens 256 hidden 2048 bf16: 1.00 MB cross domains per rank per one-way call (each token once per remote domain; rdma_GBps counts 2.00 MB, own domain included); the flat scheme (every token to every remote rank) would send 2.75 MB, 2.75x as much\n" +
		"# rdma tokens 4 hidden 16 fp32: no token leaves its domain (rdma_GBps counts 256 B per rank per one-way call, own domain included)\n"
	if got := rdmaLines(rows); got != want {
		t.Errorf("rdmaLines:\n%s\nwant:\n%s", got, want)
	}

	var b bytes.Buffer
	if err := WriteTable(&b, Record{Config: c, Rows: rows[1:2]}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "\n# rdma tokens 256 hidden 2048 bf16: 1.00 MB cross domains") {
		t.Errorf("table has no rdma line:\n%s", b.String())
	}

	one := []Row{{Call: CallDispatch, Tokens: 256, Hidden: 2048, DType: "bf16"}}
	b.Reset()
	if err := WriteTable(&b, Record{Config: Defaults(), Rows: one}); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(b.String(), "# rdma") {
		t.Errorf("one domain, but the table has an rdma line:\n%s", b.String())
	}
}

func TestPeerLine(t *testing.T) {
	rows := []Row{{NVLBytes: 300, NVLPeerBytes: 100}, {NVLBytes: 100, NVLPeerBytes: 100}}
	if got := peerLine(rows); !strings.Contains(got, " 50.0% of the received bytes") {
		t.Errorf("peerLine: %q, want 50.0%%", got)
	}
	if got := peerLine([]Row{{}}); got != "" {
		t.Errorf("peerLine of rows that received nothing: %q, want none", got)
	}
}

func TestByteSize(t *testing.T) {
	for _, tc := range []struct {
		x    float64
		want string
	}{
		{0, "0 B"}, {999, "999 B"}, {1000, "1.00 kB"}, {1.5e6, "1.50 MB"}, {2.25e9, "2.25 GB"},
	} {
		if got := byteSize(tc.x); got != tc.want {
			t.Errorf("byteSize(%v) = %q, want %q", tc.x, got, tc.want)
		}
	}
}

// TestTableAndGoBenchSweepModes: rows of a sweep over mode and top-k are
// told apart in the table (a mode column, only then), the footer and
// benchstat's view of --format=gobench (a mode: line per mode).
func TestTableAndGoBenchSweepModes(t *testing.T) {
	row := func(mode string, topk int) Row {
		return Row{Call: CallDispatch, Ranks: 4, Tokens: 32, Hidden: 64, TopK: topk, DType: "bf16", Mode: mode,
			Time: Stats{N: 2, Median: 10 * float64(topk)}, NVLGBps: float64(topk), Baseline: Stats{N: 2, Median: 1}, BaselineGBps: 1, Ratio: float64(topk)}
	}
	c := Defaults()
	c.TopK, c.Mode = Ints{2, 4}, Strings{ModeBlocking, ModeCapacity}
	swept := Record{Config: c, Rows: []Row{row(ModeBlocking, 2), row(ModeBlocking, 4), row(ModeCapacity, 2), row(ModeCapacity, 4)}}
	one := Record{Config: Defaults(), Rows: []Row{row(ModeBlocking, 8)}}

	var b bytes.Buffer
	if err := WriteTable(&b, swept); err != nil {
		t.Fatal(err)
	}
	table := b.String()
	for _, want := range []string{
		"  topk 2,4  mode blocking,capacity  ",
		" dtype mode         time_us",
		"\n  dispatch               32      64     2  bf16 blocking        20.0",
		"\n  dispatch               32      64     4  bf16 capacity        40.0",
		"min 2.00 (dispatch, tokens 32, topk 2, blocking), geomean 2.83, max 4.00 (dispatch, tokens 32, topk 4, blocking)",
	} {
		if !strings.Contains(table, want) {
			t.Errorf("swept table lacks %q:\n%s", want, table)
		}
	}
	b.Reset()
	if err := WriteTable(&b, one); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"  topk 8  mode blocking  ", " dtype     time_us", "max 8.00 (dispatch, tokens 32)\n"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("one-mode table lacks %q:\n%s", want, b.String())
		}
	}
	for _, l := range strings.Split(b.String(), "\n") {
		if strings.HasPrefix(l, "# call") && strings.Contains(l, "mode") {
			t.Errorf("one-mode table has a mode column: %q", l)
		}
	}

	b.Reset()
	if err := WriteGoBench(&b, swept); err != nil {
		t.Fatal(err)
	}
	if got := strings.Count(b.String(), "\nmode: "); got != 2 {
		t.Errorf("%d mode: lines, want 2 (one per mode):\n%s", got, b.String())
	}
	var names []string
	mode := ""
	for _, l := range strings.Split(b.String(), "\n") {
		if m, ok := strings.CutPrefix(l, "mode: "); ok {
			mode = m
		}
		if strings.HasPrefix(l, "Benchmark") {
			names = append(names, mode+" "+strings.Fields(l)[0])
		}
	}
	want := []string{
		"blocking BenchmarkDispatch/ranks=4/tokens=32/hidden=64/topk=2/dtype=bf16/routing=uniform-0",
		"blocking BenchmarkBaseline/ranks=4/tokens=32/hidden=64/topk=2/dtype=bf16/routing=uniform-0",
		"blocking BenchmarkDispatch/ranks=4/tokens=32/hidden=64/topk=4/dtype=bf16/routing=uniform-0",
		"blocking BenchmarkBaseline/ranks=4/tokens=32/hidden=64/topk=4/dtype=bf16/routing=uniform-0",
		"capacity BenchmarkDispatch/ranks=4/tokens=32/hidden=64/topk=2/dtype=bf16/routing=uniform-0",
		"capacity BenchmarkBaseline/ranks=4/tokens=32/hidden=64/topk=2/dtype=bf16/routing=uniform-0",
		"capacity BenchmarkDispatch/ranks=4/tokens=32/hidden=64/topk=4/dtype=bf16/routing=uniform-0",
		"capacity BenchmarkBaseline/ranks=4/tokens=32/hidden=64/topk=4/dtype=bf16/routing=uniform-0",
	}
	if strings.Join(names, "\n") != strings.Join(want, "\n") {
		t.Errorf("gobench results (mode, name):\n%s\nwant:\n%s", strings.Join(names, "\n"), strings.Join(want, "\n"))
	}
}

// TestRDMALinesSweep: with several top-k and modes, each case has its own
// rdma line, naming its top-k and mode.
func TestRDMALinesSweep(t *testing.T) {
	row := func(mode string, topk int) Row {
		return Row{Call: CallDispatch, Tokens: 4, Hidden: 16, TopK: topk, DType: "fp32", Mode: mode, RDMABytes: 256, RDMAGBps: 1}
	}
	got := rdmaLines([]Row{row(ModeBlocking, 2), row(ModeBlocking, 4), row(ModeCapacity, 2)})
	for _, want := range []string{"# rdma tokens 4 hidden 16 fp32 topk 2 blocking: ", "# rdma tokens 4 hidden 16 fp32 topk 4 blocking: ", "# rdma tokens 4 hidden 16 fp32 topk 2 capacity: "} {
		if !strings.Contains(got, want) {
			t.Errorf("rdma lines lack %q:\n%s", want, got)
		}
	}
	if n := strings.Count(got, "\n"); n != 3 {
		t.Errorf("%d rdma lines, want 3:\n%s", n, got)
	}
}

// TestDomainsOfRows: the table's header and the CSV give the D the engine
// ran with (the rows'), not the config's 0, which left D to the engine
// (here it found two domains of 2, as one host per domain would); with no
// rows, the config's.
func TestDomainsOfRows(t *testing.T) {
	// Unset for this test (t.Setenv restores it after): D comes from the
	// rows, never from the environment.
	t.Setenv("GOEP_RANKS_PER_DOMAIN", "")
	os.Unsetenv("GOEP_RANKS_PER_DOMAIN")
	c := Defaults()
	c.Ranks, c.RanksPerDomain = 4, 0
	rows := []Row{{Call: CallDispatch, Ranks: 4, Tokens: 32, Hidden: 64, TopK: 2, DType: "bf16", Mode: ModeBlocking, RanksPerDomain: 2}}
	var b bytes.Buffer
	if err := WriteTable(&b, Record{Config: c, Rows: rows}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "# ranks 4 (2 domains of 2)  ") {
		t.Errorf("table header does not give the engine's D:\n%s", b.String())
	}
	b.Reset()
	if err := WriteCSV(&b, Record{Config: c, Rows: rows}); err != nil {
		t.Fatal(err)
	}
	recs, err := csv.NewReader(&b).ReadAll()
	if err != nil || len(recs) != 2 {
		t.Fatalf("CSV: %v, %d records", err, len(recs))
	}
	if d := recs[1][slices.Index(CSVColumns, "ranks_per_domain")]; d != "2" {
		t.Errorf("CSV ranks_per_domain %s, want the engine's 2", d)
	}

	// No rows: the config's D.
	c.RanksPerDomain = 2
	b.Reset()
	if err := WriteTable(&b, Record{Config: c}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "# ranks 4 (2 domains of 2)  ") {
		t.Errorf("no rows: table header does not give the config's D:\n%s", b.String())
	}
}

// TestOutputsSweepKnobs: rows of a sweep over the tuning knobs are told
// apart in the table (an sms and a chunk column, only then), the footer's
// labels, the CSV's last two columns and the gobench names; a single
// value that is not the default is named in the header line and the
// gobench names, the default nowhere (names stay as they were).
func TestOutputsSweepKnobs(t *testing.T) {
	row := func(sms, chunk int) Row {
		return Row{Call: CallDispatch, Ranks: 4, Tokens: 32, Hidden: 64, TopK: 2, DType: "bf16", Mode: ModeBlocking, SMs: sms, ChunkRows: chunk,
			Time: Stats{N: 2, Median: 10 + float64(sms+chunk)}, NVLGBps: float64(1 + sms + chunk), Baseline: Stats{N: 2, Median: 1}, BaselineGBps: 1, Ratio: float64(1 + sms + chunk),
			RDMABytes: 256, RDMAGBps: 1, RanksPerDomain: 2}
	}
	c := Defaults()
	c.Ranks, c.TopK, c.SMs, c.ChunkRows = 4, Ints{2}, Ints{1, 2}, Ints{0, 8}
	swept := Record{Config: c, Rows: []Row{row(1, 0), row(1, 8), row(2, 0), row(2, 8)}}
	c1 := Defaults()
	c1.Ranks, c1.TopK, c1.SMs, c1.ChunkRows = 4, Ints{2}, Ints{8}, Ints{4}
	single := Record{Config: c1, Rows: []Row{row(8, 4)}}
	c0 := Defaults()
	c0.Ranks, c0.TopK = 4, Ints{2}
	plain := Record{Config: c0, Rows: []Row{row(0, 0)}}

	table := func(rec Record) string {
		var b bytes.Buffer
		if err := WriteTable(&b, rec); err != nil {
			t.Fatal(err)
		}
		return b.String()
	}
	columns := func(s string) []string {
		for _, l := range strings.Split(s, "\n") {
			if strings.HasPrefix(l, "# call") {
				return strings.Fields(l)[1:]
			}
		}
		return nil
	}

	got := table(swept)
	if cols := columns(got); len(cols) != 17 || cols[5] != "sms" || cols[6] != "chunk" {
		t.Errorf("swept: columns %v, want sms and chunk after dtype", cols)
	}
	for _, want := range []string{
		"  routing uniform  sms 1,2  chunk_rows 0,8\n",
		"\n  dispatch               32      64     2  bf16     1      8        19.0",
		"\n  dispatch               32      64     2  bf16     2      0        12.0",
		"min 2.00 (dispatch, tokens 32, sms 1, chunk 0), geomean ",
		"max 11.00 (dispatch, tokens 32, sms 2, chunk 8)",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("swept table lacks %q:\n%s", want, got)
		}
	}
	// The knobs do not change the bytes: one rdma line for the four cases.
	if n := strings.Count(got, "\n# rdma "); n != 1 {
		t.Errorf("%d rdma lines, want 1:\n%s", n, got)
	}

	for name, tc := range map[string]struct {
		rec    Record
		header string // "": the header line names no knob
	}{"single": {single, "  routing uniform  sms 8  chunk_rows 4\n"}, "default": {plain, ""}} {
		got := table(tc.rec)
		if cols := columns(got); len(cols) != 15 || slices.Contains(cols, "sms") || slices.Contains(cols, "chunk") {
			t.Errorf("%s: columns %v, want 15 and no knob", name, cols)
		}
		if tc.header != "" && !strings.Contains(got, tc.header) {
			t.Errorf("%s: header lacks %q:\n%s", name, tc.header, got)
		}
		if tc.header == "" && (strings.Contains(got, "sms") || strings.Contains(got, "chunk")) {
			t.Errorf("%s: the table names a knob at its default:\n%s", name, got)
		}
	}

	var b bytes.Buffer
	if err := WriteCSV(&b, swept); err != nil {
		t.Fatal(err)
	}
	recs, err := csv.NewReader(&b).ReadAll()
	if err != nil || len(recs) != 5 {
		t.Fatalf("CSV: %v, %d records", err, len(recs))
	}
	n := slices.Index(CSVColumns, "sms") + 2 // sms and chunk_rows, then the columns added after them
	if h := recs[0]; n < 3 || h[n-2] != "sms" || h[n-1] != "chunk_rows" || h[n-3] != "rdma_flat_bytes_per_rank" {
		t.Errorf("CSV header %v: want sms, chunk_rows after the columns of before", h)
	}
	var cells []string
	for _, r := range recs[1:] {
		cells = append(cells, r[n-2]+"/"+r[n-1])
	}
	if want := []string{"1/0", "1/8", "2/0", "2/8"}; !slices.Equal(cells, want) {
		t.Errorf("CSV sms/chunk_rows %v, want %v", cells, want)
	}

	names := func(rec Record) []string {
		var b bytes.Buffer
		if err := WriteGoBench(&b, rec); err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, l := range strings.Split(b.String(), "\n") {
			if strings.HasPrefix(l, "Benchmark") {
				out = append(out, strings.Fields(l)[0])
			}
		}
		return out
	}
	const base = "/ranks=4/tokens=32/hidden=64/topk=2/dtype=bf16/routing=uniform"
	var want []string
	for _, k := range []string{"/sms=1/chunk=0", "/sms=1/chunk=8", "/sms=2/chunk=0", "/sms=2/chunk=8"} {
		want = append(want, "BenchmarkDispatch"+base+k+"-0", "BenchmarkBaseline"+base+k+"-0")
	}
	if got := names(swept); !slices.Equal(got, want) {
		t.Errorf("swept gobench names\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if got, want := names(single), []string{"BenchmarkDispatch" + base + "/sms=8/chunk=4-0", "BenchmarkBaseline" + base + "/sms=8/chunk=4-0"}; !slices.Equal(got, want) {
		t.Errorf("single gobench names %v, want %v", got, want)
	}
	if got, want := names(plain), []string{"BenchmarkDispatch" + base + "-0", "BenchmarkBaseline" + base + "-0"}; !slices.Equal(got, want) {
		t.Errorf("default gobench names %v, want %v (as before the knobs)", got, want)
	}
	// One knob swept, the other at its default: only the swept one named.
	half := Record{Config: c, Rows: []Row{row(1, 0), row(2, 0)}}
	if got := names(half); len(got) != 4 || !strings.HasSuffix(got[0], "/routing=uniform/sms=1-0") {
		t.Errorf("sms swept, chunk 0: names %v, want /sms=1 and no chunk", got)
	}
}

// TestOutputsFP8: an fp8 case's rows (fp8 dispatch, bf16 combine) are one
// case: gobench gives it a copy baseline per dtype, the bf16 case after
// it one; the table shows each row's dtype and the fp8 footer line, which a
// run without fp8 lacks; rows of records written before case_dtype are
// cases by their dtype.
func TestOutputsFP8(t *testing.T) {
	row := func(call, caseDT, dt string, base float64) Row {
		return Row{Call: call, Ranks: 4, Tokens: 32, Hidden: 128, TopK: 2, DType: dt, CaseDType: caseDT, Mode: ModeBlocking,
			Time: Stats{N: 2, Median: 10}, NVLGBps: 1, Baseline: Stats{N: 2, Median: base}, BaselineGBps: base, Ratio: 1 / base}
	}
	c := Defaults()
	c.DType = Strings{"fp8", "bf16"}
	rec := Record{Config: c, Rows: []Row{
		row(CallDispatch, "fp8", "fp8", 1), row(CallCombine, "fp8", "bf16", 2),
		row(CallDispatch, "bf16", "bf16", 3), row(CallCombine, "bf16", "bf16", 3),
	}}
	var b bytes.Buffer
	if err := WriteGoBench(&b, rec); err != nil {
		t.Fatal(err)
	}
	var baselines []string
	for _, l := range strings.Split(b.String(), "\n") {
		if strings.HasPrefix(l, "BenchmarkBaseline/") {
			f := strings.Fields(l)
			baselines = append(baselines, f[0][strings.Index(f[0], "dtype="):strings.Index(f[0], "/routing")]+" "+f[4])
		}
	}
	// MB/s: GB/s x 1000.
	if want := []string{"dtype=fp8 1000.00", "dtype=bf16 2000.00", "dtype=bf16 3000.00"}; !slices.Equal(baselines, want) {
		t.Errorf("gobench baselines %v, want %v\n%s", baselines, want, b.String())
	}
	b.Reset()
	if err := WriteTable(&b, rec); err != nil {
		t.Fatal(err)
	}
	table := b.String()
	for _, want := range []string{
		"\n  dispatch               32     128     2   fp8 ",
		"\n  combine                32     128     2  bf16 ",
		"\n# fp8: dispatch and dispatch-permute move fp8 e4m3 rows with one fp32 scale per 128 channels",
	} {
		if !strings.Contains(table, want) {
			t.Errorf("table lacks %q:\n%s", want, table)
		}
	}
	bf16 := Record{Config: Defaults(), Rows: rec.Rows[2:]}
	if s := bf16.FP8Line(); s != "" {
		t.Errorf("a bf16 run has an fp8 line %q", s)
	}
	// Old rows: no case_dtype, one case per dtype.
	old := []Row{row(CallDispatch, "", "bf16", 1), row(CallCombine, "", "bf16", 1), row(CallDispatch, "", "fp32", 1)}
	if !sameCase(old[0], old[1]) || sameCase(old[1], old[2]) || old[2].CaseDTypeName() != "fp32" {
		t.Errorf("rows without case_dtype: sameCase %v %v, case dtype %q", sameCase(old[0], old[1]), sameCase(old[1], old[2]), old[2].CaseDTypeName())
	}
}

// TestWriteTableWithin: the default table keeps every line within the
// width, whatever the rows sweep (every case field and the repetitions,
// several domains, a long error); it shows the columns a reader needs
// first, those with a value, and leaves the others, named in a footer
// line, to the wide table, which keeps every column.
func TestWriteTableWithin(t *testing.T) {
	row := func(call string, tokens int, mode string, sms, chunk, rep int) Row {
		return Row{Call: call, Ranks: 8, Tokens: tokens, Hidden: 7168, TopK: 8, DType: "bf16", Mode: mode, SMs: sms, ChunkRows: chunk, Rep: rep,
			Time: Stats{N: 20, Median: 123456.7, P99: 234567.8}, NVLGBps: 123.45, RDMAGBps: 45.67, RDMABytes: 1e9, RDMACrossBytes: 5e8, RDMAFlatBytes: 9e8,
			NVLBytes: 1e9, NVLPeerBytes: 8e8, Baseline: Stats{N: 20, Median: 1000}, BaselineGBps: 456.78, Ratio: 0.27,
			A2A: &Stats{N: 20, Median: 234567.8}, A2AGBps: 12.34, A2ASpeedup: 1.9, CheckedRows: 100}
	}
	c := Defaults()
	c.Ranks, c.RanksPerDomain, c.Tokens, c.Mode, c.SMs, c.ChunkRows, c.Count = 8, 4, Ints{16384, 32768}, Strings{ModeBlocking, ModeCapacity}, Ints{0, 132}, Ints{0, 16}, 2
	c.Calls = KnownCalls
	env := Env{GoepVersion: "0.1.0-dev", Commit: "0123456789abcdef", Backend: BackendHost, GoVersion: "go1.26.0", GOOS: "linux", GOARCH: "amd64", GOMAXPROCS: 224,
		CPU: "Intel(R) Xeon(R) Platinum 8480C with a model name long enough to need folding over two lines", NumCPU: 224, LoadAvg: "1.00 2.00 3.00"}
	var rows []Row
	for rep := 1; rep <= 2; rep++ {
		for _, mode := range c.Mode {
			for _, sms := range c.SMs {
				for _, chunk := range c.ChunkRows {
					for _, tok := range c.Tokens {
						for _, call := range KnownCalls {
							rows = append(rows, row(call, tok, mode, sms, chunk, rep))
						}
					}
				}
			}
		}
	}
	full := Record{Env: env, Config: c, Launcher: "in-process", Processes: 1, Group: "local", Timing: TimingSpan, BaselineA2ATransport: "local", Rows: rows}
	failed := full
	failed.Rows, failed.Incomplete = rows[:7], true
	failed.Error = "rank 3: mode=capacity topk=8 tokens=32768 hidden=7168 dtype=bf16 sms=132 chunk_rows=16 rep=2/2: executor: capacity exceeded: " + strings.Repeat("a long cause, ", 20)
	plain := Record{Env: env, Config: Defaults(), Launcher: "in-process", Processes: 1, Timing: TimingSpan, BaselineA2ATransport: "local",
		Rows: []Row{row(CallDispatch, 512, ModeBlocking, 0, 0, 1)}}
	plain.Rows[0].RDMAGBps, plain.Rows[0].RDMABytes = 0, 0

	header := func(s string) []string {
		for _, l := range strings.Split(s, "\n") {
			if strings.HasPrefix(l, "# call") {
				return strings.Fields(l)[1:]
			}
		}
		return nil
	}
	for _, tc := range []struct {
		name string
		rec  Record
		cols []string
	}{
		{"every field swept", full, []string{"call", "tokens", "hidden", "topk", "dtype", "mode", "sms", "chunk", "rep", "time_us", "nvl_GBps", "rdma_GBps", "ratio", "vs_a2a", "#wrong"}},
		{"failed", failed, []string{"call", "tokens", "hidden", "topk", "dtype", "time_us", "p99_us", "nvl_GBps", "rdma_GBps", "ratio", "vs_a2a", "#wrong"}},
		{"one case, one domain", plain, []string{"call", "tokens", "hidden", "topk", "dtype", "time_us", "p99_us", "nvl_GBps", "ratio", "vs_a2a", "#wrong"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b bytes.Buffer
			if err := WriteTableWithin(&b, tc.rec, TableWidth); err != nil {
				t.Fatal(err)
			}
			out := b.String()
			for _, l := range strings.Split(strings.TrimSuffix(out, "\n"), "\n") {
				if n := utf8.RuneCountInString(l); n > TableWidth {
					t.Errorf("a line of %d columns, more than %d: %q", n, TableWidth, l)
				}
			}
			if got := header(out); !slices.Equal(got, tc.cols) {
				t.Errorf("columns %v, want %v", got, tc.cols)
			}
			if !strings.Contains(out, "\n# --wide adds baseline_GBps, a2a_us, a2a_GBps") {
				t.Errorf("no footer line naming the columns of the wide table:\n%s", out)
			}
			// Every row is there, with as many fields as the header.
			n := 0
			for _, l := range strings.Split(out, "\n") {
				if l != "" && !strings.HasPrefix(l, "#") {
					n++
					if f := strings.Fields(l); len(f) != len(tc.cols) {
						t.Errorf("row %q: %d fields, want %d", l, len(f), len(tc.cols))
					}
				}
			}
			if n != len(tc.rec.Rows) {
				t.Errorf("%d rows, want %d", n, len(tc.rec.Rows))
			}

			// The wide table: every column, today's footer unwrapped.
			b.Reset()
			if err := WriteTable(&b, tc.rec); err != nil {
				t.Fatal(err)
			}
			wide := header(b.String())
			for _, col := range []string{"time_us", "p99_us", "nvl_GBps", "rdma_GBps", "baseline_GBps", "ratio", "a2a_us", "a2a_GBps", "vs_a2a", "#wrong"} {
				if !slices.Contains(wide, col) {
					t.Errorf("the wide table lacks %s: %v", col, wide)
				}
			}
			if strings.Contains(b.String(), "\n#   ") || strings.Contains(b.String(), "--wide adds") {
				t.Errorf("the wide table is folded, or points to itself:\n%s", b.String())
			}
		})
	}
	var b bytes.Buffer
	if err := WriteTableWithin(&b, failed, TableWidth); err != nil {
		t.Fatal(err)
	}
	if flat := strings.ReplaceAll(b.String(), "\n#   ", " "); !strings.Contains(flat, "# check: INCOMPLETE, 7 of 160 rows measured (") || !strings.Contains(flat, "rep=2/2: executor: capacity exceeded: a long cause,") {
		t.Errorf("the failed run's footer does not say it is incomplete, and why:\n%s", b.String())
	}
}

// TestWrapComment: a comment line folds at a field separator, a "; " or
// a ", " in its second half before any other space, within a word only
// where it has no space, and never beyond the width.
func TestWrapComment(t *testing.T) {
	for _, tc := range []struct {
		line  string
		width int
		want  string
	}{
		{"# short", 20, "# short"},
		{"# ranks 4  experts 24  topk 2 and so on", 30, "# ranks 4  experts 24\n#   topk 2 and so on"},
		{"# min 1 (a, b), geomean 2, max 3 (c, d)", 30, "# min 1 (a, b), geomean 2,\n#   max 3 (c, d)"},
		{"# min 1 (a, b), geomean 2, max 3 (c, d)", 38, "# min 1 (a, b), geomean 2, max 3 (c,\n#   d)"},
		{"# min 1 (a, b), max 3 (c, d), geomean 2", 38, "# min 1 (a, b), max 3 (c, d),\n#   geomean 2"},
		{"# one; two three four five six", 24, "# one; two three four\n#   five six"},
		{"# " + strings.Repeat("x", 30), 20, "# " + strings.Repeat("x", 18) + "\n#   " + strings.Repeat("x", 12)},
	} {
		got := wrapComment(tc.line, tc.width)
		if got != tc.want {
			t.Errorf("wrapComment(%q, %d) =\n%s\nwant\n%s", tc.line, tc.width, got, tc.want)
		}
		for _, l := range strings.Split(got, "\n") {
			if utf8.RuneCountInString(l) > tc.width {
				t.Errorf("wrapComment(%q, %d): line %q is wider", tc.line, tc.width, l)
			}
		}
	}
	if got := WrapComments("  a row stays as it is, however long it is\n# a comment is folded at its width\n", 20); got != "  a row stays as it is, however long it is\n# a comment is\n#   folded at its\n#   width\n" {
		t.Errorf("WrapComments: %q", got)
	}
}

// TestOutputsCount: the rows of several repetitions are N samples of each
// case: gobench prints a line per call, case and repetition (and the
// case's baseline once per repetition), with equal names, as benchstat
// wants; the table gains a rep column, the CSV its rep, and the ratio
// summary names the repetition.
func TestOutputsCount(t *testing.T) {
	c := Defaults()
	c.Count = 6
	var rows []Row
	for rep := 1; rep <= c.Count; rep++ {
		for _, call := range []string{CallDispatch, CallCombine} {
			rows = append(rows, Row{Call: call, Ranks: 8, Tokens: 64, Hidden: 128, TopK: 2, DType: "bf16", Mode: ModeBlocking, Rep: rep,
				Time: Stats{N: 2, Median: float64(10 + rep)}, NVLGBps: 1, Baseline: Stats{N: 2, Median: 1}, BaselineGBps: 2, Ratio: float64(rep)})
		}
	}
	rec := Record{Config: c, Rows: rows}
	var b bytes.Buffer
	if err := WriteGoBench(&b, rec); err != nil {
		t.Fatal(err)
	}
	count := map[string]int{}
	for _, l := range strings.Split(b.String(), "\n") {
		if strings.HasPrefix(l, "Benchmark") {
			count[strings.Fields(l)[0]]++
		}
	}
	if len(count) != 3 {
		t.Errorf("benchmarks %v, want Dispatch, Combine and Baseline", count)
	}
	for name, n := range count {
		if n != c.Count {
			t.Errorf("%s: %d lines, want %d", name, n, c.Count)
		}
	}

	b.Reset()
	if err := WriteTableWithin(&b, rec, TableWidth); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"(+3 warm-up)  count 6  seed", " dtype rep ", "\n  combine               64    128    2  bf16   6 ", "),\n#   geomean 2.99, max 6.00 (dispatch, tokens 64, rep 6)\n"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, b.String())
		}
	}

	b.Reset()
	if err := WriteCSV(&b, rec); err != nil {
		t.Fatal(err)
	}
	recs, err := csv.NewReader(&b).ReadAll()
	if err != nil || len(recs) != 1+len(rows) || recs[0][len(recs[0])-1] != "rep" {
		t.Fatalf("CSV: %v, %d records, header %v; want rep last", err, len(recs), recs[0])
	}
	if last := recs[len(recs)-1]; last[len(last)-1] != "6" {
		t.Errorf("CSV last row %v: rep, want 6", last)
	}
}

// TestRecordIncomplete: a record of a run that failed says so (the
// incomplete field and the check line), one of a run that did not does
// not.
func TestRecordIncomplete(t *testing.T) {
	c := Defaults()
	res := &Result{Rows: []Row{{Call: CallDispatch, CheckedRows: 5}}}
	ok := NewRecord(Env{}, c, res, nil)
	failed := NewRecord(Env{}, c, res, errors.New("boom"))
	if ok.Incomplete || !strings.HasPrefix(ok.CheckLine(), "# check: OK") {
		t.Errorf("a run without error: incomplete %v, %q", ok.Incomplete, ok.CheckLine())
	}
	want := fmt.Sprintf("# check: INCOMPLETE, 1 of %d rows measured (5 output rows checked, 0 wrong) before the run failed: boom\n", len(c.Calls)*len(c.Cases()))
	if !failed.Incomplete || failed.CheckLine() != want {
		t.Errorf("a failed run: incomplete %v, %q; want true, %q", failed.Incomplete, failed.CheckLine(), want)
	}
}
