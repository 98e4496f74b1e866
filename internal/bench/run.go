package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"runtime/debug"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"

	"github.com/goep/goep/comm"
	"github.com/goep/goep/device"
	"github.com/goep/goep/executor"
)

// Timing definitions: how Row.Time is taken from the ranks' clocks.
const (
	// TimingSpan: from the first rank entering the call to the last
	// leaving it, on the one clock in-process ranks share.
	TimingSpan = "span"
	// TimingRankMax: the maximum over ranks of each rank's own time after
	// a barrier (processes have no shared clock).
	TimingRankMax = "rank_max"
	// TimingEventMax: the maximum over ranks of each rank's GPU time
	// between CUDA events recorded on its stream before and after the call
	// (after a barrier): the cuda backend, in process or not.
	TimingEventMax = "event_max"
)

// Row is the result of one call in one case.
type Row struct {
	Call    string `json:"call"`
	Ranks   int    `json:"ranks"`
	Experts int    `json:"experts"`
	Tokens  int    `json:"tokens"`
	Hidden  int    `json:"hidden"`
	TopK    int    `json:"topk"`
	// DType is the dtype of the rows the call moved: the case's, except
	// that the calls that combine of an fp8 case run in bf16
	// (Case.CallDType); CaseDType is the case's (the config's dtype), empty
	// in records written before the field (then DType; CaseDTypeName).
	// RowBytes is the bytes of one of those rows (RowBytes): hidden x the
	// dtype's size, plus hidden/128 fp32 scales (4 bytes each) for fp8;
	// 0 in records written before the field.
	DType     string `json:"dtype"`
	CaseDType string `json:"case_dtype"`
	RowBytes  int    `json:"row_bytes"`
	Mode      string `json:"mode"`
	Pad       int    `json:"pad"`
	// SMs and ChunkRows are the case's tuning knobs (0: the engine's
	// default), as the engine's Config gave them back after New.
	SMs       int `json:"sms"`
	ChunkRows int `json:"chunk_rows"`
	// RanksPerDomain is the D the engine ran with: the config's, else
	// GOEP_RANKS_PER_DOMAIN, else what New detected (one domain per host).
	// 0 in records written before the field.
	RanksPerDomain int `json:"ranks_per_domain"`
	// Rep is the repetition of the sweep that measured the row, 1 to
	// Config.Count; 0 in records written before the field.
	Rep int `json:"rep"`

	// Time is over the timed iterations, each taken as Result.Timing says:
	// in-process, from the first rank entering the call to the last
	// leaving Synchronize (Timing.Spans); across processes, the maximum
	// over ranks of each rank's own time (Timing.RankMax); on the cuda
	// backend, the maximum over ranks of each rank's time between CUDA
	// events around the call. IterUS lists them. RankMaxTime is always
	// over the per-rank maximum.
	Time        Stats     `json:"time"`
	IterUS      []float64 `json:"iter_us"`
	RankMaxTime Stats     `json:"rank_max_time"`

	// RecvRows is N_r of every rank; NVLBytes the mean over ranks of
	// N_r * RowBytes, an fp8 row's scales included (twice that for
	// dispatch-combine, which moves the rows there and back); NVLGBps =
	// NVLBytes / median time.
	RecvRows []int   `json:"recv_rows"`
	NVLBytes float64 `json:"nvl_bytes_per_rank"`
	NVLGBps  float64 `json:"nvl_GBps"`
	// NVLPeerBytes counts only the rows a rank reads from another GPU
	// (World.PeerRows: not its own tokens', nor, with several domains,
	// those it forwards itself), as NVLBytes does (mean over ranks, x row
	// bytes, twice for dispatch-combine); NVLPeerGBps = NVLPeerBytes /
	// median time. With R ranks in one domain about (R-1)/R of NVLBytes:
	// what a peer copy's bandwidth bounds, where NVLBytes, as DESIGN.md
	// counts it, also holds the rows a rank copies within its own GPU.
	NVLPeerBytes float64 `json:"nvl_peer_bytes_per_rank"`
	NVLPeerGBps  float64 `json:"nvl_peer_GBps"`
	// RDMABytes is the mean over ranks of the RDMA bytes as DESIGN.md
	// section 6 counts them (World.RDMARows: each token once per
	// destination domain, its own included) x RowBytes, twice for
	// dispatch-combine; RDMAGBps = RDMABytes / median time.
	// RDMACrossBytes counts only the rows that really cross domains
	// (World.CrossDomainRows: each token once per destination domain
	// other than its own), and RDMAFlatBytes what a flat scheme sending
	// every token to every destination rank would send across domains
	// (World.FlatRemoteRows), both as RDMABytes (mean over ranks, x row
	// bytes, twice for dispatch-combine). All four are set only when
	// there are several domains (and omitted when zero).
	RDMABytes      float64 `json:"rdma_bytes_per_rank,omitempty"`
	RDMAGBps       float64 `json:"rdma_GBps,omitempty"`
	RDMACrossBytes float64 `json:"rdma_cross_bytes_per_rank,omitempty"`
	RDMAFlatBytes  float64 `json:"rdma_flat_bytes_per_rank,omitempty"`

	// Baseline is a plain copy of each rank's N_r rows of RowBytes (the
	// row's dtype: an fp8 case has one of its fp8 rows with their scales
	// and one of bf16 rows for its calls that combine) by all ranks at
	// once, timed the same way (on the cuda backend a device-to-device
	// copy on the engine's stream); Ratio = NVLGBps / BaselineGBps.
	Baseline     Stats   `json:"baseline_time"`
	BaselineGBps float64 `json:"baseline_GBps"`
	Ratio        float64 `json:"ratio"`

	// A2A is the same call done the way a user without goep would: an
	// all-to-all of the token rows through the group (MPI_Alltoallv under
	// MPI, the TCP exchange under eprun launch, comm.NewLocal's in
	// process; Result.A2ATransport says which) plus a local permute or
	// sum, timed the same way. A2AGBps counts the call's bytes (NVLBytes);
	// A2ASpeedup = A2A median / Time median (> 1: goep is faster).
	// A2ACheckedRows and A2AWrong count its output rows checked as the
	// call's are. Absent when the baseline did not run (eprun check, and
	// the cuda backend: it is a host all-to-all).
	A2A            *Stats  `json:"baseline_a2a_time,omitempty"`
	A2AGBps        float64 `json:"baseline_a2a_GBps,omitempty"`
	A2ASpeedup     float64 `json:"speedup_vs_a2a,omitempty"`
	A2ACheckedRows int     `json:"baseline_a2a_checked_rows,omitempty"`
	A2AWrong       int     `json:"baseline_a2a_wrong"`

	// CheckedRows and Wrong count the output rows compared with the
	// expectation, over all ranks, and those that differed.
	CheckedRows int `json:"checked_rows"`
	Wrong       int `json:"wrong"`
}

