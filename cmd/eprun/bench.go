package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"
	"go.uber.org/zap"

	"github.com/goep/goep/configs"
	"github.com/goep/goep/device"
	"github.com/goep/goep/internal/bench"
	"github.com/goep/goep/launcher"
)

type benchFlags struct {
	config            string
	backend           string
	ranks             int
	ranksPerDomain    int
	tokens            []int
	hidden            []int
	topk              []int
	experts           int
	dtype             []string
	sms               []int
	chunkRows         []int
	iters             int
	warmup            int
	count             int
	mode              []string
	pad               int
	seed              uint64
	calls             []string
	maxRecvTokens     int
	maxPermutedTokens int
	routing           string
	zipfS             float64
	jsonOut           string
	csvOut            string
	format            string
	quiet             bool
	wide              bool
	forceMemory       bool
	scaleToFit        bool
}

func newBench(stdout, stderr io.Writer) *cobra.Command {
	var f benchFlags
	cmd := &cobra.Command{
		Use:   "bench [CONFIG]",
		Short: "Time dispatch, combine, dispatch-permute and unpermute-combine, and check their results",
		Long: `Time dispatch, combine, dispatch-permute and unpermute-combine, check every output against
an expectation computed from the routing, and compare, in the same run, with a plain copy of
the same bytes and with the same calls done as an all-to-all of the token rows plus a local
permute or sum (the a2a baseline).

--backend host (default) runs the engines on the host backend. --backend cuda (a binary built
with -tags cuda) runs them on GPU GOEP_DEVICE (default 0; under a launcher the local rank):
inputs are uploaded, outputs downloaded and checked as on the host, calls are timed with CUDA
events on each rank's stream, the copy baseline is a device-to-device copy of the same bytes
on that stream, and the a2a baseline (a host all-to-all) is not run. In-process ranks share
the one GPU.

Without a launcher the ranks are goroutines of this process (--ranks of them). Started by a
launcher (mpirun, srun, torchrun, eprun launch) this process is one rank: the group comes
from the launcher's environment (MPI with -tags mpi under mpirun, else TCP rendezvous), the
number of ranks is the number of processes (the config's ranks is replaced by it; --ranks,
if given, must equal it), and only rank 0 prints. The a2a baseline then runs over that
group: MPI_Alltoallv under MPI, the TCP exchange under eprun launch.

CONFIG is a YAML file, or the name of an embedded config (` + strings.Join(embeddedNames(), ", ") + `);
without one the embedded default runs. Flags override the config's fields. Mode, topk, dtype,
hidden, sms, chunk-rows and tokens take comma-separated lists to sweep (--topk 4,8 --mode
blocking,capacity --sms 0,8); every combination is a case, run on engines of its own, in that
order: mode outermost, tokens innermost. In capacity mode, max-recv-tokens and
max-permuted-tokens left at 0 are the worst case of each case (its top-k, the sweep's largest
tokens).

--dtype fp8 (also fp8_e4m3, float8_e4m3fn) is DeepEP's "FP8 dispatch, BF16 combine": fp8 e4m3
rows with one fp32 scale per 128 channels, so hidden must be a multiple of 128 (every hidden of
a sweep: each dtype runs with each hidden). Dispatch and dispatch-permute move the fp8 rows
with their scales, and their bytes (nvl_GBps, rdma_GBps, the copy baseline, the a2a baseline)
count the scales: hidden + hidden/128 x 4 bytes a row. fp8 is for dispatch only (a combine sums
rows), so combine, unpermute-combine and dispatch-combine of an fp8 case run in bf16, on bf16
inputs of their own, against a copy baseline of bf16 rows: the table's dtype column says fp8
or bf16 per call, a footer line says so, and the JSON rows have dtype (the call's), case_dtype
(fp8) and row_bytes. Every fp8 row and every scale is checked.

--sms and --chunk-rows are the engine's tuning knobs (executor.Config.SMs, ChunkRows): how the
row copies between ranks spread over the hardware. On the cuda backend, --sms bounds the thread
blocks of the push and scatter kernels (so the copies keep to at most that many SMs) and
--chunk-rows is the rows each block copies at a time; on the host backend, --sms bounds the
goroutines a rank copies with and --chunk-rows is the rows of each work item. 0 (the default)
is the engine's default: no bound (cuda: a block per chunk; host: GOMAXPROCS goroutines), and
one row per block (cuda) or one contiguous range per goroutine (host). Outputs are the same,
bit for bit, for every value; only the time changes. A swept knob gets a column in the table.

The table keeps within 120 columns: the case, time_us, p99_us, nvl_GBps, rdma_GBps (with several
domains), ratio (to the copy baseline), vs_a2a and #wrong, with footer lines folded to fit;
--wide prints every column (baseline_GBps, a2a_us and a2a_GBps too) and the footer unfolded.
--json and --csv always have every field. --count N runs the whole sweep N times, every case
on fresh engines each time: a row per call, case and repetition (the rep column), and with
--format=gobench N results per benchmark, the samples benchstat compares (it wants 6 or more):
  eprun bench --count 6 --format=gobench > old.txt; ...; benchstat old.txt new.txt
A run that stops early (a case or a baseline fails, a signal) prints and writes the rows
measured before, marked incomplete (the check line; "incomplete": true in --json), and
exits non-zero. Progress goes to stderr (-q drops it): the step running, and, once an
iteration is timed, an estimate of the time the whole run has left (eta).`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := f.configArg(cmd, args); err != nil {
				return err
			}
			return runBench(cmd, f, stdout, stderr)
		},
	}
	f.register(cmd)
	fl := cmd.Flags()
	fl.StringVar(&f.format, "format", "table", "output format: table or gobench (lines for benchstat)")
	fl.BoolVar(&f.wide, "wide", false, "print every column of the table (baseline_GBps, a2a_us, a2a_GBps too) and its footer unwrapped; without it the table keeps within 120 columns")
	fl.StringVar(&f.csvOut, "csv", "", "write one row per call and case as CSV to FILE (- for stdout; the table then goes to stderr)")
	return cmd
}

