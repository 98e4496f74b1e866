package reference

import (
	"math"

	"github.com/goep/goep/device"
)

// Gather returns rank d's received rows of per-rank tensors x ([T_s, H] in
// DType on each rank s): recv[i] = x[s][t] for received row i from (s, t),
// bytes copied unchanged. It is Dispatch of x. In capacity mode rows past
// the valid prefix are zero.
func (w *World) Gather(d int, x [][]byte) []byte { return w.gather(d, x, w.RowBytes()) }

// gather is Gather of rows of rb bytes.
func (w *World) gather(d int, x [][]byte, rb int) []byte {
	lay := w.Layout(d)
	recv := make([]byte, w.RecvRows(lay)*rb)
	for i := range w.validRecv(lay) {
		s, t := int(lay.SrcRank[i]), int(lay.SrcToken[i])
		copy(recv[i*rb:(i+1)*rb], x[s][t*rb:(t+1)*rb])
	}
	return recv
}

// Dispatch returns rank d's recvX [N_d, H]: recvX[i] = X[s][t] for received
// row i from (s, t). RecvIdx and RecvWeights are in Layout(d).
func (w *World) Dispatch(d int) []byte { return w.Gather(d, w.X) }

// Permute returns rank d's expert-major layout of received rows recvX
// [N_d, H]: px [P_d, H] with px[Pos[i][k]] = recvX[i] for every slot with
// RecvIdx[i][k] >= 0, zero rows on padding; and, when recvWeights [N_d, K] is
// not nil, pw [P_d] with pw[Pos[i][k]] = recvWeights[i][k], 0 on padding.
func (w *World) Permute(d int, recvX []byte, recvWeights []float32) (px []byte, pw []float32) {
	return w.permute(d, recvX, w.RowBytes(), recvWeights)
}

// DispatchScales returns rank d's received fp8 scales [N_d, H/128] (fp32
// bytes): the scales of received row i are Scales[s][t] of its source
// (s, t), unchanged; in capacity mode rows past the valid prefix are zero.
func (w *World) DispatchScales(d int) []byte { return w.gather(d, w.Scales, w.ScaleRowBytes()) }

// PermuteScales returns the expert-major layout of received fp8 scales
// [N_d, H/128]: each permuted row's scales beside it, zero on padding, as
// Permute lays out the rows.
func (w *World) PermuteScales(d int, recvScales []byte) []byte {
	ps, _ := w.permute(d, recvScales, w.ScaleRowBytes(), nil)
	return ps
}

// permute is Permute of rows of rb bytes.
func (w *World) permute(d int, recvX []byte, rb int, recvWeights []float32) (px []byte, pw []float32) {
	lay := w.Layout(d)
	rows, slots := w.PermutedSlots(lay)
	px = make([]byte, len(rows)*rb) // zero: padding rows stay zero
	if recvWeights != nil {
		pw = make([]float32, len(rows))
	}
	for p, i := range rows {
		if i < 0 {
			continue
		}
		copy(px[p*rb:(p+1)*rb], recvX[i*rb:(i+1)*rb])
		if pw != nil {
			pw[p] = recvWeights[i*w.TopK+slots[p]]
		}
	}
	return px, pw
}

// DispatchPermute is Permute(d, Dispatch(d), Layout(d).RecvWeights).
func (w *World) DispatchPermute(d int) (px []byte, pw []float32) {
	return w.Permute(d, w.Dispatch(d), w.Layout(d).RecvWeights)
}

// Unpermute folds y [P_d, H] back to received rows: out [N_d, H] with
//
//	out[i][j] = round(term(i, k_1) + term(i, k_2) + ...)
//	term(i, k) = float32(weights[i][k] * y[Pos[i][k]][j])  (weighted)
//	term(i, k) = y[Pos[i][k]][j]                           (unweighted: c = 1)
//
// over the slots k_1 < k_2 < ... with RecvIdx[i][k] >= 0, weights being
// [N_d, K] or nil. Each weighted term is rounded to fp32 (no fused
// multiply-add); an unweighted term is the element itself, not a product by
// 1 (which would quiet a signalling NaN). The sum starts from the first
// term (not from +0, so -0 survives), runs left to right in fp32 and is
// rounded to DType once. A row with no term (in capacity mode: all its
// positions dropped, or the row itself) is zero.
func (w *World) Unpermute(d int, y []byte, weights []float32) []byte {
	lay := w.Layout(d)
	K, rb := w.TopK, w.RowBytes()
	out := make([]byte, w.RecvRows(lay)*rb)
	rows := make([][]byte, K)
	for i := range w.validRecv(lay) {
		for k := range K {
			rows[k] = nil
			if p := w.slotPos(lay, i, k); p >= 0 {
				rows[k] = y[p*rb : (p+1)*rb]
			}
		}
		var wi []float32
		if weights != nil {
			wi = weights[i*K : (i+1)*K]
		}
		w.UnpermuteRow(out[i*rb:(i+1)*rb], rows, wi)
	}
	return out
}

