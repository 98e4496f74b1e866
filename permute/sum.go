package permute

import (
	"github.com/goep/goep/device"
)

// SumRows writes the rounded fp32 sum of rows into dst, in row order,
// starting from the first term:
//
//	for j := range dst {
//		acc := term(0, j)
//		for i := 1; i < len(rows); i++ { acc = add(acc, term(i, j)) }
//		dst[j] = round_dt(acc)
//	}
//
// with term(i, j) = x_i[j] (c == nil) or mul(c[i], x_i[j]), x widened
// exactly to fp32; with no rows dst is zero. It is the one-pass form of
// Accumulate over the rows followed by Store, bit for bit, reading every row
// once and writing dst once (in assembly on amd64 with AVX2 and on arm64,
// several rows are streamed at a time, which keeps more memory reads in
// flight). add and mul are the
// rounded fp32 operations of rows.go; no fused multiply-add. Every row is
// at least as long as dst.
func SumRows(dt device.DType, dst []byte, rows [][]byte, c []float32) {
	n := len(dst) / dt.Size()
	done := 0
	if useAsm && len(rows) > 0 {
		done = sumRowsAsm(dt, dst, rows, c, n)
	}
	sumRowsGo(dt, dst, rows, c, done, n)
}

// maxSumRows is the most rows the assembly sums in one call; longer lists
// (more destinations or slots than this) take the reference loop.
const maxSumRows = 64

// sumRowsGo is the reference loop of SumRows over elements [lo, hi).
func sumRowsGo(dt device.DType, dst []byte, rows [][]byte, c []float32, lo, hi int) {
	term := func(i, j int) float32 {
		x := device.LoadFloat32(dt, rows[i], j)
		if c == nil {
			return x
		}
		return mul(c[i], x)
	}
	if len(rows) == 0 {
		clear(dst[lo*dt.Size() : hi*dt.Size()])
		return
	}
	for j := lo; j < hi; j++ {
		acc := term(0, j)
		for i := 1; i < len(rows); i++ {
			acc = add(acc, term(i, j))
		}
		device.StoreFloat32(dt, dst, j, acc)
	}
}

// SumGroups writes into dst the rounded fp32 sum over groups of rows of
// each group's sum rounded to dt: UnpermuteRow's sum per group (the group
// of a destination's slots) then SumRows over the rounded group rows, in
// one pass that keeps the group rows in registers:
//
//	for j := range dst {
//		acc := inner(0, j)
//		for g := 1; g < len(ends); g++ { acc = add(acc, inner(g, j)) }
//		dst[j] = round_dt(acc)
//	}
//
// where group g is rows[ends[g-1]:ends[g]] (ends[-1] = 0), inner(g, j) is
// widen(round_dt(s)) for s the sum of the group's terms from its first, as
// SumRows sums them (+0 for an empty group), and term(i, j) is x_i[j]
// (c == nil) or mul(c[i], x_i[j]). With no groups dst is zero. On amd64
// with AVX2 and on arm64, bf16 rows with weights run in assembly.
func SumGroups(dt device.DType, dst []byte, rows [][]byte, c []float32, ends []int) {
	n := len(dst) / dt.Size()
	done := 0
	if useAsm {
		done = sumGroupsAsm(dt, dst, rows, c, ends, n)
	}
	sumGroupsGo(dt, dst, rows, c, ends, done, n)
}

// sumGroupsGo is the reference loop of SumGroups over elements [lo, hi).
func sumGroupsGo(dt device.DType, dst []byte, rows [][]byte, c []float32, ends []int, lo, hi int) {
	term := func(i, j int) float32 {
		x := device.LoadFloat32(dt, rows[i], j)
		if c == nil {
			return x
		}
		return mul(c[i], x)
	}
	for j := lo; j < hi; j++ {
		var acc float32
		start := 0
		for g, end := range ends {
			var s float32
			for i := start; i < end; i++ {
				if i == start {
					s = term(i, j)
				} else {
					s = add(s, term(i, j))
				}
			}
			start = end
			if dt == device.BF16 {
				s = bf16(device.Float32ToBF16(s))
			}
			if g == 0 {
				acc = s
			} else {
				acc = add(acc, s)
			}
		}
		device.StoreFloat32(dt, dst, j, acc)
	}
}