// configArg takes the optional CONFIG argument of bench and check, which
// --config may also give, but not as another config.
func (f *benchFlags) configArg(cmd *cobra.Command, args []string) error {
	if len(args) == 0 {
		return nil
	}
	if f.config != "" && f.config != args[0] {
		return fmt.Errorf("%s: config given twice (%q and --config %q)", cmd.Name(), args[0], f.config)
	}
	f.config = args[0]
	return nil
}

// register adds the flags that bench and check share (check times
// nothing and prints a summary, not a table: its help says so).
func (f *benchFlags) register(cmd *cobra.Command) {
	fl := cmd.Flags()
	check := cmd.Name() == "check"
	callsHelp, jsonHelp := "calls to time", "the table then goes to stderr"
	if check {
		callsHelp, jsonHelp = "calls to run and check", "the summary then goes to stderr"
	}
	fl.StringVar(&f.config, "config", "", "YAML config file or embedded config name (default: the embedded default)")
	fl.StringVar(&f.backend, "backend", "", "where the engines run: "+strings.Join(bench.Backends, " or ")+" (cuda: GPU GOEP_DEVICE, default 0; needs -tags cuda) (default: the config's, else host)")
	fl.IntVar(&f.ranks, "ranks", 0, "ranks R (in-process; under a launcher the number of processes, which --ranks must match if given)")
	fl.IntVar(&f.ranksPerDomain, "ranks-per-domain", 0, "ranks per NVLink domain D (0: GOEP_RANKS_PER_DOMAIN, else all)")
	fl.IntSliceVar(&f.tokens, "tokens", nil, "tokens per rank (comma-separated list to sweep)")
	fl.IntSliceVar(&f.hidden, "hidden", nil, "hidden size H (comma-separated list to sweep)")
	fl.IntSliceVar(&f.topk, "topk", nil, "expert slots per token K (comma-separated list to sweep)")
	fl.IntVar(&f.experts, "experts", 0, "experts E (a multiple of ranks)")
	fl.StringSliceVar(&f.dtype, "dtype", nil, "activation dtype: bf16, fp32 or fp8 (fp8: e4m3 rows with fp32 scales per 128 channels for dispatch and dispatch-permute, bf16 for the calls that combine; hidden a multiple of 128) (comma-separated list to sweep)")
	fl.IntSliceVar(&f.sms, "sms", nil, "tuning knob: most thread blocks of the push/scatter kernels (cuda), most goroutines of a rank's copies (host); 0: no bound (comma-separated list to sweep; results identical, only time changes)")
	fl.IntSliceVar(&f.chunkRows, "chunk-rows", nil, "tuning knob: rows per block (cuda) or per work item (host); 0: the engine's default (comma-separated list to sweep; results identical, only time changes)")
	fl.IntVar(&f.iters, "iters", 0, "timed iterations per call")
	fl.IntVar(&f.warmup, "warmup", 0, "untimed warm-up iterations per call")
	fl.IntVar(&f.count, "count", 0, "run the whole sweep N times, every case on fresh engines each time: a row per call, case and repetition (rep); --format=gobench then prints N lines per benchmark, as benchstat wants (6 or more) (default: the config's, else 1)")
	fl.StringSliceVar(&f.mode, "mode", nil, "blocking or capacity (comma-separated list to sweep)")
	fl.IntVar(&f.pad, "pad", 0, "pad multiple of each expert's permuted segment (1 = none)")
	fl.Uint64Var(&f.seed, "seed", 0, "seed of the routing and payload")
	fl.StringSliceVar(&f.calls, "calls", nil, callsHelp+": "+strings.Join(bench.KnownCalls, ",")+" (default: "+strings.Join(bench.AllCalls, ",")+")")
	fl.IntVar(&f.maxRecvTokens, "max-recv-tokens", 0, "capacity mode: receive capacity (0: worst case)")
	fl.IntVar(&f.maxPermutedTokens, "max-permuted-tokens", 0, "capacity mode: permuted capacity (0: worst case)")
	fl.StringVar(&f.routing, "routing", "", "how tokens pick experts: "+strings.Join(bench.RoutingKinds, ", "))
	fl.Float64Var(&f.zipfS, "zipf-s", 0, "routing zipf: the Zipf exponent s > 0 (e.g. 1.1)")
	fl.StringVar(&f.jsonOut, "json", "", "write the full record as JSON to FILE (- for stdout; "+jsonHelp+")")
	fl.BoolVarP(&f.quiet, "quiet", "q", false, "no progress on stderr (the step running and the time left)")
	fl.BoolVar(&f.forceMemory, "force-memory", false, "run even when the run is expected not to fit in the host memory available (the refusal is then a warning)")
	fl.BoolVar(&f.scaleToFit, "scale-to-fit", false, "where the run is expected not to fit in the host memory available, run it scaled down (ranks halved to 8, then tokens halved, every other field kept) and say so, instead of refusing it (default: the config's scale_to_fit, set by gb300-ep64)")
}

