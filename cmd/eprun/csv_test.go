package main

import (
	"encoding/csv"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/goep/goep/internal/bench"
)

func TestBenchCSV(t *testing.T) {
	path := filepath.Join(t.TempDir(), "out.csv")
	stdout, stderr := eprunOK(t, append(tiny, "--csv", path, "--tokens", "8,16", "--routing", "zipf", "--zipf-s", "1.5")...)
	if !strings.Contains(stdout, "# check: OK") {
		t.Errorf("the table is not on stdout: %q", stdout)
	}
	recs := readCSV(t, path)
	if len(recs) != 1+2*4 {
		t.Fatalf("%d records, want a header and 8 rows (2 cases x 4 calls)", len(recs))
	}
	col := func(row []string, name string) string { return row[slices.Index(bench.CSVColumns, name)] }
	for _, row := range recs[1:] {
		if len(row) != len(bench.CSVColumns) {
			t.Fatalf("row %v: %d cells", row, len(row))
		}
		for _, name := range []string{"time_us", "nvl_GBps", "baseline_GBps", "a2a_us", "vs_a2a"} {
			if v, err := strconv.ParseFloat(col(row, name), 64); err != nil || v <= 0 {
				t.Errorf("row %v: %s %q, want a positive number", row, name, col(row, name))
			}
		}
		if col(row, "wrong") != "0" || col(row, "rdma_GBps") != "" || col(row, "rdma_cross_bytes_per_rank") != "" || col(row, "rdma_flat_bytes_per_rank") != "" || col(row, "ranks") != "4" || col(row, "experts") != "24" ||
			col(row, "routing") != "zipf" || col(row, "zipf_s") != "1.5" || col(row, "launcher") != "in-process" || col(row, "ranks_per_domain") != "4" {
			t.Errorf("row %v", row)
		}
		if tok := col(row, "tokens"); tok != "8" && tok != "16" {
			t.Errorf("row %v: tokens %s", row, tok)
		}
	}

	// --csv - puts the CSV on stdout and the table on stderr.
	stdout, stderr = eprunOK(t, append(tiny, "--csv", "-")...)
	if recs, err := csv.NewReader(strings.NewReader(stdout)).ReadAll(); err != nil || len(recs) != 5 {
		t.Errorf("--csv -: stdout is not 5 CSV records (%v): %q", err, stdout)
	}
	if !strings.Contains(stderr, "# check: OK") {
		t.Errorf("--csv -: table not on stderr: %q", stderr)
	}

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--csv", "-", "--json", "-"}, "both want stdout"},
		{[]string{"--csv", filepath.Join(t.TempDir(), "no", "dir.csv")}, "--csv: open"},
	} {
		code, stdout, stderr := eprun(t, append(tiny, tc.args...)...)
		if code != 2 || stdout != "" || strings.Count(stderr, "\n") != 1 || !strings.Contains(stderr, tc.want) {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want 2 and one line with %q", tc.args, code, stdout, stderr, tc.want)
		}
	}
}
