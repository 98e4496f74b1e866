package reference

import (
	"math"
	"slices"
	"testing"

	"github.com/goep/goep/device"
)

// The tiny example of docs/EXAMPLE.md: R=4, E=8 (L=2), K=2, H=2, ragged
// tokens (rank 2 has none), token (0, 2) routed nowhere, token (3, 0) sent
// once to rank 2 for both of its experts. Every expected table below is
// written out by hand from DESIGN.md section 2, not computed by the code
// under test; docs/EXAMPLE.md has the same tables with the working.
//
// Experts: 0,1 on rank 0; 2,3 on rank 1; 4,5 on rank 2; 6,7 on rank 3.
// Token (s, t) carries x = [10s+t, 100+10s+t].

func exampleWorld(dt device.DType, pad int) *World {
	idx := [][]int32{
		{1, 4, 5, 2, -1, -1}, // rank 0: t0 -> 1,4; t1 -> 5,2; t2 -> nowhere
		{3, 0, -1, 7},        // rank 1: t0 -> 3,0; t1 -> 7
		{},                   // rank 2: no tokens
		{4, 5, 2, 1, 6, 0},   // rank 3: t0 -> 4,5; t1 -> 2,1; t2 -> 6,0
	}
	weights := [][]float32{
		{0.75, 0.25, 0.5, 0.5, 0.125, 0.125},
		{0.625, 0.375, 0.0625, 0.9375},
		{},
		{0.5, 0.5, 0.25, 0.75, 0.875, 0.125},
	}
	x := make([][]byte, 4)
	for s, r := range idx {
		var v []float32
		for t := range len(r) / 2 {
			v = append(v, float32(10*s+t), float32(100+10*s+t))
		}
		x[s] = device.EncodeFloat32(dt, v)
	}
	return &World{NumRanks: 4, NumExperts: 8, TopK: 2, Hidden: 2, PadMultiple: pad,
		DType: dt, TopkIdx: idx, X: x, Weights: weights}
}

// rows builds a [n, 2] tensor from pairs.
func rows(dt device.DType, pairs ...[2]float32) []byte {
	var v []float32
	for _, p := range pairs {
		v = append(v, p[0], p[1])
	}
	return device.EncodeFloat32(dt, v)
}

var zero = [2]float32{0, 0}

func checkBytes(t *testing.T, what string, dt device.DType, got, want []byte) {
	t.Helper()
	if len(got) != len(want) {
		t.Errorf("%s: %d bytes, want %d (got %v, want %v)", what, len(got), len(want), device.DecodeFloat32(dt, got), device.DecodeFloat32(dt, want))
		return
	}
	g, w := device.DecodeFloat32(dt, got), device.DecodeFloat32(dt, want)
	for i := range g {
		if math.Float32bits(g[i]) != math.Float32bits(w[i]) {
			t.Errorf("%s: element %d (row %d col %d) = %v, want %v\n got  %v\n want %v", what, i, i/2, i%2, g[i], w[i], g, w)
			return
		}
	}
}

func checkFloats(t *testing.T, what string, got, want []float32) {
	t.Helper()
	if !slices.Equal(Float32Bits(got), Float32Bits(want)) {
		t.Errorf("%s = %v, want %v", what, got, want)
	}
}

