package bench

import (
	"context"
	"errors"
	"fmt"
	"go.uber.org/zap"

	"golang.org/x/sync/errgroup"

	"github.com/goep/goep/comm"
	"github.com/goep/goep/device"
	"github.com/goep/goep/executor"
)

// Row is the result of one call in one case.
type Row struct {
	Call    string `json:"call"`
	Ranks   int    `json:"ranks"`
	Experts int    `json:"experts"`
	Tokens  int    `json:"tokens"`
	Hidden  int    `json:"hidden"`
	TopK    int    `json:"topk"`
	DType   string `json:"dtype"`
	Mode    string `json:"mode"`
	Pad     int    `json:"pad"`

	// Time is over the timed iterations, each from the first rank
	// entering the call to the last leaving Synchronize (Timing.Spans);
	// IterUS lists them. RankMaxTime is over the maximum over ranks of each
	// rank's own time (Timing.RankMax), for comparison.
	Time        Stats     `json:"time"`
	IterUS      []float64 `json:"iter_us"`
	RankMaxTime Stats     `json:"rank_max_time"`

	// RecvRows is N_r of every rank; NVLBytes the mean over ranks of
	// N_r * H * bytes per element; NVLGBps = NVLBytes / median time.
	RecvRows []int   `json:"recv_rows"`
	NVLBytes float64 `json:"nvl_bytes_per_rank"`
	NVLGBps  float64 `json:"nvl_GBps"`
	// RDMABytes (mean over ranks of the rows crossing to other domains,
	// counted per DESIGN.md section 6) and RDMAGBps are set only when
	// there are several domains.
	RDMABytes float64 `json:"rdma_bytes_per_rank,omitempty"`
	RDMAGBps  float64 `json:"rdma_GBps,omitempty"`

	// Baseline is a plain copy of each rank's N_r rows by all ranks at
	// once, timed the same way; Ratio = NVLGBps / BaselineGBps.
	Baseline     Stats   `json:"baseline_time"`
	BaselineGBps float64 `json:"baseline_GBps"`
	Ratio        float64 `json:"ratio"`

	// CheckedRows and Wrong count the output rows compared with the
	// expectation, over all ranks, and those that differed.
	CheckedRows int `json:"checked_rows"`
	Wrong       int `json:"wrong"`
}

// Result is a whole run.
type Result struct {
	Config Config `json:"config"`
	Rows   []Row  `json:"rows"`
}

// Wrong is the number of wrong rows over all rows.
func (r *Result) Wrong() int {
	n := 0
	for _, row := range r.Rows {
		n += row.Wrong
	}
	return n
}

// Checked is the number of rows checked over all rows.
func (r *Result) Checked() int {
	n := 0
	for _, row := range r.Rows {
		n += row.CheckedRows
	}
	return n
}

// Progress is reported after every iteration of rank 0.
type Progress struct {
	Case, Cases int // 1-based case number, number of cases
	Step        string
	Done, Total int // iterations done and total, over the whole run
}

// Options tunes Run.
type Options struct {
	// Progress, when set, is called from rank 0's goroutine.
	Progress func(Progress)
	// Logger is passed to every engine (nil: no logging).
	Logger *zap.Logger
}

// Run runs every case of cfg with in-process ranks on the host backend.
// It returns the rows of the cases that completed and the first error.
func Run(ctx context.Context, cfg Config, opt Options) (*Result, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	res := &Result{Config: cfg}
	cases := cfg.Cases()
	steps := len(cases) * (len(cfg.Calls) + 1) * (cfg.Warmup + cfg.Iters)
	done := 0
	for i, c := range cases {
		st, err := newCaseState(cfg, c)
		if err != nil {
			return res, err
		}
		st.log = opt.Logger
		if st.log == nil {
			st.log = zap.NewNop()
		}
		st.progress = func(step string) {
			done++
			if opt.Progress != nil {
				opt.Progress(Progress{Case: i + 1, Cases: len(cases), Step: step, Done: done, Total: steps})
			}
		}
		rows, err := st.run(ctx)
		if err != nil {
			return res, fmt.Errorf("tokens=%d hidden=%d dtype=%v: %w", c.Tokens, c.Hidden, c.DType, err)
		}
		res.Rows = append(res.Rows, rows...)
	}
	return res, nil
}

// caseState is what the rank goroutines of one case share. Each rank writes
// only its own index of the slices; they are read after all ranks finish.
type caseState struct {
	cfg   Config
	c     Case
	world *World
	ecfg  executor.Config

	groups  []comm.Group // the engines'
	ctl     []comm.Group // the harness's barriers
	backend *device.Host

	times    map[string]*Timing // call, or "baseline"
	checks   map[string][]Check // call -> [rank]
	recvRows []int
	progress func(step string) // rank 0 only
	log      *zap.Logger
}

