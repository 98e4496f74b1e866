package bench

import (
	"fmt"
	"slices"

	"github.com/goep/goep/device"
)

// A run whose sizes cannot fit in this machine's memory must fail with an
// error before it allocates, not take the process down: a Go allocation
// beyond the memory left is a fatal runtime error ("out of memory"), not a
// recoverable one, and a kernel OOM kill says nothing at all. So Run and
// RunRank compare a lower bound of the host memory the largest case needs
// with the memory available to this process (device.HostMemoryAvailable),
// and refuse a run that cannot fit (CheckMemory; eprun calls it before it
// prints anything). The bound counts only what the run holds whatever the
// routing, so it never refuses a run that would fit; a run just under it
// may still need more (received and permuted rows depend on the routing,
// and the host backend pools freed buffers).

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

// CheckMemory returns an error naming the case of c whose lower bound of
// host memory (inProcess ranks in this process: Ranks for Run, 1 for
// RunRank) is the largest, when that bound exceeds the memory available;
// else nil (also when the memory available cannot be read).
func (c Config) CheckMemory(inProcess int) error {
	avail, ok := availableMemory()
	if !ok {
		return nil
	}
	worst, need := c.largest(func(cs Case) float64 { return minHostBytes(c, cs, inProcess) })
	if need <= avail {
		return nil
	}
	return fmt.Errorf("the case tokens=%d hidden=%d topk=%d dtype=%v needs at least %s of host memory for its %d rank(s) in this process (routing, inputs, layout tables%s), and %s is available: lower tokens, hidden, ranks or experts",
		worst.Tokens, worst.Hidden, worst.TopK, worst.DType, gib(need), inProcess, hostTerms(c), gib(avail))
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

// hostBytesEstimate is the host memory one process is expected to hold at
// its peak for case c of cfg on the host backend, with inProcess ranks in
// it, in bytes. It counts rows per rank, from the routing's expected counts
// for uniform routing: N = R x T x p received rows (p is the chance that a
// token's K distinct experts of E include one of a rank's E/R) and P = T x
// K permuted rows, each of the bytes of a row of every dtype the case's
// calls move (RowBytes: an fp8 row's scales included; an fp8 case whose
// calls combine holds bf16 rows too, Case.CallDType, and is counted with
// both, as each has its own buffers).
//
//   - With the a2a baseline (not checkOnly), its rows dominate: 2T + 6N + 2P
//     (inputs and output; the send, receive, gathered, unpermuted and
//     round-trip buffers; the permuted rows and their copy), counted twice
//     for the Go heap's growth between collections.
//   - Else goep's own: 3T + 3N + P (the input, the outputs, and the copy
//     baseline's two buffers).
//
// Measured with 8 ranks, hidden 7168, top-8 of 64 experts
// (docs/PERFORMANCE.md): 11.4 GB estimated against 10.0 GB peak resident at
// 1000 tokens, 22.8 against 18.2 at 2000; eprun check 3.1 against 3.1.
func hostBytesEstimate(cfg Config, c Case, inProcess int, checkOnly bool) float64 {
	r, t, k := float64(cfg.Ranks), float64(c.Tokens), float64(c.TopK)
	e, l := cfg.Experts, cfg.Experts/cfg.Ranks
	none := 1.0 // the chance that a token names none of a rank's experts
	for i := range c.TopK {
		none *= max(0, float64(e-l-i)) / float64(e-i)
	}
	n, p := r*t*(1-none), t*k
	rows := 3*t + 3*n + p
	if !checkOnly {
		rows = 2 * (2*t + 6*n + 2*p)
	}
	rb := 0
	for _, dt := range c.callDTypes(cfg.Calls) {
		rb += RowBytes(dt, c.Hidden)
	}
	return float64(inProcess) * rows * float64(rb)
}

// MemoryWarning returns a warning when the host memory a run of c on the
// host backend is expected to need (inProcess ranks in this process; the
// largest case) exceeds the memory available, else "". Unlike CheckMemory
// it is an estimate, and the run goes on: it may then be killed by the
// kernel for want of memory.
func (c Config) MemoryWarning(inProcess int, checkOnly bool) string {
	if c.Backend == BackendCUDA {
		return ""
	}
	avail, ok := availableMemory()
	if !ok {
		return ""
	}
	worst, need := c.largest(func(cs Case) float64 { return hostBytesEstimate(c, cs, inProcess, checkOnly) })
	if need <= avail {
		return ""
	}
	return fmt.Sprintf("the case tokens=%d hidden=%d topk=%d dtype=%v is expected to need about %s of host memory for its %d rank(s) in this process, and %s is available: the kernel may kill the run for want of memory (eprun check, fewer tokens or a smaller hidden need less)",
		worst.Tokens, worst.Hidden, worst.TopK, worst.DType, gib(need), inProcess, gib(avail))
}
