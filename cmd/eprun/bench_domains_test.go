package main

import (
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/goep/goep/internal/bench"
)

// TestBenchDomains runs bench tiny in two domains of 2 ranks: the table
// has rdma_GBps and the footer's rdma line, the JSON rows the three RDMA
// byte counts (cross < DESIGN.md's count, cross <= flat), and the CSV the
// same cross and flat bytes in its last two columns.
func TestBenchDomains(t *testing.T) {
	dir := t.TempDir()
	jsonPath, csvPath := filepath.Join(dir, "out.json"), filepath.Join(dir, "out.csv")
	stdout, _ := eprunOK(t, append(tiny, "--ranks-per-domain", "2", "--calls", "dispatch,combine", "--json", jsonPath, "--csv", csvPath)...)
	for _, want := range []string{"# ranks 4 (2 domains of 2)", "# check: OK", " rdma_GBps ", "# rdma tokens 32: ", " cross domains a rank, one-way (rdma_GBps counts ", "; flat scheme: "} {
		if !strings.Contains(stdout, want) {
			t.Errorf("table lacks %q:\n%s", want, stdout)
		}
	}
	if n := strings.Count(stdout, "\n# rdma "); n != 1 {
		t.Errorf("%d rdma lines, want 1 (one case):\n%s", n, stdout)
	}

	rec := readRecord(t, jsonPath)
	if len(rec.Rows) != 2 {
		t.Fatalf("%d rows, want 2", len(rec.Rows))
	}
	for _, r := range rec.Rows {
		if r.RDMAGBps <= 0 || !(0 < r.RDMACrossBytes && r.RDMACrossBytes < r.RDMABytes && r.RDMACrossBytes <= r.RDMAFlatBytes) {
			t.Errorf("%s: rdma_GBps %v, bytes %v, cross %v, flat %v; want 0 < cross < bytes, cross <= flat", r.Call, r.RDMAGBps, r.RDMABytes, r.RDMACrossBytes, r.RDMAFlatBytes)
		}
	}

	recs := readCSV(t, csvPath)
	if len(recs) != 3 {
		t.Fatalf("CSV: %d records, want 3", len(recs))
	}
	col := func(row []string, name string) float64 {
		v, err := strconv.ParseFloat(row[slices.Index(bench.CSVColumns, name)], 64)
		if err != nil {
			t.Errorf("row %v: %s: %v", row, name, err)
		}
		return v
	}
	for i, row := range recs[1:] {
		r := rec.Rows[i]
		if col(row, "rdma_cross_bytes_per_rank") != r.RDMACrossBytes || col(row, "rdma_flat_bytes_per_rank") != r.RDMAFlatBytes || col(row, "ranks_per_domain") != 2 {
			t.Errorf("CSV row %v, JSON row cross %v flat %v", row, r.RDMACrossBytes, r.RDMAFlatBytes)
		}
	}
}

// TestBenchDomainsFromEnv: with ranks_per_domain left 0 in the config and
// GOEP_RANKS_PER_DOMAIN=2, the engines run in two domains of 2; the table's
// header, the CSV and every JSON row say the D they ran with, not the
// config's 0 (which the header once printed as "1 domain").
func TestBenchDomainsFromEnv(t *testing.T) {
	t.Setenv("GOEP_RANKS_PER_DOMAIN", "2")
	dir := t.TempDir()
	jsonPath, csvPath := filepath.Join(dir, "out.json"), filepath.Join(dir, "out.csv")
	stdout, _ := eprunOK(t, append(slices.Clone(tiny), "--calls", "dispatch,combine", "--json", jsonPath, "--csv", csvPath)...)
	if !strings.Contains(stdout, "# ranks 4 (2 domains of 2)") || !strings.Contains(stdout, "# check: OK") {
		t.Errorf("table header or footer:\n%s", stdout)
	}

	rec := readRecord(t, jsonPath)
	if rec.Config.RanksPerDomain != 0 || len(rec.Rows) != 2 {
		t.Fatalf("config ranks_per_domain %d, %d rows; want 0 (left to the engine) and 2 rows", rec.Config.RanksPerDomain, len(rec.Rows))
	}
	for _, r := range rec.Rows {
		if r.RanksPerDomain != 2 {
			t.Errorf("%s: ranks_per_domain %d, want 2", r.Call, r.RanksPerDomain)
		}
	}

	recs := readCSV(t, csvPath)
	if len(recs) != 3 {
		t.Fatalf("CSV: %d records, want 3", len(recs))
	}
	for _, row := range recs[1:] {
		if d := row[slices.Index(bench.CSVColumns, "ranks_per_domain")]; d != "2" {
			t.Errorf("CSV row %v: ranks_per_domain %s, want 2", row, d)
		}
	}
}
