// permute_tma: what would bulk (TMA) copies, or other shapes of the
// scatter, buy the permute kernel?
//
// The target is a permute at >= 0.9 of a device-to-device copy. Of the
// kernels built from permute/kernels/permute.cu (PTX for compute_90 by
// Debian's nvcc 11.8, which CI regenerates), goep_permute_bf16 reaches
// 0.87-0.89 (bf16, top-8) on an H200 and goep_permute_staged (psorti2
// below) 0.92 (docs/PERFORMANCE.md, docs/results/).
// Bulk asynchronous copies (cp.async.bulk, PTX ISA 8.0) need a newer nvcc,
// so this standalone experiment is compiled on the GPU host, never by CI:
//
//	nvcc -O3 -arch=sm_90 -o permute_tma scripts/experiments/permute_tma.cu
//	./permute_tma [tokens hidden topk experts]     (default 4096 7168 8 64)
//
// PERMUTE_TMA_POOL=1 takes the row buffers from the default memory pool
// (cudaMallocAsync, as goep's stream allocations) instead of cudaMalloc.
//
// It builds the routing of permute's BenchmarkCUDA (each token picks topk
// distinct experts of 64 at random; positions expert-major, no padding),
// times each variant with CUDA events (median of 30 runs queued back to
// back after 5 warm-up runs)
// with the same traffic definition (copy: 2 x P rows; permute: tokens + P
// rows read and written, P = tokens x topk), checks every output row, and
// prints GB/s and the ratio to the copy:
//
//	copy          cudaMemcpyAsync of the P rows
//	gather        one block per output row, 16-byte loads and stores
//	scatter       one block per token: each 16-byte unit loaded once,
//	              stored topk times
//	memset        cudaMemsetAsync of the P rows: the write-only bound
//	              (its GB/s counts the P rows written)
//	seqfan        scatter's traffic with each token's k rows consecutive:
//	              the bound with perfect write locality (not checked)
//	warpdest      one block per token, warp j writes the row to destination j
//	rowblock      one block per (token, slot): one row to one destination
//	tma           persistent blocks, one elected thread: a bulk load of the
//	              token's row into shared memory (mbarrier), topk bulk
//	              stores from it; two buffers, so the next row's load
//	              overlaps this row's stores
//
// Diagnostics (what bounds the scatter; not permutes, not checked):
//
//	kcopy         the copy as a kernel: 16-byte loads and stores, 4 units a
//	              thread (is the driver's copy something SMs can match?)
//	kset          the memset as a kernel: 16-byte stores, grid-stride (GB/s
//	              of the bytes written)
//	fanconst      seqfan without loads: each thread stores a value made
//	              from its indices (the scatter's stores alone)
//	fanl2         seqfan reading row i % 64 of x (reads hit L2: the
//	              scatter's stores with cheap loads)
//
// Candidates (permutes, checked):
//
//	exact         scatter with U = 4 units a thread and a block of units/U
//	              threads (no idle lanes when units % U == 0): the shape
//	              of goep's kernel (exact2, exact8: U = 2, 8; exactcs:
//	              streaming stores)
//	pfN           exact whose block i first prefetches row i + N x SMs of
//	              x into L2 (prefetch.global.L2::evict_last): the reads
//	              spread over the run instead of bunching at each wave
//	              (pf9plain: without the evict-last policy; pf9cs: with
//	              streaming stores)
//	chunked       per chunk of 1024 tokens: a kernel prefetching the
//	              chunk's rows into L2, then exact over the chunk (reads
//	              and writes in separate phases)
//	phased        one block per SM (cooperative launch), rounds of g rows a
//	              block: all blocks load their rows into shared memory,
//	              the grid synchronizes, all store them, the grid
//	              synchronizes (reads and writes in separate phases across
//	              the GPU); phasedblk: the same without the grid syncs
//	stagedN       per chunk of N tokens: a kernel loading the chunk's rows
//	              (real loads, evict-last policy: the kernel ends when
//	              they are in L2), then the scatter reading them and
//	              storing with the evict-first policy
//	splitS        exact with each row cut into S parts, a block a part
//	              (a shorter tail: the last wave's blocks are S times
//	              shorter)
//	stagedwN      stagedN with the chunk made persisting by the stream's
//	              access policy window (plain loads) instead of the
//	              evict-last policy
//	aheadN        stagedN with chunk c+1 staged on a second stream while
//	              chunk c is scattered (the reads in bursts, overlapped)
//
// The staged variants keep rows in L2 only where L2 has a set-aside for
// persisting accesses: PERMUTE_TMA_PERSIST=BYTES (or max) sets
// cudaLimitPersistingL2CacheSize before the runs (the driver's default
// is 0; evict-last then protects nothing). PERMUTE_TMA_ONLY=a,b,c runs
// only those variants (and the copy).
//
//	pipe          persistent blocks over tokens; each thread loads the
//	              next token's units into registers before it stores the
//	              current token's (software pipelining: the loads' latency
//	              hidden behind the stores)
//	pipecs        pipe with streaming stores (st.global.cs)
//	hint256       exact with ld.global.nc.L2::256B loads (a miss fetches
//	              the whole 256-byte block); hintef: the L2 evict-first
//	              policy on the loads; hintboth: both
//	multiT        exact with T = 2 or 4 consecutive tokens a block, all
//	              their loads issued before any store
//	grpG          persistent blocks over groups of G consecutive tokens,
//	              two shared buffers of G rows: the next group loaded with
//	              cp.async while this one is stored (phasedblk,
//	              double-buffered); G = 8, 4, 2, 1 with blocks of 1024,
//	              512, 256, 256 threads
//
// The traffic mix's bound (diagnostics; not permutes, not checked). Their GB/s count the permute's bytes (tokens + P rows),
// so their ratio is what a permute moving the same bytes in that mix
// would reach if the data dependency and the addresses cost nothing:
//
//	readx         the tokens' rows read, nothing written (GB/s of the
//	              bytes read)
//	mixblk        one kernel, (topk + 1) x tokens blocks: in every group of
//	              topk + 1, one block reads a token's row (xored into a
//	              sink) and topk blocks store a constant to that token's
//	              topk rows of out (consecutive); no store waits for a load
//	mixstream     cudaMemsetAsync of the P rows on one stream while a
//	              kernel on a second stream reads the tokens' rows: the
//	              driver's write path and the read path at once
//	mixcopy       mixstream with P rows read instead of tokens (the
//	              copy's 1:1 mix; GB/s of 2 x P rows): is mixstream a fair
//	              way to run a mix?
//	indep         exact's shape and addresses, the stores a constant
//	              independent of the loads (the loads xored into a sink)
//
// Staged shapes (permutes, checked unless said):
//
//	phasednold,   phased without its loads; without its stores; storing
//	phasednost,   each token's rows consecutively (diagnostics, not
//	phasedseq     checked); phased8, phased4: phased with 8 or 4 rows a
//	              block a round
//	pxB[h], pwB   phasedx: B blocks an SM (h: of 512 threads), the rows of
//	              a round loaded flat, stored a unit a thread (px) or a
//	              whole row a warp (pw), the grid synchronized (cooperative
//	              launch); ...blk: without the grid synchronization;
//	              pxi...: interleaved rows (block b takes tokens b, b +
//	              grid, ...); pxi2cN: at most N rows a round; pxi2tT: T
//	              threads a block; pxi2cs, pxi2ef: streaming stores; the
//	              loads with the L2 evict-first policy
//	psort[i]B     phasedx (no grid synchronization, interleaved with i)
//	              storing the block's rows in the order of their
//	              positions: goep_permute_staged's shape (psorti2)
//
// Unpermute's shape (not checked): usum sums each token's k permuted rows
// of y (weight 0.5, fp32, plain IEEE: no NaN rules), one block per token,
// a unit's k loads in flight together; uread does the loads only. copy2
// is the copy again, last: the drift over the run.
//
// bf16 only (the dtype the target is stated for); rows are hidden x 2 bytes, a
// multiple of 16 as bulk copies need.

#include <algorithm>
#include <cooperative_groups.h>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <cstring>
#include <map>
#include <tuple>
#include <utility>
#include <vector>

#define CHECK(x)                                                                             \
	do {                                                                                 \
		cudaError_t e_ = (x);                                                        \
		if (e_ != cudaSuccess) {                                                     \
			fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x,           \
				cudaGetErrorString(e_));                                     \
			exit(1);                                                             \
		}                                                                            \
	} while (0)

// gather: out[p] = x[src[p]], one block per output row.
__global__ void gather(uint4 *out, const uint4 *x, const int32_t *src, int64_t p, int64_t units)
{
	int64_t r = blockIdx.x;
	if (r >= p) {
		return;
	}
	const uint4 *s = x + (int64_t)src[r] * units;
	uint4 *d = out + r * units;
	for (int64_t u = threadIdx.x; u < units; u += blockDim.x) {
		d[u] = s[u];
	}
}

// scatter: out[pos[i*k+j]] = x[i] for j < k, one block per token. With
// pos null (seqfan) token i's rows go to rows i*k .. i*k+k-1: the same
// traffic with perfect write locality, a bound rather than a permute.
__global__ void scatter(uint4 *out, const uint4 *x, const int32_t *pos, int64_t n, int32_t k,
			int64_t units)
{
	int64_t i = blockIdx.x;
	if (i >= n) {
		return;
	}
	const uint4 *s = x + i * units;
	for (int64_t u = threadIdx.x; u < units; u += blockDim.x) {
		uint4 v = s[u];
		for (int32_t j = 0; j < k; j++) {
			int64_t row = pos != nullptr ? (int64_t)pos[i * k + j] : i * k + j;
			out[row * units + u] = v;
		}
	}
}

// warpdest: one block per token, warp j (of k) writes the whole row to
// destination j (each warp reads the row: from L1/L2 after the first).
__global__ void warpdest(uint4 *out, const uint4 *x, const int32_t *pos, int64_t n, int32_t k,
			 int64_t units)
{
	int64_t i = blockIdx.x;
	int32_t j = threadIdx.x / 32;
	if (i >= n || j >= k) {
		return;
	}
	const uint4 *s = x + i * units;
	uint4 *d = out + (int64_t)pos[i * k + j] * units;
	for (int64_t u = threadIdx.x % 32; u < units; u += 32) {
		d[u] = s[u];
	}
}

// rowblock: one block per (token, slot), adjacent blocks for one token:
// each copies the token's row to one destination.
__global__ void rowblock(uint4 *out, const uint4 *x, const int32_t *pos, int64_t n, int32_t k,
			 int64_t units)
{
	int64_t b = blockIdx.x;
	if (b >= n * k) {
		return;
	}
	const uint4 *s = x + (b / k) * units;
	uint4 *d = out + (int64_t)pos[b] * units;
	for (int64_t u = threadIdx.x; u < units; u += blockDim.x) {
		d[u] = s[u];
	}
}

