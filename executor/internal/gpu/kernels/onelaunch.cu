// The one-launch kernels of the GPU data path in one NVLink domain
// (package gpu, flat crossing): a whole call (its waits, its stores into
// the peers' windows, its signals and its reads of its own window) in one
// kernel launch, pipelined. go generate ./executor/internal/gpu builds them
// to onelaunch.ptx (internal/ptxgen).
//
// They take part in the domain's flag protocol (package nvlink, GPUFlags;
// nvlink/kernels/flags.cuh) exactly as the multi-kernel sequence Begin,
// stores, Arrive, reads, Finish does, so that calls of either kind follow
// each other on a stream: a block waits for a peer's done of the previous
// call only before its first store into that peer's window; the last
// block past its stores signals arrived to every peer; a block reads the
// rows of source s from its window once s has signalled arrived (rows of
// other sources are read meanwhile); the last block to end signals done
// and advances the epoch. Every block reads the epoch at its start, and no
// block changes it before all have ended, so a captured graph replays with
// fresh epochs. Waits are clock-bounded and record failures in the status
// words as nvlink's waits do.
//
// Blocks wait for each other's progress across ranks, so every rank's grid
// must be resident at once: the host sizes grids so that the grids of all
// the ranks on one GPU fit (at most the GPU's SMs / ranks on it blocks).
//
// Every pointer is device memory: goep's buffers, peers' buffers mapped
// through CUDA IPC, a caller's device tensors (DESIGN.md invariant 1).
#include <stdint.h>

#include "arith.cuh"
#include "flags.cuh"
#include "units.cuh"

namespace goep_onelaunch {  // named, not anonymous: keeps the PTX independent of the checkout path

using namespace goep_arith;
using namespace goep_nvlink;
using namespace goep_units;

// load16 reads 16 bytes of a caller's input, which no one writes during
// the launch: through the non-coherent path, not kept in L1 (read once).
__device__ __forceinline__ uint4 load16_input(const uint4 *p)
{
	uint4 v;
	asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
		     : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
		     : "l"(p));
	return v;
}

// load16_window reads 16 bytes of this rank's window, which peers wrote
// during the launch: from L2 (ld.global.cg), never a stale L1 line.
__device__ __forceinline__ uint4 load16_window(const uint4 *p) { return __ldcg(p); }

template <bool INPUT>
__device__ __forceinline__ uint4 load16(const uint4 *p)
{
	return INPUT ? load16_input(p) : load16_window(p);
}

// copyLane is how many 16-byte units a lane of warp_copy has in flight.
constexpr int copyLane = 8;

// warp_copy copies n bytes (a multiple of unit) from src to dst with the
// 32 lanes of a warp: 16-byte units copyLane in flight a lane when unit is 16,
// else one unit of unit bytes at a time. INPUT: src is a caller's input
// (load16_input), else this rank's window (load16_window).
template <bool INPUT>
__device__ __forceinline__ void warp_copy(uint8_t *dst, const uint8_t *src, int64_t n, int32_t unit, int lane)
{
	if (unit == 16) {
		const uint4 *s = (const uint4 *)src;
		uint4 *d = (uint4 *)dst;
		const int64_t m = n / 16;
		// Every unit of a round is loaded before any is stored, the
		// round's last units predicated: a row whose units are not a
		// multiple of the round's still keeps them all in flight.
		for (int64_t u = lane; u < m; u += 32 * copyLane) {
			uint4 v[copyLane];
#pragma unroll
			for (int j = 0; j < copyLane; j++) {
				if (u + 32 * j < m) {
					v[j] = load16<INPUT>(s + u + 32 * j);
				}
			}
#pragma unroll
			for (int j = 0; j < copyLane; j++) {
				if (u + 32 * j < m) {
					d[u + 32 * j] = v[j];
				}
			}
		}
		return;
	}
	for (int64_t u = lane; u < n / unit; u += 32) {
		switch (unit) {
		case 4:
			((uint32_t *)dst)[u] = INPUT ? __ldg((const uint32_t *)src + u) : __ldcg((const uint32_t *)src + u);
			break;
		case 2:
			((uint16_t *)dst)[u] = INPUT ? __ldg((const uint16_t *)src + u) : __ldcg((const uint16_t *)src + u);
			break;
		default:  // 1: fp8 rows at an odd address
			dst[u] = INPUT ? __ldg(src + u) : __ldcg(src + u);
			break;
		}
	}
}

