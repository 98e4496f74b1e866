//go:build cuda && cgo

package bench

import (
	"bytes"
	"context"
	"fmt"
	"time"

	"github.com/goep/goep/device"
	"github.com/goep/goep/executor"
)

// CUDACompiled reports whether this binary has the cuda backend.
const CUDACompiled = true

// eventClock times work on a CUDA stream with timing events recorded on
// it before and after the work (DESIGN.md section 6): the GPU's time,
// including any gap the host leaves between the first event and the
// work it enqueues.
type eventClock struct {
	s      *device.CUDAStream
	t0     time.Time
	e0, e1 *device.Event
}

func newEventClock(e *executor.Engine) (clock, error) {
	s, ok := e.Stream().(*device.CUDAStream)
	if !ok {
		return nil, fmt.Errorf("bench: the engine's stream is a %T, not a CUDA stream", e.Stream())
	}
	return &eventClock{s: s}, nil
}

func (c *eventClock) begin() (err error) {
	c.t0 = time.Now()
	c.e0, err = c.s.RecordTimed()
	return err
}

func (c *eventClock) end() (err error) {
	c.e1, err = c.s.RecordTimed()
	return err
}

func (c *eventClock) elapsed() (time.Time, time.Duration, error) {
	d, err := device.Elapsed(c.e0, c.e1)
	return c.t0, d, err
}

// runCUDABaseline times a device-to-device copy of this rank's N_r rows of
// dtype dt (cuMemcpyDtoDAsync), their bytes as a call moves them
// (RowBytes: an fp8 row's scales included, one contiguous copy), on the
// engine's stream, all ranks at once after a barrier, with the events the
// calls are timed with, then checks the copy. It records the times as
// name.
func (st *rankState) runCUDABaseline(ctx context.Context, e *executor.Engine, name string, dt device.DType) error {
	w := st.world
	s, ok := e.Stream().(*device.CUDAStream)
	if !ok {
		return fmt.Errorf("baseline: the engine's stream is a %T, not a CUDA stream", e.Stream())
	}
	n := st.recvRows
	rb := RowBytes(dt, w.Hidden)
	rows := max(n, 1) // no zero-byte allocations
	pattern := make([]byte, rows*rb)
	for i := range pattern {
		pattern[i] = byte(i)
	}
	src, err := upload(ctx, e, dt, pattern, rows, rb/dt.Size())
	if err != nil {
		return fmt.Errorf("baseline: %w", err)
	}
	defer src.Close()
	dst, err := upload(ctx, e, dt, make([]byte, rows*rb), rows, rb/dt.Size())
	if err != nil {
		return fmt.Errorf("baseline: %w", err)
	}
	defer dst.Close()
	clk := &eventClock{s: s}
	for i := range st.cfg.Warmup + st.cfg.Iters {
		if err := st.ctl.Barrier(ctx); err != nil {
			return err
		}
		if err := clk.begin(); err != nil {
			return fmt.Errorf("baseline: %w", err)
		}
		if n > 0 {
			if err := s.Copy(dst.Buffer(), 0, src.Buffer(), 0, n*rb); err != nil {
				return fmt.Errorf("baseline: %w", err)
			}
		}
		if err := clk.end(); err != nil {
			return fmt.Errorf("baseline: %w", err)
		}
		if err := e.Synchronize(ctx); err != nil {
			return fmt.Errorf("baseline: %w", err)
		}
		t0, d, err := clk.elapsed()
		if err != nil {
			return fmt.Errorf("baseline: %w", err)
		}
		if i >= st.cfg.Warmup {
			st.record(name, i-st.cfg.Warmup, t0, t0.Add(d))
		}
		st.progress(name)
	}
	if err := st.ctl.Barrier(ctx); err != nil {
		return err
	}
	got, err := device.Download(ctx, dst)
	if err != nil {
		return fmt.Errorf("baseline: %w", err)
	}
	if !bytes.Equal(got[:n*rb], pattern[:n*rb]) {
		return fmt.Errorf("baseline: device copy differs from its source")
	}
	return nil
}