// CaseDTypeName is the dtype of the row's case: CaseDType, or DType in a
// record written before CaseDType (when they were always equal).
func (r *Row) CaseDTypeName() string {
	if r.CaseDType != "" {
		return r.CaseDType
	}
	return r.DType
}

// Result is a whole run.
type Result struct {
	Config Config `json:"config"`
	Rows   []Row  `json:"rows"`
	// Timing is TimingSpan, TimingRankMax or TimingEventMax.
	Timing string `json:"timing"`
	// A2ATransport is what carried the a2a baseline's exchange: "mpi",
	// "tcp" or "local" (empty when it did not run).
	A2ATransport string `json:"baseline_a2a_transport,omitempty"`
}

// Wrong is the number of wrong rows over all rows, the a2a baseline's
// included.
func (r *Result) Wrong() int {
	n := 0
	for _, row := range r.Rows {
		n += row.Wrong + row.A2AWrong
	}
	return n
}

// Checked is the number of rows checked over all rows, the a2a baseline's
// included.
func (r *Result) Checked() int {
	n := 0
	for _, row := range r.Rows {
		n += row.CheckedRows + row.A2ACheckedRows
	}
	return n
}

// Progress is reported by rank 0 as it begins each step of a case and
// after every iteration.
type Progress struct {
	Case, Cases int // 1-based case number, number of cases of one repetition
	Rep, Reps   int // 1-based repetition, Config.Count
	Step        string
	Done, Total int // iterations done and total, over the whole run
	// Work and TotalWork are Done and Total with every iteration weighted
	// by its case's cost (caseWork), so that the share of the run left,
	// 1 - Work/TotalWork, counts a large case's iterations as the longer
	// ones they are; what an estimate of the time left scales the time
	// spent by.
	Work, TotalWork float64
}

// Options tunes Run and RunRank.
type Options struct {
	// Progress, when set, is called from rank 0 (RunRank calls it only on
	// rank 0).
	Progress func(Progress)
	// Logger is passed to every engine (nil: no logging).
	Logger *zap.Logger
	// CheckOnly runs the calls and their checks only: no copy baseline, no
	// a2a baseline (eprun check).
	CheckOnly bool
	// Backend is the backend the engines use, of the config's kind; nil:
	// Run or RunRank opens one with NewBackend(cfg.Backend) and closes it
	// at the end, except the host backend, which each rank opens for each
	// case and closes once the case's engine and copy baseline are done:
	// the regions its pool keeps for reuse then go back to the system
	// before the a2a baseline and the next case run.
	Backend device.Backend
	// Transport names what carries the group's AllToAll in the record;
	// empty: guessed from the group's type.
	Transport string
	// ForceMemory runs a run that CheckMemory refuses (its error is then
	// logged as a warning): eprun's --force-memory.
	ForceMemory bool

	// testHook, when a test sets it, runs on every rank as the rank begins
	// each step of a case (the steps of Progress, and "setup"); an error
	// fails the rank there. A hook that blocks is a rank that stops.
	testHook func(ctx context.Context, rank int, step string) error

	// sharedClock: the ranks are goroutines of one process (Run), so an
	// iteration is timed as the span over ranks.
	sharedClock bool
}

// Steps is the number of progress steps of a run of cfg: iterations, the
// warm-up's included, of every call and baseline of every case, Count
// times.
func (o Options) Steps(cfg Config) int {
	n := 0
	for _, c := range cfg.Cases() {
		n += o.caseSteps(cfg, c)
	}
	return n * max(cfg.Count, 1)
}