// embeddedNames lists the embedded configs without their .yaml.
func embeddedNames() []string {
	ents, _ := fs.ReadDir(configs.FS, ".")
	var out []string
	for _, e := range ents {
		out = append(out, strings.TrimSuffix(e.Name(), ".yaml"))
	}
	sort.Strings(out)
	return out
}

// loadConfig reads name: the embedded default when empty, a file when one
// exists, else an embedded config of that name (with or without configs/
// and .yaml).
func loadConfig(name string) (bench.Config, error) {
	if name == "" {
		name = configs.Default
	} else if _, err := os.Stat(name); err == nil {
		return bench.LoadConfig(name)
	}
	base := path.Base(strings.TrimPrefix(name, "configs/"))
	if !strings.HasSuffix(base, ".yaml") {
		base += ".yaml"
	}
	data, err := configs.FS.ReadFile(base)
	if err != nil {
		return bench.Config{}, fmt.Errorf("config %q: no such file, and no embedded config of that name (embedded: %s)", name, strings.Join(embeddedNames(), ", "))
	}
	c, err := bench.ParseConfig(bytes.NewReader(data))
	if err != nil {
		return c, fmt.Errorf("embedded %s: %w", base, err)
	}
	return c, nil
}

// apply overrides the config's fields with the flags that were set.
func (f benchFlags) apply(cmd *cobra.Command, c *bench.Config) {
	set := cmd.Flags().Changed
	if set("backend") {
		c.Backend = f.backend
	}
	if set("ranks") {
		c.Ranks = f.ranks
	}
	if set("ranks-per-domain") {
		c.RanksPerDomain = f.ranksPerDomain
	}
	if set("tokens") {
		c.Tokens = f.tokens
	}
	if set("hidden") {
		c.Hidden = f.hidden
	}
	if set("topk") {
		c.TopK = f.topk
	}
	if set("experts") {
		c.Experts = f.experts
	}
	if set("dtype") {
		c.DType = f.dtype
	}
	if set("sms") {
		c.SMs = f.sms
	}
	if set("chunk-rows") {
		c.ChunkRows = f.chunkRows
	}
	if set("iters") {
		c.Iters = f.iters
	}
	if set("warmup") {
		c.Warmup = f.warmup
	}
	if set("count") {
		c.Count = f.count
	}
	if set("mode") {
		c.Mode = f.mode
	}
	if set("pad") {
		c.Pad = f.pad
	}
	if set("seed") {
		c.Seed = f.seed
	}
	if set("calls") {
		c.Calls = f.calls
	}
	if set("max-recv-tokens") {
		c.MaxRecvTokens = f.maxRecvTokens
	}
	if set("max-permuted-tokens") {
		c.MaxPermutedTokens = f.maxPermutedTokens
	}
	if set("routing") {
		c.Routing = f.routing
		if f.routing != bench.RoutingZipf && !set("zipf-s") {
			c.ZipfS = 0 // a zipf config's exponent does not carry over
		}
	}
	if set("zipf-s") {
		c.ZipfS = f.zipfS
	}
	if set("scale-to-fit") {
		c.ScaleToFit = f.scaleToFit
	}
}

