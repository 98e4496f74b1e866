// The device side of an NVLink domain's flag protocol (package nvlink,
// GPUFlags): every rank owns one array of uint64 words, arrived[R] then
// done[R], each word written only by the peer it is named after, with the
// value epoch<<8 | op. Epochs only grow; no word is ever reset. After the
// 2R flag words: status (the first failure of a wait: 1 timeout, 2
// operation mismatch), the rank's epoch counter, the address of the
// rank's alarm word (0: none), then missing[R] (int32): what a wait found
// of each peer (1 timed out, 2 ran another call, 3 rejected its input),
// then, 8-byte aligned, grid[4] (uint32): the counters of the kernels that
// run a whole call in one launch, zero between launches. The alarm word is
// in host memory mapped for the GPU: a wait that records a failure sets it
// (fail_status), so that the host, after a synchronize, reads status and
// missing back only when it is set.
//
// Kernels that take part in the protocol include this header: flags.cu's
// own kernels, and any data-path kernel that waits or signals in place.
#ifndef GOEP_NVLINK_FLAGS_CUH
#define GOEP_NVLINK_FLAGS_CUH

#include <stdint.h>

namespace goep_nvlink {  // named, not anonymous: keeps the PTX independent of the checkout path

// now_ns is the GPU's global timer, in nanoseconds.
__device__ __forceinline__ uint64_t now_ns()
{
	uint64_t t;
	asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
	return t;
}

// opRejected is the operation a rank signals when it rejected its input on
// the host: its peers fail the call instead of waiting (nvlink.OpRejected).
constexpr uint32_t opRejected = 0x7f;

// raise_alarm sets the alarm word whose address alarmSlot holds (none
// when 0), in host memory: the host reads the failure's details back.
__device__ __forceinline__ void raise_alarm(uint64_t *const *alarmSlot)
{
	volatile uint64_t *a = *(volatile uint64_t *const *)alarmSlot;
	if (a != nullptr) {
		*a = 1;
		__threadfence_system();
	}
}

// fail_status records a failed wait: status[0] = code unless an earlier
// failure is there, and then the alarm (whose address is two words after
// status, past the epoch counter).
__device__ __forceinline__ void fail_status(uint64_t *status, uint64_t code)
{
	if (atomicCAS((unsigned long long *)status, 0ull, (unsigned long long)code) == 0ull) {
		raise_alarm((uint64_t *const *)(status + 2));
	}
}

// wait_word waits, one thread, until word (peer p's) holds an epoch of
// at least want. If op is not 0, a word at exactly epoch must carry op,
// else status[0] = 2 (the peer runs another call; missing[p] = 2, or 3
// when the peer rejected its input: op opRejected). Past timeoutNs of
// waiting (globaltimer) it sets status[0] = 1 and missing[p] = 1. A wait
// after an earlier failure (status[0] != 0) returns at once. It returns
// whether the peer was heard from in order. It spins without sleeping at
// first: the word is in this GPU's memory, and the peer's signal is
// usually microseconds away. After the wait the thread's reads and writes
// follow the peer's: a system-wide fence does it, or, with acquire, the
// word's reads are system-scope acquires, which order them without waiting
// for the thread's own earlier writes (for a thread that has made none
// the signal needs to cover).
__device__ __forceinline__ bool wait_word(const uint64_t *word, int32_t p, uint64_t want, uint64_t epoch,
					  uint32_t op, int64_t timeoutNs, uint64_t *status, int32_t *missing,
					  bool acquire = false)
{
	volatile const uint64_t *f = word;
	volatile uint64_t *st = status;
	uint64_t start = now_ns();
	for (int spin = 0;; spin++) {
		if (*st != 0) {
			return false;
		}
		uint64_t v;
		if (acquire) {
			asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(word) : "memory");
		} else {
			v = *f;
		}
		if ((v >> 8) >= want) {
			if (op != 0 && (v >> 8) == epoch && (uint32_t)(v & 0xff) != op) {
				missing[p] = (v & 0xff) == opRejected ? 3 : 2;
				fail_status(status, 2);
				return false;
			}
			if (!acquire) {
				__threadfence_system();  // reads after the wait see the peer's writes
			}
			return true;
		}
		if ((spin & 63) == 63 && (int64_t)(now_ns() - start) > timeoutNs) {
			missing[p] = 1;
			fail_status(status, 1);
			return false;
		}
		if (spin > 1024) {
			__nanosleep(128);
		}
	}
}