func TestExampleLayout(t *testing.T) {
	type want struct {
		src      [][2]int32
		recvIdx  []int32
		recvW    []float32
		tpe      []int
		offsets1 []int
		pos1     []int32
		offsets4 []int
		pos4     []int32
	}
	wants := []want{
		{ // rank 0 (experts 0, 1)
			src:      [][2]int32{{0, 0}, {1, 0}, {3, 1}, {3, 2}},
			recvIdx:  []int32{1, -1, -1, 0, -1, 1, -1, 0},
			recvW:    []float32{0.75, 0, 0, 0.375, 0, 0.75, 0, 0.125},
			tpe:      []int{2, 2},
			offsets1: []int{0, 2, 4},
			pos1:     []int32{2, -1, -1, 0, -1, 3, -1, 1},
			offsets4: []int{0, 4, 8},
			pos4:     []int32{4, -1, -1, 0, -1, 5, -1, 1},
		},
		{ // rank 1 (experts 2, 3)
			src:      [][2]int32{{0, 1}, {1, 0}, {3, 1}},
			recvIdx:  []int32{-1, 0, 1, -1, 0, -1},
			recvW:    []float32{0, 0.5, 0.625, 0, 0.25, 0},
			tpe:      []int{2, 1},
			offsets1: []int{0, 2, 3},
			pos1:     []int32{-1, 0, 2, -1, 1, -1},
			offsets4: []int{0, 4, 8},
			pos4:     []int32{-1, 0, 4, -1, 1, -1},
		},
		{ // rank 2 (experts 4, 5)
			src:      [][2]int32{{0, 0}, {0, 1}, {3, 0}},
			recvIdx:  []int32{-1, 0, 1, -1, 0, 1},
			recvW:    []float32{0, 0.25, 0.5, 0, 0.5, 0.5},
			tpe:      []int{2, 2},
			offsets1: []int{0, 2, 4},
			pos1:     []int32{-1, 0, 2, -1, 1, 3},
			offsets4: []int{0, 4, 8},
			pos4:     []int32{-1, 0, 4, -1, 1, 5},
		},
		{ // rank 3 (experts 6, 7)
			src:      [][2]int32{{1, 1}, {3, 2}},
			recvIdx:  []int32{-1, 1, 0, -1},
			recvW:    []float32{0, 0.9375, 0.875, 0},
			tpe:      []int{1, 1},
			offsets1: []int{0, 1, 2},
			pos1:     []int32{-1, 1, 0, -1},
			offsets4: []int{0, 4, 8},
			pos4:     []int32{-1, 4, 0, -1},
		},
	}
	for _, pad := range []int{1, 4} {
		w := exampleWorld(device.FP32, pad)
		if err := w.Validate(); err != nil {
			t.Fatal(err)
		}
		for d, want := range wants {
			lay := w.Layout(d)
			var src [][2]int32
			for i := range lay.RecvCount {
				src = append(src, [2]int32{lay.SrcRank[i], lay.SrcToken[i]})
			}
			offsets, pos := want.offsets1, want.pos1
			if pad == 4 {
				offsets, pos = want.offsets4, want.pos4
			}
			switch {
			case lay.RecvCount != len(want.src) || !slices.Equal(src, want.src):
				t.Errorf("pad %d rank %d: sources %v, want %v", pad, d, src, want.src)
			case !slices.Equal(lay.RecvIdx, want.recvIdx):
				t.Errorf("pad %d rank %d: RecvIdx %v, want %v", pad, d, lay.RecvIdx, want.recvIdx)
			case !slices.Equal(lay.RecvWeights, want.recvW):
				t.Errorf("pad %d rank %d: RecvWeights %v, want %v", pad, d, lay.RecvWeights, want.recvW)
			case !slices.Equal(lay.TokensPerExpert, want.tpe):
				t.Errorf("pad %d rank %d: TokensPerExpert %v, want %v", pad, d, lay.TokensPerExpert, want.tpe)
			case !slices.Equal(lay.ExpertOffsets, offsets) || lay.PermutedCount != offsets[2]:
				t.Errorf("pad %d rank %d: ExpertOffsets %v P %d, want %v", pad, d, lay.ExpertOffsets, lay.PermutedCount, offsets)
			case !slices.Equal(lay.Pos, pos):
				t.Errorf("pad %d rank %d: Pos %v, want %v", pad, d, lay.Pos, pos)
			}
		}
	}
}

