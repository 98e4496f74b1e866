package bench

import (
	"context"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/goep/goep/comm"
	"github.com/goep/goep/device"
)

func TestMinHostBytes(t *testing.T) {
	c := Defaults()
	c.Ranks, c.Experts, c.Calls = 4, 16, []string{CallDispatch}
	cs := Case{Tokens: 100, Hidden: 1024, TopK: 8, DType: device.BF16}
	// routing 4 x 100 x 8 x 4, x 100 x 2048 (on the host and in "device"
	// memory), weights 100 x 8 x 4, the layout's tables 8 x (2 x 4 x 4 +
	// 2 x 4 x 16); per rank, 4 ranks in the process.
	const tables = 8 * (2*4*4 + 2*4*16)
	perRank := 4*100*8*4 + 2*100*2048 + 100*8*4 + tables
	if got := minHostBytes(c, cs, 4); got != float64(4*perRank) {
		t.Errorf("dispatch, host backend: %v, want %d", got, 4*perRank)
	}
	c.Calls = []string{CallDispatch, CallCombine}
	if got := minHostBytes(c, cs, 1); got != float64(perRank+100*2048) {
		t.Errorf("with combine, one rank: %v, want %d (the combined output too)", got, perRank+100*2048)
	}
	c.Backend = BackendCUDA
	if got := minHostBytes(c, cs, 1); got != float64(perRank-100*2048) {
		t.Errorf("cuda backend: %v, want %d (no host copy of x or output)", got, perRank-100*2048)
	}
	// fp8: rows of 1024 bytes and 8 fp32 scales; an fp8 case whose calls
	// combine holds bf16 inputs too (on the host and, on the host
	// backend, in "device" memory) and a bf16 combined output.
	c.Backend, c.Calls = "", []string{CallDispatch, CallDispatchPermute}
	fp8 := Case{Tokens: 100, Hidden: 1024, TopK: 8, DType: device.FP8E4M3}
	perRank8 := 4*100*8*4 + 2*100*(1024+8*4) + 100*8*4 + tables
	if got := minHostBytes(c, fp8, 1); got != float64(perRank8) {
		t.Errorf("fp8 dispatch calls, host backend: %v, want %d", got, perRank8)
	}
	c.Calls = AllCalls
	if got := minHostBytes(c, fp8, 1); got != float64(perRank8+3*100*2048) {
		t.Errorf("fp8 with combine, host backend: %v, want %d", got, perRank8+3*100*2048)
	}
	c.Backend = BackendCUDA
	if got, want := minHostBytes(c, fp8, 1), 4*100*8*4+100*(1024+8*4)+100*8*4+100*2048+tables; got != float64(want) {
		t.Errorf("fp8 with combine, cuda backend: %v, want %d", got, want)
	}
	// Sizes Validate allows whose product overflows int64.
	cs.Tokens, cs.Hidden = maxSize, maxSize
	if got := minHostBytes(c, cs, maxSize); got < 1e27 {
		t.Errorf("largest sizes: %v, want their product (no overflow)", got)
	}
	// The layout's tables alone: thousands of ranks with no tokens (they
	// once counted nothing, and such a run took all of the machine).
	c.Ranks, c.Experts = 2048, 2048
	cs.Tokens, cs.Hidden = 0, 1
	if got, want := minHostBytes(c, cs, 2048), 2048*8*(2*2048*2048+2*2048*2048.0); got != want {
		t.Errorf("2048 ranks, 0 tokens: %v, want %v (the layout's tables)", got, want)
	}
}

