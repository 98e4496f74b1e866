// CUDA kernels of package permute. go generate ./permute builds them:
//
//	nvcc -ptx -arch=compute_90 -o permute.ptx permute.cu (kernels/gen.sh)
//
// Each kernel must match, bit for bit, the host function of package permute
// named in its comment (whose doc comment is the reference loop). Counts
// and capacities arrive by value; every pointer is device memory (DESIGN.md
// invariant 1).
//
// Launch shape (all kernels): one block row per item, grid.x = items (rows
// or slots), grid.y * blockDim.x >= units per row; a unit is 16 bytes when
// the host says the rows allow it (vec16: row bytes a multiple of 16 and
// every base address 16-byte aligned), else one element.
//
// Arithmetic of the sums (DESIGN.md section 2): a weighted term is
// mul(c, x) rounded to fp32 (__fmul_rn: never fused with the add), the sum
// starts from the first term and adds the others in slot order
// (__fadd_rn), and is rounded to the output dtype once. NaN results follow
// the host's rules (permute/rows.go add and mul as executed on the host
// CPU), not the GPU's canonical NaN: when an operand is NaN the result is
// the first NaN operand, quieted; a NaN made by the operation itself
// (inf - inf, 0 * inf) is dnan, the host CPU's default NaN, passed by the
// caller (0xffc00000 on amd64, 0x7fc00000 on arm64). bf16 rounding is
// device.Float32ToBF16: to nearest even, a NaN keeps its top bits, quieted.
#include <stdint.h>

