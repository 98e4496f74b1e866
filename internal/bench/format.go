package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/goep/goep/device"
)

// Record is everything one eprun bench run writes with --json.
type Record struct {
	Env    Env    `json:"env"`
	Config Config `json:"config"`
	// Launcher is what started the ranks: "in-process" (goroutines of one
	// process), or the launcher.Env kind ("ompi", "pmi", "slurm",
	// "torchrun" for eprun launch) with one process per rank.
	Launcher string `json:"launcher"`
	// Processes is the number of processes the ranks ran in.
	Processes int `json:"processes"`
	// Group is the transport of the ranks' comm group: "local", "tcp" or
	// "mpi".
	Group string `json:"group,omitempty"`
	// Timing is how an iteration's time is taken: "span" (in-process: first
	// rank's start to last rank's end on the shared clock), "rank_max"
	// (processes: the maximum over ranks of each rank's own time) or
	// "event_max" (cuda backend: the maximum over ranks of each rank's GPU
	// time between CUDA events around the call).
	Timing string `json:"timing"`
	// BaselineA2ATransport is what carried the a2a baseline's exchange:
	// "mpi" (MPI_Alltoallv), "tcp" or "local" (empty: not run).
	BaselineA2ATransport string `json:"baseline_a2a_transport,omitempty"`
	Rows                 []Row  `json:"rows"`
	// CheckedRows and Wrong total the rows of all calls.
	CheckedRows int `json:"checked_rows"`
	Wrong       int `json:"wrong"`
	// Incomplete is true when the run stopped early (a case or a baseline
	// failed, a signal ended it): Error says why, and Rows holds what was
	// measured before, not every case Config.Count times.
	Incomplete bool `json:"incomplete"`
	// Error is set when the run stopped early; Rows has what completed.
	Error string `json:"error,omitempty"`
	// Topology is what `eprun topo --json` reports on the rank that wrote
	// the record (CPUs and NUMA nodes, GPUs with their NVLinks and fabric
	// clique, UCX's devices, the launcher, the domain layout); eprun sets
	// it, other callers may leave it empty.
	Topology json.RawMessage `json:"topology,omitempty"`
	// Scaled is set when the configured run could not fit and ran scaled
	// down (Config.ScaleToFit, Config.ScaleDown); Config is then the run's,
	// the scaled one.
	Scaled *Scaling `json:"scaled,omitempty"`
}

// NewRecord assembles a record from a (possibly partial) result.
func NewRecord(env Env, cfg Config, res *Result, err error) Record {
	rec := Record{Env: env, Config: cfg, Rows: []Row{}}
	if res != nil {
		rec.Rows = res.Rows
		rec.Timing = res.Timing
		rec.BaselineA2ATransport = res.A2ATransport
		rec.CheckedRows = res.Checked()
		rec.Wrong = res.Wrong()
	}
	if err != nil {
		rec.Error = err.Error()
	}
	rec.Incomplete = err != nil
	return rec
}

// WriteTable prints the wide table: a commented header with the
// environment and config, one row per call and case with every column
// (eprun bench --wide), and a footer with the check result, the ratio
// summaries and what the columns mean. WriteTableWithin prints the
// default, narrower one.
func WriteTable(w io.Writer, rec Record) error {
	_, err := io.WriteString(w, tableText(rec, 0))
	return err
}

// TableWidth is the width eprun's default table keeps within: a terminal
// of 120 columns shows it unwrapped.
const TableWidth = 120

// WriteTableWithin prints the table for a terminal of width columns: the
// header and footer of WriteTable, every line longer than width wrapped
// at spaces (continuation lines start "#   "), and the columns a reader
// needs first: the case, time_us, p99_us, nvl_GBps, rdma_GBps (with
// several domains), ratio, vs_a2a and #wrong; baseline_GBps, a2a_us and
// a2a_GBps only in the wide table (a footer line says so). When even
// those do not fit (a sweep of every field), p99_us, ratio, rdma_GBps and
// vs_a2a go, in that order, until the rows fit.
func WriteTableWithin(w io.Writer, rec Record, width int) error {
	_, err := io.WriteString(w, tableText(rec, max(width, 40)))
	return err
}

