// Package nvlink is the NVLink-domain layer: the ranks of one domain map each
// other's memory and meet in epoch-numbered exchanges.
//
// Each rank owns a control block that its peers map. An exchange at epoch e
// is two phases:
//
//  1. publish: a rank writes its header for e (operation, call signature,
//     status, the buffers it exposes for this call: their handles, or their
//     spans in its stage), then stores e into its epoch word; it waits until
//     every peer has published e (the count below), checks that all peers
//     run the same operation with the same signature and that none reported
//     bad input, and maps the peers' buffers;
//  2. work and done: the caller's function reads the peers' buffers; then,
//     if some rank exposed buffers, the rank stores e into its done word
//     and waits until every peer's reaches e.
//
// A rank's waits do not look at each peer: every rank also counts each of
// its stores in one word of the domain (in rank 0's block), and a phase is
// over when that count reaches R times the phases so far; the store that
// brings it to a multiple of R wakes the others.
//
// Epochs only grow; no flag is ever reset. After phase 2 no peer touches this
// rank's buffers for epoch e any more, so its caller may reuse them. A small
// call stages instead (Stage): it copies what it exposes into its stage, two
// halves in its control block, and when every rank did, the exchange ends
// after the work, one round instead of two. Headers and stage halves
// alternate by epoch parity: a peer reads those of e until it publishes e+1,
// and a rank writes them again at e+2, which it reaches only after every
// peer's publish of e+1. Every wait has a deadline and names the ranks not
// heard from.
//
// On the host backend the domain's memory is host memory: peers in this
// process take the buffers an exchange exposes from their owner's inbox,
// peers in other processes map them by a handle (a memfd); the CUDA backend
// uses IPC or fabric handles instead.
//
// On the GPU the same protocol runs as stream work (GPUFlags, tag cuda):
// every rank's windows are mapped by its peers (MapGPU), and epoch flags in
// a region of them (arrived and done words, written only by the peer they
// are named after) order the calls; waits are clock-bounded and leave a
// status word the host reads after a synchronize (WaitError decodes it).
// kernels/flags.cuh is the protocol's device side, for kernels that wait
// or signal in place; kernels/flags.cu its own kernels.
package nvlink
