package bench

import (
	"errors"
	"fmt"
	"testing"

	"github.com/goep/goep/device"
	"github.com/goep/goep/executor"
)

// TestRun runs small benchmarks end to end on the real engine: every output
// must check, and the numbers must be sane.
func TestRun(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(*Config)
	}{
		{"blocking", func(*Config) {}},
		{"capacity-pad", func(c *Config) { c.Mode, c.Pad, c.DType = "capacity", 4, Strings{"fp32"} }},
		{"sweep", func(c *Config) { c.Tokens, c.Hidden = Ints{0, 8}, Ints{16, 40} }},
		{"combine-only", func(c *Config) { c.Calls = []string{CallCombine, CallUnpermuteCombine} }},
		{"two-domains", func(c *Config) { c.RanksPerDomain = 2; c.Calls = append(c.Calls, CallDispatchCombine) }},
		{"dispatch-combine", func(c *Config) { c.Calls = []string{CallDispatchCombine} }},
		{"dispatch-combine-capacity", func(c *Config) {
			c.Mode, c.DType, c.Calls = "capacity", Strings{"fp32"}, []string{CallDispatch, CallDispatchCombine}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := Defaults()
			c.Ranks, c.Experts, c.TopK, c.Hidden, c.Tokens, c.Iters, c.Warmup = 4, 8, 3, Ints{32}, Ints{24}, 3, 1
			tc.edit(&c)
			steps := 0
			res, err := Run(t.Context(), c, Options{Progress: func(p Progress) { steps = p.Done }})
			if errors.Is(err, executor.ErrUnsupported) {
				t.Skipf("the engine does not support this yet: %v", err)
			}
			if err != nil {
				t.Fatal(err)
			}
			cases := len(c.Cases())
			if want := cases * (2*len(c.Calls) + 1) * (c.Iters + c.Warmup); steps != want {
				t.Errorf("progress reached %d steps, want %d", steps, want)
			}
			if len(res.Rows) != cases*len(c.Calls) {
				t.Fatalf("%d rows, want %d", len(res.Rows), cases*len(c.Calls))
			}
			if res.Wrong() != 0 {
				t.Errorf("%d of %d rows wrong", res.Wrong(), res.Checked())
			}
			for _, r := range res.Rows {
				what := fmt.Sprintf("%s tokens=%d hidden=%d", r.Call, r.Tokens, r.Hidden)
				if r.Time.N != c.Iters || r.Time.Median <= 0 || len(r.IterUS) != c.Iters {
					t.Errorf("%s: time %+v", what, r.Time)
				}
				if r.CheckedRows == 0 && r.Tokens > 0 {
					t.Errorf("%s: nothing checked", what)
				}
				if r.Tokens > 0 && (r.NVLGBps <= 0 || r.BaselineGBps <= 0 || r.Ratio <= 0) {
					t.Errorf("%s: bandwidth %v GB/s, baseline %v GB/s, ratio %v", what, r.NVLGBps, r.BaselineGBps, r.Ratio)
				}
				if (c.RanksPerDomain > 0) != (r.RDMAGBps > 0) && r.Tokens > 0 {
					t.Errorf("%s: rdma_GBps %v with ranks_per_domain %d", what, r.RDMAGBps, c.RanksPerDomain)
				}
				if c.RanksPerDomain == 0 && (r.RDMABytes != 0 || r.RDMACrossBytes != 0 || r.RDMAFlatBytes != 0) {
					t.Errorf("%s: one domain, but rdma bytes %v, cross %v, flat %v", what, r.RDMABytes, r.RDMACrossBytes, r.RDMAFlatBytes)
				}
				// Uniform routing of 24 tokens over 2 domains: some tokens
				// cross, some reach their own domain too, and some reach
				// two ranks of the other domain.
				if c.RanksPerDomain > 0 && r.Tokens > 0 &&
					!(0 < r.RDMACrossBytes && r.RDMACrossBytes < r.RDMABytes && r.RDMACrossBytes < r.RDMAFlatBytes) {
					t.Errorf("%s: rdma bytes %v, cross %v, flat %v; want 0 < cross < rdma and cross < flat", what, r.RDMABytes, r.RDMACrossBytes, r.RDMAFlatBytes)
				}
			}
			if c.RanksPerDomain > 0 {
				byCall := map[string]Row{}
				for _, r := range res.Rows {
					byCall[r.Call] = r
				}
				d, dc := byCall[CallDispatch], byCall[CallDispatchCombine]
				if dc.RDMABytes != 2*d.RDMABytes || dc.RDMACrossBytes != 2*d.RDMACrossBytes || dc.RDMAFlatBytes != 2*d.RDMAFlatBytes {
					t.Errorf("dispatch-combine rdma bytes %v, cross %v, flat %v; want twice the dispatch's %v, %v, %v",
						dc.RDMABytes, dc.RDMACrossBytes, dc.RDMAFlatBytes, d.RDMABytes, d.RDMACrossBytes, d.RDMAFlatBytes)
				}
				w := NewRoutedWorld(c.RoutingSpec(), c.Seed, c.Ranks, c.RanksPerDomain, c.Experts, c.TopK, c.Hidden[0], device.BF16, []int{24, 24, 24, 24})
				rb := float64(c.Hidden[0] * device.BF16.Size())
				var cross, flat float64
				for s := range c.Ranks {
					cross += float64(w.CrossDomainRows(s)) * rb
					flat += float64(w.FlatRemoteRows(s)) * rb
				}
				if n := float64(c.Ranks); d.RDMACrossBytes != cross/n || d.RDMAFlatBytes != flat/n {
					t.Errorf("dispatch: cross %v, flat %v; want the world's mean %v, %v", d.RDMACrossBytes, d.RDMAFlatBytes, cross/n, flat/n)
				}
			}
		})
	}
}

