package main

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/goep/goep/internal/bench"
)

// TestBenchFlagsKnobs: --sms and --chunk-rows take one value or a
// comma-separated list and replace the config's; left out, the config's
// (or the default, 0) stays.
func TestBenchFlagsKnobs(t *testing.T) {
	cfg := writeFile(t, t.TempDir(), "knobs.yaml", "ranks: 4\nexperts: 16\nsms: [1, 4]\nchunk_rows: 16\n")
	for _, tc := range []struct {
		config     string
		args       []string
		sms, chunk bench.Ints
	}{
		{"", nil, bench.Ints{0}, bench.Ints{0}},
		{"", []string{"--sms", "1,2", "--chunk-rows", "0,8"}, bench.Ints{1, 2}, bench.Ints{0, 8}},
		{"", []string{"--sms", "8"}, bench.Ints{8}, bench.Ints{0}},
		{cfg, nil, bench.Ints{1, 4}, bench.Ints{16}},
		{cfg, []string{"--chunk-rows", "2", "--chunk-rows", "3"}, bench.Ints{1, 4}, bench.Ints{2, 3}},
		{cfg, []string{"--sms", "0"}, bench.Ints{0}, bench.Ints{16}},
	} {
		c := configWithFlags(t, tc.config, tc.args)
		if !slices.Equal(c.SMs, tc.sms) || !slices.Equal(c.ChunkRows, tc.chunk) {
			t.Errorf("%s %v: sms %v chunk_rows %v, want %v %v", filepath.Base(tc.config), tc.args, []int(c.SMs), []int(c.ChunkRows), []int(tc.sms), []int(tc.chunk))
		}
	}
}

// TestBenchSweepKnobs runs bench tiny on the host backend sweeping --sms
// 1,2 --chunk-rows 0,8: every row of every call passes its checks (the
// knobs change no output), the JSON and CSV rows carry the case's knobs
// in Cases order, and the table has an sms and a chunk column that give
// them.
func TestBenchSweepKnobs(t *testing.T) {
	dir := t.TempDir()
	jsonPath, csvPath := filepath.Join(dir, "out.json"), filepath.Join(dir, "out.csv")
	stdout, _ := eprunOK(t, append(slices.Clone(tiny), "--sms", "1,2", "--chunk-rows", "0,8", "--tokens", "16,33", "--json", jsonPath, "--csv", csvPath)...)
	var want []string // call/sms/chunk/tokens in Cases order
	for _, sms := range []int{1, 2} {
		for _, chunk := range []int{0, 8} {
			for _, tok := range []int{16, 33} {
				for _, call := range bench.AllCalls {
					want = append(want, fmt.Sprintf("%s/%d/%d/%d", call, sms, chunk, tok))
				}
			}
		}
	}

	// The JSON record.
	rec := readRecord(t, jsonPath)
	if !slices.Equal(rec.Config.SMs, bench.Ints{1, 2}) || !slices.Equal(rec.Config.ChunkRows, bench.Ints{0, 8}) {
		t.Errorf("config sms %v chunk_rows %v", []int(rec.Config.SMs), []int(rec.Config.ChunkRows))
	}
	if rec.Wrong != 0 || rec.CheckedRows == 0 || rec.Error != "" {
		t.Errorf("%d of %d rows wrong, error %q", rec.Wrong, rec.CheckedRows, rec.Error)
	}
	var got []string
	for _, r := range rec.Rows {
		got = append(got, fmt.Sprintf("%s/%d/%d/%d", r.Call, r.SMs, r.ChunkRows, r.Tokens))
		if r.CheckedRows == 0 || r.Wrong != 0 || r.A2AWrong != 0 {
			t.Errorf("%s sms %d chunk %d tokens %d: %d rows checked, %d wrong, a2a %d wrong", r.Call, r.SMs, r.ChunkRows, r.Tokens, r.CheckedRows, r.Wrong, r.A2AWrong)
		}
		if r.RanksPerDomain != 4 {
			t.Errorf("%s: ranks_per_domain %d, want 4 (one domain)", r.Call, r.RanksPerDomain)
		}
	}
	if !slices.Equal(got, want) {
		t.Errorf("JSON rows (call/sms/chunk/tokens)\n%v\nwant\n%v", got, want)
	}

	// The table: sms and chunk after dtype, every row #wrong 0.
	if !strings.Contains(unfold(stdout), "  sms 1,2  chunk_rows 0,8\n") || !strings.Contains(stdout, "# check: OK") {
		t.Errorf("table header or footer:\n%s", stdout)
	}
	got = nil
	_, rows := tableRows(t, stdout, 13, "sms", "chunk")
	for _, f := range rows {
		got = append(got, fmt.Sprintf("%s/%s/%s/%s", f[0], f[5], f[6], f[1]))
	}
	if !slices.Equal(got, want) {
		t.Errorf("table rows (call/sms/chunk/tokens)\n%v\nwant\n%v", got, want)
	}

	// The CSV: sms and chunk_rows follow the columns before them (the
	// columns added after them come last).
	recs := readCSV(t, csvPath)
	if len(recs) != 1+len(want) {
		t.Fatalf("CSV: %d records, want %d", len(recs), 1+len(want))
	}
	n := slices.Index(bench.CSVColumns, "sms") + 2
	if h := recs[0]; !slices.Equal(h, bench.CSVColumns) || h[n-3] != "rdma_flat_bytes_per_rank" || h[n-2] != "sms" || h[n-1] != "chunk_rows" {
		t.Errorf("CSV header %v: want sms, chunk_rows after rdma_flat_bytes_per_rank", h)
	}
	got = nil
	for _, row := range recs[1:] {
		got = append(got, fmt.Sprintf("%s/%s/%s/%s", row[0], row[n-2], row[n-1], row[slices.Index(bench.CSVColumns, "tokens")]))
	}
	if !slices.Equal(got, want) {
		t.Errorf("CSV rows (call/sms/chunk/tokens)\n%v\nwant\n%v", got, want)
	}
}

// TestBenchKnobsNotSwept: one value of each knob gives no column; the
// header line names a value that is not the default.
func TestBenchKnobsNotSwept(t *testing.T) {
	stdout, _ := eprunOK(t, append(slices.Clone(tiny), "--sms", "3", "--chunk-rows", "5")...)
	if !strings.Contains(unfold(stdout), "  sms 3  chunk_rows 5\n") || !strings.Contains(stdout, "# check: OK") {
		t.Errorf("table header or footer:\n%s", stdout)
	}
	if header, _ := tableRows(t, stdout, 11); slices.Contains(header, "sms") || slices.Contains(header, "chunk") {
		t.Errorf("column header %v: a knob column without a sweep", header)
	}
}

// TestCheckSweepKnobs: eprun check sweeps the knobs too, one case per
// (sms, chunk_rows), and names them in its header.
func TestCheckSweepKnobs(t *testing.T) {
	stdout, _ := eprunOK(t, "check", "tiny", "-q", "--sms", "1,0", "--chunk-rows", "0,3")
	if !strings.Contains(unfold(stdout), "  sms 1,0  chunk_rows 0,3\n") || !strings.Contains(stdout, "# check: OK") {
		t.Errorf("summary:\n%s", stdout)
	}
	for _, l := range strings.Split(strings.TrimSpace(stdout), "\n") {
		if f := strings.Fields(l); !strings.HasPrefix(l, "#") && (len(f) != 4 || f[1] != "4" || f[3] != "0") {
			t.Errorf("row %q: want call, 4 cases, rows, 0 wrong", l)
		}
	}
}