func newCaseState(cfg Config, c Case) (*caseState, error) {
	d, err := cfg.domainSize()
	if err != nil {
		return nil, err
	}
	r := cfg.Ranks
	tokens := make([]int, r)
	for i := range tokens {
		tokens[i] = c.Tokens
	}
	maxT := 0
	for _, t := range cfg.Tokens {
		maxT = max(maxT, t)
	}
	l := cfg.Experts / r
	ecfg := executor.Config{
		NumExperts:       cfg.Experts,
		TopK:             cfg.TopK,
		Hidden:           c.Hidden,
		MaxTokensPerRank: maxT,
		RanksPerDomain:   cfg.RanksPerDomain,
		PadMultiple:      cfg.Pad,
	}
	if cfg.Mode == "capacity" {
		ecfg.Mode = executor.Capacity
		ecfg.MaxRecvTokens = cfg.MaxRecvTokens
		if ecfg.MaxRecvTokens == 0 {
			ecfg.MaxRecvTokens = max(1, r*maxT)
		}
		ecfg.MaxPermutedTokens = cfg.MaxPermutedTokens
		if ecfg.MaxPermutedTokens == 0 {
			ecfg.MaxPermutedTokens = max(1, r*maxT*min(cfg.TopK, l)+l*(cfg.Pad-1))
		}
	}
	st := &caseState{
		cfg:      cfg,
		c:        c,
		world:    NewWorld(cfg.Seed, r, d, cfg.Experts, cfg.TopK, c.Hidden, c.DType, tokens),
		ecfg:     ecfg,
		times:    map[string]*Timing{"baseline": NewTiming(r, cfg.Iters)},
		checks:   map[string][]Check{},
		recvRows: make([]int, r),
	}
	for _, call := range cfg.Calls {
		st.times[call] = NewTiming(r, cfg.Iters)
		st.checks[call] = make([]Check, r)
	}
	return st, nil
}

func (st *caseState) run(ctx context.Context) ([]Row, error) {
	r := st.cfg.Ranks
	st.groups = comm.NewLocal(r)
	st.ctl = comm.NewLocal(r)
	st.backend = device.NewHost()
	g, gctx := errgroup.WithContext(ctx)
	for rank := range r {
		g.Go(func() error {
			if err := st.rank(gctx, rank); err != nil {
				return fmt.Errorf("rank %d: %w", rank, err)
			}
			return nil
		})
	}
	err := g.Wait()
	for rank := range r {
		err = errors.Join(err, st.groups[rank].Close(), st.ctl[rank].Close())
	}
	err = errors.Join(err, st.backend.Close())
	if err != nil {
		return nil, err
	}
	return st.rows(), nil
}

// rows turns the per-rank measurements into one row per call.
func (st *caseState) rows() []Row {
	w := st.world
	rb := float64(w.Hidden * w.DType.Size())
	var nvl, rdma float64
	for rank, n := range st.recvRows {
		nvl += float64(n) * rb
		rdma += float64(w.RDMARows(rank)) * rb
	}
	nvl /= float64(len(st.recvRows))
	rdma /= float64(len(st.recvRows))
	base := Summarize(st.times["baseline"].Spans())
	var out []Row
	for _, call := range st.cfg.Calls {
		iters := st.times[call].Spans()
		row := Row{
			Call: call, Ranks: st.cfg.Ranks, Experts: st.cfg.Experts,
			Tokens: st.c.Tokens, Hidden: st.c.Hidden, TopK: st.cfg.TopK,
			DType: st.c.DType.String(), Mode: st.cfg.Mode, Pad: st.cfg.Pad,
			Time: Summarize(iters), IterUS: iters,
			RankMaxTime: Summarize(st.times[call].RankMax()),
			RecvRows:    st.recvRows, NVLBytes: nvl,
			Baseline: base,
		}
		row.NVLGBps = gbps(nvl, row.Time.Median)
		if w.RanksPerDomain < w.Ranks {
			row.RDMABytes = rdma
			row.RDMAGBps = gbps(rdma, row.Time.Median)
		}
		row.BaselineGBps = gbps(nvl, base.Median)
		if row.BaselineGBps > 0 {
			row.Ratio = row.NVLGBps / row.BaselineGBps
		}
		for _, c := range st.checks[call] {
			row.CheckedRows += c.Rows
			row.Wrong += c.Wrong
		}
		out = append(out, row)
	}
	return out
}

// gbps is bytes / (us microseconds) in GB/s (1e9 bytes per second).
func gbps(bytes, us float64) float64 {
	if us <= 0 {
		return 0
	}
	return bytes / (us * 1e3)
}
