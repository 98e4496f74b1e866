package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/goep/goep/internal/bench"
)

// TestSize: eprun size prints the table on stdout, or on stderr with
// --json -, whose figures are bench.Size's for the config and flags.
func TestSize(t *testing.T) {
	out, _ := eprunOK(t, "size", "tiny", "--ranks", "4", "--ranks-per-domain", "2", "--nvlink-gbps", "400", "--rail-gbps", "25")
	for _, want := range []string{"# eprun size tiny: one rank on the GPU path", "ranks 4 (2 domains of 2)", "window: dispatch receive", "host: rail send", "dispatch  rail"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	js, table := eprunOK(t, "size", "tiny", "--ranks", "4", "--ranks-per-domain", "2", "--nvlink-gbps", "400", "--rail-gbps", "25", "--json", "-")
	if !strings.Contains(table, "window: combine") {
		t.Errorf("--json -: the table not on stderr:\n%s", table)
	}
	var got struct {
		Config  string         `json:"config"`
		Sizings []bench.Sizing `json:"sizings"`
	}
	if err := json.Unmarshal([]byte(js), &got); err != nil {
		t.Fatalf("%v:\n%s", err, js)
	}
	cfg, err := loadConfig("tiny")
	if err != nil {
		t.Fatal(err)
	}
	cfg.Ranks, cfg.RanksPerDomain = 4, 2
	want, err := bench.Size(cfg, 400, 25)
	if err != nil {
		t.Fatal(err)
	}
	if got.Config != "tiny" || len(got.Sizings) != len(want) || got.Sizings[0] != want[0] {
		t.Errorf("--json: %+v\nwant %+v", got, want)
	}
	if code, _, stderr := eprun(t, "size", "tiny", "--rail-gbps", "0"); code == 0 || !strings.Contains(stderr, "link rates") {
		t.Errorf("--rail-gbps 0: exit %d, %s", code, stderr)
	}
}
