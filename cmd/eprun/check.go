package main

import (
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/goep/goep/internal/bench"
)

func newCheck(stdout, stderr io.Writer) *cobra.Command {
	var f benchFlags
	cmd := &cobra.Command{
		Use:   "check [CONFIG]",
		Short: "Run every call of a config a few times and check every output; exit 1 on any mismatch",
		Long: `Run the correctness sweep of eprun bench alone: every case of the config, every call, a few
iterations (--iters, default 2, no warm-up), each rank checking its own outputs against the
expectation computed from the routing (DESIGN.md section 2), with no timing baselines. Prints
a summary per call and exits 1 if any row is wrong on any rank. --count N runs the whole
sweep N times, every case on fresh engines each time, every output checked each time.

--backend cuda (a binary built with -tags cuda) runs the engines on GPU GOEP_DEVICE (default
0; under a launcher the local rank), uploading the inputs and downloading every output to
check it as on the host.

Without a launcher the ranks are goroutines of this process; under mpirun or eprun launch this
process is one rank, as for eprun bench, and only rank 0 prints.

CONFIG is a YAML file or an embedded config (` + strings.Join(embeddedNames(), ", ") + `); default: the
embedded default. Flags override its fields.`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := f.configArg(cmd, args); err != nil {
				return err
			}
			// A few iterations, unless the flags say otherwise.
			if !cmd.Flags().Changed("iters") {
				_ = cmd.Flags().Set("iters", "2")
			}
			if !cmd.Flags().Changed("warmup") {
				_ = cmd.Flags().Set("warmup", "0")
			}
			return runWithCSV(cmd, "check", f, stdout, stderr, writeCheck)
		},
	}
	f.register(cmd)
	cmd.Flags().StringVar(&f.csvOut, "csv", "", "write one row per call and case as CSV to FILE (- for stdout; the summary then goes to stderr); no baseline columns")
	return cmd
}

// writeCheck prints the per-call summary of a check run.
func writeCheck(w io.Writer, rec bench.Record) error {
	var b strings.Builder
	e, c := rec.Env, rec.Config
	fmt.Fprintf(&b, "# goep %s (%s)  backend %s  %s %s/%s\n", e.GoepVersion, dash(e.ShortCommit()), e.Backend, e.GoVersion, e.GOOS, e.GOARCH)
	if rec.Scaled != nil {
		fmt.Fprintf(&b, "# %s\n", rec.Scaled)
	}
	if s := e.GPULine(); s != "" {
		fmt.Fprintf(&b, "# %s\n", s)
	}
	// Every swept field prints as its flag takes it: 64,128.
	// The tuning knobs only when not the engine's default (0).
	knobs := ""
	if slices.ContainsFunc(c.SMs, func(n int) bool { return n != 0 }) {
		knobs += fmt.Sprintf("  sms %v", c.SMs)
	}
	if slices.ContainsFunc(c.ChunkRows, func(n int) bool { return n != 0 }) {
		knobs += fmt.Sprintf("  chunk_rows %v", c.ChunkRows)
	}
	count := ""
	if c.Count > 1 {
		count = fmt.Sprintf("  count %d", c.Count)
	}
	fmt.Fprintf(&b, "# ranks %d  experts %d  topk %v  hidden %v  tokens %v  dtype %v  mode %v  pad %d  iters %d%s  seed %d%s\n",
		c.Ranks, c.Experts, c.TopK, c.Hidden, c.Tokens, c.DType, c.Mode, c.Pad, c.Iters, count, c.Seed, knobs)
	fmt.Fprintf(&b, "# launcher %s  processes %d  group %s\n#\n", rec.Launcher, rec.Processes, dash(rec.Group))
	fmt.Fprintf(&b, "# %-17s %6s %13s %8s\n", "call", "cases", "rows_checked", "#wrong")
	type sum struct{ cases, rows, wrong int }
	sums := map[string]*sum{}
	for _, r := range rec.Rows {
		s := sums[r.Call]
		if s == nil {
			s = &sum{}
			sums[r.Call] = s
		}
		if r.Rep <= 1 { // cases, not their repetitions
			s.cases++
		}
		s.rows += r.CheckedRows
		s.wrong += r.Wrong
	}
	for _, call := range c.Calls {
		s := sums[call]
		if s == nil {
			s = &sum{}
		}
		fmt.Fprintf(&b, "  %-17s %6d %13d %8d\n", call, s.cases, s.rows, s.wrong)
	}
	b.WriteString("#\n")
	b.WriteString(rec.FP8Line())
	b.WriteString(rec.CheckLine())
	_, err := io.WriteString(w, bench.WrapComments(b.String(), bench.TableWidth))
	return err
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
