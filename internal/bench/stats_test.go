package bench

import (
	"math"
	"testing"
	"time"
)

func TestSummarize(t *testing.T) {
	seq := func(n int) []float64 {
		xs := make([]float64, n)
		for i := range xs {
			xs[i] = float64(n - i) // descending: Summarize must sort
		}
		return xs
	}
	for _, tc := range []struct {
		name             string
		xs               []float64
		median, p90, p99 float64
		min, max, mean   float64
	}{
		{"one", []float64{5}, 5, 5, 5, 5, 5, 5},
		{"two", []float64{4, 2}, 3, 3.8, 3.98, 2, 4, 3},
		{"odd", []float64{3, 1, 2}, 2, 2.8, 2.98, 1, 3, 2},
		{"1..100", seq(100), 50.5, 90.1, 99.01, 1, 100, 50.5},
		{"1..20", seq(20), 10.5, 18.1, 19.81, 1, 20, 10.5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := Summarize(tc.xs)
			for _, c := range []struct {
				what      string
				got, want float64
			}{
				{"median", s.Median, tc.median}, {"p90", s.P90, tc.p90}, {"p99", s.P99, tc.p99},
				{"min", s.Min, tc.min}, {"max", s.Max, tc.max}, {"mean", s.Mean, tc.mean},
			} {
				if math.Abs(c.got-c.want) > 1e-9 {
					t.Errorf("%s = %v, want %v", c.what, c.got, c.want)
				}
			}
			if s.N != len(tc.xs) {
				t.Errorf("N = %d, want %d", s.N, len(tc.xs))
			}
		})
	}
	if s := Summarize(nil); s.N != 0 {
		t.Errorf("Summarize(nil) = %+v", s)
	}
}

func TestTiming(t *testing.T) {
	t0 := time.Now()
	at := func(us int) time.Time { return t0.Add(time.Duration(us) * time.Microsecond) }
	tm := NewTiming(2, 2)
	// iteration 0: rank 0 [0, 10], rank 1 [5, 12]: span 12, rank max 10
	// iteration 1: rank 0 [20, 21], rank 1 [30, 40]: span 20, rank max 10
	tm.Start[0][0], tm.End[0][0] = at(0), at(10)
	tm.Start[1][0], tm.End[1][0] = at(5), at(12)
	tm.Start[0][1], tm.End[0][1] = at(20), at(21)
	tm.Start[1][1], tm.End[1][1] = at(30), at(40)
	if got := tm.Spans(); got[0] != 12 || got[1] != 20 {
		t.Errorf("Spans = %v, want [12 20]", got)
	}
	if got := tm.RankMax(); got[0] != 10 || got[1] != 10 {
		t.Errorf("RankMax = %v, want [10 10]", got)
	}
}
