package bench

import (
	"math"
	"slices"
	"time"
)

// Stats summarises the per-iteration times of one call, in microseconds.
type Stats struct {
	N      int     `json:"n"`
	Median float64 `json:"median_us"`
	P90    float64 `json:"p90_us"`
	P99    float64 `json:"p99_us"`
	Min    float64 `json:"min_us"`
	Max    float64 `json:"max_us"`
	Mean   float64 `json:"mean_us"`
}

// Summarize computes Stats of xs (any order; not modified). Percentiles
// interpolate linearly between the closest ranks (numpy's default), so the
// median of an even count is the mean of the two middle values.
func Summarize(xs []float64) Stats {
	if len(xs) == 0 {
		return Stats{}
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	sum := 0.0
	for _, x := range s {
		sum += x
	}
	return Stats{
		N:      len(s),
		Median: Percentile(s, 50),
		P90:    Percentile(s, 90),
		P99:    Percentile(s, 99),
		Min:    s[0],
		Max:    s[len(s)-1],
		Mean:   sum / float64(len(s)),
	}
}

// Percentile returns the p-th percentile (0..100) of sorted, interpolating
// linearly between closest ranks: position p/100*(n-1).
func Percentile(sorted []float64, p float64) float64 {
	n := len(sorted)
	if n == 0 {
		return math.NaN()
	}
	pos := p / 100 * float64(n-1)
	lo := int(math.Floor(pos))
	if lo >= n-1 {
		return sorted[n-1]
	}
	if lo < 0 {
		return sorted[0]
	}
	f := pos - float64(lo)
	return sorted[lo] + f*(sorted[lo+1]-sorted[lo])
}

// Timing holds the start and end of every timed iteration of every rank.
type Timing struct {
	Start, End [][]time.Time // [rank][iter]
}

// NewTiming allocates a Timing.
func NewTiming(ranks, iters int) *Timing {
	t := &Timing{Start: make([][]time.Time, ranks), End: make([][]time.Time, ranks)}
	for r := range ranks {
		t.Start[r] = make([]time.Time, iters)
		t.End[r] = make([]time.Time, iters)
	}
	return t
}

// Spans is the time of each iteration in microseconds: from the first rank
// entering the call to the last rank leaving it. In-process ranks share one
// monotonic clock, so this is the collective's wall time, including a rank
// that the scheduler started late.
func (t *Timing) Spans() []float64 {
	if len(t.Start) == 0 {
		return nil
	}
	out := make([]float64, len(t.Start[0]))
	for i := range out {
		lo, hi := t.Start[0][i], t.End[0][i]
		for r := range t.Start {
			if t.Start[r][i].Before(lo) {
				lo = t.Start[r][i]
			}
			if t.End[r][i].After(hi) {
				hi = t.End[r][i]
			}
		}
		out[i] = us(hi.Sub(lo))
	}
	return out
}

// RankMax is the time of each iteration in microseconds as the maximum
// over ranks of each rank's own end minus start (what separate processes,
// without a shared clock, measure after a barrier).
func (t *Timing) RankMax() []float64 {
	if len(t.Start) == 0 {
		return nil
	}
	out := make([]float64, len(t.Start[0]))
	for r := range t.Start {
		for i := range out {
			out[i] = max(out[i], us(t.End[r][i].Sub(t.Start[r][i])))
		}
	}
	return out
}

func us(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }
