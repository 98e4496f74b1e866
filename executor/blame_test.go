package executor

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/goep/goep/comm"
	"github.com/goep/goep/device"
	"github.com/goep/goep/internal/testenv"
	"github.com/goep/goep/nvlink"
)

// TestFaultMatrix is DESIGN.md invariant 4's rule of blame, in a world of
// 4 in-process ranks: in two domains of 2 joined by the rail and, with
// GOEP_TEST_FULL, in one domain and in four domains of 1. For each
// collective call (the layout, a dispatch, a combine) rank 3 misbehaves:
//
//   - hang: it never makes the call. Every other rank fails with
//     ErrTimeout naming exactly rank 3 (a rank that relays the timeout
//     keeps its class and its names: never ErrPeerLost, never a live rank
//     named), within the timeout and the relay margin;
//   - slow: it makes the call half a timeout late. Every rank succeeds;
//   - reject: its input is bad. Every rank fails with ErrInvalidInput,
//     naming rank 3, at once.
//
// Rank 1 always comes late by less than the relay margin: a rank that
// relays rank 3's timeout after its own deadline (its rail round with rank
// 3 started later) must still be heard, not named. A hung rank 3 is
// released once the others have returned. (A rank that dies is the
// multi-process tests', TestMultiProcessKill and TestMultiProcessDomainsKill.)
func TestFaultMatrix(t *testing.T) {
	const R, E, K, H, T = 4, 4, 2, 1, 2
	const timeout = 2 * time.Second
	late := nvlink.RelayMargin(timeout) * 3 / 5
	ds := []int{2}
	if testenv.Full(t) {
		ds = []int{R, 2, 1}
	}
	for _, d := range ds {
		for _, fault := range []string{"hang", "slow", "reject"} {
			for _, call := range []string{"layout", "dispatch", "combine"} {
				t.Run(fmt.Sprintf("D=%d/%s/%s", d, fault, call), func(t *testing.T) {
					cfg := Config{NumExperts: E, TopK: K, Hidden: H, MaxTokensPerRank: T, RanksPerDomain: d, Timeout: timeout}
					release := make(chan struct{})
					var once sync.Once
					var finished sync.WaitGroup
					finished.Add(R - 1)
					elapsed := make([]time.Duration, R)
					errs := runRanks(t, R, cfg, func(ctx context.Context, e *Engine) error {
						r, bad := e.Rank(), e.Rank() == R-1
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
						switch {
						case bad && fault == "hang":
							<-release
							return nil
						case bad && fault == "slow":
							time.Sleep(timeout / 2)
						case bad:
						case r == 1:
							time.Sleep(late) // late, within the margin
						}
						if !bad {
							defer finished.Done()
							defer func() { go func() { finished.Wait(); once.Do(func() { close(release) }) }() }()
						}
						// A rejected input is a row count the handle does not have.
						rows := T
						if bad && fault == "reject" {
							rows = T + 1
						}
						start := time.Now()
						err := faultCall(ctx, e, h, call, idx, x, rows)
						elapsed[r] = time.Since(start)
						return checkBlame(fault, call, r, R-1, err)
					})
					for r, err := range errs {
						// A hung rank's Close finds its peers gone; it may
						// report that, but it must return.
						if err != nil && (r != R-1 || fault != "hang") {
							t.Errorf("rank %d: %v", r, err)
						}
					}
					if fault != "hang" {
						return
					}
					for r := range R - 1 {
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
}

// faultCall makes one collective call of the fault matrix and waits for
// it: a layout of idx, a dispatch of x, or a combine, on rows tokens
// (received rows for the combine).
func faultCall(ctx context.Context, e *Engine, h *Handle, call string, idx []int32, x []byte, rows int) error {
	const K, H = 2, 1
	switch call {
	case "layout":
		v := append(slices.Clone(idx), make([]int32, (rows*K)-len(idx))...)
		ti, err := upload(ctx, e, device.Int32, device.EncodeInt32(v[:rows*K]), rows, K)
		if err != nil {
			return err
		}
		_, err = e.Layout(ctx, LayoutInput{TopkIdx: ti})
		return err
	case "dispatch":
		xs := append(slices.Clone(x), make([]byte, rows*H*4-len(x))...)
		xt, err := upload(ctx, e, device.FP32, xs[:rows*H*4], rows, H)
		if err != nil {
			return err
		}
		if _, err = e.Dispatch(ctx, h, DispatchInput{X: xt}); err != nil {
			return err
		}
	case "combine":
		n := h.RecvRows() + rows - len(idx)/K
		z, err := e.NewTensor(device.FP32, n, H)
		if err != nil {
			return err
		}
		clear(z.Bytes())
		if _, err = e.Combine(ctx, h, CombineInput{Z: z}); err != nil {
			return err
		}
	}
	return e.Synchronize(ctx)
}

// checkBlame checks the error of rank r in the fault matrix, whose rank
// bad misbehaves.
func checkBlame(fault, call string, r, bad int, err error) error {
	var te *comm.TimeoutError
	switch {
	case fault == "slow":
		if err != nil {
			return fmt.Errorf("%s with a rank slow within the timeout: %v", call, err)
		}
	case fault == "reject" && r == bad:
		if !errors.Is(err, ErrInvalidInput) {
			return fmt.Errorf("%s: %v, want ErrInvalidInput", call, err)
		}
	case fault == "reject":
		if !errors.Is(err, ErrInvalidInput) || errors.Is(err, ErrTimeout) || !strings.Contains(err.Error(), fmt.Sprint("rank ", bad)) {
			return fmt.Errorf("%s: %v, want ErrInvalidInput naming rank %d", call, err, bad)
		}
	case errors.Is(err, ErrPeerLost):
		return fmt.Errorf("%s: %v: a live rank reported lost", call, err)
	case !errors.Is(err, ErrTimeout) || !errors.As(err, &te):
		return fmt.Errorf("%s: %v, want ErrTimeout naming rank %d", call, err, bad)
	case !slices.Equal(te.Missing, []int{bad}):
		return fmt.Errorf("%s: %v names %v, want [%d]", call, err, te.Missing, bad)
	}
	return nil
}
