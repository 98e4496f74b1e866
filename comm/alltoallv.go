package comm

import (
	"context"
	"fmt"
)

// AllToAllv is an all-to-all over the caller's buffers, as MPI_Alltoallv
// with contiguous displacements: this rank sends to rank p the
// sendCounts[p] bytes of send that start at sendCounts[0] + ... +
// sendCounts[p-1], and receives into recv what rank p sends it, its
// recvCounts[p] bytes at recvCounts[0] + ... + recvCounts[p-1]. The counts
// must match across ranks (what p sends this rank is recvCounts[p] here):
// the receivers learn them beforehand, usually by an AllToAllv of the
// counts themselves with fixed counts. A rank that receives another count
// than it expects returns an error (under MPI, the library's: a truncation
// error, or none when fewer bytes come).
//
// Both buffers belong to the caller, who reuses them from one call to the
// next: nothing is allocated per call in proportion to the bytes, and once
// AllToAllv returns without error, no peer reads send or writes recv
// again. In process that holds after an error too (a member that leaves
// before every member has arrived voids the exchange for all, and one that
// has seen it complete waits for every peer's copies); under MPI, after an
// error (a deadline say) a peer may still be reading send, and the buffers
// stay pinned for good: the group is done. It is for
// moving data the way a user of the group would, not goep's data path:
// in process (NewLocal) each rank copies its part of every peer's send
// buffer into its recv once; under MPI (tag mpi) it is one
// MPI_Ialltoallv on the buffers themselves, pinned for the call
// (runtime.Pinner); a group without an implementation of its own (TCP)
// goes through AllToAll and copies what arrives into recv.
//
// len(sendCounts) and len(recvCounts) must be g.Size(), and the counts
// must fit in send and recv.
func AllToAllv(ctx context.Context, g Group, send []byte, sendCounts []int, recv []byte, recvCounts []int) error {
	if err := checkV(g.Rank(), g.Size(), send, sendCounts, recv, recvCounts); err != nil {
		return err
	}
	if v, ok := g.(interface {
		AllToAllv(ctx context.Context, send []byte, sendCounts []int, recv []byte, recvCounts []int) error
	}); ok {
		return v.AllToAllv(ctx, send, sendCounts, recv, recvCounts)
	}
	return allToAllvCopy(ctx, g, send, sendCounts, recv, recvCounts)
}

// checkV checks AllToAllv's arguments.
func checkV(rank, size int, send []byte, sendCounts []int, recv []byte, recvCounts []int) error {
	if len(sendCounts) != size || len(recvCounts) != size {
		return fmt.Errorf("comm: alltoallv on rank %d: %d send and %d receive counts for %d ranks", rank, len(sendCounts), len(recvCounts), size)
	}
	for _, c := range [...]struct {
		what   string
		counts []int
		n      int
	}{{"send", sendCounts, len(send)}, {"receive", recvCounts, len(recv)}} {
		total := 0
		for p, n := range c.counts {
			if n < 0 {
				return fmt.Errorf("comm: alltoallv on rank %d: %s count %d for rank %d", rank, c.what, n, p)
			}
			total += n
		}
		if total > c.n {
			return fmt.Errorf("comm: alltoallv on rank %d: %s counts total %d bytes, the buffer has %d", rank, c.what, total, c.n)
		}
	}
	return nil
}

// allToAllvCopy is AllToAllv through AllToAll: views of send go out, and
// what comes back is copied into recv.
func allToAllvCopy(ctx context.Context, g Group, send []byte, sendCounts []int, recv []byte, recvCounts []int) error {
	parts := make([][]byte, len(sendCounts))
	off := 0
	for p, n := range sendCounts {
		parts[p] = send[off : off+n : off+n]
		off += n
	}
	got, err := g.AllToAll(ctx, parts)
	if err != nil {
		return err
	}
	return copyParts(g.Rank(), got, recv, recvCounts)
}

// copyParts copies got[p], what rank p sent, into recv at its place,
// checking each against recvCounts[p].
func copyParts(rank int, got [][]byte, recv []byte, recvCounts []int) error {
	var bad error
	off := 0
	for p, n := range recvCounts {
		if len(got[p]) != n {
			if bad == nil {
				bad = fmt.Errorf("comm: alltoallv on rank %d: rank %d sent %d bytes, %d expected", rank, p, len(got[p]), n)
			}
		} else {
			copy(recv[off:off+n], got[p])
		}
		off += n
	}
	return bad
}