// TestExampleRows checks the row-at-a-time forms on the example: Dests and
// PermutedSlots against the tables by hand, RecvRow against the layout it
// is one row of. (UnpermuteRow and CombineRow are what Unpermute and
// Combine run, row by row.)
func TestExampleRows(t *testing.T) {
	dests := [][][]int{
		{{0, 2}, {1, 2}, nil}, // rank 0: experts 1,4; 5,2; nowhere
		{{0, 1}, {3}},         // rank 1: experts 3,0; 7
		{},                    // rank 2: no tokens
		{{2}, {0, 1}, {0, 3}}, // rank 3: experts 4,5 (one rank, once); 2,1; 6,0
	}
	w := exampleWorld(device.BF16, 4)
	for s := range w.NumRanks {
		for tok := range w.NumTokens(s) {
			if got := w.Dests(s, tok); !slices.Equal(got, dests[s][tok]) {
				t.Errorf("Dests(%d, %d) = %v, want %v", s, tok, got, dests[s][tok])
			}
		}
	}
	K := w.TopK
	for d := range w.NumRanks {
		lay := w.Layout(d)
		row := map[[2]int32]int{} // received row of each source (s, t)
		for i := range lay.RecvCount {
			row[[2]int32{lay.SrcRank[i], lay.SrcToken[i]}] = i
		}
		for s := range w.NumRanks {
			for tok := range w.NumTokens(s) {
				idx, weights := w.RecvRow(d, s, tok)
				i, received := row[[2]int32{int32(s), int32(tok)}]
				if !received {
					if idx != nil || weights != nil {
						t.Errorf("RecvRow(%d, %d, %d) = %v, %v; rank %d does not receive it", d, s, tok, idx, weights, d)
					}
					continue
				}
				if !slices.Equal(idx, lay.RecvIdx[i*K:(i+1)*K]) || !slices.Equal(weights, lay.RecvWeights[i*K:(i+1)*K]) {
					t.Errorf("RecvRow(%d, %d, %d) = %v, %v; want row %d of the layout: %v, %v", d, s, tok, idx, weights, i, lay.RecvIdx[i*K:(i+1)*K], lay.RecvWeights[i*K:(i+1)*K])
				}
			}
		}
	}
	// Rank 0 with pad 4 (TestExampleLayout): Pos = [4 -1; -1 0; -1 5; -1 1],
	// so P = 8 rows: 0 and 1 hold slot 1 of rows 1 and 3, 4 and 5 slot 0 of
	// row 0 and slot 1 of row 2, the rest are padding.
	rows, slots := w.PermutedSlots(w.Layout(0))
	if want := []int{1, 3, -1, -1, 0, 2, -1, -1}; !slices.Equal(rows, want) {
		t.Errorf("PermutedSlots of rank 0: rows %v, want %v", rows, want)
	}
	if want := []int{1, 1, -1, -1, 0, 1, -1, -1}; !slices.Equal(slots, want) {
		t.Errorf("PermutedSlots of rank 0: slots %v, want %v", slots, want)
	}
}

func TestExampleDispatchPermute(t *testing.T) {
	recvX := [][][2]float32{
		{{0, 100}, {10, 110}, {31, 131}, {32, 132}},
		{{1, 101}, {10, 110}, {31, 131}},
		{{0, 100}, {1, 101}, {30, 130}},
		{{11, 111}, {32, 132}},
	}
	px1 := [][][2]float32{
		{{10, 110}, {32, 132}, {0, 100}, {31, 131}},
		{{1, 101}, {31, 131}, {10, 110}},
		{{0, 100}, {30, 130}, {1, 101}, {30, 130}},
		{{32, 132}, {11, 111}},
	}
	pw1 := [][]float32{
		{0.375, 0.125, 0.75, 0.75},
		{0.5, 0.25, 0.625},
		{0.25, 0.5, 0.5, 0.5},
		{0.875, 0.9375},
	}
	px4 := [][][2]float32{
		{{10, 110}, {32, 132}, zero, zero, {0, 100}, {31, 131}, zero, zero},
		{{1, 101}, {31, 131}, zero, zero, {10, 110}, zero, zero, zero},
		{{0, 100}, {30, 130}, zero, zero, {1, 101}, {30, 130}, zero, zero},
		{{32, 132}, zero, zero, zero, {11, 111}, zero, zero, zero},
	}
	pw4 := [][]float32{
		{0.375, 0.125, 0, 0, 0.75, 0.75, 0, 0},
		{0.5, 0.25, 0, 0, 0.625, 0, 0, 0},
		{0.25, 0.5, 0, 0, 0.5, 0.5, 0, 0},
		{0.875, 0, 0, 0, 0.9375, 0, 0, 0},
	}
	for _, dt := range []device.DType{device.FP32, device.BF16} {
		for _, pad := range []int{1, 4} {
			w := exampleWorld(dt, pad)
			px, pw := px1, pw1
			if pad == 4 {
				px, pw = px4, pw4
			}
			for d := range 4 {
				checkBytes(t, "Dispatch", dt, w.Dispatch(d), rows(dt, recvX[d]...))
				gx, gw := w.Permute(d, w.Dispatch(d), w.Layout(d).RecvWeights)
				checkBytes(t, "Permute", dt, gx, rows(dt, px[d]...))
				checkFloats(t, "Permute weights", gw, pw[d])
				fx, fw := w.DispatchPermute(d)
				checkBytes(t, "DispatchPermute", dt, fx, rows(dt, px[d]...))
				checkFloats(t, "DispatchPermute weights", fw, pw[d])
				if _, nw := w.Permute(d, w.Dispatch(d), nil); nw != nil {
					t.Errorf("unweighted Permute returned weights %v", nw)
				}
			}
		}
	}
}