func runBench(cmd *cobra.Command, f benchFlags, stdout, stderr io.Writer) error {
	if f.format != "table" && f.format != "gobench" {
		return fmt.Errorf("bench: --format %q: want table or gobench", f.format)
	}
	if f.wide && f.format != "table" {
		return fmt.Errorf("bench: --wide is for --format table, not %s", f.format)
	}
	write := func(w io.Writer, rec bench.Record) error { return bench.WriteTableWithin(w, rec, bench.TableWidth) }
	switch {
	case f.format == "gobench":
		write = bench.WriteGoBench
	case f.wide:
		write = bench.WriteTable
	}
	return runWithCSV(cmd, "bench", f, stdout, stderr, write)
}

// runWithCSV is execute with --csv: the CSV goes to the file, or to stdout
// with what write prints moved to stderr.
func runWithCSV(cmd *cobra.Command, name string, f benchFlags, stdout, stderr io.Writer, write func(io.Writer, bench.Record) error) error {
	if f.csvOut == "-" && f.jsonOut == "-" {
		return fmt.Errorf("%s: --csv - and --json - both want stdout; give one of them a file", name)
	}
	var csvFile *os.File
	if f.csvOut != "" && f.csvOut != "-" {
		// Only rank 0 writes it; open it first, so a bad path fails
		// before a long run.
		env, err := launcher.Detect()
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		if env.Rank == 0 {
			if csvFile, err = os.Create(f.csvOut); err != nil {
				return fmt.Errorf("%s: --csv: %w", name, err)
			}
			defer csvFile.Close()
		}
	}
	return execute(cmd, name, f, stdout, stderr, func(o outputs, rec bench.Record) error {
		if f.csvOut == "-" {
			o = outputs{stderr, "stderr"}
		}
		var err error
		if werr := write(o.w, rec); werr != nil {
			err = fmt.Errorf("%s: %w", o.name, werr)
		}
		switch {
		case f.csvOut == "-":
			if werr := bench.WriteCSV(stdout, rec); werr != nil {
				err = errors.Join(err, fmt.Errorf("--csv - (stdout): %w", werr))
			}
		case csvFile != nil:
			if werr := errors.Join(bench.WriteCSV(csvFile, rec), csvFile.Close()); werr != nil {
				err = errors.Join(err, fmt.Errorf("--csv %s: %w", f.csvOut, werr))
			}
		}
		return err
	})
}

