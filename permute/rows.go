package permute

import (
	"math"

	"github.com/goep/goep/device"
	"github.com/goep/goep/internal/view"
)

// Float dtypes only: BF16 and FP32. Row slices are the bytes of one row of
// Hidden elements; they must be 2- (BF16) or 4-byte (FP32) aligned, which
// every device buffer is.

func bf16(u uint16) float32 { return math.Float32frombits(uint32(u) << 16) }

// Accumulate adds one row into an fp32 accumulator:
//
//	for j := range acc {
//		term := float32(c * float32(row[j]))
//		if first { acc[j] = term } else { acc[j] = acc[j] + term }
//	}
//
// With c == 1 the term is the element itself, exactly. NaNs propagate by
// the first-operand rule of add and mul below: when both operands are NaN
// the result is acc[j] (in a sum) or c (in a product), quieted. On amd64
// with AVX2 and on arm64 the loop runs in assembly (rows_amd64.s,
// rows_arm64.s), bit-identical to accumulateGo.
func Accumulate(dt device.DType, acc []float32, row []byte, c float32, first bool) {
	if useAsm {
		accumulateAsm(dt, acc, row, c, first)
		return
	}
	accumulateGo(dt, acc, row, c, first)
}

// Store rounds the accumulator to dt into row (round to nearest even for
// BF16, as device.Float32ToBF16):
//
//	for j, f := range acc { row[j] = round_dt(f) }
func Store(dt device.DType, row []byte, acc []float32) {
	if useAsm {
		storeAsm(dt, row, acc)
		return
	}
	storeGo(dt, row, acc)
}

// Scale writes float32(c * float32(src[j])) rounded to dt into dst (a NaN
// c wins over a NaN element, as in Accumulate); with c == 1 it is a copy:
//
//	for j := range dst { dst[j] = round_dt(float32(c * float32(src[j]))) }
func Scale(dt device.DType, dst, src []byte, c float32) {
	if c == 1 {
		copy(dst, src)
		return
	}
	if useAsm {
		scaleAsm(dt, dst, src, c)
		return
	}
	scaleGo(dt, dst, src, c)
}

// add is a + b, except that when both are NaN the result is a, quieted,
// whatever operand order the compiler gives the instruction (x86 returns
// its first source then, and Go's register allocator may put either
// operand first; it does differ between builds, e.g. with -race). This
// makes the NaN payloads of the reference loops a property of the source,
// which the assembly can match. A single NaN operand, or a NaN made by the
// operation itself, comes out the same in either order.
func add(a, b float32) float32 {
	s := float32(a + b)
	if s != s && a != a {
		return quiet(a)
	}
	return s
}

// mul is a * b with the NaN rule of add, rounded to float32: the explicit
// conversion keeps the compiler from fusing it with a following add (the
// Go spec allows fusion across statements otherwise; GOAMD64=v3 and arm64
// do fuse).
func mul(a, b float32) float32 {
	p := float32(a * b)
	if p != p && a != a {
		return quiet(a)
	}
	return p
}

func quiet(f float32) float32 { return math.Float32frombits(math.Float32bits(f) | 0x00400000) }

// accumulateGo is the reference loop of Accumulate and its portable
// implementation; the assembly is tested against it bit for bit.
func accumulateGo(dt device.DType, acc []float32, row []byte, c float32, first bool) {
	switch dt {
	case device.BF16:
		src := view.Uint16s(row)[:len(acc)]
		switch {
		case c == 1 && first:
			for j, u := range src {
				acc[j] = bf16(u)
			}
		case c == 1:
			for j, u := range src {
				acc[j] = add(acc[j], bf16(u))
			}
		case first:
			for j, u := range src {
				acc[j] = mul(c, bf16(u))
			}
		default:
			for j, u := range src {
				acc[j] = add(acc[j], mul(c, bf16(u)))
			}
		}
	case device.FP32:
		src := view.Float32s(row)[:len(acc)]
		switch {
		case c == 1 && first:
			copy(acc, src)
		case c == 1:
			for j, v := range src {
				acc[j] = add(acc[j], v)
			}
		case first:
			for j, v := range src {
				acc[j] = mul(c, v)
			}
		default:
			for j, v := range src {
				acc[j] = add(acc[j], mul(c, v))
			}
		}
	}
}

// storeGo is the reference loop of Store.
func storeGo(dt device.DType, row []byte, acc []float32) {
	switch dt {
	case device.BF16:
		dst := view.Uint16s(row)[:len(acc)]
		for j, f := range acc {
			dst[j] = device.Float32ToBF16(f)
		}
	case device.FP32:
		copy(view.Float32s(row)[:len(acc)], acc)
	}
}

// scaleGo is the reference loop of Scale for c != 1.
func scaleGo(dt device.DType, dst, src []byte, c float32) {
	switch dt {
	case device.BF16:
		d, s := view.Uint16s(dst), view.Uint16s(src)[:len(view.Uint16s(dst))]
		for j, u := range s {
			d[j] = device.Float32ToBF16(mul(c, bf16(u)))
		}
	case device.FP32:
		d, s := view.Float32s(dst), view.Float32s(src)[:len(view.Float32s(dst))]
		for j, v := range s {
			d[j] = mul(c, v)
		}
	}
}

// Dot is the inner product of two rows, accumulated in float64 in element
// order and rounded to float32 once.
func Dot(dt device.DType, a, b []byte) float32 {
	var s float64
	switch dt {
	case device.BF16:
		x, y := view.Uint16s(a), view.Uint16s(b)[:len(view.Uint16s(a))]
		for j := range x {
			s += float64(bf16(x[j])) * float64(bf16(y[j]))
		}
	case device.FP32:
		x, y := view.Float32s(a), view.Float32s(b)[:len(view.Float32s(a))]
		for j := range x {
			s += float64(x[j]) * float64(y[j])
		}
	}
	return float32(s)
}
