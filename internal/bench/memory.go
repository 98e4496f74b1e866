package bench

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/goep/goep/device"
)

// A run whose sizes cannot fit in this machine's memory must fail with an
// error before it allocates, not take the process down: a Go allocation
// beyond the memory left is a fatal runtime error ("out of memory"), not a
// recoverable one, and a kernel OOM kill, minutes in, says nothing at all.
// So eprun, Run and RunRank compare the host memory the largest case needs
// with the memory available to this process (device.HostMemoryAvailable),
// and refuse a run that cannot fit (CheckMemory; eprun calls it before it
// prints anything, and its --force-memory, Options.ForceMemory, runs it
// anyway). Two measures refuse: a lower bound whatever the routing
// (minHostBytes), and the rows the run is expected to hold at once
// (hostBytes, with every size flag in it). A run whose expected peak, the
// Go heap's growth included, exceeds the memory gets a warning and runs.

// minHostBytes is a lower bound on the host memory one process holds for
// case c of cfg with inProcess ranks running in it (Run: all of them;
// RunRank under a launcher: one), in bytes, as a float64 (the products
// overflow int64 for sizes Validate allows). Per rank, of T tokens of rows
// of b bytes (RowBytes of the case's dtype: H x the element size, plus an
// fp8 row's H/128 fp32 scales), top-k K, R ranks in all:
//
//   - the case's routing of every rank (World.Idx), which each rank
//     rebuilds to check its results: R x T x K int32;
//   - its inputs as built on the host (World.Inputs, InputScales): x (and
//     its scales), T x b, and the weights, T x K fp32;
//   - on the host backend, x again in "device" memory, and the output of
//     a combine when a call combines (T x c, c the row bytes of the
//     combine dtype, Case.CallDType);
//   - in an fp8 case whose calls combine, the bf16 inputs of those calls,
//     T x c, twice on the host backend;
//   - the layout's world tables (executor.ComputeLayout: rows and expert
//     rows from every source to every destination, and their bases), 2 x
//     R x R + 2 x R x E ints, whatever T is.
func minHostBytes(cfg Config, c Case, inProcess int) float64 {
	r, t, k := float64(cfg.Ranks), float64(c.Tokens), float64(c.TopK)
	row := float64(RowBytes(c.DType, c.Hidden))
	comb := slices.ContainsFunc(cfg.Calls, combines)
	cdt := c.CallDType(CallCombine)
	crow := float64(RowBytes(cdt, c.Hidden))
	host := cfg.Backend != BackendCUDA
	perRank := r*t*k*4 + t*row + t*k*4 + 8*(2*r*r+2*r*float64(cfg.Experts))
	if comb && cdt != c.DType {
		perRank += t * crow
		if host {
			perRank += t * crow
		}
	}
	if host {
		perRank += t * row
		if comb {
			perRank += t * crow
		}
	}
	return float64(inProcess) * perRank
}

// combines reports whether call returns combined rows.
func combines(call string) bool {
	return call == CallCombine || call == CallUnpermuteCombine || call == CallDispatchCombine
}

// availableMemory is the host memory this process may still take
// (device.HostMemoryAvailable); tests replace it.
var availableMemory = func() (float64, bool) {
	n, ok := device.HostMemoryAvailable()
	return float64(n), ok
}

// ErrMemory is wrapped by CheckMemory's error: the run cannot fit in the
// host memory available.
var ErrMemory = errors.New("not enough host memory")

