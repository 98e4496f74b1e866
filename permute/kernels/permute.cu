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
// or slots), the blocks of grid.y covering the units of the row (each
// kernel's comment says how); a unit is 16 bytes when the host says the
// rows allow it (vec16: row bytes a multiple of 16 and every base address
// 16-byte aligned), else one element.
//
// Arithmetic of the sums (DESIGN.md section 2): a weighted term is
// mul(c, x) rounded to fp32 (__fmul_rn: never fused with the add), the sum
// starts from the first term and adds the others in slot order
// (__fadd_rn), and is rounded to the output dtype once. add, mul, to_bf16
// and their NaN rules (the host's, not the GPU's canonical NaN) are in
// arith.cuh, which the GPU data path's ep.cu shares.
#include <stdint.h>

#include "arith.cuh"

namespace goep_permute {  // named, not anonymous: nvcc hashes the source path into anonymous-namespace names, which would make the PTX depend on the checkout directory

using namespace goep_arith;

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
	// pack_finite is pack for values none of which is NaN (unpermute's
	// fast path): the GPU's round-to-nearest-even conversion, two
	// elements an instruction (cvt.rn.bf16x2.f32, sm_80), gives to_bf16's
	// bits for every non-NaN value, subnormals, overflow to infinity and
	// signed zeros included.
	static __device__ __forceinline__ R pack_finite(const float *f)
	{
		uint32_t w[4];
#pragma unroll
		for (int q = 0; q < 4; q++) {
			asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(w[q]) : "f"(f[2 * q + 1]), "f"(f[2 * q]));
		}
		return make_uint4(w[0], w[1], w[2], w[3]);
	}
	static __device__ __forceinline__ R negzero()
	{
		return make_uint4(0x80008000u, 0x80008000u, 0x80008000u, 0x80008000u);
	}
};

template <>
struct Unit<true, 1> {
	typedef uint16_t R;
	static __device__ __forceinline__ void widen(R r, float *f) { f[0] = from_bf16(r); }
	static __device__ __forceinline__ R pack(const float *f) { return (uint16_t)to_bf16(f[0]); }
	static __device__ __forceinline__ R pack_finite(const float *f) { return pack(f); }
	static __device__ __forceinline__ R negzero() { return 0x8000u; }
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
	static __device__ __forceinline__ R pack_finite(const float *f) { return pack(f); }
	static __device__ __forceinline__ R negzero()
	{
		return make_uint4(0x80000000u, 0x80000000u, 0x80000000u, 0x80000000u);
	}
};

template <>
struct Unit<false, 1> {
	typedef uint32_t R;
	static __device__ __forceinline__ void widen(R r, float *f) { f[0] = __uint_as_float(r); }
	static __device__ __forceinline__ R pack(const float *f) { return __float_as_uint(f[0]); }
	static __device__ __forceinline__ R pack_finite(const float *f) { return pack(f); }
	static __device__ __forceinline__ R negzero() { return 0x80000000u; }
};

// Loads of the row data that each kernel reads exactly once: streaming
// (ld.global.cs: evict first) when hints bit 0 is set, else through the
// read-only path (ld.global.nc). Stores of the rows a kernel writes:
// streaming (st.global.cs) when hints bit 1 is set, else plain. The hints
// change no value, only cache policy (the rows read are never written by
// the same launch).
constexpr int32_t hintLoadCS = 1;
constexpr int32_t hintStoreCS = 2;

template <typename R>
__device__ __forceinline__ R load_row(const R *p, bool cs)
{
	return cs ? __ldcs(p) : __ldg(p);
}

template <typename R>
__device__ __forceinline__ void store_row(R *p, R v, bool cs)
{
	if (cs) {
		__stcs(p, v);
	} else {
		*p = v;
	}
}

// slots is the number of slots whose positions (and loads, in unpermute)
// a thread issues together before it uses them (memory-level parallelism;
// unpermute's adds stay in slot order).
constexpr int slots = 8;

