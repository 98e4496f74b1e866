//go:build ucx && cgo

package rdma_test

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/goep/goep/comm"
	"github.com/goep/goep/rdma"
)

// Two in-process ranks each put a greeting into the other's receive region
// and wait for the other's signal.
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	groups := comm.NewLocal(2)
	got := make([]string, 2)
	var wg sync.WaitGroup
	for r, g := range groups {
		wg.Go(func() {
			defer g.Close()
			t, err := rdma.NewUCX(ctx, g, rdma.Config{SendBytes: 64, RecvBytes: 64,
				UCXOptions: []string{"TLS=tcp", "NET_DEVICES=lo"}})
			if err != nil {
				got[r] = err.Error()
				return
			}
			defer t.Close()
			peer := 1 - r
			n := copy(t.SendBuffer(), fmt.Sprintf("hello from rank %d", r))
			if err := t.Put(ctx, rdma.Work{Peer: peer, Bytes: n, Epoch: 1}); err != nil {
				got[r] = err.Error()
				return
			}
			if err := t.Wait(ctx, peer, 1); err != nil {
				got[r] = err.Error()
				return
			}
			got[r] = string(t.RecvBuffer()[:n])
		})
	}
	wg.Wait()
	fmt.Println(got[0])
	fmt.Println(got[1])
	// Output:
	// hello from rank 1
	// hello from rank 0
}