// TestRunRefusesWhatCannotFit: a run whose lower bound of host memory
// (here 384 MiB a rank) exceeds what is available (256 MiB, as the test says)
// fails with an error naming the case and both sizes, before it allocates;
// a run that fits is not refused.
func TestRunRefusesWhatCannotFit(t *testing.T) {
	old := availableMemory
	t.Cleanup(func() { availableMemory = old })
	availableMemory = func() (float64, bool) { return 256 << 20, true }
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	c := Defaults()
	c.Ranks, c.Experts, c.TopK, c.Hidden, c.Tokens, c.Iters, c.Warmup = 2, 8, Ints{2}, Ints{1 << 18}, Ints{256}, 1, 0
	for _, run := range []struct {
		name, need string
		f          func() error
	}{
		{"Run", "0.8 GiB of host memory for its 2 rank(s)", func() error { _, err := Run(ctx, c, Options{}); return err }},
		{"RunRank", "0.4 GiB of host memory for its 1 rank(s)", func() error {
			g := comm.NewLocal(2)
			defer func() {
				for _, x := range g {
					x.Close()
				}
			}()
			_, err := RunRank(ctx, c, g[0], Options{})
			return err
		}},
	} {
		err := run.f()
		want := []string{"tokens=256 hidden=262144 topk=2 dtype=bf16 needs at least " + run.need, "and 0.2 GiB is available"}
		if err == nil || !strings.Contains(err.Error(), want[0]) || !strings.Contains(err.Error(), want[1]) {
			t.Fatalf("%s: got %v, want an error with %q", run.name, err, want)
		}
	}
	if _, err := c.CheckMemory(2, false); !errors.Is(err, ErrMemory) || !strings.Contains(err.Error(), "for its 2 rank(s) in this process") {
		t.Fatalf("CheckMemory(2): %v", err)
	}
	c.Hidden, c.Tokens = Ints{64}, Ints{32}
	if _, err := c.CheckMemory(2, false); err != nil {
		t.Fatalf("a tiny run refused: %v", err)
	}
	availableMemory = func() (float64, bool) { return 0, false }
	c.Hidden, c.Tokens = Ints{1 << 18}, Ints{256}
	if _, err := c.CheckMemory(2, false); err != nil {
		t.Fatalf("refused with the memory available unknown: %v", err)
	}
}

// TestHostBytesEstimate: the expected rows of the shape measured in
// docs/PERFORMANCE.md (8 ranks, hidden 7168 bf16, top-8 of 64, 1000
// tokens), with and without the a2a baseline.
func TestHostBytesEstimate(t *testing.T) {
	c := Defaults()
	c.Ranks, c.Experts = 8, 64
	cs := Case{Tokens: 1000, Hidden: 7168, TopK: 8, DType: device.BF16}
	none := 1.0
	for i := range 8 {
		none *= float64(56-i) / float64(64-i)
	}
	n := 8 * 1000 * (1 - none) // about 5300 received rows a rank
	row := 7168 * 2.0
	for _, tc := range []struct {
		checkOnly bool
		rows      float64
	}{
		// goep's calls (3T + 2N + 2P) and the copy baseline (2N) hold
		// more than the a2a baseline (3T + 2N + P); the Go heap's inputs
		// (2T) twice at the peak.
		{false, 3*1000 + 2*n + 2*8000 + 2*n + 4*1000},
		{true, 3*1000 + 2*n + 2*8000 + 4*1000},
	} {
		got := hostBytesEstimate(c, cs, 8, tc.checkOnly)
		if want := 8 * tc.rows * row; math.Abs(got-want) > 1 {
			t.Errorf("checkOnly %v: %v, want %v", tc.checkOnly, got, want)
		}
	}
	// The default bench's largest case (configs/default.yaml), measured at
	// 0.94 GB resident.
	if got := hostBytesEstimate(c, Case{Tokens: 1024, Hidden: 2048, TopK: 8, DType: device.BF16}, 8, false) / (1 << 30); got < 1.2 || got > 1.5 {
		t.Errorf("the default bench: %.2f GiB, want about 1.4", got)
	}
	// fp8: rows of 7168 bytes and 56 scales, plus, with calls that
	// combine, bf16 rows of the same count.
	fp8 := cs
	fp8.DType = device.FP8E4M3
	rows := 3*1000 + 2*n + 2*8000 + 2*n + 4*1000
	if got, want := hostBytesEstimate(c, fp8, 8, false), 8*rows*(7168+56*4+7168*2); math.Abs(got-want) > 1 {
		t.Errorf("fp8, every call: %v, want %v", got, want)
	}
	c.Calls = []string{CallDispatch}
	if got, want := hostBytesEstimate(c, fp8, 8, false), 8*rows*(7168+56*4); math.Abs(got-want) > 1 {
		t.Errorf("fp8 dispatch: %v, want %v", got, want)
	}
	// With padding the a2a baseline's buffers are the larger: its
	// permuted rows, besides its messages.
	c.Pad = 1
	wide := Case{Tokens: 10, Hidden: 128, TopK: 8, DType: device.BF16}
	c.Calls = AllCalls
	_, wn, wp, _, _ := expectedRows(c, wide)
	if got, want := hostBytes(c, wide, 1, false, false), max(3*10+4*wn+2*wp, 3*10+2*wn+wp)*256; math.Abs(got-want) > 1e-6 {
		t.Errorf("live rows: %v, want %v", got, want)
	}
}

