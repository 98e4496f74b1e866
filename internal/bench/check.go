package bench

import (
	"bytes"
	"math"

	"github.com/goep/goep/device"
)

// The checks below compare one rank's outputs with what the reference
// model (internal/reference, DESIGN.md section 2) says they must be, given
// the world's routing, and count the rows that differ. They take the
// layout's tables from the model and make the payload rows they expect one
// at a time with XRow and ScaleRow: one rank checks only its own outputs,
// with no more memory than a few rows beside them.

// Check is the outcome of one check: rows compared and rows wrong.
type Check struct {
	Rows, Wrong int
}

func (c *Check) add(o Check) { c.Rows += o.Rows; c.Wrong += o.Wrong }

// CheckDispatch checks rank d's dispatch output: recvX ([rows, H], rows >=
// n), recvScales ([rows, H/128] fp32 bytes: an fp8 world's, else nil),
// recvIdx ([rows, K]) and recvWeights ([rows, K], or nil if not
// dispatched), of which the first n rows are valid. A row is right when its
// payload, its scales (fp8), its slots and its weights all are. Rows past n
// (capacity mode) must be zero in recvX and recvScales. A nil recvX (the
// fused call, which has none) checks only recvIdx and recvWeights.
func (w *World) CheckDispatch(d int, n int, recvX, recvScales []byte, recvIdx []int32, recvWeights []float32) Check {
	lay := w.model(1).Layout(d)
	rb := w.Hidden * w.DType.Size()
	sb := 4 * w.ScaleCols()
	k := w.TopK
	c := Check{Rows: max(n, lay.RecvCount), Wrong: abs(n - lay.RecvCount)}
	want := make([]byte, rb)
	wantS := make([]byte, sb)
	for i := range min(n, lay.RecvCount) {
		s, t := int(lay.SrcRank[i]), int(lay.SrcToken[i])
		ok := true
		if recvX != nil {
			w.XRow(want, s, t)
			ok = len(recvX) >= (i+1)*rb && bytes.Equal(recvX[i*rb:(i+1)*rb], want)
			if sb > 0 {
				w.ScaleRow(wantS, s, t)
				ok = ok && len(recvScales) >= (i+1)*sb && bytes.Equal(recvScales[i*sb:(i+1)*sb], wantS)
			}
		}
		if ok && len(recvIdx) >= (i+1)*k {
			for j := i * k; j < (i+1)*k; j++ {
				if recvIdx[j] != lay.RecvIdx[j] || (recvWeights != nil && math.Float32bits(recvWeights[j]) != math.Float32bits(lay.RecvWeights[j])) {
					ok = false
				}
			}
		} else {
			ok = false
		}
		if !ok {
			c.Wrong++
		}
	}
	// capacity tail: zero, scales included
	for i := n; i < len(recvX)/rb; i++ {
		c.Rows++
		if !isZero(recvX[i*rb:(i+1)*rb]) || (sb > 0 && (len(recvScales) < (i+1)*sb || !isZero(recvScales[i*sb:(i+1)*sb]))) {
			c.Wrong++
		}
	}
	return c
}

// CheckPermute checks rank d's permuted output: px ([rows, H], rows >= p),
// ps ([rows, H/128] fp32 bytes: an fp8 world's scales, else nil) and pw
// ([rows] or nil), of which the first p rows are valid, segments padded to
// pad rows. Padding rows must be zero, scales included.
func (w *World) CheckPermute(d, pad, p int, px, ps []byte, pw []float32) Check {
	m := w.model(pad)
	lay := m.Layout(d)
	rows, slots := m.PermutedSlots(lay)
	rb := w.Hidden * w.DType.Size()
	sb := 4 * w.ScaleCols()
	c := Check{Rows: max(p, len(rows)), Wrong: abs(p - len(rows))}
	want := make([]byte, rb)
	wantS := make([]byte, sb)
	for q := range min(p, len(rows)) {
		wantW := float32(0)
		if i := rows[q]; i >= 0 {
			s, t := int(lay.SrcRank[i]), int(lay.SrcToken[i])
			w.XRow(want, s, t)
			w.ScaleRow(wantS, s, t)
			wantW = lay.RecvWeights[i*w.TopK+slots[q]]
		} else {
			clear(want)
			clear(wantS)
		}
		ok := len(px) >= (q+1)*rb && bytes.Equal(px[q*rb:(q+1)*rb], want)
		if sb > 0 && (len(ps) < (q+1)*sb || !bytes.Equal(ps[q*sb:(q+1)*sb], wantS)) {
			ok = false
		}
		if pw != nil && (len(pw) <= q || math.Float32bits(pw[q]) != math.Float32bits(wantW)) {
			ok = false
		}
		if !ok {
			c.Wrong++
		}
	}
	return c
}

// CheckCombine checks rank s's combine output out ([T_s, H]) when every
// rank combined its dispatch output unchanged (z = recvX) or, if
// unpermuted, the weighted unpermute of its permuted output unchanged
// (y = px, weights = recvWeights).
//
// Combine sums rows, which fp8 rows never are (a call that combines in an
// fp8 case runs in bf16, Case.CallDType): on an fp8 world every row counts
// as wrong.
func (w *World) CheckCombine(s int, out []byte, unpermuted bool) Check {
	if w.DType == device.FP8E4M3 {
		return Check{Rows: w.Tokens[s], Wrong: w.Tokens[s]}
	}
	m := w.model(1)
	rb := w.Hidden * w.DType.Size()
	c := Check{Rows: w.Tokens[s]}
	x := make([]byte, rb)
	want := make([]byte, rb)
	back := make([][]byte, w.TopK)   // the row each destination returns
	unperm := make([][]byte, w.TopK) // ... when it unpermuted
	for i := range unperm {
		unperm[i] = make([]byte, rb)
	}
	slots := make([][]byte, w.TopK)
	for t := range w.Tokens[s] {
		w.XRow(x, s, t)
		dests := m.Dests(s, t)
		for i, d := range dests {
			back[i] = x
			if !unpermuted {
				continue
			}
			// d permuted x into a segment per slot of its experts, then
			// folded those copies back with the received weights.
			idx, weights := m.RecvRow(d, s, t)
			for k, e := range idx {
				slots[k] = nil
				if e >= 0 {
					slots[k] = x
				}
			}
			back[i] = unperm[i]
			m.UnpermuteRow(back[i], slots, weights)
		}
		m.CombineRow(want, s, dests, back[:len(dests)])
		if len(out) < (t+1)*rb || !bytes.Equal(out[t*rb:(t+1)*rb], want) {
			c.Wrong++
		}
	}
	return c
}

func isZero(b []byte) bool {
	for _, v := range b {
		if v != 0 {
			return false
		}
	}
	return true
}

func abs(x int) int {
	if x < 0 {
		return -x
	}
	return x
}
