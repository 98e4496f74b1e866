package bench

import (
	"context"
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
	if err := c.CheckMemory(2); err == nil || !strings.Contains(err.Error(), "for its 2 rank(s) in this process") {
		t.Fatalf("CheckMemory(2): %v", err)
	}
	c.Hidden, c.Tokens = Ints{64}, Ints{32}
	if err := c.CheckMemory(2); err != nil {
		t.Fatalf("a tiny run refused: %v", err)
	}
	availableMemory = func() (float64, bool) { return 0, false }
	c.Hidden, c.Tokens = Ints{1 << 18}, Ints{256}
	if err := c.CheckMemory(2); err != nil {
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
		{false, 2 * (2*1000 + 6*n + 2*8000)},
		{true, 3*1000 + 3*n + 8000},
	} {
		got := hostBytesEstimate(c, cs, 8, tc.checkOnly)
		if want := 8 * tc.rows * row; math.Abs(got-want) > 1 {
			t.Errorf("checkOnly %v: %v, want %v", tc.checkOnly, got, want)
		}
	}
	if got := hostBytesEstimate(c, cs, 8, false) / 1e9; got < 11 || got > 12 {
		t.Errorf("the measured shape: %.1f GB, want about 11.4", got)
	}
	// fp8: rows of 7168 bytes and 56 scales, plus, with calls that
	// combine, bf16 rows of the same count.
	fp8 := cs
	fp8.DType = device.FP8E4M3
	rows := 2 * (2*1000 + 6*n + 2*8000)
	if got, want := hostBytesEstimate(c, fp8, 8, false), 8*rows*(7168+56*4+7168*2); math.Abs(got-want) > 1 {
		t.Errorf("fp8, every call: %v, want %v", got, want)
	}
	c.Calls = []string{CallDispatch}
	if got, want := hostBytesEstimate(c, fp8, 8, false), 8*rows*(7168+56*4); math.Abs(got-want) > 1 {
		t.Errorf("fp8 dispatch: %v, want %v", got, want)
	}
}

// TestMemoryWarning: a run whose estimate exceeds the memory available,
// though its lower bound does not, is logged as a warning and still runs;
// none on the cuda backend or with the memory unknown.
func TestMemoryWarning(t *testing.T) {
	old := availableMemory
	t.Cleanup(func() { availableMemory = old })
	c := Defaults()
	c.Ranks, c.Experts, c.TopK, c.Hidden, c.Tokens, c.Iters, c.Warmup = 4, 8, Ints{2}, Ints{64}, Ints{32}, 1, 0
	var lower, est float64
	for _, cs := range c.Cases() {
		lower, est = minHostBytes(c, cs, 4), hostBytesEstimate(c, cs, 4, false)
	}
	if lower >= est {
		t.Fatalf("lower bound %v not below the estimate %v", lower, est)
	}
	availableMemory = func() (float64, bool) { return (lower + est) / 2, true }
	core, logs := observer.New(zap.WarnLevel)
	if _, err := Run(t.Context(), c, Options{Logger: zap.New(core)}); err != nil {
		t.Fatal(err)
	}
	if w := logs.FilterMessageSnippet("is expected to need about").All(); len(w) != 1 {
		t.Fatalf("%d warnings logged, want 1: %v", len(w), logs.All())
	}
	if w := c.MemoryWarning(4, true); w != "" {
		t.Errorf("check only, far less memory: %q", w)
	}
	c.Backend = BackendCUDA
	if w := c.MemoryWarning(4, false); w != "" {
		t.Errorf("cuda backend: %q", w)
	}
	c.Backend = ""
	availableMemory = func() (float64, bool) { return 0, false }
	if w := c.MemoryWarning(4, false); w != "" {
		t.Errorf("memory unknown: %q", w)
	}
}