// kcopy: out = y over n units, 4 units a thread per step, grid-stride.
__global__ void kcopy(uint4 *__restrict__ out, const uint4 *__restrict__ y, int64_t n)
{
	const int64_t stride = (int64_t)gridDim.x * blockDim.x;
	for (int64_t u = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; u < n; u += 4 * stride) {
		uint4 v[4];
#pragma unroll
		for (int q = 0; q < 4; q++) {
			if (u + q * stride < n) {
				v[q] = y[u + q * stride];
			}
		}
#pragma unroll
		for (int q = 0; q < 4; q++) {
			if (u + q * stride < n) {
				out[u + q * stride] = v[q];
			}
		}
	}
}

// kset: out = 0 over n units, 4 stores a thread per step, grid-stride.
__global__ void kset(uint4 *__restrict__ out, int64_t n)
{
	const int64_t stride = (int64_t)gridDim.x * blockDim.x;
	for (int64_t u = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; u < n; u += stride) {
		out[u] = make_uint4(0, 0, 0, 0);
	}
}

// fan: seqfan's stores; mode 0 stores a value made from the indices (no
// loads), mode 1 loads row i % 64 of x (an L2 hit after the first).
__global__ void fan(uint4 *__restrict__ out, const uint4 *__restrict__ x, int64_t n, int32_t k,
		    int64_t units, int mode)
{
	int64_t i = blockIdx.x;
	if (i >= n) {
		return;
	}
	for (int64_t u = threadIdx.x; u < units; u += blockDim.x) {
		uint4 v = mode == 0 ? make_uint4((uint32_t)i, (uint32_t)u, 0, 0) : x[(i % 64) * units + u];
		for (int32_t j = 0; j < k; j++) {
			out[(i * k + j) * units + u] = v;
		}
	}
}

// prefetch_row asks L2 for the 128-byte lines of row r of x (units of 16
// bytes): evict-last when last (they are read once, later, while the
// writes stream through L2), else with the default policy.
__device__ __forceinline__ void prefetch_row(const uint4 *x, int64_t r, int64_t units, bool last)
{
	const char *row = (const char *)(x + r * units);
	for (int64_t b = (int64_t)threadIdx.x * 128; b < units * 16; b += (int64_t)blockDim.x * 128) {
		if (last) {
			asm volatile("prefetch.global.L2::evict_last [%0];" ::"l"(row + b));
		} else {
			asm volatile("prefetch.global.L2 [%0];" ::"l"(row + b));
		}
	}
}

// exact: scatter with U units a thread (units j, j + blockDim.x, ...),
// one block per token. With ahead > 0 block i first prefetches row i +
// ahead into L2 (about a wave of blocks later, the block that copies it
// finds it there), so the reads spread over the writes instead of
// bunching at the waves' starts; evict-last when last. CS: streaming
// stores (st.global.cs).
template <int U, bool CS>
__global__ void exact(uint4 *__restrict__ out, const uint4 *__restrict__ x, const int32_t *__restrict__ pos,
		      int64_t n, int32_t k, int64_t units, int64_t ahead, bool last = true)
{
	int64_t i = blockIdx.x;
	if (i >= n) {
		return;
	}
	if (ahead > 0 && i + ahead < n) {
		prefetch_row(x, i + ahead, units, last);
	}
	const uint4 *s = x + i * units;
	for (int64_t u0 = threadIdx.x; u0 < units; u0 += (int64_t)U * blockDim.x) {
		uint4 v[U];
#pragma unroll
		for (int q = 0; q < U; q++) {
			if (u0 + q * blockDim.x < units) {
				v[q] = s[u0 + q * blockDim.x];
			}
		}
		for (int32_t j = 0; j < k; j++) {
			uint4 *d = out + (int64_t)pos[i * k + j] * units;
#pragma unroll
			for (int q = 0; q < U; q++) {
				if (u0 + q * blockDim.x < units) {
					if (CS) {
						__stcs(d + u0 + q * blockDim.x, v[q]);
					} else {
						d[u0 + q * blockDim.x] = v[q];
					}
				}
			}
		}
	}
}

// split: exact with each row cut into S parts, one block a part (block b:
// token b / S, part b % S, units [part x per, part x per + per)), 4 units a
// thread: blocks S times shorter, so the grid's last partial wave is too.
__global__ void split(uint4 *__restrict__ out, const uint4 *__restrict__ x, const int32_t *__restrict__ pos,
		      int64_t n, int32_t k, int64_t units, int32_t S)
{
	const int64_t i = blockIdx.x / S;
	const int64_t per = (units + S - 1) / S;
	const int64_t lo = (blockIdx.x % S) * per, hi = lo + per < units ? lo + per : units;
	if (i >= n) {
		return;
	}
	const uint4 *s = x + i * units;
	for (int64_t u0 = lo + threadIdx.x; u0 < hi; u0 += 4 * (int64_t)blockDim.x) {
		uint4 v[4];
#pragma unroll
		for (int q = 0; q < 4; q++) {
			if (u0 + q * blockDim.x < hi) {
				v[q] = s[u0 + q * blockDim.x];
			}
		}
		for (int32_t j = 0; j < k; j++) {
			uint4 *d = out + (int64_t)pos[i * k + j] * units;
#pragma unroll
			for (int q = 0; q < 4; q++) {
				if (u0 + q * blockDim.x < hi) {
					d[u0 + q * blockDim.x] = v[q];
				}
			}
		}
	}
}

static void splitRun(cudaStream_t s, int32_t S);

// prefetch: rows [lo, hi) of x into L2, one block per row (the first
// phase of chunked: reads alone, then the chunk's scatter from L2).
__global__ void prefetch(const uint4 *x, int64_t lo, int64_t hi, int64_t units)
{
	if (lo + blockIdx.x < hi) {
		prefetch_row(x, lo + blockIdx.x, units, true);
	}
}

// L2 cache policies (createpolicy, sm_80): loads that keep their lines
// in L2 (evict-last) or drop them first (evict-first).
__device__ __forceinline__ uint64_t policy(bool last)
{
	uint64_t p;
	if (last) {
		asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(p));
	} else {
		asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p));
	}
	return p;
}

__device__ __forceinline__ uint4 load_policy(const uint4 *a, uint64_t pol)
{
	uint4 v;
	asm volatile("ld.global.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
		     : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
		     : "l"(a), "l"(pol));
	return v;
}

__device__ __forceinline__ void store_policy(uint4 *a, uint4 v, uint64_t pol)
{
	asm volatile("st.global.L2::cache_hint.v4.u32 [%0], {%1, %2, %3, %4}, %5;" ::"l"(a), "r"(v.x), "r"(v.y),
		     "r"(v.z), "r"(v.w), "l"(pol)
		     : "memory");
}

// stage: loads units [0, n) of x (really: the data reaches the SMs, so
// the kernel ends when it is in L2) with the evict-last policy (plain
// loads when !last: the stream's access policy window decides); sink is
// written only if the xor of everything is a value it never is.
__global__ void stage(const uint4 *__restrict__ x, int64_t n, uint32_t *sink, bool last = true)
{
	const uint64_t pol = policy(true);
	uint32_t acc = 0;
	for (int64_t u = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; u < n; u += (int64_t)gridDim.x * blockDim.x) {
		uint4 v = last ? load_policy(x + u, pol) : x[u];
		acc ^= v.x ^ v.y ^ v.z ^ v.w;
	}
	if (acc == 0x9e3779b9u && sink != nullptr) {
		*sink = acc;
	}
}

// readrows: loads units [0, n) of x, 4 units a thread in flight,
// grid-stride; the xor of everything goes to sink only if it is a value
// it never is (so the loads are not dropped).
__global__ void readrows(const uint4 *__restrict__ x, int64_t n, uint32_t *sink)
{
	const int64_t stride = (int64_t)gridDim.x * blockDim.x;
	uint32_t acc = 0;
	for (int64_t u = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; u < n; u += 4 * stride) {
		uint4 v[4];
#pragma unroll
		for (int q = 0; q < 4; q++) {
			v[q] = u + q * stride < n ? x[u + q * stride] : make_uint4(0, 0, 0, 0);
		}
#pragma unroll
		for (int q = 0; q < 4; q++) {
			acc ^= v[q].x ^ v[q].y ^ v[q].z ^ v[q].w;
		}
	}
	if (acc == 0x9e3779b9u && sink != nullptr) {
		*sink = acc;
	}
}

// mixblk: the permute's traffic with no store waiting for a load. Block
// b of (k + 1) x n: g = b / (k + 1), r = b % (k + 1); r == 0 reads row g
// of x, r > 0 stores a constant to row g x k + r - 1 of out. Blocks start
// roughly in order, so the reads spread evenly over the writes.
__global__ void mixblk(uint4 *__restrict__ out, const uint4 *__restrict__ x, int64_t n, int32_t k, int64_t units,
		       uint32_t *sink, const int32_t *__restrict__ pos = nullptr, bool front = false)
{
	int64_t g = blockIdx.x / (k + 1), r = blockIdx.x % (k + 1);
	if (front) {
		// Blocks [0, n) read, the rest write: the reads in a burst first.
		if (blockIdx.x < n) {
			g = blockIdx.x, r = 0;
		} else {
			g = (blockIdx.x - n) / k, r = (blockIdx.x - n) % k + 1;
		}
	}
	if (g >= n) {
		return;
	}
	if (r == 0) {
		const uint4 *s = x + g * units;
		uint32_t acc = 0;
		for (int64_t u = threadIdx.x; u < units; u += 4 * (int64_t)blockDim.x) {
			uint4 v[4];
#pragma unroll
			for (int q = 0; q < 4; q++) {
				v[q] = u + q * blockDim.x < units ? s[u + q * blockDim.x] : make_uint4(0, 0, 0, 0);
			}
#pragma unroll
			for (int q = 0; q < 4; q++) {
				acc ^= v[q].x ^ v[q].y ^ v[q].z ^ v[q].w;
			}
		}
		if (acc == 0x9e3779b9u && sink != nullptr) {
			*sink = acc;
		}
		return;
	}
	uint4 *d = out + (pos != nullptr ? (int64_t)pos[g * k + r - 1] : g * k + r - 1) * units;
	const uint4 c = make_uint4((uint32_t)g, (uint32_t)r, 0, 0);
	for (int64_t u = threadIdx.x; u < units; u += blockDim.x) {
		d[u] = c;
	}
}