// configure loads the config, applies the flags and, under a launcher,
// sets the ranks to the number of processes.
func configure(cmd *cobra.Command, name string, f benchFlags, env launcher.Env) (bench.Config, *bench.Scaling, error) {
	cfg, err := loadConfig(f.config)
	if err != nil {
		return cfg, nil, fmt.Errorf("%s: %w", name, err)
	}
	f.apply(cmd, &cfg)
	if env.Kind != launcher.KindSingle {
		if cmd.Flags().Changed("ranks") && f.ranks != env.Size {
			return cfg, nil, fmt.Errorf("%s: --ranks %d, but %s started %d processes (under a launcher the ranks are the processes)", name, f.ranks, env.Kind, env.Size)
		}
		cfg.Ranks = env.Size
	}
	if err := cfg.Validate(); err != nil {
		return cfg, nil, fmt.Errorf("%s: config: %w", name, err)
	}
	if err := bench.CheckBackend(cfg.Backend); err != nil {
		return cfg, nil, fmt.Errorf("%s: %w", name, err)
	}
	if _, err := bench.HarnessTimeout(); err != nil {
		return cfg, nil, fmt.Errorf("%s: %w", name, err)
	}
	inProcess := cfg.Ranks // in-process ranks, else one rank per process
	if env.Kind != launcher.KindSingle {
		inProcess = 1
	}
	// Refused (or scaled down, with ScaleToFit) here, before anything is
	// printed; the warning of a run that probably fits comes from the run
	// (rank 0's).
	if f.forceMemory {
		return cfg, nil, nil
	}
	if !cfg.ScaleToFit {
		if _, err := cfg.CheckMemory(inProcess, name == "check"); err != nil {
			return cfg, nil, fmt.Errorf("%s: %w (--force-memory runs it anyway, --scale-to-fit runs it scaled down)", name, err)
		}
		return cfg, nil, nil
	}
	scaled, sc, err := cfg.ScaleDown(inProcess, name == "check", env.Kind != launcher.KindSingle)
	if err != nil {
		return cfg, nil, fmt.Errorf("%s: %w (--force-memory runs it anyway)", name, err)
	}
	return scaled, sc, nil
}

