package main

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"image/color"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	_ "gonum.org/v1/plot/vg/vgimg" // png
	_ "gonum.org/v1/plot/vg/vgpdf" // pdf
	_ "gonum.org/v1/plot/vg/vgsvg" // svg

	"github.com/goep/goep/internal/bench"
)

type plotFlags struct {
	out           string
	width, height float64
}

func newPlot(stdout io.Writer) *cobra.Command {
	var f plotFlags
	cmd := &cobra.Command{
		Use:   "plot RESULTS.json... [-o OUT.png]",
		Short: "Plot bandwidth and latency against tokens per rank from eprun bench --json records",
		Long: `Plot one or more eprun bench --json records: bandwidth (nvl_GBps, GB/s) and latency (time_us,
median, µs, on a log axis) against tokens per rank (a log axis when there are several), one
line per call, in two panels side by side, with one legend for both at their right, outside
the data. The baselines of the same run are dashed: the a2a baseline of each call in the
call's colour, the plain copy in grey. A sweep over several hidden sizes, dtypes, top-k, modes
or tuning knobs (sms, chunk rows) gets a line per call and case, the legend naming the case
(the knobs only when swept); several files get their file name in the legend. A record of
several repetitions (eprun bench --count) plots each repetition's points.

The output format follows -o's extension: .png (default), .svg or .pdf; without -o the plot
goes beside the first record, RESULTS.png.`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runPlot(args, f, stdout)
		},
	}
	fl := cmd.Flags()
	fl.StringVarP(&f.out, "output", "o", "", "output file: .png, .svg or .pdf (default: the first record's name with .png)")
	fl.Float64Var(&f.width, "width", 12, "width in inches (png: 96 pixels per inch)")
	fl.Float64Var(&f.height, "height", 4.5, "height in inches")
	return cmd
}

// plotRun is one record to plot and its name in the legend.
type plotRun struct {
	name string
	rec  bench.Record
}

func runPlot(args []string, f plotFlags, stdout io.Writer) error {
	if f.width <= 0 || f.height <= 0 || f.width > 100 || f.height > 100 {
		return fmt.Errorf("plot: --width %g --height %g: want 0 < inches <= 100", f.width, f.height)
	}
	out := f.out
	if out == "" {
		out = strings.TrimSuffix(args[0], filepath.Ext(args[0])) + ".png"
	}
	format := strings.TrimPrefix(strings.ToLower(filepath.Ext(out)), ".")
	if !slices.Contains([]string{"png", "svg", "pdf"}, format) {
		return fmt.Errorf("plot: -o %q: want a .png, .svg or .pdf file", out)
	}
	var runs []plotRun
	for _, a := range args {
		data, err := os.ReadFile(a)
		if err != nil {
			return fmt.Errorf("plot: %w", err)
		}
		var rec bench.Record
		if err := json.Unmarshal(data, &rec); err != nil {
			return fmt.Errorf("plot: %s: not an eprun bench --json record: %v", a, err)
		}
		if len(rec.Rows) == 0 {
			return fmt.Errorf("plot: %s: no rows to plot", a)
		}
		if err := plottable(rec.Rows); err != nil {
			return fmt.Errorf("plot: %s: %w", a, err)
		}
		runs = append(runs, plotRun{strings.TrimSuffix(filepath.Base(a), filepath.Ext(a)), rec})
	}
	fig, err := plotRecords(runs)
	if err != nil {
		return runError{fmt.Errorf("plot: %w", err)}
	}
	w, h := vg.Length(f.width)*vg.Inch, vg.Length(f.height)*vg.Inch
	c, err := draw.NewFormattedCanvas(w, h, format)
	if err != nil {
		return fmt.Errorf("plot: %w", err)
	}
	fig.draw(draw.New(c))
	file, err := os.Create(out)
	if err != nil {
		return fmt.Errorf("plot: %w", err)
	}
	_, werr := c.WriteTo(file)
	if err := errors.Join(werr, file.Close()); err != nil {
		return runError{fmt.Errorf("plot: writing %s: %w", out, err)}
	}
	fmt.Fprintf(stdout, "eprun: plot written to %s\n", out)
	return nil
}

// plottable refuses rows whose tokens per rank, the plots' x axis, is
// null, missing, zero or negative: a record eprun bench did not write that
// way (it writes every case's tokens, and a case of 0 tokens per rank has
// no bandwidth to draw).
func plottable(rows []bench.Row) error {
	for i, r := range rows {
		if r.Tokens <= 0 {
			what := fmt.Sprintf("%d", r.Tokens)
			if r.Tokens == 0 {
				what = "0 (null, missing or zero)"
			}
			return fmt.Errorf("row %d (call %q): tokens is %s; the plots need a positive token count per rank", i, r.Call, what)
		}
	}
	return nil
}