// indep: exact's shape (4 units a thread, one block per token, the same
// destinations) with every store a constant: the loads are still made
// (xored into sink) but no store waits for them.
__global__ void indep(uint4 *__restrict__ out, const uint4 *__restrict__ x, const int32_t *__restrict__ pos,
		      int64_t n, int32_t k, int64_t units, uint32_t *sink, bool seq = false)
{
	int64_t i = blockIdx.x;
	if (i >= n) {
		return;
	}
	const uint4 *s = x + i * units;
	const uint4 c = make_uint4((uint32_t)i, 0, 0, 0);
	uint32_t acc = 0;
	for (int64_t u0 = threadIdx.x; u0 < units; u0 += 4 * (int64_t)blockDim.x) {
		uint4 v[4];
#pragma unroll
		for (int q = 0; q < 4; q++) {
			v[q] = u0 + q * blockDim.x < units ? s[u0 + q * blockDim.x] : make_uint4(0, 0, 0, 0);
		}
		for (int32_t j = 0; j < k; j++) {
			uint4 *d = out + (seq ? i * k + j : (int64_t)pos[i * k + j]) * units;
#pragma unroll
			for (int q = 0; q < 4; q++) {
				if (u0 + q * blockDim.x < units) {
					d[u0 + q * blockDim.x] = c;
				}
			}
		}
#pragma unroll
		for (int q = 0; q < 4; q++) {
			acc ^= v[q].x ^ v[q].y ^ v[q].z ^ v[q].w;
		}
	}
	if (acc == 0x9e3779b9u && sink != nullptr) {
		*sink = acc;
	}
}

// phased: reads and writes in separate phases across the whole GPU. One
// block per SM (a cooperative launch), rounds of g tokens a block: every
// block loads its g rows into shared memory (cp.async), the grid synchronizes, every
// block stores them to their k positions from there, the grid
// synchronizes again. With GRID false only the block synchronizes (the
// same shape without the global phases).
template <bool GRID>
__global__ void phased(uint4 *__restrict__ out, const uint4 *__restrict__ x, const int32_t *__restrict__ pos,
		       int64_t n, int32_t k, int64_t units, int32_t g, int32_t mode)
{
	// mode (diagnostics): bit 0 skips the loads, bit 1 the stores; bit 2
	// stores each token's k rows consecutively instead of at pos.
	extern __shared__ uint4 rows[];
	namespace cg = cooperative_groups;
	const int64_t perRound = (int64_t)gridDim.x * g;
	for (int64_t base = 0; base < n; base += perRound) {
		const int64_t t0 = base + (int64_t)blockIdx.x * g;
		// The loads as asynchronous copies (cp.async, sm_80): all of them
		// in flight at once, none through registers.
		for (int32_t r = 0; r < g; r++) {
			if (t0 + r < n && (mode & 1) == 0) {
				for (int64_t u = threadIdx.x; u < units; u += blockDim.x) {
					asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(
							     (uint32_t)__cvta_generic_to_shared(&rows[r * units + u])),
						     "l"(x + (t0 + r) * units + u)
						     : "memory");
				}
			}
		}
		asm volatile("cp.async.wait_all;" ::: "memory");
		__syncthreads();
		if (GRID) {
			cg::this_grid().sync();
		}
		for (int32_t r = 0; r < g; r++) {
			if (t0 + r >= n || (mode & 2) != 0) {
				break;
			}
			for (int64_t u = threadIdx.x; u < units; u += blockDim.x) {
				uint4 v = rows[r * units + u];
				for (int32_t j = 0; j < k; j++) {
					const int64_t p = (mode & 4) != 0 ? (t0 + r) * k + j : (int64_t)pos[(t0 + r) * k + j];
					out[p * units + u] = v;
				}
			}
		}
		__syncthreads();
		if (GRID) {
			cg::this_grid().sync();
		}
	}
}

// phasedx: phased with the rows of a round flat (a block's g rows of x
// are consecutive, so the loads are one cp.async per 16 bytes over
// cnt x units, no idle threads), any number of blocks an SM, and two
// shapes of the store phase: WARPROW false, a thread stores its units k
// times (as phased); WARPROW true, warp w writes whole destination rows
// (row r, slot j), 4 units a lane in flight. GRID: the grid synchronizes
// after the loads and after the stores (cooperative launch), so every
// round's reads reach DRAM as one burst.
//
// IL (interleaved): a block's rows of a round are tokens base + i x
// gridDim.x + blockIdx.x (i < g) instead of g consecutive ones, so that
// at any moment the blocks store consecutive tokens' rows (next to each
// other within each expert's part of out).
template <bool GRID, bool WARPROW, bool IL = false>
__global__ void phasedx(uint4 *__restrict__ out, const uint4 *__restrict__ x, const int32_t *__restrict__ pos,
			int32_t n, int32_t k, int32_t units, int32_t g, int32_t flags)
{
	// flags: bit 0 streaming stores (st.global.cs); bit 1 the loads with
	// the L2 evict-first policy.
	extern __shared__ uint4 rows[];
	namespace cg = cooperative_groups;
	const uint64_t first = policy(false);
	const int32_t perRound = (int32_t)gridDim.x * g;
	for (int32_t base = 0; base < n; base += perRound) {
		// Row i of this block is token t0 + i x step.
		const int32_t t0 = IL ? base + (int32_t)blockIdx.x : base + (int32_t)blockIdx.x * g;
		const int32_t step = IL ? (int32_t)gridDim.x : 1;
		const int32_t cnt = t0 >= n ? 0 : min(g, (n - t0 + step - 1) / step);
		for (int32_t i = threadIdx.x; i < cnt * units; i += blockDim.x) {
			const int32_t r = i / units, u = i - r * units;
			if (flags & 2) {
				asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2;" ::"r"(
						     (uint32_t)__cvta_generic_to_shared(&rows[i])),
					     "l"(x + (int64_t)(t0 + r * step) * units + u), "l"(first)
					     : "memory");
			} else {
				asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(
						     (uint32_t)__cvta_generic_to_shared(&rows[i])),
					     "l"(x + (int64_t)(t0 + r * step) * units + u)
					     : "memory");
			}
		}
		asm volatile("cp.async.wait_all;" ::: "memory");
		__syncthreads();
		if (GRID) {
			cg::this_grid().sync();
		}
		if (WARPROW) {
			const int32_t warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
			for (int32_t idx = warp; idx < cnt * k; idx += warps) {
				const int32_t r = idx / k;
				uint4 *d = out + (int64_t)pos[(int64_t)(t0 + r * step) * k + idx % k] * units;
				const uint4 *sr = rows + r * units;
				for (int32_t u = lane; u < units; u += 4 * 32) {
					uint4 v[4];
#pragma unroll
					for (int q = 0; q < 4; q++) {
						if (u + q * 32 < units) {
							v[q] = sr[u + q * 32];
						}
					}
#pragma unroll
					for (int q = 0; q < 4; q++) {
						if (u + q * 32 < units) {
							d[u + q * 32] = v[q];
						}
					}
				}
			}
		} else {
			for (int32_t i = threadIdx.x; i < cnt * units; i += blockDim.x) {
				const int32_t r = i / units, u = i - r * units;
				const uint4 v = rows[i];
				const int32_t *pr = pos + (int64_t)(t0 + r * step) * k;
				for (int32_t j = 0; j < k; j++) {
					if (flags & 1) {
						__stcs(out + (int64_t)pr[j] * units + u, v);
					} else {
						out[(int64_t)pr[j] * units + u] = v;
					}
				}
			}
		}
		__syncthreads();
		if (GRID) {
			cg::this_grid().sync();
		}
	}
}

// psort: phasedx (no grid sync) whose store phase runs in the order of
// the destination rows: after its rows are in shared memory, a block
// ranks its g x k (row, slot) pairs by position (each pair's rank is the
// number of pairs with a smaller position; positions are distinct) and
// then stores whole rows in that order, the block on one row at a time.
// Every block sweeps its part of out from low positions to high, so the
// rows being written across the GPU at any moment lie close together.
template <bool IL>
__global__ void psort(uint4 *__restrict__ out, const uint4 *__restrict__ x, const int32_t *__restrict__ pos,
		      int32_t n, int32_t k, int32_t units, int32_t g)
{
	extern __shared__ uint4 rows[];
	int2 *order = (int2 *)(rows + (int64_t)g * units); // rank -> (position, row)
	const int32_t perRound = (int32_t)gridDim.x * g;
	for (int32_t base = 0; base < n; base += perRound) {
		const int32_t t0 = IL ? base + (int32_t)blockIdx.x : base + (int32_t)blockIdx.x * g;
		const int32_t step = IL ? (int32_t)gridDim.x : 1;
		const int32_t cnt = t0 >= n ? 0 : min(g, (n - t0 + step - 1) / step);
		for (int32_t i = threadIdx.x; i < cnt * units; i += blockDim.x) {
			const int32_t r = i / units, u = i - r * units;
			asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(
					     (uint32_t)__cvta_generic_to_shared(&rows[i])),
				     "l"(x + (int64_t)(t0 + r * step) * units + u)
				     : "memory");
		}
		const int32_t pairs = cnt * k;
		if (threadIdx.x < pairs) {
			const int32_t r = threadIdx.x / k;
			const int32_t p = pos[(int64_t)(t0 + r * step) * k + threadIdx.x % k];
			int32_t rank = 0;
			for (int32_t q = 0; q < pairs; q++) {
				const int32_t rq = q / k;
				rank += pos[(int64_t)(t0 + rq * step) * k + q % k] < p;
			}
			order[rank] = make_int2(p, r);
		}
		asm volatile("cp.async.wait_all;" ::: "memory");
		__syncthreads();
		for (int32_t i = threadIdx.x; i < pairs * units; i += blockDim.x) {
			const int32_t q = i / units, u = i - q * units;
			const int2 o = order[q];
			out[(int64_t)o.x * units + u] = rows[o.y * units + u];
		}
		__syncthreads();
	}
}