// tableText is the table of rec: the wide one for width 0, else the one
// of WriteTableWithin.
func tableText(rec Record, width int) string {
	var b strings.Builder
	e, c := rec.Env, rec.Config
	fmt.Fprintf(&b, "# goep %s (%s)  backend %s  %s %s/%s  GOMAXPROCS %d\n", e.GoepVersion, orDash(e.ShortCommit()), e.Backend, e.GoVersion, e.GOOS, e.GOARCH, e.GOMAXPROCS)
	if e.CPU != "" {
		fmt.Fprintf(&b, "# cpu: %s (%d logical)  loadavg %s\n", e.CPU, e.NumCPU, orDash(e.LoadAvg))
	}
	if s := e.GPULine(); s != "" {
		fmt.Fprintf(&b, "# %s\n", s)
	}
	domains := "1 domain"
	if d := rec.ranksPerDomain(); d > 0 && d < c.Ranks {
		domains = fmt.Sprintf("%d domains of %d", c.Ranks/d, d)
	}
	// The tuning knobs only when not the engine's default (0), the count
	// only when the sweep repeats.
	knobs := ""
	if !allZero(c.SMs) {
		knobs += fmt.Sprintf("  sms %v", c.SMs)
	}
	if !allZero(c.ChunkRows) {
		knobs += fmt.Sprintf("  chunk_rows %v", c.ChunkRows)
	}
	count := ""
	if c.Count > 1 {
		count = fmt.Sprintf("  count %d", c.Count)
	}
	fmt.Fprintf(&b, "# ranks %d (%s)  experts %d  topk %d  mode %s  pad %d  iters %d (+%d warm-up)%s  seed %d  routing %s%s\n",
		c.Ranks, domains, c.Experts, c.TopK, c.Mode, c.Pad, c.Iters, c.Warmup, count, c.Seed, c.RoutingSpec(), knobs)
	if rec.Scaled != nil {
		fmt.Fprintf(&b, "# %s\n", rec.Scaled)
	}
	if rec.Launcher != "" {
		fmt.Fprintf(&b, "# launcher %s  processes %d  group %s  timing %s  a2a over %s\n", rec.Launcher, rec.Processes, orDash(rec.Group), orDash(rec.Timing), orDash(rec.BaselineA2ATransport))
	}
	b.WriteString("#\n")

	cols, left := tableColumns(rec.Rows), []string(nil)
	if width > 0 {
		cols, left = fitColumns(cols, rec.Rows, width)
	}
	writeColumns(&b, cols, rec.Rows)

	b.WriteString("#\n")
	b.WriteString(rec.CheckLine())
	if width > 0 {
		b.WriteString(briefFooter(rec))
	} else {
		b.WriteString(wideFooter(rec))
	}
	if len(left) > 0 {
		fmt.Fprintf(&b, "# --wide adds %s; --json and --csv have every field\n", strings.Join(left, ", "))
	}
	if width == 0 {
		return b.String()
	}
	return WrapComments(b.String(), width)
}

// WrapComments folds every comment line of text (a line that starts with
// "#") longer than width runes into lines within it, breaking at spaces
// where it can; continuation lines start "#   ". Other lines are left as
// they are.
func WrapComments(text string, width int) string {
	var out strings.Builder
	for _, l := range strings.SplitAfter(text, "\n") {
		if strings.HasPrefix(l, "#") {
			nl := strings.HasSuffix(l, "\n")
			l = wrapComment(strings.TrimSuffix(l, "\n"), width)
			if nl {
				l += "\n"
			}
		}
		out.WriteString(l)
	}
	return out.String()
}

