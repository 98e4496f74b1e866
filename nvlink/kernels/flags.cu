// The kernels of an NVLink domain's flag protocol on the GPU (package
// nvlink, GPUFlags; the words are described in flags.cuh). go generate
// ./nvlink builds them to flags.ptx (internal/ptxgen). Every pointer is
// device memory: this rank's flags region, and the peers' flags regions
// mapped through CUDA IPC (DESIGN.md invariant 1). Each kernel runs as one
// block of at least ranks threads.
#include "flags.cuh"

using namespace goep_nvlink;

// goep_nvlink_wait waits until every peer's word p of flags holds an epoch
// of at least E - lag (wait_flags; bump advances the epoch first).
extern "C" __global__ void goep_nvlink_wait(const uint64_t *flags, int32_t ranks, uint64_t *counter,
					    int32_t bump, int64_t lag, uint32_t op, int64_t timeoutNs,
					    uint64_t *status, int32_t *missing)
{
	wait_flags(flags, ranks, counter, bump, lag, op, timeoutNs, status, missing);
}

// goep_nvlink_signal stores this call's epoch and op into word slot of
// every peer's flags (signal_flags).
extern "C" __global__ void goep_nvlink_signal(uint64_t *const *peerFlags, int32_t ranks, int64_t slot,
					      const uint64_t *counter, uint32_t op)
{
	signal_flags(peerFlags, ranks, slot, counter, op);
}

// goep_nvlink_arrive is goep_nvlink_signal (word slot, this rank's word,
// of every peer's flags, with op), then goep_nvlink_wait on flags[0,
// ranks) (the peers' words in this rank's own flags: this call's epoch
// exactly, op checked, no bump): a call's arrive in one launch instead of
// two.
extern "C" __global__ void goep_nvlink_arrive(uint64_t *const *peerFlags, int32_t ranks, int64_t slot,
					      const uint64_t *flags, uint64_t *counter, uint32_t op,
					      int64_t timeoutNs, uint64_t *status, int32_t *missing)
{
	signal_flags(peerFlags, ranks, slot, counter, op);
	wait_flags(flags, ranks, counter, 0, 0, op, timeoutNs, status, missing);
}