// series is one line: a call (or baseline) of one (run, hidden, dtype).
type series struct {
	label     string
	colour    color.Color
	dashed    bool
	bw, lat   plotter.XYs
	lastToken int
}

// plotRecords builds the bandwidth and latency plots and their legend.
func plotRecords(runs []plotRun) (*figure, error) {
	all, xs, positive := plotSeries(runs)
	return drawPlots(runs, all, xs, positive)
}

// plotSeries turns the records' rows into lines: one per call (and its
// a2a and copy baselines) for every run and swept case other than tokens;
// xs are the distinct token counts.
func plotSeries(runs []plotRun) (all []*series, xs []int, positive bool) {
	// One set of lines per run and swept case other than tokens.
	// dtype is the rows' (Row.DType), caseDType the case's: the calls of
	// an fp8 case that combine move bf16 rows, a line of their own apart
	// from a bf16 case's.
	type group struct {
		run, hidden, topk      int
		dtype, caseDType, mode string
		sms, chunk             int
	}
	var groups []group
	var smsSwept, chunkSwept bool // over all runs' rows
	for i, r := range runs {
		for _, row := range r.rec.Rows {
			g := group{i, row.Hidden, row.TopK, row.DType, row.CaseDTypeName(), row.Mode, row.SMs, row.ChunkRows}
			if !slices.Contains(groups, g) {
				groups = append(groups, g)
			}
			smsSwept = smsSwept || g.sms != groups[0].sms
			chunkSwept = chunkSwept || g.chunk != groups[0].chunk
		}
	}
	var calls []string
	for _, r := range runs {
		for _, row := range r.rec.Rows {
			if !slices.Contains(calls, row.Call) {
				calls = append(calls, row.Call)
			}
		}
	}
	byKey := map[string]*series{}
	get := func(g group, key, label string, colour color.Color, dashed bool) *series {
		k := fmt.Sprint(g, key)
		if s := byKey[k]; s != nil {
			return s
		}
		if len(runs) > 1 {
			label = runs[g.run].name + ": " + label
		}
		if len(groups) > len(runs) || len(groups) > 1 && len(runs) == 1 {
			dtype := g.dtype
			if g.caseDType != g.dtype {
				dtype += fmt.Sprintf(" (%s case)", g.caseDType)
			}
			label += fmt.Sprintf(" H=%d %s top%d %s", g.hidden, dtype, g.topk, g.mode)
			if smsSwept {
				label += fmt.Sprintf(" sms=%d", g.sms)
			}
			if chunkSwept {
				label += fmt.Sprintf(" chunk=%d", g.chunk)
			}
		}
		s := &series{label: label, colour: colour, dashed: dashed}
		byKey[k] = s
		all = append(all, s)
		return s
	}
	positive = true
	for gi, g := range groups {
		for _, row := range runs[g.run].rec.Rows {
			if row.Hidden != g.hidden || row.DType != g.dtype || row.CaseDTypeName() != g.caseDType || row.TopK != g.topk || row.Mode != g.mode || row.SMs != g.sms || row.ChunkRows != g.chunk {
				continue
			}
			x := float64(row.Tokens)
			if !slices.Contains(xs, row.Tokens) {
				xs = append(xs, row.Tokens)
			}
			positive = positive && row.Tokens > 0
			ci := slices.Index(calls, row.Call) + gi*len(calls)
			col := plotutil.Color(ci)
			s := get(g, row.Call, row.Call, col, false)
			s.bw = append(s.bw, plotter.XY{X: x, Y: row.NVLGBps})
			s.lat = append(s.lat, plotter.XY{X: x, Y: row.Time.Median})
			if row.A2A != nil {
				a := get(g, "a2a/"+row.Call, "a2a "+row.Call, col, true)
				a.bw = append(a.bw, plotter.XY{X: x, Y: row.A2AGBps})
				a.lat = append(a.lat, plotter.XY{X: x, Y: row.A2A.Median})
			}
			if row.BaselineGBps > 0 {
				b := get(g, "copy", "copy baseline", color.Gray{Y: uint8(100 + 40*(gi%3))}, true)
				if n := len(b.bw); n == 0 || b.lastToken != row.Tokens {
					b.bw = append(b.bw, plotter.XY{X: x, Y: row.BaselineGBps})
					b.lat = append(b.lat, plotter.XY{X: x, Y: row.Baseline.Median})
					b.lastToken = row.Tokens
				}
			}
		}
	}
	return all, xs, positive
}