// hint: exact (4 units a thread) with a cache hint on its loads. mode 0:
// ld.global.nc.L2::256B (on a miss L2 fetches the whole 256-byte block
// from DRAM: fewer, longer reads between the writes); mode 1: the L2
// evict-first policy (the row is dead after its one read); mode 2: both.
// Mode 3 is staged's scatter: loads through L2 (not the read-only path)
// and stores, both evict-first, so that the chunk that stage kept in L2
// is not pushed out by the stores.
__global__ void hint(uint4 *__restrict__ out, const uint4 *__restrict__ x, const int32_t *__restrict__ pos,
		     int64_t n, int32_t k, int64_t units, int mode)
{
	int64_t i = blockIdx.x;
	if (i >= n) {
		return;
	}
	const uint64_t first = policy(false);
	const uint4 *s = x + i * units;
	for (int64_t u0 = threadIdx.x; u0 < units; u0 += 4 * (int64_t)blockDim.x) {
		uint4 v[4];
#pragma unroll
		for (int q = 0; q < 4; q++) {
			const uint4 *a = s + u0 + q * blockDim.x;
			if (u0 + q * blockDim.x >= units) {
				continue;
			}
			if (mode == 0) {
				asm volatile("ld.global.nc.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
					     : "=r"(v[q].x), "=r"(v[q].y), "=r"(v[q].z), "=r"(v[q].w)
					     : "l"(a));
			} else if (mode == 1) {
				asm volatile("ld.global.nc.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
					     : "=r"(v[q].x), "=r"(v[q].y), "=r"(v[q].z), "=r"(v[q].w)
					     : "l"(a), "l"(first));
			} else if (mode == 2) {
				asm volatile("ld.global.nc.L2::cache_hint.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
					     : "=r"(v[q].x), "=r"(v[q].y), "=r"(v[q].z), "=r"(v[q].w)
					     : "l"(a), "l"(first));
			} else {
				v[q] = load_policy(a, first);
			}
		}
		for (int32_t j = 0; j < k; j++) {
			uint4 *d = out + (int64_t)pos[i * k + j] * units;
#pragma unroll
			for (int q = 0; q < 4; q++) {
				if (u0 + q * blockDim.x >= units) {
					continue;
				}
				if (mode == 3) {
					store_policy(d + u0 + q * blockDim.x, v[q], first);
				} else {
					d[u0 + q * blockDim.x] = v[q];
				}
			}
		}
	}
}

// multi: exact with T consecutive tokens a block: a thread loads its 4
// units of all T rows (4T loads in flight) before any store.
template <int T>
__global__ void multi(uint4 *__restrict__ out, const uint4 *__restrict__ x, const int32_t *__restrict__ pos,
		      int64_t n, int32_t k, int64_t units)
{
	const int64_t i0 = (int64_t)blockIdx.x * T;
	for (int64_t u0 = threadIdx.x; u0 < units; u0 += 4 * (int64_t)blockDim.x) {
		uint4 v[T][4];
#pragma unroll
		for (int t = 0; t < T; t++) {
#pragma unroll
			for (int q = 0; q < 4; q++) {
				if (i0 + t < n && u0 + q * blockDim.x < units) {
					v[t][q] = x[(i0 + t) * units + u0 + q * blockDim.x];
				}
			}
		}
#pragma unroll
		for (int t = 0; t < T; t++) {
			if (i0 + t >= n) {
				break;
			}
			for (int32_t j = 0; j < k; j++) {
				uint4 *d = out + (int64_t)pos[(i0 + t) * k + j] * units;
#pragma unroll
				for (int q = 0; q < 4; q++) {
					if (u0 + q * blockDim.x < units) {
						d[u0 + q * blockDim.x] = v[t][q];
					}
				}
			}
		}
	}
}

// grp: persistent blocks over groups of G consecutive tokens (block b
// takes groups b, b + gridDim.x, ...), with two shared buffers of G rows:
// the next group's rows are loaded with cp.async while this group's are
// stored, k times each, from shared memory (phasedblk, double-buffered).
template <int G>
__global__ void grp(uint4 *__restrict__ out, const uint4 *__restrict__ x, const int32_t *__restrict__ pos,
		    int64_t n, int32_t k, int64_t units)
{
	extern __shared__ uint4 rows[];
	const int64_t groups = (n + G - 1) / G;
	auto load = [&](int64_t g, int buf) {
		if (g < groups) {
			for (int r = 0; r < G; r++) {
				const int64_t t = g * G + r;
				if (t >= n) {
					break;
				}
				for (int64_t u = threadIdx.x; u < units; u += blockDim.x) {
					asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(
							     (uint32_t)__cvta_generic_to_shared(&rows[(buf * G + r) * units + u])),
						     "l"(x + t * units + u)
						     : "memory");
				}
			}
		}
		asm volatile("cp.async.commit_group;" ::: "memory");
	};
	int buf = 0;
	load(blockIdx.x, 0);
	for (int64_t g = blockIdx.x; g < groups; g += gridDim.x) {
		load(g + gridDim.x, buf ^ 1);
		asm volatile("cp.async.wait_group 1;" ::: "memory");
		__syncthreads();
		for (int r = 0; r < G; r++) {
			const int64_t t = g * G + r;
			if (t >= n) {
				break;
			}
			for (int64_t u = threadIdx.x; u < units; u += blockDim.x) {
				uint4 v = rows[(buf * G + r) * units + u];
				for (int32_t j = 0; j < k; j++) {
					out[(int64_t)pos[t * k + j] * units + u] = v;
				}
			}
		}
		__syncthreads();
		buf ^= 1;
	}
	asm volatile("cp.async.wait_all;" ::: "memory");
}

// usum: an unpermute's traffic and arithmetic without goep's NaN rules:
// out[i] = bf16(sum over j < k of w * y[pos[i*k+j]]) in fp32, one block
// per token, U = 4 units a thread, a unit's k loads issued together. With
// SUM false (uread) the loaded words are only xor-ed: the loads alone.
template <bool SUM>
__global__ void usum(uint4 *__restrict__ out, const uint4 *__restrict__ y, const int32_t *__restrict__ pos,
		     int64_t n, int32_t k, int64_t units)
{
	int64_t i = blockIdx.x;
	if (i >= n || k > 8) {
		return;
	}
	int64_t p[8];
	for (int j = 0; j < 8; j++) {
		p[j] = j < k ? (int64_t)pos[i * k + j] : 0;
	}
	for (int64_t u = threadIdx.x; u < units; u += blockDim.x) {
		uint4 r[8];
#pragma unroll
		for (int j = 0; j < 8; j++) {
			if (j < k) {
				r[j] = __ldcs(y + p[j] * units + u);
			}
		}
		uint32_t o[4] = {0, 0, 0, 0};
		if (SUM) {
			float acc[8] = {-0.0f, -0.0f, -0.0f, -0.0f, -0.0f, -0.0f, -0.0f, -0.0f};
#pragma unroll
			for (int j = 0; j < 8; j++) {
				if (j < k) {
					uint32_t w[4] = {r[j].x, r[j].y, r[j].z, r[j].w};
#pragma unroll
					for (int q = 0; q < 4; q++) {
						acc[2 * q] = __fadd_rn(acc[2 * q], __fmul_rn(0.5f, __uint_as_float(w[q] << 16)));
						acc[2 * q + 1] = __fadd_rn(acc[2 * q + 1],
									   __fmul_rn(0.5f, __uint_as_float(w[q] & 0xffff0000u)));
					}
				}
			}
#pragma unroll
			for (int q = 0; q < 4; q++) {
				o[q] = (__float_as_uint(acc[2 * q]) >> 16) | (__float_as_uint(acc[2 * q + 1]) & 0xffff0000u);
			}
		} else {
#pragma unroll
			for (int j = 0; j < 8; j++) {
				if (j < k) {
					o[0] ^= r[j].x, o[1] ^= r[j].y, o[2] ^= r[j].z, o[3] ^= r[j].w;
				}
			}
		}
		out[i * units + u] = make_uint4(o[0], o[1], o[2], o[3]);
	}
}

// pipe: persistent blocks; block b takes tokens b, b + gridDim.x, ...;
// thread t moves units t + q*blockDim.x (q < U) of each (rows of at most
// U*blockDim.x units). The next token's units are loaded before the
// current token's stores, so a load's latency overlaps k stores.
template <int U, bool CS>
__global__ void pipe(uint4 *__restrict__ out, const uint4 *__restrict__ x, const int32_t *__restrict__ pos,
		     int64_t n, int32_t k, int64_t units)
{
	uint4 cur[U], nxt[U];
	int64_t i = blockIdx.x;
	if (i >= n) {
		return;
	}
#pragma unroll
	for (int q = 0; q < U; q++) {
		int64_t u = threadIdx.x + q * blockDim.x;
		if (u < units) {
			cur[q] = x[i * units + u];
		}
	}
	for (; i < n; i += gridDim.x) {
		int64_t next = i + gridDim.x;
		if (next < n) {
#pragma unroll
			for (int q = 0; q < U; q++) {
				int64_t u = threadIdx.x + q * blockDim.x;
				if (u < units) {
					nxt[q] = x[next * units + u];
				}
			}
		}
		for (int32_t j = 0; j < k; j++) {
			uint4 *d = out + (int64_t)pos[i * k + j] * units;
#pragma unroll
			for (int q = 0; q < U; q++) {
				int64_t u = threadIdx.x + q * blockDim.x;
				if (u < units) {
					if (CS) {
						__stcs(d + u, cur[q]);
					} else {
						d[u] = cur[q];
					}
				}
			}
		}
#pragma unroll
		for (int q = 0; q < U; q++) {
			cur[q] = nxt[q];
		}
	}
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
__device__ __forceinline__ uint32_t smem(const void *p)
{
	return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void mbar_init(uint64_t *bar)
{
	asm volatile("mbarrier.init.shared.b64 [%0], 1;" ::"r"(smem(bar)));
}

__device__ __forceinline__ void mbar_expect(uint64_t *bar, uint32_t bytes)
{
	asm volatile("{\n\t.reg .b64 st;\n\t"
		     "mbarrier.arrive.expect_tx.shared::cta.b64 st, [%0], %1;\n\t}" ::"r"(smem(bar)),
		     "r"(bytes)
		     : "memory");
}

__device__ __forceinline__ void mbar_wait(uint64_t *bar, uint32_t parity)
{
	uint32_t done;
	do {
		asm volatile("{\n\t.reg .pred p;\n\t"
			     "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
			     "selp.u32 %0, 1, 0, p;\n\t}"
			     : "=r"(done)
			     : "r"(smem(bar)), "r"(parity)
			     : "memory");
	} while (!done);
}

__device__ __forceinline__ void bulk_load(void *dst, const void *src, uint32_t bytes, uint64_t *bar)
{
	asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
			     smem(dst)),
		     "l"(src), "r"(bytes), "r"(smem(bar))
		     : "memory");
}

__device__ __forceinline__ void bulk_store(void *dst, const void *src, uint32_t bytes)
{
	asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(dst), "r"(smem(src)),
		     "r"(bytes)
		     : "memory");
}
#endif

