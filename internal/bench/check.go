package bench

import (
	"bytes"
	"math"

	"github.com/goep/goep/device"
)

// The checks below recompute each output straight from DESIGN.md section 2
// and the world's routing, and count the rows that differ. They are written
// for clarity, not speed: one rank checks only its own outputs.

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
	recv := w.Recv(d)
	rb := w.Hidden * w.DType.Size()
	sb := 4 * w.ScaleCols()
	k := w.TopK
	l := w.LocalExperts()
	c := Check{Rows: max(n, len(recv))}
	c.Wrong = abs(n - len(recv))
	want := make([]byte, rb)
	wantS := make([]byte, sb)
	for i := range min(n, len(recv)) {
		src := recv[i]
		ok := true
		if recvX != nil {
			w.XRow(want, src.Rank, src.Token)
			ok = len(recvX) >= (i+1)*rb && bytes.Equal(recvX[i*rb:(i+1)*rb], want)
			if sb > 0 {
				w.ScaleRow(wantS, src.Rank, src.Token)
				ok = ok && len(recvScales) >= (i+1)*sb && bytes.Equal(recvScales[i*sb:(i+1)*sb], wantS)
			}
		}
		if ok && len(recvIdx) >= (i+1)*k {
			for j := range k {
				e := w.Idx[src.Rank][src.Token*k+j]
				wantIdx, wantW := int32(-1), float32(0)
				if e >= 0 && int(e)/l == d {
					wantIdx, wantW = e%int32(l), w.Weight(src.Rank, src.Token, j)
				}
				if recvIdx[i*k+j] != wantIdx || (recvWeights != nil && math.Float32bits(recvWeights[i*k+j]) != math.Float32bits(wantW)) {
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

// PermutedLayout returns, for rank d, the padded segment start of every
// local expert ([L+1], the last being P) and for each local expert the
// received rows (indices in receive order) that chose it, with their slots.
func (w *World) PermutedLayout(d, pad int) (offsets []int, rows [][]int, slots [][]int) {
	recv := w.Recv(d)
	l := w.LocalExperts()
	rows = make([][]int, l)
	slots = make([][]int, l)
	for i, src := range recv {
		for j, e := range w.Idx[src.Rank][src.Token*w.TopK : (src.Token+1)*w.TopK] {
			if e >= 0 && int(e)/l == d {
				le := int(e) % l
				rows[le] = append(rows[le], i)
				slots[le] = append(slots[le], j)
			}
		}
	}
	offsets = make([]int, l+1)
	for e := range l {
		n := len(rows[e])
		offsets[e+1] = offsets[e] + (n+pad-1)/pad*pad
	}
	return offsets, rows, slots
}

// CheckPermute checks rank d's permuted output: px ([rows, H], rows >= p),
// ps ([rows, H/128] fp32 bytes: an fp8 world's scales, else nil) and pw
// ([rows] or nil), of which the first p rows are valid. Padding rows must
// be zero, scales included.
func (w *World) CheckPermute(d, pad, p int, px, ps []byte, pw []float32) Check {
	recv := w.Recv(d)
	offsets, rows, slots := w.PermutedLayout(d, pad)
	rb := w.Hidden * w.DType.Size()
	sb := 4 * w.ScaleCols()
	total := offsets[len(offsets)-1]
	c := Check{Rows: max(p, total), Wrong: abs(p - total)}
	want := make([]byte, rb)
	wantS := make([]byte, sb)
	for e := range rows {
		for q := offsets[e]; q < offsets[e+1]; q++ {
			if q >= p {
				break
			}
			wantW := float32(0)
			if j := q - offsets[e]; j < len(rows[e]) {
				src := recv[rows[e][j]]
				w.XRow(want, src.Rank, src.Token)
				w.ScaleRow(wantS, src.Rank, src.Token)
				wantW = w.Weight(src.Rank, src.Token, slots[e][j])
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
	rb := w.Hidden * w.DType.Size()
	l := w.LocalExperts()
	k := w.TopK
	dt := w.DType
	c := Check{Rows: w.Tokens[s]}
	xrow := make([]byte, rb)
	want := make([]byte, rb)
	var dests []int
	terms := make([]float32, 0, k)
	wk := make([]float32, k)
	for t := range w.Tokens[s] {
		dests = w.Dests(s, t, dests)
		w.XRow(xrow, s, t)
		slotsIdx := w.Idx[s][t*k : (t+1)*k]
		for q := range k {
			wk[q] = w.Weight(s, t, q)
		}
		for j := range w.Hidden {
			x := device.LoadFloat32(dt, xrow, j)
			terms = terms[:0]
			for _, d := range dests {
				if !unpermuted {
					terms = append(terms, x)
					continue
				}
				// unpermute on d: weighted terms rounded to fp32, summed
				// in slot order, rounded to the dtype once
				var acc float32
				first := true
				for q, e := range slotsIdx {
					if e >= 0 && int(e)/l == d {
						p := float32(wk[q] * x)
						if first {
							acc, first = p, false
						} else {
							acc = float32(acc + p)
						}
					}
				}
				terms = append(terms, round(dt, acc))
			}
			device.StoreFloat32(dt, want, j, w.combineSum(s, dests, terms))
		}
		if len(out) < (t+1)*rb || !bytes.Equal(out[t*rb:(t+1)*rb], want) {
			c.Wrong++
		}
	}
	return c
}

// combineSum adds the terms of destination ranks dests (ascending) for a
// token of rank s: an fp32 partial per domain, rounded to the dtype when it
// crosses domains, then the partials in domain order in fp32. A sum of one
// term is that term (a -0 stays -0).
func (w *World) combineSum(s int, dests []int, terms []float32) float32 {
	dsize := w.RanksPerDomain
	home := s / dsize
	var total float32
	haveTotal := false
	for a := 0; a < len(dests); {
		dom := dests[a] / dsize
		part := terms[a]
		b := a + 1
		for ; b < len(dests) && dests[b]/dsize == dom; b++ {
			part = float32(part + terms[b])
		}
		if dom != home {
			part = round(w.DType, part)
		}
		if haveTotal {
			total = float32(total + part)
		} else {
			total, haveTotal = part, true
		}
		a = b
	}
	return total
}

// round rounds f to dt and back.
func round(dt device.DType, f float32) float32 {
	if dt == device.BF16 {
		return device.BF16ToFloat32(device.Float32ToBF16(f))
	}
	return f
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