// figure is what eprun plot draws: the bandwidth and latency panels, and
// one legend for both, kept out of the panels (a legend inside a panel
// covered the lines it named).
type figure struct {
	bw, lat *plot.Plot
	entries []legendEntry
}

// legendEntry is a line of the legend: a series' label and its line and
// glyph.
type legendEntry struct {
	label  string
	thumbs []plot.Thumbnailer
}

// The figure's margins and the legend's font.
var (
	figPad     = vg.Points(6)
	legendFont = vg.Points(8)
)

// drawPlots builds the panels from the series: a line and its points per
// series in each, the legend's entries in the series' order.
func drawPlots(runs []plotRun, all []*series, xs []int, positive bool) (*figure, error) {
	bw, lat := plot.New(), plot.New()
	rec := runs[0].rec
	c := rec.Config
	title := fmt.Sprintf("goep %s: %d ranks, %d experts, top-%d, %s routing", rec.Env.Backend, c.Ranks, c.Experts, c.TopK, c.RoutingSpec())
	bw.Title.Text = "bandwidth against tokens per rank\n" + title
	lat.Title.Text = "latency against tokens per rank\n" + fmt.Sprintf("%s mode, %d iterations", c.Mode, c.Iters)
	bw.Y.Label.Text = "nvl_GBps (GB/s)"
	lat.Y.Label.Text = "time_us, median (µs)"
	for _, p := range []*plot.Plot{bw, lat} {
		p.X.Label.Text = "tokens per rank"
		p.Add(plotter.NewGrid())
		// Log scale across several token counts: a single one is widened
		// around itself, to 0 when it is 1, which a log scale cannot show.
		if positive && len(xs) > 1 {
			p.X.Scale, p.X.Tick.Marker = plot.LogScale{}, plot.LogTicks{Prec: -1}
		}
		if len(xs) <= 12 { // label the measured points themselves
			slices.Sort(xs)
			var ticks plot.ConstantTicks
			for _, x := range xs {
				ticks = append(ticks, plot.Tick{Value: float64(x), Label: fmt.Sprint(x)})
			}
			p.X.Tick.Marker = ticks
		}
	}
	bw.Y.Min = 0
	fig := &figure{bw: bw, lat: lat}
	// Latency on a log axis: the calls, the a2a baseline and a sweep over
	// tokens span decades. The panel plots log10 of each latency on a
	// linear axis whose ticks are labelled with latencies (logTicks): a
	// log axis to the reader. gonum's LogScale would do the same, but it
	// places the axis label's box by the arithmetic mean of the range,
	// near the top of a log axis, and pads the panel above its data by
	// what it thinks overflows (the data started 43 pt lower than the
	// bandwidth's). A log axis needs every value positive: a record with a
	// zero or negative latency (one that measured nothing, or edited by
	// hand) keeps the linear axis.
	logLat := true
	for _, s := range all {
		for _, pt := range s.lat {
			logLat = logLat && pt.Y > 0
		}
	}
	if logLat {
		lat.Y.Tick.Marker = logTicks{}
		lat.Y.Label.Text = "time_us, median (µs, log scale)"
	}
	for _, s := range all {
		slices.SortFunc(s.bw, func(a, b plotter.XY) int { return cmp.Compare(a.X, b.X) })
		slices.SortFunc(s.lat, func(a, b plotter.XY) int { return cmp.Compare(a.X, b.X) })
		latPts := s.lat
		if logLat {
			latPts = slices.Clone(s.lat)
			for i := range latPts {
				latPts[i].Y = math.Log10(latPts[i].Y)
			}
		}
		for i, pts := range []plotter.XYs{s.bw, latPts} {
			l, sc, err := plotter.NewLinePoints(pts)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", s.label, err)
			}
			l.Color, sc.Color = s.colour, s.colour
			l.Width = vg.Points(1.5)
			sc.Shape = draw.CircleGlyph{}
			sc.Radius = vg.Points(2)
			if s.dashed {
				l.Dashes = []vg.Length{vg.Points(5), vg.Points(3)}
				sc.Shape = draw.BoxGlyph{}
			}
			[]*plot.Plot{bw, lat}[i].Add(l, sc)
			if i == 0 {
				fig.entries = append(fig.entries, legendEntry{s.label, []plot.Thumbnailer{l, sc}})
			}
		}
	}
	if logLat {
		// A little beyond the values, and never a range of one value
		// (which gonum widens by 1 either way: a factor of 10 here).
		lat.Y.Min, lat.Y.Max = lat.Y.Min-0.06, lat.Y.Max+0.06
	}
	return fig, nil
}

