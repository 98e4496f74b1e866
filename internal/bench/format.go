package bench

import (
	"fmt"
	"io"
	"math"
	"strings"
)

// Record is everything one eprun bench run writes with --json.
type Record struct {
	Env    Env    `json:"env"`
	Config Config `json:"config"`
	Rows   []Row  `json:"rows"`
	// CheckedRows and Wrong total the rows of all calls.
	CheckedRows int `json:"checked_rows"`
	Wrong       int `json:"wrong"`
	// Error is set when the run stopped early; Rows has what completed.
	Error string `json:"error,omitempty"`
}

// NewRecord assembles a record from a (possibly partial) result.
func NewRecord(env Env, cfg Config, res *Result, err error) Record {
	rec := Record{Env: env, Config: cfg, Rows: []Row{}}
	if res != nil {
		rec.Rows = res.Rows
		rec.CheckedRows = res.Checked()
		rec.Wrong = res.Wrong()
	}
	if err != nil {
		rec.Error = err.Error()
	}
	return rec
}

// WriteTable prints the human-readable table: a commented header with the
// environment and config, one row per call and case, and a footer with the
// check result and the ratio summary.
func WriteTable(w io.Writer, rec Record) error {
	var b strings.Builder
	e, c := rec.Env, rec.Config
	commit := e.Commit
	if len(commit) > 12 {
		commit = commit[:12]
	}
	if e.Modified {
		commit += "+dirty"
	}
	fmt.Fprintf(&b, "# goep %s (%s)  backend %s  %s %s/%s  GOMAXPROCS %d\n", e.GoepVersion, orDash(commit), e.Backend, e.GoVersion, e.GOOS, e.GOARCH, e.GOMAXPROCS)
	if e.CPU != "" {
		fmt.Fprintf(&b, "# cpu: %s (%d logical)  loadavg %s\n", e.CPU, e.NumCPU, orDash(e.LoadAvg))
	}
	domains := "1 domain"
	if d := c.RanksPerDomain; d > 0 && d < c.Ranks {
		domains = fmt.Sprintf("%d domains of %d", c.Ranks/d, d)
	}
	fmt.Fprintf(&b, "# ranks %d (%s)  experts %d  topk %d  mode %s  pad %d  iters %d (+%d warm-up)  seed %d\n#\n",
		c.Ranks, domains, c.Experts, c.TopK, c.Mode, c.Pad, c.Iters, c.Warmup, c.Seed)

	fmt.Fprintf(&b, "# %-17s %7s %7s %5s %5s %11s %11s %9s %9s %13s %6s %7s\n",
		"call", "tokens", "hidden", "topk", "dtype", "time_us", "p99_us", "nvl_GBps", "rdma_GBps", "baseline_GBps", "ratio", "#wrong")
	for _, r := range rec.Rows {
		rdma := "-"
		if r.RDMAGBps > 0 {
			rdma = fmt.Sprintf("%.2f", r.RDMAGBps)
		}
		fmt.Fprintf(&b, "  %-17s %7d %7d %5d %5s %11.1f %11.1f %9.2f %9s %13.2f %6.2f %7d\n",
			r.Call, r.Tokens, r.Hidden, r.TopK, r.DType, r.Time.Median, r.Time.P99, r.NVLGBps, rdma, r.BaselineGBps, r.Ratio, r.Wrong)
	}
	b.WriteString("#\n")
	switch {
	case rec.Error != "":
		fmt.Fprintf(&b, "# check: INCOMPLETE, run failed: %s\n", rec.Error)
	case rec.Wrong > 0:
		fmt.Fprintf(&b, "# check: FAILED, %d of %d output rows wrong\n", rec.Wrong, rec.CheckedRows)
	default:
		fmt.Fprintf(&b, "# check: OK, %d output rows match the expectation\n", rec.CheckedRows)
	}
	if s := ratioSummary(rec.Rows); s != "" {
		fmt.Fprintf(&b, "# ratio nvl_GBps / baseline_GBps: %s\n", s)
	}
	b.WriteString("# time_us, p99_us: median and p99 over iterations of the time from the first rank entering the call to the last leaving Synchronize\n")
	b.WriteString("# nvl_GBps: mean over ranks of received rows x hidden x dtype size, / time_us; baseline: a plain copy of those bytes by every rank at once\n")
	_, err := io.WriteString(w, b.String())
	return err
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// ratioSummary is "min X (call), geomean Y, max Z (call)".
func ratioSummary(rows []Row) string {
	var lo, hi *Row
	logSum, n := 0.0, 0
	for i := range rows {
		r := &rows[i]
		if r.Ratio <= 0 {
			continue
		}
		if lo == nil || r.Ratio < lo.Ratio {
			lo = r
		}
		if hi == nil || r.Ratio > hi.Ratio {
			hi = r
		}
		logSum += math.Log(r.Ratio)
		n++
	}
	if n == 0 {
		return ""
	}
	return fmt.Sprintf("min %.2f (%s, tokens %d), geomean %.2f, max %.2f (%s, tokens %d)",
		lo.Ratio, lo.Call, lo.Tokens, math.Exp(logSum/float64(n)), hi.Ratio, hi.Call, hi.Tokens)
}

// benchName is the Go benchmark name of a call: dispatch-permute ->
// DispatchPermute.
func benchName(call string) string {
	var b strings.Builder
	for _, p := range strings.Split(call, "-") {
		if p != "" {
			b.WriteString(strings.ToUpper(p[:1]) + p[1:])
		}
	}
	return b.String()
}

// WriteGoBench prints the rows as Go benchmark results that benchstat
// reads: one line per call and case, plus the baseline of each case, with
// ns/op the median iteration time and MB/s the NVLink bandwidth.
func WriteGoBench(w io.Writer, rec Record) error {
	var b strings.Builder
	e := rec.Env
	fmt.Fprintf(&b, "goos: %s\ngoarch: %s\npkg: github.com/goep/goep/cmd/eprun\n", e.GOOS, e.GOARCH)
	if e.CPU != "" {
		fmt.Fprintf(&b, "cpu: %s\n", e.CPU)
	}
	fmt.Fprintf(&b, "backend: %s\nmode: %s\n", e.Backend, rec.Config.Mode)
	line := func(name string, r Row, s Stats, gbps float64) {
		fmt.Fprintf(&b, "Benchmark%s/ranks=%d/tokens=%d/hidden=%d/topk=%d/dtype=%s-%d\t%d\t%.0f ns/op\t%.2f MB/s\t%.0f p99-ns/op\n",
			name, r.Ranks, r.Tokens, r.Hidden, r.TopK, r.DType, e.GOMAXPROCS, s.N, s.Median*1e3, gbps*1e3, s.P99*1e3)
	}
	for i, r := range rec.Rows {
		line(benchName(r.Call), r, r.Time, r.NVLGBps)
		if i+1 == len(rec.Rows) || !sameCase(r, rec.Rows[i+1]) {
			line("Baseline", r, r.Baseline, r.BaselineGBps)
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func sameCase(a, b Row) bool {
	return a.Tokens == b.Tokens && a.Hidden == b.Hidden && a.DType == b.DType
}