// CheckMemory compares the host memory a run of c needs, with inProcess
// of its ranks in this process (Ranks for Run, 1 for RunRank), with the
// memory available to the process (device.HostMemoryAvailable), on the
// largest case. It returns an error wrapping ErrMemory when the run cannot
// fit:
//
//   - when minHostBytes, a bound whatever the routing, exceeds the memory
//     available;
//   - on the host backend, when the rows the run is expected to hold at
//     once (hostBytes, with every size in it: tokens, hidden, top-k, the
//     padding of pad, capacity mode's output capacities) exceed it;
//   - or when the expected peak (hostBytes with the Go heap's growth
//     between collections; the same for eprun check) exceeds it by more
//     than peakError, the most the estimate has been measured above the
//     memory a run really took.
//
// A run whose expected peak exceeds the memory available by less than that
// probably fits: CheckMemory returns a warning saying so, and no error.
// Both are "" and nil when the memory available cannot be read. The cuda
// backend's device memory is not counted here.
func (c Config) CheckMemory(inProcess int, checkOnly bool) (warning string, err error) {
	avail, ok := availableMemory()
	if !ok {
		return "", nil
	}
	worst, need := c.largest(func(cs Case) float64 { return minHostBytes(c, cs, inProcess) })
	if need > avail {
		return "", fmt.Errorf("%w: the case %s needs at least %s of host memory for its %d rank(s) in this process (routing, inputs, layout tables%s), and %s is available: lower tokens, hidden, ranks or experts",
			ErrMemory, worst.name(), gib(need), inProcess, hostTerms(c), gib(avail))
	}
	if c.Backend == BackendCUDA {
		return "", nil
	}
	worst, live := c.largest(func(cs Case) float64 { return hostBytes(c, cs, inProcess, checkOnly, false) })
	if live > avail {
		return "", fmt.Errorf("%w: the case %s is expected to hold about %s of host memory at once for its %d rank(s) in this process (%s), and %s is available: lower tokens, hidden, pad or the capacities%s",
			ErrMemory, worst.name(), gib(live), inProcess, c.rowTerms(worst, checkOnly), gib(avail), checkHint(checkOnly))
	}
	worst, peak := c.largest(func(cs Case) float64 { return hostBytes(c, cs, inProcess, checkOnly, true) })
	if peak > avail*(1+peakError) {
		return "", fmt.Errorf("%w: the case %s is expected to need up to %s of host memory for its %d rank(s) in this process (%s, and the Go heap's growth between collections), and %s is available: lower tokens, hidden, pad or the capacities%s",
			ErrMemory, worst.name(), gib(peak), inProcess, c.rowTerms(worst, checkOnly), gib(avail), checkHint(checkOnly))
	}
	if peak > avail {
		return fmt.Sprintf("the case %s is expected to need up to %s of host memory for its %d rank(s) in this process (%s, and the Go heap's growth between collections), and %s is available: it probably fits, the garbage collector working harder, but the kernel may kill it for want of memory%s",
			worst.name(), gib(peak), inProcess, c.rowTerms(worst, checkOnly), gib(avail), checkHint(checkOnly)), nil
	}
	return "", nil
}

// peakError is the most hostBytes' peak may be above the memory a run
// takes, as a fraction, for CheckMemory to refuse the run; between the two
// it warns.
const peakError = 0.25

// checkHint suggests eprun check, which holds no baseline rows.
func checkHint(checkOnly bool) string {
	if checkOnly {
		return ""
	}
	return " (eprun check, without the baselines, needs less)"
}

// name is the case as errors name it: tokens=T hidden=H topk=K dtype=D,
// and its mode when capacity.
func (c Case) name() string {
	s := fmt.Sprintf("tokens=%d hidden=%d topk=%d dtype=%v", c.Tokens, c.Hidden, c.TopK, c.DType)
	if c.Mode == ModeCapacity {
		s += " mode=capacity"
	}
	return s
}

// checkMemory is CheckMemory for Run and RunRank: the error, unless
// ForceMemory, in which case it is logged as a warning, as the warning is.
func (o Options) checkMemory(cfg Config, inProcess int) error {
	w, err := cfg.CheckMemory(inProcess, o.CheckOnly)
	if err != nil {
		if !o.ForceMemory {
			return err
		}
		w = err.Error() + "; running anyway (forced)"
	}
	if w != "" && o.Logger != nil {
		o.Logger.Warn(w)
	}
	return nil
}

// largest returns the case of c with the most bytes and their number.
func (c Config) largest(bytes func(Case) float64) (worst Case, most float64) {
	for _, cs := range c.Cases() {
		if b := bytes(cs); b > most {
			worst, most = cs, b
		}
	}
	return worst, most
}

// hostTerms names the host backend's terms of minHostBytes, if any.
func hostTerms(cfg Config) string {
	if cfg.Backend == BackendCUDA {
		return ""
	}
	if slices.ContainsFunc(cfg.Calls, combines) {
		return ", the host backend's device copies of x and the combined output"
	}
	return ", the host backend's device copy of x"
}

// gib writes n bytes in GiB.
func gib(n float64) string { return fmt.Sprintf("%.1f GiB", n/(1<<30)) }