// execute runs the benchmark (bench) or the checks alone (check), in
// process or as one rank of a launched world, and writes the results on
// rank 0 with write; --json writes the record too. Under a launcher an
// error names this process's rank.
func execute(cmd *cobra.Command, name string, f benchFlags, stdout, stderr io.Writer, write func(outputs, bench.Record) error) (err error) {
	env, err := launcher.Detect()
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	if env.Kind != launcher.KindSingle {
		defer func() {
			if err != nil {
				err = rankError(env.Rank, err)
			}
		}()
	}
	cfg, scaled, err := configure(cmd, name, f, env)
	if err != nil {
		return err
	}
	if scaled != nil && env.Rank == 0 {
		// Said before the run, on stderr, and in the table and the record.
		fmt.Fprintf(stderr, "eprun: %s: %s\n", name, scaled)
	}
	rank0 := env.Rank == 0
	if !rank0 {
		stdout, f.quiet, f.jsonOut = io.Discard, true, ""
	} else if err := checkStdout(stdout); err != nil {
		return runError{fmt.Errorf("%s: %w", name, err)}
	}
	var jsonFile *os.File
	if f.jsonOut != "" && f.jsonOut != "-" {
		// Open it first: a bad path should fail before a long run.
		if jsonFile, err = os.Create(f.jsonOut); err != nil {
			return fmt.Errorf("%s: --json: %w", name, err)
		}
		defer jsonFile.Close()
	}

	log, err := newLogger(stderr)
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	defer log.Sync()
	if n, ok := shareCPUs(env); ok {
		log.Info("GOMAXPROCS set to this rank's share of the node's CPUs (set GOMAXPROCS to choose)",
			zap.Int("gomaxprocs", n), zap.Int("local_ranks", env.LocalSize))
	}
	ctx := cmd.Context()
	envRec := bench.CollectEnv(ctx)
	envRec.Args = os.Args
	var prog *progress
	if !f.quiet {
		prog = newProgress(stderr)
	}
	defer prog.finish()
	opt := bench.Options{Progress: prog.update, Logger: log, CheckOnly: name == "check", ForceMemory: f.forceMemory}
	var (
		res    *bench.Result
		runErr error
		group  = "local"
		launch = "in-process"
		procs  = 1
	)
	if env.Kind == launcher.KindSingle {
		b, err := openBackend(cfg, &envRec)
		if err != nil {
			return runError{fmt.Errorf("%s: %w", name, err)}
		}
		opt.Backend = engineBackend(b)
		res, runErr = bench.Run(ctx, cfg, opt)
		runErr = errors.Join(runErr, b.Close())
	} else {
		g, benv, err := launcher.Bootstrap(ctx, launcher.WithLogger(log), launcher.WithAbort(ctx))
		if err != nil {
			return runError{fmt.Errorf("%s: %w", name, err)}
		}
		if g.Size() != cfg.Ranks || g.Rank() != benv.Rank {
			g.Close()
			return runError{fmt.Errorf("%s: the group has rank %d of %d, the launcher said %v", name, g.Rank(), g.Size(), benv)}
		}
		group, launch, procs = bench.TransportOf(g), benv.Kind, g.Size()
		opt.Transport = group
		// After Bootstrap: it sets GOEP_DEVICE from the local rank.
		b, err := openBackend(cfg, &envRec)
		if err != nil {
			g.Close()
			return runError{fmt.Errorf("%s: %w", name, err)}
		}
		opt.Backend = engineBackend(b)
		res, runErr = bench.RunRank(ctx, cfg, g, opt)
		runErr = errors.Join(runErr, g.Close(), b.Close())
	}
	prog.finish()
	rec := bench.NewRecord(envRec, cfg, res, runErr)
	rec.Scaled = scaled
	rec.Launcher, rec.Processes, rec.Group = launch, procs, group
	if f.jsonOut != "" && rank0 {
		rec.Topology = topoJSON(cfg.Ranks)
	}

	// The rows measured are written before the run's error is returned,
	// and an output that cannot be written is an error naming it.
	out, outName := stdout, "stdout"
	if f.jsonOut == "-" {
		out, outName = stderr, "stderr"
	}
	var werr error
	if rank0 {
		werr = write(outputs{out, outName}, rec)
	}
	if f.jsonOut != "" {
		data, err := json.MarshalIndent(rec, "", "  ")
		switch {
		case err != nil:
			werr = errors.Join(werr, fmt.Errorf("--json: %w", err))
		case jsonFile != nil:
			_, err := jsonFile.Write(append(data, '\n'))
			if err = errors.Join(err, jsonFile.Close()); err != nil {
				werr = errors.Join(werr, fmt.Errorf("--json %s: %w", f.jsonOut, err))
			}
		default:
			if _, err := stdout.Write(append(data, '\n')); err != nil {
				werr = errors.Join(werr, fmt.Errorf("--json - (stdout): %w", err))
			}
		}
	}
	switch {
	case runErr != nil && werr != nil:
		return runError{fmt.Errorf("%s: %w; and writing the results: %w", name, runErr, werr)}
	case runErr != nil:
		return runError{fmt.Errorf("%s: %w", name, runErr)}
	case werr != nil:
		return runError{fmt.Errorf("%s: writing the results: %w", name, werr)}
	case rec.Wrong > 0:
		return runError{fmt.Errorf("%s: check failed: %d of %d output rows wrong", name, rec.Wrong, rec.CheckedRows)}
	}
	return nil
}