// caseSteps is the number of progress steps of case c.
func (o Options) caseSteps(cfg Config, c Case) int {
	per := len(cfg.Calls)
	if !o.CheckOnly {
		per += len(c.callDTypes(cfg.Calls)) // the copy baselines
		if runsA2A(cfg) {
			per += len(cfg.Calls)
		}
	}
	return per * (cfg.Warmup + cfg.Iters)
}

// caseWork is the weight of one iteration of case c in Progress.Work: the
// bytes of the rows a rank sends (tokens x topk rows of the case's dtype),
// plus iterOverheadBytes for what every iteration costs whatever its size
// (barriers, synchronisation, waking the ranks). Only the ratios between
// cases matter; a sweep over tokens 256, 512, 1024 weighs them about
// 1:2:4, as their times are.
func caseWork(c Case) float64 {
	return float64(c.Tokens)*float64(c.TopK)*float64(RowBytes(c.DType, c.Hidden)) + iterOverheadBytes
}

// iterOverheadBytes is an iteration's fixed cost as bytes moved: about
// 100 µs of a host iteration at a few GB/s.
const iterOverheadBytes = 256 << 10

// backend returns o.Backend or, without one, a backend opened with
// NewBackend(cfg.Backend); close closes only the one it opened.
func (o Options) backend(cfg Config) (b device.Backend, close func() error, err error) {
	if o.Backend != nil || o.caseBackends(cfg) {
		return o.Backend, func() error { return nil }, nil
	}
	if b, err = NewBackend(cfg.Backend); err != nil {
		return nil, nil, err
	}
	return b, b.Close, nil
}

// caseBackends reports whether each rank opens a backend of its own for
// each case (see Options.Backend); backend then returns none.
func (o Options) caseBackends(cfg Config) bool {
	return o.Backend == nil && backendKind(cfg) == device.KindHost
}

// runsA2A reports whether a (non-check) run of cfg has the a2a baseline:
// not on the cuda backend, whose data the host all-to-all cannot read.
func runsA2A(cfg Config) bool { return cfg.Backend != BackendCUDA }

// backendKind is the device kind of cfg.Backend.
func backendKind(cfg Config) device.Kind {
	if cfg.Backend == BackendCUDA {
		return device.KindCUDA
	}
	return device.KindHost
}

// Run runs every case of cfg with cfg.Ranks in-process ranks (goroutines,
// comm.NewLocal groups, one shared backend: the host, or with backend cuda
// one *device.CUDA of GPU GOEP_DEVICE, default 0), each running RunRank
// exactly as one process of a multi-process world does. It returns rank
// 0's rows of the cases that completed and the first error.
func Run(ctx context.Context, cfg Config, opt Options) (*Result, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if _, err := HarnessTimeout(); err != nil {
		return nil, err
	}
	if err := opt.checkMemory(cfg, cfg.Ranks); err != nil {
		return nil, err
	}
	r := cfg.Ranks
	backend, closeBackend, err := opt.backend(cfg)
	if err != nil {
		return nil, err
	}
	groups := comm.NewLocal(r)
	results := make([]*Result, r)
	errs := make([]error, r)
	g, gctx := errgroup.WithContext(ctx)
	for rank := range r {
		g.Go(func() error {
			o := opt
			o.Backend, o.sharedClock = backend, true
			if o.Transport == "" {
				o.Transport = "local"
			}
			res, err := RunRank(gctx, cfg, groups[rank], o)
			results[rank] = res
			if err != nil {
				errs[rank] = fmt.Errorf("rank %d: %w", rank, err)
			}
			return errs[rank]
		})
	}
	err = causeOf(ctx, g.Wait(), errs)
	for rank := range r {
		err = errors.Join(err, groups[rank].Close())
	}
	return results[0], errors.Join(err, closeBackend())
}

// causeOf is the error to report for a run whose ranks failed with errs,
// first being the one errgroup saw first. A rank that fails on its own
// closes the harness group, and the first failure cancels the others'
// context: its peers may return "a peer closed the group" or "context
// canceled" before it returns its own error. So the cause is first when
// it is neither of those, else the first rank's error that is neither,
// else first (the caller's own cancellation, say).
func causeOf(ctx context.Context, first error, errs []error) error {
	consequence := func(err error) bool {
		return errors.Is(err, comm.ErrClosed) || (errors.Is(err, context.Canceled) && ctx.Err() == nil)
	}
	if first == nil || !consequence(first) {
		return first
	}
	for _, err := range errs {
		if err != nil && !consequence(err) {
			return err
		}
	}
	return first
}

// HarnessTimeout bounds each of the harness's own collectives (its
// barriers and gathers between iterations and cases, the config
// comparison, and the a2a baseline's exchanges): GOEP_TIMEOUT (as the
// engine reads it, executor.TimeoutFromEnv: default 60 s) plus
// HarnessMargin. A rank that stops makes the others fail within it, with
// a *comm.TimeoutError naming that rank; the margin lets the engine's own
// waits, bounded by GOEP_TIMEOUT alone, report a stop inside a call first.
// Between two collectives each rank checks its outputs, so a rank whose
// checks take GOEP_TIMEOUT longer than another's makes that one time out:
// raise GOEP_TIMEOUT for cases whose checks take minutes. An invalid
// GOEP_TIMEOUT is an error.
func HarnessTimeout() (time.Duration, error) {
	t, err := executor.TimeoutFromEnv()
	if err != nil {
		return 0, fmt.Errorf("bench: %w", err)
	}
	m := HarnessMargin(t)
	if t > math.MaxInt64-m {
		return math.MaxInt64, nil
	}
	return t + m, nil
}