// legends splits the entries into as few columns as fit a height of h,
// each a legend of its own, top-left aligned.
func (f *figure) legends(h vg.Length) []plot.Legend {
	newLegend := func() plot.Legend {
		l := plot.NewLegend()
		l.Top, l.Left = true, true
		l.TextStyle.Font.Size = legendFont
		return l
	}
	l := newLegend()
	per := len(f.entries)
	if n := len(f.entries); n > 0 {
		l.Add(f.entries[0].label, f.entries[0].thumbs...)
		entry := l.Rectangle(draw.Canvas{}).Size().Y
		if entry > 0 {
			per = max(1, int(h/(entry+l.Padding)))
		}
	}
	var out []plot.Legend
	for i := 0; i < len(f.entries); i += per {
		l := newLegend()
		for _, e := range f.entries[i:min(i+per, len(f.entries))] {
			l.Add(e.label, e.thumbs...)
		}
		out = append(out, l)
	}
	return out
}

// layout places the figure on c: the legend's columns at the right, from
// the top, each as wide as its longest entry, and the two panels side by
// side in the rest. It returns the panels' canvases (bandwidth, latency),
// and the legend columns with the canvas of each.
func (f *figure) layout(c draw.Canvas) (panels []draw.Canvas, legends []plot.Legend, at []draw.Canvas) {
	inner := draw.Crop(c, figPad, -figPad, figPad, -figPad)
	legends = f.legends(inner.Size().Y)
	right := inner.Max.X
	widths := make([]vg.Length, len(legends))
	for i := range legends {
		widths[i] = legends[i].Rectangle(inner).Size().X
	}
	for i := len(legends) - 1; i >= 0; i-- {
		lc := inner
		lc.Min.X, lc.Max.X = right-widths[i], right
		at = append([]draw.Canvas{lc}, at...)
		right -= widths[i] + figPad
	}
	area := inner
	area.Max.X = right - figPad
	tiles := draw.Tiles{Rows: 1, Cols: 2, PadX: vg.Points(12), PadTop: vg.Points(2)}
	cvs := plot.Align([][]*plot.Plot{{f.bw, f.lat}}, tiles, area)
	return cvs[0], legends, at
}

// draw draws the figure on c.
func (f *figure) draw(c draw.Canvas) {
	panels, legends, at := f.layout(c)
	f.bw.Draw(panels[0])
	f.lat.Draw(panels[1])
	for i := range legends {
		legends[i].Draw(at[i])
	}
}

// logTicks marks an axis of log10 values (the latency panel's) at 1, 2
// and 5 times the powers of ten within its range, labelled with the
// value, and at the other multiples, unlabelled. gonum's LogTicks labels
// the powers of ten alone, so that a range within a decade (latencies of
// 120 to 900 µs) had no label at all; with fewer than two labelled marks
// in the range every multiple is labelled, and with fewer still the
// range's ends are.
type logTicks struct{}

func (logTicks) Ticks(lo, hi float64) []plot.Tick {
	if lo > hi || math.IsInf(lo, 0) || math.IsInf(hi, 0) || math.IsNaN(lo) || math.IsNaN(hi) {
		return nil
	}
	// value is m x 10^e, exact for the decimals it prints.
	value := func(m int, e int) float64 {
		if e < 0 {
			return float64(m) / math.Pow10(-e)
		}
		return float64(m) * math.Pow10(e)
	}
	label := func(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) }
	var ticks []plot.Tick
	for e := int(math.Floor(lo)); e <= int(math.Ceil(hi)); e++ {
		for m := 1; m < 10; m++ {
			v := value(m, e)
			if l := math.Log10(v); l >= lo && l <= hi {
				t := plot.Tick{Value: l}
				if m == 1 || m == 2 || m == 5 {
					t.Label = label(v)
				}
				ticks = append(ticks, t)
			}
		}
	}
	labelled := func() int {
		n := 0
		for _, t := range ticks {
			if !t.IsMinor() {
				n++
			}
		}
		return n
	}
	if labelled() < 2 {
		for i := range ticks {
			ticks[i].Label = label(math.Round(math.Pow(10, ticks[i].Value)*1e6) / 1e6)
		}
	}
	if labelled() < 2 {
		for _, l := range []float64{lo, hi} {
			ticks = append(ticks, plot.Tick{Value: l, Label: strconv.FormatFloat(math.Pow(10, l), 'g', 3, 64)})
		}
	}
	return ticks
}
