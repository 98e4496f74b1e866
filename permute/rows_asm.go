//go:build amd64 || arm64

package permute

import (
	"github.com/goep/goep/device"
	"github.com/goep/goep/internal/view"
)

// The assembly kernels below (rows_amd64.s with AVX2, rows_arm64.s with
// NEON) handle n elements, n a multiple of 8 (n may be 0); the wrappers run
// the remaining n%8 elements through the reference loops, and so does a
// NaN weight c: NEON's multiply, given a quiet NaN c and a signalling NaN
// element, returns the element, where mul returns c. Each kernel's
// reference loop is quoted in its comment, with add and mul of rows.go
// (rounded fp32 operations whose NaN result, when both operands are NaN,
// is the first one); x is the element widened to fp32 (bf16: bits << 16).

// acc[j] = x[j]
//
//go:noescape
func accSetBF16(acc *float32, src *uint16, n int)

// acc[j] = add(acc[j], x[j])
//
//go:noescape
func accAddBF16(acc *float32, src *uint16, n int)

// acc[j] = mul(c, x[j])
//
//go:noescape
func accMulBF16(acc *float32, src *uint16, n int, c float32)

// acc[j] = add(acc[j], mul(c, x[j]))
//
//go:noescape
func accMulAddBF16(acc *float32, src *uint16, n int, c float32)

// acc[j] = add(acc[j], src[j])
//
//go:noescape
func accAddF32(acc, src *float32, n int)

// dst[j] = mul(c, src[j]) (also Scale for FP32)
//
//go:noescape
func accMulF32(dst, src *float32, n int, c float32)

// acc[j] = add(acc[j], mul(c, src[j]))
//
//go:noescape
func accMulAddF32(acc, src *float32, n int, c float32)

// dst[j] = device.Float32ToBF16(src[j])
//
//go:noescape
func storeBF16(dst *uint16, src *float32, n int)

// dst[j] = device.Float32ToBF16(mul(c, x[j]))
//
//go:noescape
func scaleBF16(dst, src *uint16, n int, c float32)

// accumulateAsm is Accumulate with the bulk of the row in assembly.
func accumulateAsm(dt device.DType, acc []float32, row []byte, c float32, first bool) {
	n := len(acc) &^ 7
	if n == 0 || c != c {
		accumulateGo(dt, acc, row, c, first)
		return
	}
	sz := dt.Size()
	switch dt {
	case device.BF16:
		src := view.Uint16s(row)[:len(acc)]
		switch {
		case c == 1 && first:
			accSetBF16(&acc[0], &src[0], n)
		case c == 1:
			accAddBF16(&acc[0], &src[0], n)
		case first:
			accMulBF16(&acc[0], &src[0], n, c)
		default:
			accMulAddBF16(&acc[0], &src[0], n, c)
		}
	case device.FP32:
		src := view.Float32s(row)[:len(acc)]
		switch {
		case c == 1 && first:
			copy(acc, src)
			return
		case c == 1:
			accAddF32(&acc[0], &src[0], n)
		case first:
			accMulF32(&acc[0], &src[0], n, c)
		default:
			accMulAddF32(&acc[0], &src[0], n, c)
		}
	default:
		return
	}
	if n < len(acc) {
		accumulateGo(dt, acc[n:], row[n*sz:], c, first)
	}
}

// storeAsm is Store with the bulk of the row in assembly.
func storeAsm(dt device.DType, row []byte, acc []float32) {
	if dt != device.BF16 {
		storeGo(dt, row, acc)
		return
	}
	dst := view.Uint16s(row)[:len(acc)]
	n := len(acc) &^ 7
	if n > 0 {
		storeBF16(&dst[0], &acc[0], n)
	}
	if n < len(acc) {
		storeGo(dt, row[2*n:], acc[n:])
	}
}

// scaleAsm is Scale (c != 1) with the bulk of the row in assembly.
func scaleAsm(dt device.DType, dst, src []byte, c float32) {
	if c != c {
		scaleGo(dt, dst, src, c)
		return
	}
	var m int
	switch dt {
	case device.BF16:
		d := view.Uint16s(dst)
		s := view.Uint16s(src)[:len(d)]
		m = len(d)
		if n := m &^ 7; n > 0 {
			scaleBF16(&d[0], &s[0], n, c)
			if n < m {
				scaleGo(dt, dst[2*n:], src[2*n:], c)
			}
			return
		}
	case device.FP32:
		d := view.Float32s(dst)
		s := view.Float32s(src)[:len(d)]
		m = len(d)
		if n := m &^ 7; n > 0 {
			accMulF32(&d[0], &s[0], n, c)
			if n < m {
				scaleGo(dt, dst[4*n:], src[4*n:], c)
			}
			return
		}
	}
	scaleGo(dt, dst, src, c)
}