// tma: persistent blocks; thread 0 loads token rows into two shared
// buffers in turn and stores each k times with bulk copies.
__global__ void tma(uint8_t *out, const uint8_t *x, const int32_t *pos, int64_t n, int32_t k,
		    uint32_t rowBytes)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
	extern __shared__ __align__(128) uint8_t buf[];
	__shared__ __align__(8) uint64_t bar[2];
	if (threadIdx.x != 0) {
		return;
	}
	mbar_init(&bar[0]);
	mbar_init(&bar[1]);
	asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
	asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
	int64_t i = blockIdx.x;
	if (i < n) {
		mbar_expect(&bar[0], rowBytes);
		bulk_load(buf, x + i * rowBytes, rowBytes, &bar[0]);
	}
	for (int64_t j = 0; i < n; j++, i += gridDim.x) {
		int b = j & 1;
		int64_t next = i + gridDim.x;
		if (next < n) {
			// The other buffer was the source of the previous row's
			// stores: they must have read it before it is refilled.
			asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
			mbar_expect(&bar[b ^ 1], rowBytes);
			bulk_load(buf + (b ^ 1) * rowBytes, x + next * rowBytes, rowBytes, &bar[b ^ 1]);
		}
		mbar_wait(&bar[b], (j >> 1) & 1);
		for (int32_t c = 0; c < k; c++) {
			bulk_store(out + (int64_t)pos[i * k + c] * rowBytes, buf + b * rowBytes, rowBytes);
		}
		asm volatile("cp.async.bulk.commit_group;" ::: "memory");
	}
	asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
#endif
}

// check counts the output rows that differ from their source row.
__global__ void check(const uint4 *out, const uint4 *x, const int32_t *src, int64_t p, int64_t units,
		      unsigned long long *wrong)
{
	int64_t r = blockIdx.x;
	if (r >= p) {
		return;
	}
	__shared__ int bad;
	if (threadIdx.x == 0) {
		bad = 0;
	}
	__syncthreads();
	const uint4 *s = x + (int64_t)src[r] * units, *d = out + r * units;
	for (int64_t u = threadIdx.x; u < units; u += blockDim.x) {
		uint4 a = s[u], b = d[u];
		if (a.x != b.x || a.y != b.y || a.z != b.z || a.w != b.w) {
			bad = 1;
		}
	}
	__syncthreads();
	if (threadIdx.x == 0 && bad) {
		atomicAdd(wrong, 1ULL);
	}
}

// The buffers and shapes of the variants (set once by main; captureless
// lambdas read them).
static uint8_t *sx, *sout, *sy;
static int32_t *spos, *ssrc;
static int64_t sP, sT, sUnits, sRow;
static int sk, sGrid, sExactBlock, sPipeBlock, sPipeGrid, sSMs, sPhasedG;
static size_t sSmem, sPhasedSmem;

// phasedRun launches phased on one block of 1024 threads per SM (GRID:
// cooperatively, so that the grid can synchronize).
template <bool GRID>
static void phasedRun(cudaStream_t s, int32_t mode = 0, int32_t rows = 0)
{
	uint4 *out = (uint4 *)sout;
	const uint4 *x = (const uint4 *)sx;
	const int32_t *pos = spos;
	int64_t n = sT, units = sUnits;
	int32_t k = sk, g = rows > 0 ? std::min(rows, sPhasedG) : sPhasedG;
	void *args[] = {&out, &x, &pos, &n, &k, &units, &g, &mode};
	if (GRID) {
		CHECK(cudaLaunchCooperativeKernel((void *)phased<true>, sSMs, 1024, args, sPhasedSmem, s));
	} else {
		CHECK(cudaLaunchKernel((void *)phased<false>, sSMs, 1024, args, sPhasedSmem, s));
	}
}

// phasedxRun launches phasedx with B blocks of T threads an SM (fewer
// if they do not fit), each holding as many rows as its share of the
// SM's shared memory allows (at most cap when cap > 0), rounds balanced;
// flags go to the kernel.
template <bool GRID, bool WARPROW, bool IL = false>
static void phasedxRun(cudaStream_t s, int B, int T, int cap = 0, int32_t flags = 0)
{
	static std::map<std::tuple<int, int, int>, std::pair<int, int32_t>> shapes;
	auto key = std::make_tuple(B, T, cap);
	if (shapes.count(key) == 0) {
		int optin = 0, dev = 0, smPer = 0;
		CHECK(cudaGetDevice(&dev));
		CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
		CHECK(cudaDeviceGetAttribute(&smPer, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev));
		int64_t gmax = std::min<int64_t>(optin, smPer / B - 1024) / sRow;
		CHECK(cudaFuncSetAttribute(phasedx<GRID, WARPROW, IL>, cudaFuncAttributeMaxDynamicSharedMemorySize,
					   (int)std::max<int64_t>(gmax * sRow, 0)));
		if (cap > 0) {
			gmax = std::min<int64_t>(gmax, cap);
		}
		int per = 0;
		CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per, phasedx<GRID, WARPROW, IL>, T, gmax * sRow));
		per = std::min(per, B);
		if (per < 1 || gmax < 1) {
			fprintf(stderr, "phasedx: B %d T %d does not fit\n", B, T);
			exit(2);
		}
		const int64_t blocks = (int64_t)sSMs * per;
		const int64_t rounds = (sT + blocks * gmax - 1) / (blocks * gmax);
		const int32_t g = (int32_t)((sT + blocks * rounds - 1) / (blocks * rounds));
		shapes[key] = {(int)blocks, g};
		printf("# phasedx<%d,%d,%d> B %d T %d cap %d: %lld blocks (%d an SM), %d rows a block a round, %lld rounds\n",
		       GRID, WARPROW, IL, B, T, cap, (long long)blocks, per, g, (long long)rounds);
	}
	uint4 *out = (uint4 *)sout;
	const uint4 *x = (const uint4 *)sx;
	const int32_t *pos = spos;
	int32_t n = (int32_t)sT, k = sk, units = (int32_t)sUnits, g = shapes[key].second;
	const int grid = shapes[key].first;
	void *args[] = {&out, &x, &pos, &n, &k, &units, &g, &flags};
	const size_t smem = (size_t)g * sRow;
	if (GRID) {
		CHECK(cudaLaunchCooperativeKernel((void *)phasedx<GRID, WARPROW, IL>, grid, T, args, smem, s));
	} else {
		CHECK(cudaLaunchKernel((void *)phasedx<GRID, WARPROW, IL>, grid, T, args, smem, s));
	}
}

// psortRun launches psort with B blocks of T threads an SM, as many rows
// a block as its share of shared memory holds (with the order table),
// rounds balanced.
template <bool IL>
static void psortRun(cudaStream_t s, int B, int T)
{
	static std::map<std::pair<int, int>, std::pair<int, int32_t>> shapes;
	auto key = std::make_pair(B, T);
	if (shapes.count(key) == 0) {
		int optin = 0, dev = 0, smPer = 0;
		CHECK(cudaGetDevice(&dev));
		CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
		CHECK(cudaDeviceGetAttribute(&smPer, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev));
		const int64_t avail = std::min<int64_t>(optin, smPer / B - 1024);
		int64_t gmax = avail / (sRow + 8 * sk);
		CHECK(cudaFuncSetAttribute(psort<IL>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)avail));
		int per = 0;
		CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per, psort<IL>, T, gmax * (sRow + 8 * sk)));
		per = std::min(per, B);
		if (per < 1 || gmax < 1 || gmax * sk > T) {
			fprintf(stderr, "psort: B %d T %d does not fit\n", B, T);
			exit(2);
		}
		const int64_t blocks = (int64_t)sSMs * per;
		const int64_t rounds = (sT + blocks * gmax - 1) / (blocks * gmax);
		const int32_t g = (int32_t)((sT + blocks * rounds - 1) / (blocks * rounds));
		shapes[key] = {(int)blocks, g};
		printf("# psort<%d> B %d T %d: %lld blocks (%d an SM), %d rows a block a round, %lld rounds\n", IL, B, T,
		       (long long)blocks, per, g, (long long)rounds);
	}
	const int grid = shapes[key].first;
	const int32_t g = shapes[key].second;
	psort<IL><<<grid, T, (size_t)g * (sRow + 8 * sk), s>>>((uint4 *)sout, (const uint4 *)sx, spos, (int32_t)sT, sk,
								 (int32_t)sUnits, g);
}

// staged: per chunk of tokens, stage loads the chunk's rows into L2
// (reads alone, evict-last), then hint (mode 3) writes them from there.
static void staged(cudaStream_t s, int64_t chunk)
{
	for (int64_t lo = 0; lo < sT; lo += chunk) {
		int64_t hi = std::min(sT, lo + chunk);
		stage<<<sSMs * 8, 256, 0, s>>>((const uint4 *)sx + lo * sUnits, (hi - lo) * sUnits, nullptr);
		hint<<<hi - lo, sExactBlock, 0, s>>>((uint4 *)sout, (const uint4 *)sx + lo * sUnits, spos + lo * sk,
						      hi - lo, sk, sUnits, 3);
	}
}

// sWin sets (bytes > 0) or clears the access policy window of stream s:
// accesses to [base, base+bytes) are persisting (kept in the L2 set-aside
// of PERMUTE_TMA_PERSIST), others normal.
static void sWin(cudaStream_t s, const void *base, size_t bytes)
{
	cudaStreamAttrValue a = {};
	a.accessPolicyWindow.base_ptr = const_cast<void *>(base);
	a.accessPolicyWindow.num_bytes = bytes;
	a.accessPolicyWindow.hitRatio = bytes > 0 ? 1.0f : 0.0f;
	a.accessPolicyWindow.hitProp = bytes > 0 ? cudaAccessPropertyPersisting : cudaAccessPropertyNormal;
	a.accessPolicyWindow.missProp = cudaAccessPropertyNormal;
	CHECK(cudaStreamSetAttribute(s, cudaStreamAttributeAccessPolicyWindow, &a));
}

// stagedWin: staged with the chunk made persisting by the stream's access
// policy window (plain loads in stage) instead of the evict-last policy.
static void stagedWin(cudaStream_t s, int64_t chunk)
{
	for (int64_t lo = 0; lo < sT; lo += chunk) {
		int64_t hi = std::min(sT, lo + chunk);
		sWin(s, sx + lo * sRow, (hi - lo) * sRow);
		stage<<<sSMs * 8, 256, 0, s>>>((const uint4 *)sx + lo * sUnits, (hi - lo) * sUnits, nullptr, false);
		sWin(s, nullptr, 0);
		hint<<<hi - lo, sExactBlock, 0, s>>>((uint4 *)sout, (const uint4 *)sx + lo * sUnits, spos + lo * sk,
						      hi - lo, sk, sUnits, 3);
	}
}

