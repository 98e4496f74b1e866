package permute

import (
	"github.com/goep/goep/device"
)

// Map is one rank's permutation: slot k of received row i goes to permuted
// row Pos[i*TopK+k] (-1: the slot names no expert of this rank). Rows and
// positions at or past the capacities are dropped. The valid positions are
// distinct, as a layout makes them: where two slots name the same permuted
// row, which of them Permute writes there is unspecified (rows and slots
// run in parallel, on the host and on the GPU).
type Map struct {
	Rows    int     // valid received rows
	TopK    int     // slots per row
	Pos     []int32 // [Rows*TopK]
	RowCap  int     // received-row capacity of the input/output (>= Rows in blocking mode)
	PermCap int     // permuted-row capacity of the permuted tensor
}

// rowGrain is the minimum number of rows a ParallelFor chunk takes.
const rowGrain = 16

// Permute writes the expert-major copy of the received rows:
//
//	for i < Rows, k < TopK:
//		if p := Pos[i*TopK+k]; p >= 0 && p < PermCap {
//			px[p] = x[i]; if pw != nil { pw[p] = w[i*TopK+k] }
//		}
//
// Rows the loop does not write (padding) must be zeroed by ZeroRows.
func Permute(dt device.DType, hidden int, px []byte, pw []float32, x []byte, w []float32, m Map) {
	rb := hidden * dt.Size()
	device.ParallelFor(min(m.Rows, m.RowCap), rowGrain, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			for k := range m.TopK {
				p := int(m.Pos[i*m.TopK+k])
				if p < 0 || p >= m.PermCap {
					continue
				}
				copy(px[p*rb:(p+1)*rb], x[i*rb:(i+1)*rb])
				if pw != nil {
					pw[p] = w[i*m.TopK+k]
				}
			}
		}
	})
}

// ZeroDropped zeroes the permuted rows (and weights) that belong to rows
// dropped for capacity, i >= Rows, so that no output row is left
// unwritten:
//
//	for Rows <= i < len(Pos)/TopK, k < TopK:
//		if p := Pos[i*TopK+k]; p >= 0 && p < PermCap { px[p] = 0; pw[p] = 0 }
func ZeroDropped(px []byte, rowBytes int, pw []float32, m Map) {
	for i := m.Rows * m.TopK; i < len(m.Pos); i++ {
		if p := int(m.Pos[i]); p >= 0 && p < m.PermCap {
			ZeroRows(px, rowBytes, pw, p, p+1)
		}
	}
}

// ZeroRows zeroes rows [lo, hi) of a tensor with rowBytes-byte rows (and the
// matching entries of w, if not nil).
func ZeroRows(b []byte, rowBytes int, w []float32, lo, hi int) {
	if hi <= lo {
		return
	}
	clear(b[lo*rowBytes : hi*rowBytes])
	if w != nil {
		clear(w[lo:hi])
	}
}

// ZeroPadding zeroes the padding of a permuted tensor: for each expert l the
// rows [offsets[l]+counts[l], offsets[l+1]), then the rows past the total up
// to the capacity, all clipped to the capacity.
func ZeroPadding(px []byte, rowBytes int, pw []float32, offsets, counts []int32, capacity int) {
	for l := range counts {
		ZeroRows(px, rowBytes, pw, min(int(offsets[l]+counts[l]), capacity), min(int(offsets[l+1]), capacity))
	}
	ZeroRows(px, rowBytes, pw, min(int(offsets[len(counts)]), capacity), capacity)
}

// Terms is scratch for gathering the rows (and weights) of one sum; reuse
// one per goroutine.
type Terms struct {
	Rows [][]byte
	C    []float32
}

// Reset empties t for a new sum.
func (t *Terms) Reset() {
	t.Rows, t.C = t.Rows[:0], t.C[:0]
}

// UnpermuteRow folds row i back:
//
//	out = round(sum over k in slot order with p = pos[k] in [0, permCap) of
//	      term_k),  term_k = mul(w[k], y[p]) if w != nil, else y[p]
//
// summed in fp32 from the first term (SumRows); a row with no term is
// zero.
func UnpermuteRow(dt device.DType, out []byte, y []byte, pos []int32, w []float32, permCap int, t *Terms) {
	rb := len(out)
	t.Reset()
	for k, p := range pos {
		if p < 0 || int(p) >= permCap {
			continue
		}
		t.Rows = append(t.Rows, y[int(p)*rb:(int(p)+1)*rb])
		if w != nil {
			t.C = append(t.C, w[k])
		}
	}
	c := t.C
	if w == nil {
		c = nil
	}
	SumRows(dt, out, t.Rows, c)
}

// Unpermute applies UnpermuteRow to every valid row i (weights w[i*TopK:],
// if w is not nil) and zeroes the rows past Rows up to RowCap.
func Unpermute(dt device.DType, hidden int, out []byte, y []byte, w []float32, m Map) {
	rb := hidden * dt.Size()
	rows := min(m.Rows, m.RowCap)
	device.ParallelFor(rows, rowGrain, func(lo, hi int) {
		var t Terms
		for i := lo; i < hi; i++ {
			var wi []float32
			if w != nil {
				wi = w[i*m.TopK : (i+1)*m.TopK]
			}
			UnpermuteRow(dt, out[i*rb:(i+1)*rb], y, m.Pos[i*m.TopK:(i+1)*m.TopK], wi, m.PermCap, &t)
		}
	})
	ZeroRows(out, rb, nil, rows, m.RowCap)
}

// PermuteScaled is the backward of a weighted unpermute with respect to y:
//
//	gy[p] = round(float32(c_ik * g[i])) for p = Pos[i*TopK+k] in [0, PermCap)
//
// with c_ik = w[i*TopK+k] (1 when w is nil). Padding must be zeroed
// separately.
func PermuteScaled(dt device.DType, hidden int, gy []byte, g []byte, w []float32, m Map) {
	rb := hidden * dt.Size()
	device.ParallelFor(min(m.Rows, m.RowCap), rowGrain, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			for k := range m.TopK {
				p := int(m.Pos[i*m.TopK+k])
				if p < 0 || p >= m.PermCap {
					continue
				}
				c := float32(1)
				if w != nil {
					c = w[i*m.TopK+k]
				}
				Scale(dt, gy[p*rb:(p+1)*rb], g[i*rb:(i+1)*rb], c)
			}
		}
	})
}

// WeightGrad is the backward of a weighted unpermute with respect to the
// weights: gw[i*TopK+k] = Dot(g[i], y[Pos[i*TopK+k]]), 0 for empty or dropped
// slots and for rows past Rows up to RowCap.
func WeightGrad(dt device.DType, hidden int, gw []float32, g, y []byte, m Map) {
	rb := hidden * dt.Size()
	rows := min(m.Rows, m.RowCap)
	device.ParallelFor(rows, rowGrain, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			for k := range m.TopK {
				p := int(m.Pos[i*m.TopK+k])
				if p < 0 || p >= m.PermCap {
					gw[i*m.TopK+k] = 0
					continue
				}
				gw[i*m.TopK+k] = Dot(dt, g[i*rb:(i+1)*rb], y[p*rb:(p+1)*rb])
			}
		}
	})
	clear(gw[rows*m.TopK : m.RowCap*m.TopK])
}