// UnpermuteRow is one row of Unpermute, for callers that hold a row's
// permuted copies but not a rank's whole y: it writes into dst ([H] in
// DType) the fold of rows, where rows[k] ([H] in DType) is the permuted row
// that holds slot k (nil for a slot without one: empty, or its position
// dropped) and weights is the row's [K] weights (nil: unweighted). The
// terms and their order are Unpermute's.
func (w *World) UnpermuteRow(dst []byte, rows [][]byte, weights []float32) {
	for j := range w.Hidden {
		var acc float32
		first := true
		for k, y := range rows {
			if y == nil {
				continue
			}
			term := device.LoadFloat32(w.DType, y, j) // c = 1: the element itself
			if weights != nil {
				term = float32(weights[k] * term)
			}
			if first {
				acc, first = term, false
			} else {
				acc = float32(acc + term)
			}
		}
		device.StoreFloat32(w.DType, dst, j, acc) // acc is +0 when there was no term
	}
}

// Combine sums processed rows back to their sources: given z[d] [N_d, H] on
// every rank d, it returns out[s] [T_s, H] for every source rank s. For
// token t of s, with D = RanksPerDomain and n(r) = r / D:
//
//	p_n = z[d_1][row] + z[d_2][row] + ...  (fp32, starting from the first
//	      term, over the ranks d_1 < d_2 < ... of domain n that t went to)
//	p_n = round(p_n)                        if n != n(s) (crosses domains in
//	                                         DType; a no-op for fp32)
//	out[s][t] = round(p_a + p_b + ...)      (fp32, starting from the first
//	                                         partial, over the domains a < b
//	                                         < ... that t reached)
//
// round is rounding to DType. With one domain this is the fp32 sum over the
// destination ranks in ascending order, rounded once. A token routed nowhere
// gets a zero row.
func (w *World) Combine(z [][]byte) [][]byte {
	rb := w.RowBytes()
	routes := w.Routes()
	out := make([][]byte, w.NumRanks)
	for s := range w.NumRanks {
		out[s] = make([]byte, w.NumTokens(s)*rb)
		for t, rs := range routes[s] {
			dests := make([]int, len(rs))
			rows := make([][]byte, len(rs))
			for i, r := range rs {
				dests[i], rows[i] = r.Rank, z[r.Rank][r.Row*rb:(r.Row+1)*rb]
			}
			w.CombineRow(out[s][t*rb:(t+1)*rb], s, dests, rows)
		}
	}
	return out
}

// CombineRow is one row of Combine, for callers that hold a token's
// returned rows but not every rank's whole z: it writes into dst ([H] in
// DType) the combined row of a token of source rank s from rows[i] ([H] in
// DType), the row that destination rank dests[i] returns, dests ascending.
// The partials per domain and the order of the sums are Combine's; no
// destination gives a zero row.
func (w *World) CombineRow(dst []byte, s int, dests []int, rows [][]byte) {
	dt, D := w.DType, w.ranksPerDomain()
	for j := range w.Hidden {
		var acc float32
		haveAcc := false
		// Domains in ascending order; dests are ascending, so each
		// domain's ranks are contiguous in them.
		for a := 0; a < len(dests); {
			n := dests[a] / D
			b := a
			var part float32
			for ; b < len(dests) && dests[b]/D == n; b++ {
				v := device.LoadFloat32(dt, rows[b], j)
				if b == a {
					part = v
				} else {
					part = float32(part + v)
				}
			}
			if n != s/D {
				part = roundTo(dt, part)
			}
			if !haveAcc {
				acc, haveAcc = part, true
			} else {
				acc = float32(acc + part)
			}
			a = b
		}
		device.StoreFloat32(dt, dst, j, acc) // +0 when routed nowhere
	}
}

// UnpermuteCombine is Combine of Unpermute on every rank: u[d] =
// Unpermute(d, y[d], weights[d]) (rounded to DType), then Combine(u).
// weights may be nil (unweighted) or hold one table per rank.
func (w *World) UnpermuteCombine(y [][]byte, weights [][]float32) [][]byte {
	u := make([][]byte, w.NumRanks)
	for d := range w.NumRanks {
		var wd []float32
		if weights != nil {
			wd = weights[d]
		}
		u[d] = w.Unpermute(d, y[d], wd)
	}
	return w.Combine(u)
}