// wideFooter is the wide table's footer after the check line: the ratio
// summaries and what each column means, in full.
func wideFooter(rec Record) string {
	var b strings.Builder
	if s := ratioSummary(rec.Rows, func(r *Row) float64 { return r.Ratio }); s != "" {
		fmt.Fprintf(&b, "# ratio nvl_GBps / baseline_GBps: %s\n", s)
	}
	if s := ratioSummary(rec.Rows, func(r *Row) float64 { return r.A2ASpeedup }); s != "" {
		fmt.Fprintf(&b, "# vs_a2a = a2a_us / time_us (goep's speedup over the a2a baseline): %s\n", s)
	}
	switch rec.Timing {
	case TimingEventMax:
		b.WriteString("# time_us, p99_us: median and p99 over iterations of the maximum over ranks of each rank's GPU time between CUDA events recorded on its stream after a barrier, before and after the call\n")
	case TimingRankMax:
		b.WriteString("# time_us, p99_us: median and p99 over iterations of the maximum over ranks of each rank's time from a barrier's exit to leaving Synchronize\n")
	default:
		b.WriteString("# time_us, p99_us: median and p99 over iterations of the time from the first rank entering the call to the last leaving Synchronize\n")
	}
	if rec.Env.Backend == BackendCUDA {
		b.WriteString("# nvl_GBps: mean over ranks of received rows x hidden x dtype size, / time_us; baseline: a device-to-device copy of those bytes on each rank's engine stream, every rank at once\n")
	} else {
		b.WriteString("# nvl_GBps: mean over ranks of received rows x hidden x dtype size, / time_us; baseline: a plain copy of those bytes by every rank at once\n")
	}
	b.WriteString(peerLine(rec.Rows))
	b.WriteString(rec.FP8Line())
	b.WriteString(rdmaLines(rec.Rows))
	if slices.ContainsFunc(rec.Rows, func(r Row) bool { return r.Call == CallDispatchCombine }) {
		b.WriteString("# dispatch-combine: Dispatch then Combine of its RecvX per iteration, no host synchronisation between them; its bytes count twice (there and back)\n")
	}
	if rec.Env.Backend == BackendCUDA && len(rec.Rows) > 0 {
		b.WriteString("# a2a: not run on the cuda backend (the a2a baseline is a host all-to-all of host memory)\n")
	}
	if rec.BaselineA2ATransport != "" {
		fmt.Fprintf(&b, "# a2a: the same call as an all-to-all of the token rows over %s plus a local permute or sum, same bytes, timed the same way; #wrong counts its rows too\n", rec.BaselineA2ATransport)
	}
	return b.String()
}

// briefFooter is wideFooter said in lines that fit TableWidth (a long
// case label or byte count may still need wrapping); docs/PERFORMANCE.md
// and the wide table say it in full.
func briefFooter(rec Record) string {
	var b strings.Builder
	if s := ratioSummary(rec.Rows, func(r *Row) float64 { return r.Ratio }); s != "" {
		fmt.Fprintf(&b, "# ratio = nvl_GBps / baseline_GBps: %s\n", s)
	}
	if s := ratioSummary(rec.Rows, func(r *Row) float64 { return r.A2ASpeedup }); s != "" {
		fmt.Fprintf(&b, "# vs_a2a = a2a_us / time_us: %s\n", s)
	}
	switch rec.Timing {
	case TimingEventMax:
		b.WriteString("# time_us, p99_us: median, p99 over iterations of the slowest rank's GPU time between CUDA events around the call\n")
	case TimingRankMax:
		b.WriteString("# time_us, p99_us: median, p99 over iterations of the slowest rank's time from a barrier to leaving Synchronize\n")
	default:
		b.WriteString("# time_us, p99_us: median, p99 over iterations of first rank entering the call to last leaving Synchronize\n")
	}
	copy := "a plain copy of them by every rank at once"
	if rec.Env.Backend == BackendCUDA {
		copy = "a device-to-device copy of them on each rank's stream"
	}
	fmt.Fprintf(&b, "# nvl_GBps: received rows x row bytes / time_us, mean over ranks; baseline: %s\n", copy)
	if s := peerShare(rec.Rows); s >= 0 {
		fmt.Fprintf(&b, "# nvl_peer_GBps (JSON): the %.1f%% of the received bytes a rank reads from another GPU\n", s)
	}
	if rec.FP8Line() != "" {
		fmt.Fprintf(&b, "# fp8: dispatch, dispatch-permute move e4m3 rows and an fp32 scale per %d channels; the calls that combine run in bf16\n", device.FP8ScaleChannels)
	}
	b.WriteString(briefRDMALines(rec.Rows))
	if slices.ContainsFunc(rec.Rows, func(r Row) bool { return r.Call == CallDispatchCombine }) {
		b.WriteString("# dispatch-combine: Dispatch then Combine, no host synchronisation between them; its bytes count twice\n")
	}
	if rec.Env.Backend == BackendCUDA && len(rec.Rows) > 0 {
		b.WriteString("# a2a: not run on the cuda backend (the a2a baseline is a host all-to-all of host memory)\n")
	}
	if rec.BaselineA2ATransport != "" {
		fmt.Fprintf(&b, "# a2a: the same call as an all-to-all of the rows over %s plus a local permute or sum; #wrong counts its rows too\n", rec.BaselineA2ATransport)
	}
	return b.String()
}

// column is one column of the table: its header, its width in the wide
// table (the least in the narrow one is narrow), whether its values are
// left-aligned, and the value of a row ("-" where the row has none).
type column struct {
	name         string
	wide, narrow int
	left         bool
	// brief: WriteTableWithin shows it (when some row has a value, for
	// the columns that may have none).
	brief bool
	value func(r *Row) string
}