// stagedAhead: staged with the stage of chunk c+1 on a second stream, run
// while chunk c is scattered (the set-aside holds two chunks): reads come
// in bursts of a chunk, overlapped with the writes of the one before.
static cudaStream_t sS2;
static cudaEvent_t sEv[2][64];
static void stagedAhead(cudaStream_t s, int64_t chunk)
{
	const int64_t nc = (sT + chunk - 1) / chunk;
	if (nc > 64) {
		fprintf(stderr, "stagedAhead: at most 64 chunks\n");
		exit(2);
	}
	// ev[0][c]: chunk c staged (on s2); ev[1][c]: chunk c scattered (on s).
	CHECK(cudaEventRecord(sEv[1][63], s)); // the run's start, for s2
	CHECK(cudaStreamWaitEvent(sS2, sEv[1][63], 0));
	for (int64_t c = 0; c < nc; c++) {
		int64_t lo = c * chunk, hi = std::min(sT, lo + chunk);
		if (c >= 2) {
			CHECK(cudaStreamWaitEvent(sS2, sEv[1][c - 2], 0)); // its half of the set-aside is free
		}
		stage<<<sSMs * 2, 256, 0, sS2>>>((const uint4 *)sx + lo * sUnits, (hi - lo) * sUnits, nullptr);
		CHECK(cudaEventRecord(sEv[0][c], sS2));
	}
	for (int64_t c = 0; c < nc; c++) {
		int64_t lo = c * chunk, hi = std::min(sT, lo + chunk);
		CHECK(cudaStreamWaitEvent(s, sEv[0][c], 0));
		hint<<<hi - lo, sExactBlock, 0, s>>>((uint4 *)sout, (const uint4 *)sx + lo * sUnits, spos + lo * sk,
						      hi - lo, sk, sUnits, 3);
		CHECK(cudaEventRecord(sEv[1][c], s));
	}
}

// mixRun: cudaMemsetAsync of the P rows on s while readrows reads the
// first rows rows of src on the second stream (forked from s and joined
// back into it, so the pair is one run on s).
static uint32_t *sSink;
static void mixRun(cudaStream_t s, const uint8_t *src, int64_t rows, int readBlocks = 0, bool kernel = false)
{
	CHECK(cudaEventRecord(sEv[1][62], s));
	CHECK(cudaStreamWaitEvent(sS2, sEv[1][62], 0));
	readrows<<<readBlocks > 0 ? readBlocks : sSMs, 256, 0, sS2>>>((const uint4 *)src, rows * sUnits, sSink);
	if (kernel) {
		kset<<<sSMs * 8, 256, 0, s>>>((uint4 *)sout, sP * sUnits);
	} else {
		CHECK(cudaMemsetAsync(sout, 0, sP * sRow, s));
	}
	CHECK(cudaEventRecord(sEv[0][62], sS2));
	CHECK(cudaStreamWaitEvent(s, sEv[0][62], 0));
}

static void splitRun(cudaStream_t s, int32_t S)
{
	const int64_t per = (sUnits + S - 1) / S;
	const int block = std::min(1024, (int)((per / 4 + 31) / 32 * 32));
	split<<<sT * S, block, 0, s>>>((uint4 *)sout, (const uint4 *)sx, spos, sT, sk, sUnits, S);
}

// grpRun launches grp<G> on as many blocks of `threads` as fit (two
// buffers of G rows of shared memory each).
template <int G>
static void grpRun(cudaStream_t s, int threads)
{
	static int grid = 0;
	const size_t smem = 2 * (size_t)G * sRow;
	if (grid == 0) {
		CHECK(cudaFuncSetAttribute(grp<G>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
		int per = 0;
		CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per, grp<G>, threads, smem));
		if (per < 1) {
			fprintf(stderr, "grp<%d>: %zu bytes of shared memory do not fit\n", G, smem);
			exit(2);
		}
		grid = sSMs * per;
		printf("# grp<%d>: %d blocks of %d (%d per SM), %zu bytes of shared memory each\n", G, grid, threads, per,
		       smem);
	}
	grp<G><<<grid, threads, smem, s>>>((uint4 *)sout, (const uint4 *)sx, spos, sT, sk, sUnits);
}

