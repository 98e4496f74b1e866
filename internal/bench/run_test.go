package bench

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/goep/goep/device"
	"github.com/goep/goep/executor"
)

// runProgress runs c in process, failing t on an error, and checks that
// the progress reports reached every step of Options.Steps.
func runProgress(t *testing.T, c Config) *Result {
	t.Helper()
	steps := 0
	res, err := Run(t.Context(), c, Options{Progress: func(p Progress) { steps = p.Done }})
	if err != nil {
		t.Fatal(err)
	}
	if want := (Options{}).Steps(c); steps != want {
		t.Errorf("progress reached %d steps, want %d", steps, want)
	}
	return res
}

// TestRun runs small benchmarks end to end on the real engine: every output
// must check, and the numbers must be sane.
func TestRun(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(*Config)
	}{
		{"blocking", func(*Config) {}},
		{"capacity-pad", func(c *Config) { c.Mode, c.Pad, c.DType = Strings{ModeCapacity}, 4, Strings{"fp32"} }},
		{"sweep", func(c *Config) { c.Tokens, c.Hidden = Ints{0, 8}, Ints{16, 40} }},
		{"combine-only", func(c *Config) { c.Calls = []string{CallCombine, CallUnpermuteCombine} }},
		{"two-domains", func(c *Config) { c.RanksPerDomain = 2; c.Calls = append(c.Calls, CallDispatchCombine) }},
		{"dispatch-combine", func(c *Config) { c.Calls = []string{CallDispatchCombine} }},
		{"topk-mode-sweep", func(c *Config) {
			c.TopK, c.Mode, c.Pad, c.Tokens = Ints{2, 3}, Strings{ModeBlocking, ModeCapacity}, 4, Ints{0, 24}
		}},
		{"dispatch-combine-capacity", func(c *Config) {
			c.Mode, c.DType, c.Calls = Strings{ModeCapacity}, Strings{"fp32"}, []string{CallDispatch, CallDispatchCombine}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := Defaults()
			c.Ranks, c.Experts, c.TopK, c.Hidden, c.Tokens, c.Iters, c.Warmup = 4, 8, Ints{3}, Ints{32}, Ints{24}, 3, 1
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
				// Uniform routing: every rank reads some rows from a peer,
				// and some of its own tokens' rows come from itself.
				if r.Tokens > 0 && !(0 < r.NVLPeerBytes && r.NVLPeerBytes < r.NVLBytes && r.NVLPeerGBps > 0) {
					t.Errorf("%s: peer bytes %v (%v GB/s), nvl bytes %v; want 0 < peer < nvl", what, r.NVLPeerBytes, r.NVLPeerGBps, r.NVLBytes)
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
				w := NewRoutedWorld(c.RoutingSpec(), c.Seed, c.Ranks, c.RanksPerDomain, c.Experts, c.TopK[0], c.Hidden[0], device.BF16, []int{24, 24, 24, 24})
				rb := float64(c.Hidden[0] * device.BF16.Size())
				var cross, flat, peer float64
				for s := range c.Ranks {
					cross += float64(w.CrossDomainRows(s)) * rb
					flat += float64(w.FlatRemoteRows(s)) * rb
					peer += float64(w.PeerRows(s)) * rb
				}
				if n := float64(c.Ranks); d.NVLPeerBytes != peer/n || dc.NVLPeerBytes != 2*d.NVLPeerBytes {
					t.Errorf("peer bytes: dispatch %v, dispatch-combine %v; want the world's mean %v, and twice that", d.NVLPeerBytes, dc.NVLPeerBytes, peer/n)
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
	c.Ranks, c.Experts, c.TopK, c.Hidden, c.Tokens, c.Iters, c.Warmup = 4, 8, Ints{3}, Ints{32}, Ints{24}, 2, 0
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

// TestRunTopKModeSweep: a sweep over top-k and mode gives one row per
// call and case, in Cases order, each naming its top-k and mode, with
// every output checked on an engine of the case's top-k and mode.
func TestRunTopKModeSweep(t *testing.T) {
	c := Defaults()
	c.Ranks, c.Experts, c.Hidden, c.Tokens, c.Iters, c.Warmup = 4, 16, Ints{32}, Ints{24}, 2, 0
	c.TopK, c.Mode, c.Pad = Ints{2, 5}, Strings{ModeCapacity, ModeBlocking}, 2
	res, err := Run(t.Context(), c, Options{})
	if err != nil {
		t.Fatal(err)
	}
	var got, want []string
	for _, k := range c.Cases() {
		for _, call := range c.Calls {
			want = append(want, fmt.Sprintf("%s/%s/%d", call, k.Mode, k.TopK))
		}
	}
	recv := map[string]int{} // mode/topk: dispatch rows received over ranks
	for _, r := range res.Rows {
		got = append(got, fmt.Sprintf("%s/%s/%d", r.Call, r.Mode, r.TopK))
		if r.CheckedRows == 0 || r.Wrong != 0 || r.A2AWrong != 0 {
			t.Errorf("%s %s topk %d: %d rows checked, %d wrong, a2a %d wrong", r.Call, r.Mode, r.TopK, r.CheckedRows, r.Wrong, r.A2AWrong)
		}
		n := 0
		for _, x := range r.RecvRows {
			n += x
		}
		recv[fmt.Sprintf("%s/%d", r.Mode, r.TopK)] = n
	}
	if !slices.Equal(got, want) {
		t.Errorf("rows\n%v\nwant\n%v", got, want)
	}
	// More slots per token reach more ranks; the mode does not change the
	// routing.
	for _, m := range c.Mode {
		if k2, k5 := recv[m+"/2"], recv[m+"/5"]; !(0 < k2 && k2 < k5) {
			t.Errorf("%s: %d rows received with topk 2, %d with topk 5", m, k2, k5)
		}
	}
	if recv["blocking/5"] != recv["capacity/5"] {
		t.Errorf("topk 5 received %d rows blocking, %d capacity", recv["blocking/5"], recv["capacity/5"])
	}
}

// TestCaseEngineConfig: every case's engine has the case's top-k, mode and
// tuning knobs, and capacities left at 0 are the worst case of that case's
// top-k (so a larger top-k later in the sweep never overflows the first
// one's).
func TestCaseEngineConfig(t *testing.T) {
	c := Defaults()
	c.Ranks, c.Experts, c.Tokens, c.Pad = 4, 16, Ints{8, 24}, 3 // 4 local experts
	c.TopK, c.Mode = Ints{2, 6}, Strings{ModeBlocking, ModeCapacity}
	c.SMs, c.ChunkRows = Ints{0, 3}, Ints{5, 0}
	for _, explicit := range []bool{false, true} {
		if explicit {
			c.MaxRecvTokens, c.MaxPermutedTokens = 100, 500
		}
		for _, k := range c.Cases() {
			rs, err := newRankState(c, k, 0)
			if err != nil {
				t.Fatal(err)
			}
			e := rs.ecfg
			what := fmt.Sprintf("explicit %v, %s topk %d tokens %d", explicit, k.Mode, k.TopK, k.Tokens)
			if e.TopK != k.TopK || rs.world.TopK != k.TopK || e.MaxTokensPerRank != 24 {
				t.Errorf("%s: engine topk %d, world topk %d, max tokens %d", what, e.TopK, rs.world.TopK, e.MaxTokensPerRank)
			}
			if e.SMs != k.SMs || e.ChunkRows != k.ChunkRows {
				t.Errorf("%s sms %d chunk_rows %d: engine SMs %d, ChunkRows %d", what, k.SMs, k.ChunkRows, e.SMs, e.ChunkRows)
			}
			recv, perm := 0, 0
			if k.Mode == ModeCapacity {
				recv, perm = 4*24, 4*24*min(k.TopK, 4)+4*(3-1)
				if explicit {
					recv, perm = 100, 500
				}
			}
			if wantMode := (k.Mode == ModeCapacity); (e.Mode == executor.Capacity) != wantMode {
				t.Errorf("%s: engine mode %v", what, e.Mode)
			}
			if e.MaxRecvTokens != recv || e.MaxPermutedTokens != perm {
				t.Errorf("%s: capacities %d, %d; want %d, %d", what, e.MaxRecvTokens, e.MaxPermutedTokens, recv, perm)
			}
		}
	}
}

// TestRunCapacityOverflowNamesCase: a capacity too small for one case
// fails with an error that names the case, mode and top-k included.
func TestRunCapacityOverflowNamesCase(t *testing.T) {
	c := Defaults()
	c.Ranks, c.Experts, c.Hidden, c.Tokens, c.Iters, c.Warmup = 2, 4, Ints{8}, Ints{8}, 1, 0
	// topk 1: at most 2 ranks x 8 tokens = 16 permuted rows per rank;
	// topk 4 of 4 experts: every token in both local experts, 32.
	c.TopK, c.Mode, c.MaxPermutedTokens = Ints{1, 4}, Strings{ModeCapacity}, 16
	res, err := Run(t.Context(), c, Options{CheckOnly: true})
	if err == nil || !strings.Contains(err.Error(), "mode=capacity topk=4 tokens=8 hidden=8 dtype=bf16: ") || strings.Contains(err.Error(), "\n") {
		t.Errorf("error %v, want one line naming mode=capacity topk=4", err)
	}
	if res == nil || len(res.Rows) != len(c.Calls) || res.Rows[0].TopK != 1 || res.Wrong() != 0 {
		t.Errorf("want the rows of the topk 1 case, which fits; got %+v", res)
	}
}

// TestRunCount: a config of count 3 runs the whole sweep three times, a
// row per call, case and repetition, in that order (repetition
// outermost), every one measured and checked; progress says which
// repetition runs, and its steps and work reach the totals.
func TestRunCount(t *testing.T) {
	c := Defaults()
	c.Ranks, c.Experts, c.TopK, c.Hidden, c.Tokens, c.Iters, c.Warmup = 2, 4, Ints{2}, Ints{16}, Ints{4, 8}, 2, 0
	c.Calls, c.Count = []string{CallDispatch, CallCombine}, 3
	var last Progress
	reps := map[int]bool{}
	res, err := Run(t.Context(), c, Options{Progress: func(p Progress) {
		if p.Work < last.Work || p.Done < last.Done {
			t.Errorf("progress went back: %+v after %+v", p, last)
		}
		last = p
		reps[p.Rep] = true
	}})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range res.Rows {
		got = append(got, fmt.Sprintf("%d/%d/%s", r.Rep, r.Tokens, r.Call))
		if r.Time.N != c.Iters || r.CheckedRows == 0 || r.Wrong != 0 || r.A2A == nil {
			t.Errorf("rep %d tokens %d %s: %d iterations, %d of %d rows wrong, a2a %v", r.Rep, r.Tokens, r.Call, r.Time.N, r.Wrong, r.CheckedRows, r.A2A)
		}
	}
	var want []string
	for rep := 1; rep <= 3; rep++ {
		for _, tok := range []int{4, 8} {
			for _, call := range c.Calls {
				want = append(want, fmt.Sprintf("%d/%d/%s", rep, tok, call))
			}
		}
	}
	if !slices.Equal(got, want) {
		t.Errorf("rows (rep/tokens/call)\n%v\nwant\n%v", got, want)
	}
	one := c
	one.Count = 1
	if steps := (Options{}).Steps(c); last.Done != steps || last.Total != steps || steps != 3*(Options{}).Steps(one) {
		t.Errorf("progress reached %d of %d steps; Steps %d, want 3 x %d", last.Done, last.Total, steps, (Options{}).Steps(one))
	}
	if last.Reps != 3 || !reps[1] || !reps[2] || !reps[3] || last.Cases != 2 {
		t.Errorf("progress reported repetitions %v of %d, %d cases; want 1, 2 and 3 of 3, 2 cases", reps, last.Reps, last.Cases)
	}
	if last.TotalWork <= 0 || math.Abs(last.Work-last.TotalWork) > 1e-9*last.TotalWork {
		t.Errorf("work reached %v of %v, want all of it", last.Work, last.TotalWork)
	}
}

// TestRunCountFailureKeepsRows: a case that fails in the second
// repetition ends the run with the rows measured before it (the first
// repetition's and the second's cases before), and the error names the
// case and the repetition.
func TestRunCountFailureKeepsRows(t *testing.T) {
	c := Defaults()
	c.Ranks, c.Experts, c.TopK, c.Hidden, c.Tokens, c.Iters, c.Warmup = 2, 4, Ints{2}, Ints{16}, Ints{4, 8}, 1, 0
	c.Calls, c.Count = []string{CallDispatch}, 2
	boom := errors.New("boom")
	setups := 0 // rank 1's
	res, err := Run(t.Context(), c, Options{CheckOnly: true, testHook: func(ctx context.Context, rank int, step string) error {
		if rank == 1 && step == "setup" {
			if setups++; setups == 4 { // the second repetition's second case
				return boom
			}
		}
		return nil
	}})
	if !errors.Is(err, boom) || !strings.Contains(err.Error(), "tokens=8 hidden=16 dtype=bf16 rep=2/2: ") {
		t.Fatalf("Run: %v; want boom, naming tokens=8 and rep=2/2", err)
	}
	var got []string
	for _, r := range res.Rows {
		got = append(got, fmt.Sprintf("%d/%d", r.Rep, r.Tokens))
	}
	if want := []string{"1/4", "1/8", "2/4"}; !slices.Equal(got, want) {
		t.Errorf("rows (rep/tokens) %v, want %v", got, want)
	}
	rec := NewRecord(Env{}, c, res, err)
	if !rec.Incomplete || !strings.Contains(rec.CheckLine(), "# check: INCOMPLETE, 3 of 4 rows measured (") {
		t.Errorf("record incomplete %v, check line %q; want incomplete, 3 of 4 rows", rec.Incomplete, rec.CheckLine())
	}
}

// TestRunFP8 runs fp8 cases end to end: dispatch and dispatch-permute move
// fp8 rows with their scales, the calls that combine run in bf16, every
// output checks (goep's and the a2a baseline's), and the bytes are the
// rows' as each call moves them, DESIGN.md section 6: fp8 rows of hidden +
// hidden/128 x 4 bytes, bf16 rows of 2 x hidden, with a copy baseline of
// each.
func TestRunFP8(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(*Config)
	}{
		{"blocking", func(*Config) {}},
		{"capacity-pad-two-domains-every-call", func(c *Config) {
			c.Mode, c.Pad, c.RanksPerDomain, c.Calls = Strings{ModeCapacity}, 4, 2, slices.Clone(KnownCalls)
		}},
		{"sweep-bf16-fp8", func(c *Config) { c.DType, c.Hidden, c.Tokens = Strings{"bf16", "fp8"}, Ints{128, 256}, Ints{0, 24} }},
		{"dispatch-only", func(c *Config) { c.Calls = []string{CallDispatchPermute, CallDispatch} }},
		{"combine-only", func(c *Config) { c.Calls = []string{CallUnpermuteCombine, CallCombine} }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := Defaults()
			c.Ranks, c.Experts, c.TopK, c.Hidden, c.Tokens, c.Iters, c.Warmup = 4, 8, Ints{3}, Ints{128}, Ints{24}, 2, 1
			c.DType = Strings{"fp8"}
			tc.edit(&c)
			res := runProgress(t, c)
			if len(res.Rows) != len(c.Cases())*len(c.Calls) {
				t.Fatalf("%d rows, want %d", len(res.Rows), len(c.Cases())*len(c.Calls))
			}
			if res.Wrong() != 0 || res.Checked() == 0 {
				t.Errorf("%d of %d rows wrong", res.Wrong(), res.Checked())
			}
			for i, r := range res.Rows {
				k := c.Cases()[i/len(c.Calls)]
				what := fmt.Sprintf("%s %s tokens=%d hidden=%d", r.Call, k.DType, r.Tokens, r.Hidden)
				wantDT := k.DType
				if k.DType == device.FP8E4M3 && combines(r.Call) {
					wantDT = device.BF16
				}
				wantRB := r.Hidden * wantDT.Size()
				if wantDT == device.FP8E4M3 {
					wantRB = r.Hidden + r.Hidden/128*4
				}
				if r.DType != wantDT.String() || r.CaseDType != k.DType.String() || r.RowBytes != wantRB {
					t.Errorf("%s: dtype %s, case dtype %s, row bytes %d; want %v, %v, %d", what, r.DType, r.CaseDType, r.RowBytes, wantDT, k.DType, wantRB)
				}
				n := 0
				for _, x := range r.RecvRows {
					n += x
				}
				if want := float64(callTrips(r.Call)*n*wantRB) / float64(c.Ranks); math.Abs(r.NVLBytes-want) > 1e-6*want {
					t.Errorf("%s: %v NVLink bytes per rank, want %v (received rows x %d bytes)", what, r.NVLBytes, want, wantRB)
				}
				if r.Tokens == 0 {
					continue
				}
				// goep's capacity outputs have tails to check too.
				if r.CheckedRows == 0 || r.A2ACheckedRows == 0 || (r.Mode == ModeBlocking && r.A2ACheckedRows != r.CheckedRows) || r.A2AWrong != 0 {
					t.Errorf("%s: %d rows checked, a2a %d (%d wrong)", what, r.CheckedRows, r.A2ACheckedRows, r.A2AWrong)
				}
				if r.BaselineGBps <= 0 || r.A2AGBps <= 0 {
					t.Errorf("%s: baseline %v GB/s, a2a %v GB/s", what, r.BaselineGBps, r.A2AGBps)
				}
				if want := r.NVLBytes / float64(callTrips(r.Call)) / (r.Baseline.Median * 1e3); math.Abs(r.BaselineGBps-want) > 1e-9*want {
					t.Errorf("%s: baseline %v GB/s, want the call's bytes over the baseline's time, %v", what, r.BaselineGBps, want)
				}
				if c.RanksPerDomain > 0 {
					w := NewRoutedWorld(c.RoutingSpec(), c.Seed, c.Ranks, c.RanksPerDomain, c.Experts, r.TopK, r.Hidden, wantDT, []int{24, 24, 24, 24})
					rdma := 0
					for s := range c.Ranks {
						rdma += w.RDMARows(s)
					}
					if want := float64(callTrips(r.Call)*rdma*wantRB) / float64(c.Ranks); math.Abs(r.RDMABytes-want) > 1e-6*want {
						t.Errorf("%s: %v RDMA bytes per rank, want %v", what, r.RDMABytes, want)
					}
				}
			}
			// An fp8 case whose calls move both dtypes times a copy of
			// each: the fp8 rows' baseline is not the bf16 rows'.
			for i := 0; i+1 < len(res.Rows); i++ {
				a, b := res.Rows[i], res.Rows[i+1]
				if sameCase(a, b) && a.DType != b.DType && a.Baseline == b.Baseline {
					t.Errorf("%s (%s) and %s (%s) share a baseline %+v", a.Call, a.DType, b.Call, b.DType, a.Baseline)
				}
			}
		})
	}
}

// TestStepsFP8: an fp8 case with calls of both kinds has two copy
// baselines (fp8 rows with their scales, bf16 rows), one without calls
// that combine only the fp8 one.
func TestStepsFP8(t *testing.T) {
	c := Defaults()
	c.DType, c.Hidden, c.Tokens, c.Iters, c.Warmup = Strings{"bf16", "fp8"}, Ints{128}, Ints{8}, 3, 1
	calls := len(c.Calls)
	if got, want := (Options{}).Steps(c), ((2*calls+1)+(2*calls+2))*4; got != want {
		t.Errorf("bf16,fp8: %d steps, want %d", got, want)
	}
	if got, want := (Options{CheckOnly: true}).Steps(c), 2*calls*4; got != want {
		t.Errorf("bf16,fp8 check only: %d steps, want %d", got, want)
	}
	c.Calls = []string{CallDispatch, CallDispatchPermute}
	if got, want := (Options{}).Steps(c), 2*(2*2+1)*4; got != want {
		t.Errorf("dispatch calls only: %d steps, want %d", got, want)
	}
	k := Case{DType: device.FP8E4M3, Hidden: 256}
	if got := k.callDTypes(KnownCalls); !slices.Equal(got, []device.DType{device.FP8E4M3, device.BF16}) {
		t.Errorf("fp8 case's call dtypes %v, want fp8, bf16", got)
	}
	if got := (Case{DType: device.FP32}).callDTypes(KnownCalls); !slices.Equal(got, []device.DType{device.FP32}) {
		t.Errorf("fp32 case's call dtypes %v, want fp32", got)
	}
	for _, tc := range []struct {
		dt   device.DType
		h, b int
	}{{device.FP8E4M3, 128, 132}, {device.FP8E4M3, 7168, 7168 + 56*4}, {device.BF16, 7168, 14336}, {device.FP32, 100, 400}} {
		if got := RowBytes(tc.dt, tc.h); got != tc.b {
			t.Errorf("RowBytes(%v, %d) = %d, want %d", tc.dt, tc.h, got, tc.b)
		}
	}
}