// warp_zero zeroes n bytes (a multiple of unit) at dst with a warp.
__device__ __forceinline__ void warp_zero(uint8_t *dst, int64_t n, int32_t unit, int lane)
{
	for (int64_t u = lane; u < n / unit; u += 32) {
		zero_unit(dst, u, unit);
	}
}

// warp_copy4 copies n bytes (a multiple of 4: an fp8 row's scales) with a
// warp, 4 bytes a lane.
template <bool INPUT>
__device__ __forceinline__ void warp_copy4(uint8_t *dst, const uint8_t *src, int64_t n, int lane)
{
	for (int64_t u = lane; u < n / 4; u += 32) {
		((uint32_t *)dst)[u] = INPUT ? __ldg((const uint32_t *)src + u) : __ldcg((const uint32_t *)src + u);
	}
}

// heard is a block's record of the peers it has heard from in this launch
// (a bit a rank), in shared memory: a warp waits for a peer's word once.
struct heard {
	uint32_t *bits;  // [ranks/32 rounded up]
	__device__ __forceinline__ bool has(int32_t p) const
	{
		return (*(volatile uint32_t *)&bits[p >> 5] >> (p & 31)) & 1;
	}
	__device__ __forceinline__ void add(int32_t p) { atomicOr(&bits[p >> 5], 1u << (p & 31)); }
};

// wait_heard is wait_word for lane 0 of a warp, cached in h, the outcome
// given to every lane.
__device__ __forceinline__ bool wait_heard(heard h, const uint64_t *word, int32_t p, uint64_t want, uint64_t epoch,
					   uint32_t op, int64_t timeoutNs, const flag_words &fw, int lane)
{
	int ok = 1;
	if (lane == 0 && !h.has(p)) {
		ok = wait_word(word, p, want, epoch, op, timeoutNs, fw.status, fw.missing);
		if (ok) {
			h.add(p);
		}
	}
	return __shfl_sync(0xffffffffu, ok, 0) != 0;
}

