package bench

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"testing"

	"github.com/goep/goep/device"
	"github.com/goep/goep/internal/reference"
)

// refWorld is the reference model of the same inputs as w, its payload
// included.
func refWorld(w *World, pad int) *reference.World {
	rw := w.model(pad)
	for r := range w.Ranks {
		x, _, _ := w.Inputs(r)
		rw.X = append(rw.X, x)
		if w.DType == device.FP8E4M3 {
			rw.Scales = append(rw.Scales, w.InputScales(r))
		}
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
				if c := w.CheckDispatch(d, lay.RecvCount, z[d], nil, lay.RecvIdx, lay.RecvWeights); c.Wrong != 0 || c.Rows != lay.RecvCount {
					t.Errorf("rank %d dispatch: %+v, want %d rows, 0 wrong", d, c, lay.RecvCount)
				}
				if c := w.CheckDispatch(d, lay.RecvCount, nil, nil, lay.RecvIdx, lay.RecvWeights); c.Wrong != 0 {
					t.Errorf("rank %d dispatch metadata: %+v", d, c)
				}
				px, pw := ref.DispatchPermute(d)
				y[d], rws[d] = px, lay.RecvWeights
				if c := w.CheckPermute(d, tc.pad, lay.PermutedCount, px, nil, pw); c.Wrong != 0 || c.Rows != lay.PermutedCount {
					t.Errorf("rank %d permute: %+v, want %d rows, 0 wrong", d, c, lay.PermutedCount)
				}
				if lay.RecvCount > 0 {
					bad := append([]byte(nil), z[d]...)
					bad[(lay.RecvCount-1)*rb] ^= 0x40
					if c := w.CheckDispatch(d, lay.RecvCount, bad, nil, lay.RecvIdx, lay.RecvWeights); c.Wrong != 1 {
						t.Errorf("rank %d dispatch with one corrupt row: %d wrong, want 1", d, c.Wrong)
					}
					if c := w.CheckDispatch(d, lay.RecvCount-1, z[d][:(lay.RecvCount-1)*rb], nil, lay.RecvIdx, lay.RecvWeights); c.Wrong != 1 {
						t.Errorf("rank %d dispatch missing a row: %d wrong, want 1", d, c.Wrong)
					}
					badPW := append([]float32(nil), pw...)
					badPW[0] += 1
					if c := w.CheckPermute(d, tc.pad, lay.PermutedCount, px, nil, badPW); c.Wrong != 1 {
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

// TestChecksFP8 feeds the reference model's fp8 outputs (rows moved
// unchanged, with their scales) to the checks: none may be wrong; then
// corrupts one byte of one row, one scale, swaps two rows' scales, drops
// the scales, and writes into capacity tails and padding: the checks must
// count exactly the rows hurt.
func TestChecksFP8(t *testing.T) {
	for _, tc := range []struct {
		ranks, perDomain, experts, topk, hidden, pad int
		tokens                                       []int
	}{
		{4, 4, 8, 2, 128, 1, []int{6, 0, 9, 3}},
		{4, 2, 8, 3, 256, 4, []int{12, 5, 7, 9}},
	} {
		t.Run(fmt.Sprintf("R%d_D%d_E%d_K%d_H%d_pad%d", tc.ranks, tc.perDomain, tc.experts, tc.topk, tc.hidden, tc.pad), func(t *testing.T) {
			w := NewWorld(11, tc.ranks, tc.perDomain, tc.experts, tc.topk, tc.hidden, device.FP8E4M3, tc.tokens)
			ref := refWorld(w, tc.pad)
			if err := ref.Validate(); err != nil {
				t.Fatal(err)
			}
			rb, sb := w.Hidden, 4*w.Hidden/device.FP8ScaleChannels
			if w.ScaleCols()*4 != sb || RowBytes(w.DType, w.Hidden) != rb+sb {
				t.Fatalf("ScaleCols %d, RowBytes %d; want %d scales, %d bytes", w.ScaleCols(), RowBytes(w.DType, w.Hidden), sb/4, rb+sb)
			}
			wrong := func(what string, c Check, want int) {
				t.Helper()
				if c.Wrong != want {
					t.Errorf("%s: %+v, want %d wrong", what, c, want)
				}
			}
			for d := range w.Ranks {
				lay := ref.Layout(d)
				n := lay.RecvCount
				x, s := ref.Dispatch(d), ref.DispatchScales(d)
				if c := w.CheckDispatch(d, n, x, s, lay.RecvIdx, lay.RecvWeights); c.Wrong != 0 || c.Rows != n {
					t.Errorf("rank %d dispatch: %+v, want %d rows, 0 wrong", d, c, n)
				}
				px, pw := ref.DispatchPermute(d)
				ps := ref.PermuteScales(d, s)
				if c := w.CheckPermute(d, tc.pad, lay.PermutedCount, px, ps, pw); c.Wrong != 0 || c.Rows != lay.PermutedCount {
					t.Errorf("rank %d permute: %+v, want %d rows, 0 wrong", d, c, lay.PermutedCount)
				}
				// Capacity tails of zeros are right, a scale in them is not.
				tailX, tailS := append(bytes.Clone(x), make([]byte, 2*rb)...), append(bytes.Clone(s), make([]byte, 2*sb)...)
				if c := w.CheckDispatch(d, n, tailX, tailS, lay.RecvIdx, lay.RecvWeights); c.Wrong != 0 || c.Rows != n+2 {
					t.Errorf("rank %d dispatch with a zero tail of 2 rows: %+v, want %d rows, 0 wrong", d, c, n+2)
				}
				tailS[len(tailS)-1] = 0x3f
				wrong(fmt.Sprintf("rank %d dispatch, a scale in the capacity tail", d), w.CheckDispatch(d, n, tailX, tailS, lay.RecvIdx, lay.RecvWeights), 1)
				if n == 0 {
					continue
				}
				bad := bytes.Clone(x)
				bad[(n-1)*rb+rb/2] ^= 0x01
				wrong(fmt.Sprintf("rank %d dispatch, one fp8 byte flipped", d), w.CheckDispatch(d, n, bad, s, lay.RecvIdx, lay.RecvWeights), 1)
				bad = bytes.Clone(s)
				bad[0] ^= 0x80
				wrong(fmt.Sprintf("rank %d dispatch, one scale's sign flipped", d), w.CheckDispatch(d, n, x, bad, lay.RecvIdx, lay.RecvWeights), 1)
				wrong(fmt.Sprintf("rank %d dispatch without scales", d), w.CheckDispatch(d, n, x, nil, lay.RecvIdx, lay.RecvWeights), n)
				if n >= 2 {
					bad = bytes.Clone(s)
					copy(bad[:sb], s[sb:2*sb])
					copy(bad[sb:2*sb], s[:sb])
					wrong(fmt.Sprintf("rank %d dispatch, two rows' scales swapped", d), w.CheckDispatch(d, n, x, bad, lay.RecvIdx, lay.RecvWeights), 2)
				}
				bad = bytes.Clone(ps)
				bad[len(bad)-1] ^= 0x01
				wrong(fmt.Sprintf("rank %d permute, one scale byte flipped", d), w.CheckPermute(d, tc.pad, lay.PermutedCount, px, bad, pw), 1)
				bad = bytes.Clone(px)
				bad[0] ^= 0x01
				wrong(fmt.Sprintf("rank %d permute, one fp8 byte flipped", d), w.CheckPermute(d, tc.pad, lay.PermutedCount, bad, ps, pw), 1)
				// A padding row's scales must be zero.
				for e, n := range lay.TokensPerExpert {
					if q := lay.ExpertOffsets[e] + n; q < lay.ExpertOffsets[e+1] {
						bad = bytes.Clone(ps)
						bad[q*sb] = 1
						wrong(fmt.Sprintf("rank %d permute, a scale on padding", d), w.CheckPermute(d, tc.pad, lay.PermutedCount, px, bad, pw), 1)
						break
					}
				}
			}
			// fp8 rows are never combined: a check of one fails every row.
			if c := w.CheckCombine(0, nil, false); c.Wrong != w.Tokens[0] {
				t.Errorf("combine of an fp8 world: %+v, want every row wrong", c)
			}
		})
	}
}

// TestPayloadRowsDiffer checks that rows name themselves: no two payload
// rows of a world are equal, for every dtype, nor two scale rows of an fp8
// world.
func TestPayloadRowsDiffer(t *testing.T) {
	for _, dt := range []device.DType{device.BF16, device.FP32, device.FP8E4M3} {
		w := NewWorld(5, 4, 4, 8, 2, 128, dt, []int{50, 50, 50, 50})
		type source struct{ Rank, Token int }
		seen, seenS := map[string]source{}, map[string]source{}
		row, srow := make([]byte, w.Hidden*dt.Size()), make([]byte, 4*w.ScaleCols())
		for s := range w.Ranks {
			for tok := range w.Tokens[s] {
				w.XRow(row, s, tok)
				if prev, ok := seen[string(row)]; ok {
					t.Fatalf("%v: rows %v and %v are equal", dt, prev, source{s, tok})
				}
				seen[string(row)] = source{s, tok}
				if dt != device.FP8E4M3 {
					continue
				}
				w.ScaleRow(srow, s, tok)
				if prev, ok := seenS[string(srow)]; ok {
					t.Fatalf("scale rows %v and %v are equal", prev, source{s, tok})
				}
				seenS[string(srow)] = source{s, tok}
				for j := range w.ScaleCols() {
					if f := math.Float32frombits(binary.LittleEndian.Uint32(srow[4*j:])); !(f >= 1.0/256 && f < 256) {
						t.Fatalf("scale %d of %v is %v, want a normal number in [2^-8, 2^8)", j, source{s, tok}, f)
					}
				}
			}
		}
	}
}
