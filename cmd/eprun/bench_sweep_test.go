package main

import (
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"golang.org/x/perf/benchfmt"

	"github.com/goep/goep/internal/bench"
)

// TestBenchFlagsTopKMode: --topk and --mode take one value or a
// comma-separated list, and replace the config's (scalar or list).
func TestBenchFlagsTopKMode(t *testing.T) {
	dir := t.TempDir()
	scalar := writeFile(t, dir, "scalar.yaml", "ranks: 4\nexperts: 16\ntopk: 3\nmode: capacity\n")
	list := writeFile(t, dir, "list.yaml", "ranks: 4\nexperts: 16\ntopk: [1, 3]\nmode: [capacity, blocking]\n")
	for _, tc := range []struct {
		config string
		args   []string
		topk   bench.Ints
		mode   bench.Strings
	}{
		{"", nil, bench.Ints{8}, bench.Strings{"blocking"}},
		{"", []string{"--topk", "4,8", "--mode", "blocking,capacity"}, bench.Ints{4, 8}, bench.Strings{"blocking", "capacity"}},
		{"", []string{"--topk", "4", "--mode", "capacity"}, bench.Ints{4}, bench.Strings{"capacity"}},
		{"", []string{"--topk", "2", "--topk", "6", "--mode", "capacity", "--mode", "blocking"}, bench.Ints{2, 6}, bench.Strings{"capacity", "blocking"}},
		{scalar, nil, bench.Ints{3}, bench.Strings{"capacity"}},
		{list, nil, bench.Ints{1, 3}, bench.Strings{"capacity", "blocking"}},
		{list, []string{"--topk", "2"}, bench.Ints{2}, bench.Strings{"capacity", "blocking"}},
		{scalar, []string{"--mode", "blocking,capacity"}, bench.Ints{3}, bench.Strings{"blocking", "capacity"}},
	} {
		c := configWithFlags(t, tc.config, tc.args)
		if !slices.Equal(c.TopK, tc.topk) || !slices.Equal(c.Mode, tc.mode) {
			t.Errorf("%s %v: topk %v mode %v, want %v %v", filepath.Base(tc.config), tc.args, []int(c.TopK), []string(c.Mode), []int(tc.topk), []string(tc.mode))
		}
	}
}

// TestBenchBadTopKMode: a bad value in a list is a usage error of one line
// naming it.
func TestBenchBadTopKMode(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"bench", "tiny", "--topk", "2,100"}, "topk is 100; need 1 <= topk <= experts (24)"},
		{[]string{"bench", "tiny", "--topk", "0"}, "topk is 0"},
		{[]string{"bench", "tiny", "--topk", "2,two"}, `invalid argument "2,two"`},
		{[]string{"bench", "tiny", "--mode", "blocking,fast"}, `mode "fast": want blocking or capacity`},
		{[]string{"check", "tiny", "--mode", "capacity,"}, `mode "": want blocking or capacity`},
	} {
		code, stdout, stderr := eprun(t, tc.args...)
		if code != 2 || stdout != "" || strings.Count(stderr, "\n") != 1 || !strings.Contains(stderr, tc.want) {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want exit 2 and one line with %q", tc.args, code, stdout, stderr, tc.want)
		}
	}
}