int main(int argc, char **argv)
{
	int64_t tokens = 4096, hidden = 7168;
	int k = 8, experts = 64;
	if (argc == 5) {
		tokens = atoll(argv[1]);
		hidden = atoll(argv[2]);
		k = atoi(argv[3]);
		experts = atoi(argv[4]);
	} else if (argc != 1) {
		fprintf(stderr, "usage: %s [tokens hidden topk experts]\n", argv[0]);
		return 2;
	}
	const int64_t rowBytes = hidden * 2, units = rowBytes / 16;
	if (rowBytes % 16 != 0 || k < 1 || k > experts || tokens < 1) {
		fprintf(stderr, "need hidden a multiple of 8 and 1 <= topk <= experts\n");
		return 2;
	}
	// Routing and expert-major positions, as permute's BenchmarkCUDA.
	std::mt19937_64 rng(7);
	std::vector<int32_t> slot(tokens * k), counts(experts, 0);
	std::vector<int> perm(experts);
	for (int64_t i = 0; i < tokens; i++) {
		for (int e = 0; e < experts; e++) {
			perm[e] = e;
		}
		std::shuffle(perm.begin(), perm.end(), rng);
		for (int j = 0; j < k; j++) {
			slot[i * k + j] = perm[j];
			counts[perm[j]]++;
		}
	}
	std::vector<int32_t> offsets(experts + 1, 0), seen(experts, 0), pos(tokens * k);
	for (int e = 0; e < experts; e++) {
		offsets[e + 1] = offsets[e] + counts[e];
	}
	const int64_t P = offsets[experts];
	std::vector<int32_t> src(P);
	for (int64_t s = 0; s < tokens * k; s++) {
		int e = slot[s];
		pos[s] = offsets[e] + seen[e]++;
		src[pos[s]] = (int32_t)(s / k);
	}

	int dev = 0, sms = 0;
	CHECK(cudaSetDevice(dev));
	CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
	cudaDeviceProp prop;
	CHECK(cudaGetDeviceProperties(&prop, dev));
	uint8_t *x, *out, *y;
	int32_t *dpos, *dsrc;
	unsigned long long *wrong;
	// The row buffers: cudaMalloc, or with PERMUTE_TMA_POOL=1 the default
	// memory pool (cudaMallocAsync, what goep's stream allocations use).
	const char *poolEnv = getenv("PERMUTE_TMA_POOL");
	const bool pool = poolEnv != nullptr && poolEnv[0] == '1';
	for (auto b : {std::make_pair(&x, tokens * rowBytes), std::make_pair(&out, P * rowBytes),
		       std::make_pair(&y, P * rowBytes)}) {
		if (pool) {
			CHECK(cudaMallocAsync((void **)b.first, b.second, 0));
		} else {
			CHECK(cudaMalloc((void **)b.first, b.second));
		}
	}
	CHECK(cudaDeviceSynchronize());
	CHECK(cudaMalloc(&dpos, pos.size() * 4));
	CHECK(cudaMalloc(&dsrc, src.size() * 4));
	CHECK(cudaMalloc(&wrong, 8));
	CHECK(cudaMalloc(&sSink, 4));
	CHECK(cudaMemcpy(dpos, pos.data(), pos.size() * 4, cudaMemcpyHostToDevice));
	CHECK(cudaMemcpy(dsrc, src.data(), src.size() * 4, cudaMemcpyHostToDevice));
	{
		std::vector<uint16_t> hx(tokens * hidden);
		for (size_t i = 0; i < hx.size(); i++) {
			hx[i] = (uint16_t)(0x3c00 + (i * 2654435761u >> 20) % 512); // distinct rows
		}
		CHECK(cudaMemcpy(x, hx.data(), hx.size() * 2, cudaMemcpyHostToDevice));
	}
	CHECK(cudaMemset(y, 0x3c, P * rowBytes));

	const int tmaBlocksPerSM = std::max(1, std::min(16, (int)(prop.sharedMemPerMultiprocessor / (2 * rowBytes + 1024))));
	const size_t tmaSmem = 2 * rowBytes;
	if (tmaSmem > 48 * 1024) {
		CHECK(cudaFuncSetAttribute(tma, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)tmaSmem));
	}
	// phased: as many rows a block as its shared memory holds, then the
	// rounds balanced (g rows a block per round).
	{
		int optin = 0;
		CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
		int64_t gmax = std::max<int64_t>(1, optin / rowBytes);
		int64_t rounds = (tokens + sms * gmax - 1) / (sms * gmax);
		sPhasedG = (int)((tokens + sms * rounds - 1) / (sms * rounds));
		sPhasedSmem = (size_t)sPhasedG * rowBytes;
		if (sPhasedSmem > (size_t)optin) {
			fprintf(stderr, "phased: a row of %lld bytes does not fit in shared memory\n", (long long)rowBytes);
			return 2;
		}
		CHECK(cudaFuncSetAttribute(phased<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sPhasedSmem));
		CHECK(cudaFuncSetAttribute(phased<false>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sPhasedSmem));
	}

	// PERMUTE_TMA_PERSIST=BYTES|max sets aside that much L2 for persisting
	// accesses (evict-last lines, access policy windows); by default the
	// set-aside is the driver's (0), and evict-last then protects nothing.
	if (const char *ps = getenv("PERMUTE_TMA_PERSIST"); ps != nullptr && ps[0] != 0) {
		size_t want = strcmp(ps, "max") == 0 ? (size_t)prop.persistingL2CacheMaxSize : (size_t)atoll(ps);
		CHECK(cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize, want));
	}
	size_t setAside = 0;
	CHECK(cudaDeviceGetLimit(&setAside, cudaLimitPersistingL2CacheSize));
	printf("# L2 %d bytes; persisting set-aside %zu bytes (max %d); access policy window max %d bytes\n",
	       prop.l2CacheSize, setAside, prop.persistingL2CacheMaxSize, prop.accessPolicyMaxWindowSize);
	// PERMUTE_TMA_ONLY=a,b,c times only those variants (and the copy).
	const char *only = getenv("PERMUTE_TMA_ONLY");

	cudaStream_t s;
	CHECK(cudaStreamCreate(&s));
	CHECK(cudaStreamCreateWithFlags(&sS2, cudaStreamNonBlocking));
	for (auto &row : sEv) {
		for (auto &e : row) {
			CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
		}
	}
	cudaEvent_t e0, e1, evs[31];
	CHECK(cudaEventCreate(&e0));
	CHECK(cudaEventCreate(&e1));
	for (auto &e : evs) {
		CHECK(cudaEventCreate(&e));
	}

	struct variant {
		const char *name;
		double bytes; // traffic per run
		bool permutes; // a permute: its output is checked
		bool copy;     // the copy the ratios are against
		void (*run)(cudaStream_t);
	};
	sx = x, sout = out, sy = y, spos = dpos, ssrc = dsrc, sP = P, sT = tokens, sUnits = units, sRow = rowBytes;
	sk = k, sGrid = sms * tmaBlocksPerSM, sSmem = tmaSmem;
	// exact and pipe: 4 units a thread, a block of units/4 threads rounded
	// up to a warp (224 threads for hidden 7168); pipe is persistent, as
	// many blocks as fit, and needs rows of at most 4 x 1024 units.
	sExactBlock = std::min(1024, (int)((units / 4 + 31) / 32 * 32));
	sSMs = sms;
	sPipeBlock = sExactBlock;
	if (units > 4 * 1024) {
		fprintf(stderr, "pipe needs rows of at most 4096 units\n");
		return 2;
	}
	{
		int per = 0;
		CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per, pipe<4, false>, sPipeBlock, 0));
		sPipeGrid = sms * std::max(1, per);
	}
	const double permBytes = (double)(tokens + P) * rowBytes;
	variant vs[] = {
		{"copy", 2.0 * P * rowBytes, false, true,
		 [](cudaStream_t s) { CHECK(cudaMemcpyAsync(sout, sy, sP * sRow, cudaMemcpyDeviceToDevice, s)); }},
		// The write-only bound: the permuted tensor's bytes written, none read
		// (its ratio counts those bytes only).
		{"memset", 1.0 * P * rowBytes, false, false,
		 [](cudaStream_t s) { CHECK(cudaMemsetAsync(sout, 0, sP * sRow, s)); }},
		{"seqfan", permBytes, false, false,
		 [](cudaStream_t s) { scatter<<<sT, 256, 0, s>>>((uint4 *)sout, (const uint4 *)sx, nullptr, sT, sk, sUnits); }},
		{"gather", permBytes, true, false,
		 [](cudaStream_t s) {
			 gather<<<sP, 256, 0, s>>>((uint4 *)sout, (const uint4 *)sx, ssrc, sP, sUnits);
		 }},
		{"scatter", permBytes, true, false,
		 [](cudaStream_t s) {
			 scatter<<<sT, 256, 0, s>>>((uint4 *)sout, (const uint4 *)sx, spos, sT, sk, sUnits);
		 }},
		{"warpdest", permBytes, true, false,
		 [](cudaStream_t s) {
			 warpdest<<<sT, 32 * sk, 0, s>>>((uint4 *)sout, (const uint4 *)sx, spos, sT, sk, sUnits);
		 }},
		{"rowblock", permBytes, true, false,
		 [](cudaStream_t s) {
			 rowblock<<<sT * sk, 256, 0, s>>>((uint4 *)sout, (const uint4 *)sx, spos, sT, sk, sUnits);
		 }},
		{"tma", permBytes, true, false,
		 [](cudaStream_t s) { tma<<<sGrid, 32, sSmem, s>>>(sout, sx, spos, sT, sk, (uint32_t)sRow); }},
		{"kcopy", 2.0 * P * rowBytes, false, false,
		 [](cudaStream_t s) { kcopy<<<sGrid * 8, 256, 0, s>>>((uint4 *)sout, (const uint4 *)sy, sP * sUnits); }},
		{"kset", 1.0 * P * rowBytes, false, false,
		 [](cudaStream_t s) { kset<<<sGrid * 8, 256, 0, s>>>((uint4 *)sout, sP * sUnits); }},
		{"fanconst", permBytes, false, false,
		 [](cudaStream_t s) { fan<<<sT, 256, 0, s>>>((uint4 *)sout, (const uint4 *)sx, sT, sk, sUnits, 0); }},
		{"fanl2", permBytes, false, false,
		 [](cudaStream_t s) { fan<<<sT, 256, 0, s>>>((uint4 *)sout, (const uint4 *)sx, sT, sk, sUnits, 1); }},
		{"exact", permBytes, true, false,
		 [](cudaStream_t s) {
			 exact<4, false><<<sT, sExactBlock, 0, s>>>((uint4 *)sout, (const uint4 *)sx, spos, sT, sk, sUnits, 0);
		 }},
		{"exact2", permBytes, true, false,
		 [](cudaStream_t s) {
			 exact<2, false><<<sT, std::min(1024, 2 * sExactBlock), 0, s>>>((uint4 *)sout, (const uint4 *)sx, spos, sT,
										    sk, sUnits, 0);
		 }},
		{"exact8", permBytes, true, false,
		 [](cudaStream_t s) {
			 exact<8, false><<<sT, (sExactBlock / 2 + 31) / 32 * 32, 0, s>>>((uint4 *)sout, (const uint4 *)sx, spos,
										     sT, sk, sUnits, 0);
		 }},
		{"exactcs", permBytes, true, false,
		 [](cudaStream_t s) {
			 exact<4, true><<<sT, sExactBlock, 0, s>>>((uint4 *)sout, (const uint4 *)sx, spos, sT, sk, sUnits, 0);
		 }},
		{"pf4", permBytes, true, false,
		 [](cudaStream_t s) {
			 exact<4, false><<<sT, sExactBlock, 0, s>>>((uint4 *)sout, (const uint4 *)sx, spos, sT, sk, sUnits,
								     4 * sSMs);
		 }},
		{"pf9", permBytes, true, false,
		 [](cudaStream_t s) {
			 exact<4, false><<<sT, sExactBlock, 0, s>>>((uint4 *)sout, (const uint4 *)sx, spos, sT, sk, sUnits,
								     9 * sSMs);
		 }},
		{"pf18", permBytes, true, false,
		 [](cudaStream_t s) {
			 exact<4, false><<<sT, sExactBlock, 0, s>>>((uint4 *)sout, (const uint4 *)sx, spos, sT, sk, sUnits,
								     18 * sSMs);
		 }},
		{"pf9plain", permBytes, true, false,
		 [](cudaStream_t s) {
			 exact<4, false><<<sT, sExactBlock, 0, s>>>((uint4 *)sout, (const uint4 *)sx, spos, sT, sk, sUnits,
								     9 * sSMs, false);
		 }},
		{"pf9cs", permBytes, true, false,
		 [](cudaStream_t s) {
			 exact<4, true><<<sT, sExactBlock, 0, s>>>((uint4 *)sout, (const uint4 *)sx, spos, sT, sk, sUnits,
								    9 * sSMs);
		 }},
		{"chunked", permBytes, true, false,
		 [](cudaStream_t s) {
			 const int64_t chunk = 1024;
			 for (int64_t lo = 0; lo < sT; lo += chunk) {
				 int64_t hi = std::min(sT, lo + chunk);
				 prefetch<<<hi - lo, 128, 0, s>>>((const uint4 *)sx, lo, hi, sUnits);
				 exact<4, true><<<hi - lo, sExactBlock, 0, s>>>((uint4 *)sout, (const uint4 *)sx + lo * sUnits,
										 spos + lo * sk, hi - lo, sk, sUnits, 0);
			 }
		 }},
		{"staged1k", permBytes, true, false, [](cudaStream_t s) { staged(s, 1024); }},
		{"staged2k", permBytes, true, false, [](cudaStream_t s) { staged(s, 2048); }},
		{"staged512", permBytes, true, false, [](cudaStream_t s) { staged(s, 512); }},
		{"split2", permBytes, true, false, [](cudaStream_t s) { splitRun(s, 2); }},
		{"split4", permBytes, true, false, [](cudaStream_t s) { splitRun(s, 4); }},
		{"split7", permBytes, true, false, [](cudaStream_t s) { splitRun(s, 7); }},
		{"staged256", permBytes, true, false, [](cudaStream_t s) { staged(s, 256); }},
		{"stagedw1k", permBytes, true, false, [](cudaStream_t s) { stagedWin(s, 1024); }},
		{"stagedw2k", permBytes, true, false, [](cudaStream_t s) { stagedWin(s, 2048); }},
		{"ahead256", permBytes, true, false, [](cudaStream_t s) { stagedAhead(s, 256); }},
		{"ahead512", permBytes, true, false, [](cudaStream_t s) { stagedAhead(s, 512); }},
		{"ahead1k", permBytes, true, false, [](cudaStream_t s) { stagedAhead(s, 1024); }},
		{"phased", permBytes, true, false, [](cudaStream_t s) { phasedRun<true>(s); }},
		{"phasedblk", permBytes, true, false, [](cudaStream_t s) { phasedRun<false>(s); }},
		{"pipe", permBytes, true, false,
		 [](cudaStream_t s) {
			 pipe<4, false><<<sPipeGrid, sPipeBlock, 0, s>>>((uint4 *)sout, (const uint4 *)sx, spos, sT, sk, sUnits);
		 }},
		{"pipecs", permBytes, true, false,
		 [](cudaStream_t s) {
			 pipe<4, true><<<sPipeGrid, sPipeBlock, 0, s>>>((uint4 *)sout, (const uint4 *)sx, spos, sT, sk, sUnits);
		 }},
		{"hint256", permBytes, true, false,
		 [](cudaStream_t s) {
			 hint<<<sT, sExactBlock, 0, s>>>((uint4 *)sout, (const uint4 *)sx, spos, sT, sk, sUnits, 0);
		 }},
		{"hintef", permBytes, true, false,
		 [](cudaStream_t s) {
			 hint<<<sT, sExactBlock, 0, s>>>((uint4 *)sout, (const uint4 *)sx, spos, sT, sk, sUnits, 1);
		 }},
		{"hintboth", permBytes, true, false,
		 [](cudaStream_t s) {
			 hint<<<sT, sExactBlock, 0, s>>>((uint4 *)sout, (const uint4 *)sx, spos, sT, sk, sUnits, 2);
		 }},
		{"multi2", permBytes, true, false,
		 [](cudaStream_t s) {
			 multi<2><<<(sT + 1) / 2, sExactBlock, 0, s>>>((uint4 *)sout, (const uint4 *)sx, spos, sT, sk, sUnits);
		 }},
		{"multi4", permBytes, true, false,
		 [](cudaStream_t s) {
			 multi<4><<<(sT + 3) / 4, sExactBlock, 0, s>>>((uint4 *)sout, (const uint4 *)sx, spos, sT, sk, sUnits);
		 }},
		{"grp8", permBytes, true, false, [](cudaStream_t s) { grpRun<8>(s, 1024); }},
		{"grp4", permBytes, true, false, [](cudaStream_t s) { grpRun<4>(s, 512); }},
		{"grp2", permBytes, true, false, [](cudaStream_t s) { grpRun<2>(s, 256); }},
		{"grp1", permBytes, true, false, [](cudaStream_t s) { grpRun<1>(s, 256); }},
		{"usum", permBytes, false, false,
		 [](cudaStream_t s) {
			 usum<true><<<sT, sExactBlock, 0, s>>>((uint4 *)sout, (const uint4 *)sy, spos, sT, sk, sUnits);
		 }},
		{"uread", permBytes, false, false,
		 [](cudaStream_t s) {
			 usum<false><<<sT, sExactBlock, 0, s>>>((uint4 *)sout, (const uint4 *)sy, spos, sT, sk, sUnits);
		 }},
		{"readx", 1.0 * tokens * rowBytes, false, false,
		 [](cudaStream_t s) { readrows<<<sSMs * 8, 256, 0, s>>>((const uint4 *)sx, sT * sUnits, sSink); }},
		{"mixblk", permBytes, false, false,
		 [](cudaStream_t s) {
			 mixblk<<<sT * (sk + 1), sExactBlock, 0, s>>>((uint4 *)sout, (const uint4 *)sx, sT, sk, sUnits, sSink);
		 }},
		{"mixstream", permBytes, false, false, [](cudaStream_t s) { mixRun(s, sx, sT); }},
		{"mixcopy", 2.0 * P * rowBytes, false, false, [](cudaStream_t s) { mixRun(s, sy, sP); }},
		{"mixtrickle", permBytes, false, false, [](cudaStream_t s) { mixRun(s, sx, sT, 8); }},
		{"mixkset", permBytes, false, false, [](cudaStream_t s) { mixRun(s, sx, sT, 0, true); }},
		{"mixblkpos", permBytes, false, false,
		 [](cudaStream_t s) {
			 mixblk<<<sT * (sk + 1), sExactBlock, 0, s>>>((uint4 *)sout, (const uint4 *)sx, sT, sk, sUnits, sSink,
								      spos);
		 }},
		{"mixfront", permBytes, false, false,
		 [](cudaStream_t s) {
			 mixblk<<<sT * (sk + 1), sExactBlock, 0, s>>>((uint4 *)sout, (const uint4 *)sx, sT, sk, sUnits, sSink,
								      nullptr, true);
		 }},
		{"mixfrontpos", permBytes, false, false,
		 [](cudaStream_t s) {
			 mixblk<<<sT * (sk + 1), sExactBlock, 0, s>>>((uint4 *)sout, (const uint4 *)sx, sT, sk, sUnits, sSink,
								      spos, true);
		 }},
		{"phasednold", permBytes, false, false, [](cudaStream_t s) { phasedRun<true>(s, 1); }},
		{"phasednost", permBytes, false, false, [](cudaStream_t s) { phasedRun<true>(s, 2); }},
		{"phasedseq", permBytes, false, false, [](cudaStream_t s) { phasedRun<true>(s, 4); }},
		{"phased8", permBytes, true, false, [](cudaStream_t s) { phasedRun<true>(s, 0, 8); }},
		{"phased4", permBytes, true, false, [](cudaStream_t s) { phasedRun<true>(s, 0, 4); }},
		{"px1", permBytes, true, false, [](cudaStream_t s) { phasedxRun<true, false>(s, 1, 1024); }},
		{"px2", permBytes, true, false, [](cudaStream_t s) { phasedxRun<true, false>(s, 2, 1024); }},
		{"px2h", permBytes, true, false, [](cudaStream_t s) { phasedxRun<true, false>(s, 2, 512); }},
		{"px4", permBytes, true, false, [](cudaStream_t s) { phasedxRun<true, false>(s, 4, 512); }},
		{"pw1", permBytes, true, false, [](cudaStream_t s) { phasedxRun<true, true>(s, 1, 1024); }},
		{"pw2", permBytes, true, false, [](cudaStream_t s) { phasedxRun<true, true>(s, 2, 1024); }},
		{"pw4", permBytes, true, false, [](cudaStream_t s) { phasedxRun<true, true>(s, 4, 512); }},
		{"px2blk", permBytes, true, false, [](cudaStream_t s) { phasedxRun<false, false>(s, 2, 1024); }},
		{"pw2blk", permBytes, true, false, [](cudaStream_t s) { phasedxRun<false, true>(s, 2, 1024); }},
		{"pxi1", permBytes, true, false, [](cudaStream_t s) { phasedxRun<true, false, true>(s, 1, 1024); }},
		{"pxi2h", permBytes, true, false, [](cudaStream_t s) { phasedxRun<true, false, true>(s, 2, 512); }},
		{"pxi2blk", permBytes, true, false, [](cudaStream_t s) { phasedxRun<false, false, true>(s, 2, 1024); }},
		{"pxi4blk", permBytes, true, false, [](cudaStream_t s) { phasedxRun<false, false, true>(s, 4, 512); }},
		{"pwi2blk", permBytes, true, false, [](cudaStream_t s) { phasedxRun<false, true, true>(s, 2, 1024); }},
		{"px4blk", permBytes, true, false, [](cudaStream_t s) { phasedxRun<false, false>(s, 4, 512); }},
		{"pxi2c4", permBytes, true, false, [](cudaStream_t s) { phasedxRun<false, false, true>(s, 2, 1024, 4); }},
		{"pxi2c6", permBytes, true, false, [](cudaStream_t s) { phasedxRun<false, false, true>(s, 2, 1024, 6); }},
		{"pxi2t896", permBytes, true, false, [](cudaStream_t s) { phasedxRun<false, false, true>(s, 2, 896); }},
		{"pxi2t768", permBytes, true, false, [](cudaStream_t s) { phasedxRun<false, false, true>(s, 2, 768); }},
		{"pxi3t672", permBytes, true, false, [](cudaStream_t s) { phasedxRun<false, false, true>(s, 3, 672); }},
		{"pxi2cs", permBytes, true, false,
		 [](cudaStream_t s) { phasedxRun<false, false, true>(s, 2, 1024, 0, 1); }},
		{"pxi2ef", permBytes, true, false,
		 [](cudaStream_t s) { phasedxRun<false, false, true>(s, 2, 1024, 0, 2); }},
		{"psorti2", permBytes, true, false, [](cudaStream_t s) { psortRun<true>(s, 2, 1024); }},
		{"psort2", permBytes, true, false, [](cudaStream_t s) { psortRun<false>(s, 2, 1024); }},
		{"psorti1", permBytes, true, false, [](cudaStream_t s) { psortRun<true>(s, 1, 1024); }},
		{"psorti3", permBytes, true, false, [](cudaStream_t s) { psortRun<true>(s, 3, 640); }},
		{"indepseq", permBytes, false, false,
		 [](cudaStream_t s) {
			 indep<<<sT, sExactBlock, 0, s>>>((uint4 *)sout, (const uint4 *)sx, spos, sT, sk, sUnits, sSink, true);
		 }},
		{"indep", permBytes, false, false,
		 [](cudaStream_t s) {
			 indep<<<sT, sExactBlock, 0, s>>>((uint4 *)sout, (const uint4 *)sx, spos, sT, sk, sUnits, sSink);
		 }},
		// The copy again, last: how far the GPU drifted during the run.
		{"copy2", 2.0 * P * rowBytes, false, false,
		 [](cudaStream_t s) { CHECK(cudaMemcpyAsync(sout, sy, sP * sRow, cudaMemcpyDeviceToDevice, s)); }},
	};
	printf("# permute_tma: %s, %d SMs; tokens %lld hidden %lld topk %d experts %d; P = %lld rows of %lld bytes; %s\n",
	       prop.name, sms, (long long)tokens, (long long)hidden, k, experts, (long long)P, (long long)rowBytes,
	       pool ? "rows from the memory pool (cudaMallocAsync)" : "rows from cudaMalloc");
	printf("# tma: %d blocks (%d per SM), %zu bytes of shared memory each\n", sGrid, tmaBlocksPerSM, tmaSmem);
	printf("# phased: %d blocks of 1024, %d rows (%zu bytes of shared memory) a block per round\n", sms, sPhasedG,
	       sPhasedSmem);
	printf("# exact: block %d, 4 units a thread; pipe: %d blocks of %d, 4 units a thread\n", sExactBlock, sPipeGrid,
	       sPipeBlock);
	printf("# %-10s %10s %10s %8s %8s\n", "variant", "median_us", "GBps", "ratio", "wrong");
	// Warm-up: a second of copies before the first timing (a fresh
	// machine's first GPU work can run slower).
	{
		float spent = 0;
		CHECK(cudaEventRecord(e0, s));
		while (spent < 1000) {
			vs[0].run(s);
			CHECK(cudaEventRecord(e1, s));
			CHECK(cudaEventSynchronize(e1));
			CHECK(cudaEventElapsedTime(&spent, e0, e1));
		}
	}
	double copyGBps = 0;
	int failed = 0;
	for (auto &v : vs) {
		if (only != nullptr && !v.copy) {
			std::string list = std::string(",") + only + ",";
			if (list.find(std::string(",") + v.name + ",") == std::string::npos) {
				continue;
			}
		}
		CHECK(cudaMemsetAsync(out, 0, P * rowBytes, s));
		// 5 warm-up runs, then 30 timed back to back, an event between
		// every two, and one synchronize: each run is queued before the
		// one ahead of it ends, so an event pair times the run alone (not
		// the host's launch of it, as on an idle stream).
		const int warmup = 5, iters = 30;
		for (int it = 0; it < warmup; it++) {
			v.run(s);
		}
		CHECK(cudaEventRecord(evs[0], s));
		for (int it = 0; it < iters; it++) {
			v.run(s);
			CHECK(cudaEventRecord(evs[it + 1], s));
		}
		CHECK(cudaGetLastError());
		CHECK(cudaStreamSynchronize(s));
		std::vector<float> ms;
		for (int it = 0; it < iters; it++) {
			float t;
			CHECK(cudaEventElapsedTime(&t, evs[it], evs[it + 1]));
			ms.push_back(t);
		}
		std::sort(ms.begin(), ms.end());
		double med = ms[ms.size() / 2] * 1e-3;
		double gbps = v.bytes / med / 1e9;
		if (v.copy) {
			copyGBps = gbps;
		}
		unsigned long long bad = 0;
		if (v.permutes) {
			CHECK(cudaMemsetAsync(wrong, 0, 8, s));
			check<<<P, 256, 0, s>>>((const uint4 *)out, (const uint4 *)x, dsrc, P, units, wrong);
			CHECK(cudaMemcpyAsync(&bad, wrong, 8, cudaMemcpyDeviceToHost, s));
			CHECK(cudaStreamSynchronize(s));
			failed += bad != 0;
		}
		printf("  %-10s %10.1f %10.1f %8.2f %8llu\n", v.name, med * 1e6, gbps, copyGBps > 0 ? gbps / copyGBps : 0.0,
		       bad);
	}
	printf("# %s\n", failed ? "WRONG rows: see the wrong column" : "check: every permuted row equals its source row");
	return failed ? 1 : 0;
}