// expectedRows is the rows one rank of case cs of cfg is expected to
// hold, from the routing's expected counts for uniform routing: its T
// tokens, N = R x T x p received rows (p is the chance that a token's K
// distinct experts of E include one of a rank's E/R), P = T x K permuted
// rows plus the padding of each of the rank's E/R experts' segments (up to
// Pad-1 rows each), and the rows of goep's outputs: N and P in blocking
// mode, the capacities in capacity mode (Config.capacities).
func expectedRows(cfg Config, c Case) (t, n, p, nOut, pOut float64) {
	r, k := float64(cfg.Ranks), float64(c.TopK)
	t = float64(c.Tokens)
	e, l := cfg.Experts, cfg.Experts/cfg.Ranks
	none := 1.0 // the chance that a token names none of a rank's experts
	for i := range c.TopK {
		none *= max(0, float64(e-l-i)) / float64(e-i)
	}
	n, p = r*t*(1-none), t*k
	if t > 0 {
		p += float64(l) * float64(cfg.Pad-1)
	}
	nOut, pOut = n, p
	if c.Mode == ModeCapacity {
		rc, pc := cfg.capacities(c)
		nOut, pOut = float64(rc), float64(pc)
	}
	return t, n, p, nOut, pOut
}

// hostBytes is the host memory one process is expected to hold for case
// c of cfg on the host backend, with inProcess ranks in it, in bytes: its
// rows (expectedRows) held at once (peak false) or at the peak (peak
// true), each of the bytes of a row of every dtype the case's calls move
// (RowBytes: an fp8 row's scales included; an fp8 case whose calls
// combine holds bf16 rows too, Case.CallDType, and is counted with both,
// as each has its own buffers).
//
//   - goep's calls: 3T + 2N' + 2P' (the input and its device copy and
//     the combined output; the outputs, of N' and P' rows, the capacities
//     in capacity mode, and as many freed ones the host backend's pool
//     keeps for reuse), plus 2N with the baselines (the copy baseline's
//     two buffers). The checks read the outputs in place.
//   - with the a2a baseline (not checkOnly), which runs after goep's
//     engine and the case's host backend are closed: 3T + 2N + P (the
//     inputs, as the engine's and the baseline's own, and the output; the
//     messages both ways, or the rows that come back and the unpermuted
//     ones; the permuted rows). Its buffers are mapped outside the Go heap
//     and given back after each call (A2A.Free).
//   - at the peak, the Go heap's growth between collections: its share of
//     the rows above, the inputs (2T), counted twice.
//
// Measured with 8 ranks, hidden 2048, top-8 of 64 experts, 1024 tokens
// (the default config, docs/PERFORMANCE.md): 1.4 GiB estimated against
// 0.94 GB resident.
func hostBytes(cfg Config, c Case, inProcess int, checkOnly, peak bool) float64 {
	t, n, p, nOut, pOut := expectedRows(cfg, c)
	rows := 3*t + 2*nOut + 2*pOut
	if !checkOnly {
		rows += 2 * n
		rows = max(rows, 3*t+2*n+p)
	}
	if peak {
		rows += 2 * 2 * t
	}
	rb := 0
	for _, dt := range c.callDTypes(cfg.Calls) {
		rb += RowBytes(dt, c.Hidden)
	}
	return float64(inProcess) * rows * float64(rb)
}

// hostBytesEstimate is hostBytes at the peak.
func hostBytesEstimate(cfg Config, c Case, inProcess int, checkOnly bool) float64 {
	return hostBytes(cfg, c, inProcess, checkOnly, true)
}

// rowTerms says what hostBytes counted for case cs.
func (c Config) rowTerms(cs Case, checkOnly bool) string {
	t, n, p, nOut, pOut := expectedRows(c, cs)
	s := fmt.Sprintf("%.0f tokens, about %.0f received and %.0f permuted rows a rank", t, n, p)
	if cs.Mode == ModeCapacity {
		s += fmt.Sprintf(", outputs of capacity %.0f and %.0f rows", nOut, pOut)
	}
	if !checkOnly {
		s += ", the baselines' buffers of them"
	}
	return s
}

// Scaling records how ScaleDown scaled a run down to fit: the ranks and
// tokens configured and run, and why.
type Scaling struct {
	FromRanks  int  `json:"from_ranks"`
	ToRanks    int  `json:"to_ranks"`
	FromTokens Ints `json:"from_tokens"`
	ToTokens   Ints `json:"to_tokens"`
	// Reason is the memory estimate's refusal of the configured run.
	Reason string `json:"reason"`
	// Peak is the scaled run's expected peak of host memory, and
	// Available the memory available, in bytes.
	Peak      float64 `json:"peak_bytes"`
	Available float64 `json:"available_bytes"`
}