// HarnessMargin is the margin HarnessTimeout adds to a GOEP_TIMEOUT of t:
// a tenth of it, at least one second.
func HarnessMargin(t time.Duration) time.Duration { return max(time.Second, t/10) }

// sameConfig all-gathers every rank's config over g and fails on every
// rank when one differs, naming the rank and the fields.
func sameConfig(ctx context.Context, g comm.Group, cfg Config) error {
	mine, err := json.Marshal(cfg)
	if err != nil {
		return err
	}
	all, err := g.AllGather(ctx, mine)
	if err != nil {
		return fmt.Errorf("compare the ranks' configs: %w", err)
	}
	for r, other := range all {
		if !bytes.Equal(other, mine) {
			return fmt.Errorf("rank %d runs another config than rank %d: %s", r, g.Rank(), configDiff(mine, other))
		}
	}
	return nil
}

// bounded is a group whose collectives each end after d at most (the
// harness's group: an in-process or MPI group waits on its context alone);
// a timeout's error says what bounded it.
type bounded struct {
	comm.Group
	d time.Duration
}

// newBounded bounds g's collectives by HarnessTimeout.
func newBounded(g comm.Group) (bounded, error) {
	d, err := HarnessTimeout()
	return bounded{g, d}, err
}

// bound runs f under the deadline, and names the bound in a timeout.
func (b bounded) bound(ctx context.Context, f func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, b.d)
	defer cancel()
	err := f(ctx)
	if errors.Is(err, comm.ErrTimeout) || errors.Is(err, context.DeadlineExceeded) {
		env, _ := executor.TimeoutFromEnv()
		return &harnessTimeoutError{err, fmt.Sprintf("eprun's harness waits GOEP_TIMEOUT %v plus %v", env, HarnessMargin(env))}
	}
	return err
}

// harnessTimeoutError is a timeout of one of the harness's own
// collectives, saying what bounded it.
type harnessTimeoutError struct {
	err   error
	bound string
}

func (e *harnessTimeoutError) Error() string { return fmt.Sprintf("%v (%s)", e.err, e.bound) }
func (e *harnessTimeoutError) Unwrap() error { return e.err }

// engineGroup is the group an engine of the harness runs on: the rank's
// group, until abandon, after which every collective fails at once. A rank
// abandons it when one of the harness's collectives timed out, before it
// closes the engine: the engine's Close would otherwise wait up to
// min(GOEP_TIMEOUT, 10 s) more for the rank that did not come. That wait
// is for peers still in an exchange with this rank, or storing into its
// windows; there are none: the harness's collectives come only after a
// rank has synchronised its engine's calls, and a rank that has not come to
// one has not begun the next call. The engine never closes the group (its
// owner does), so Close does nothing.
type engineGroup struct {
	comm.Group
	cause atomic.Pointer[error]
}

func (g *engineGroup) abandon(cause error) { g.cause.CompareAndSwap(nil, &cause) }

func (g *engineGroup) abandoned(op string) error {
	if c := g.cause.Load(); c != nil {
		return fmt.Errorf("comm: %s on rank %d: the harness gave up on this run: %w", op, g.Rank(), *c)
	}
	return nil
}

func (g *engineGroup) AllGather(ctx context.Context, data []byte) ([][]byte, error) {
	if err := g.abandoned("allgather"); err != nil {
		return nil, err
	}
	return g.Group.AllGather(ctx, data)
}

func (g *engineGroup) AllToAll(ctx context.Context, send [][]byte) ([][]byte, error) {
	if err := g.abandoned("alltoall"); err != nil {
		return nil, err
	}
	return g.Group.AllToAll(ctx, send)
}

func (g *engineGroup) Broadcast(ctx context.Context, root int, data []byte) ([]byte, error) {
	if err := g.abandoned("broadcast"); err != nil {
		return nil, err
	}
	return g.Group.Broadcast(ctx, root, data)
}

func (g *engineGroup) Barrier(ctx context.Context) error {
	if err := g.abandoned("barrier"); err != nil {
		return err
	}
	return g.Group.Barrier(ctx)
}

func (g *engineGroup) Split(ctx context.Context, color, key int) (comm.Group, error) {
	if err := g.abandoned("split"); err != nil {
		return nil, err
	}
	return g.Group.Split(ctx, color, key)
}

func (g *engineGroup) Close() error { return nil }

func (b bounded) AllGather(ctx context.Context, data []byte) (all [][]byte, err error) {
	err = b.bound(ctx, func(ctx context.Context) (err error) {
		all, err = b.Group.AllGather(ctx, data)
		return err
	})
	return all, err
}

func (b bounded) AllToAll(ctx context.Context, send [][]byte) (recv [][]byte, err error) {
	err = b.bound(ctx, func(ctx context.Context) (err error) {
		recv, err = b.Group.AllToAll(ctx, send)
		return err
	})
	return recv, err
}

