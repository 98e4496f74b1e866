//go:build ucx && cgo

package rdma

import (
	"context"
	"errors"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/goep/goep/comm"
)

// TestWaitAllSignalledThenLost: a peer that signals the epoch and exits
// between WaitAll's look at the signals and its check for lost peers (it
// had nothing more to do) has not failed the wait; one lost without
// signalling still fails it, named. The transport is only what WaitAll
// reads: no UCX.
func TestWaitAllSignalledThenLost(t *testing.T) {
	tr := &ucxTransport{rank: 0, size: 3, sig: make([]byte, 8*3), peers: []*ucxPeer{{}, {}, {}}}
	atomic.StoreUint64(tr.signal(2), 5)
	testHookWaitLooked = func() {
		atomic.StoreUint64(tr.signal(1), 5)
		tr.lose(1, "process exited")
	}
	defer func() { testHookWaitLooked = nil }()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	if err := tr.WaitAll(ctx, []int{1, 2}, 5); err != nil {
		t.Fatalf("peer 1 signalled epoch 5, then was lost: %v, want nil", err)
	}
	testHookWaitLooked = nil
	atomic.StoreUint64(tr.signal(2), 6)
	err := tr.WaitAll(ctx, []int{1, 2}, 6)
	var lost *comm.PeerLostError
	if !errors.As(err, &lost) || !slices.Equal(lost.Ranks, []int{1}) {
		t.Fatalf("peer 1 lost before epoch 6: %v, want a *comm.PeerLostError naming rank 1", err)
	}
}
