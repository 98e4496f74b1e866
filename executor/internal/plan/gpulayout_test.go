//go:build cgo

package plan

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/goep/goep/executor/internal/plan/plantest"
	"github.com/goep/goep/internal/gpulayout"
)

// TestLayoutKernels runs the GPU layout kernels' code on the host (package
// kernels' emulation) for random worlds and checks, for every rank, the
// summary against ComputeLayout and the tables against BuildTables, bit
// for bit; for a routing at fault, the same RoutingError. The kernels
// themselves run on a GPU in TestCUDALayoutKernels.
func TestLayoutKernels(t *testing.T) {
	n := 400
	if testing.Short() {
		n = 100
	}
	for seed := range uint64(n) {
		c := genLayoutCase(seed)
		for me := range c.R {
			if err := c.check(me); err != nil {
				t.Fatalf("seed %d (%s), rank %d: %v", seed, c, me, err)
			}
		}
	}
}

type layoutCase struct {
	R, chunk, scan int
	cfg            Params
	routing        [][]int32
}

func (c *layoutCase) String() string {
	return fmt.Sprintf("R=%d E=%d K=%d maxT=%d pad=%d capacity=%v maxRecv=%d chunk=%d scan=%d", c.R, c.cfg.NumExperts,
		c.cfg.TopK, c.cfg.MaxTokensPerRank, c.cfg.PadMultiple, c.cfg.Capacity, c.cfg.MaxRecvTokens, c.chunk, c.scan)
}

// genLayoutCase draws a world: 1-6 ranks, 1-4 experts each, up to 20
// tokens per rank, hot experts, empty slots, and in one case of eight an
// attempt at a fault (an expert out of range, or one copied onto another
// slot of its token: no fault when the draw copies a slot onto itself or
// the rank has no tokens).
func genLayoutCase(seed uint64) *layoutCase {
	rng := rand.New(rand.NewPCG(seed, 0x1a70))
	R, L := 1+rng.IntN(6), 1+rng.IntN(4)
	E := R * L
	K := 1 + rng.IntN(min(E, 6))
	maxT := 1 + rng.IntN(20)
	c := &layoutCase{R: R, chunk: 1 + rng.IntN(7), scan: 1 + rng.IntN(40)}
	c.cfg = Params{NumExperts: E, TopK: K, MaxTokensPerRank: maxT, PadMultiple: 1 + rng.IntN(3), RanksPerDomain: R}
	if rng.IntN(2) == 0 {
		c.cfg.Capacity = true
		// Often below a rank's rows, so that rows are dropped.
		c.cfg.MaxRecvTokens = rng.IntN(2*maxT + 1)
		c.cfg.MaxPermutedTokens = rng.IntN(4*maxT + 1)
	}
	hot := rng.Perm(E)[:1+rng.IntN(E)]
	for range R {
		c.routing = append(c.routing, plantest.Routing(rng, rng.IntN(maxT+1), E, K, hot))
	}
	if seed%8 == 3 {
		// A fault in some rank's routing (or none, when it has no tokens).
		s := rng.IntN(R)
		if idx := c.routing[s]; len(idx) > 0 {
			i := rng.IntN(len(idx))
			switch rng.IntN(3) {
			case 0:
				idx[i] = int32(E + rng.IntN(3))
			case 1:
				idx[i] = int32(-2 - rng.IntN(3))
			default:
				t := i / K
				idx[t*K+rng.IntN(K)] = max(idx[t*K+rng.IntN(K)], 0)
			}
		}
	}
	return c
}

// check compares the emulated kernels with the host layout for rank me.
func (c *layoutCase) check(me int) error {
	want, werr := ComputeLayout(me, c.cfg, c.routing)
	T := len(c.routing[me]) / c.cfg.TopK
	rowCap := c.cfg.MaxRecvTokens
	if !c.cfg.Capacity {
		rowCap = c.R * c.cfg.MaxTokensPerRank // the blocking count is known after the summary
		if want != nil {
			rowCap = want.RecvCount
		}
	}
	d := LayoutDims(c.cfg, c.R, me, T, rowCap)
	d.Chunk = c.chunk
	sum, tables, err := gpulayout.EmulateLayout(d, c.routing, c.scan)
	if err != nil {
		return err
	}
	got, gerr := SummaryLayout(sum, d)
	if err := c.checkFinish(d, sum, want, werr); err != nil {
		return fmt.Errorf("finish: %w", err)
	}
	if werr != nil || gerr != nil {
		var re *RoutingError
		if werr == nil || gerr == nil || !errors.As(gerr, &re) || werr.Error() != gerr.Error() {
			return fmt.Errorf("error %v, want %v", gerr, werr)
		}
		for i, v := range tables {
			if v != -1 {
				return fmt.Errorf("table entry %d written after a routing error: %d", i, v)
			}
		}
		return nil
	}
	if got.RecvCount != want.RecvCount || got.PermutedCount != want.PermutedCount ||
		!slices.Equal(got.RecvCounts, want.RecvCounts) || !slices.Equal(got.PermutedCounts, want.PermutedCounts) ||
		!slices.Equal(got.TokensPerExpert, want.TokensPerExpert) || !slices.Equal(got.ExpertOffsets, want.ExpertOffsets) {
		return fmt.Errorf("summary %+v, want counts %d %d %v %v %v %v", got, want.RecvCount, want.PermutedCount,
			want.RecvCounts, want.PermutedCounts, want.TokensPerExpert, want.ExpertOffsets)
	}
	wt := BuildTables(want, c.cfg, c.routing, min(c.cfg.TopK, c.R), rowCap)
	if !slices.Equal(tables, wt) {
		names := []string{"entTok", "entDest", "entRow", "slotEnt", "recvSrc", "recvEnt", "recvIdx", "pos"}
		o := 0
		for i, n := range TableSizes(T, c.cfg.TopK, min(c.cfg.TopK, c.R), rowCap) {
			if g, w := tables[o:o+n], wt[o:o+n]; !slices.Equal(g, w) {
				return fmt.Errorf("table %s:\n got  %v\n want %v\nrouting %v", names[i], g, w, c.routing)
			}
			o += n
		}
		return fmt.Errorf("tables differ (%d and %d entries)", len(tables), len(wt))
	}
	return nil
}

