// The fp32 and bf16 arithmetic of package permute on the GPU, shared by
// permute.cu and the GPU data path's ep.cu (executor/internal/gpu, which
// names this directory with -I in its go:generate). Each function matches, bit for bit, the host function named
// in its comment. NaN results follow the host's rules (permute/rows.go add
// and mul as executed on the host CPU), not the GPU's canonical NaN: when
// an operand is NaN the result is the first NaN operand, quieted; a NaN
// made by the operation itself (inf - inf, 0 * inf) is dnan, the host
// CPU's default NaN, passed by the caller (0xffc00000 on amd64, 0x7fc00000
// on arm64).
//
// Every function is inline: nothing here is emitted into the PTX by
// itself, so the generated PTX does not depend on this file's layout.
#ifndef GOEP_PERMUTE_ARITH_CUH
#define GOEP_PERMUTE_ARITH_CUH

#include <stdint.h>

namespace goep_arith {  // named, not anonymous: nvcc hashes the source path into anonymous-namespace names

__device__ __forceinline__ bool is_nan(float f)
{
	return (__float_as_uint(f) & 0x7fffffffu) > 0x7f800000u;
}

__device__ __forceinline__ float quiet(float f)
{
	return __uint_as_float(__float_as_uint(f) | 0x00400000u);
}

// host_nan is the host's result of an operation on a and b whose IEEE
// result is r: the first NaN operand, quieted; else dnan where the
// operation made a NaN itself; else r.
__device__ __forceinline__ float host_nan(float a, float b, float r, uint32_t dnan)
{
	if (is_nan(a)) {
		return quiet(a);
	}
	if (is_nan(b)) {
		return quiet(b);
	}
	return is_nan(r) ? __uint_as_float(dnan) : r;
}

// add is permute's add: a + b rounded to fp32, NaNs as on the host. A
// NaN operand makes the IEEE result a NaN, so only a NaN result needs
// host_nan's look at the operands: one check on the common path.
__device__ __forceinline__ float add(float a, float b, uint32_t dnan)
{
	const float r = __fadd_rn(a, b);
	return is_nan(r) ? host_nan(a, b, r, dnan) : r;
}

// mul is permute's mul: a * b rounded to fp32, NaNs as on the host (one
// check on the common path, as add).
__device__ __forceinline__ float mul(float a, float b, uint32_t dnan)
{
	const float r = __fmul_rn(a, b);
	return is_nan(r) ? host_nan(a, b, r, dnan) : r;
}

// to_bf16 is device.Float32ToBF16: round to nearest even; a NaN keeps its
// top bits, quieted.
__device__ __forceinline__ uint32_t to_bf16(float f)
{
	uint32_t u = __float_as_uint(f);
	if ((u & 0x7fffffffu) > 0x7f800000u) {
		return ((u >> 16) | 0x40u) & 0xffffu;
	}
	u += 0x7fffu + ((u >> 16) & 1u);
	return u >> 16;
}

// from_bf16 widens the bf16 bits h (low 16 bits) to fp32, exactly.
__device__ __forceinline__ float from_bf16(uint32_t h)
{
	return __uint_as_float(h << 16);
}

} // namespace goep_arith

#endif
