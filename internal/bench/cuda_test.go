//go:build cuda && cgo

package bench

import (
	"flag"
	"slices"
	"testing"

	"github.com/goep/goep/comm"
)

var gpu = flag.Bool("gpu", false, "run the tests that need a GPU (GOEP_DEVICE, default 0)")

// TestRunCUDA runs small benchmarks on the cuda backend end to end, in
// process (4 ranks sharing the GPU) and through RunRank: every output
// checks, times come from CUDA events, the device copy baseline ran and
// the a2a baseline did not.
func TestRunCUDA(t *testing.T) {
	if !*gpu {
		t.Skip("run the test binary with -gpu on a GPU host")
	}
	for _, tc := range []struct {
		name string
		edit func(*Config)
	}{
		{"blocking", func(*Config) {}},
		{"capacity-pad-fp32", func(c *Config) { c.Mode, c.Pad, c.DType = Strings{ModeCapacity}, 4, Strings{"fp32"} }},
		{"sweep-zero-tokens", func(c *Config) { c.Tokens = Ints{0, 8} }},
		{"dispatch-combine", func(c *Config) { c.Calls = []string{CallDispatchCombine} }},
		{"fp8-every-call", func(c *Config) { c.DType, c.Hidden, c.Calls = Strings{"fp8"}, Ints{256}, slices.Clone(KnownCalls) }},
		{"fp8-capacity-pad", func(c *Config) {
			c.DType, c.Hidden, c.Mode, c.Pad = Strings{"fp8"}, Ints{128}, Strings{ModeCapacity}, 4
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := Defaults()
			c.Backend = BackendCUDA
			c.Ranks, c.Experts, c.TopK, c.Hidden, c.Tokens, c.Iters, c.Warmup = 4, 8, Ints{3}, Ints{64}, Ints{24}, 3, 1
			tc.edit(&c)
			res := runProgress(t, c)
			if res.Timing != TimingEventMax || res.A2ATransport != "" {
				t.Errorf("timing %q, a2a transport %q; want event_max and none", res.Timing, res.A2ATransport)
			}
			if res.Wrong() != 0 || res.Checked() == 0 {
				t.Errorf("%d of %d rows wrong", res.Wrong(), res.Checked())
			}
			for _, r := range res.Rows {
				if r.Time.N != c.Iters || r.Time.Median <= 0 || r.A2A != nil {
					t.Errorf("%s tokens %d: time %+v, a2a %v", r.Call, r.Tokens, r.Time, r.A2A)
				}
				if r.Tokens > 0 && (r.BaselineGBps <= 0 || r.CheckedRows == 0) {
					t.Errorf("%s tokens %d: baseline %v GB/s, %d rows checked", r.Call, r.Tokens, r.BaselineGBps, r.CheckedRows)
				}
			}
		})
	}
	t.Run("rank", func(t *testing.T) {
		c := Defaults()
		c.Backend = BackendCUDA
		c.Ranks, c.Experts, c.TopK, c.Hidden, c.Tokens, c.Iters, c.Warmup = 1, 8, Ints{3}, Ints{64}, Ints{24}, 2, 1
		g := comm.NewLocal(1)[0]
		defer g.Close()
		res, err := RunRank(t.Context(), c, g, Options{CheckOnly: true})
		if err != nil {
			t.Fatal(err)
		}
		if res.Wrong() != 0 || res.Checked() == 0 || res.Timing != TimingEventMax {
			t.Errorf("%d of %d rows wrong, timing %q", res.Wrong(), res.Checked(), res.Timing)
		}
	})
}