// load_terms reads V elements of a row (bf16 when BF16, else fp32) at p
// as floats: 16 bytes when V is 8 (bf16) or 4 (fp32), else one element.
// WIN: p is in this rank's window, written by peers during the launch
// (read from L2), else in a caller's input.
template <bool BF16, int V, bool WIN>
__device__ __forceinline__ void load_terms(float *f, const uint8_t *p)
{
	if (V > 1) {
		uint4 q = load16<!WIN>((const uint4 *)p);
		uint32_t wq[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
		for (int e = 0; e < 4; e++) {
			if (BF16) {
				f[2 * e] = __uint_as_float(wq[e] << 16);
				f[2 * e + 1] = __uint_as_float(wq[e] & 0xffff0000u);
			} else {
				f[e] = __uint_as_float(wq[e]);
			}
		}
	} else if (BF16) {
		const unsigned short *q = (const unsigned short *)p;
		f[0] = __uint_as_float((uint32_t)(WIN ? __ldcg(q) : __ldg(q)) << 16);
	} else {
		const float *q = (const float *)p;
		f[0] = WIN ? __ldcg(q) : __ldg(q);
	}
}

// store_sum writes V sums at p: rounded once to bf16 (BF16), else fp32.
template <bool BF16, int V>
__device__ __forceinline__ void store_sum(uint8_t *p, const float *acc)
{
	if (V > 1) {
		uint32_t wq[4];
#pragma unroll
		for (int e = 0; e < 4; e++) {
			wq[e] = BF16 ? (to_bf16(acc[2 * e]) | (to_bf16(acc[2 * e + 1]) << 16)) : __float_as_uint(acc[e]);
		}
		*(uint4 *)p = make_uint4(wq[0], wq[1], wq[2], wq[3]);
	} else if (BF16) {
		*(uint16_t *)p = (uint16_t)to_bf16(acc[0]);
	} else {
		*(float *)p = acc[0];
	}
}

// sumChunk is how many units a warp sums as one item: sumLane a lane.
constexpr int sumLane = 4;
constexpr int64_t sumChunk = 32 * sumLane;

// combine_sums is goep_ep_combine's sums (ep.cu's sum_rows, bit for bit):
// item (token t, chunk ch) of tokens * chunks, a warp each in turn; its
// terms are entries e = t*width + c for c < width with entRow[e] >= 0, in
// c order: row entRow[e] of z for this rank's own (entDest[e] == me), else
// row e of the window once rank entDest[e] has signalled arrived. Units
// are V elements (V > 1: 16 bytes). With gw, the token's weights as
// sum_rows sets them, from zw (own) or the window's weights (wOff).
template <bool BF16, int V>
__device__ __forceinline__ void combine_sums(uint8_t *out, float *gw, const uint8_t *z, const float *zw,
					     const uint8_t *win, const int32_t *entDest, const int32_t *entRow,
					     const int32_t *slot, int64_t tokens, int32_t width, int64_t hidden,
					     int64_t wOff, int32_t topk, uint32_t dnan, heard arrived, uint64_t epoch,
					     uint32_t op, int64_t timeoutNs, const flag_words &fw, int32_t me, int64_t warp,
					     int64_t warps, int lane)
{
	const int64_t es = BF16 ? 2 : 4;
	const int64_t rowBytes = hidden * es;
	const int64_t units = hidden / V;
	const int64_t chunks = (units + sumChunk - 1) / sumChunk;
	for (int64_t item = warp; item < tokens * chunks; item += warps) {
		const int64_t t = item / chunks, ch = item % chunks;
		bool ok = true;
		for (int32_t c = 0; c < width && ok; c++) {
			int64_t e = t * width + c;
			int32_t d = entDest[e];
			if (entRow[e] >= 0 && d != me) {
				ok = wait_heard(arrived, fw.arrived + d, d, epoch, epoch, op, timeoutNs, fw, lane);
			}
		}
		if (!ok) {
			continue;  // the call fails (status)
		}
		// A lane's units of the chunk are u0 + 32j, j < sumLane: every
		// term's units are loaded before they are added (sumLane loads in
		// flight a lane), in c order as sum_rows adds them.
		const int64_t u0 = ch * sumChunk + lane;
		const int64_t uEnd = min(units, (ch + 1) * sumChunk);
		float acc[sumLane][V];
		bool any = false;
		for (int32_t c = 0; c < width; c++) {
			int64_t e = t * width + c;
			int32_t r = entRow[e];
			if (r < 0) {
				continue;
			}
			float f[sumLane][V];
			if (entDest[e] == me) {
				const uint8_t *src = z + (int64_t)r * rowBytes;
#pragma unroll
				for (int j = 0; j < sumLane; j++) {
					if (u0 + 32 * j < uEnd) {
						load_terms<BF16, V, false>(f[j], src + (u0 + 32 * j) * V * es);
					}
				}
			} else {
				const uint8_t *src = win + e * rowBytes;
#pragma unroll
				for (int j = 0; j < sumLane; j++) {
					if (u0 + 32 * j < uEnd) {
						load_terms<BF16, V, true>(f[j], src + (u0 + 32 * j) * V * es);
					}
				}
			}
#pragma unroll
			for (int j = 0; j < sumLane; j++) {
#pragma unroll
				for (int i = 0; i < V; i++) {
					acc[j][i] = any ? add(acc[j][i], f[j][i], dnan) : f[j][i];
				}
			}
			any = true;
		}
#pragma unroll
		for (int j = 0; j < sumLane; j++) {
			if (u0 + 32 * j >= uEnd) {
				continue;
			}
			if (!any) {
#pragma unroll
				for (int i = 0; i < V; i++) {
					acc[j][i] = 0.0f;
				}
			}
			store_sum<BF16, V>(out + t * rowBytes + (u0 + 32 * j) * V * es, acc[j]);
		}
		for (int32_t k = lane; gw != nullptr && ch == 0 && k < topk; k += 32) {
			int64_t s = t * topk + k;
			int32_t e = slot[s];
			float v = 0.0f;
			if (e >= 0) {
				if (entDest[e] == me) {
					v = zw[(int64_t)entRow[e] * topk + k];
				} else {
					v = __ldcg((const float *)(win + wOff) + (int64_t)e * topk + k);
				}
			}
			gw[s] = v;
		}
	}
}

}  // namespace goep_onelaunch

using namespace goep_onelaunch;

// The most ranks of a domain (the host refuses more): the shared bitmaps.
#define GOEP_MAX_RANKS 1024