// outputs is where execute writes the results: w, named name in errors.
type outputs struct {
	w    io.Writer
	name string
}

// openBackend opens the config's backend for this process and records it
// in env: the backend's name and, on the GPU, its name, index and the
// driver version (from NVML, empty without it).
func openBackend(cfg bench.Config, env *bench.Env) (device.Backend, error) {
	b, err := bench.NewBackend(cfg.Backend)
	if err != nil {
		return nil, err
	}
	env.Backend = string(b.Kind())
	if b.Kind() == device.KindCUDA {
		env.GPU = bench.DeviceName(b)
		if ord, err := bench.DeviceOrdinal(); err == nil {
			env.GPUIndex = &ord
		}
		env.Driver = nvmlDriver()
	}
	return b, nil
}

// engineBackend is the backend bench runs the engines on: b on the GPU;
// none for the host backend, so that bench opens one for each case and
// rank and closes it after the case's engine (bench.Options.Backend): the
// memory its pool keeps does not outlive the case.
func engineBackend(b device.Backend) device.Backend {
	if b.Kind() == device.KindHost {
		return nil
	}
	return b
}

// rankError prefixes err with the rank, keeping runError (exit 1) as is.
func rankError(rank int, err error) error {
	var re runError
	if errors.As(err, &re) {
		return runError{fmt.Errorf("rank %d: %w", rank, re.err)}
	}
	return fmt.Errorf("rank %d: %w", rank, err)
}

// progress reports on stderr: a bar redrawn in place on a terminal, else a
// line whenever a new step (a call, a baseline, a case's setup) starts.
// While a step runs long (an iteration of a large case, a slow a2a
// baseline, the checks), it says so every heartbeat, so that a long run is
// never silent for more than that. Once an iteration has been timed, every
// line carries an estimate of the time the whole run has left (eta).
type progress struct {
	w     io.Writer
	tty   bool
	start time.Time

	mu      sync.Mutex
	ev      bench.Progress // the last event
	last    string         // the last step printed (not tty)
	printed time.Time      // when a line or the bar was last written
	stop    chan struct{}  // closed by finish; nil once finished
	done    chan struct{}  // closed when the heartbeat has stopped
}

// heartbeat is the longest progress stays silent during a run.
const heartbeat = 10 * time.Second

func newProgress(w io.Writer) *progress {
	t := time.NewTicker(time.Second)
	return newProgressEvery(w, t.C, t.Stop)
}

// newProgressEvery is newProgress with the ticks that wake the heartbeat
// (tests send their own); finish calls stopTicks.
func newProgressEvery(w io.Writer, ticks <-chan time.Time, stopTicks func()) *progress {
	p := &progress{w: w, start: time.Now(), stop: make(chan struct{}), done: make(chan struct{})}
	p.printed = p.start
	if f, ok := w.(*os.File); ok {
		if st, err := f.Stat(); err == nil && st.Mode()&os.ModeCharDevice != 0 && os.Getenv("TERM") != "dumb" {
			p.tty = true
		}
	}
	stop := p.stop // finish sets p.stop to nil
	go func() {
		defer close(p.done)
		defer stopTicks()
		for {
			select {
			case <-stop:
				return
			case now := <-ticks:
				p.beat(now)
			}
		}
	}()
	return p
}