// signal_words stores value into word slot of every peer's flags
// (peerFlags[p] + slot, p < ranks), the block's threads in turn. The
// caller has fenced (system-wide) the writes the signal announces.
__device__ __forceinline__ void signal_words(uint64_t *const *peerFlags, int32_t ranks, int64_t slot,
					     uint64_t value)
{
	for (int32_t p = threadIdx.x; p < ranks; p += blockDim.x) {
		volatile uint64_t *f = peerFlags[p] + slot;
		*f = value;
	}
}

// wait_flags waits, one thread per peer p < ranks, until flags[p] holds
// an epoch of at least E - lag (wait_word), E being the call's epoch
// *counter, which the wait first increments when bump is set (the first
// kernel of a call). The epoch lives in device memory, never in
// a kernel argument, so a captured graph replays with fresh epochs. If op
// is not 0, a word at exactly E must carry op, else status[0] = 2 (the
// peer runs another call; missing[p] = 2, or 3 when the peer rejected its
// input: op opRejected). Past timeoutNs of waiting (globaltimer) it sets
// status[0] = 1 and missing[p] = 1 and returns. A wait after an earlier
// failure (status[0] != 0) returns at once. One block of at least ranks
// threads.
__device__ __forceinline__ void wait_flags(const uint64_t *flags, int32_t ranks, uint64_t *counter,
					   int32_t bump, int64_t lag, uint32_t op, int64_t timeoutNs,
					   uint64_t *status, int32_t *missing)
{
	__shared__ uint64_t epoch;
	if (threadIdx.x == 0) {
		uint64_t e = *(volatile uint64_t *)counter;
		if (bump) {
			e++;
			*(volatile uint64_t *)counter = e;
		}
		epoch = e;
	}
	__syncthreads();
	int p = threadIdx.x;
	if (p < ranks) {
		wait_word(flags + p, p, epoch - (uint64_t)lag, epoch, op, timeoutNs, status, missing);
	}
}

// signal_flags stores E<<8 | op (E = *counter, the call's epoch) into
// word slot of every peer's flags (peerFlags[p] + slot, p < ranks), after a
// system-wide fence so that the peer sees every write this stream made
// before. One block of at least ranks threads.
__device__ __forceinline__ void signal_flags(uint64_t *const *peerFlags, int32_t ranks, int64_t slot,
					     const uint64_t *counter, uint32_t op)
{
	__threadfence_system();
	signal_words(peerFlags, ranks, slot, *(volatile const uint64_t *)counter << 8 | op);
}

// flag_words are the words of a rank's flags region of a domain of ranks
// ranks, at nvlink's offsets (gpuflags.go).
struct flag_words {
	uint64_t *arrived;  // [ranks]
	uint64_t *done;     // [ranks]
	uint64_t *status;   // then the counter and the alarm's address (fail_status)
	uint64_t *counter;
	int32_t *missing;  // [ranks]
	uint32_t *grid;    // [4]
};

__device__ __forceinline__ flag_words flag_words_of(uint64_t *flags, int32_t ranks)
{
	flag_words w;
	w.arrived = flags;
	w.done = flags + ranks;
	w.status = flags + 2 * ranks;
	w.counter = flags + 2 * ranks + 1;
	w.missing = (int32_t *)(flags + 2 * ranks + 3);
	int64_t gridOff = ((2 * (int64_t)ranks + 3) * 8 + 4 * (int64_t)ranks + 7) / 8 * 8;
	w.grid = (uint32_t *)((uint8_t *)flags + gridOff);
	return w;
}

// grid_last counts this block past a point of a one-launch kernel in
// counter (a grid word, zero between launches) and reports, to every
// thread of the block, whether it is the last of blocks to get there;
// the last puts counter back to zero. The block's writes before the point
// are fenced system-wide first, so the last block's signal after it
// announces every block's writes. Every thread of the block calls it.
__device__ __forceinline__ bool grid_last(uint32_t *counter, uint32_t blocks)
{
	__shared__ int last;
	__syncthreads();
	if (threadIdx.x == 0) {
		__threadfence_system();
		last = atomicAdd(counter, 1u) == blocks - 1;
		if (last) {
			atomicExch(counter, 0u);
			__threadfence_system();
		}
	}
	__syncthreads();
	return last != 0;
}

}  // namespace goep_nvlink

#endif  // GOEP_NVLINK_FLAGS_CUH
