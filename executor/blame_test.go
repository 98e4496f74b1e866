package executor

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/goep/goep/comm"
	"github.com/goep/goep/device"
	"github.com/goep/goep/internal/testenv"
	"github.com/goep/goep/nvlink"
)

// TestBlameHang is DESIGN.md invariant 4's rule of blame for a rank that
// hangs: in a world of 4 ranks, in one domain, in two domains of 2 joined
// by the rail, and in four domains of 1, rank 3 never makes a collective
// call (the layout, a dispatch, or a combine) that the others make. Every
// other rank must fail the call with ErrTimeout naming exactly rank 3 (a
// rank that relays the timeout keeps its class and its names: never
// ErrPeerLost, never a live rank named), within the timeout and the relay
// margin. Rank 1 comes to the call late, by less than the relay margin:
// a rank that relays rank 3's timeout after its own deadline (its rail
// round with rank 3 started later) must still be heard, not named. Rank 3
// is released once they all have returned. By default the world of two
// domains runs; GOEP_TEST_FULL adds one domain and four.
func TestBlameHang(t *testing.T) {
	const R, E, K, H, T = 4, 4, 2, 1, 2
	const timeout = 2 * time.Second
	late := nvlink.RelayMargin(timeout) * 3 / 5
	ds := []int{2}
	if testenv.Full(t) {
		ds = []int{R, 2, 1}
	}
	for _, d := range ds {
		for _, call := range []string{"layout", "dispatch", "combine"} {
			t.Run(fmt.Sprintf("D=%d/%s", d, call), func(t *testing.T) {
				cfg := Config{NumExperts: E, TopK: K, Hidden: H, MaxTokensPerRank: T, RanksPerDomain: d, Timeout: timeout}
				release := make(chan struct{})
				var once sync.Once
				var finished sync.WaitGroup
				finished.Add(R - 1)
				elapsed := make([]time.Duration, R)
				errs := runRanks(t, R, cfg, func(ctx context.Context, e *Engine) error {
					r := e.Rank()
					idx, x, _ := rankInputs(5, r, T, K, E, H, device.FP32)
					var h *Handle
					if call != "layout" {
						ti, err := upload(ctx, e, device.Int32, device.EncodeInt32(idx), T, K)
						if err != nil {
							return err
						}
						if h, err = e.Layout(ctx, LayoutInput{TopkIdx: ti}); err != nil {
							return err
						}
						defer h.Close()
					}
					if r == R-1 { // the rank that hangs
						<-release
						return nil
					}
					defer finished.Done()
					defer func() { go func() { finished.Wait(); once.Do(func() { close(release) }) }() }()
					if r == 1 {
						time.Sleep(late) // a slow rank, within the margin
					}
					start := time.Now()
					var err error
					switch call {
					case "layout":
						ti, uerr := upload(ctx, e, device.Int32, device.EncodeInt32(idx), T, K)
						if uerr != nil {
							return uerr
						}
						_, err = e.Layout(ctx, LayoutInput{TopkIdx: ti})
					case "dispatch":
						xt, uerr := upload(ctx, e, device.FP32, x, T, H)
						if uerr != nil {
							return uerr
						}
						if _, err = e.Dispatch(ctx, h, DispatchInput{X: xt}); err == nil {
							err = e.Synchronize(ctx)
						}
					case "combine":
						z, uerr := e.NewTensor(device.FP32, h.RecvRows(), H)
						if uerr != nil {
							return uerr
						}
						clear(z.Bytes())
						if _, err = e.Combine(ctx, h, CombineInput{Z: z}); err == nil {
							err = e.Synchronize(ctx)
						}
					}
					elapsed[r] = time.Since(start)
					var te *comm.TimeoutError
					switch {
					case errors.Is(err, ErrPeerLost):
						return fmt.Errorf("%s: %v: a live rank reported lost", call, err)
					case !errors.Is(err, ErrTimeout) || !errors.As(err, &te):
						return fmt.Errorf("%s: %v, want ErrTimeout naming rank %d", call, err, R-1)
					case !slices.Equal(te.Missing, []int{R - 1}):
						return fmt.Errorf("%s: %v names %v, want [%d]", call, err, te.Missing, R-1)
					}
					return nil
				})
				for r := range R - 1 {
					if errs[r] != nil {
						t.Errorf("rank %d: %v", r, errs[r])
					}
					// The bound catches a second timeout served in a row (a
					// relay waited out instead of heard), with room for a
					// loaded machine.
					if limit := timeout + nvlink.RelayMargin(timeout) + timeout/2; elapsed[r] > limit {
						t.Errorf("rank %d: failed after %v, more than the timeout and relay margin (%v)", r, elapsed[r], limit)
					}
				}
			})
		}
	}
}