// tableColumns lists the table's columns in order: the case (mode, sms,
// chunk and rep only when the rows take several values of them: else the
// header line names the one value), then the measurements.
func tableColumns(rows []Row) []column {
	f1 := func(x float64) string { return fmt.Sprintf("%.1f", x) }
	f2 := func(x float64) string { return fmt.Sprintf("%.2f", x) }
	itoa := strconv.Itoa
	sw := sweeps(rows)
	cols := []column{
		{"call", 17, 17, true, true, func(r *Row) string { return r.Call }},
		{"tokens", 7, 6, false, true, func(r *Row) string { return itoa(r.Tokens) }},
		{"hidden", 7, 6, false, true, func(r *Row) string { return itoa(r.Hidden) }},
		{"topk", 5, 4, false, true, func(r *Row) string { return itoa(r.TopK) }},
		{"dtype", 5, 5, false, true, func(r *Row) string { return r.DType }},
	}
	if sw.mode {
		cols = append(cols, column{"mode", 8, 8, true, true, func(r *Row) string { return r.Mode }})
	}
	if sw.sms {
		cols = append(cols, column{"sms", 5, 4, false, true, func(r *Row) string { return itoa(r.SMs) }})
	}
	if sw.chunk {
		cols = append(cols, column{"chunk", 6, 5, false, true, func(r *Row) string { return itoa(r.ChunkRows) }})
	}
	if sw.rep {
		cols = append(cols, column{"rep", 3, 3, false, true, func(r *Row) string { return itoa(r.Rep) }})
	}
	return append(cols,
		column{"time_us", 11, 9, false, true, func(r *Row) string { return f1(r.Time.Median) }},
		column{"p99_us", 11, 9, false, true, func(r *Row) string { return f1(r.Time.P99) }},
		column{"nvl_GBps", 9, 8, false, true, func(r *Row) string { return f2(r.NVLGBps) }},
		column{"rdma_GBps", 9, 9, false, true, func(r *Row) string { return posOrDash(r.RDMAGBps, r.RDMAGBps) }},
		column{"baseline_GBps", 13, 13, false, false, func(r *Row) string { return posOrDash(r.BaselineGBps, r.BaselineGBps) }},
		column{"ratio", 6, 5, false, true, func(r *Row) string { return posOrDash(r.BaselineGBps, r.Ratio) }},
		column{"a2a_us", 11, 9, false, false, func(r *Row) string { return a2aOrDash(r, f1(a2aMedian(r))) }},
		column{"a2a_GBps", 9, 8, false, false, func(r *Row) string { return a2aOrDash(r, f2(r.A2AGBps)) }},
		column{"vs_a2a", 7, 6, false, true, func(r *Row) string { return a2aOrDash(r, f2(r.A2ASpeedup)) }},
		column{"#wrong", 7, 6, false, true, func(r *Row) string { return itoa(r.Wrong + r.A2AWrong) }},
	)
}

// posOrDash is v with two decimals when the quantity it depends on, x, is
// positive (measured), else "-".
func posOrDash(x, v float64) string {
	if x > 0 {
		return fmt.Sprintf("%.2f", v)
	}
	return "-"
}

// a2aOrDash is s when the row has the a2a baseline, else "-".
func a2aOrDash(r *Row, s string) string {
	if r.A2A == nil {
		return "-"
	}
	return s
}

func a2aMedian(r *Row) float64 {
	if r.A2A == nil {
		return 0
	}
	return r.A2A.Median
}

// dropOrder is the order in which fitColumns leaves out columns that do
// not fit: the least needed first.
var dropOrder = []string{"p99_us", "ratio", "rdma_GBps", "vs_a2a"}

// fitColumns picks the narrow table's columns of cols: the brief ones,
// less those without a value in any row, each as wide as its header and
// its values (at least its narrow width), less those of dropOrder while
// the rows are wider than width. It returns them, and the names of the
// columns with values it left out.
func fitColumns(cols []column, rows []Row, width int) (kept []column, left []string) {
	hasValue := func(c column) bool {
		for i := range rows {
			if c.value(&rows[i]) != "-" {
				return true
			}
		}
		return false
	}
	for _, c := range cols {
		c.wide = max(c.narrow, len(c.name))
		for i := range rows {
			c.wide = max(c.wide, utf8.RuneCountInString(c.value(&rows[i])))
		}
		switch {
		case c.brief && (hasValue(c) || !slices.Contains(dropOrder, c.name)):
			kept = append(kept, c)
		case hasValue(c):
			left = append(left, c.name)
		}
	}
	lineWidth := func() int {
		n := 1 // "  " before the first, " " before the others
		for _, c := range kept {
			n += 1 + c.wide
		}
		return n
	}
	for _, name := range dropOrder {
		if lineWidth() <= width {
			break
		}
		if i := slices.IndexFunc(kept, func(c column) bool { return c.name == name }); i >= 0 {
			kept = slices.Delete(kept, i, i+1)
			left = append(left, name)
		}
	}
	return kept, left
}