// maxUnpermuteBlock is the largest block of the unpermute kernels (cuda.go
// keeps to it), and minUnpermuteBlocksBF16 and minUnpermuteBlocksFP32 the
// blocks of that size each kernel asks to fit on a multiprocessor. fp32: 3
// blocks, up to 80 registers a thread, enough for 8 slots of 16-byte loads
// in flight without spilling. bf16 (twice the elements of a 16-byte unit
// to widen, add and round, so more latency to hide): 4 blocks, 64
// registers, with a few spills around the NaN path's call: the faster
// choice for bf16 at every top-k, while fp32 is faster with 3
// (docs/results/2026-12-03-h200-permute-topk.md).
constexpr int maxUnpermuteBlock = 256;
constexpr int minUnpermuteBlocksBF16 = 4;
constexpr int minUnpermuteBlocksFP32 = 3;

// permute_rows is permute.Permute for rows of units R (units per row):
// block (i, y) covers units [y*blockDim.x*U, (y+1)*blockDim.x*U) of row i,
// thread t the units y*blockDim.x*U + t + u*blockDim.x for u < U. Each
// thread loads its U units of x[i] once, then stores them to
// px[pos[i][k]] for every valid slot k. Thread k of the row's first block
// moves slot k's weight (k < topk; slots past the block loop): its loads
// are issued with the row's and its store follows the row's, so no block
// stays resident on a chain of dependent weight loads.
template <typename R, int U>
__device__ __forceinline__ void permute_rows(R *__restrict__ px, float *__restrict__ pw,
					     const R *__restrict__ x, const float *__restrict__ w,
					     const int32_t *__restrict__ pos, int64_t rows,
					     int32_t topk, int64_t permCap, int64_t units,
					     int32_t hints)
{
	int64_t i = blockIdx.x;
	if (i >= rows) {
		return;
	}
	const int32_t *pi = pos + i * topk;
	const bool weights = pw != nullptr && blockIdx.y == 0;
	int64_t wp = -1;
	float wv = 0.0f;
	if (weights && (int64_t)threadIdx.x < topk) {
		wp = __ldg(pi + threadIdx.x);
		wv = __ldg(w + i * topk + threadIdx.x);
	}
	int64_t j0 = (int64_t)blockIdx.y * blockDim.x * U + threadIdx.x;
	if (j0 < units) {
		const bool csl = (hints & hintLoadCS) != 0, css = (hints & hintStoreCS) != 0;
		const R *xr = x + i * units + j0;
		R v[U];
#pragma unroll
		for (int u = 0; u < U; u++) {
			if (j0 + (int64_t)u * blockDim.x < units) {
				v[u] = load_row(xr + u * blockDim.x, csl);
			}
		}
		for (int32_t k0 = 0; k0 < topk; k0 += slots) {
			int64_t p[slots];
#pragma unroll
			for (int q = 0; q < slots; q++) {
				p[q] = k0 + q < topk ? (int64_t)__ldg(pi + k0 + q) : -1;
			}
#pragma unroll
			for (int q = 0; q < slots; q++) {
				if (p[q] < 0 || p[q] >= permCap) {
					continue;
				}
				R *d = px + p[q] * units + j0;
#pragma unroll
				for (int u = 0; u < U; u++) {
					if (j0 + (int64_t)u * blockDim.x < units) {
						store_row(d + u * blockDim.x, v[u], css);
					}
				}
			}
		}
	}
	if (weights) {
		if (wp >= 0 && wp < permCap) {
			pw[wp] = wv;
		}
		for (int64_t k = (int64_t)threadIdx.x + blockDim.x; k < topk; k += blockDim.x) {
			int64_t p = pi[k];
			if (p >= 0 && p < permCap) {
				pw[p] = w[i * topk + k];
			}
		}
	}
}

