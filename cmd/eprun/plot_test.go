package main

import (
	"image/png"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"

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

// TestPlotLayout reads the figure of a real record through gonum's
// structs: both panels have a title and labelled axes, latency is on a log
// axis (log10 values under logTicks), tokens too across several counts;
// the panels draw no legend of their own, and the one legend, an entry
// per line, lies in the figure, clear of both panels' data areas.
func TestPlotLayout(t *testing.T) {
	rec := filepath.Join(t.TempDir(), "r.json")
	eprunOK(t, append(tiny, "--tokens", "8,16,32", "--json", rec)...)
	r := readRecord(t, rec)
	fig, err := plotRecords([]plotRun{{"r", r}})
	if err != nil {
		t.Fatal(err)
	}
	for name, p := range map[string]*plot.Plot{"bandwidth": fig.bw, "latency": fig.lat} {
		if p.Title.Text == "" || p.X.Label.Text != "tokens per rank" || p.Y.Label.Text == "" {
			t.Errorf("%s: title %q, x %q, y %q; want all labelled", name, p.Title.Text, p.X.Label.Text, p.Y.Label.Text)
		}
		if _, ok := p.X.Scale.(plot.LogScale); !ok {
			t.Errorf("%s: x scale %T, want a log scale across three token counts", name, p.X.Scale)
		}
	}
	if _, ok := fig.lat.Y.Tick.Marker.(logTicks); !ok || !strings.Contains(fig.lat.Y.Label.Text, "log scale") {
		t.Errorf("latency: y ticks %T, label %q; want logTicks and a label saying log scale", fig.lat.Y.Tick.Marker, fig.lat.Y.Label.Text)
	}
	// The latency panel plots log10 of every latency.
	want := math.Log10(r.Rows[0].Time.Median)
	if fig.lat.Y.Min > want || fig.lat.Y.Max < want || fig.lat.Y.Max > 7 {
		t.Errorf("latency axis [%v, %v], want log10 values around %v", fig.lat.Y.Min, fig.lat.Y.Max, want)
	}
	if _, ok := fig.bw.Y.Scale.(plot.LinearScale); !ok || fig.bw.Y.Min != 0 {
		t.Errorf("bandwidth: y scale %T from %v, want linear from 0", fig.bw.Y.Scale, fig.bw.Y.Min)
	}
	all, _, _ := plotSeries([]plotRun{{"r", r}})
	if len(fig.entries) != len(all) {
		t.Errorf("%d legend entries, want one per line, %d", len(fig.entries), len(all))
	}

	for _, size := range [][2]float64{{12, 4.5}, {8, 3}, {20, 6}} {
		c := vgimg.New(vg.Length(size[0])*vg.Inch, vg.Length(size[1])*vg.Inch)
		dc := draw.New(c)
		panels, legends, at := fig.layout(dc)
		if len(panels) != 2 || len(legends) == 0 || len(legends) != len(at) {
			t.Fatalf("%v in: %d panels, %d legends at %d places", size, len(panels), len(legends), len(at))
		}
		data := []vg.Rectangle{fig.bw.DataCanvas(panels[0]).Rectangle, fig.lat.DataCanvas(panels[1]).Rectangle}
		for i, l := range legends {
			box := l.Rectangle(at[i])
			if box.Size().X <= 0 || box.Size().Y <= 0 || !inside(box, dc.Rectangle) {
				t.Errorf("%v in: legend %d at %v, outside the figure %v or empty", size, i, box, dc.Rectangle)
			}
			for j, d := range data {
				if overlap(box, d) {
					t.Errorf("%v in: legend %d at %v covers panel %d's data %v", size, i, box, j, d)
				}
			}
		}
		for _, p := range []*plot.Plot{fig.bw, fig.lat} {
			if r := p.Legend.Rectangle(dc); r.Size().X != 0 || r.Size().Y != 0 {
				t.Errorf("a panel has a legend of its own: %v", r)
			}
		}
		// Level within a glyph's size: gonum's Align sizes the panels
		// from their data areas, which the glyphs near an edge pad.
		if math.Abs(float64(data[0].Max.Y-data[1].Max.Y)) > 4 || math.Abs(float64(data[0].Min.Y-data[1].Min.Y)) > 4 {
			t.Errorf("%v in: the panels' data areas %v and %v are not level", size, data[0], data[1])
		}
	}
}

func inside(a, b vg.Rectangle) bool {
	return a.Min.X >= b.Min.X && a.Min.Y >= b.Min.Y && a.Max.X <= b.Max.X && a.Max.Y <= b.Max.Y
}

func overlap(a, b vg.Rectangle) bool {
	return a.Min.X < b.Max.X && b.Min.X < a.Max.X && a.Min.Y < b.Max.Y && b.Min.Y < a.Max.Y
}

// TestPlotLatencyNotPositive: a record with a latency of 0 (a row that
// measured nothing) plots on a linear latency axis instead of failing; so
// does one token count with every latency equal (a range of one value).
func TestPlotLatencyNotPositive(t *testing.T) {
	row := func(call string, tokens int, us float64) bench.Row {
		return bench.Row{Call: call, Tokens: tokens, Hidden: 64, TopK: 2, DType: "bf16", Mode: bench.ModeBlocking, Time: bench.Stats{N: 1, Median: us}, NVLGBps: 1}
	}
	dir := t.TempDir()
	for _, tc := range []struct {
		name string
		rows []bench.Row
		log  bool
	}{
		{"zero", []bench.Row{row(bench.CallDispatch, 8, 0), row(bench.CallDispatch, 16, 5)}, false},
		{"one value", []bench.Row{row(bench.CallDispatch, 1, 0.5), row(bench.CallCombine, 1, 0.5)}, true},
	} {
		fig, err := plotRecords([]plotRun{{tc.name, bench.Record{Rows: tc.rows}}})
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if _, log := fig.lat.Y.Tick.Marker.(logTicks); log != tc.log {
			t.Errorf("%s: log latency axis %v, want %v", tc.name, log, tc.log)
		}
		c, err := draw.NewFormattedCanvas(6*vg.Inch, 3*vg.Inch, "png")
		if err != nil {
			t.Fatal(err)
		}
		fig.draw(draw.New(c)) // gonum panics on a log axis that reaches 0
		f, err := os.Create(filepath.Join(dir, tc.name+".png"))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.WriteTo(f); err != nil {
			t.Error(err)
		}
		f.Close()
	}
}

// TestLogTicks: the latency axis is labelled at 1, 2 and 5 times the
// powers of ten in its range; a range within one of those steps gets
// every multiple labelled, or its ends.
func TestLogTicks(t *testing.T) {
	labels := func(lo, hi float64) []string {
		var out []string
		for _, tk := range (logTicks{}).Ticks(math.Log10(lo), math.Log10(hi)) {
			if !tk.IsMinor() {
				out = append(out, tk.Label)
			}
		}
		return out
	}
	for _, tc := range []struct {
		lo, hi float64
		want   []string
	}{
		{7, 996, []string{"10", "20", "50", "100", "200", "500"}},
		{0.15, 0.6, []string{"0.2", "0.5"}},
		{120, 180, []string{"120", "180"}},
		{310, 390, []string{"310", "390"}},
		{260, 480, []string{"300", "400"}},
	} {
		if got := labels(tc.lo, tc.hi); !slices.Equal(got, tc.want) {
			t.Errorf("ticks of [%v, %v]: %v, want %v", tc.lo, tc.hi, got, tc.want)
		}
	}
	if got := (logTicks{}).Ticks(math.Inf(-1), 1); got != nil {
		t.Errorf("ticks of an infinite range: %v", got)
	}
}

// TestPlotLegendColumns: a legend taller than the figure splits into
// columns, each within its height, laid out side by side, clear of the
// panels.
func TestPlotLegendColumns(t *testing.T) {
	var rows []bench.Row
	for h := 1; h <= 20; h++ {
		for _, call := range []string{bench.CallDispatch, bench.CallCombine} {
			rows = append(rows, bench.Row{Call: call, Tokens: 8, Hidden: 64 * h, TopK: 2, DType: "bf16", Mode: bench.ModeBlocking, Time: bench.Stats{N: 1, Median: 10}, NVLGBps: 1})
		}
	}
	fig, err := plotRecords([]plotRun{{"tall", bench.Record{Rows: rows}}})
	if err != nil {
		t.Fatal(err)
	}
	c := vgimg.New(12*vg.Inch, 3*vg.Inch)
	dc := draw.New(c)
	panels, legends, at := fig.layout(dc)
	if len(fig.entries) != 40 || len(legends) < 2 {
		t.Fatalf("%d entries in %d columns, want 40 in several", len(fig.entries), len(legends))
	}
	for i, l := range legends {
		box := l.Rectangle(at[i])
		if box.Size().Y > dc.Size().Y || !inside(box, dc.Rectangle) {
			t.Errorf("column %d at %v: taller than the figure %v, or outside it", i, box, dc.Rectangle)
		}
		if i > 0 && overlap(box, legends[i-1].Rectangle(at[i-1])) {
			t.Errorf("columns %d and %d overlap", i-1, i)
		}
		for j, p := range []*plot.Plot{fig.bw, fig.lat} {
			if d := p.DataCanvas(panels[j]).Rectangle; overlap(box, d) {
				t.Errorf("column %d at %v covers panel %d's data %v", i, box, j, d)
			}
		}
	}
}
