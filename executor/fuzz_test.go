package executor

import (
	"context"
	"encoding/binary"
	"errors"
	"testing"
	"time"

	"github.com/goep/goep/device"
	"github.com/goep/goep/internal/ranktest"
)

// FuzzEngineRouting drives the whole engine with fuzzed routing on one rank
// of two: every rank must return a layout or the routing's error, never a
// timeout (a rank that waited for its peer's deadline instead of hearing
// of its bad routing), and never panic.
func FuzzEngineRouting(f *testing.F) {
	f.Add([]byte{1, 2, 3, 4}, 2)
	f.Add([]byte{255, 0, 7, 7}, 3)
	f.Add([]byte{}, 0)
	f.Fuzz(func(t *testing.T, raw []byte, rows int) {
		const R, E, K, H = 2, 4, 2, 4
		rows = max(0, min(rows, 12))
		idx := make([]int32, rows*K)
		for i := range idx {
			idx[i] = -1
			if 2*i+1 < len(raw) {
				idx[i] = int32(int16(binary.LittleEndian.Uint16(raw[2*i:])))
			}
		}
		cfg := Config{NumExperts: E, TopK: K, Hidden: H, MaxTokensPerRank: 8, Timeout: time.Minute}
		errs := runRanks(t, R, cfg, func(ctx context.Context, e *Engine) error {
			mine := []int32{0, 1}
			n := 1
			if e.Rank() == 1 {
				mine, n = idx, rows
			}
			ti, err := e.NewTensor(device.Int32, n, K)
			if err != nil {
				return err
			}
			if err := device.Upload(ctx, ti, device.EncodeInt32(mine)); err != nil {
				return err
			}
			h, err := e.Layout(ctx, LayoutInput{TopkIdx: ti})
			if err == nil {
				h.Close()
			}
			if errors.Is(err, ErrTimeout) {
				return err
			}
			return nil
		})
		if err := ranktest.Err(errs); err != nil {
			t.Fatal(err)
		}
	})
}
