package main

import (
	"image/png"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/goep/goep/internal/bench"
)

func TestPlot(t *testing.T) {
	dir := t.TempDir()
	rec := filepath.Join(dir, "results.json")
	eprunOK(t, append(tiny, "--tokens", "8,16,32", "--json", rec)...)
	out := filepath.Join(dir, "out.png")
	stdout, _ := eprunOK(t, "plot", rec, "-o", out)
	if !strings.Contains(stdout, out) {
		t.Errorf("stdout %q does not name %s", stdout, out)
	}
	f, err := os.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatalf("not a PNG: %v", err)
	}
	b := img.Bounds()
	if b.Dx() < 800 || b.Dy() < 300 {
		t.Errorf("image is %dx%d, want at least 800x300", b.Dx(), b.Dy())
	}
	colours := map[[4]uint32]bool{}
	ink := 0
	for y := b.Min.Y; y < b.Max.Y; y++ {
		for x := b.Min.X; x < b.Max.X; x++ {
			r, g, bl, a := img.At(x, y).RGBA()
			colours[[4]uint32{r, g, bl, a}] = true
			if a > 0 && (r < 0xf000 || g < 0xf000 || bl < 0xf000) {
				ink++
			}
		}
	}
	// Axes, text and eight coloured lines: many colours (anti-aliased),
	// and a few percent of the pixels inked.
	if len(colours) < 20 {
		t.Errorf("%d distinct colours: the plot looks blank", len(colours))
	}
	if frac := float64(ink) / float64(b.Dx()*b.Dy()); frac < 0.01 {
		t.Errorf("%.2f%% of the pixels are not white: the plot looks blank", 100*frac)
	}

	// Two records, svg, and the default output name.
	code, _, stderr := eprun(t, "plot", rec, rec, "-o", filepath.Join(dir, "two.svg"))
	if code != 0 {
		t.Errorf("plot two records to svg: exit %d: %s", code, stderr)
	}
	code, _, stderr = eprun(t, "plot", rec)
	if _, err := os.Stat(filepath.Join(dir, "results.png")); code != 0 || err != nil {
		t.Errorf("plot without -o: exit %d, %v: %s", code, err, stderr)
	}
}

// TestPlotOneTokenCount: a record of one token count, 1, plots (a log
// axis widened around 1 reached 0, and gonum panicked).
func TestPlotOneTokenCount(t *testing.T) {
	dir := t.TempDir()
	rec := filepath.Join(dir, "one.json")
	eprunOK(t, append(tiny, "--tokens", "1", "--json", rec)...)
	eprunOK(t, "plot", rec, "-o", filepath.Join(dir, "one.png"))
}

func TestPlotBadUsage(t *testing.T) {
	dir := t.TempDir()
	notJSON := writeFile(t, dir, "x.json", "# call tokens\n")
	empty := writeFile(t, dir, "empty.json", `{"rows": []}`)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"plot"}, "requires at least 1 arg"},
		{[]string{"plot", filepath.Join(dir, "none.json")}, "no such file"},
		{[]string{"plot", notJSON}, "not an eprun bench --json record"},
		{[]string{"plot", empty}, "no rows to plot"},
		{[]string{"plot", empty, "-o", "out.gif"}, "want a .png, .svg or .pdf"},
		{[]string{"plot", empty, "--width", "0"}, "--width 0"},
	} {
		code, stdout, stderr := eprun(t, tc.args...)
		if code != 2 || stdout != "" || !strings.HasPrefix(stderr, "eprun: ") || strings.Count(stderr, "\n") != 1 || !strings.Contains(stderr, tc.want) {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want 2 and one line with %q", tc.args, code, stdout, stderr, tc.want)
		}
	}
}

// TestPlotSweepGroups: a sweep over top-k and mode gives one line per call
// and case, each with the tokens of that case only.
func TestPlotSweepGroups(t *testing.T) {
	rec := filepath.Join(t.TempDir(), "sweep.json")
	eprunOK(t, append(tiny, "--tokens", "8,16", "--topk", "2,4", "--mode", "blocking,capacity", "--json", rec)...)
	r := readRecord(t, rec)
	all, _, _ := plotSeries([]plotRun{{"sweep", r}})
	calls := map[string]bool{}
	for _, row := range r.Rows {
		calls[row.Call] = true
	}
	lines := 0
	for _, s := range all {
		if s.dashed {
			continue // baselines
		}
		lines++
		if len(s.bw) != 2 {
			t.Errorf("line %q has %d points, want 2 (one per token count)", s.label, len(s.bw))
		}
		if !strings.Contains(s.label, "top2") && !strings.Contains(s.label, "top4") {
			t.Errorf("line %q does not name its top-k", s.label)
		}
	}
	if want := 4 * len(calls); lines != want {
		t.Errorf("%d lines, want %d (4 cases x %d calls)", lines, want, len(calls))
	}
}

