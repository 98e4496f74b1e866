package main

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"image/color"
	"io"
	"os"
	"path/filepath"
	"slices"
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
median, µs) against tokens per rank, one line per call, in two panels side by side. The
baselines of the same run are dashed: the a2a baseline of each call in the call's colour, the
plain copy in grey. A sweep over several hidden sizes, dtypes, top-k, modes or tuning knobs
(sms, chunk rows) gets a line per call and case, the legend naming the case (the knobs only
when swept); several files get their file name in the legend.

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
	bw, lat, err := plotRecords(runs)
	if err != nil {
		return runError{fmt.Errorf("plot: %w", err)}
	}
	w, h := vg.Length(f.width)*vg.Inch, vg.Length(f.height)*vg.Inch
	c, err := draw.NewFormattedCanvas(w, h, format)
	if err != nil {
		return fmt.Errorf("plot: %w", err)
	}
	tiles := draw.Tiles{Rows: 1, Cols: 2, PadX: vg.Points(12), PadY: vg.Points(6), PadTop: vg.Points(6), PadBottom: vg.Points(4), PadLeft: vg.Points(4), PadRight: vg.Points(8)}
	cvs := plot.Align([][]*plot.Plot{{bw, lat}}, tiles, draw.New(c))
	bw.Draw(cvs[0][0])
	lat.Draw(cvs[0][1])
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

// plotRecords builds the bandwidth and latency plots.
func plotRecords(runs []plotRun) (bw, lat *plot.Plot, err error) {
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

// drawPlots draws the series.
func drawPlots(runs []plotRun, all []*series, xs []int, positive bool) (bw, lat *plot.Plot, err error) {
	bw, lat = plot.New(), plot.New()
	rec := runs[0].rec
	c := rec.Config
	title := fmt.Sprintf("goep %s: %d ranks, %d experts, top-%d, %s routing", rec.Env.Backend, c.Ranks, c.Experts, c.TopK, c.RoutingSpec())
	bw.Title.Text, lat.Title.Text = "bandwidth (nvl_GBps)", "latency (median time_us)"
	bw.Title.Text += "\n" + title
	lat.Title.Text += "\n" + fmt.Sprintf("%s mode, %d iterations", c.Mode, c.Iters)
	bw.Y.Label.Text, lat.Y.Label.Text = "GB/s", "µs"
	for _, p := range []*plot.Plot{bw, lat} {
		p.X.Label.Text = "tokens per rank"
		p.Add(plotter.NewGrid())
		p.Legend.Top, p.Legend.Left = true, true
		p.Legend.TextStyle.Font.Size = vg.Points(8)
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
	for _, s := range all {
		slices.SortFunc(s.bw, func(a, b plotter.XY) int { return cmp.Compare(a.X, b.X) })
		slices.SortFunc(s.lat, func(a, b plotter.XY) int { return cmp.Compare(a.X, b.X) })
		for i, pts := range []plotter.XYs{s.bw, s.lat} {
			l, sc, err := plotter.NewLinePoints(pts)
			if err != nil {
				return nil, nil, fmt.Errorf("%s: %w", s.label, err)
			}
			l.Color, sc.Color = s.colour, s.colour
			l.Width = vg.Points(1.5)
			sc.Shape = draw.CircleGlyph{}
			sc.Radius = vg.Points(2)
			if s.dashed {
				l.Dashes = []vg.Length{vg.Points(5), vg.Points(3)}
				sc.Shape = draw.BoxGlyph{}
			}
			p := []*plot.Plot{bw, lat}[i]
			p.Add(l, sc)
			if i == 0 {
				bw.Legend.Add(s.label, l, sc)
			}
		}
	}
	return bw, lat, nil
}