// TestMemoryDeepSeekPrefill: eprun bench deepseek-v3-prefill at its real
// shape with 8 in-process ranks (4096 tokens, hidden 7168) runs with the
// memory of a 24 GB machine, and is refused before it starts, with the
// case, what it would hold and what is available, on a machine with less.
func TestMemoryDeepSeekPrefill(t *testing.T) {
	old := availableMemory
	t.Cleanup(func() { availableMemory = old })
	c, err := LoadConfig("../../configs/deepseek-v3-prefill.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if c.Ranks != 8 || c.Tokens[0] != 4096 || c.Hidden[0] != 7168 {
		t.Fatalf("config: %d ranks, tokens %v, hidden %v; the test wants the real shape", c.Ranks, c.Tokens, c.Hidden)
	}
	availableMemory = func() (float64, bool) { return 22 << 30, true }
	if w, err := c.CheckMemory(8, false); w != "" || err != nil {
		t.Errorf("22 GiB available: %q, %v; want it to run", w, err)
	}
	availableMemory = func() (float64, bool) { return 12 << 30, true }
	_, err = c.CheckMemory(8, false)
	for _, want := range []string{"tokens=4096 hidden=7168 topk=8 dtype=bf16", "is expected to hold about 17.", "for its 8 rank(s)", "12.0 GiB is available"} {
		if !errors.Is(err, ErrMemory) || !strings.Contains(err.Error(), want) {
			t.Errorf("12 GiB available: %v; want a refusal saying %q", err, want)
		}
	}
}

