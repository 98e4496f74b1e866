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
// once and writing dst once (on amd64 with AVX2, several rows are streamed
// at a time, which keeps more memory reads in flight). add and mul are the
// rounded fp32 operations of rows.go; no fused multiply-add. Every row is
// at least as long as dst.
func SumRows(dt device.DType, dst []byte, rows [][]byte, c []float32) {
	n := len(dst) / dt.Size()
	done := 0
	if useAVX2 && len(rows) > 0 {
		done = sumRowsAVX2(dt, dst, rows, c, n)
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
