// The CUDA kernels of the GPU data path (package gpu): the push of rows
// into peers' mapped windows, combine's scatter, copy-out and sums, the
// weight gradients, and the rail's GPU-fed posts with several domains. go
// generate ./executor/internal/gpu builds them to ep.ptx
// (internal/ptxgen). The calls' synchronization (epoch flags with
// clock-bounded waits) is package nvlink's (nvlink/kernels/flags.cuh).
//
// Every pointer a kernel receives is device memory: goep's own buffers,
// peers' buffers mapped through CUDA IPC, or a caller's device tensor
// (DESIGN.md invariant 1); the one exception is the rail's send region and
// descriptor ring with several domains, host memory goep owns (mmap'd by
// package rdma), mapped for the GPU for the engine's lifetime, which
// goep_ep_push and goep_ep_rail_post store into. Counts known on the host
// arrive by value; in capacity mode the kernels read them from the
// handle's device tables, so a captured graph can be replayed after a new
// layout.
//
// Rows move in units of unit bytes (16 when the row bytes and every base
// address allow, else 4, 2 or 1): grid.x covers the items (rows or entries),
// grid.y the units of a row in chunks of blockDim.x.
#include <stdint.h>

#include "arith.cuh"
#include "units.cuh"

namespace goep_ep {  // named, not anonymous: keeps the PTX independent of the checkout path

using namespace goep_arith;
using namespace goep_units;

// copy_units copies one row of unitsPerRow units of unit bytes from src to
// dst, the units of this block's chunk (grid.y) one per thread.
__device__ __forceinline__ void copy_units(uint8_t *dst, const uint8_t *src, int64_t unitsPerRow,
					   int32_t unit)
{
	int64_t u = (int64_t)blockIdx.y * blockDim.x + threadIdx.x;
	for (; u < unitsPerRow; u += (int64_t)gridDim.y * blockDim.x) {
		switch (unit) {
		case 16:
			((uint4 *)dst)[u] = ((const uint4 *)src)[u];
			break;
		case 4:
			((uint32_t *)dst)[u] = ((const uint32_t *)src)[u];
			break;
		case 2:
			((uint16_t *)dst)[u] = ((const uint16_t *)src)[u];
			break;
		default:  // 1: fp8 rows at an odd address
			dst[u] = src[u];
			break;
		}
	}
}

__device__ __forceinline__ void zero_units(uint8_t *dst, int64_t unitsPerRow, int32_t unit)
{
	int64_t u = (int64_t)blockIdx.y * blockDim.x + threadIdx.x;
	for (; u < unitsPerRow; u += (int64_t)gridDim.y * blockDim.x) {
		zero_unit(dst, u, unit);
	}
}

}  // namespace goep_ep

using namespace goep_ep;

// put_rows is goep_ep_push and goep_ep_scatter: for every item j < items
// with row = dstRow[j] >= 0, row s = srcRow[j] (j when srcRow is null) of
// x (rowBytes) goes to row row of the rows area of peer dstPeer[j]
// (peerBase[dstPeer[j]]) and, when w is not null, w[s*K:(s+1)*K] to the
// peer's weights area (peerBase + wOff) at row*K, and, when sx is not
// null, row s of sx (sBytes, a multiple of 4: an fp8 row's scales) to the
// peer's scales area (peerBase + sOff) at row*sBytes. Blocks: grid.x
// blocks take chunks of chunk consecutive items in turn (block b: chunks
// b, b + grid.x, ...), grid.y chunks of the row's units.
__device__ __forceinline__ void put_rows(const uint8_t *x, const float *w, const int32_t *srcRow,
					 const int32_t *dstPeer, const int32_t *dstRow, int64_t items,
					 uint8_t *const *peerBase, int64_t rowBytes, int64_t wOff,
					 int32_t topk, int32_t unit, int64_t chunk, const uint8_t *sx,
					 int64_t sOff, int64_t sBytes)
{
	for (int64_t c = (int64_t)blockIdx.x * chunk; c < items; c += (int64_t)gridDim.x * chunk) {
		int64_t end = c + chunk < items ? c + chunk : items;
		for (int64_t j = c; j < end; j++) {
			int32_t row = dstRow[j];
			if (row < 0) {
				continue;
			}
			int64_t s = srcRow != nullptr ? (int64_t)srcRow[j] : j;
			uint8_t *base = peerBase[dstPeer[j]];
			copy_units(base + (int64_t)row * rowBytes, x + s * rowBytes, rowBytes / unit, unit);
			if (w != nullptr && blockIdx.y == 0 && threadIdx.x < topk) {
				float *pw = (float *)(base + wOff);
				pw[(int64_t)row * topk + threadIdx.x] = w[s * topk + threadIdx.x];
			}
			if (sx != nullptr && blockIdx.y == 0) {
				const uint32_t *ss = (const uint32_t *)(sx + s * sBytes);
				uint32_t *sd = (uint32_t *)(base + sOff + (int64_t)row * sBytes);
				for (int64_t u = threadIdx.x; u < sBytes / 4; u += blockDim.x) {
					sd[u] = ss[u];
				}
			}
		}
	}
}

