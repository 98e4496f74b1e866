package main

import (
	"math"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/goep/goep/internal/bench"
)

// fp8Tiny is bench tiny with fp8 rows (hidden 128, one scale a row).
var fp8Tiny = append(slices.Clone(tiny), "--dtype", "fp8", "--hidden", "128")

// TestBenchFP8 runs bench tiny with --dtype fp8 and every call in process:
// dispatch and dispatch-permute are fp8 rows with their scales, the calls
// that combine bf16, and the table, the footer, the JSON record, the CSV
// and the gobench lines all say which, every row checked and right.
func TestBenchFP8(t *testing.T) {
	dir := t.TempDir()
	jsonPath, csvPath := filepath.Join(dir, "out.json"), filepath.Join(dir, "out.csv")
	stdout, _ := eprunOK(t, append(slices.Clone(fp8Tiny), "--calls", strings.Join(bench.KnownCalls, ","), "--json", jsonPath, "--csv", csvPath)...)
	wantDType := map[string]string{
		bench.CallDispatch: "fp8", bench.CallDispatchPermute: "fp8",
		bench.CallCombine: "bf16", bench.CallUnpermuteCombine: "bf16", bench.CallDispatchCombine: "bf16",
	}
	// fp8: 128 bytes and one fp32 scale; bf16: 2 x 128 bytes.
	wantRowBytes := map[string]int{"fp8": 128 + 4, "bf16": 256}

	// The table: the dtype column per call, the footer line, all right.
	_, rows := tableRows(t, stdout, 11)
	for _, f := range rows {
		if f[4] != wantDType[f[0]] {
			t.Errorf("row %v: want dtype %s", f, wantDType[f[0]])
		}
	}
	if len(rows) != len(bench.KnownCalls) {
		t.Errorf("%d rows, want %d:\n%s", len(rows), len(bench.KnownCalls), stdout)
	}
	for _, want := range []string{
		"# fp8: dispatch, dispatch-permute move e4m3 rows and an fp32 scale per 128 channels",
		"the calls that combine run in bf16",
		"# check: OK",
	} {
		if !strings.Contains(stdout, want) {
			t.Errorf("table lacks %q:\n%s", want, stdout)
		}
	}

	// The JSON record: dtype is the call's, case_dtype fp8, row_bytes with
	// the scales, and the bytes are the received rows of those.
	rec := readRecord(t, jsonPath)
	if rec.Wrong != 0 || rec.CheckedRows == 0 || rec.Error != "" || len(rec.Rows) != len(bench.KnownCalls) {
		t.Fatalf("%d rows, %d of %d wrong, error %q", len(rec.Rows), rec.Wrong, rec.CheckedRows, rec.Error)
	}
	if !slices.Equal(rec.Config.DType, bench.Strings{"fp8"}) {
		t.Errorf("config dtype %v, want fp8", rec.Config.DType)
	}
	for _, r := range rec.Rows {
		dt := wantDType[r.Call]
		if r.DType != dt || r.CaseDType != "fp8" || r.RowBytes != wantRowBytes[dt] {
			t.Errorf("%s: dtype %q, case_dtype %q, row_bytes %d; want %s, fp8, %d", r.Call, r.DType, r.CaseDType, r.RowBytes, dt, wantRowBytes[dt])
		}
		n := 0
		for _, x := range r.RecvRows {
			n += x
		}
		trips := 1
		if r.Call == bench.CallDispatchCombine {
			trips = 2
		}
		if want := float64(trips*n*wantRowBytes[dt]) / float64(len(r.RecvRows)); math.Abs(r.NVLBytes-want) > 1e-6*want {
			t.Errorf("%s: nvl_bytes_per_rank %v, want %v", r.Call, r.NVLBytes, want)
		}
		if r.CheckedRows == 0 || r.A2ACheckedRows != r.CheckedRows || r.BaselineGBps <= 0 || r.A2A == nil {
			t.Errorf("%s: %d rows checked, a2a %d, baseline %v GB/s, a2a %v", r.Call, r.CheckedRows, r.A2ACheckedRows, r.BaselineGBps, r.A2A)
		}
	}

	// The CSV: dtype is the call's, then case_dtype and row_bytes.
	recs := readCSV(t, csvPath)
	col := func(row []string, name string) string { return row[slices.Index(bench.CSVColumns, name)] }
	for _, row := range recs[1:] {
		dt := wantDType[col(row, "call")]
		if col(row, "dtype") != dt || col(row, "case_dtype") != "fp8" || col(row, "row_bytes") != map[string]string{"fp8": "132", "bf16": "256"}[dt] {
			t.Errorf("CSV row %v: want dtype %s, case_dtype fp8, its row bytes", row, dt)
		}
	}

	// gobench: the names carry the call's dtype, and the case has a copy
	// baseline of each dtype.
	stdout, _ = eprunOK(t, append(slices.Clone(fp8Tiny), "--format=gobench")...)
	for _, want := range []string{
		"BenchmarkDispatch/ranks=4/tokens=32/hidden=128/topk=2/dtype=fp8/routing=uniform-",
		"BenchmarkCombine/ranks=4/tokens=32/hidden=128/topk=2/dtype=bf16/routing=uniform-",
		"BenchmarkDispatchPermute/ranks=4/tokens=32/hidden=128/topk=2/dtype=fp8/routing=uniform-",
		"BenchmarkBaseline/ranks=4/tokens=32/hidden=128/topk=2/dtype=fp8/routing=uniform-",
		"BenchmarkBaseline/ranks=4/tokens=32/hidden=128/topk=2/dtype=bf16/routing=uniform-",
	} {
		if strings.Count(stdout, want) != 1 {
			t.Errorf("gobench output has %d lines %q, want 1:\n%s", strings.Count(stdout, want), want, stdout)
		}
	}
}