// beat writes the current step again if nothing was written for a
// heartbeat.
func (p *progress) beat(now time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stop == nil || now.Sub(p.printed) < heartbeat {
		return
	}
	if p.ev.Cases == 0 {
		p.line(now, "starting")
		return
	}
	p.draw(now, fmt.Sprintf("still in %s, %d of %d iterations done", p.step(), p.ev.Done, p.ev.Total))
}

// step names the step running: "case 2/3 dispatch", after "rep 4/6 "
// when the sweep repeats.
func (p *progress) step() string {
	s := fmt.Sprintf("case %d/%d %s", p.ev.Case, p.ev.Cases, p.ev.Step)
	if p.ev.Reps > 1 {
		s = fmt.Sprintf("rep %d/%d %s", p.ev.Rep, p.ev.Reps, s)
	}
	return s
}

// eta is ", eta 1m20s", the time the run has left: the time spent so far
// scaled by the share of the run's work left to what is done
// (bench.Progress.Work weighs each iteration by its case's size, so that
// the large cases of a sweep count as the longer ones they are); "" until
// an iteration is done. Setup and checks are not counted as work, and the
// spent time includes them: the estimate is rough in the first case.
func (p *progress) eta(now time.Time) string {
	ev := p.ev
	if ev.Work <= 0 || ev.TotalWork <= 0 {
		return ""
	}
	left := time.Duration(float64(now.Sub(p.start)) * max(ev.TotalWork-ev.Work, 0) / ev.Work)
	return ", eta " + shortDuration(left)
}

// shortDuration is d as "45s", "4m05s" or "2h10m".
func shortDuration(d time.Duration) string {
	if d = d.Round(time.Second); d < time.Minute {
		return fmt.Sprintf("%ds", d/time.Second)
	}
	if d < time.Hour {
		return fmt.Sprintf("%dm%02ds", d/time.Minute, d%time.Minute/time.Second)
	}
	d = d.Round(time.Minute)
	return fmt.Sprintf("%dh%02dm", d/time.Hour, d%time.Hour/time.Minute)
}

// line writes one line (not tty) or redraws the bar with what.
func (p *progress) line(now time.Time, what string) {
	p.printed = now
	if p.tty {
		const width = 30
		fill := width * p.ev.Done / max(p.ev.Total, 1)
		bar := strings.Repeat("=", fill) + strings.Repeat(" ", width-fill)
		fmt.Fprintf(p.w, "\r\x1b[Keprun: [%s] %3d%% %-28s %5.1fs%s", bar, 100*p.ev.Done/max(p.ev.Total, 1), what, now.Sub(p.start).Seconds(), p.eta(now))
		return
	}
	fmt.Fprintf(p.w, "eprun: %s (%.1fs%s)\n", what, now.Sub(p.start).Seconds(), p.eta(now))
}

// draw is line for the heartbeat: a line, or the bar with the step.
func (p *progress) draw(now time.Time, what string) {
	if p.tty {
		what = p.step()
	}
	p.line(now, what)
}

func (p *progress) update(ev bench.Progress) {
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stop == nil {
		return
	}
	p.ev = ev
	now := time.Now()
	step := p.step()
	if !p.tty {
		if step != p.last {
			p.last = step
			p.line(now, step)
		}
		return
	}
	if ev.Done < ev.Total && now.Sub(p.printed) < 50*time.Millisecond {
		return
	}
	p.line(now, step)
}

// finish stops the heartbeat and clears the bar; it may be called again.
func (p *progress) finish() {
	if p == nil {
		return
	}
	p.mu.Lock()
	stop := p.stop
	p.stop = nil
	if stop != nil && p.tty {
		fmt.Fprint(p.w, "\r\x1b[K")
	}
	p.mu.Unlock()
	if stop != nil {
		close(stop)
		<-p.done
	}
}
