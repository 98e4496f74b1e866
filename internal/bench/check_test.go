package bench

import (
	"fmt"
	"testing"

	"github.com/goep/goep/device"
	"github.com/goep/goep/internal/reference"
)

// refWorld is the reference model of the same inputs as w.
func refWorld(w *World, pad int) *reference.World {
	rw := &reference.World{
		NumRanks: w.Ranks, NumExperts: w.Experts, TopK: w.TopK, Hidden: w.Hidden,
		RanksPerDomain: w.RanksPerDomain, PadMultiple: pad, DType: w.DType,
	}
	for r := range w.Ranks {
		x, idx, wts := w.Inputs(r)
		rw.TopkIdx = append(rw.TopkIdx, idx)
		rw.X = append(rw.X, x)
		rw.Weights = append(rw.Weights, wts)
	}
	return rw
}

// TestChecksAgainstReference feeds the reference model's outputs (an
// independent reading of DESIGN.md section 2) to the checks: none may be
// wrong; then corrupts one row of each: exactly that row must be.
func TestChecksAgainstReference(t *testing.T) {
	for _, tc := range []struct {
		ranks, perDomain, experts, topk, hidden, pad int
		dt                                           device.DType
		tokens                                       []int
	}{
		{4, 4, 8, 2, 8, 1, device.BF16, []int{6, 0, 9, 3}},
		{4, 2, 8, 3, 16, 4, device.BF16, []int{12, 5, 7, 9}},
		{8, 2, 32, 8, 24, 16, device.BF16, []int{20, 20, 20, 20, 20, 20, 20, 20}},
		{6, 3, 12, 4, 5, 1, device.FP32, []int{3, 8, 1, 0, 4, 7}},
	} {
		t.Run(fmt.Sprintf("R%d_D%d_E%d_K%d_H%d_pad%d_%v", tc.ranks, tc.perDomain, tc.experts, tc.topk, tc.hidden, tc.pad, tc.dt), func(t *testing.T) {
			w := NewWorld(11, tc.ranks, tc.perDomain, tc.experts, tc.topk, tc.hidden, tc.dt, tc.tokens)
			ref := refWorld(w, tc.pad)
			if err := ref.Validate(); err != nil {
				t.Fatal(err)
			}
			rb := w.Hidden * w.DType.Size()
			z := make([][]byte, w.Ranks)
			y := make([][]byte, w.Ranks)
			rws := make([][]float32, w.Ranks)
			for d := range w.Ranks {
				lay := ref.Layout(d)
				z[d] = ref.Dispatch(d)
				if c := w.CheckDispatch(d, lay.RecvCount, z[d], lay.RecvIdx, lay.RecvWeights); c.Wrong != 0 || c.Rows != lay.RecvCount {
					t.Errorf("rank %d dispatch: %+v, want %d rows, 0 wrong", d, c, lay.RecvCount)
				}
				if c := w.CheckDispatch(d, lay.RecvCount, nil, lay.RecvIdx, lay.RecvWeights); c.Wrong != 0 {
					t.Errorf("rank %d dispatch metadata: %+v", d, c)
				}
				px, pw := ref.DispatchPermute(d)
				y[d], rws[d] = px, lay.RecvWeights
				if c := w.CheckPermute(d, tc.pad, lay.PermutedCount, px, pw); c.Wrong != 0 || c.Rows != lay.PermutedCount {
					t.Errorf("rank %d permute: %+v, want %d rows, 0 wrong", d, c, lay.PermutedCount)
				}
				if lay.RecvCount > 0 {
					bad := append([]byte(nil), z[d]...)
					bad[(lay.RecvCount-1)*rb] ^= 0x40
					if c := w.CheckDispatch(d, lay.RecvCount, bad, lay.RecvIdx, lay.RecvWeights); c.Wrong != 1 {
						t.Errorf("rank %d dispatch with one corrupt row: %d wrong, want 1", d, c.Wrong)
					}
					if c := w.CheckDispatch(d, lay.RecvCount-1, z[d][:(lay.RecvCount-1)*rb], lay.RecvIdx, lay.RecvWeights); c.Wrong != 1 {
						t.Errorf("rank %d dispatch missing a row: %d wrong, want 1", d, c.Wrong)
					}
					badPW := append([]float32(nil), pw...)
					badPW[0] += 1
					if c := w.CheckPermute(d, tc.pad, lay.PermutedCount, px, badPW); c.Wrong != 1 {
						t.Errorf("rank %d permute with one wrong weight: %d wrong, want 1", d, c.Wrong)
					}
				}
			}
			out := ref.Combine(z)
			outU := ref.UnpermuteCombine(y, rws)
			for s := range w.Ranks {
				if c := w.CheckCombine(s, out[s], false); c.Wrong != 0 {
					t.Errorf("rank %d combine: %+v", s, c)
				}
				if c := w.CheckCombine(s, outU[s], true); c.Wrong != 0 {
					t.Errorf("rank %d unpermute-combine: %+v", s, c)
				}
				if w.Tokens[s] > 0 {
					bad := append([]byte(nil), out[s]...)
					bad[len(bad)-1] ^= 0x01
					if c := w.CheckCombine(s, bad, false); c.Wrong != 1 {
						t.Errorf("rank %d combine with one corrupt row: %d wrong, want 1", s, c.Wrong)
					}
				}
			}
		})
	}
}

// TestPayloadRowsDiffer checks that rows name themselves: no two payload
// rows of a world are equal.
func TestPayloadRowsDiffer(t *testing.T) {
	w := NewWorld(5, 4, 4, 8, 2, 64, device.BF16, []int{50, 50, 50, 50})
	seen := map[string]Source{}
	row := make([]byte, w.Hidden*2)
	for s := range w.Ranks {
		for tok := range w.Tokens[s] {
			w.XRow(row, s, tok)
			if prev, ok := seen[string(row)]; ok {
				t.Fatalf("rows %v and %v are equal", prev, Source{s, tok})
			}
			seen[string(row)] = Source{s, tok}
		}
	}
}