// goep_ep_push is dispatch's push: entry j (token entTok[j]'s copy for its
// destination entDest[j], at row entRow[j] of that destination's receive
// window, -1: none) as put_rows, with the fp8 scales sx (null: none).
extern "C" __global__ void goep_ep_push(const uint8_t *x, const float *w, const int32_t *entTok,
					const int32_t *entDest, const int32_t *entRow,
					int64_t entries, uint8_t *const *peerBase, int64_t rowBytes,
					int64_t wOff, int32_t topk, int32_t unit, int64_t chunk,
					const uint8_t *sx, int64_t sOff, int64_t sBytes)
{
	put_rows(x, w, entTok, entDest, entRow, entries, peerBase, rowBytes, wOff, topk, unit, chunk,
		 sx, sOff, sBytes);
}

// goep_ep_scatter is combine's scatter: received row i of z (and zw) goes
// back to row dstRow[i] (-1: none) of the combine window of dstRank[i], as
// put_rows.
extern "C" __global__ void goep_ep_scatter(const uint8_t *z, const float *zw,
					   const int32_t *dstRank, const int32_t *dstRow,
					   int64_t rows, uint8_t *const *peerBase, int64_t rowBytes,
					   int64_t wOff, int32_t topk, int32_t unit, int64_t chunk)
{
	put_rows(z, zw, nullptr, dstRank, dstRow, rows, peerBase, rowBytes, wOff, topk, unit, chunk,
		 nullptr, 0, 0);
}

// rail_store writes descriptor pos of the rail's feed ring (package rdma's
// Ring layout, 64-bit words: two 64-byte counter lines, then one 64-byte
// slot per descriptor: seq, peer, local offset, remote offset, bytes,
// epoch), as rdma.Ring.Store does: the fields, a system-scope fence, then
// the sequence word pos+1, which the host proxy's feed polls.
__device__ __forceinline__ void rail_store(uint64_t *ring, uint64_t pos, uint64_t mask, uint64_t peer,
					   uint64_t local, uint64_t remote, uint64_t bytes, uint64_t epoch)
{
	volatile uint64_t *s = ring + 16 + (pos & mask) * 8;
	s[1] = peer;
	s[2] = local;
	s[3] = remote;
	s[4] = bytes;
	s[5] = epoch;
	__threadfence_system();
	s[0] = pos + 1;
}