// TestBenchFP8Sweep: --dtype bf16,fp8 runs a bf16 case and an fp8 case,
// told apart in the JSON by case_dtype (their combine rows are both bf16).
func TestBenchFP8Sweep(t *testing.T) {
	path := filepath.Join(t.TempDir(), "out.json")
	eprunOK(t, append(slices.Clone(tiny), "--dtype", "bf16,fp8", "--hidden", "128,256", "--calls", "dispatch,combine", "--json", path)...)
	rec := readRecord(t, path)
	var got []string
	for _, r := range rec.Rows {
		got = append(got, r.Call+"/"+r.CaseDType+"/"+r.DType+"/"+strconv.Itoa(r.Hidden))
		if r.Wrong != 0 || r.A2AWrong != 0 || r.CheckedRows == 0 {
			t.Errorf("%s %s hidden %d: %d of %d wrong, a2a %d", r.Call, r.CaseDType, r.Hidden, r.Wrong, r.CheckedRows, r.A2AWrong)
		}
	}
	want := []string{
		"dispatch/bf16/bf16/128", "combine/bf16/bf16/128", "dispatch/bf16/bf16/256", "combine/bf16/bf16/256",
		"dispatch/fp8/fp8/128", "combine/fp8/bf16/128", "dispatch/fp8/fp8/256", "combine/fp8/bf16/256",
	}
	if !slices.Equal(got, want) {
		t.Errorf("rows (call/case_dtype/dtype/hidden)\n%v\nwant\n%v", got, want)
	}
}

// TestCheckFP8: eprun check with fp8 checks every call and says what the
// fp8 case's calls moved.
func TestCheckFP8(t *testing.T) {
	stdout, _ := eprunOK(t, "check", "tiny", "-q", "--dtype", "fp8", "--hidden", "256", "--mode", "blocking,capacity", "--pad", "4")
	for _, want := range []string{"dtype fp8", "# fp8: dispatch and dispatch-permute move fp8 e4m3 rows", "# check: OK"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("summary lacks %q:\n%s", want, stdout)
		}
	}
}

// TestBenchHelpFP8: bench --help says what fp8 means.
func TestBenchHelpFP8(t *testing.T) {
	stdout, _ := eprunOK(t, "bench", "--help")
	for _, want := range []string{"bf16, fp32 or fp8", "FP8 dispatch, BF16 combine", "hidden must be a multiple of 128", "run in bf16", "case_dtype"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("bench --help lacks %q:\n%s", want, stdout)
		}
	}
}