// TestMemoryBands: with the memory available between the rows a run
// holds at once and its expected peak (the Go heap's growth included), the
// run probably fits: a warning, logged once, and it runs. Above the peak:
// nothing. Below the rows held at once, or a quarter and more below the
// peak: refused, with an error wrapping ErrMemory, unless forced
// (Options.ForceMemory: the refusal is logged and the run goes on). eprun
// check holds no baseline rows. Nothing is said
// on the cuda backend or with the memory unknown.
func TestMemoryBands(t *testing.T) {
	old := availableMemory
	t.Cleanup(func() { availableMemory = old })
	c := Defaults()
	c.Ranks, c.Experts, c.TopK, c.Hidden, c.Tokens, c.Iters, c.Warmup = 4, 8, Ints{1}, Ints{64}, Ints{32}, 1, 0
	cs := c.Cases()[0]
	live, peak := hostBytes(c, cs, 4, false, false), hostBytes(c, cs, 4, false, true)
	checkLive := hostBytes(c, cs, 4, true, false)
	checkPeak := hostBytes(c, cs, 4, true, true)
	if lower := minHostBytes(c, cs, 4); !(lower < live && live < peak/(1+peakError) && checkLive < checkPeak) {
		t.Fatalf("lower bound %v, live %v, peak %v, check %v and %v: want lower < live < peak/1.25, check's live below its peak", lower, live, peak, checkLive, checkPeak)
	}
	for _, tc := range []struct {
		name      string
		avail     float64
		checkOnly bool
		force     bool
		want      string // "" none, "warn", "refuse"
		msg       string
	}{
		{"above the peak", peak * 1.01, false, false, "", ""},
		{"below the peak", peak / 1.1, false, false, "warn", "is expected to need up to"},
		{"far below the peak", peak / 1.3, false, false, "refuse", "is expected to need up to"},
		{"below the live rows", live / 1.01, false, false, "refuse", "is expected to hold about"},
		{"below the live rows, forced", live / 1.01, false, true, "warn", "running anyway (forced)"},
		{"check, above its peak", checkPeak * 1.01, true, false, "", ""},
		{"check, below its rows", checkLive / 1.01, true, false, "refuse", "is expected to hold about"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			availableMemory = func() (float64, bool) { return tc.avail, true }
			w, err := c.CheckMemory(4, tc.checkOnly)
			switch tc.want {
			case "":
				if w != "" || err != nil {
					t.Errorf("CheckMemory: %q, %v; want nothing", w, err)
				}
			case "warn":
				if !tc.force && (err != nil || !strings.Contains(w, tc.msg) || !strings.Contains(w, "it probably fits")) {
					t.Errorf("CheckMemory: %q, %v; want a warning %q", w, err, tc.msg)
				}
			case "refuse":
				if w != "" || !errors.Is(err, ErrMemory) || !strings.Contains(err.Error(), tc.msg) {
					t.Errorf("CheckMemory: %q, %v; want an error %q", w, err, tc.msg)
				}
			}
			core, logs := observer.New(zap.WarnLevel)
			_, err = Run(t.Context(), c, Options{CheckOnly: tc.checkOnly, ForceMemory: tc.force, Logger: zap.New(core)})
			if (err != nil) != (tc.want == "refuse") || (err != nil && !errors.Is(err, ErrMemory)) {
				t.Errorf("Run: %v; want refused %v", err, tc.want == "refuse")
			}
			warned := logs.FilterMessageSnippet(tc.msg).Len()
			if want := map[bool]int{true: 1}[tc.want == "warn"]; warned != want {
				t.Errorf("Run logged %d warnings %q, want %d: %v", warned, tc.msg, want, logs.All())
			}
		})
	}
	availableMemory = func() (float64, bool) { return live / 2, true }
	c.Backend = BackendCUDA
	if w, err := c.CheckMemory(4, false); w != "" || err != nil {
		t.Errorf("cuda backend: %q, %v", w, err)
	}
	c.Backend = ""
	availableMemory = func() (float64, bool) { return 0, false }
	if w, err := c.CheckMemory(4, false); w != "" || err != nil {
		t.Errorf("memory unknown: %q, %v", w, err)
	}
}

// TestMemoryCountsEverySize: every size of a run is in what CheckMemory
// compares with the memory available, pad and the capacities included. The
// run of the report (eprun check tiny --tokens 512 --hidden 2048 --pad
// 20000, which took 3.9 GB with no warning) is refused with 3 GiB
// available, and fits with pad 1; so with an explicit capacity of 2^24
// permuted rows.
func TestMemoryCountsEverySize(t *testing.T) {
	old := availableMemory
	t.Cleanup(func() { availableMemory = old })
	availableMemory = func() (float64, bool) { return 3 << 30, true }
	tiny := func() Config {
		c := Defaults()
		c.Ranks, c.Experts, c.TopK, c.Hidden, c.Tokens = 4, 24, Ints{2}, Ints{2048}, Ints{512}
		return c
	}
	if _, err := tiny().CheckMemory(4, true); err != nil {
		t.Fatalf("the base run: %v", err)
	}
	for _, tc := range []struct {
		name string
		edit func(*Config)
	}{
		{"pad", func(c *Config) { c.Pad = 20000 }},
		{"max_permuted_tokens", func(c *Config) { c.Mode, c.MaxPermutedTokens = Strings{ModeCapacity}, 1<<24 }},
		{"max_recv_tokens", func(c *Config) { c.Mode, c.MaxRecvTokens = Strings{ModeCapacity}, 1<<24 }},
		{"tokens", func(c *Config) { c.Tokens = Ints{512, 1 << 17} }},
		{"hidden", func(c *Config) { c.Hidden = Ints{1 << 18} }},
		{"topk", func(c *Config) { c.TopK, c.Experts, c.Tokens = Ints{2, 64}, 256, Ints{8192} }},
	} {
		c := tiny()
		tc.edit(&c)
		if err := c.Validate(); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if _, err := c.CheckMemory(4, true); !errors.Is(err, ErrMemory) {
			t.Errorf("%s: %v; want the run refused", tc.name, err)
		}
	}
}