// goep_ep_rail_post is the device producer of the rail's descriptors
// (the GPU-fed rail: package rdma's Feed hands them to the transport).
// The kernels before it on the stream have stored this round's payload
// into the send region send (host memory goep owns, mapped for the GPU).
// For every other domain n, ascending, it writes slot n's header (at
// n*slot: op, sig0..2, status 0, counts[n] rows, as package rail's
// header; when status is not null and *status != 0, the waits of
// this call failed: word 7 is then 1 and the message holds missing[p] as
// one byte per rank of the domain, ranks of them, which the receiver
// decodes), then what the rail's host post would put: the header and area
// of slot n (the signal of epoch with it when the slot has no rows), then
// the slot's rows with the signal. The slot's rows are at header + area
// in it, counts[n] of them, of rowBytes each, with weightBytes per row in
// the area; the peer's receive slot for this rank is (parity*domains +
// domain)*slot. Descriptors go to ring positions pos, pos+1, ... (mask:
// ring size - 1), whose slots the host has freed. One thread.
extern "C" __global__ void goep_ep_rail_post(uint64_t *ring, uint64_t pos, uint64_t mask,
					     uint8_t *send, const int32_t *counts, int32_t domains,
					     int32_t domain, int64_t slot, int64_t header, int64_t area,
					     int64_t rowBytes, int64_t weightBytes, int64_t parity,
					     uint64_t epoch, uint64_t op, uint64_t sig0, uint64_t sig1,
					     uint64_t sig2, const uint64_t *status, const int32_t *missing,
					     int32_t ranks)
{
	if (blockIdx.x != 0 || threadIdx.x != 0) {
		return;
	}
	bool failed = status != nullptr && *(volatile const uint64_t *)status != 0;
	for (int32_t n = 0; n < domains; n++) {
		if (n == domain) {
			continue;
		}
		volatile uint64_t *h = (volatile uint64_t *)(send + n * slot);
		h[0] = op;
		h[1] = sig0;
		h[2] = sig1;
		h[3] = sig2;
		h[4] = 0;
		h[5] = (uint64_t)counts[n];
		h[6] = failed ? (uint64_t)ranks : 0;
		h[7] = failed ? 1 : 0;
		if (failed) {
			volatile uint8_t *msg = send + n * slot + 64;
			for (int32_t p = 0; p < ranks; p++) {
				msg[p] = (uint8_t)missing[p];
			}
		}
	}
	// The payload stored by the kernels before this one, and the headers,
	// reach the host before any descriptor that names them.
	__threadfence_system();
	int64_t remote = (parity * domains + domain) * slot;
	for (int32_t n = 0; n < domains; n++) {
		if (n == domain) {
			continue;
		}
		int64_t rows = (int64_t)counts[n] * rowBytes;
		int64_t first = header + (int64_t)counts[n] * weightBytes;
		rail_store(ring, pos++, mask, (uint64_t)n, (uint64_t)(n * slot), (uint64_t)remote,
			   (uint64_t)first, rows > 0 ? 0 : epoch);
		if (rows > 0) {
			rail_store(ring, pos++, mask, (uint64_t)n, (uint64_t)(n * slot + header + area),
				   (uint64_t)(remote + header + area), (uint64_t)rows, epoch);
		}
	}
}

// goep_ep_copy_out writes the received rows to a call's outputs: with n =
// min(counts[0], rowCap) when counts is not null, else rows (by value), row
// i < n of out is row i of the rows area src and row i of outW (when not
// null) is srcW[i*K+k] where idx[i*K+k] >= 0, else 0; rows [n, rowCap) of
// out and outW are zero. Row i < rowCap of outIdx (when not null) is row i
// of idx, as it is. Blocks: grid.x = rowCap, grid.y chunks, at least topk
// threads.
extern "C" __global__ void goep_ep_copy_out(uint8_t *out, float *outW, int32_t *outIdx, const uint8_t *src,
					    const float *srcW, const int32_t *idx,
					    const int32_t *counts, int64_t rows, int64_t rowCap,
					    int64_t rowBytes, int32_t topk, int32_t unit)
{
	int64_t i = blockIdx.x;
	if (i >= rowCap) {
		return;
	}
	int64_t n = rows;
	if (counts != nullptr) {
		n = counts[0] < rowCap ? counts[0] : rowCap;
	}
	if (out != nullptr) {
		if (i < n) {
			copy_units(out + i * rowBytes, src + i * rowBytes, rowBytes / unit, unit);
		} else {
			zero_units(out + i * rowBytes, rowBytes / unit, unit);
		}
	}
	if (outIdx != nullptr && blockIdx.y == 0 && threadIdx.x < topk) {
		outIdx[i * topk + threadIdx.x] = idx[i * topk + threadIdx.x];
	}
	if (outW != nullptr && blockIdx.y == 0 && threadIdx.x < topk) {
		int64_t s = i * topk + threadIdx.x;
		// Two stores, not a select: nvcc 11.8 placed the select's constant
		// differently from run to run, which CI's regeneration check caught.
		if (i < n && idx[s] >= 0) {
			outW[s] = srcW[s];
		} else {
			outW[s] = 0.0f;
		}
	}
}