// AllToAllv is comm.AllToAllv on the group itself (its own all-to-all
// over the caller's buffers, MPI_Ialltoallv under MPI), bounded.
func (b bounded) AllToAllv(ctx context.Context, send []byte, sendCounts []int, recv []byte, recvCounts []int) error {
	return b.bound(ctx, func(ctx context.Context) error {
		return comm.AllToAllv(ctx, b.Group, send, sendCounts, recv, recvCounts)
	})
}

func (b bounded) Broadcast(ctx context.Context, root int, data []byte) (out []byte, err error) {
	err = b.bound(ctx, func(ctx context.Context) (err error) {
		out, err = b.Group.Broadcast(ctx, root, data)
		return err
	})
	return out, err
}

func (b bounded) Barrier(ctx context.Context) error {
	return b.bound(ctx, b.Group.Barrier)
}

func (b bounded) Split(ctx context.Context, color, key int) (comm.Group, error) {
	var g comm.Group
	err := b.bound(ctx, func(ctx context.Context) (err error) {
		g, err = b.Group.Split(ctx, color, key)
		return err
	})
	if err != nil {
		return nil, err
	}
	return bounded{g, b.d}, nil
}

// configDiff names the top-level fields of two JSON configs that differ,
// with both values.
func configDiff(a, b []byte) string {
	var ma, mb map[string]any
	if json.Unmarshal(a, &ma) != nil || json.Unmarshal(b, &mb) != nil {
		return "(unreadable)"
	}
	var keys []string
	for k := range ma {
		keys = append(keys, k)
	}
	for k := range mb {
		if _, ok := ma[k]; !ok {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	var diffs []string
	for _, k := range keys {
		if va, vb := fmt.Sprint(ma[k]), fmt.Sprint(mb[k]); va != vb {
			diffs = append(diffs, fmt.Sprintf("%s %s here, %s there", k, va, vb))
		}
	}
	return strings.Join(diffs, "; ")
}

// RunRank runs every case of cfg as rank g.Rank() of g: one engine on this
// rank, created on g; the harness's barriers and gathers go through a
// second group split from g, so they never interleave with the engine's
// traffic. cfg.Ranks must equal g.Size(). Every rank returns the same
// aggregated rows (times over all ranks, checks summed over ranks); the
// caller prints rank 0's. On error it returns the cases that completed.
func RunRank(ctx context.Context, cfg Config, g comm.Group, opt Options) (_ *Result, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Ranks != g.Size() {
		return nil, fmt.Errorf("config has %d ranks, the group %d", cfg.Ranks, g.Size())
	}
	hg, err := newBounded(g)
	if err != nil {
		return nil, err
	}
	if !opt.sharedClock { // Run has checked the memory of all its ranks
		o := opt
		if g.Rank() != 0 {
			o.Logger = nil // one warning, rank 0's
		}
		if err := o.checkMemory(cfg, 1); err != nil {
			return nil, err
		}
	}
	if opt.Backend != nil && opt.Backend.Kind() != backendKind(cfg) {
		return nil, fmt.Errorf("the config's backend is %s, Options.Backend is %s", backendKind(cfg), opt.Backend.Kind())
	}
	// The ranks compare their configs before anything collective: ranks
	// launched with different flags would otherwise wait for each other in
	// different cases (under mpirun, for ever). A rank that refused its
	// own config above has returned; its launcher stops the others, and
	// else their comparison ends after HarnessTimeout, naming it.
	if err := sameConfig(ctx, hg, cfg); err != nil {
		return nil, err
	}
	rank := g.Rank()
	res := &Result{Config: cfg, Timing: TimingRankMax}
	switch {
	case backendKind(cfg) == device.KindCUDA:
		res.Timing = TimingEventMax
	case opt.sharedClock:
		res.Timing = TimingSpan
	}
	if !opt.CheckOnly && runsA2A(cfg) {
		res.A2ATransport = opt.Transport
		if res.A2ATransport == "" {
			res.A2ATransport = TransportOf(g)
		}
	}
	ctl, err := hg.Split(ctx, 0, rank)
	if err != nil {
		return res, fmt.Errorf("harness group: %w", err)
	}
	// Closed, the harness group makes the ranks waiting in one of its
	// collectives fail at once: what a rank that fails on its own wants.
	// After a timeout it stays open (the caller's Close of g ends it), so
	// that the other ranks, waiting for the same stopped rank, time out
	// and name it themselves instead of blaming this rank's Close.
	defer func() {
		if !errors.Is(err, comm.ErrTimeout) {
			ctl.Close()
		}
	}()
	backend, closeBackend, err := opt.backend(cfg)
	if err != nil {
		return res, err
	}
	defer closeBackend()
	log := opt.Logger
	if log == nil {
		log = zap.NewNop()
	}
	cases := cfg.Cases()
	reps := max(cfg.Count, 1)
	steps, done := opt.Steps(cfg), 0
	var work, totalWork float64
	for _, c := range cases {
		totalWork += float64(opt.caseSteps(cfg, c)) * caseWork(c)
	}
	totalWork *= float64(reps)
	// The whole sweep, Count times: each repetition runs every case on
	// engines of its own, as the first did, so that its rows are samples
	// of the same measurement.
	for rep := 1; rep <= reps; rep++ {
		for i, c := range cases {
			rs, err := newRankState(cfg, c, rank)
			if err != nil {
				return res, err
			}
			rs.g, rs.a2a, rs.ctl, rs.backend, rs.log, rs.checkOnly = g, bounded{g, hg.d}, ctl, backend, log, opt.CheckOnly
			rs.closeBackend = func() error { return nil }
			rs.tidies = !opt.sharedClock || rank == 0
			if opt.caseBackends(cfg) {
				b, err := NewBackend(cfg.Backend)
				if err != nil {
					return res, err
				}
				rs.backend, rs.closeBackend = b, b.Close
			}
			report := func(step string) {
				if rank == 0 && opt.Progress != nil {
					opt.Progress(Progress{Case: i + 1, Cases: len(cases), Rep: rep, Reps: reps, Step: step,
						Done: done, Total: steps, Work: work, TotalWork: totalWork})
				}
			}
			w := caseWork(c)
			rs.progress = func(step string) {
				done++
				work += w
				report(step)
			}
			rs.begin = func(ctx context.Context, step string) error {
				if step != "gather" { // quick, and a line per case less
					report(step)
				}
				if opt.testHook != nil {
					return opt.testHook(ctx, rank, step)
				}
				return nil
			}
			// The rows of a case whose a2a baseline failed come back with
			// the error: they are measured and checked.
			rows, err := rs.run(ctx, res.Timing)
			for j := range rows {
				rows[j].Rep = rep
			}
			res.Rows = append(res.Rows, rows...)
			if err != nil {
				which := ""
				if reps > 1 {
					which = fmt.Sprintf(" rep=%d/%d", rep, reps)
				}
				return res, fmt.Errorf("mode=%s topk=%d tokens=%d hidden=%d dtype=%v%s%s: %w", c.Mode, c.TopK, c.Tokens, c.Hidden, c.DType, c.knobs(), which, err)
			}
		}
	}
	return res, nil
}

// TransportOf names the transport of a comm group from its type: "mpi",
// "tcp", "local", else the type's name.
func TransportOf(g comm.Group) string {
	t := fmt.Sprintf("%T", g)
	l := strings.ToLower(t)
	for _, k := range []string{"mpi", "tcp", "local"} {
		if strings.Contains(l, k) {
			return k
		}
	}
	return t
}

// epoch is this process's time origin; in-process ranks share it, so their
// times can be compared (spans).
var epoch = time.Now()

// series is one rank's start and end of every timed iteration of one
// call, in nanoseconds since epoch.
type series struct {
	Start []int64 `json:"s"`
	End   []int64 `json:"e"`
}

// rankState is one rank's view of one case, with its own engine (made by
// rankMain from ecfg: the case's top-k, mode and capacities). Nothing in
// it is shared with other ranks; the per-rank results are gathered
// through ctl at the end.
type rankState struct {
	cfg   Config
	c     Case
	rank  int
	world *World // the case's routing and payload
	// cworld is the world of the calls that combine: world, or for an fp8
	// case the same routing with a bf16 payload (Case.CallDType).
	cworld *World
	ecfg   executor.Config
	ran    executor.Config // the engine's, after New (set by rankMain)

	g, ctl  comm.Group // the engine's, the harness's
	a2a     comm.Group // g, its collectives bounded as the harness's (the a2a baseline's)
	backend device.Backend
	tidies  bool // this rank tidies the process's heap (tidy)
	// closeBackend closes backend when it is the case's own
	// (Options.caseBackends), once the engine is closed.
	closeBackend func() error
	checkOnly    bool
	clock        clock // of the engine's stream, set by rankMain

	times     map[string]*series // call, "baseline", or "a2a/"+call
	checks    map[string]*Check  // call
	a2aChecks map[string]*Check  // call
	recvRows  int
	progress  func(step string) // after each iteration (rank 0 reports it)
	// begin is called as the rank begins a step (rank 0 reports it); an
	// error (Options.testHook's) fails the rank there.
	begin func(ctx context.Context, step string) error
	log   *zap.Logger
}

// rankReport is what each rank contributes to the rows of a case.
type rankReport struct {
	RecvRows  int                `json:"recv_rows"`
	Times     map[string]*series `json:"times"`
	Checks    map[string]*Check  `json:"checks"`
	A2AChecks map[string]*Check  `json:"a2a_checks"`
}

// engineConfig is the engine config of case c: its buffers sized for the
// sweep's largest tokens, capacity mode's capacities those of the case.
func (cfg Config) engineConfig(c Case) executor.Config {
	ecfg := executor.Config{
		NumExperts:       cfg.Experts,
		TopK:             c.TopK,
		Hidden:           c.Hidden,
		MaxTokensPerRank: slices.Max(cfg.Tokens),
		RanksPerDomain:   cfg.RanksPerDomain,
		PadMultiple:      cfg.Pad,
		SMs:              c.SMs,
		ChunkRows:        c.ChunkRows,
		// The widest rows the case's calls move: bf16 and fp8 cases
		// (whose combines run in bf16) need windows of bf16 rows only.
		RowDType: device.BF16,
	}
	if c.DType == device.FP32 {
		ecfg.RowDType = device.FP32
	}
	if c.Mode == ModeCapacity {
		ecfg.Mode = executor.Capacity
		ecfg.MaxRecvTokens, ecfg.MaxPermutedTokens = cfg.capacities(c)
	}
	return ecfg
}

func newRankState(cfg Config, c Case, rank int) (*rankState, error) {
	d, err := cfg.domainSize()
	if err != nil {
		return nil, err
	}
	r := cfg.Ranks
	tokens := make([]int, r)
	for i := range tokens {
		tokens[i] = c.Tokens
	}
	ecfg := cfg.engineConfig(c)
	rs := &rankState{
		cfg:       cfg,
		c:         c,
		rank:      rank,
		world:     NewRoutedWorld(cfg.RoutingSpec(), cfg.Seed, r, d, cfg.Experts, c.TopK, c.Hidden, c.DType, tokens),
		ecfg:      ecfg,
		times:     map[string]*series{},
		checks:    map[string]*Check{},
		a2aChecks: map[string]*Check{},
	}
	rs.cworld = rs.world
	if dt := c.CallDType(CallCombine); dt != c.DType {
		rs.cworld = rs.world.WithDType(dt)
	}
	for _, call := range cfg.Calls {
		rs.checks[call] = &Check{}
	}
	return rs, nil
}

// record stores iteration i of a timed series.
func (rs *rankState) record(name string, i int, t0, t1 time.Time) {
	s := rs.times[name]
	if s == nil {
		s = &series{Start: make([]int64, rs.cfg.Iters), End: make([]int64, rs.cfg.Iters)}
		rs.times[name] = s
	}
	s.Start[i] = t0.Sub(epoch).Nanoseconds()
	s.End[i] = t1.Sub(epoch).Nanoseconds()
}

// run runs this rank's part of the case, then gathers every rank's report
// and turns them into rows; the a2a baseline runs last, and its times are
// gathered apart, so that a baseline that fails leaves the calls' rows
// (returned with the error, without their a2a columns).
func (rs *rankState) run(ctx context.Context, timing string) ([]Row, error) {
	err := rs.rankMain(ctx)
	if cerr := rs.closeBackend(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, err
	}
	reps, err := rs.gather(ctx)
	if err != nil {
		return nil, fmt.Errorf("gather results: %w", err)
	}
	rows, err := rs.rows(reps, timing)
	if err != nil {
		return nil, err
	}
	rs.tidy()
	// The a2a baseline runs after rankMain has closed the engine and its
	// outputs, so the two never hold their rows at once (host memory).
	if rs.checkOnly || !runsA2A(rs.cfg) {
		return rows, nil
	}
	rs.times, rs.checks = map[string]*series{}, nil // the calls' are gathered
	if err := rs.runA2A(ctx); err != nil {
		return rows, fmt.Errorf("a2a baseline: %w", err)
	}
	if reps, err = rs.gather(ctx); err != nil {
		return rows, fmt.Errorf("a2a baseline: gather results: %w", err)
	}
	if err := rs.addA2A(rows, reps, timing); err != nil {
		return rows, fmt.Errorf("a2a baseline: %w", err)
	}
	rs.tidy()
	return rows, nil
}

// tidy gives the Go heap's free memory back to the system
// (debug.FreeOSMemory) between the parts of a case, outside every timed
// loop: what the checks and the setup of one part dropped would otherwise
// stay resident under the next part's buffers. One rank of a process does
// it (rank 0 of in-process ranks, which gather has held until every rank
// finished the part).
func (rs *rankState) tidy() {
	if rs.tidies {
		debug.FreeOSMemory()
	}
}

// gather all-gathers every rank's report of what it has measured since the
// last gather.
func (rs *rankState) gather(ctx context.Context) ([]rankReport, error) {
	if err := rs.begin(ctx, "gather"); err != nil {
		return nil, err
	}
	rep, err := json.Marshal(rankReport{RecvRows: rs.recvRows, Times: rs.times, Checks: rs.checks, A2AChecks: rs.a2aChecks})
	if err != nil {
		return nil, err
	}
	all, err := rs.ctl.AllGather(ctx, rep)
	if err != nil {
		return nil, err
	}
	reps := make([]rankReport, len(all))
	for r, b := range all {
		if err := json.Unmarshal(b, &reps[r]); err != nil {
			return nil, fmt.Errorf("results of rank %d: %w", r, err)
		}
	}
	return reps, nil
}

// timingOf assembles the ranks' series of one name.
func timingOf(reps []rankReport, name string, iters int) (*Timing, error) {
	t := NewTiming(len(reps), iters)
	for r, rep := range reps {
		s := rep.Times[name]
		if s == nil || len(s.Start) != iters || len(s.End) != iters {
			return nil, fmt.Errorf("rank %d has no times of %s", r, name)
		}
		for i := range iters {
			t.Start[r][i] = epoch.Add(time.Duration(s.Start[i]))
			t.End[r][i] = epoch.Add(time.Duration(s.End[i]))
		}
	}
	return t, nil
}

// rows turns the ranks' reports into one row per call.
func (rs *rankState) rows(reps []rankReport, timing string) ([]Row, error) {
	w := rs.world
	recvRows := make([]int, len(reps))
	for rank, rep := range reps {
		recvRows[rank] = rep.RecvRows
	}
	// The peer rows of every rank, once per case.
	peerRows := make([]int, len(reps))
	for rank := range reps {
		peerRows[rank] = w.PeerRows(rank)
	}
	// bytesOf is the mean over ranks of the NVLink (all received, and
	// peer) and RDMA bytes of one one-way call moving rows of rb bytes.
	bytesOf := func(rb float64) (nvl, peer, rdma, cross, flat float64) {
		for rank, rep := range reps {
			nvl += float64(rep.RecvRows) * rb
			peer += float64(peerRows[rank]) * rb
			rdma += float64(w.RDMARows(rank)) * rb
			cross += float64(w.CrossDomainRows(rank)) * rb
			flat += float64(w.FlatRemoteRows(rank)) * rb
		}
		n := float64(len(reps))
		return nvl / n, peer / n, rdma / n, cross / n, flat / n
	}
	iters := rs.cfg.Iters
	times := func(name string) ([]float64, []float64, error) {
		t, err := timingOf(reps, name, iters)
		if err != nil {
			return nil, nil, err
		}
		if timing == TimingSpan {
			return t.Spans(), t.RankMax(), nil
		}
		return t.RankMax(), t.RankMax(), nil
	}
	// The copy baseline of each dtype the calls move.
	base := map[device.DType]Stats{}
	if !rs.checkOnly {
		for _, dt := range rs.c.callDTypes(rs.cfg.Calls) {
			b, _, err := times(baselineName(rs.c, dt))
			if err != nil {
				return nil, err
			}
			base[dt] = Summarize(b)
		}
	}
	var out []Row
	for _, call := range rs.cfg.Calls {
		it, rm, err := times(call)
		if err != nil {
			return nil, err
		}
		dt := rs.c.CallDType(call)
		rb := RowBytes(dt, w.Hidden)
		nvl, peer, rdma, cross, flat := bytesOf(float64(rb))
		// A round trip moves the dispatch's bytes twice, there and back.
		trips := float64(callTrips(call))
		row := Row{
			Call: call, Ranks: rs.cfg.Ranks, Experts: rs.cfg.Experts,
			Tokens: rs.c.Tokens, Hidden: rs.c.Hidden, TopK: rs.c.TopK,
			DType: dt.String(), CaseDType: rs.c.DType.String(), RowBytes: rb,
			Mode: rs.c.Mode, Pad: rs.cfg.Pad,
			SMs: rs.ran.SMs, ChunkRows: rs.ran.ChunkRows, RanksPerDomain: w.RanksPerDomain,
			Time: Summarize(it), IterUS: it,
			RankMaxTime: Summarize(rm),
			RecvRows:    recvRows, NVLBytes: trips * nvl, NVLPeerBytes: trips * peer,
			Baseline: base[dt],
		}
		row.NVLGBps = gbps(row.NVLBytes, row.Time.Median)
		row.NVLPeerGBps = gbps(row.NVLPeerBytes, row.Time.Median)
		if w.RanksPerDomain < w.Ranks {
			row.RDMABytes = trips * rdma
			row.RDMAGBps = gbps(row.RDMABytes, row.Time.Median)
			row.RDMACrossBytes = trips * cross
			row.RDMAFlatBytes = trips * flat
		}
		row.BaselineGBps = gbps(nvl, row.Baseline.Median)
		if row.BaselineGBps > 0 {
			row.Ratio = row.NVLGBps / row.BaselineGBps
		}
		for _, rep := range reps {
			if c := rep.Checks[call]; c != nil {
				row.CheckedRows += c.Rows
				row.Wrong += c.Wrong
			}
		}
		out = append(out, row)
	}
	return out, nil
}

// addA2A fills the a2a columns of the case's rows (one per call, in
// rs.cfg.Calls order) from the ranks' reports of the a2a baseline.
func (rs *rankState) addA2A(rows []Row, reps []rankReport, timing string) error {
	for i := range rows {
		row := &rows[i]
		t, err := timingOf(reps, "a2a/"+row.Call, rs.cfg.Iters)
		if err != nil {
			return err
		}
		at := t.RankMax()
		if timing == TimingSpan {
			at = t.Spans()
		}
		s := Summarize(at)
		row.A2A = &s
		row.A2AGBps = gbps(row.NVLBytes, s.Median)
		if row.Time.Median > 0 {
			row.A2ASpeedup = s.Median / row.Time.Median
		}
		for _, rep := range reps {
			if c := rep.A2AChecks[row.Call]; c != nil {
				row.A2ACheckedRows += c.Rows
				row.A2AWrong += c.Wrong
			}
		}
	}
	return nil
}

// callTrips is how many times a call moves the dispatch's bytes: 2 for
// the dispatch-combine round trip, else 1.
func callTrips(call string) int {
	if call == CallDispatchCombine {
		return 2
	}
	return 1
}

// gbps is bytes / (us microseconds) in GB/s (1e9 bytes per second).
func gbps(bytes, us float64) float64 {
	if us <= 0 {
		return 0
	}
	return bytes / (us * 1e3)
}
