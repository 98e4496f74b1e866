package device

import (
	"fmt"
	"math"
	"sort"
)

// DType is the element type of a tensor.
type DType uint8

// The element types goep moves. Activations are BF16 (default) or FP32;
// router weights are FP32; indices are Int32. FP8E4M3 (OCP float8 e4m3,
// PyTorch's float8_e4m3fn) is for dispatch only: goep moves its bytes and
// never does arithmetic on it, and its fp32 scales (one per
// FP8ScaleChannels channels of a row) travel beside it as their own tensor.
const (
	BF16 DType = iota + 1
	FP32
	Int32
	FP8E4M3
)

// FP8ScaleChannels is the number of channels of an FP8E4M3 row that share
// one fp32 scale: a row of H elements has H / FP8ScaleChannels scales (H a
// multiple of it), as DeepEP's and HybridEP's fp8 dispatch has.
const FP8ScaleChannels = 128

// Size is the size of one element in bytes.
func (d DType) Size() int {
	switch d {
	case FP8E4M3:
		return 1
	case BF16:
		return 2
	case FP32, Int32:
		return 4
	}
	return 0
}

// Valid reports whether d is a known dtype.
func (d DType) Valid() bool { return d.Size() > 0 }

func (d DType) String() string {
	switch d {
	case BF16:
		return "bf16"
	case FP32:
		return "fp32"
	case Int32:
		return "int32"
	case FP8E4M3:
		return "fp8"
	}
	return fmt.Sprintf("dtype(%d)", uint8(d))
}

// ParseDType parses "bf16", "fp32", "int32" or "fp8" (also "fp8_e4m3",
// "float8_e4m3fn").
func ParseDType(s string) (DType, error) {
	switch s {
	case "bf16", "bfloat16":
		return BF16, nil
	case "fp32", "float32":
		return FP32, nil
	case "int32":
		return Int32, nil
	case "fp8", "fp8_e4m3", "float8_e4m3fn":
		return FP8E4M3, nil
	}
	return 0, fmt.Errorf("device: unknown dtype %q (want bf16, fp32 or fp8)", s)
}

// BF16ToFloat32 widens a bfloat16 bit pattern to float32 exactly.
func BF16ToFloat32(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }

// Float32ToBF16 rounds f to the nearest bfloat16, ties to even, as CUDA's
// __float2bfloat16_rn does. NaN stays NaN (quiet).
func Float32ToBF16(f float32) uint16 {
	u := math.Float32bits(f)
	if u&0x7fffffff > 0x7f800000 { // NaN
		return uint16(u>>16) | 0x40
	}
	u += 0x7fff + (u>>16)&1
	return uint16(u >> 16)
}

// FP8E4M3ToFloat32 widens an fp8 e4m3 bit pattern (PyTorch's
// float8_e4m3fn: sign, 4 exponent bits of bias 7, 3 mantissa bits; no
// infinities; S.1111.111 is NaN) to float32 exactly.
func FP8E4M3ToFloat32(b byte) float32 {
	sign := float32(1)
	if b&0x80 != 0 {
		sign = -1
	}
	e, m := int(b>>3&0xf), int(b&7)
	switch {
	case e == 15 && m == 7:
		return float32(math.Copysign(math.NaN(), float64(sign)))
	case e == 0: // zero and subnormals: m/8 x 2^-6
		return sign * float32(math.Ldexp(float64(m), -9))
	}
	return sign * float32(math.Ldexp(float64(8+m), e-10))
}

// Float32ToFP8E4M3 rounds f to the nearest fp8 e4m3 value, ties to even,
// as PyTorch's float8_e4m3fn conversion does: a magnitude that rounds
// beyond the largest finite value (448), infinities and NaN become NaN
// (0x7f, with f's sign); there is no saturation.
func Float32ToFP8E4M3(f float32) byte {
	var sign byte
	if math.Signbit(float64(f)) {
		sign = 0x80
	}
	a := math.Abs(float64(f))
	if math.IsNaN(a) || a > 464 { // 464: halfway from 448 to 480, which rounds to even (448)
		return sign | 0x7f
	}
	// The codes 0x00..0x7e are the non-negative finite values in
	// increasing order: find the nearest, ties to the even code.
	lo := sort.Search(0x7f, func(c int) bool { return float64(FP8E4M3ToFloat32(byte(c))) >= a })
	if lo == 0 {
		return sign
	}
	if lo == 0x7f {
		return sign | 0x7e
	}
	below, above := float64(FP8E4M3ToFloat32(byte(lo-1))), float64(FP8E4M3ToFloat32(byte(lo)))
	switch {
	case a-below < above-a:
		return sign | byte(lo-1)
	case a-below > above-a:
		return sign | byte(lo)
	case (lo-1)%2 == 0:
		return sign | byte(lo-1)
	}
	return sign | byte(lo)
}