func TestExampleUnpermuteCombine(t *testing.T) {
	// With y = px, the weighted Unpermute gives each row the sum of its
	// local slots' weights times its x.
	unperm := [][][2]float32{
		{{0, 75}, {3.75, 41.25}, {23.25, 98.25}, {4, 16.5}},
		{{0.5, 50.5}, {6.25, 68.75}, {7.75, 32.75}},
		{{0, 25}, {0.5, 50.5}, {30, 130}},
		{{10.3125, 104.0625}, {28, 115.5}},
	}
	// Combine of those: the weights of each token sum to 1 except for the
	// empty slots of (0, 2) (routed nowhere: zero row) and (1, 1) (slot 0
	// empty: 0.9375 x).
	combined := [][][2]float32{
		{{0, 100}, {1, 101}, zero},
		{{10, 110}, {10.3125, 104.0625}},
		{},
		{{30, 130}, {31, 131}, {32, 132}},
	}
	// Unweighted Combine of the received rows: x times its number of
	// destination ranks.
	combinedRecv := [][][2]float32{
		{{0, 200}, {2, 202}, zero},
		{{20, 220}, {11, 111}},
		{},
		{{30, 130}, {62, 262}, {64, 264}},
	}
	for _, pad := range []int{1, 4} {
		dt := device.FP32
		w := exampleWorld(dt, pad)
		y := make([][]byte, 4)
		u := make([][]byte, 4)
		recv := make([][]byte, 4)
		rw := make([][]float32, 4)
		for d := range 4 {
			y[d], _ = w.DispatchPermute(d)
			rw[d] = w.Layout(d).RecvWeights
			u[d] = w.Unpermute(d, y[d], rw[d])
			recv[d] = w.Dispatch(d)
			checkBytes(t, "Unpermute", dt, u[d], rows(dt, unperm[d]...))
			// Unweighted Unpermute of the permuted rows: x times the number
			// of local slots (2 for row 2 of rank 2, else 1).
			want := recv[d]
			if d == 2 {
				want = rows(dt, [2]float32{0, 100}, [2]float32{1, 101}, [2]float32{60, 260})
			}
			checkBytes(t, "unweighted Unpermute", dt, w.Unpermute(d, y[d], nil), want)
			checkBytes(t, "PermuteBackward", dt, w.PermuteBackward(d, y[d]), want)
		}
		for s, out := range w.Combine(u) {
			checkBytes(t, "Combine", dt, out, rows(dt, combined[s]...))
		}
		for s, out := range w.UnpermuteCombine(y, rw) {
			checkBytes(t, "UnpermuteCombine", dt, out, rows(dt, combined[s]...))
		}
		for s, out := range w.Combine(recv) {
			checkBytes(t, "Combine(Dispatch)", dt, out, rows(dt, combinedRecv[s]...))
		}
	}
}

func TestExampleBackward(t *testing.T) {
	dt := device.FP32
	w := exampleWorld(dt, 4)
	recv := make([][]byte, 4)
	rw := make([][]float32, 4)
	for d := range 4 {
		recv[d] = w.Dispatch(d)
		rw[d] = w.Layout(d).RecvWeights
		// CombineBackward is Dispatch of the output gradient.
		checkBytes(t, "CombineBackward", dt, w.CombineBackward(d, w.X), recv[d])
	}
	gx, gw := w.DispatchBackward(recv, rw)
	combinedRecv := [][][2]float32{
		{{0, 200}, {2, 202}, zero},
		{{20, 220}, {11, 111}},
		{},
		{{30, 130}, {62, 262}, {64, 264}},
	}
	// Each slot's gradient comes back from the rank owning its expert; with
	// gradRecvWeights = recvWeights that is the slot's own weight, and 0 on
	// empty slots.
	wantGW := [][]float32{
		{0.75, 0.25, 0.5, 0.5, 0, 0},
		{0.625, 0.375, 0, 0.9375},
		{},
		{0.5, 0.5, 0.25, 0.75, 0.875, 0.125},
	}
	for s := range 4 {
		checkBytes(t, "DispatchBackward gradX", dt, gx[s], rows(dt, combinedRecv[s]...))
		checkFloats(t, "DispatchBackward gradTopkWeights", gw[s], wantGW[s])
	}
	if _, nw := w.DispatchBackward(recv, nil); nw != nil {
		t.Errorf("DispatchBackward without weight gradients returned %v", nw)
	}

	// UnpermuteBackward on rank 2 (pad 4) with gradOut = ones: gradY is each
	// slot's weight at its position, gradWeights the sum of the row at that
	// position.
	ones := rows(dt, [2]float32{1, 1}, [2]float32{1, 1}, [2]float32{1, 1})
	y, _ := w.DispatchPermute(2)
	gy, gwt := w.UnpermuteBackward(2, ones, y, rw[2])
	q, h := [2]float32{0.25, 0.25}, [2]float32{0.5, 0.5}
	checkBytes(t, "UnpermuteBackward gradY", dt, gy, rows(dt, q, h, zero, zero, h, h, zero, zero))
	checkFloats(t, "UnpermuteBackward gradWeights", gwt, []float32{0, 100, 102, 0, 160, 160})
	gy, gwt = w.UnpermuteBackward(2, ones, y, nil)
	o := [2]float32{1, 1}
	checkBytes(t, "unweighted UnpermuteBackward gradY", dt, gy, rows(dt, o, o, zero, zero, o, o, zero, zero))
	if gwt != nil {
		t.Errorf("unweighted UnpermuteBackward returned weight gradients %v", gwt)
	}
}