// writeColumns writes the column header and a line per row, each column
// as wide as its wide width (a longer value overflows it, as printf's
// widths do).
func writeColumns(b *strings.Builder, cols []column, rows []Row) {
	cell := func(c column, s string) string {
		pad := max(c.wide-utf8.RuneCountInString(s), 0)
		if c.left {
			return s + strings.Repeat(" ", pad)
		}
		return strings.Repeat(" ", pad) + s
	}
	line := func(prefix string, val func(c column) string) {
		var cells []string
		for _, c := range cols {
			cells = append(cells, cell(c, val(c)))
		}
		b.WriteString(strings.TrimRight(prefix+strings.Join(cells, " "), " ") + "\n")
	}
	line("# ", func(c column) string { return c.name })
	for i := range rows {
		line("  ", func(c column) string { return c.value(&rows[i]) })
	}
}

// wrapComment folds a comment line longer than width into lines of at
// most width runes, continuation lines starting "#   ".
func wrapComment(line string, width int) string {
	const cont = "#   "
	rs := []rune(line)
	var out []string
	for len(rs) > width {
		cut := breakAt(rs, width, len(cont)+1)
		out = append(out, strings.TrimRight(string(rs[:cut]), " "))
		rest := strings.TrimLeft(string(rs[cut:]), " ")
		if rest == "" {
			return strings.Join(out, "\n")
		}
		rs = []rune(cont + rest)
	}
	return strings.Join(append(out, string(rs)), "\n")
}

// breakAt is where to break rs, longer than width, so that rs[:cut] fits:
// at the last field separator (two spaces), "; ", "), " or ", " (after
// the punctuation) in the line's second half, in that order of
// preference, else at its last space after least, else within a word, at
// width.
func breakAt(rs []rune, width, least int) int {
	for _, sep := range []string{"  ", "; ", "), ", ", ", " "} {
		sr := []rune(sep)
		lo := width / 2
		if sep == " " {
			lo = least
		}
		for i := min(width, len(rs)-len(sr)); i > lo; i-- {
			if string(rs[i:i+len(sr)]) != sep {
				continue
			}
			i += len(strings.TrimRight(sep, " ")) // keep the punctuation
			if i <= width {
				return i
			}
		}
	}
	return width
}

// ranksPerDomain is the run's D: the one the engines ran with (the
// rows'), else, with no rows (or rows of records written before
// Row.RanksPerDomain), the config's, else GOEP_RANKS_PER_DOMAIN, else all
// ranks. The config's is 0 when it left D to the engine, which may have
// detected several domains.
func (rec *Record) ranksPerDomain() int {
	for _, r := range rec.Rows {
		if r.RanksPerDomain > 0 {
			return r.RanksPerDomain
		}
	}
	if d := rec.Config.RanksPerDomain; d > 0 {
		return d
	}
	if d, err := rec.Config.domainSize(); err == nil {
		return d
	}
	return rec.Config.Ranks
}

// rdmaLines is the footer's line per case with several domains: the bytes
// a one-way call sends across domains per rank (mean over ranks), each
// token once per remote domain (Row.RDMACrossBytes), beside what
// rdma_GBps counts (Row.RDMABytes, the own domain included) and what the
// flat scheme, every token to every remote rank, would send
// (Row.RDMAFlatBytes). "" with one domain. Cases that differ only in the
// tuning knobs send the same bytes: one line for them all.
func rdmaLines(rows []Row) string {
	var b strings.Builder
	sw := sweeps(rows)
	type bytesCase struct {
		tokens, hidden, topk int
		dtype, mode          string
	}
	seen := map[bytesCase]bool{}
	for _, r := range rows {
		k := bytesCase{r.Tokens, r.Hidden, r.TopK, r.DType, r.Mode}
		if r.RDMABytes <= 0 || seen[k] {
			continue
		}
		seen[k] = true
		trips := float64(callTrips(r.Call))
		design, cross, flat := r.RDMABytes/trips, r.RDMACrossBytes/trips, r.RDMAFlatBytes/trips
		fmt.Fprintf(&b, "# rdma tokens %d hidden %d %s", r.Tokens, r.Hidden, r.DType)
		if sw.topk {
			fmt.Fprintf(&b, " topk %d", r.TopK)
		}
		if sw.mode {
			fmt.Fprintf(&b, " %s", r.Mode)
		}
		b.WriteString(": ")
		if cross <= 0 {
			fmt.Fprintf(&b, "no token leaves its domain (rdma_GBps counts %s per rank per one-way call, own domain included)\n", byteSize(design))
			continue
		}
		fmt.Fprintf(&b, "%s cross domains per rank per one-way call (each token once per remote domain; rdma_GBps counts %s, own domain included); the flat scheme (every token to every remote rank) would send %s, %.2fx as much\n",
			byteSize(cross), byteSize(design), byteSize(flat), flat/cross)
	}
	return b.String()
}

