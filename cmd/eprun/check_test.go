package main

import (
	"encoding/csv"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/goep/goep/internal/bench"
)

func TestCheck(t *testing.T) {
	stdout, _ := eprunOK(t, "check", "tiny", "-q", "--tokens", "0,16")
	for _, want := range []string{"# call", "rows_checked", "#wrong", "launcher in-process", "# check: OK", "iters 2"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("summary lacks %q:\n%s", want, stdout)
		}
	}
	rows := 0
	for _, l := range strings.Split(strings.TrimSpace(stdout), "\n") {
		if strings.HasPrefix(l, "#") {
			continue
		}
		rows++
		if f := strings.Fields(l); len(f) != 4 || f[1] != "2" || f[3] != "0" {
			t.Errorf("row %q: want call, 2 cases, rows, 0 wrong", l)
		}
	}
	if rows != 4 {
		t.Errorf("%d rows, want 4:\n%s", rows, stdout)
	}
	if code, _, stderr := eprun(t, "check", "--ranks", "3"); code != 2 || !strings.Contains(stderr, "not a multiple of ranks 3") {
		t.Errorf("check --ranks 3: exit %d, %q", code, stderr)
	}
}

// TestCheckCSV: check --csv - puts the CSV on stdout and the summary on
// stderr; --csv FILE writes it there and keeps the summary on stdout.
func TestCheckCSV(t *testing.T) {
	stdout, stderr := eprunOK(t, "check", "tiny", "-q", "--csv", "-", "--calls", "dispatch,dispatch-combine")
	recs, err := csv.NewReader(strings.NewReader(stdout)).ReadAll()
	if err != nil {
		t.Fatalf("stdout is not CSV: %v\n%s", err, stdout)
	}
	if len(recs) != 3 || !slices.Equal(recs[0], bench.CSVColumns) {
		t.Fatalf("CSV %v, want the header and 2 rows", recs)
	}
	col := func(row []string, name string) string { return row[slices.Index(bench.CSVColumns, name)] }
	for i, call := range []string{"dispatch", "dispatch-combine"} {
		row := recs[1+i]
		if col(row, "call") != call || col(row, "wrong") != "0" || col(row, "baseline_GBps") != "" || col(row, "a2a_us") != "" {
			t.Errorf("row %v: want %s, 0 wrong, no baseline columns", row, call)
		}
	}
	if !strings.Contains(stderr, "# check: OK") {
		t.Errorf("the summary is not on stderr: %q", stderr)
	}

	path := filepath.Join(t.TempDir(), "check.csv")
	stdout, stderr = eprunOK(t, "check", "tiny", "-q", "--csv", path)
	if !strings.Contains(stdout, "# check: OK") {
		t.Errorf("the summary is not on stdout: %q", stdout)
	}
	if recs := readCSV(t, path); len(recs) != 1+len(bench.AllCalls) {
		t.Errorf("%s: %d records, want a header and %d rows", path, len(recs), len(bench.AllCalls))
	}
	if code, _, stderr := eprun(t, "check", "tiny", "--csv", "-", "--json", "-"); code != 2 || !strings.Contains(stderr, "both want stdout") {
		t.Errorf("check --csv - --json -: exit %d, %q", code, stderr)
	}
}