namespace {

__device__ __forceinline__ bool is_nan(float f)
{
	return (__float_as_uint(f) & 0x7fffffffu) > 0x7f800000u;
}

__device__ __forceinline__ float quiet(float f)
{
	return __uint_as_float(__float_as_uint(f) | 0x00400000u);
}

// add is permute's add: a + b rounded to fp32, NaNs as on the host.
__device__ __forceinline__ float add(float a, float b, uint32_t dnan)
{
	if (is_nan(a)) {
		return quiet(a);
	}
	if (is_nan(b)) {
		return quiet(b);
	}
	float s = __fadd_rn(a, b);
	return is_nan(s) ? __uint_as_float(dnan) : s;
}

// mul is permute's mul: a * b rounded to fp32, NaNs as on the host.
__device__ __forceinline__ float mul(float a, float b, uint32_t dnan)
{
	if (is_nan(a)) {
		return quiet(a);
	}
	if (is_nan(b)) {
		return quiet(b);
	}
	float p = __fmul_rn(a, b);
	return is_nan(p) ? __uint_as_float(dnan) : p;
}

// to_bf16 is device.Float32ToBF16.
__device__ __forceinline__ uint32_t to_bf16(float f)
{
	uint32_t u = __float_as_uint(f);
	if ((u & 0x7fffffffu) > 0x7f800000u) {
		return ((u >> 16) | 0x40u) & 0xffffu;
	}
	u += 0x7fffu + ((u >> 16) & 1u);
	return u >> 16;
}

__device__ __forceinline__ float from_bf16(uint32_t h)
{
	return __uint_as_float(h << 16);
}

// Unit<BF16, N> is N elements of bf16 (BF16) or fp32 moved as one load or
// store (R), widened to and rounded from fp32.
template <bool BF16, int N>
struct Unit;

template <>
struct Unit<true, 8> {
	typedef uint4 R;
	static __device__ __forceinline__ void widen(R r, float *f)
	{
		uint32_t w[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
		for (int q = 0; q < 4; q++) {
			f[2 * q] = from_bf16(w[q] & 0xffffu);
			f[2 * q + 1] = __uint_as_float(w[q] & 0xffff0000u);
		}
	}
	static __device__ __forceinline__ R pack(const float *f)
	{
		uint32_t w[4];
#pragma unroll
		for (int q = 0; q < 4; q++) {
			w[q] = to_bf16(f[2 * q]) | (to_bf16(f[2 * q + 1]) << 16);
		}
		return make_uint4(w[0], w[1], w[2], w[3]);
	}
};

template <>
struct Unit<true, 1> {
	typedef uint16_t R;
	static __device__ __forceinline__ void widen(R r, float *f) { f[0] = from_bf16(r); }
	static __device__ __forceinline__ R pack(const float *f) { return (uint16_t)to_bf16(f[0]); }
};

template <>
struct Unit<false, 4> {
	typedef uint4 R;
	static __device__ __forceinline__ void widen(R r, float *f)
	{
		f[0] = __uint_as_float(r.x);
		f[1] = __uint_as_float(r.y);
		f[2] = __uint_as_float(r.z);
		f[3] = __uint_as_float(r.w);
	}
	static __device__ __forceinline__ R pack(const float *f)
	{
		return make_uint4(__float_as_uint(f[0]), __float_as_uint(f[1]), __float_as_uint(f[2]),
				  __float_as_uint(f[3]));
	}
};

template <>
struct Unit<false, 1> {
	typedef uint32_t R;
	static __device__ __forceinline__ void widen(R r, float *f) { f[0] = __uint_as_float(r); }
	static __device__ __forceinline__ R pack(const float *f) { return __float_as_uint(f[0]); }
};

// permute_rows is permute.Permute for rows of units R (units per row):
// block (i, y) copies its units of x[i] to px[pos[i][k]] for every valid
// slot k, and one thread writes the weights.
template <typename R>
__device__ __forceinline__ void permute_rows(R *px, float *pw, const R *x, const float *w,
					     const int32_t *pos, int64_t rows, int32_t topk,
					     int64_t permCap, int64_t units)
{
	int64_t i = blockIdx.x;
	if (i >= rows) {
		return;
	}
	const int32_t *pi = pos + i * topk;
	int64_t j = (int64_t)blockIdx.y * blockDim.x + threadIdx.x;
	if (j < units) {
		R v = x[i * units + j];
		for (int32_t k = 0; k < topk; k++) {
			int64_t p = pi[k];
			if (p >= 0 && p < permCap) {
				px[p * units + j] = v;
			}
		}
	}
	if (pw != nullptr && blockIdx.y == 0 && threadIdx.x == 0) {
		for (int32_t k = 0; k < topk; k++) {
			int64_t p = pi[k];
			if (p >= 0 && p < permCap) {
				pw[p] = w[i * topk + k];
			}
		}
	}
}

// chunk is the number of slots whose loads an unpermute thread issues
// before it adds them (memory-level parallelism; the adds stay in slot
// order).
constexpr int chunk = 8;

// unpermute_rows is permute.Unpermute for rows i < rows (UnpermuteRow):
// block (i, y) sums its units of y[pos[i][k]] over the valid slots k in
// slot order, weighted by w[i][k] when w is not null.
template <bool BF16, int N>
__device__ __forceinline__ void unpermute_rows(void *out, const void *y, const float *w,
					       const int32_t *pos, int64_t rows, int32_t topk,
					       int64_t permCap, int64_t hidden, uint32_t dnan)
{
	typedef Unit<BF16, N> U;
	typedef typename U::R R;
	int64_t i = blockIdx.x;
	int64_t units = hidden / N;
	int64_t j = (int64_t)blockIdx.y * blockDim.x + threadIdx.x;
	if (i >= rows || j >= units) {
		return;
	}
	const R *yr = (const R *)y;
	const int32_t *pi = pos + i * topk;
	const float *wi = w != nullptr ? w + i * topk : nullptr;
	float acc[N];
	bool first = true;
	for (int32_t k0 = 0; k0 < topk; k0 += chunk) {
		R raw[chunk];
		bool ok[chunk];
#pragma unroll
		for (int q = 0; q < chunk; q++) {
			int32_t k = k0 + q;
			int64_t p = k < topk ? (int64_t)pi[k] : -1;
			ok[q] = p >= 0 && p < permCap;
			if (ok[q]) {
				raw[q] = yr[p * units + j];
			}
		}
#pragma unroll
		for (int q = 0; q < chunk; q++) {
			if (!ok[q]) {
				continue;
			}
			float t[N];
			U::widen(raw[q], t);
			if (wi != nullptr) {
				float c = wi[k0 + q];
#pragma unroll
				for (int n = 0; n < N; n++) {
					t[n] = mul(c, t[n], dnan);
				}
			}
			if (first) {
#pragma unroll
				for (int n = 0; n < N; n++) {
					acc[n] = t[n];
				}
				first = false;
			} else {
#pragma unroll
				for (int n = 0; n < N; n++) {
					acc[n] = add(acc[n], t[n], dnan);
				}
			}
		}
	}
	if (first) {
#pragma unroll
		for (int n = 0; n < N; n++) {
			acc[n] = __uint_as_float(0u);
		}
	}
	((R *)out)[i * units + j] = U::pack(acc);
}

// zero_row zeroes the units of row p that this thread covers.
__device__ __forceinline__ void zero_row(void *px, int64_t rowBytes, int32_t unit, int64_t p)
{
	int64_t j = (int64_t)blockIdx.y * blockDim.x + threadIdx.x;
	int64_t units = rowBytes / unit;
	if (j >= units) {
		return;
	}
	char *row = (char *)px + p * rowBytes;
	switch (unit) {
	case 16:
		((uint4 *)row)[j] = make_uint4(0, 0, 0, 0);
		break;
	case 2:
		((uint16_t *)row)[j] = 0;
		break;
	default:
		row[j] = 0;
	}
}

} // namespace

// goep_permute_bf16 is permute.Permute for BF16 rows of hidden elements:
// for i < rows, k < topk with p = pos[i*topk+k] in [0, permCap): px[p] =
// x[i], and pw[p] = w[i*topk+k] when pw is not null. 16-byte units when
// vec16, else 2-byte elements. Grid (rows, units/blockDim.x rounded up).
extern "C" __global__ void goep_permute_bf16(void *px, float *pw, const void *x, const float *w,
					     const int32_t *pos, int64_t rows, int32_t topk,
					     int64_t permCap, int64_t hidden, int32_t vec16)
{
	if (vec16) {
		permute_rows<uint4>((uint4 *)px, pw, (const uint4 *)x, w, pos, rows, topk, permCap,
				    hidden / 8);
	} else {
		permute_rows<uint16_t>((uint16_t *)px, pw, (const uint16_t *)x, w, pos, rows, topk,
				       permCap, hidden);
	}
}

// goep_permute_fp32 is goep_permute_bf16 for FP32 rows.
extern "C" __global__ void goep_permute_fp32(void *px, float *pw, const void *x, const float *w,
					     const int32_t *pos, int64_t rows, int32_t topk,
					     int64_t permCap, int64_t hidden, int32_t vec16)
{
	if (vec16) {
		permute_rows<uint4>((uint4 *)px, pw, (const uint4 *)x, w, pos, rows, topk, permCap,
				    hidden / 4);
	} else {
		permute_rows<uint32_t>((uint32_t *)px, pw, (const uint32_t *)x, w, pos, rows, topk,
				       permCap, hidden);
	}
}

// goep_unpermute_bf16 is permute.Unpermute for BF16 rows i < rows (the
// rows past them up to the capacity are zeroed by goep_zero_rows):
//
//	out[i] = round(sum over k in slot order with p = pos[i*topk+k] in
//	         [0, permCap) of term_k), term_k = mul(w[i*topk+k], y[p]) if w
//	         is not null, else y[p]
//
// from the first term; a row with no term is zero. 16-byte units (8
// elements) when vec16, else single elements.
extern "C" __global__ void goep_unpermute_bf16(void *out, const void *y, const float *w,
					       const int32_t *pos, int64_t rows, int32_t topk,
					       int64_t permCap, int64_t hidden, int32_t vec16,
					       uint32_t dnan)
{
	if (vec16) {
		unpermute_rows<true, 8>(out, y, w, pos, rows, topk, permCap, hidden, dnan);
	} else {
		unpermute_rows<true, 1>(out, y, w, pos, rows, topk, permCap, hidden, dnan);
	}
}

// goep_unpermute_fp32 is goep_unpermute_bf16 for FP32 rows (4 elements per
// 16-byte unit).
extern "C" __global__ void goep_unpermute_fp32(void *out, const void *y, const float *w,
					       const int32_t *pos, int64_t rows, int32_t topk,
					       int64_t permCap, int64_t hidden, int32_t vec16,
					       uint32_t dnan)
{
	if (vec16) {
		unpermute_rows<false, 4>(out, y, w, pos, rows, topk, permCap, hidden, dnan);
	} else {
		unpermute_rows<false, 1>(out, y, w, pos, rows, topk, permCap, hidden, dnan);
	}
}

// goep_zero_rows is permute.ZeroRows: rows [lo, lo+gridDim.x) of px
// (rowBytes each, in units of unit = 16, 2 or 1 bytes) and, when pw is
// not null, the matching weights are zeroed. Grid (hi-lo, units/blockDim.x
// rounded up).
extern "C" __global__ void goep_zero_rows(void *px, float *pw, int64_t rowBytes, int64_t lo,
					  int64_t hi, int32_t unit)
{
	int64_t p = lo + blockIdx.x;
	if (p >= hi) {
		return;
	}
	zero_row(px, rowBytes, unit, p);
	if (pw != nullptr && blockIdx.y == 0 && threadIdx.x == 0) {
		pw[p] = 0.0f;
	}
}

// goep_zero_dropped is permute.ZeroDropped: for each slot s in [from, to)
// with p = pos[s] in [0, permCap), row p of px and pw[p] (when pw is not
// null) are zeroed. Grid (to-from, units/blockDim.x rounded up).
extern "C" __global__ void goep_zero_dropped(void *px, float *pw, int64_t rowBytes,
					     const int32_t *pos, int64_t from, int64_t to,
					     int64_t permCap, int32_t unit)
{
	int64_t s = from + blockIdx.x;
	if (s >= to) {
		return;
	}
	int64_t p = pos[s];
	if (p < 0 || p >= permCap) {
		return;
	}
	zero_row(px, rowBytes, unit, p);
	if (pw != nullptr && blockIdx.y == 0 && threadIdx.x == 0) {
		pw[p] = 0.0f;
	}
}
