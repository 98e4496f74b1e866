// The one-launch kernels of the GPU data path in one NVLink domain
// (package gpu, flat crossing): a whole call (its waits, its stores into
// the peers' windows, its signals and its reads of its own window) in one
// kernel launch, pipelined. go generate ./executor/internal/gpu builds them
// to onelaunch.ptx (internal/ptxgen).
//
// Roles: the lower warps of every block send first (sendWarps), storing
// rows into the peers' windows; every row stored is announced by its own
// flag in the window (the call's epoch and op, published with release
// semantics), so that the receiving warps, which start at once, move each
// row to its final place as soon as it lands, while later rows are still
// in flight; senders join the receivers once their sends are done. A
// rank's own rows never pass through its window.
//
// They take part in the domain's flag protocol (package nvlink, GPUFlags;
// nvlink/kernels/flags.cuh) as the multi-kernel sequence Begin, stores,
// Arrive, reads, Finish does, so that calls of either kind follow each
// other on a stream: a sender waits for a peer's done of the previous call
// only before its first store into that peer's window; the last sender
// signals arrived to every peer; the last block to end waits for every
// peer's arrived, signals done and advances the epoch (a rank alone, which
// waits for no one: the last block to count itself in, at its end). Every
// block reads the epoch at its start (a rank alone: only the block that
// ends the call), and no block changes it before all have read it, so a
// captured graph replays with fresh epochs; row flags carry epochs,
// which only grow, so they are never reset. Waits are clock-bounded and
// record failures in the status words as nvlink's waits do.
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
// the launch: through the non-coherent path, not kept in L1 (read once),
// L2 fetching 256 bytes at a time from memory (rows are read whole, front
// to back).
__device__ __forceinline__ uint4 load16_input(const uint4 *p)
{
	uint4 v;
	asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
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

// store16 stores 16 bytes. FINAL: p is an output's final place, which
// nothing reads during the launch: evict-first in L2 (st.global.cs), so
// that the rows streaming out do not push out lines still to be read.
// Else p is a peer's window, which the peer reads back during the launch:
// a plain store.
template <bool FINAL>
__device__ __forceinline__ void store16(uint4 *p, uint4 v)
{
	if (FINAL) {
		__stcs(p, v);
	} else {
		*p = v;
	}
}

// one_term is the sum of a token's one term over a 16-byte unit q, as
// store_sum would store it (unit_floats, then rounded once): fp32 keeps
// its bits; a bf16 widened and rounded back is itself, but for a NaN,
// which to_bf16 quiets (bit 6 of the half set): a few bit operations a
// word instead of unit_floats' widening and store_sum's rounding.
template <bool BF16>
__device__ __forceinline__ uint4 one_term(uint4 q)
{
	if (!BF16) {
		return q;
	}
	uint32_t w[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
	for (int e = 0; e < 4; e++) {
		// A half is a NaN where its magnitude is above infinity's.
		const uint32_t nan = __vcmpgtu2(w[e] & 0x7fff7fffu, 0x7f807f80u);
		w[e] |= nan & 0x00400040u;
	}
	return make_uint4(w[0], w[1], w[2], w[3]);
}

// copyLane is how many 16-byte units a lane of warp_copy has in flight.
constexpr int copyLane = 8;

// warp_copy copies n bytes (a multiple of unit) from src to dst with the
// 32 lanes of a warp: 16-byte units copyLane in flight a lane when unit is 16,
// else one unit of unit bytes at a time. INPUT: src is a caller's input
// (load16_input), else this rank's window (load16_window). TERM (unit 16
// only): src is a token's one term of bf16 elements, stored as its sum
// (one_term).
template <bool INPUT, bool FINAL, bool TERM = false>
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
					store16<FINAL>(d + u + 32 * j, TERM ? one_term<true>(v[j]) : v[j]);
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
// given to every lane. Its waits are a sender's, for a peer's done before
// the first store into that peer's window: the word's acquire loads order
// the stores after the peer's reads of the window, which is all the wait
// must order; a fence would also wait for the warp's stores into other
// peers' windows, which need no order here.
__device__ __forceinline__ bool wait_heard(heard h, const uint64_t *word, int32_t p, uint64_t want, uint64_t epoch,
					   uint32_t op, int64_t timeoutNs, const flag_words &fw, int lane)
{
	int ok = 1;
	if (lane == 0 && !h.has(p)) {
		ok = wait_word(word, p, want, epoch, op, timeoutNs, fw.status, fw.missing, true);
		if (ok) {
			h.add(p);
		}
	}
	return __shfl_sync(0xffffffffu, ok, 0) != 0;
}

// load_acquire reads a flag word with acquire semantics at system scope:
// reads after it see what its writer stored before releasing it.
__device__ __forceinline__ uint64_t load_acquire(const uint64_t *p)
{
	uint64_t v;
	asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
	return v;
}

// publish_row announces a row (with its weights and scales) that a warp's
// lanes stored into a peer's window: __syncwarp orders the lanes' stores
// before lane 0's, whose store of value into the row's flag releases them
// at system scope, so that a reader acquiring the flag sees the row.
__device__ __forceinline__ void publish_row(uint64_t *flag, uint64_t value, int lane)
{
	__syncwarp();
	if (lane == 0) {
		asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(flag), "l"(value) : "memory");
	}
}

// wait_row waits, with a warp, until the flag of a row of this rank's
// window (written by peer p) holds this call's epoch: lane 0 polls it with
// acquire loads and meanwhile watches p's arrived word, so that a peer
// that rejected its input or runs another call fails the wait at once
// (status 2; missing[p] 3 or 2, as wait_word), and a peer silent past
// timeoutNs fails it as a timeout (status 1, missing[p] 1). A wait after
// an earlier failure returns at once. Every lane gets the outcome; after a
// success, every lane's reads see the row.
__device__ __forceinline__ bool wait_row(const uint64_t *flag, int32_t p, uint64_t epoch, uint32_t op,
					 int64_t timeoutNs, const flag_words &fw, int lane)
{
	int ok = 1;
	if (lane == 0) {
		ok = 0;
		uint64_t start = 0;
		for (int spin = 0;; spin++) {
			uint64_t v = load_acquire(flag);
			if ((v >> 8) >= epoch) {
				if ((v >> 8) == epoch && (uint32_t)(v & 0xff) != op) {
					fw.missing[p] = 2;
					fail_status(fw.status, 2);
				} else {
					ok = 1;
				}
				break;
			}
			if ((spin & 31) == 0) {
				if (*(volatile const uint64_t *)fw.status != 0) {
					break;
				}
				uint64_t a = *(volatile const uint64_t *)(fw.arrived + p);
				if ((a >> 8) == epoch && (uint32_t)(a & 0xff) != op) {
					fw.missing[p] = (a & 0xff) == opRejected ? 3 : 2;
					fail_status(fw.status, 2);
					break;
				}
				uint64_t t = now_ns();
				if (start == 0) {
					start = t;
				} else if ((int64_t)(t - start) > timeoutNs) {
					fw.missing[p] = 1;
					fail_status(fw.status, 1);
					break;
				}
			}
			if (spin > 1024) {
				__nanosleep(64);
			}
		}
	}
	ok = __shfl_sync(0xffffffffu, ok, 0);
	__syncwarp();
	return ok != 0;
}

// work hands a warp the items [0, total) of a launch in turn (the host
// keeps every count of items below 2^31 - 2^16, oneLaunchFits, so that a
// counter that runs past them still fits 31 bits). Shared (counter: a grid
// word, zero between launches): slots of batch
// consecutive items go to warps in order, the next slot fetched (one
// atomic by lane 0) while the warp works on the current one, so that
// items go out in order and a warp that finishes early takes more; with
// late, not before the warp calls ahead (else at the next take): a warp
// whose item waits for rows to land then holds that item alone, and the
// items after it go to warps that are free. Fixed (counter null): warp w
// takes items w, w + warps, ... (where nothing waits, every warp's share
// is as long, and no atomic is needed).
struct work {
	uint32_t *counter;
	int32_t total, item, step, left;
	uint32_t next;  // lane 0's fetch in flight
	bool have;      // next holds the warp's next slot
	bool late;
	__device__ __forceinline__ work(uint32_t *c, int64_t total_, int32_t batch, int64_t warp, int64_t warps,
					int lane, bool late_ = false)
		: counter(c), total((int32_t)total_), item((int32_t)warp), step((int32_t)warps), left(0), next(0),
		  have(false), late(late_)
	{
		if (counter != nullptr) {
			step = batch;
			fetch(lane);
		}
	}
	__device__ __forceinline__ void fetch(int lane)
	{
		if (lane == 0) {
			next = atomicAdd(counter, (uint32_t)step);
		}
		have = true;
	}
	// take sets k to the warp's next item and reports whether there is one.
	__device__ __forceinline__ bool take(int64_t &k, int lane)
	{
		if (counter == nullptr) {
			k = item;
			item += step;
			return k < total;
		}
		if (left == 0) {
			if (!have) {
				fetch(lane);
			}
			item = (int32_t)__shfl_sync(0xffffffffu, next, 0);
			left = step;
			have = false;
			if (!late && item < total) {
				fetch(lane);
			}
		}
		k = item++;
		left--;
		return k < total;
	}
	// ahead fetches the warp's next slot now (late), if the current one
	// has no items left and it was not fetched yet.
	__device__ __forceinline__ void ahead(int lane)
	{
		if (counter != nullptr && !have && left == 0 && item < total) {
			fetch(lane);
		}
	}
};

// The probe (package gpu's Probe; nil when off): a launch's live words,
// then a ring of the records of finished launches. Times are the GPU's
// global timer (ns); a word of an earliest time holds its complement, so
// that atomicMax keeps the earliest and zero means none.
constexpr int probeStart = 0;  // ~(earliest block start)
constexpr int probeSent = 1;   // the last store into a peer's window ended
constexpr int probeFirst = 2;  // ~(the first remote row in its final place)
constexpr int probeLast = 3;   // the last remote row in its final place
constexpr int probeBytes = 4;  // bytes stored into peers' windows
constexpr int probeFound = 5;  // the last block had the received rows' offsets by source
constexpr int probeFirstSent = 6;  // ~(the first row published into a peer's window)
constexpr int probeLive = 8;
constexpr int probeSlots = 64;  // records, at probeLive + slot*probeLive
// A record: epoch<<8 | op, start, sent, first, last, bytes, found,
// first sent (times plain).

// probe_max keeps the largest of v and probe[w] in probe[w]: lane 0, when
// probing.
__device__ __forceinline__ void probe_max(uint64_t *probe, int w, uint64_t v, int lane)
{
	if (probe != nullptr && lane == 0) {
		atomicMax((unsigned long long *)probe + w, (unsigned long long)v);
	}
}

// probe_sent records, when probing, that a warp published a row into a
// peer's window now.
__device__ __forceinline__ void probe_sent(uint64_t *probe, int lane)
{
	if (probe != nullptr && lane == 0) {
		uint64_t t = now_ns();
		atomicMax((unsigned long long *)probe + probeFirstSent, ~(unsigned long long)t);
		atomicMax((unsigned long long *)probe + probeSent, (unsigned long long)t);
	}
}

// landed records, when probing, that a warp put a remote row (dispatch)
// or a sum (combine) in its final place now.
__device__ __forceinline__ void landed(uint64_t *probe, int lane)
{
	if (probe != nullptr && lane == 0) {
		uint64_t t = now_ns();
		atomicMax((unsigned long long *)probe + probeFirst, ~(unsigned long long)t);
		atomicMax((unsigned long long *)probe + probeLast, (unsigned long long)t);
	}
}

// pace_reserve counts bytes a sender warp is about to store into peers'
// windows in probe[probeBytes] and returns the offset of the first among
// the launch's such bytes (lane 0's atomic, given to every lane; 0 when
// not probing). A warp reserves a token's rows at once, so that they go
// out one after the other.
__device__ __forceinline__ uint64_t pace_reserve(uint64_t *probe, int64_t bytes, int lane)
{
	unsigned long long o = 0;
	if (probe != nullptr && lane == 0) {
		o = atomicAdd((unsigned long long *)probe + probeBytes, (unsigned long long)bytes);
	}
	return __shfl_sync(0xffffffffu, o, 0);
}

// pace_wait holds a sender warp, when pacing (paceFs > 0, femtoseconds a
// byte), until the link it emulates has room for the store that starts at
// byte o of the launch's stores to peers: until start + o * paceFs (a
// token bucket without burst). Lane 0 waits; the warp goes on together.
__device__ __forceinline__ void pace_wait(uint64_t o, int64_t paceFs, uint64_t start, int lane)
{
	if (paceFs <= 0) {
		return;
	}
	if (lane == 0) {
		const uint64_t due = start + o * (uint64_t)paceFs / 1000000ull;
		while (now_ns() < due) {
		}
	}
	__syncwarp();
}

// role_sync is a barrier among the warps of one role of the block (named
// barrier 1, threads of them): the other role goes on meanwhile. With
// every thread of the block it is __syncthreads.
__device__ __forceinline__ void role_sync(int threads)
{
	if (threads == (int)blockDim.x) {
		__syncthreads();
		return;
	}
	asm volatile("bar.sync 1, %0;" ::"r"(threads) : "memory");
}

// row_source is the source of received row i as source_offsets orders
// the rows: a row past the valid ones (source -1) comes after every source.
__device__ __forceinline__ int32_t row_source(const int32_t *recvSrc, int64_t i, int32_t ranks)
{
	const int32_t s = recvSrc[i];
	return s < 0 ? ranks : s;
}

// first_row_of finds, with a warp, the first of the rows [0, limit) whose
// source (row_source) is at least p, else limit: a 32-ary search, each
// step one load a lane, so that a few memory round trips find it however
// many rows there are. Every lane gets the answer.
__device__ __forceinline__ int64_t first_row_of(const int32_t *recvSrc, int64_t limit, int32_t ranks, int32_t p,
						int lane)
{
	// The answer lies in [lo, hi].
	int64_t lo = 0, hi = limit;
	while (hi - lo > 32) {
		// Lane l looks at the last row of the l-th of 32 strides.
		const int64_t stride = (hi - lo + 31) / 32;
		const int64_t i = min(lo + (lane + 1) * stride - 1, hi - 1);
		const uint32_t at = __ballot_sync(0xffffffffu, row_source(recvSrc, i, ranks) >= p);
		if (at == 0) {
			return hi;  // no row of [lo, hi) is p's or later
		}
		const int f = __ffs(at) - 1;
		const int64_t next = lo + (int64_t)f * stride;
		hi = min(lo + (int64_t)(f + 1) * stride - 1, hi - 1);
		lo = next;
	}
	const int64_t i = lo + lane;
	const uint32_t at = __ballot_sync(0xffffffffu, i < hi && row_source(recvSrc, i, ranks) >= p);
	return at == 0 ? hi : lo + __ffs(at) - 1;
}

// source_offsets sets off[p] (p <= ranks) to the first of the rows [0,
// limit) whose source recvSrc is at least p, a row past the valid ones
// (source -1) counting as past every source, and most to the most rows
// any source has. Received rows are in receive order (DESIGN.md section
// 2: by source ascending), so source s's rows are [off[s], off[s+1]).
// The threads [0, threads) of one role call it (tid: a thread's index
// among them; threads a multiple of 32), each warp searching for the
// offsets of sources warp, warp + warps, ... (first_row_of).
__device__ __forceinline__ void source_offsets(int32_t *off, int32_t *most, const int32_t *recvSrc, int64_t limit,
					       int32_t ranks, int tid, int threads)
{
	const int lane = tid & 31, warps = threads / 32;
	for (int32_t p = tid / 32; p <= ranks; p += warps) {
		const int64_t o = first_row_of(recvSrc, limit, ranks, p, lane);
		if (lane == 0) {
			off[p] = (int32_t)o;
		}
	}
	role_sync(threads);
	for (int32_t p = tid; p < ranks; p += threads) {
		atomicMax(most, off[p + 1] - off[p]);
	}
	role_sync(threads);
}

// hand_offsets and take_offsets pass the offsets from the role that
// found them to the other (named barrier 2 of the whole block): the
// finders arrive without waiting, the takers wait until they have.
__device__ __forceinline__ void hand_offsets()
{
	asm volatile("bar.arrive 2, %0;" ::"r"(blockDim.x) : "memory");
}

__device__ __forceinline__ void take_offsets()
{
	asm volatile("bar.sync 2, %0;" ::"r"(blockDim.x) : "memory");
}

// load_unit reads one unit of a term (16 bytes when V > 1, else one
// element, bf16 or fp32, in x) at p: from this rank's window (win: peers
// wrote it during the launch, so from L2), else from a caller's input.
template <bool BF16, int V>
__device__ __forceinline__ uint4 load_unit(const uint8_t *p, bool win)
{
	if (V > 1) {
		return win ? load16_window((const uint4 *)p) : load16_input((const uint4 *)p);
	}
	uint4 q = make_uint4(0, 0, 0, 0);
	if (BF16) {
		const unsigned short *s = (const unsigned short *)p;
		q.x = win ? __ldcg(s) : __ldg(s);
	} else {
		const unsigned int *s = (const unsigned int *)p;
		q.x = win ? __ldcg(s) : __ldg(s);
	}
	return q;
}

// unit_floats is a unit that load_unit read as V floats.
template <bool BF16, int V>
__device__ __forceinline__ void unit_floats(float *f, uint4 q)
{
	if (V > 1) {
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
	} else {
		f[0] = __uint_as_float(BF16 ? q.x << 16 : q.x);
	}
}

// cvt_bf16x2 is lo and hi rounded to bf16 and packed, lo in the low half,
// by the hardware (cvt.rn.bf16x2.f32): to_bf16's round to nearest even,
// but NaNs come out canonical, so not for NaNs.
__device__ __forceinline__ uint32_t cvt_bf16x2(float lo, float hi)
{
	uint32_t r;
	asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
	return r;
}

// store_sum writes V sums at p: rounded once to bf16 (BF16), else fp32;
// a unit of 16 bytes as a final place's (store16).
template <bool BF16, int V>
__device__ __forceinline__ void store_sum(uint8_t *p, const float *acc)
{
	if (V > 1) {
		// bf16: the hardware rounds a unit without a NaN (cvt_bf16x2);
		// a unit with one takes to_bf16, element by element.
		bool nan = false;
#pragma unroll
		for (int i = 0; BF16 && i < V; i++) {
			nan = nan || is_nan(acc[i]);
		}
		uint32_t wq[4];
#pragma unroll
		for (int e = 0; e < 4; e++) {
			if (!BF16) {
				wq[e] = __float_as_uint(acc[e]);
			} else if (nan) {
				wq[e] = to_bf16(acc[2 * e]) | (to_bf16(acc[2 * e + 1]) << 16);
			} else {
				wq[e] = cvt_bf16x2(acc[2 * e], acc[2 * e + 1]);
			}
		}
		store16<true>((uint4 *)p, make_uint4(wq[0], wq[1], wq[2], wq[3]));
	} else if (BF16) {
		*(uint16_t *)p = (uint16_t)to_bf16(acc[0]);
	} else {
		*(float *)p = acc[0];
	}
}

// token_weights sets token t's weights gw[t*K:(t+1)*K] as sum_rows does,
// with a warp: weight k of the entry e = slot[t*K+k] (none: 0), from zw
// for this rank's own row (entDest[e] == me), else from the window's
// weights (wOff), which the row's flag covers.
__device__ __forceinline__ void token_weights(float *gw, const float *zw, const uint8_t *win, int64_t wOff,
					      const int32_t *entDest, const int32_t *entRow, const int32_t *slot,
					      int64_t t, int32_t topk, int32_t me, int lane)
{
	for (int32_t k = lane; k < topk; k += 32) {
		const int64_t s = t * topk + k;
		const int32_t e = slot[s];
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

// combine_alone is combine_sums for a rank alone, with 16-byte units:
// every term is its own and a token has one at most (width 1), so token
// t's sum is row entRow[t] of z as it is (one_term; none: zeros). Items
// are (token, chunk) of tokens * chunks, a chunk one round of warp_copy
// (copyLane units a lane, 4 KiB), warp, warp + warps, ... to a warp:
// every warp has a chunk's loads in flight at once where a sum's item has
// sumLane units a lane, and the rows of a small call still spread over
// every warp. Lane k reads the row of the warp's item k of each 32 at
// once, so that an item's loads wait for no load of its row's index.
template <bool BF16>
__device__ __forceinline__ void combine_alone(uint8_t *out, float *gw, const uint8_t *z, const float *zw,
					      const int32_t *entDest, const int32_t *entRow, const int32_t *slot,
					      int64_t tokens, int64_t rowBytes, int32_t topk, int32_t me, int64_t warp,
					      int64_t warps, int lane)
{
	const int64_t chunk = 32 * copyLane * 16;
	const int64_t chunks = (rowBytes + chunk - 1) / chunk;
	const int64_t items = tokens * chunks;
	for (int64_t first = warp; first < items; first += 32 * warps) {
		const int64_t mine = first + lane * warps;
		const int32_t rowOf = mine < items ? entRow[mine / chunks] : -1;
		for (int k = 0; k < 32; k++) {
			const int64_t item = first + k * warps;
			if (item >= items) {
				break;
			}
			const int64_t t = item / chunks, o = item % chunks * chunk;
			const int64_t n = min(chunk, rowBytes - o);
			const int32_t r = __shfl_sync(0xffffffffu, rowOf, k);
			if (r >= 0) {
				warp_copy<true, true, BF16>(out + t * rowBytes + o, z + (int64_t)r * rowBytes + o, n, 16,
							    lane);
			} else {
				warp_zero(out + t * rowBytes + o, n, 16, lane);
			}
			if (gw != nullptr && o == 0) {
				token_weights(gw, zw, nullptr, 0, entDest, entRow, slot, t, topk, me, lane);
			}
		}
	}
}

// sumChunk is how many units a warp sums as one item: sumLane a lane.
// sumTerms is how many of an item's terms a lane loads before it adds
// them: a warp has sumTerms * sumLane * 512 bytes of loads in flight (16-byte
// units), which is what keeps a sum from waiting a memory round trip a
// term.
constexpr int sumLane = 4;
constexpr int32_t sumChunk = 32 * sumLane;
constexpr int sumTerms = 2;

// combine_sums is goep_ep_combine's sums (ep.cu's sum_rows, bit for bit):
// items (token t, chunk ch) of tokens * chunks, one at a time from the
// work counter (shared: work), else warp's share of warps, so that the
// chunks of the last tokens to be complete are summed by as many warps at
// once; an item's terms are entries e = t*width + c for c < width with
// entRow[e] >= 0, added in c order: row entRow[e] of z for this rank's
// own (entDest[e] == me), else row e of the window once its flag
// (flags[e]) holds the call's epoch. Lane c of the warp reads the entries
// and the flag of term c (of each 32 in turn) at once, waits only for the
// terms not yet in (not again for a token whose terms it saw land), and
// the terms' units are loaded sumTerms terms at a time. Units are V
// elements (V > 1: 16 bytes). With gw, the token's weights as sum_rows sets them, from zw
// (own) or the window's weights (wOff).
template <bool BF16, int V>
__device__ __forceinline__ void combine_sums(uint8_t *out, float *gw, const uint8_t *z, const float *zw,
					     const uint8_t *win, const uint64_t *rowFlags, const int32_t *entDest,
					     const int32_t *entRow, const int32_t *slot, int64_t tokens, int32_t width,
					     int64_t hidden, int64_t wOff, int32_t topk, uint32_t dnan, uint64_t epoch,
					     uint32_t op, int64_t timeoutNs, const flag_words &fw, int32_t me,
					     uint64_t *probe, bool shared, int64_t warp, int64_t warps, int lane)
{
	const int64_t es = BF16 ? 2 : 4;
	const int64_t rowBytes = hidden * es;
	// Item counts stay below 2^31 (oneLaunchFits): 32-bit arithmetic.
	const int32_t units = (int32_t)(hidden / V);
	const int32_t chunks = (units + sumChunk - 1) / sumChunk;
	// late: a warp takes its next item once its item's terms are in, so
	// that the items after one that waits go to free warps.
	work q(shared ? &fw.grid[2] : nullptr, tokens * chunks, 1, warp, warps, lane, true);
	int64_t ready = -1;  // the token whose terms this warp has seen land
	for (int64_t item; q.take(item, lane);) {
		const int32_t t = (int32_t)item / chunks, ch = (int32_t)item % chunks;
		// A lane's units of the chunk are u0 + 32j, j < sumLane.
		const int32_t u0 = ch * sumChunk + lane;
		const int32_t uEnd = min(units, (ch + 1) * sumChunk);
		float acc[sumLane][V];
		// stored: the item had one term, already in out.
		bool any = false, remote = false, ok = true, stored = false;
		for (int32_t c0 = 0; c0 < width && ok; c0 += 32) {
			const int32_t c = c0 + lane;
			const int64_t e = (int64_t)t * width + c;
			int32_t r = -1, d = me;
			if (c < width) {
				r = entRow[e];
				d = entDest[e];
			}
			const bool mine = r >= 0 && d != me;
			const uint32_t fromWin = __ballot_sync(0xffffffffu, mine);
			remote = remote || fromWin != 0;
			// Each lane looks at its term's flag once; only the terms
			// not yet in (or that fail) are waited for, one by one.
			bool in = true;
			if (t != ready && mine) {
				const uint64_t v = load_acquire(rowFlags + e);
				in = (v >> 8) > epoch || ((v >> 8) == epoch && (uint32_t)(v & 0xff) == op);
			}
			__syncwarp();
			for (uint32_t m = __ballot_sync(0xffffffffu, !in); m != 0 && ok; m &= m - 1) {
				const int b = __ffs(m) - 1;
				ok = wait_row(rowFlags + (int64_t)t * width + c0 + b, __shfl_sync(0xffffffffu, d, b), epoch,
					      op, timeoutNs, fw, lane);
			}
			if (!ok) {
				break;  // the call fails (status)
			}
			q.ahead(lane);
			const uint8_t *src = r < 0 ? nullptr : d == me ? z + (int64_t)r * rowBytes : win + e * rowBytes;
			const uint32_t terms = __ballot_sync(0xffffffffu, r >= 0);
			// A token's one term goes to out as it is (one_term),
			// without the sums' float arithmetic.
			const bool single = V > 1 && !any && c0 + 32 >= width && __popc(terms) == 1;
			// Up to sumTerms live terms at a time, in c order: every
			// unit of theirs loaded before any is added.
			for (uint32_t live = terms; live != 0;) {
				const uint8_t *s[sumTerms];
				bool has[sumTerms], w[sumTerms];
#pragma unroll
				for (int k = 0; k < sumTerms; k++) {
					has[k] = live != 0;
					const int b = has[k] ? __ffs(live) - 1 : 0;
					live &= live - 1;
					s[k] = (const uint8_t *)__shfl_sync(0xffffffffu, (unsigned long long)src, b);
					w[k] = (fromWin >> b) & 1;
				}
				uint4 v[sumTerms][sumLane];
#pragma unroll
				for (int k = 0; k < sumTerms; k++) {
#pragma unroll
					for (int j = 0; j < sumLane; j++) {
						if (has[k] && u0 + 32 * j < uEnd) {
							v[k][j] = load_unit<BF16, V>(s[k] + (int64_t)(u0 + 32 * j) * V * es, w[k]);
						}
					}
				}
				if (single) {
#pragma unroll
					for (int j = 0; j < sumLane; j++) {
						if (u0 + 32 * j < uEnd) {
							store16<true>((uint4 *)(out + (int64_t)t * rowBytes +
										(int64_t)(u0 + 32 * j) * 16),
								      one_term<BF16>(v[0][j]));
						}
					}
					stored = true;
					break;
				}
#pragma unroll
				for (int k = 0; k < sumTerms; k++) {
					if (!has[k]) {
						continue;
					}
#pragma unroll
					for (int j = 0; j < sumLane; j++) {
						float f[V];
						unit_floats<BF16, V>(f, v[k][j]);
#pragma unroll
						for (int i = 0; i < V; i++) {
							acc[j][i] = any ? add(acc[j][i], f[i], dnan) : f[i];
						}
					}
					any = true;
				}
			}
		}
		if (!ok) {
			continue;  // the call fails (status)
		}
		ready = t;
#pragma unroll
		for (int j = 0; j < sumLane && !stored; j++) {
			if (u0 + 32 * j >= uEnd) {
				continue;
			}
			if (!any) {
#pragma unroll
				for (int i = 0; i < V; i++) {
					acc[j][i] = 0.0f;
				}
			}
			store_sum<BF16, V>(out + (int64_t)t * rowBytes + (int64_t)(u0 + 32 * j) * V * es, acc[j]);
		}
		if (gw != nullptr && ch == 0) {
			token_weights(gw, zw, win, wOff, entDest, entRow, slot, t, topk, me, lane);
		}
		if (remote) {
			landed(probe, lane);
		}
	}
}

}  // namespace goep_onelaunch

using namespace goep_onelaunch;

// The most ranks of a domain (the host refuses more): the shared tables.
#define GOEP_MAX_RANKS 1024

// sendWarps is how many warps of a block send first (the lower ones); the
// others receive (dispatch) or sum (combine) from the start, and the
// senders join them once their sends are done.
constexpr int sendWarps = 8;

// launch_start is what a one-launch kernel starts from: the call's epoch
// (the epoch counter's next; end_call stores it; 0 with one rank, whose
// launch reads it only to end the call: finish_alone), the block's record
// of the peers heard from (free: done for the previous call), the warp's
// place in the grid and its role, the launch's start (for pacing), and
// the received rows' offsets by source (source_offsets: off[ranks+1] and
// most, in shared memory).
struct launch_start {
	uint64_t epoch;
	int lane;
	int64_t warp, warps;
	bool sender;
	int64_t sendWarpsAll;
	heard freed;
	uint64_t start;
	uint64_t *probe;
	int32_t *off, *most;
};

// start_launch reads the epoch, clears the block's records and notes the
// launch's start in the probe; every thread of the block calls it. With
// one rank, the offsets are all of limit's rows (the valid ones), found
// at once; else the role that needs them first finds them
// (find_offsets).
__device__ __forceinline__ launch_start start_launch(const flag_words &fw, uint64_t *probe, int64_t limit,
						     int32_t ranks)
{
	__shared__ uint64_t epochShared, startShared;
	__shared__ uint32_t freeBits[GOEP_MAX_RANKS / 32];
	__shared__ int32_t off[GOEP_MAX_RANKS + 1], most;
	if (threadIdx.x == 0) {
		// With one rank only finish_alone needs the epoch, and reads it
		// there: the blocks start without waiting for the load.
		epochShared = ranks > 1 ? *(volatile const uint64_t *)fw.counter + 1 : 0;
		startShared = 0;
		if (probe != nullptr) {
			atomicMax((unsigned long long *)probe + probeStart, ~(unsigned long long)now_ns());
			startShared = ~*(volatile const uint64_t *)(probe + probeStart);
		}
		most = 0;
		if (ranks == 1) {
			off[0] = 0;
			off[1] = (int32_t)limit;
			most = (int32_t)limit;
		}
	}
	for (int i = threadIdx.x; i < GOEP_MAX_RANKS / 32; i += blockDim.x) {
		freeBits[i] = 0;
	}
	__syncthreads();
	launch_start ls;
	ls.epoch = epochShared;
	ls.start = startShared;
	ls.lane = threadIdx.x & 31;
	ls.warps = (int64_t)gridDim.x * (blockDim.x / 32);
	ls.warp = (int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
	ls.sender = (int)(threadIdx.x / 32) < sendWarps;
	ls.sendWarpsAll = (int64_t)gridDim.x * sendWarps;
	ls.freed = heard{freeBits};
	ls.off = off;
	ls.most = &most;
	ls.probe = probe;
	return ls;
}

// find_offsets finds the received rows' offsets by source among rows [0,
// limit) (source_offsets) with the receiving warps (receivers), else with
// every warp of the block; with one rank start_launch did.
__device__ __forceinline__ void find_offsets(const launch_start &ls, const int32_t *recvSrc, int64_t limit,
					     int32_t ranks, bool receivers)
{
	if (ranks == 1) {
		return;
	}
	const int first = receivers ? sendWarps * 32 : 0;
	source_offsets(ls.off, ls.most, recvSrc, limit, ranks, (int)threadIdx.x - first, (int)blockDim.x - first);
	probe_max(ls.probe, probeFound, now_ns(), (int)threadIdx.x - first);
}

// senders_done counts a sender warp past its sends (grid[0], of senders
// warps in all); the last one signals arrived (value) to every peer. Each
// warp fences its stores system-wide before it counts itself, so the
// signal announces every sender's stores.
__device__ __forceinline__ void senders_done(const flag_words &fw, uint64_t *const *peerFlags, int32_t ranks,
					     int32_t me, uint64_t value, int64_t senders, int lane)
{
	int last = 0;
	__syncwarp();
	if (lane == 0) {
		__threadfence_system();
		last = atomicAdd(&fw.grid[0], 1u) == (uint32_t)senders - 1;
		if (last) {
			atomicExch(&fw.grid[0], 0u);
			__threadfence_system();
		}
	}
	if (__shfl_sync(0xffffffffu, last, 0)) {
		__syncwarp();
		for (int32_t p = lane; p < ranks; p += 32) {
			*(volatile uint64_t *)(peerFlags[p] + me) = value;
		}
	}
}

// end_call ends a one-launch call, by the one block that ends it
// (finish_launch's last, or finish_alone's): it puts the work counters
// back to zero, files the probe's record and clears its live words (when
// probing), then stores the epoch and signals done (the flags' Finish) to
// every peer. Thread 0 does all but the signals, which the block's threads
// share (a peer a thread): every thread of the block calls it, but with
// one rank thread 0 alone may (finish_alone).
__device__ __forceinline__ void end_call(const flag_words &fw, uint64_t *const *peerFlags, int32_t ranks, int32_t me,
					 uint64_t epoch, uint32_t op, uint64_t *probe)
{
	if (threadIdx.x == 0) {
		atomicExch(&fw.grid[2], 0u);
		atomicExch(&fw.grid[3], 0u);
		if (probe != nullptr) {
			volatile uint64_t *live = probe;
			volatile uint64_t *rec = probe + probeLive * (1 + (int64_t)(epoch % probeSlots));
			uint64_t first = live[probeFirst];
			rec[1] = ~live[probeStart];
			rec[2] = live[probeSent];
			rec[3] = first == 0 ? 0 : ~first;
			rec[4] = live[probeLast];
			rec[5] = live[probeBytes];
			rec[6] = live[probeFound];
			first = live[probeFirstSent];
			rec[7] = first == 0 ? 0 : ~first;
			rec[0] = epoch << 8 | op;
			for (int w = 0; w < probeLive; w++) {
				live[w] = 0;
			}
		}
		__threadfence();
		*(volatile uint64_t *)fw.counter = epoch;
	}
	signal_words(peerFlags, ranks, ranks + me, epoch << 8 | op);
}

// alone_ticket counts a lone rank's block into its launch (thread 0's
// atomic; 0 on the other threads) and returns its place, which
// finish_alone reads at the block's end, so that the atomic's round trip
// overlaps the block's work.
__device__ __forceinline__ uint32_t alone_ticket(const flag_words &fw)
{
	return threadIdx.x == 0 ? atomicAdd(&fw.grid[1], 1u) : 0u;
}

// finish_alone ends a lone rank's call: thread 0 of the block that counted
// itself last (alone_ticket) puts the count back to zero, stores the
// rank's own arrived word and ends the call (end_call), with the epoch
// counter's next. Such a call waits for no peer and signals none, nothing
// else of its launch reads the epoch, and what follows it on its stream
// starts only once the launch has ended: no block waits for another, and
// nothing needs their writes announced. Every thread of the block calls
// it, with its ticket.
__device__ __forceinline__ void finish_alone(const flag_words &fw, uint64_t *const *peerFlags, uint32_t op,
					     uint64_t *probe, uint32_t ticket)
{
	if (threadIdx.x == 0 && ticket == gridDim.x - 1) {
		atomicExch(&fw.grid[1], 0u);
		const uint64_t epoch = *(volatile const uint64_t *)fw.counter + 1;
		// A rank alone sends nothing, so no sender signalled arrived
		// (senders_done): its own word, here.
		*(volatile uint64_t *)peerFlags[0] = epoch << 8 | op;
		end_call(fw, peerFlags, 1, 0, epoch, op, probe);
	}
}

// finish_launch ends a call at a block's end. With several ranks the
// grid's last block past this point waits until every peer has signalled
// arrived with op, those this rank exchanged no rows with included (a peer
// that rejected the call, ran another, hung or died fails it on every
// rank, as the flags' Arrive does), then ends the call (end_call),
// whatever the waits found. A rank alone ends it by finish_alone, with the
// block's ticket (alone_ticket).
__device__ __forceinline__ void finish_launch(const flag_words &fw, uint64_t *const *peerFlags, int32_t ranks,
					      int32_t me, uint64_t epoch, uint32_t op, int64_t timeoutNs,
					      uint64_t *probe, uint32_t ticket)
{
	if (ranks == 1) {
		finish_alone(fw, peerFlags, op, probe, ticket);
		return;
	}
	if (grid_last(&fw.grid[1], gridDim.x)) {
		for (int32_t p = threadIdx.x; p < ranks; p += blockDim.x) {
			if (p != me) {
				wait_word(fw.arrived + p, p, epoch, epoch, op, timeoutNs, fw.status, fw.missing);
			}
		}
		__syncthreads();
		end_call(fw, peerFlags, ranks, me, epoch, op, probe);
	}
}

// A one-launch grid has at most one block an SM (oneLaunchBlocks in
// launch.go), so a block may take an SM's registers: without the minimum
// of one block an SM, ptxas keeps room for two and spills the copies'
// loads in flight.
#define GOEP_ONE_LAUNCH_BOUNDS __launch_bounds__(512, 1)

// goep_ep_dispatch is Dispatch in one domain, in one launch.
//
// Sends (the sender warps, a warp an entry, entries in order from a work
// counter; entries = tokens * width, a token's consecutive, so that its
// copies go out at once): entry j (token entTok[j]'s copy for
// destination entDest[j], at row entRow[j] there; row -1: none) for a
// peer d is row entTok[j] of x (rowBytes), its weights w[t*K:(t+1)*K] (w null: none) and its fp8 scales (row t of sx,
// sBytes; sx null: none), stored into d's receive window (peerBase[d]):
// the row at row*rowBytes, the weights at wOff + row*K*4, the scales at
// sOff + row*sBytes, once d has signalled done for the previous call;
// then the row's flag (fOff + row*8) gets the call's epoch and op. The
// last sender signals arrived.
//
// Receives (every warp; a sender once its sends are done): with n =
// min(counts[0], rowCap) when counts is not null, else rows, row i < n of
// out (and outS) is, for a row of this rank's own (recvSrc[i] == me),
// row t = recvEnt[i] / width of x (sx), else the window's row i once its
// flag holds the call's epoch. Rows are taken in turn from the work
// counter, sources interleaved (item k: row k / ranks of source (me + k)
// % ranks), so that every source's rows are copied out while its later
// rows are still in flight. Rows [n, rowCap) are zero; row i of outIdx is
// row i of idx; outW[i*K+k] is the row's weight k where idx[i*K+k] >= 0
// and i < n (this rank's own: w[t*K+k]), else 0. out, outW, outIdx and
// outS may each be null (not written).
//
// probe (null: off) records the launch's times; paceFs > 0 paces the
// stores to peers (pace_reserve, pace_wait).
//
// This is goep_ep_push, goep_ep_copy_out and the flags' Begin, Arrive and
// Finish, bit for bit.
extern "C" __global__ void GOEP_ONE_LAUNCH_BOUNDS goep_ep_dispatch(
	const uint8_t *x, const float *w, const uint8_t *sx, const int32_t *entTok, const int32_t *entDest,
	const int32_t *entRow, int64_t entries, const int32_t *recvSrc, const int32_t *recvEnt, const int32_t *idx,
	const int32_t *counts, int64_t rows, int64_t rowCap, uint8_t *out, float *outW, int32_t *outIdx, uint8_t *outS,
	uint8_t *const *peerBase, const uint8_t *win, int64_t rowBytes, int64_t wOff, int64_t sOff, int64_t sBytes,
	int64_t fOff, int32_t topk, int32_t width, int32_t unit, uint64_t *const *peerFlags, uint64_t *flags,
	int32_t ranks, int32_t me, uint32_t op, int64_t timeoutNs, uint64_t *probe, int64_t paceFs)
{
	flag_words fw = flag_words_of(flags, ranks);
	int64_t n = rows;
	if (counts != nullptr) {
		n = counts[0] < rowCap ? counts[0] : rowCap;
	}
	const launch_start ls = start_launch(fw, probe, n, ranks);
	const uint64_t epoch = ls.epoch;
	const int lane = ls.lane;
	const uint64_t tag = epoch << 8 | op;
	const uint32_t ticket = ranks == 1 ? alone_ticket(fw) : 0u;

	// Sends: rows for peers only (this rank's own go straight to their
	// place with the receives). With one rank there are none, and the
	// sender warps receive from the start: their share of the rows is
	// fixed (work), so a late start would be the launch's tail.
	if (ls.sender && ranks > 1) {
		// A warp an entry (a token's copy for one destination), not a
		// token: a token's copies go out at once from consecutive warps
		// instead of one after another from one warp, whose copies to
		// the later destinations would wait behind the earlier ones.
		work q(&fw.grid[3], entries, 1, 0, 0, lane);
		const int64_t sent = rowBytes + sBytes + (w != nullptr ? 4 * topk : 0);
		for (int64_t j; q.take(j, lane);) {
			const int32_t row = entRow[j], d = entDest[j];
			if (row < 0 || d == me) {
				continue;
			}
			if (!wait_heard(ls.freed, fw.done + d, d, epoch - 1, epoch, 0, timeoutNs, fw, lane)) {
				continue;  // the call fails (status); nothing to store
			}
			const int64_t t = entTok[j];
			uint8_t *base = peerBase[d];
			pace_wait(pace_reserve(probe, sent, lane), paceFs, ls.start, lane);
			warp_copy<true, false>(base + (int64_t)row * rowBytes, x + t * rowBytes, rowBytes, unit, lane);
			for (int32_t k = lane; w != nullptr && k < topk; k += 32) {
				((float *)(base + wOff))[(int64_t)row * topk + k] = w[t * topk + k];
			}
			if (sx != nullptr) {
				warp_copy4<true>(base + sOff + (int64_t)row * sBytes, sx + t * sBytes, sBytes, lane);
			}
			publish_row((uint64_t *)(base + fOff) + row, tag, lane);
			probe_sent(probe, lane);
		}
		senders_done(fw, peerFlags, ranks, me, tag, ls.sendWarpsAll, lane);
		take_offsets();
	} else if (!ls.sender) {
		find_offsets(ls, recvSrc, n, ranks, true);
		if (ranks > 1) {
			hand_offsets();
		}
	}

	// Receives.
	const uint64_t *rowFlags = (const uint64_t *)(win + fOff);
	const int64_t items = (int64_t)ranks * *ls.most;
	work q(ranks > 1 ? &fw.grid[2] : nullptr, items, 1, ls.warp, ls.warps, lane);
	for (int64_t k; q.take(k, lane);) {
		// Item counts stay below 2^31 (oneLaunchFits): 32-bit arithmetic.
		const int32_t s = (me + (int32_t)k % ranks) % ranks;
		const int64_t i = ls.off[s] + (int32_t)k / ranks;
		if (i >= ls.off[s + 1]) {
			continue;
		}
		// The row first, its index and weights after: their loads do
		// not wait behind the stores of outIdx.
		const bool own = s == me;
		const int64_t t = own ? recvEnt[i] / width : 0;
		if (own) {
			if (out != nullptr) {
				warp_copy<true, true>(out + i * rowBytes, x + t * rowBytes, rowBytes, unit, lane);
			}
			if (sx != nullptr && outS != nullptr) {
				warp_copy4<true>(outS + i * sBytes, sx + t * sBytes, sBytes, lane);
			}
		} else {
			if (!wait_row(rowFlags + i, s, epoch, op, timeoutNs, fw, lane)) {
				continue;  // the call fails (status)
			}
			if (out != nullptr) {
				warp_copy<false, true>(out + i * rowBytes, win + i * rowBytes, rowBytes, unit, lane);
			}
			if (outS != nullptr) {
				warp_copy4<false>(outS + i * sBytes, win + sOff + i * sBytes, sBytes, lane);
			}
		}
		for (int32_t q = lane; (outIdx != nullptr || outW != nullptr) && q < topk; q += 32) {
			const int64_t e = i * topk + q;
			const int32_t ix = idx[e];
			if (outIdx != nullptr) {
				outIdx[e] = ix;
			}
			if (outW != nullptr) {
				float v = 0.0f;
				if (ix >= 0) {
					if (own) {
						v = w != nullptr ? w[t * topk + q] : 0.0f;
					} else {
						v = __ldcg((const float *)(win + wOff) + e);
					}
				}
				outW[e] = v;
			}
		}
		if (!own) {
			landed(probe, lane);
		}
	}
	// Rows past the received ones.
	for (int64_t i = n + ls.warp; i < rowCap; i += ls.warps) {
		for (int32_t q = lane; outIdx != nullptr && q < topk; q += 32) {
			outIdx[i * topk + q] = idx[i * topk + q];
		}
		if (out != nullptr) {
			warp_zero(out + i * rowBytes, rowBytes, unit, lane);
		}
		if (outS != nullptr) {
			warp_zero(outS + i * sBytes, sBytes, 4, lane);
		}
		for (int32_t q = lane; outW != nullptr && q < topk; q += 32) {
			outW[i * topk + q] = 0.0f;
		}
	}
	finish_launch(fw, peerFlags, ranks, me, epoch, op, timeoutNs, probe, ticket);
}

// goep_ep_combine is Combine (and DispatchBackward, with zw) in one domain,
// in one launch.
//
// Sends (the sender warps, items in order from a work counter): received
// row i < rowCap of z (rowBytes), with
// recvSrc[i] >= 0 and recvEnt[i] >= 0 (-1 past the valid rows), for a peer
// s = recvSrc[i] goes back to s: into s's combine window (peerBase[s]) at
// row recvEnt[i], its weights zw[i*K:(i+1)*K] (zw null: none) at wOff +
// recvEnt[i]*K*4, once s has signalled done for the previous call; then
// the row's flag (fOff + recvEnt[i]*8) gets the call's epoch and op.
// Sources are interleaved, this rank's next first (item k: row k /
// (ranks-1) of source (me + 1 + k % (ranks-1)) % ranks), so that no rank
// is every sender's first and every source's tokens fill in at the same
// pace. A row of this rank's own stays in z: the sums read it there. The
// last sender signals arrived.
//
// Sums (every warp; a sender once its sends are done): out and gw as
// goep_ep_sum_bf16/_fp32 write them from the window that goep_ep_scatter
// filled (combine_sums), a token's terms summed once their rows' flags
// hold the call's epoch. bf16: rows of bf16, else fp32; vec: units of 16
// bytes (rowBytes, z, out and the window 16-byte aligned), else one
// element. A rank alone with 16-byte units copies each token's one term
// instead (combine_alone).
//
// probe and paceFs: as goep_ep_dispatch's.
//
// This is goep_ep_scatter, goep_ep_sum_* and the flags' Begin, Arrive and
// Finish, bit for bit.
extern "C" __global__ void GOEP_ONE_LAUNCH_BOUNDS goep_ep_combine(
	const uint8_t *z, const float *zw, const int32_t *recvSrc, const int32_t *recvEnt, int64_t rowCap,
	const int32_t *entDest, const int32_t *entRow, const int32_t *slot, int64_t tokens, uint8_t *out, float *gw,
	uint8_t *const *peerBase, const uint8_t *win, int64_t rowBytes, int64_t wOff, int64_t fOff, int64_t hidden,
	int32_t topk, int32_t width, int32_t unit, int32_t bf16, int32_t vec, uint32_t dnan, uint64_t *const *peerFlags,
	uint64_t *flags, int32_t ranks, int32_t me, uint32_t op, int64_t timeoutNs, uint64_t *probe, int64_t paceFs)
{
	flag_words fw = flag_words_of(flags, ranks);
	const launch_start ls = start_launch(fw, probe, rowCap, ranks);
	const uint64_t epoch = ls.epoch;
	const int lane = ls.lane;
	const uint64_t tag = epoch << 8 | op;
	const uint32_t ticket = ranks == 1 ? alone_ticket(fw) : 0u;
	// The senders' order needs the offsets; the sums cannot start before
	// rows arrive anyway, so every warp finds them.
	find_offsets(ls, recvSrc, rowCap, ranks, false);

	// Sends (none with one rank, as in dispatch).
	if (ls.sender && ranks > 1) {
		work q(&fw.grid[3], (int64_t)(ranks - 1) * *ls.most, 1, 0, 0, lane);
		for (int64_t k; q.take(k, lane);) {
			const int32_t s = (int32_t)((me + 1 + k % (ranks - 1)) % ranks);
			const int64_t i = ls.off[s] + k / (ranks - 1);
			if (i >= ls.off[s + 1]) {
				continue;
			}
			const int32_t e = recvEnt[i];
			if (e < 0) {
				continue;
			}
			if (!wait_heard(ls.freed, fw.done + s, s, epoch - 1, epoch, 0, timeoutNs, fw, lane)) {
				continue;  // the call fails (status); nothing to store
			}
			uint8_t *base = peerBase[s];
			pace_wait(pace_reserve(probe, rowBytes + (zw != nullptr ? 4 * topk : 0), lane), paceFs, ls.start, lane);
			warp_copy<true, false>(base + (int64_t)e * rowBytes, z + i * rowBytes, rowBytes, unit, lane);
			for (int32_t q = lane; zw != nullptr && q < topk; q += 32) {
				((float *)(base + wOff))[(int64_t)e * topk + q] = zw[i * topk + q];
			}
			publish_row((uint64_t *)(base + fOff) + e, tag, lane);
			probe_sent(probe, lane);
		}
		senders_done(fw, peerFlags, ranks, me, tag, ls.sendWarpsAll, lane);
	}

	// Sums.
	const uint64_t *rowFlags = (const uint64_t *)(win + fOff);
	if (ranks == 1 && vec) {
		if (bf16) {
			combine_alone<true>(out, gw, z, zw, entDest, entRow, slot, tokens, rowBytes, topk, me, ls.warp,
					    ls.warps, lane);
		} else {
			combine_alone<false>(out, gw, z, zw, entDest, entRow, slot, tokens, rowBytes, topk, me,
					     ls.warp, ls.warps, lane);
		}
	} else if (bf16 && vec) {
		combine_sums<true, 8>(out, gw, z, zw, win, rowFlags, entDest, entRow, slot, tokens, width, hidden, wOff,
				      topk, dnan, epoch, op, timeoutNs, fw, me, probe, ranks > 1, ls.warp, ls.warps, lane);
	} else if (bf16) {
		combine_sums<true, 1>(out, gw, z, zw, win, rowFlags, entDest, entRow, slot, tokens, width, hidden, wOff,
				      topk, dnan, epoch, op, timeoutNs, fw, me, probe, ranks > 1, ls.warp, ls.warps, lane);
	} else if (vec) {
		combine_sums<false, 4>(out, gw, z, zw, win, rowFlags, entDest, entRow, slot, tokens, width, hidden,
				       wOff, topk, dnan, epoch, op, timeoutNs, fw, me, probe, ranks > 1, ls.warp, ls.warps, lane);
	} else {
		combine_sums<false, 1>(out, gw, z, zw, win, rowFlags, entDest, entRow, slot, tokens, width, hidden,
				       wOff, topk, dnan, epoch, op, timeoutNs, fw, me, probe, ranks > 1, ls.warp, ls.warps, lane);
	}
	finish_launch(fw, peerFlags, ranks, me, epoch, op, timeoutNs, probe, ticket);
}