// launch_start is what a one-launch kernel starts from: the call's epoch
// (the epoch counter's next; finish_launch stores it), the block's records
// of the peers heard from (free: done for the previous call; arrived: this
// call's rows), and the warp's place in the grid.
struct launch_start {
	uint64_t epoch;
	int lane;
	int64_t warp, warps;
	heard freed, arrived;
};

// start_launch reads the epoch and clears the block's records; every
// thread of the block calls it.
__device__ __forceinline__ launch_start start_launch(const flag_words &fw)
{
	__shared__ uint64_t epochShared;
	__shared__ uint32_t freeBits[GOEP_MAX_RANKS / 32], arrivedBits[GOEP_MAX_RANKS / 32];
	if (threadIdx.x == 0) {
		epochShared = *(volatile const uint64_t *)fw.counter + 1;
	}
	for (int i = threadIdx.x; i < GOEP_MAX_RANKS / 32; i += blockDim.x) {
		freeBits[i] = 0;
		arrivedBits[i] = 0;
	}
	__syncthreads();
	launch_start ls;
	ls.epoch = epochShared;
	ls.lane = threadIdx.x & 31;
	ls.warps = (int64_t)gridDim.x * (blockDim.x / 32);
	ls.warp = (int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
	ls.freed = heard{freeBits};
	ls.arrived = heard{arrivedBits};
	return ls;
}

// finish_launch ends a one-launch call: the grid's last block past this
// point waits until every peer has signalled arrived with op, those this
// rank exchanged no rows with included (a peer that rejected the call,
// ran another, hung or died fails it on every rank, as the flags' Arrive
// does), then stores the epoch and signals done (the flags' Finish) to
// every peer, whatever the waits found.
__device__ __forceinline__ void finish_launch(const flag_words &fw, uint64_t *const *peerFlags, int32_t ranks,
					      int32_t me, uint64_t epoch, uint32_t op, int64_t timeoutNs)
{
	if (grid_last(&fw.grid[1], gridDim.x)) {
		for (int32_t p = threadIdx.x; p < ranks; p += blockDim.x) {
			if (p != me) {
				wait_word(fw.arrived + p, p, epoch, epoch, op, timeoutNs, fw.status, fw.missing);
			}
		}
		__syncthreads();
		if (threadIdx.x == 0) {
			*(volatile uint64_t *)fw.counter = epoch;
		}
		signal_words(peerFlags, ranks, ranks + me, epoch << 8 | op);
	}
}

// A one-launch grid has at most one block an SM (oneLaunchBlocks in
// launch.go), so a block may take an SM's registers: without the minimum
// of one block an SM, ptxas keeps room for two and spills the copies'
// loads in flight.
#define GOEP_ONE_LAUNCH_BOUNDS __launch_bounds__(512, 1)

// goep_ep_dispatch is Dispatch in one domain, in one launch.
//
// Sends: entry j < entries (token entTok[j]'s copy for destination
// entDest[j], at row entRow[j] there; row -1: none) is row entTok[j] of x
// (rowBytes), its weights w[t*K:(t+1)*K] (w null: none) and its fp8
// scales (row t of sx, sBytes; sx null: none). A copy for this rank goes
// straight to its outputs: row entRow[j] of out and of outS. A copy for
// peer d goes into d's receive window (peerBase[d]): the row at
// row*rowBytes, the weights at wOff + row*K*4, the scales at sOff +
// row*sBytes, once d has signalled done for the previous call.
//
// Receives: with n = min(counts[0], rowCap) when counts is not null, else
// rows, row i < n of out (and outS) is the window's row i once its source
// recvSrc[i] has signalled arrived (a row of this rank's own was stored
// by the sends); rows [n, rowCap) are zero; row i of outIdx is row i of
// idx; outW[i*K+k] is the row's weight k where idx[i*K+k] >= 0 and i < n
// (this rank's own: w[t*K+k] with t = recvEnt[i] / width), else 0. out,
// outW, outIdx and outS may each be null (not written).
//
// This is goep_ep_push, goep_ep_copy_out and the flags' Begin, Arrive and
// Finish, bit for bit. Warps take entries (then rows) in turn across the
// grid, one at a time.
extern "C" __global__ void GOEP_ONE_LAUNCH_BOUNDS goep_ep_dispatch(
	const uint8_t *x, const float *w, const uint8_t *sx, const int32_t *entTok, const int32_t *entDest,
	const int32_t *entRow, int64_t entries, const int32_t *recvSrc, const int32_t *recvEnt, const int32_t *idx,
	const int32_t *counts, int64_t rows, int64_t rowCap, uint8_t *out, float *outW, int32_t *outIdx, uint8_t *outS,
	uint8_t *const *peerBase, const uint8_t *win, int64_t rowBytes, int64_t wOff, int64_t sOff, int64_t sBytes,
	int32_t topk, int32_t width, int32_t unit, uint64_t *const *peerFlags, uint64_t *flags, int32_t ranks,
	int32_t me, uint32_t op, int64_t timeoutNs)
{
	flag_words fw = flag_words_of(flags, ranks);
	const launch_start ls = start_launch(fw);
	const uint64_t epoch = ls.epoch;
	const int lane = ls.lane;
	const int64_t warps = ls.warps, warp = ls.warp;
	const heard freed = ls.freed, arrived = ls.arrived;

	// Sends.
	for (int64_t j = warp; j < entries; j += warps) {
		int32_t row = entRow[j];
		if (row < 0) {
			continue;
		}
		int32_t d = entDest[j];
		int64_t t = entTok[j];
		uint8_t *dst, *dstS = nullptr;
		if (d == me) {
			if (out == nullptr) {
				continue;
			}
			dst = out + (int64_t)row * rowBytes;
			if (sx != nullptr && outS != nullptr) {
				dstS = outS + (int64_t)row * sBytes;
			}
		} else {
			if (!wait_heard(freed, fw.done + d, d, epoch - 1, epoch, 0, timeoutNs, fw, lane)) {
				continue;  // the call fails (status); nothing to store
			}
			uint8_t *base = peerBase[d];
			dst = base + (int64_t)row * rowBytes;
			for (int32_t k = lane; w != nullptr && k < topk; k += 32) {
				((float *)(base + wOff))[(int64_t)row * topk + k] = w[t * topk + k];
			}
			if (sx != nullptr) {
				dstS = base + sOff + (int64_t)row * sBytes;
			}
		}
		warp_copy<true>(dst, x + t * rowBytes, rowBytes, unit, lane);
		if (dstS != nullptr) {
			warp_copy4<true>(dstS, sx + t * sBytes, sBytes, lane);
		}
	}
	if (grid_last(&fw.grid[0], gridDim.x)) {
		signal_words(peerFlags, ranks, me, epoch << 8 | op);
	}

	// Receives.
	int64_t n = rows;
	if (counts != nullptr) {
		n = counts[0] < rowCap ? counts[0] : rowCap;
	}
	for (int64_t i = warp; i < rowCap; i += warps) {
		for (int32_t k = lane; outIdx != nullptr && k < topk; k += 32) {
			outIdx[i * topk + k] = idx[i * topk + k];
		}
		if (i >= n) {
			if (out != nullptr) {
				warp_zero(out + i * rowBytes, rowBytes, unit, lane);
			}
			if (outS != nullptr) {
				warp_zero(outS + i * sBytes, sBytes, 4, lane);
			}
			for (int32_t k = lane; outW != nullptr && k < topk; k += 32) {
				outW[i * topk + k] = 0.0f;
			}
			continue;
		}
		int32_t s = recvSrc[i];
		bool own = s == me;
		if (!own && !wait_heard(arrived, fw.arrived + s, s, epoch, epoch, op, timeoutNs, fw, lane)) {
			continue;  // the call fails (status)
		}
		if (!own) {
			if (out != nullptr) {
				warp_copy<false>(out + i * rowBytes, win + i * rowBytes, rowBytes, unit, lane);
			}
			if (outS != nullptr) {
				warp_copy4<false>(outS + i * sBytes, win + sOff + i * sBytes, sBytes, lane);
			}
		}
		for (int32_t k = lane; outW != nullptr && k < topk; k += 32) {
			int64_t e = i * topk + k;
			float v = 0.0f;
			if (idx[e] >= 0) {
				if (own) {
					v = w != nullptr ? w[(int64_t)(recvEnt[i] / width) * topk + k] : 0.0f;
				} else {
					v = __ldcg((const float *)(win + wOff) + e);
				}
			}
			outW[e] = v;
		}
	}
	finish_launch(fw, peerFlags, ranks, me, epoch, op, timeoutNs);
}

// goep_ep_combine is Combine (and DispatchBackward, with zw) in one domain,
// in one launch.
//
// Sends: received row i < rowCap of z (rowBytes), with recvSrc[i] >= 0
// and recvEnt[i] >= 0 (-1 past the valid rows), goes back to its source s
// = recvSrc[i]: into s's combine window (peerBase[s]) at row recvEnt[i],
// its weights zw[i*K:(i+1)*K] (zw null: none) at wOff + recvEnt[i]*K*4,
// once s has signalled done for the previous call. A row of this rank's
// own stays in z: the sums read it there.
//
// Sums: out and gw as goep_ep_sum_bf16/_fp32 write them from the window
// that goep_ep_scatter filled (combine_sums), the terms of a token summed
// once every rank they come from has signalled arrived. bf16: rows of
// bf16, else fp32; vec: units of 16 bytes (rowBytes, z, out and the
// window 16-byte aligned), else one element.
//
// This is goep_ep_scatter, goep_ep_sum_* and the flags' Begin, Arrive and
// Finish, bit for bit. Warps take rows (then sum items) in turn across
// the grid, one at a time.
extern "C" __global__ void GOEP_ONE_LAUNCH_BOUNDS goep_ep_combine(
	const uint8_t *z, const float *zw, const int32_t *recvSrc, const int32_t *recvEnt, int64_t rowCap,
	const int32_t *entDest, const int32_t *entRow, const int32_t *slot, int64_t tokens, uint8_t *out, float *gw,
	uint8_t *const *peerBase, const uint8_t *win, int64_t rowBytes, int64_t wOff, int64_t hidden, int32_t topk,
	int32_t width, int32_t unit, int32_t bf16, int32_t vec, uint32_t dnan, uint64_t *const *peerFlags,
	uint64_t *flags, int32_t ranks, int32_t me, uint32_t op, int64_t timeoutNs)
{
	flag_words fw = flag_words_of(flags, ranks);
	const launch_start ls = start_launch(fw);
	const uint64_t epoch = ls.epoch;
	const int lane = ls.lane;
	const int64_t warps = ls.warps, warp = ls.warp;
	const heard freed = ls.freed, arrived = ls.arrived;

	// Sends.
	for (int64_t i = warp; i < rowCap; i += warps) {
		int32_t s = recvSrc[i], e = recvEnt[i];
		if (s < 0 || e < 0 || s == me) {
			continue;
		}
		if (!wait_heard(freed, fw.done + s, s, epoch - 1, epoch, 0, timeoutNs, fw, lane)) {
			continue;  // the call fails (status); nothing to store
		}
		uint8_t *base = peerBase[s];
		warp_copy<true>(base + (int64_t)e * rowBytes, z + i * rowBytes, rowBytes, unit, lane);
		for (int32_t k = lane; zw != nullptr && k < topk; k += 32) {
			((float *)(base + wOff))[(int64_t)e * topk + k] = zw[i * topk + k];
		}
	}
	if (grid_last(&fw.grid[0], gridDim.x)) {
		signal_words(peerFlags, ranks, me, epoch << 8 | op);
	}

	// Sums.
	if (bf16 && vec) {
		combine_sums<true, 8>(out, gw, z, zw, win, entDest, entRow, slot, tokens, width, hidden, wOff, topk,
				      dnan, arrived, epoch, op, timeoutNs, fw, me, warp, warps, lane);
	} else if (bf16) {
		combine_sums<true, 1>(out, gw, z, zw, win, entDest, entRow, slot, tokens, width, hidden, wOff, topk,
				      dnan, arrived, epoch, op, timeoutNs, fw, me, warp, warps, lane);
	} else if (vec) {
		combine_sums<false, 4>(out, gw, z, zw, win, entDest, entRow, slot, tokens, width, hidden, wOff,
				       topk, dnan, arrived, epoch, op, timeoutNs, fw, me, warp, warps, lane);
	} else {
		combine_sums<false, 1>(out, gw, z, zw, win, entDest, entRow, slot, tokens, width, hidden, wOff,
				       topk, dnan, arrived, epoch, op, timeoutNs, fw, me, warp, warps, lane);
	}
	finish_launch(fw, peerFlags, ranks, me, epoch, op, timeoutNs);
}