// checkFinish runs the finish kernel of a captured layout on the summary
// sum of the layout want (or of the routing error werr), under both
// capacity policies, and checks the device counts against Counts (zeros
// after a routing error) and the report: written exactly when the
// layout fails (a routing error, or under the error policy a rank over
// capacity), with the summary from which the host rebuilds the same
// error; an earlier report is kept.
func (c *layoutCase) checkFinish(d gpulayout.Dims, sum []int32, want *Layout, werr error) error {
	maxPerm := math.MaxInt32 // blocking mode: no capacity
	if c.cfg.Capacity {
		maxPerm = c.cfg.MaxPermutedTokens
	}
	for _, capErr := range []bool{false, true} {
		report := make([]int32, 1+len(sum))
		counts, err := gpulayout.EmulateFinish(d, sum, report, maxPerm, capErr)
		if err != nil {
			return err
		}
		wantCounts := make([]int32, CountsHeader+d.L)
		var wantErr error = werr
		if werr == nil {
			wantCounts = Counts(want, c.cfg)
			if capErr {
				if ce := CheckCapacity(want, c.cfg); ce != nil {
					wantErr = ce
				}
			}
		}
		if !slices.Equal(counts, wantCounts) {
			return fmt.Errorf("capacity error policy %v: counts %v, want %v", capErr, counts, wantCounts)
		}
		if (report[0] != 0) != (wantErr != nil) {
			return fmt.Errorf("capacity error policy %v: report %d, want an error %v", capErr, report[0], wantErr)
		}
		if wantErr != nil {
			lay, gerr := SummaryLayout(report[1:], d)
			if gerr == nil {
				gerr = CheckCapacity(lay, c.cfg)
			}
			if gerr == nil || gerr.Error() != wantErr.Error() {
				return fmt.Errorf("capacity error policy %v: the report's error %v, want %v", capErr, gerr, wantErr)
			}
			// A second failing layout keeps the first report.
			again := slices.Clone(report)
			again[1] = 77
			if _, err := gpulayout.EmulateFinish(d, sum, again, maxPerm, capErr); err != nil {
				return err
			}
			if again[1] != 77 {
				return errors.New("a later layout overwrote the report")
			}
		}
	}
	return nil
}

// TestSummaryCountsOrder: the CUDA layout copies this rank's RecvCount and
// PermutedCount from the summary into the handle's device counts as one
// pair (countsFromSummary), so both must be adjacent in the same order.
func TestSummaryCountsOrder(t *testing.T) {
	if gpulayout.SumPermuted != gpulayout.SumRecv+1 || CountPermuted != CountRecv+1 {
		t.Fatalf("summary words recv %d, permuted %d; device counts recv %d, permuted %d: not one adjacent pair",
			gpulayout.SumRecv, gpulayout.SumPermuted, CountRecv, CountPermuted)
	}
}

// TestLayoutChunk: a column's chunks are 8 tokens for a decode's few
// tokens, 32 from 2048 tokens a rank, and a column has at most 64 chunks
// below that.
func TestLayoutChunk(t *testing.T) {
	for _, c := range []struct{ maxT, want int }{{1, 8}, {128, 8}, {512, 8}, {513, 9}, {1024, 16}, {2048, 32}, {4096, 32}, {32768, 32}} {
		if got := layoutChunk(c.maxT); got != c.want {
			t.Errorf("layoutChunk(%d) = %d, want %d", c.maxT, got, c.want)
		}
		if c.maxT <= 2048 && (c.maxT+layoutChunk(c.maxT)-1)/layoutChunk(c.maxT) > 64 {
			t.Errorf("%d tokens: more than 64 chunks of %d", c.maxT, layoutChunk(c.maxT))
		}
	}
}