// briefRDMALines is rdmaLines in short lines: per case with several
// domains, the bytes a rank sends across domains per one-way call, what
// rdma_GBps counts and what the flat scheme would send, the case named by
// its tokens and the other fields the rows sweep. The bytes do not depend
// on the mode or the tuning knobs (the routing does not): one line for
// the cases that differ only in those.
func briefRDMALines(rows []Row) string {
	var b strings.Builder
	sw := sweeps(rows)
	sw.mode, sw.sms, sw.chunk, sw.rep = false, false, false, false
	seen := map[string]bool{}
	for i := range rows {
		r := &rows[i]
		k := sw.label(r)
		if r.RDMABytes <= 0 || seen[k] {
			continue
		}
		seen[k] = true
		trips := float64(callTrips(r.Call))
		design, cross, flat := r.RDMABytes/trips, r.RDMACrossBytes/trips, r.RDMAFlatBytes/trips
		if cross <= 0 {
			fmt.Fprintf(&b, "# rdma %s: no token leaves its domain (rdma_GBps counts %s a rank, one-way)\n", k, byteSize(design))
			continue
		}
		fmt.Fprintf(&b, "# rdma %s: %s cross domains a rank, one-way (rdma_GBps counts %s); flat scheme: %s, %.2fx\n",
			k, byteSize(cross), byteSize(design), byteSize(flat), flat/cross)
	}
	return b.String()
}

// byteSize is x bytes in decimal units (kB = 1000 bytes, as GB/s counts).
func byteSize(x float64) string {
	switch {
	case x >= 1e9:
		return fmt.Sprintf("%.2f GB", x/1e9)
	case x >= 1e6:
		return fmt.Sprintf("%.2f MB", x/1e6)
	case x >= 1e3:
		return fmt.Sprintf("%.2f kB", x/1e3)
	}
	return fmt.Sprintf("%.0f B", x)
}

// ShortCommit is the commit as the headers print it: its first 12 hex
// digits, with "+dirty" when the tree had uncommitted changes; "" when
// unknown.
func (e Env) ShortCommit() string {
	c := e.Commit
	if len(c) > 12 {
		c = c[:12]
	}
	if e.Modified {
		c += "+dirty"
	}
	return c
}

// GPULine is "gpu: NAME (GPU i)  driver V" on the cuda backend, else "".
func (e Env) GPULine() string {
	if e.GPU == "" {
		return ""
	}
	idx := ""
	if e.GPUIndex != nil {
		idx = fmt.Sprintf(" (GPU %d)", *e.GPUIndex)
	}
	return fmt.Sprintf("gpu: %s%s  driver %s", e.GPU, idx, orDash(e.Driver))
}

// FP8Line is the footer line that says what the calls of an fp8 case move
// (eprun bench and eprun check print it alike); "" when the record has no
// fp8 case.
func (rec *Record) FP8Line() string {
	fp8 := slices.ContainsFunc(rec.Rows, func(r Row) bool { return r.CaseDTypeName() == device.FP8E4M3.String() })
	for _, d := range rec.Config.DType {
		if dt, err := parseDType(d); err == nil && dt == device.FP8E4M3 {
			fp8 = true
		}
	}
	if !fp8 {
		return ""
	}
	return fmt.Sprintf("# fp8: dispatch and dispatch-permute move fp8 e4m3 rows with one fp32 scale per %d channels (hidden + hidden/%d x 4 bytes a row, in nvl and rdma bytes and the copy baseline); combine, unpermute-combine and dispatch-combine run in bf16 (fp8 is dispatch only: DeepEP's FP8 dispatch, BF16 combine), on bf16 inputs of their own, against a bf16 copy baseline\n",
		device.FP8ScaleChannels, device.FP8ScaleChannels)
}