// TestRounding checks the summation orders on bf16 values chosen so that
// rounding once, rounding per step, and rounding per domain differ.
func TestRounding(t *testing.T) {
	const eps = 1.0 / 256 // 2^-8: half an ulp of bf16 at 1
	negZero := float32(math.Copysign(0, -1))
	bf := device.BF16

	// Unpermute on one rank: a token choosing all three experts, weighted
	// terms 1, 2^-8, 2^-8. fp32 sum 1 + 2^-7 is a bf16 value; rounding per
	// step would give 1 (1 + 2^-8 is a tie, to even).
	w := &World{NumRanks: 1, NumExperts: 3, TopK: 3, Hidden: 2, DType: bf,
		TopkIdx: [][]int32{{0, 1, 2, 2, -1, 0}}}
	if err := w.Validate(); err != nil {
		t.Fatal(err)
	}
	// Pos: token 0 -> 0, 2, 3 (expert 2's segment is rows 3..4); token 1 -> 4, -, 1.
	y := rows(bf, [2]float32{1, negZero}, [2]float32{negZero, 5}, [2]float32{2 * eps, negZero}, [2]float32{2 * eps, negZero}, [2]float32{negZero, 7})
	got := w.Unpermute(0, y, []float32{1, 0.5, 0.5, 0.25, 0.125, 0.5})
	checkBytes(t, "weighted bf16 Unpermute", bf, got, rows(bf, [2]float32{1 + 2*eps, negZero}, [2]float32{negZero, 4.25}))

	// Combine across domains: R=4, D=2, E=4 (L=1), K=3. Rank 2 (domain 1)
	// sends token 0 to ranks 0, 1 (domain 0) and 2, token 1 to ranks 0, 1.
	w = &World{NumRanks: 4, NumExperts: 4, TopK: 3, Hidden: 2, DType: bf,
		TopkIdx: [][]int32{{}, {}, {0, 1, 2, 1, -1, 0}, {}}}
	if err := w.Validate(); err != nil {
		t.Fatal(err)
	}
	z := [][]byte{
		rows(bf, [2]float32{1, eps}, [2]float32{negZero, 3}),
		rows(bf, [2]float32{eps, eps}, [2]float32{negZero, eps}),
		rows(bf, [2]float32{eps, 1}),
		{},
	}
	// One domain: fp32 sums rounded once.
	want := rows(bf, [2]float32{1 + 2*eps, 1 + 2*eps}, [2]float32{negZero, 3})
	checkBytes(t, "one-domain Combine", bf, w.Combine(z)[2], want)
	// Two domains: domain 0's partial is remote for rank 2 and rounded to
	// bf16 (1 + 2^-8 -> 1; 2^-8 + 2^-8 = 2^-7 stays; 3 + 2^-8 -> 3), then
	// domain 1's partial is added: 1 + 2^-8 -> 1, 2^-7 + 1 = 1 + 2^-7.
	w.RanksPerDomain = 2
	want = rows(bf, [2]float32{1, 1 + 2*eps}, [2]float32{negZero, 3})
	checkBytes(t, "two-domain Combine", bf, w.Combine(z)[2], want)
	// fp32 keeps the fp32 partials: the same as one domain here.
	w.DType = device.FP32
	z32 := make([][]byte, 4)
	for d := range z {
		z32[d] = device.EncodeFloat32(device.FP32, device.DecodeFloat32(bf, z[d]))
	}
	want = rows(device.FP32, [2]float32{1 + 2*eps, 1 + 2*eps}, [2]float32{negZero, 3 + eps})
	checkBytes(t, "two-domain fp32 Combine", device.FP32, w.Combine(z32)[2], want)
}

