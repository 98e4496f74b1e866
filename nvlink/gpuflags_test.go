package nvlink

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/goep/goep/comm"
)

// TestGPUReport: a rank's report of a timeout or a lost peer, read back by
// a peer for the rejection of the same epoch, relays the class and the
// names (a relayed timeout stays a timeout naming the ranks not heard
// from, never a loss, and never names the reporting rank); other failures
// are not reported; a report of another epoch, or one not yet stamped,
// is not taken.
func TestGPUReport(t *testing.T) {
	timeout := fmt.Errorf("executor: rail round 2: %w", &comm.TimeoutError{Op: "rdma: wait for epoch 2", Missing: []int{3}})
	lost := fmt.Errorf("rail: %w", &comm.PeerLostError{Op: "ucx", Ranks: []int{5, 7}, Cause: "endpoint error"})
	stamp := func(b []byte, epoch uint64) []byte {
		b = slices.Clone(b)
		binary.LittleEndian.PutUint64(b, epoch)
		return b
	}
	for _, c := range []struct {
		name  string
		err   error
		class error
		ranks []int
	}{
		{"timeout", timeout, comm.ErrTimeout, []int{3}},
		{"lost", lost, comm.ErrPeerLost, []int{5, 7}},
	} {
		t.Run(c.name, func(t *testing.T) {
			b, ok := GPUReport(c.err)
			if !ok || len(b) != reportSize {
				t.Fatalf("GPUReport: %d bytes, %v", len(b), ok)
			}
			if pe := decodeReport(b, 9, 1); pe != nil {
				t.Fatalf("a report not stamped was taken: %v", pe)
			}
			if pe := decodeReport(stamp(b, 8), 9, 1); pe != nil {
				t.Fatalf("a report of epoch 8 was taken for epoch 9: %v", pe)
			}
			pe := decodeReport(stamp(b, 9), 9, 1)
			if pe == nil {
				t.Fatal("the report of epoch 9 was not taken")
			}
			var err error = pe
			if !errors.Is(err, c.class) || !errors.Is(err, ErrPeerReported) {
				t.Errorf("%v: want class %v and ErrPeerReported", err, c.class)
			}
			if c.class == comm.ErrTimeout && errors.Is(err, comm.ErrPeerLost) {
				t.Errorf("%v: a relayed timeout became a loss", err)
			}
			if !slices.Equal(Named(err), c.ranks) || !slices.Equal(pe.Ranks, c.ranks) {
				t.Errorf("%v names %v, want %v", err, Named(err), c.ranks)
			}
			if pe.Rank != 1 || !strings.Contains(err.Error(), "rank 1 reported: "+c.err.Error()) {
				t.Errorf("%q: want rank 1's report with its message", err)
			}
		})
	}
	// A peer's reported rejection, relayed: its class (not a timeout, not
	// a loss) and its words, which name the rank that rejected.
	relayed := fmt.Errorf("executor: rail: %w", &PeerError{Rank: 3, Status: StatusInvalid, Msg: "X has shape [3 64], want [2 64]"})
	b, ok := GPUReport(relayed)
	if !ok {
		t.Fatal("a peer's reported rejection is not reported")
	}
	if pe := decodeReport(stamp(b, 4), 4, 1); pe == nil || pe.Status != StatusInvalid || errors.Is(pe, comm.ErrTimeout) ||
		errors.Is(pe, comm.ErrPeerLost) || !errors.Is(pe, ErrPeerReported) || !strings.Contains(pe.Error(), "rank 1 reported: executor: rail: nvlink: rank 3 reported: X has shape") {
		t.Errorf("a relayed rejection decodes as %v", pe)
	}
	for _, err := range []error{nil, errors.New("shape [4 8] is not [4 16]"), ErrPeerMismatch} {
		if _, ok := GPUReport(err); ok {
			t.Errorf("GPUReport(%v) reported; a rank's own rejection is signalled as such", err)
		}
	}
	// Bounds: the first MaxNamed ranks, the first msgCap bytes.
	many := make([]int, MaxNamed+10)
	for i := range many {
		many[i] = i
	}
	long := &comm.TimeoutError{Op: strings.Repeat("x", 3*msgCap), Missing: many}
	b, _ = GPUReport(long)
	pe := decodeReport(stamp(b, 1), 1, 0)
	if pe == nil || len(pe.Ranks) != MaxNamed || len(pe.Msg) != msgCap {
		t.Fatalf("a report of %d ranks and a %d-byte message: %+v", len(many), len(long.Error()), pe)
	}
}