// goep_ep_sum_* is the combine sum on the source (executor.sumRows): for
// token t < tokens, the terms are the rows of the rows area src at row
// t*width + c for c < width with live[t*width+c] >= 0, in c order
// (destinations ascending); out[t] is their fp32 sum from the first term
// (add: NaNs as on the host), rounded to the dtype once, zero without
// terms. When gw is not null, gw[t*K+k] = srcW[slot[t*K+k]*K + k] for
// slot >= 0, else 0. Blocks: grid.x = tokens, grid.y chunks of the row's
// units; a unit is V elements (16 bytes) when vec, else one element.
template <bool BF16, int V, bool OUT32 = false>
__device__ __forceinline__ void sum_rows(uint8_t *out, float *gw, const uint8_t *src,
					 const float *srcW, const int32_t *live, const int32_t *slot,
					 int64_t tokens, int32_t width, int64_t hidden, int32_t topk,
					 uint32_t dnan)
{
	int64_t t = blockIdx.x;
	if (t >= tokens) {
		return;
	}
	const int64_t es = BF16 ? 2 : 4;
	const int64_t rowBytes = hidden * es;
	const int64_t units = hidden / V;
	for (int64_t u = (int64_t)blockIdx.y * blockDim.x + threadIdx.x; u < units;
	     u += (int64_t)gridDim.y * blockDim.x) {
		float acc[V];
		bool any = false;
		for (int32_t c = 0; c < width; c++) {
			int64_t r = t * width + c;
			if (live[r] < 0) {
				continue;
			}
			const uint8_t *row = src + r * rowBytes + u * V * es;
			float f[V];
			if (BF16) {
				if (V == 8) {
					uint4 q = *(const uint4 *)row;
					uint32_t wq[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
					for (int e = 0; e < 4; e++) {
						f[2 * e] = __uint_as_float(wq[e] << 16);
						f[2 * e + 1] = __uint_as_float(wq[e] & 0xffff0000u);
					}
				} else {
#pragma unroll
					for (int e = 0; e < V; e++) {
						f[e] = __uint_as_float((uint32_t)((const uint16_t *)row)[e] << 16);
					}
				}
			} else {
				if (V == 4) {
					uint4 q = *(const uint4 *)row;
					f[0] = __uint_as_float(q.x);
					f[1] = __uint_as_float(q.y);
					f[2] = __uint_as_float(q.z);
					f[3] = __uint_as_float(q.w);
				} else {
#pragma unroll
					for (int e = 0; e < V; e++) {
						f[e] = ((const float *)row)[e];
					}
				}
			}
#pragma unroll
			for (int e = 0; e < V; e++) {
				acc[e] = any ? add(acc[e], f[e], dnan) : f[e];
			}
			any = true;
		}
		if (!any) {
#pragma unroll
			for (int e = 0; e < V; e++) {
				acc[e] = 0.0f;
			}
		}
		if (OUT32) {  // fp32 out, not rounded (a domain's partial)
			float *o = (float *)out + t * hidden + u * V;
#pragma unroll
			for (int e = 0; e < V; e++) {
				o[e] = acc[e];
			}
			continue;
		}
		uint8_t *o = out + t * rowBytes + u * V * es;
		if (BF16) {
			if (V == 8) {
				uint32_t wq[4];
#pragma unroll
				for (int e = 0; e < 4; e++) {
					wq[e] = to_bf16(acc[2 * e]) | (to_bf16(acc[2 * e + 1]) << 16);
				}
				*(uint4 *)o = make_uint4(wq[0], wq[1], wq[2], wq[3]);
			} else {
#pragma unroll
				for (int e = 0; e < V; e++) {
					((uint16_t *)o)[e] = (uint16_t)to_bf16(acc[e]);
				}
			}
		} else {
			if (V == 4) {
				*(uint4 *)o = make_uint4(__float_as_uint(acc[0]), __float_as_uint(acc[1]),
							 __float_as_uint(acc[2]), __float_as_uint(acc[3]));
			} else {
#pragma unroll
				for (int e = 0; e < V; e++) {
					((float *)o)[e] = acc[e];
				}
			}
		}
	}
	if (gw != nullptr && blockIdx.y == 0 && threadIdx.x < topk) {
		int64_t s = t * topk + threadIdx.x;
		int32_t r = slot[s];
		gw[s] = r >= 0 ? srcW[(int64_t)r * topk + threadIdx.x] : 0.0f;
	}
}

extern "C" __global__ void goep_ep_sum_bf16(uint8_t *out, float *gw, const uint8_t *src,
					    const float *srcW, const int32_t *live,
					    const int32_t *slot, int64_t tokens, int32_t width,
					    int64_t hidden, int32_t topk, int32_t vec, uint32_t dnan)
{
	if (vec) {
		sum_rows<true, 8>(out, gw, src, srcW, live, slot, tokens, width, hidden, topk, dnan);
	} else {
		sum_rows<true, 1>(out, gw, src, srcW, live, slot, tokens, width, hidden, topk, dnan);
	}
}

extern "C" __global__ void goep_ep_sum_fp32(uint8_t *out, float *gw, const uint8_t *src,
					    const float *srcW, const int32_t *live,
					    const int32_t *slot, int64_t tokens, int32_t width,
					    int64_t hidden, int32_t topk, int32_t vec, uint32_t dnan)
{
	if (vec) {
		sum_rows<false, 4>(out, gw, src, srcW, live, slot, tokens, width, hidden, topk, dnan);
	} else {
		sum_rows<false, 1>(out, gw, src, srcW, live, slot, tokens, width, hidden, topk, dnan);
	}
}

// goep_ep_sum_bf16_f32 is goep_ep_sum_bf16 with fp32 rows out, not
// rounded: the partial of this rank's own domain in the hierarchical
// combine (DESIGN.md: it is added to the other domains' partials in fp32).
// The fp32 dtype needs no variant (rounding fp32 to fp32 is exact).
extern "C" __global__ void goep_ep_sum_bf16_f32(uint8_t *out, float *gw, const uint8_t *src,
						const float *srcW, const int32_t *live,
						const int32_t *slot, int64_t tokens, int32_t width,
						int64_t hidden, int32_t topk, int32_t vec, uint32_t dnan)
{
	if (vec) {
		sum_rows<true, 8, true>(out, gw, src, srcW, live, slot, tokens, width, hidden, topk, dnan);
	} else {
		sum_rows<true, 1, true>(out, gw, src, srcW, live, slot, tokens, width, hidden, topk, dnan);
	}
}

// goep_ep_merge_* is the last step of the hierarchical combine on the
// source (executor.hierCombine): for token t < tokens and element j,
// out[t][j] is the fp32 sum over the domains n < domains in ascending
// order of their partials, from the first: the own domain's (n == mine)
// is own[t*hidden + j] (fp32) when ownLive[t], another domain's is row
// remIdx[n*tokens + t] (when >= 0) of domain n's block of rem (rows of
// maxRows, the dtype), then rounded to the dtype once; zero when no domain
// has a partial. Weight gradients, when gw is not null: gw[t*K+k] is
// ownW[t*K+k] when slot k's expert is in this domain (slotDom == mine),
// remW of that domain's row when in another, 0 for an empty slot. One
// thread per element: grid.x = tokens, grid.y chunks of hidden.
template <bool BF16>
__device__ __forceinline__ void merge_rows(uint8_t *out, float *gw, const float *own,
					   const int32_t *ownLive, const float *ownW, const uint8_t *rem,
					   const float *remW, const int32_t *remIdx, const int32_t *slotDom,
					   int64_t tokens, int32_t domains, int32_t mine, int64_t maxRows,
					   int64_t hidden, int32_t topk, uint32_t dnan)
{
	int64_t t = blockIdx.x;
	if (t >= tokens) {
		return;
	}
	for (int64_t j = (int64_t)blockIdx.y * blockDim.x + threadIdx.x; j < hidden;
	     j += (int64_t)gridDim.y * blockDim.x) {
		float acc = 0.0f;
		bool any = false;
		for (int32_t n = 0; n < domains; n++) {
			float v;
			if (n == mine) {
				if (!ownLive[t]) {
					continue;
				}
				v = own[t * hidden + j];
			} else {
				int32_t i = remIdx[(int64_t)n * tokens + t];
				if (i < 0) {
					continue;
				}
				int64_t r = (int64_t)n * maxRows + i;
				v = BF16 ? __uint_as_float((uint32_t)((const uint16_t *)rem)[r * hidden + j] << 16)
					 : ((const float *)rem)[r * hidden + j];
			}
			acc = any ? add(acc, v, dnan) : v;
			any = true;
		}
		if (BF16) {
			((uint16_t *)out)[t * hidden + j] = any ? (uint16_t)to_bf16(acc) : 0;
		} else {
			((float *)out)[t * hidden + j] = any ? acc : 0.0f;
		}
	}
	if (gw != nullptr && blockIdx.y == 0 && threadIdx.x < topk) {
		int64_t s = t * topk + threadIdx.x;
		int32_t d = slotDom[s];
		float g = 0.0f;
		if (d == mine) {
			g = ownW[s];
		} else if (d >= 0) {
			int32_t i = remIdx[(int64_t)d * tokens + t];
			g = i >= 0 ? remW[((int64_t)d * maxRows + i) * topk + threadIdx.x] : 0.0f;
		}
		gw[s] = g;
	}
}

extern "C" __global__ void goep_ep_merge_bf16(uint8_t *out, float *gw, const float *own,
					      const int32_t *ownLive, const float *ownW,
					      const uint8_t *rem, const float *remW,
					      const int32_t *remIdx, const int32_t *slotDom,
					      int64_t tokens, int32_t domains, int32_t mine,
					      int64_t maxRows, int64_t hidden, int32_t topk, uint32_t dnan)
{
	merge_rows<true>(out, gw, own, ownLive, ownW, rem, remW, remIdx, slotDom, tokens, domains, mine,
			 maxRows, hidden, topk, dnan);
}

extern "C" __global__ void goep_ep_merge_fp32(uint8_t *out, float *gw, const float *own,
					      const int32_t *ownLive, const float *ownW,
					      const uint8_t *rem, const float *remW,
					      const int32_t *remIdx, const int32_t *slotDom,
					      int64_t tokens, int32_t domains, int32_t mine,
					      int64_t maxRows, int64_t hidden, int32_t topk, uint32_t dnan)
{
	merge_rows<false>(out, gw, own, ownLive, ownW, rem, remW, remIdx, slotDom, tokens, domains, mine,
			  maxRows, hidden, topk, dnan);
}

// goep_ep_permute_scaled_* is permute.PermuteScaled: for row i < rows and
// slot k with p = pos[i*K+k] in [0, permCap), gy[p] = g[i] scaled by c =
// w[i*K+k] (1 when w is null): a copy when c == 1, else each element
// mul(c, x) rounded to the dtype. Blocks: grid.x = rows, grid.y chunks of
// the row's elements.
template <bool BF16>
__device__ __forceinline__ void permute_scaled(uint8_t *gy, const uint8_t *g, const float *w,
					       const int32_t *pos, int64_t rows, int32_t topk,
					       int64_t permCap, int64_t hidden, uint32_t dnan)
{
	int64_t i = blockIdx.x;
	if (i >= rows) {
		return;
	}
	for (int64_t j = (int64_t)blockIdx.y * blockDim.x + threadIdx.x; j < hidden;
	     j += (int64_t)gridDim.y * blockDim.x) {
		uint32_t raw = BF16 ? ((const uint16_t *)g)[i * hidden + j] : ((const uint32_t *)g)[i * hidden + j];
		float x = BF16 ? __uint_as_float(raw << 16) : __uint_as_float(raw);
		for (int32_t k = 0; k < topk; k++) {
			int64_t p = pos[i * topk + k];
			if (p < 0 || p >= permCap) {
				continue;
			}
			float c = w != nullptr ? w[i * topk + k] : 1.0f;
			uint32_t v = raw;
			if (c != 1.0f) {
				float f = mul(c, x, dnan);
				v = BF16 ? to_bf16(f) : __float_as_uint(f);
			}
			if (BF16) {
				((uint16_t *)gy)[p * hidden + j] = (uint16_t)v;
			} else {
				((uint32_t *)gy)[p * hidden + j] = v;
			}
		}
	}
}

extern "C" __global__ void goep_ep_permute_scaled_bf16(uint8_t *gy, const uint8_t *g, const float *w,
						       const int32_t *pos, int64_t rows, int32_t topk,
						       int64_t permCap, int64_t hidden, uint32_t dnan)
{
	permute_scaled<true>(gy, g, w, pos, rows, topk, permCap, hidden, dnan);
}

extern "C" __global__ void goep_ep_permute_scaled_fp32(uint8_t *gy, const uint8_t *g, const float *w,
						       const int32_t *pos, int64_t rows, int32_t topk,
						       int64_t permCap, int64_t hidden, uint32_t dnan)
{
	permute_scaled<false>(gy, g, w, pos, rows, topk, permCap, hidden, dnan);
}

// goep_ep_weight_grad_* is permute.WeightGrad: for slot s = i*K+k <
// rows*K with p = pos[s] in [0, permCap), gw[s] = the inner product of
// g[i] and y[p] accumulated in fp64 in element order (__dmul_rn, exact for
// these operands, then __dadd_rn: the host's loop, bit for bit), rounded
// to fp32 once; else 0. One thread a slot.
template <bool BF16>
__device__ __forceinline__ void weight_grad(float *gw, const uint8_t *g, const uint8_t *y,
					    const int32_t *pos, int64_t rows, int32_t topk,
					    int64_t permCap, int64_t hidden)
{
	int64_t s = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
	if (s >= rows * topk) {
		return;
	}
	int64_t i = s / topk;
	int64_t p = pos[s];
	if (p < 0 || p >= permCap) {
		gw[s] = 0.0f;
		return;
	}
	double acc = 0.0;
	for (int64_t j = 0; j < hidden; j++) {
		float a, b;
		if (BF16) {
			a = __uint_as_float((uint32_t)((const uint16_t *)g)[i * hidden + j] << 16);
			b = __uint_as_float((uint32_t)((const uint16_t *)y)[p * hidden + j] << 16);
		} else {
			a = ((const float *)g)[i * hidden + j];
			b = ((const float *)y)[p * hidden + j];
		}
		acc = __dadd_rn(acc, __dmul_rn((double)a, (double)b));
	}
	gw[s] = __double2float_rn(acc);
}

extern "C" __global__ void goep_ep_weight_grad_bf16(float *gw, const uint8_t *g, const uint8_t *y,
						    const int32_t *pos, int64_t rows, int32_t topk,
						    int64_t permCap, int64_t hidden)
{
	weight_grad<true>(gw, g, y, pos, rows, topk, permCap, hidden);
}

extern "C" __global__ void goep_ep_weight_grad_fp32(float *gw, const uint8_t *g, const uint8_t *y,
						    const int32_t *pos, int64_t rows, int32_t topk,
						    int64_t permCap, int64_t hidden)
{
	weight_grad<false>(gw, g, y, pos, rows, topk, permCap, hidden);
}