// CheckLine is the footer line that reports the run's checks (eprun bench
// and eprun check print it alike); for a run that stopped early, how many
// of its rows it measured and why it stopped.
func (rec *Record) CheckLine() string {
	switch {
	case rec.Error != "" || rec.Incomplete:
		return fmt.Sprintf("# check: INCOMPLETE, %d of %d rows measured (%d output rows checked, %d wrong) before the run failed: %s\n",
			len(rec.Rows), rec.Config.rows(), rec.CheckedRows, rec.Wrong, orDash(rec.Error))
	case rec.Wrong > 0:
		return fmt.Sprintf("# check: FAILED, %d of %d output rows wrong\n", rec.Wrong, rec.CheckedRows)
	}
	return fmt.Sprintf("# check: OK, %d output rows match the expectation\n", rec.CheckedRows)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// swept says which of a case's fields other than tokens take several
// values over rows (sms: Row.SMs, chunk: Row.ChunkRows), and whether the
// rows are of several repetitions (rep: Row.Rep).
type swept struct{ hidden, topk, dtype, mode, sms, chunk, rep bool }

func sweeps(rows []Row) swept {
	var s swept
	for _, r := range rows[min(1, len(rows)):] {
		s.hidden = s.hidden || r.Hidden != rows[0].Hidden
		s.topk = s.topk || r.TopK != rows[0].TopK
		s.dtype = s.dtype || r.DType != rows[0].DType
		s.mode = s.mode || r.Mode != rows[0].Mode
		s.sms = s.sms || r.SMs != rows[0].SMs
		s.chunk = s.chunk || r.ChunkRows != rows[0].ChunkRows
		s.rep = s.rep || r.Rep != rows[0].Rep
	}
	return s
}

// allZero reports whether every value of v is 0 (the tuning knobs'
// default).
func allZero(v Ints) bool {
	for _, x := range v {
		if x != 0 {
			return false
		}
	}
	return true
}

// label names r's case among rows: its tokens, and each other field of
// the case that the rows sweep ("tokens 256, topk 4, capacity, sms 2,
// chunk 16"), and its repetition when there are several ("rep 3").
func (s swept) label(r *Row) string {
	l := fmt.Sprintf("tokens %d", r.Tokens)
	if s.hidden {
		l += fmt.Sprintf(", hidden %d", r.Hidden)
	}
	if s.topk {
		l += fmt.Sprintf(", topk %d", r.TopK)
	}
	if s.dtype {
		l += ", " + r.DType
	}
	if s.mode {
		l += ", " + r.Mode
	}
	if s.sms {
		l += fmt.Sprintf(", sms %d", r.SMs)
	}
	if s.chunk {
		l += fmt.Sprintf(", chunk %d", r.ChunkRows)
	}
	if s.rep {
		l += fmt.Sprintf(", rep %d", r.Rep)
	}
	return l
}

// ratioSummary is "min X (call, case), geomean Y, max Z (call, case)" of f
// over the rows where it is positive; the case is named by swept.label.
func ratioSummary(rows []Row, f func(*Row) float64) string {
	var lo, hi *Row
	logSum, n := 0.0, 0
	for i := range rows {
		r := &rows[i]
		if f(r) <= 0 {
			continue
		}
		if lo == nil || f(r) < f(lo) {
			lo = r
		}
		if hi == nil || f(r) > f(hi) {
			hi = r
		}
		logSum += math.Log(f(r))
		n++
	}
	if n == 0 {
		return ""
	}
	sw := sweeps(rows)
	return fmt.Sprintf("min %.2f (%s, %s), geomean %.2f, max %.2f (%s, %s)",
		f(lo), lo.Call, sw.label(lo), math.Exp(logSum/float64(n)), f(hi), hi.Call, sw.label(hi))
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
// ns/op the median iteration time and MB/s the NVLink bandwidth. Names are
// Benchmark<Call>/ranks=R/tokens=T/hidden=H/topk=K/dtype=D/routing=KIND
// (plus /zipf_s=S for zipf; then /sms=N and /chunk=N, each only when the
// rows sweep that knob or its value is not the default 0, so that the
// names of runs without the knobs stay as they were)-GOMAXPROCS. The mode is a configuration line,
// "mode: blocking", which holds for the results after it: a sweep over
// modes repeats it before the first row of each new mode, so that
// benchstat (whose default tables are per configuration) never pools a
// capacity result with a blocking one, and a name means the same in a
// run of one mode as in a sweep.
func WriteGoBench(w io.Writer, rec Record) error {
	var b strings.Builder
	e := rec.Env
	fmt.Fprintf(&b, "goos: %s\ngoarch: %s\npkg: github.com/goep/goep/cmd/eprun\n", e.GOOS, e.GOARCH)
	if e.CPU != "" {
		fmt.Fprintf(&b, "cpu: %s\n", e.CPU)
	}
	mode := ""
	if len(rec.Rows) > 0 {
		mode = rec.Rows[0].Mode
	} else if len(rec.Config.Mode) > 0 {
		mode = rec.Config.Mode[0]
	}
	fmt.Fprintf(&b, "backend: %s\nmode: %s\n", e.Backend, mode)
	if e.GPU != "" {
		fmt.Fprintf(&b, "gpu: %s\n", e.GPU)
	}
	// The routing is part of the name, so that benchstat tells a zipf run
	// from a uniform one (it compares results of equal names).
	routing := "/routing=" + rec.Config.RoutingSpec().kind()
	if rec.Config.Routing == RoutingZipf {
		routing += "/zipf_s=" + strconv.FormatFloat(rec.Config.ZipfS, 'g', -1, 64)
	}
	sw := sweeps(rec.Rows)
	line := func(name string, r Row, s Stats, gbps float64) {
		knobs := ""
		if sw.sms || r.SMs != 0 {
			knobs += fmt.Sprintf("/sms=%d", r.SMs)
		}
		if sw.chunk || r.ChunkRows != 0 {
			knobs += fmt.Sprintf("/chunk=%d", r.ChunkRows)
		}
		fmt.Fprintf(&b, "Benchmark%s/ranks=%d/tokens=%d/hidden=%d/topk=%d/dtype=%s%s%s-%d\t%d\t%.0f ns/op\t%.2f MB/s\t%.0f p99-ns/op\n",
			name, r.Ranks, r.Tokens, r.Hidden, r.TopK, r.DType, routing, knobs, e.GOMAXPROCS, s.N, s.Median*1e3, gbps*1e3, s.P99*1e3)
	}
	for i, r := range rec.Rows {
		if r.Mode != mode {
			mode = r.Mode
			fmt.Fprintf(&b, "mode: %s\n", mode)
		}
		line(benchName(r.Call), r, r.Time, r.NVLGBps)
		if r.A2A != nil {
			line("A2A"+benchName(r.Call), r, *r.A2A, r.A2AGBps)
		}
		if i+1 == len(rec.Rows) || !sameCase(r, rec.Rows[i+1]) {
			// The case's copy baselines, one per dtype its calls moved
			// (an fp8 case: fp8 rows with their scales, and bf16).
			first := i
			for first > 0 && sameCase(rec.Rows[first-1], r) {
				first--
			}
			var done []string
			for _, cr := range rec.Rows[first : i+1] {
				if cr.BaselineGBps > 0 && !slices.Contains(done, cr.DType) {
					done = append(done, cr.DType)
					line("Baseline", cr, cr.Baseline, cr.BaselineGBps)
				}
			}
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// sameCase reports whether two rows are of one case of the sweep, in one
// repetition (the rows of an fp8 case differ in DType: fp8 and bf16).
func sameCase(a, b Row) bool {
	return a.Tokens == b.Tokens && a.Hidden == b.Hidden && a.CaseDTypeName() == b.CaseDTypeName() && a.TopK == b.TopK && a.Mode == b.Mode &&
		a.SMs == b.SMs && a.ChunkRows == b.ChunkRows && a.Rep == b.Rep
}

// peerLine says what share of the received bytes a rank reads from
// another GPU (Row.NVLPeerBytes), the bytes a peer copy's bandwidth
// bounds, when it is not all of them; "" when no row received anything.
func peerLine(rows []Row) string {
	s := peerShare(rows)
	if s < 0 {
		return ""
	}
	return fmt.Sprintf("# nvl_peer_GBps (JSON): the rows a rank reads from another GPU, %.1f%% of the received bytes here (the rest it copies within its GPU): what a GPU-to-GPU copy bounds\n", s)
}

// peerShare is the percentage of the received bytes a rank reads from
// another GPU, over rows; -1 when no row received anything.
func peerShare(rows []Row) float64 {
	var nvl, peer float64
	for _, r := range rows {
		nvl += r.NVLBytes
		peer += r.NVLPeerBytes
	}
	if nvl == 0 {
		return -1
	}
	return 100 * peer / nvl
}