func TestRunInvalid(t *testing.T) {
	c := Defaults()
	c.Experts = 9
	if _, err := Run(t.Context(), c, Options{}); err == nil {
		t.Fatal("Run accepted 9 experts on 8 ranks")
	}
}

// TestDispatchCombineBytes: the round trip counts the dispatch's bytes
// twice, for goep and for the a2a baseline, and checks both its outputs
// (the dispatched rows and their combine) on every rank.
func TestDispatchCombineBytes(t *testing.T) {
	c := Defaults()
	c.Ranks, c.Experts, c.TopK, c.Hidden, c.Tokens, c.Iters, c.Warmup = 4, 8, 3, Ints{32}, Ints{24}, 2, 0
	c.Calls = []string{CallDispatch, CallCombine, CallDispatchCombine}
	res, err := Run(t.Context(), c, Options{})
	if err != nil {
		t.Fatal(err)
	}
	rows := map[string]Row{}
	for _, r := range res.Rows {
		rows[r.Call] = r
	}
	d, cb, dc := rows[CallDispatch], rows[CallCombine], rows[CallDispatchCombine]
	if d.NVLBytes <= 0 || dc.NVLBytes != 2*d.NVLBytes {
		t.Errorf("dispatch-combine moves %v bytes per rank, want twice the dispatch's %v", dc.NVLBytes, d.NVLBytes)
	}
	if want := dc.NVLBytes / (dc.Time.Median * 1e3); dc.NVLGBps != want {
		t.Errorf("dispatch-combine %v GB/s, want %v", dc.NVLGBps, want)
	}
	if want := dc.NVLBytes / (dc.A2A.Median * 1e3); dc.A2AGBps != want {
		t.Errorf("a2a dispatch-combine %v GB/s, want %v", dc.A2AGBps, want)
	}
	if want := d.CheckedRows + cb.CheckedRows; dc.CheckedRows != want || dc.A2ACheckedRows != want {
		t.Errorf("dispatch-combine checked %d rows (a2a %d), want %d (the dispatch's and the combine's)", dc.CheckedRows, dc.A2ACheckedRows, want)
	}
	if res.Wrong() != 0 {
		t.Errorf("%d of %d rows wrong", res.Wrong(), res.Checked())
	}
}