// TestBenchSweepTopKMode runs bench tiny sweeping --topk 2,4 --mode
// blocking,capacity in process: every row of every output passes its
// checks, and the rows are told apart (the table by its mode column, the
// JSON and CSV by their topk and mode, gobench by the name and the mode:
// configuration line).
func TestBenchSweepTopKMode(t *testing.T) {
	dir := t.TempDir()
	jsonPath, csvPath := filepath.Join(dir, "out.json"), filepath.Join(dir, "out.csv")
	sweep := append(slices.Clone(tiny), "--topk", "2,4", "--mode", "blocking,capacity")
	stdout, _ := eprunOK(t, append(slices.Clone(sweep), "--json", jsonPath, "--csv", csvPath)...)
	calls := bench.AllCalls
	var want []string // call/topk/mode in Cases order
	for _, mode := range []string{"blocking", "capacity"} {
		for _, k := range []int{2, 4} {
			for _, call := range calls {
				want = append(want, fmt.Sprintf("%s/%d/%s", call, k, mode))
			}
		}
	}

	// The table: a mode column, every row #wrong 0, no two rows alike in
	// their case columns.
	if !strings.Contains(unfold(stdout), "  topk 2,4  mode blocking,capacity  ") || !strings.Contains(stdout, "# check: OK") {
		t.Errorf("table header or footer:\n%s", stdout)
	}
	var got []string
	_, rows := tableRows(t, stdout, 12, "mode")
	for _, f := range rows {
		got = append(got, fmt.Sprintf("%s/%s/%s", f[0], f[3], f[5]))
	}
	if !slices.Equal(got, want) {
		t.Errorf("table rows (call/topk/mode)\n%v\nwant\n%v", got, want)
	}

	// The JSON record.
	rec := readRecord(t, jsonPath)
	if !slices.Equal(rec.Config.TopK, bench.Ints{2, 4}) || !slices.Equal(rec.Config.Mode, bench.Strings{"blocking", "capacity"}) {
		t.Errorf("config topk %v mode %v", []int(rec.Config.TopK), []string(rec.Config.Mode))
	}
	if rec.Wrong != 0 || rec.Error != "" {
		t.Errorf("%d of %d rows wrong, error %q", rec.Wrong, rec.CheckedRows, rec.Error)
	}
	got = nil
	for _, r := range rec.Rows {
		got = append(got, fmt.Sprintf("%s/%d/%s", r.Call, r.TopK, r.Mode))
		if r.CheckedRows == 0 || r.Wrong != 0 || r.A2AWrong != 0 {
			t.Errorf("%s topk %d %s: %d rows checked, %d wrong, a2a %d wrong", r.Call, r.TopK, r.Mode, r.CheckedRows, r.Wrong, r.A2AWrong)
		}
	}
	if !slices.Equal(got, want) {
		t.Errorf("JSON rows (call/topk/mode)\n%v\nwant\n%v", got, want)
	}

	// The CSV: the mode column is the row's.
	recs := readCSV(t, csvPath)
	col := func(row []string, name string) string { return row[slices.Index(bench.CSVColumns, name)] }
	got = nil
	for _, row := range recs[1:] {
		got = append(got, fmt.Sprintf("%s/%s/%s", col(row, "call"), col(row, "topk"), col(row, "mode")))
		if col(row, "wrong") != "0" {
			t.Errorf("CSV row %v: wrong %s", row, col(row, "wrong"))
		}
	}
	if !slices.Equal(got, want) {
		t.Errorf("CSV rows (call/topk/mode)\n%v\nwant\n%v", got, want)
	}

	// gobench, read by benchstat's parser: the name and the mode
	// configuration together are distinct for every result.
	stdout, _ = eprunOK(t, append(slices.Clone(sweep), "--format=gobench")...)
	r := benchfmt.NewReader(strings.NewReader(stdout), "eprun.txt")
	seen := map[string]bool{}
	var n int
	for r.Scan() {
		switch res := r.Result().(type) {
		case *benchfmt.SyntaxError:
			t.Errorf("benchfmt: %v", res)
		case *benchfmt.Result:
			key := res.GetConfig("mode") + " " + res.Name.String()
			if seen[key] {
				t.Errorf("two results %q", key)
			}
			seen[key] = true
			n++
			if m := res.GetConfig("mode"); m != "blocking" && m != "capacity" {
				t.Errorf("%s: mode %q", res.Name, m)
			}
		}
	}
	if err := r.Err(); err != nil {
		t.Fatal(err)
	}
	// Per case: every call and its a2a, and the copy baseline.
	if want := 4 * (2*len(calls) + 1); n != want {
		t.Errorf("%d results, want %d", n, want)
	}
	if !slices.ContainsFunc(slices.Collect(maps.Keys(seen)), func(k string) bool {
		return strings.HasPrefix(k, "capacity Dispatch/ranks=4/tokens=32/hidden=64/topk=4/dtype=bf16/routing=uniform-")
	}) {
		t.Errorf("no capacity topk=4 dispatch among %v", seen)
	}
}

// TestCheckSweepTopKMode: eprun check sweeps the same way: per call, one
// case per (mode, topk).
func TestCheckSweepTopKMode(t *testing.T) {
	stdout, _ := eprunOK(t, "check", "tiny", "-q", "--topk", "2,4", "--mode", "blocking,capacity")
	if !strings.Contains(stdout, "topk 2,4 ") || !strings.Contains(stdout, "mode blocking,capacity ") || !strings.Contains(stdout, "# check: OK") {
		t.Errorf("summary:\n%s", stdout)
	}
	for _, l := range strings.Split(strings.TrimSpace(stdout), "\n") {
		if f := strings.Fields(l); !strings.HasPrefix(l, "#") && (len(f) != 4 || f[1] != "4" || f[3] != "0") {
			t.Errorf("row %q: want call, 4 cases, rows, 0 wrong", l)
		}
	}
}

// configWithFlags is the config eprun bench would run: config (a file or
// embedded name, "" for the default) with the bench flags args applied.
// It must validate.
func configWithFlags(t *testing.T, config string, args []string) bench.Config {
	t.Helper()
	var f benchFlags
	cmd := &cobra.Command{}
	f.register(cmd)
	if err := cmd.ParseFlags(args); err != nil {
		t.Fatalf("%v: %v", args, err)
	}
	c, err := loadConfig(config)
	if err != nil {
		t.Fatal(err)
	}
	f.apply(cmd, &c)
	if err := c.Validate(); err != nil {
		t.Errorf("%s %v: %v", filepath.Base(config), args, err)
	}
	return c
}
