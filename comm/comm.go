// Package comm is goep's control plane: the bootstrap groups that carry
// configuration checks, handle exchange and barriers between ranks. Data
// never goes through comm.
//
// Every collective must be called by every rank of the group, in the same
// order, and takes a context whose deadline bounds the wait: a rank that does
// not arrive in time makes the others return an error wrapping ErrTimeout that
// names it.
//
// Usage (in-process ranks):
//
//	groups := comm.NewLocal(4)
//	for r, g := range groups {
//		go func() { all, err := g.AllGather(ctx, []byte{byte(r)}); ... }()
//	}
package comm

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
)

// ErrTimeout is returned when peers do not join a collective before the
// context's deadline.
var ErrTimeout = errors.New("comm: timeout")

// ErrClosed is returned by a collective on a closed group, or one whose peer
// has closed.
var ErrClosed = errors.New("comm: group closed")

// ErrPeerLost is returned when a peer disappears (its process died or its
// connection broke) during or before a collective.
var ErrPeerLost = errors.New("comm: peer lost")

// ErrAborted is returned by every collective of a rank that aborted its
// group (Abort).
var ErrAborted = errors.New("comm: group aborted")

// ErrUnsupported is returned by a constructor whose implementation is not
// compiled in (the message names the build tag to add).
var ErrUnsupported = errors.New("comm: unsupported")

// Group is a set of ranks that run collectives together.
type Group interface {
	// Rank is this member's index in [0, Size).
	Rank() int
	// Size is the number of members.
	Size() int
	// AllGather returns every rank's data, indexed by rank. Lengths may
	// differ between ranks.
	AllGather(ctx context.Context, data []byte) ([][]byte, error)
	// AllToAll sends send[p] to rank p and returns, indexed by rank, what
	// every rank sent to this one (len(send) must be Size(); lengths may
	// differ). It is the baseline a user would otherwise pick for moving
	// tokens, not goep's data path.
	AllToAll(ctx context.Context, send [][]byte) ([][]byte, error)
	// Broadcast returns root's data on every rank (data is ignored on
	// other ranks).
	Broadcast(ctx context.Context, root int, data []byte) ([]byte, error)
	// Barrier returns once every rank has entered it.
	Barrier(ctx context.Context) error
	// Split partitions the group: ranks passing the same color form a new
	// group, ordered by key then by rank in this group.
	Split(ctx context.Context, color, key int) (Group, error)
	// Close releases the group. Peers blocked in a collective with this
	// rank get ErrClosed.
	Close() error
}

// Abort cuts this rank off g's world at once, as its process's death
// would, but saying why: the collectives of this rank in flight and to come,
// in g and every group of its world, fail with an error wrapping
// ErrAborted, and the other ranks learn of it as of a lost peer whose cause
// is cause ("stopped by SIGTERM"). It is for a process about to stop (a
// signal; launcher.WithAbort calls it when the program's context ends), so
// that a rank shutting down never waits for peers that will not come. Close
// still releases the group. It does not block for more than a fraction of
// a second, and may be called from any goroutine; a second call does
// nothing.
//
// Abort reports whether g's kind supports it: TCP groups do; MPI groups
// (tag mpi) make this rank's later calls fail, but a call in flight cannot
// be cut short and the other ranks are not told (mpirun forwards the
// signal to them); in-process groups do not.
func Abort(g Group, cause string) bool {
	a, ok := g.(interface{ abort(cause string) })
	if ok {
		a.abort(cause)
	}
	return ok
}

// TimeoutError is the error of a collective whose peers did not all arrive.
type TimeoutError struct {
	Op      string
	Missing []int // ranks not heard from, ascending
}

func (e *TimeoutError) Error() string {
	return fmt.Sprintf("comm: %s: timed out waiting for rank(s) %v", e.Op, e.Missing)
}

// Unwrap makes errors.Is(err, ErrTimeout) true.
func (e *TimeoutError) Unwrap() error { return ErrTimeout }

// PeerLostError names the peers that disappeared.
type PeerLostError struct {
	Op    string
	Ranks []int // ascending
	Cause string
}

func (e *PeerLostError) Error() string {
	return fmt.Sprintf("comm: %s: lost rank(s) %v: %s", e.Op, e.Ranks, e.Cause)
}

// Unwrap makes errors.Is(err, ErrPeerLost) true.
func (e *PeerLostError) Unwrap() error { return ErrPeerLost }

// splitMembers returns, for the rank with the given color, the ranks of its
// new group in order (by key, then old rank), and its index among them.
// colorKeys holds 8 bytes per rank: color then key, as int32 little-endian.
func splitMembers(me int, colors, keys []int) (members []int, index int) {
	for r := range colors {
		if colors[r] == colors[me] {
			members = append(members, r)
		}
	}
	slices.SortStableFunc(members, func(a, b int) int {
		if c := cmp.Compare(keys[a], keys[b]); c != 0 {
			return c // not keys[a] - keys[b], which overflows for extreme keys
		}
		return a - b
	})
	return members, slices.Index(members, me)
}
