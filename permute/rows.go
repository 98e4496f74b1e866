package permute

import (
	"math"
	"unsafe"

	"github.com/goep/goep/device"
)

// Float dtypes only: BF16 and FP32. Row slices are the bytes of one row of
// Hidden elements; they must be 2- (BF16) or 4-byte (FP32) aligned, which
// every device buffer is.

func asU16(b []byte) []uint16 {
	if len(b) == 0 {
		return nil
	}
	return unsafe.Slice((*uint16)(unsafe.Pointer(&b[0])), len(b)/2)
}

func asF32(b []byte) []float32 {
	if len(b) == 0 {
		return nil
	}
	return unsafe.Slice((*float32)(unsafe.Pointer(&b[0])), len(b)/4)
}

// Float32s views the bytes of an FP32 array as float32 values (no copy).
func Float32s(b []byte) []float32 { return asF32(b) }

// Int32s views the bytes of an Int32 array as int32 values (no copy).
func Int32s(b []byte) []int32 {
	if len(b) == 0 {
		return nil
	}
	return unsafe.Slice((*int32)(unsafe.Pointer(&b[0])), len(b)/4)
}

func bf16(u uint16) float32 { return math.Float32frombits(uint32(u) << 16) }

// Accumulate adds one row into an fp32 accumulator:
//
//	for j := range acc {
//		term := float32(c * float32(row[j]))
//		if first { acc[j] = term } else { acc[j] = acc[j] + term }
//	}
//
// With c == 1 the term is the element itself, exactly. On amd64 with AVX2
// the loop runs in assembly (rows_amd64.s), bit-identical to accumulateGo.
func Accumulate(dt device.DType, acc []float32, row []byte, c float32, first bool) {
	if useAVX2 {
		accumulateAVX2(dt, acc, row, c, first)
		return
	}
	accumulateGo(dt, acc, row, c, first)
}

// Store rounds the accumulator to dt into row (round to nearest even for
// BF16, as device.Float32ToBF16):
//
//	for j, f := range acc { row[j] = round_dt(f) }
func Store(dt device.DType, row []byte, acc []float32) {
	if useAVX2 {
		storeAVX2(dt, row, acc)
		return
	}
	storeGo(dt, row, acc)
}

// Scale writes float32(c * float32(src[j])) rounded to dt into dst; with
// c == 1 it is a copy:
//
//	for j := range dst { dst[j] = round_dt(float32(c * float32(src[j]))) }
func Scale(dt device.DType, dst, src []byte, c float32) {
	if c == 1 {
		copy(dst, src)
		return
	}
	if useAVX2 {
		scaleAVX2(dt, dst, src, c)
		return
	}
	scaleGo(dt, dst, src, c)
}

// accumulateGo is the reference loop of Accumulate and its portable
// implementation; the assembly is tested against it bit for bit.
func accumulateGo(dt device.DType, acc []float32, row []byte, c float32, first bool) {
	switch dt {
	case device.BF16:
		src := asU16(row)[:len(acc)]
		switch {
		case c == 1 && first:
			for j, u := range src {
				acc[j] = bf16(u)
			}
		case c == 1:
			for j, u := range src {
				acc[j] = acc[j] + bf16(u)
			}
		case first:
			for j, u := range src {
				acc[j] = float32(c * bf16(u))
			}
		default:
			for j, u := range src {
				acc[j] = acc[j] + float32(c*bf16(u))
			}
		}
	case device.FP32:
		src := asF32(row)[:len(acc)]
		switch {
		case c == 1 && first:
			copy(acc, src)
		case c == 1:
			for j, v := range src {
				acc[j] = acc[j] + v
			}
		case first:
			for j, v := range src {
				acc[j] = float32(c * v)
			}
		default:
			for j, v := range src {
				acc[j] = acc[j] + float32(c*v)
			}
		}
	}
}

// storeGo is the reference loop of Store.
func storeGo(dt device.DType, row []byte, acc []float32) {
	switch dt {
	case device.BF16:
		dst := asU16(row)[:len(acc)]
		for j, f := range acc {
			dst[j] = device.Float32ToBF16(f)
		}
	case device.FP32:
		copy(asF32(row)[:len(acc)], acc)
	}
}

// scaleGo is the reference loop of Scale for c != 1.
func scaleGo(dt device.DType, dst, src []byte, c float32) {
	switch dt {
	case device.BF16:
		d, s := asU16(dst), asU16(src)[:len(asU16(dst))]
		for j, u := range s {
			d[j] = device.Float32ToBF16(float32(c * bf16(u)))
		}
	case device.FP32:
		d, s := asF32(dst), asF32(src)[:len(asF32(dst))]
		for j, v := range s {
			d[j] = float32(c * v)
		}
	}
}

// Dot is the inner product of two rows, accumulated in float64 in element
// order and rounded to float32 once.
func Dot(dt device.DType, a, b []byte) float32 {
	var s float64
	switch dt {
	case device.BF16:
		x, y := asU16(a), asU16(b)[:len(asU16(a))]
		for j := range x {
			s += float64(bf16(x[j])) * float64(bf16(y[j]))
		}
	case device.FP32:
		x, y := asF32(a), asF32(b)[:len(asF32(a))]
		for j := range x {
			s += float64(x[j]) * float64(y[j])
		}
	}
	return float32(s)
}