// TestPlotSweepKnobs: a sweep over the tuning knobs gives a line per call
// and knob value, each with its own tokens, labelled with the knobs that
// the rows sweep and only those.
func TestPlotSweepKnobs(t *testing.T) {
	rows := func(knobs ...[2]int) []bench.Row {
		var out []bench.Row
		for _, k := range knobs {
			for _, tok := range []int{8, 16} {
				for _, call := range []string{bench.CallDispatch, bench.CallCombine} {
					out = append(out, bench.Row{Call: call, Tokens: tok, Hidden: 64, TopK: 2, DType: "bf16", Mode: bench.ModeBlocking,
						SMs: k[0], ChunkRows: k[1], Time: bench.Stats{N: 2, Median: float64(tok)}, NVLGBps: 1})
				}
			}
		}
		return out
	}
	for _, tc := range []struct {
		name        string
		rows        []bench.Row
		lines       int
		sms, chunk  bool // labelled with
		wantInLabel []string
	}{
		{"both", rows([2]int{1, 0}, [2]int{1, 8}, [2]int{2, 0}, [2]int{2, 8}), 8, true, true, []string{" sms=2 chunk=8"}},
		{"sms", rows([2]int{0, 4}, [2]int{3, 4}), 4, true, false, []string{" sms=3"}},
		{"none", rows([2]int{0, 0}), 2, false, false, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			all, xs, _ := plotSeries([]plotRun{{"knobs", bench.Record{Rows: tc.rows}}})
			if len(all) != tc.lines || len(xs) != 2 {
				t.Fatalf("%d lines over %d token counts, want %d over 2", len(all), len(xs), tc.lines)
			}
			var labels []string
			for _, s := range all {
				labels = append(labels, s.label)
				if len(s.bw) != 2 {
					t.Errorf("line %q has %d points, want 2 (one per token count)", s.label, len(s.bw))
				}
				if strings.Contains(s.label, " sms=") != tc.sms || strings.Contains(s.label, " chunk=") != tc.chunk {
					t.Errorf("line %q: want sms named %v, chunk named %v", s.label, tc.sms, tc.chunk)
				}
			}
			for _, w := range tc.wantInLabel {
				if !strings.Contains(strings.Join(labels, "|"), w) {
					t.Errorf("no label with %q among %q", w, labels)
				}
			}
		})
	}
}

// TestPlotFP8Sweep: a bf16,fp8 sweep gives the fp8 case's dispatch (fp8),
// its combine (bf16, labelled as the fp8 case's) and the bf16 case's calls
// lines of their own, each with one point per token count, and a copy
// baseline per group.
func TestPlotFP8Sweep(t *testing.T) {
	var rows []bench.Row
	for _, caseDT := range []string{"bf16", "fp8"} {
		for _, tok := range []int{8, 16} {
			for _, call := range []string{bench.CallDispatch, bench.CallCombine} {
				dt := caseDT
				if call == bench.CallCombine {
					dt = "bf16"
				}
				rows = append(rows, bench.Row{Call: call, Tokens: tok, Hidden: 128, TopK: 2, DType: dt, CaseDType: caseDT, Mode: bench.ModeBlocking,
					Time: bench.Stats{N: 2, Median: float64(tok)}, NVLGBps: 1, BaselineGBps: 2, Baseline: bench.Stats{N: 2, Median: 1}})
			}
		}
	}
	all, xs, _ := plotSeries([]plotRun{{"fp8", bench.Record{Rows: rows}}})
	var labels []string
	for _, s := range all {
		labels = append(labels, s.label)
		if len(s.bw) != 2 {
			t.Errorf("line %q has %d points, want 2 (one per token count)", s.label, len(s.bw))
		}
	}
	// Groups: the bf16 case (dispatch, combine); the fp8 case's fp8 rows
	// (dispatch); its bf16 rows (combine). Each with a copy baseline.
	if len(all) != 3+2+2 || len(xs) != 2 {
		t.Fatalf("%d lines over %d token counts, want 7 over 2: %q", len(all), len(xs), labels)
	}
	for _, want := range []string{"dispatch H=128 fp8 top2", "combine H=128 bf16 (fp8 case) top2", "combine H=128 bf16 top2"} {
		if !slices.Contains(labels, want+" blocking") {
			t.Errorf("no line %q among %q", want+" blocking", labels)
		}
	}
}