func TestValidate(t *testing.T) {
	good := func() *World { return exampleWorld(device.BF16, 1) }
	if err := good().Validate(); err != nil {
		t.Fatalf("example: %v", err)
	}
	tests := []struct {
		name string
		edit func(w *World)
	}{
		{"expert out of range", func(w *World) { w.TopkIdx[1][0] = 8 }},
		{"index below -1", func(w *World) { w.TopkIdx[1][0] = -2 }},
		{"repeated expert", func(w *World) { w.TopkIdx[3][3] = 2 }},
		{"ragged routing", func(w *World) { w.TopkIdx[1] = w.TopkIdx[1][:3] }},
		{"missing rank", func(w *World) { w.TopkIdx = w.TopkIdx[:3] }},
		{"experts not a multiple of ranks", func(w *World) { w.NumExperts = 6 }},
		{"TopK above experts", func(w *World) { w.TopK = 9 }},
		{"bad dtype", func(w *World) { w.DType = device.Int32 }},
		{"short x", func(w *World) { w.X[0] = w.X[0][:4] }},
		{"short weights", func(w *World) { w.Weights[3] = w.Weights[3][:5] }},
		{"domain size", func(w *World) { w.RanksPerDomain = 3 }},
	}
	for _, tc := range tests {
		w := good()
		tc.edit(w)
		if err := w.Validate(); err == nil {
			t.Errorf("%s: Validate accepted it", tc.name)
		}
	}
}

// TestExampleCapacityDrop runs the example in capacity mode with the Drop
// policy, MaxRecvTokens 3 and MaxPermutedTokens 5 (PadMultiple 4): rank 0
// keeps rows 0..2 of its 4 (row 3, from (3, 2), is dropped) and drops
// position 5 (row 2's slot 1); rank 2 drops position 5 (row 2's slot 1).
func TestExampleCapacityDrop(t *testing.T) {
	dt := device.FP32
	w := exampleWorld(dt, 4)
	w.MaxRecvTokens, w.MaxPermutedTokens = 3, 5
	if err := w.Validate(); err != nil {
		t.Fatal(err)
	}
	recvX := [][][2]float32{
		{{0, 100}, {10, 110}, {31, 131}},
		{{1, 101}, {10, 110}, {31, 131}},
		{{0, 100}, {1, 101}, {30, 130}},
		{{11, 111}, {32, 132}, zero},
	}
	px := [][][2]float32{
		{{10, 110}, zero, zero, zero, {0, 100}},
		{{1, 101}, {31, 131}, zero, zero, {10, 110}},
		{{0, 100}, {30, 130}, zero, zero, {1, 101}},
		{{32, 132}, zero, zero, zero, {11, 111}},
	}
	unperm := [][][2]float32{
		{{0, 75}, {3.75, 41.25}, zero},
		{{0.5, 50.5}, {6.25, 68.75}, {7.75, 32.75}},
		{{0, 25}, {0.5, 50.5}, {15, 65}},
		{{10.3125, 104.0625}, {28, 115.5}, zero},
	}
	combined := [][][2]float32{
		{{0, 100}, {1, 101}, zero},
		{{10, 110}, {10.3125, 104.0625}},
		{},
		{{15, 65}, {7.75, 32.75}, {28, 115.5}},
	}
	y := make([][]byte, 4)
	rw := make([][]float32, 4)
	for d := range 4 {
		lay := w.Layout(d)
		// The received weights as capacity mode delivers them: 3 rows.
		rw[d] = make([]float32, 3*2)
		copy(rw[d], lay.RecvWeights)
		checkBytes(t, "capacity Dispatch", dt, w.Dispatch(d), rows(dt, recvX[d]...))
		y[d], _ = w.Permute(d, w.Dispatch(d), rw[d])
		checkBytes(t, "capacity Permute", dt, y[d], rows(dt, px[d]...))
		checkBytes(t, "capacity Unpermute", dt, w.Unpermute(d, y[d], rw[d]), rows(dt, unperm[d]...))
	}
	for s, out := range w.UnpermuteCombine(y, rw) {
		checkBytes(t, "capacity UnpermuteCombine", dt, out, rows(dt, combined[s]...))
	}
}