// String says what was scaled and why, in one sentence.
func (s *Scaling) String() string {
	ranks := fmt.Sprintf("ranks %d", s.FromRanks)
	if s.ToRanks != s.FromRanks {
		ranks = fmt.Sprintf("ranks %d -> %d", s.FromRanks, s.ToRanks)
	}
	return fmt.Sprintf("scaled down to fit: %s, tokens %v -> %v a rank, every other field as configured; the scaled run is expected to need up to %s of the %s available. The configured run cannot fit: %s",
		ranks, []int(s.FromTokens), []int(s.ToTokens), gib(s.Peak), gib(s.Available), s.Reason)
}

// scaleMinRanks is the fewest ranks ScaleDown goes to before it reduces
// tokens: a node of eight GPUs, the rank count of eprun's default.
const scaleMinRanks = 8

// ScaleDown returns c scaled down until the memory estimate (CheckMemory)
// neither refuses nor warns, with a record of what changed, or c and nil
// when c fits as it is (or the memory available is unknown). inProcess is
// the ranks in this process: c.Ranks (in-process ranks, which ScaleDown
// reduces with the ranks), or 1 under a launcher (fixedRanks: the ranks
// are the processes, and only tokens are reduced).
//
// The steps, each taken until the run fits: the ranks are halved (to the
// largest divisor of the experts at most half of them, and a multiple of
// ranks_per_domain if set) down to eight, then every tokens value is
// halved (at least 1), then the ranks go below eight. Experts, top-k,
// hidden, dtype, routing, the knobs and every other field stay as
// configured, so the experts a rank owns grow as the ranks shrink. It
// fails, wrapping ErrMemory, when even one token on the fewest ranks
// does not fit.
func (c Config) ScaleDown(inProcess int, checkOnly, fixedRanks bool) (Config, *Scaling, error) {
	procs := func(x Config) int {
		if fixedRanks {
			return inProcess
		}
		return x.Ranks
	}
	fits := func(x Config) bool {
		w, err := x.CheckMemory(procs(x), checkOnly)
		return err == nil && w == ""
	}
	_, first := c.CheckMemory(procs(c), checkOnly)
	if first == nil {
		return c, nil, nil
	}
	cur := c
	for !fits(cur) {
		next, ok := cur.shrink(fixedRanks)
		if !ok {
			return c, nil, fmt.Errorf("%w; and scaled down to %d rank(s) of %v token(s) it still does not fit", first, cur.Ranks, []int(cur.Tokens))
		}
		cur = next
	}
	avail, _ := availableMemory()
	measure := func(cs Case) float64 { return hostBytes(cur, cs, procs(cur), checkOnly, true) }
	if cur.Backend == BackendCUDA {
		measure = func(cs Case) float64 { return minHostBytes(cur, cs, procs(cur)) }
	}
	_, peak := cur.largest(measure)
	reason := strings.TrimPrefix(first.Error(), ErrMemory.Error()+": ")
	return cur, &Scaling{FromRanks: c.Ranks, ToRanks: cur.Ranks, FromTokens: slices.Clone(c.Tokens), ToTokens: slices.Clone(cur.Tokens),
		Reason: reason, Peak: peak, Available: avail}, nil
}

// shrink is ScaleDown's next step from c, false when there is none.
func (c Config) shrink(fixedRanks bool) (Config, bool) {
	fewer := func() bool {
		for r := c.Ranks / 2; r >= 1; r-- {
			if c.Experts%r == 0 && (c.RanksPerDomain == 0 || r%c.RanksPerDomain == 0) {
				c.Ranks = r
				return true
			}
		}
		return false
	}
	if !fixedRanks && c.Ranks > scaleMinRanks && fewer() {
		return c, true
	}
	if slices.Max(c.Tokens) > 1 {
		t := make(Ints, len(c.Tokens))
		for i, n := range c.Tokens {
			t[i] = min(n, max(n/2, 1))
		}
		c.Tokens = t
		return c, true
	}
	if !fixedRanks && fewer() {
		return c, true
	}
	return c, false
}
