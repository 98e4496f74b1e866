package ranktest

import (
	"context"
	"slices"
	"strings"
	"testing"
)

// loopback is a group of one rank: every collective hands the rank its own
// data back.
func loopback() Collectives {
	return Collectives{
		Rank: 0, Size: 1,
		AllGather: func(_ context.Context, data []byte) ([][]byte, error) { return [][]byte{data}, nil },
		AllToAll:  func(_ context.Context, send [][]byte) ([][]byte, error) { return send, nil },
		Broadcast: func(_ context.Context, _ int, data []byte) ([]byte, error) { return data, nil },
		Barrier:   func(context.Context) error { return nil },
	}
}

// TestCheckCollectives: a right group passes, and a wrong answer is named.
func TestCheckCollectives(t *testing.T) {
	if err := CheckCollectives(t.Context(), loopback(), 3); err != nil {
		t.Fatalf("loopback: %v", err)
	}
	bad := loopback()
	bad.AllToAll = func(_ context.Context, send [][]byte) ([][]byte, error) {
		recv := slices.Clone(send)
		recv[0] = append([]byte{0xff}, recv[0]...)
		return recv, nil
	}
	if err := CheckCollectives(t.Context(), bad, 3); err == nil || !strings.Contains(err.Error(), "alltoall round 0: from rank 0") {
		t.Fatalf("a wrong alltoall: %v, want an error naming it", err)
	}
}