// unpermute_exact is UnpermuteRow for unit j of row i with the host's NaN
// rules in every operation: the slow path of unpermute_rows, taken only
// for a unit whose sum is NaN in some element (and so, because a NaN
// operand or result stays NaN through every later add, only where a NaN
// operand or result appeared). It writes the unit.
template <bool BF16, int N>
__device__ __noinline__ void unpermute_exact(void *out, const void *y, const float *w,
					     const int32_t *pos, int64_t i, int32_t topk,
					     int64_t permCap, int64_t units, int64_t j, uint32_t dnan)
{
	typedef Unit<BF16, N> U;
	typedef typename U::R R;
	const R *yr = (const R *)y;
	const int32_t *pi = pos + i * topk;
	const float *wi = w != nullptr ? w + i * topk : nullptr;
	float acc[N];
	bool first = true;
	for (int32_t k = 0; k < topk; k++) {
		int64_t p = pi[k];
		if (p < 0 || p >= permCap) {
			continue;
		}
		float t[N];
		U::widen(yr[p * units + j], t);
		if (wi != nullptr) {
			float c = wi[k];
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
	if (first) {
#pragma unroll
		for (int n = 0; n < N; n++) {
			acc[n] = __uint_as_float(0u);
		}
	}
	((R *)out)[i * units + j] = U::pack(acc);
}

// unpermute_add adds to acc, in slot order, the terms of slots q < nq
// (nq <= Q) whose loaded values are raw[q] and weights c[q] (fast path of
// unpermute_rows: plain IEEE arithmetic).
template <bool BF16, int N, int Q>
__device__ __forceinline__ void unpermute_add(float *acc, const typename Unit<BF16, N>::R *raw,
					      const float *c, int nq, bool weighted)
{
#pragma unroll
	for (int q = 0; q < Q; q++) {
		if (q >= nq) {
			break;
		}
		float t[N];
		Unit<BF16, N>::widen(raw[q], t);
		if (weighted) {
#pragma unroll
			for (int n = 0; n < N; n++) {
				t[n] = __fmul_rn(c[q], t[n]);
			}
		}
#pragma unroll
		for (int n = 0; n < N; n++) {
			acc[n] = __fadd_rn(acc[n], t[n]);
		}
	}
}

// unpermute_slots adds to acc, in slot order, the terms of slots q < nq
// of unit yr (y + j) whose positions are p[q] (-1: no term) and weights
// c[q] (1 for no term), issuing all loads before the first add (the fast
// path of unpermute_rows for topk > slots, a chunk of slots at a time). A
// slot without a term adds c*(-0) = -0, which leaves every non-NaN sum as
// it is, so the adds need no branch.
template <bool BF16, int N>
__device__ __forceinline__ void unpermute_slots(float *acc, const typename Unit<BF16, N>::R *yr,
						const int32_t *p, const float *c, int nq,
						int64_t units, bool weighted)
{
	typedef Unit<BF16, N> U;
	typename U::R raw[slots];
#pragma unroll
	for (int q = 0; q < slots; q++) {
		raw[q] = U::negzero();
		if (q < nq && p[q] >= 0) {
			raw[q] = __ldcs(yr + (int64_t)p[q] * units);
		}
	}
	unpermute_add<BF16, N, slots>(acc, raw, c, nq, weighted);
}

// unpermute_chunk reads the positions and weights of slots [k0, k0+slots)
// of row i: p[q] a valid position, else -1; c[q] its weight, 1 without
// weights or without a term. It reports whether any position is valid.
__device__ __forceinline__ bool unpermute_chunk(int32_t *p, float *c, const int32_t *pi,
						const float *wi, int32_t k0, int32_t topk,
						int64_t permCap)
{
	bool any = false;
#pragma unroll
	for (int q = 0; q < slots; q++) {
		int32_t k = k0 + q;
		int32_t v = k < topk ? __ldg(pi + k) : -1;
		bool ok = v >= 0 && (int64_t)v < permCap;
		p[q] = ok ? v : -1;
		c[q] = ok && wi != nullptr ? __ldg(wi + k) : 1.0f;
		any |= ok;
	}
	return any;
}

// unpermute_store writes unit j of the output row from the fast-path sums
// acc and returns true, or, when one of them is NaN, writes nothing and
// returns false: the caller then redoes the unit with unpermute_exact.
template <bool BF16, int N>
__device__ __forceinline__ bool unpermute_store(void *out, int64_t i, int64_t units, int64_t j,
						const float *acc, bool any)
{
	typedef Unit<BF16, N> U;
	typedef typename U::R R;
	bool nan = false;
#pragma unroll
	for (int n = 0; n < N; n++) {
		nan |= is_nan(acc[n]);
	}
	if (nan) {
		return false;
	}
	float z[N];
#pragma unroll
	for (int n = 0; n < N; n++) {
		z[n] = any ? acc[n] : __uint_as_float(0u);
	}
	((R *)out)[i * units + j] = U::pack_finite(z);
	return true;
}

// unpermute_units is the fast path of unpermute_rows for topk <= slots/M,
// positions p and weights c read once (unpermute_chunk): a thread issues
// the loads of M of its units (j, j + stride, ..., those below units) for
// every slot before the first add, so a small topk keeps as many loads in
// flight as topk = slots does (unpermuteGroup of cuda.go picks M and gives
// each thread at least M units), then sums and stores each unit. Slots
// without a term load -0, as in unpermute_slots. Units with a NaN sum are
// redone (unpermute_exact) after the group's stores, so that no loaded
// value has to live across that call.
template <bool BF16, int N, int M>
__device__ __forceinline__ void unpermute_units(void *out, const void *y, const float *w,
						const int32_t *pos, int64_t i, int32_t topk,
						int64_t permCap, int64_t units, int64_t j0,
						int64_t stride, uint32_t dnan, const int32_t *p,
						const float *c, bool any)
{
	constexpr int TK = slots / M;
	typedef Unit<BF16, N> U;
	typedef typename U::R R;
	const R *yr = (const R *)y;
	for (int64_t j = j0; j < units; j += M * stride) {
		R raw[M][TK];
#pragma unroll
		for (int m = 0; m < M; m++) {
#pragma unroll
			for (int q = 0; q < TK; q++) {
				raw[m][q] = U::negzero();
				if (j + m * stride < units && q < topk && p[q] >= 0) {
					raw[m][q] = __ldcs(yr + (int64_t)p[q] * units + j + m * stride);
				}
			}
		}
		uint32_t redo = 0;
#pragma unroll
		for (int m = 0; m < M; m++) {
			if (j + m * stride >= units) {
				break;
			}
			float acc[N];
#pragma unroll
			for (int n = 0; n < N; n++) {
				acc[n] = -0.0f;
			}
			unpermute_add<BF16, N, TK>(acc, raw[m], c, topk, w != nullptr);
			if (!unpermute_store<BF16, N>(out, i, units, j + m * stride, acc, any)) {
				redo |= 1u << m;
			}
		}
		for (int m = 0; redo != 0; m++, redo >>= 1) {
			if (redo & 1) {
				unpermute_exact<BF16, N>(out, y, w, pos, i, topk, permCap, units, j + m * stride, dnan);
			}
		}
	}
}

// unpermute_rows is permute.Unpermute for rows i < rows (UnpermuteRow):
// block (i, y) sums the units j = y*blockDim.x + t + m*gridDim.y*blockDim.x
// (m = 0, 1, ...) of y[pos[i][k]] over the valid slots k in slot order,
// weighted by w[i][k] when w is not null. With topk <= slots a thread
// reads the positions and weights once, for all its units, and sums M =
// 8, 4, 2 or 1 units at a time for topk 1, 2, 3-4 or more
// (unpermute_units): about slots loads in flight whatever topk.
//
// Fast path: plain IEEE arithmetic, acc = -0 + t_1 + t_2 + ... (each add
// __fadd_rn, each term __fmul_rn(c, y) or y). -0 is the identity of
// round-to-nearest addition (-0 + t == t bit for bit for every non-NaN t,
// +0 and -0 included), so this equals the sum from the first term. While
// no NaN appears, the host's add and mul are exactly __fadd_rn and
// __fmul_rn; once one appears every later sum is NaN. So a unit whose sums
// are all non-NaN is bit-identical to the host's, and any other unit is
// redone by unpermute_exact. A row with no valid slot is zero (+0). The
// rows of y are read once (streaming loads, ld.global.cs).
//
// Row i is stored at row i of out or, when SCATTER, at row toRow[i] of the
// buffer at to[toRank[i]] (nowhere when toRow[i] < 0; out is not used).
// The functions below store unit j of row i at out + (i*units + j) units,
// so SCATTER gives them out = target row - i rows (an address computed in
// integers, which wrap; only out + i rows is ever accessed), and the
// non-SCATTER kernels compile as they did before SCATTER existed.
template <bool BF16, int N, bool SCATTER>
__device__ __forceinline__ void unpermute_rows(void *__restrict__ out, const void *__restrict__ y,
					       const float *__restrict__ w,
					       const int32_t *__restrict__ pos, int64_t rows,
					       int32_t topk, int64_t permCap, int64_t hidden,
					       uint32_t dnan, uint8_t *const *to,
					       const int32_t *toRank, const int32_t *toRow)
{
	typedef Unit<BF16, N> U;
	typedef typename U::R R;
	int64_t i = blockIdx.x;
	int64_t units = hidden / N;
	int64_t j0 = (int64_t)blockIdx.y * blockDim.x + threadIdx.x;
	int64_t stride = (int64_t)gridDim.y * blockDim.x;
	if (i >= rows || j0 >= units) {
		return;
	}
	if (SCATTER) {
		int64_t r = toRow[i];
		if (r < 0) {
			return;
		}
		out = (void *)((uintptr_t)to[toRank[i]] + (uintptr_t)((r - i) * units * (int64_t)sizeof(R)));
	}
	const R *yr = (const R *)y;
	const int32_t *pi = pos + i * topk;
	const float *wi = w != nullptr ? w + i * topk : nullptr;
	if (topk <= slots) {
		int32_t p[slots];
		float c[slots];
		bool any = unpermute_chunk(p, c, pi, wi, 0, topk, permCap);
		static_assert(slots == 8, "unpermute_units' groups M are for 8 slots");
		if (topk == 1) {
			unpermute_units<BF16, N, 8>(out, y, w, pos, i, topk, permCap, units, j0, stride, dnan, p, c, any);
		} else if (topk == 2) {
			unpermute_units<BF16, N, 4>(out, y, w, pos, i, topk, permCap, units, j0, stride, dnan, p, c, any);
		} else if (topk <= 4) {
			unpermute_units<BF16, N, 2>(out, y, w, pos, i, topk, permCap, units, j0, stride, dnan, p, c, any);
		} else {
			unpermute_units<BF16, N, 1>(out, y, w, pos, i, topk, permCap, units, j0, stride, dnan, p, c, any);
		}
		return;
	}
	for (int64_t j = j0; j < units; j += stride) {
		float acc[N];
#pragma unroll
		for (int n = 0; n < N; n++) {
			acc[n] = -0.0f;
		}
		bool any = false;
		for (int32_t k0 = 0; k0 < topk; k0 += slots) {
			int32_t p[slots];
			float c[slots];
			any |= unpermute_chunk(p, c, pi, wi, k0, topk, permCap);
			unpermute_slots<BF16, N>(acc, yr + j, p, c, min(slots, topk - k0), units,
						 wi != nullptr);
		}
		if (!unpermute_store<BF16, N>(out, i, units, j, acc, any)) {
			unpermute_exact<BF16, N>(out, y, w, pos, i, topk, permCap, units, j, dnan);
		}
	}
}

// zero_unit zeroes unit j (of unit = 16, 2 or 1 bytes) of row.
__device__ __forceinline__ void zero_unit(char *row, int32_t unit, int64_t j)
{
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

// zero_row zeroes the units of row p that this thread covers.
__device__ __forceinline__ void zero_row(void *px, int64_t rowBytes, int32_t unit, int64_t p)
{
	int64_t j = (int64_t)blockIdx.y * blockDim.x + threadIdx.x;
	int64_t units = rowBytes / unit;
	if (j >= units) {
		return;
	}
	zero_unit((char *)px + p * rowBytes, unit, j);
}

} // namespace goep_permute

using namespace goep_permute;

// permute_units dispatches permute_rows on the units per thread.
template <typename R>
__device__ __forceinline__ void permute_units(R *px, float *pw, const R *x, const float *w,
					      const int32_t *pos, int64_t rows, int32_t topk,
					      int64_t permCap, int64_t units, int32_t upt,
					      int32_t hints)
{
	switch (upt) {
	case 4:
		permute_rows<R, 4>(px, pw, x, w, pos, rows, topk, permCap, units, hints);
		break;
	case 2:
		permute_rows<R, 2>(px, pw, x, w, pos, rows, topk, permCap, units, hints);
		break;
	default:
		permute_rows<R, 1>(px, pw, x, w, pos, rows, topk, permCap, units, hints);
	}
}

// goep_permute_bf16 is permute.Permute for BF16 rows of hidden elements:
// for i < rows, k < topk with p = pos[i*topk+k] in [0, permCap): px[p] =
// x[i], and pw[p] = w[i*topk+k] when pw is not null. 16-byte units when
// vec16, else 2-byte elements; upt (1, 2 or 4; else 1) units per thread,
// hints as for load_row and store_row. Grid (rows, units/(blockDim.x*upt)
// rounded up).
extern "C" __global__ void __launch_bounds__(1024)
goep_permute_bf16(void *px, float *pw, const void *x, const float *w, const int32_t *pos,
		  int64_t rows, int32_t topk, int64_t permCap, int64_t hidden, int32_t vec16,
		  int32_t upt, int32_t hints)
{
	if (vec16) {
		permute_units<uint4>((uint4 *)px, pw, (const uint4 *)x, w, pos, rows, topk, permCap,
				     hidden / 8, upt, hints);
	} else {
		permute_units<uint16_t>((uint16_t *)px, pw, (const uint16_t *)x, w, pos, rows, topk,
					permCap, hidden, upt, hints);
	}
}

// goep_permute_fp32 is goep_permute_bf16 for FP32 rows.
extern "C" __global__ void __launch_bounds__(1024)
goep_permute_fp32(void *px, float *pw, const void *x, const float *w, const int32_t *pos,
		  int64_t rows, int32_t topk, int64_t permCap, int64_t hidden, int32_t vec16,
		  int32_t upt, int32_t hints)
{
	if (vec16) {
		permute_units<uint4>((uint4 *)px, pw, (const uint4 *)x, w, pos, rows, topk, permCap,
				     hidden / 4, upt, hints);
	} else {
		permute_units<uint32_t>((uint32_t *)px, pw, (const uint32_t *)x, w, pos, rows, topk,
					permCap, hidden, upt, hints);
	}
}

// goep_permute_staged is goep_permute_bf16 and goep_permute_fp32 for rows
// of units 16-byte units (any dtype: it moves bytes), staged in shared
// memory so that the GPU reads the rows in bursts and writes the permuted
// rows in the order of their positions. It is the faster shape for many
// rows at top-8 (docs/results/2026-12-04-h200-permute-staged.md).
//
// The grid's blocks work in rounds; in each, block b takes up to g rows,
// i = base + b + r*gridDim.x for r < g (the blocks together take
// consecutive rows, so the positions being written at any moment across
// the GPU lie close together within each expert's part of px):
//
//  1. it loads its rows into shared memory (cp.async, 16 bytes a thread,
//     all in flight at once; step 2's loads go first);
//  2. thread s < g*topk takes slot s of those rows (its position and
//     weight loaded before the rows): if the position p is in [0, permCap)
//     it ranks the slot among the block's valid slots by (position, slot
//     index) and writes the slot's weight (pw not null);
//  3. the block stores the valid slots' rows in the order of their ranks,
//     every thread one 16-byte unit at a time.
//
// The ranks are distinct whatever the positions hold (ties go by slot
// index), so every valid slot is stored exactly once and only in-range
// positions are written. Shared memory: g*units*16 bytes of rows, then
// g*topk int2 (position, row) and g*topk int32 keys; the host keeps
// g*topk <= blockDim.x. Grid (blocks, 1), blockDim.x <= 1024, two blocks
// an SM (__launch_bounds__(1024, 2): at most 32 registers a thread).
extern "C" __global__ void __launch_bounds__(1024, 2)
goep_permute_staged(uint4 *px, float *pw, const uint4 *x, const float *w, const int32_t *pos,
		    int64_t rows, int32_t topk, int64_t permCap, int32_t units, int32_t g)
{
	extern __shared__ uint4 stage[];
	int2 *order = (int2 *)(stage + (int64_t)g * units); // rank -> (position, row)
	int32_t *keys = (int32_t *)(order + g * topk);       // slot -> position, -1 if dropped
	const int64_t step = gridDim.x;
	for (int64_t base = 0; base < rows; base += step * g) {
		const int64_t first = base + blockIdx.x;
		const int32_t cnt = first >= rows ? 0 : (int32_t)min((int64_t)g, (rows - first + step - 1) / step);
		const int32_t pairs = cnt * topk;
		// The slot's position and weight, loaded before the rows so that
		// their latency hides behind the rows' (the weight unconditionally:
		// w holds every slot's when pw is not null).
		int32_t p = -1;
		float wv = 0.0f;
		if ((int32_t)threadIdx.x < pairs) {
			const int32_t r = threadIdx.x / topk;
			const int64_t slot = (first + r * step) * topk + (threadIdx.x - r * topk);
			p = __ldg(pos + slot);
			if (pw != nullptr) {
				wv = __ldg(w + slot);
			}
		}
		for (int32_t i = threadIdx.x; i < cnt * units; i += blockDim.x) {
			const int32_t r = i / units, u = i - r * units;
			asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(
					     (uint32_t)__cvta_generic_to_shared(&stage[i])),
				     "l"(x + (first + r * step) * units + u)
				     : "memory");
		}
		const bool valid = (int32_t)threadIdx.x < pairs && p >= 0 && p < permCap;
		if ((int32_t)threadIdx.x < pairs) {
			keys[threadIdx.x] = valid ? p : -1;
		}
		const int32_t nvalid = __syncthreads_count(valid);
		if (valid) {
			int32_t rank = 0;
			for (int32_t q = 0; q < pairs; q++) {
				const int32_t kq = keys[q];
				rank += kq >= 0 && (kq < p || (kq == p && q < (int32_t)threadIdx.x));
			}
			order[rank] = make_int2(p, threadIdx.x / topk);
			if (pw != nullptr) {
				pw[p] = wv;
			}
		}
		asm volatile("cp.async.wait_all;" ::: "memory");
		__syncthreads();
		for (int32_t i = threadIdx.x; i < nvalid * units; i += blockDim.x) {
			const int32_t q = i / units, u = i - q * units;
			const int2 o = order[q];
			px[(int64_t)o.x * units + u] = stage[o.y * units + u];
		}
		__syncthreads();
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
// elements) when vec16, else single elements. Grid (rows, gy) with any gy:
// a thread covers every gy*blockDim.x-th unit of its row; blockDim.x <=
// maxUnpermuteBlock.
extern "C" __global__ void __launch_bounds__(maxUnpermuteBlock, minUnpermuteBlocksBF16)
goep_unpermute_bf16(void *out, const void *y, const float *w, const int32_t *pos, int64_t rows,
		    int32_t topk, int64_t permCap, int64_t hidden, int32_t vec16, uint32_t dnan)
{
	if (vec16) {
		unpermute_rows<true, 8, false>(out, y, w, pos, rows, topk, permCap, hidden, dnan, nullptr,
					     nullptr, nullptr);
	} else {
		unpermute_rows<true, 1, false>(out, y, w, pos, rows, topk, permCap, hidden, dnan, nullptr,
					     nullptr, nullptr);
	}
}

// goep_unpermute_fp32 is goep_unpermute_bf16 for FP32 rows (4 elements per
// 16-byte unit).
extern "C" __global__ void __launch_bounds__(maxUnpermuteBlock, minUnpermuteBlocksFP32)
goep_unpermute_fp32(void *out, const void *y, const float *w, const int32_t *pos, int64_t rows,
		    int32_t topk, int64_t permCap, int64_t hidden, int32_t vec16, uint32_t dnan)
{
	if (vec16) {
		unpermute_rows<false, 4, false>(out, y, w, pos, rows, topk, permCap, hidden, dnan, nullptr,
					     nullptr, nullptr);
	} else {
		unpermute_rows<false, 1, false>(out, y, w, pos, rows, topk, permCap, hidden, dnan, nullptr,
					     nullptr, nullptr);
	}
}

// goep_unpermute_scatter_bf16 is goep_unpermute_bf16 with each output row
// stored elsewhere: row i at row toRow[i] (rows of hidden elements) of the
// buffer at address to[toRank[i]], not at all when toRow[i] < 0
// (permute.CUDAKernels.UnpermuteScatter; the executor's fused
// unpermute-combine stores into the peers' combine windows). 16-byte units
// when vec16 (every destination row 16-byte aligned).
extern "C" __global__ void __launch_bounds__(maxUnpermuteBlock, minUnpermuteBlocksBF16)
goep_unpermute_scatter_bf16(uint8_t *const *to, const int32_t *toRank, const int32_t *toRow,
			    const void *y, const float *w, const int32_t *pos, int64_t rows,
			    int32_t topk, int64_t permCap, int64_t hidden, int32_t vec16,
			    uint32_t dnan)
{
	if (vec16) {
		unpermute_rows<true, 8, true>(nullptr, y, w, pos, rows, topk, permCap, hidden, dnan, to,
					      toRank, toRow);
	} else {
		unpermute_rows<true, 1, true>(nullptr, y, w, pos, rows, topk, permCap, hidden, dnan, to,
					      toRank, toRow);
	}
}

// goep_unpermute_scatter_fp32 is goep_unpermute_scatter_bf16 for FP32
// rows.
extern "C" __global__ void __launch_bounds__(maxUnpermuteBlock, minUnpermuteBlocksFP32)
goep_unpermute_scatter_fp32(uint8_t *const *to, const int32_t *toRank, const int32_t *toRow,
			    const void *y, const float *w, const int32_t *pos, int64_t rows,
			    int32_t topk, int64_t permCap, int64_t hidden, int32_t vec16,
			    uint32_t dnan)
{
	if (vec16) {
		unpermute_rows<false, 4, true>(nullptr, y, w, pos, rows, topk, permCap, hidden, dnan, to,
					       toRank, toRow);
	} else {
		unpermute_rows<false, 1, true>(nullptr, y, w, pos, rows, topk, permCap, hidden, dnan, to,
					       toRank, toRow);
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

// goep_mark_rows marks the rows Permute writes: for each slot s < slots
// with p = pos[s] in [0, permCap), mark[p] = 1 (threads of slots sharing a
// row store the same byte). mark must be zeroed first. One thread a slot.
extern "C" __global__ void goep_mark_rows(uint8_t *mark, const int32_t *pos, int64_t slots,
					  int64_t permCap)
{
	int64_t s = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
	if (s >= slots) {
		return;
	}
	int64_t p = pos[s];
	if (p >= 0 && p < permCap) {
		mark[p] = 1;
	}
}

// goep_zero_unmarked zeroes every row p < permCap of px (rowBytes each, in
// units of unit = 16, 2 or 1 bytes) with mark[p] == 0, and pw[p] when pw
// is not null. A warp a row: warp w of block b takes rows b*W + w, then
// every gridDim.x*W rows after it (W warps a block), so a grid of any
// size covers the capacity and a marked row costs one load.
extern "C" __global__ void goep_zero_unmarked(void *px, float *pw, int64_t rowBytes,
					      const uint8_t *mark, int64_t permCap, int32_t unit)
{
	const int64_t warps = blockDim.x / 32, lane = threadIdx.x % 32;
	const int64_t units = rowBytes / unit;
	for (int64_t p = (int64_t)blockIdx.x * warps + threadIdx.x / 32; p < permCap;
	     p += (int64_t)gridDim.x * warps) {
		if (mark[p] != 0) {
			continue;
		}
		char *row = (char *)px + p * rowBytes;
		for (int64_t j = lane; j < units; j += 32) {
			zero_unit(row, unit, j);
		}
		if (pw != nullptr && lane == 0) {
			pw[p] = 0.0f;
		}
	}
}
