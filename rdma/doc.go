// Package rdma is goep's inter-domain transport: one-sided puts from this
// rank's registered send region into peers' registered receive regions,
// each followed by a signal that the peer waits for. DESIGN.md section 4:
// the executor's hierarchical dispatch and combine move rows between the
// ranks of different NVLink domains with it.
//
// # Contract
//
// A Transport is created collectively (every rank of the group, same
// order). Each rank owns:
//
//   - a send region (Config.SendBytes): the caller writes what it sends
//     there (SendBuffer) before posting work that reads it, and leaves it
//     alone until Flush returns;
//   - a receive region (Config.RecvBytes; may differ between ranks): peers
//     write into it; the caller reads it after Wait says the bytes are there.
//     It is allocated by the transport (UCX: shared memory first, so that
//     peers on the same host store into it directly);
//   - one signal word per peer: the epoch that peer last signalled.
//
// Put queues a Work descriptor {Peer, LocalOff, RemoteOff, Bytes, Epoch} in
// a fixed-size ring read by the host proxy, a goroutine that posts the put
// and then the signal on the same endpoint, ordered by a fence, and
// progresses the transport. When the peer's Wait for (this rank, epoch)
// returns, the bytes of every put this rank queued to it before that
// signal are in the peer's receive region. Epochs are monotonic per
// (sender, receiver) pair and never reset: each signalled epoch must be
// greater than the last one sent to that peer.
//
// Every wait has the caller's deadline. A timeout names the peers not heard
// from (*comm.TimeoutError); a peer whose process died or whose endpoint
// failed gives a *comm.PeerLostError naming it, at once, not a hang.
//
// # Implementations
//
// New is the constructor the executor uses: one all-gather of the ranks'
// process identities (pid and a per-process random nonce) picks, for all
// ranks alike, NewInProcess when every rank lives in this process and
// NewUCX otherwise.
//
// NewInProcess (no build tag) is for goroutine ranks (comm.NewLocal, the
// embedded default of eprun and the executor's tests): ranks meet through
// a process-wide registry under a random key that rank 0 broadcasts, a
// put is a copy into the peer's mmap'd receive region before Put returns,
// and a signal is an atomic store into the peer's signal word that wakes
// its waiters (who sleep, not spin). Ranks in several processes get an
// error wrapping ErrUnsupported.
//
// NewUCX (build tag ucx; UCX from Debian's libucx-dev) uses UCX's ucp
// through internal/ucx: worker addresses and remote keys are all-gathered
// over the comm.Group, one endpoint per peer, ucp_put_nbx then a fence then
// a 64-bit atomic add on the peer's signal word. UCX picks InfiniBand/RoCE
// on clusters and TCP (or shared memory, Config.SharedMemory) on one
// machine, so the same code is tested here and runs there. A libibverbs or
// libfabric transport can be added behind the same interface. Devices lists
// what UCX finds on this machine (eprun topo prints it): its transport
// resources, and among them the RDMA-capable devices.
//
// # Usage
//
//	t, err := rdma.NewUCX(ctx, g, rdma.Config{SendBytes: 1 << 20, RecvBytes: 1 << 20})
//	if err != nil { ... }          // names -tags ucx when built without it
//	defer t.Close()
//	copy(t.SendBuffer()[off:], rows)
//	err = t.Put(ctx, rdma.Work{Peer: p, LocalOff: off, RemoteOff: slot, Bytes: n, Epoch: e})
//	err = t.Wait(ctx, p, e)        // p's bytes for epoch e are in t.RecvBuffer()
package rdma