// DispatchBackward is the gradient of Dispatch: gradX = Combine(gradRecvX),
// and, when gradRecvWeights ([N_d, K] fp32 per rank) is not nil,
//
//	gradTopkWeights[s][t][k] = gradRecvWeights[d][row of (s, t) on d][k]
//
// for d = TopkIdx[s][t][k] / L the rank owning slot k's expert, 0 for an
// empty slot (or a row dropped at d in capacity mode). gradTopkWeights is
// nil when gradRecvWeights is nil.
func (w *World) DispatchBackward(gradRecvX [][]byte, gradRecvWeights [][]float32) (gradX [][]byte, gradTopkWeights [][]float32) {
	gradX = w.Combine(gradRecvX)
	if gradRecvWeights == nil {
		return gradX, nil
	}
	K, L := w.TopK, w.NumLocalExperts()
	routes := w.Routes()
	gradTopkWeights = make([][]float32, w.NumRanks)
	for s := range w.NumRanks {
		gradTopkWeights[s] = make([]float32, w.NumTokens(s)*K)
		for t := range w.NumTokens(s) {
			for k := range K {
				e := w.TopkIdx[s][t*K+k]
				if e < 0 {
					continue
				}
				d := int(e) / L
				for _, r := range routes[s][t] {
					if r.Rank == d {
						gradTopkWeights[s][t*K+k] = gradRecvWeights[d][r.Row*K+k]
					}
				}
			}
		}
	}
	return gradX, gradTopkWeights
}

// CombineBackward is the gradient of Combine on rank d: Dispatch of the
// output gradients, gradZ[i] = gradOut[s][t] for received row i from (s, t).
func (w *World) CombineBackward(d int, gradOut [][]byte) []byte { return w.Gather(d, gradOut) }

// PermuteBackward is the gradient of Permute's rows on rank d: the
// unweighted Unpermute of gradPX [P_d, H] (padding rows ignored).
func (w *World) PermuteBackward(d int, gradPX []byte) []byte { return w.Unpermute(d, gradPX, nil) }

// UnpermuteBackward is the gradient of Unpermute(d, y, weights) given the
// gradient of its output gradOut [N_d, H]:
//
//	gradY[Pos[i][k]][j] = round(float32(weights[i][k] * gradOut[i][j]))  for RecvIdx[i][k] >= 0
//	gradY[Pos[i][k]] = gradOut[i]       (unweighted: c = 1, bytes copied)
//	gradY[p] = 0                                                on padding rows p
//	gradWeights[i][k] = float32(sum_j float64(gradOut[i][j]) * float64(y[Pos[i][k]][j]))
//
// round is rounding to DType; the dot product is accumulated in float64 in element
// order j = 0, 1, ... and rounded to float32 once; gradWeights is 0 for an
// empty (or dropped) slot and nil when weights is nil (an unweighted
// forward).
func (w *World) UnpermuteBackward(d int, gradOut, y []byte, weights []float32) (gradY []byte, gradWeights []float32) {
	lay := w.Layout(d)
	K, H, dt := w.TopK, w.Hidden, w.DType
	gradY = make([]byte, w.PermutedRows(lay)*w.RowBytes())
	if weights != nil {
		gradWeights = make([]float32, w.RecvRows(lay)*K)
	}
	for i := range w.validRecv(lay) {
		for k := range K {
			p := w.slotPos(lay, i, k)
			if p < 0 {
				continue
			}
			rb := w.RowBytes()
			if weights == nil {
				copy(gradY[p*rb:(p+1)*rb], gradOut[i*rb:(i+1)*rb]) // c = 1: pure data movement
				continue
			}
			c := weights[i*K+k]
			var dot float64
			for j := range H {
				g := device.LoadFloat32(dt, gradOut, i*H+j)
				device.StoreFloat32(dt, gradY, p*H+j, float32(c*g))
				dot += float64(g) * float64(device.LoadFloat32(dt, y, p*H+j))
			}
			if gradWeights != nil {
				gradWeights[i*K+k] = float32(dot)
			}
		}
	}
	return gradY, gradWeights
}

// Dot64 is the fp64 inner product of two same-dtype tensors' elements, in
// element order (for adjoint checks such as <Dispatch(x), g> = <x,
// DispatchBackward(g)>).
func Dot64(dt device.DType, a, b []byte) float64 {
	var s float64
	n := len(a) / dt.Size()
	for i := range n {
		s += float64(device.LoadFloat32(dt, a, i)) * float64(device.LoadFloat32(dt, b, i))
	}
	return s
}

// Float32Bits returns the bit patterns of v, for bit-exact comparisons that
// tell -0 from +0 and compare NaNs by payload.
func Float32Bits(v []float32) []uint32 {
	out := make([]uint32, len(v))
	for i, f := range v {
		out[i] = math.Float32bits(f)
	}
	return out
}
