package bench

import (
	"encoding/csv"
	"io"
	"strconv"
)

// CSVColumns is the header of WriteCSV: the table's columns (#wrong as
// wrong), then the config's fields (mode: the row's, as topk is) and
// where it ran, then the RDMA byte counts of the JSON record
// (Row.RDMACrossBytes, Row.RDMAFlatBytes; empty with one domain), then
// the row's tuning knobs (Row.SMs, Row.ChunkRows; 0: the engine's
// default), then the case's dtype and the bytes of a row (Row.CaseDType,
// Row.RowBytes: dtype is the call's, bf16 for the calls that combine of an
// fp8 case), then the repetition that measured the row (Row.Rep, 1 to
// count). New columns go at the end: consumers index by position.
var CSVColumns = []string{
	"call", "tokens", "hidden", "topk", "dtype", "time_us", "p99_us", "nvl_GBps", "rdma_GBps",
	"baseline_GBps", "ratio", "a2a_us", "a2a_GBps", "vs_a2a", "wrong",
	"ranks", "ranks_per_domain", "experts", "mode", "pad", "iters", "warmup", "seed", "routing", "zipf_s",
	"launcher", "processes", "timing", "commit", "backend",
	"rdma_cross_bytes_per_rank", "rdma_flat_bytes_per_rank",
	"sms", "chunk_rows",
	"case_dtype", "row_bytes",
	"rep",
}

// WriteCSV writes one row per (call, case) with CSVColumns. A value the
// table prints as "-" (no RDMA, no baseline) is an empty cell; wrong
// counts the a2a baseline's rows too, as the table's #wrong does.
func WriteCSV(w io.Writer, rec Record) error {
	cw := csv.NewWriter(w)
	if err := cw.Write(CSVColumns); err != nil {
		return err
	}
	c := rec.Config
	f := func(x float64, prec int) string { return strconv.FormatFloat(x, 'f', prec, 64) }
	pos := func(x float64, prec int) string {
		if x > 0 {
			return f(x, prec)
		}
		return ""
	}
	itoa := strconv.Itoa
	for _, r := range rec.Rows {
		// The D the engine ran with (a record written before rows had it:
		// the config's).
		d := r.RanksPerDomain
		if d <= 0 {
			d = rec.ranksPerDomain()
		}
		a2aUS, a2aGBps, vs := "", "", ""
		if r.A2A != nil {
			a2aUS, a2aGBps, vs = f(r.A2A.Median, 3), f(r.A2AGBps, 4), f(r.A2ASpeedup, 4)
		}
		ratio := ""
		if r.BaselineGBps > 0 {
			ratio = f(r.Ratio, 4)
		}
		zipf := ""
		if c.ZipfS != 0 {
			zipf = strconv.FormatFloat(c.ZipfS, 'g', -1, 64)
		}
		backend := c.Backend
		if backend == "" {
			backend = BackendHost
		}
		routing := c.Routing
		if routing == "" {
			routing = RoutingUniform
		}
		row := []string{
			r.Call, itoa(r.Tokens), itoa(r.Hidden), itoa(r.TopK), r.DType,
			f(r.Time.Median, 3), f(r.Time.P99, 3), f(r.NVLGBps, 4), pos(r.RDMAGBps, 4),
			pos(r.BaselineGBps, 4), ratio, a2aUS, a2aGBps, vs, itoa(r.Wrong + r.A2AWrong),
			itoa(c.Ranks), itoa(d), itoa(c.Experts), r.Mode, itoa(c.Pad), itoa(c.Iters), itoa(c.Warmup),
			strconv.FormatUint(c.Seed, 10), routing, zipf,
			rec.Launcher, itoa(rec.Processes), rec.Timing, rec.Env.Commit, backend,
			pos(r.RDMACrossBytes, -1), pos(r.RDMAFlatBytes, -1),
			itoa(r.SMs), itoa(r.ChunkRows),
			r.CaseDTypeName(), itoa(r.RowBytes),
			itoa(r.Rep),
		}
		if err := cw.Write(row); err != nil {
			return err
		}
	}
	cw.Flush()
	return cw.Error()
}
