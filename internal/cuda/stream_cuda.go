//go:build cuda && cgo

package cuda

/*
#include <cuda.h>
#include <stdint.h>

// goep_stream_of turns another library's stream handle into a CUstream
// (an integer from Go, never a Go pointer).
static CUstream goep_stream_of(uintptr_t h) { return (CUstream)h; }
static uintptr_t goep_handle_of(CUstream s) { return (uintptr_t)s; }
*/
import "C"

import (
	"context"
	"fmt"
	"time"

	"github.com/goep/goep/internal/poll"
)

// Stream is an ordered queue of GPU work (CUstream).
type Stream struct {
	d        *Device
	s        C.CUstream // nil once closed; read and written inside Do only
	borrowed bool       // a stream of another library (WrapStream): never destroyed here
}

// WrapStream returns a Stream for a CUstream created by another library in
// this process on d's primary context (h is its handle, as that library
// reports it). Close forgets it without destroying it.
func (d *Device) WrapStream(h uintptr) (*Stream, error) {
	if h == 0 {
		return nil, fmt.Errorf("cuda: wrap stream: the legacy default stream (0) is not supported; pass a created stream")
	}
	return &Stream{d: d, s: C.goep_stream_of(C.uintptr_t(h)), borrowed: true}, nil
}

// NewStream creates a stream that does not synchronise with the legacy
// default stream (cuStreamCreate with CU_STREAM_NON_BLOCKING).
func (d *Device) NewStream() (*Stream, error) {
	s := &Stream{d: d}
	if err := d.Do(func() error {
		return result("cuStreamCreate", C.cuStreamCreate(&s.s, C.CU_STREAM_NON_BLOCKING))
	}); err != nil {
		return nil, fmt.Errorf("cuda: new stream: %w", err)
	}
	return s, nil
}

// Handle is the CUstream as an integer, for other libraries of the process
// (0 once closed).
func (s *Stream) Handle() uintptr {
	var h uintptr
	_ = s.d.Do(func() error {
		h = uintptr(C.goep_handle_of(s.s))
		return nil
	})
	return h
}

// Device is the stream's device.
func (s *Stream) Device() *Device { return s.d }

// do runs f inside Do with the stream's handle, or fails with ErrClosed.
func (s *Stream) do(f func(C.CUstream) error) error {
	return s.d.Do(func() error {
		if s.s == nil {
			return fmt.Errorf("cuda: stream: %w", ErrClosed)
		}
		return f(s.s)
	})
}

// Query reports whether all work enqueued on s has completed
// (cuStreamQuery). An error of that work is returned here.
func (s *Stream) Query() (done bool, err error) {
	err = s.do(func(cs C.CUstream) (qerr error) {
		done, qerr = queried("cuStreamQuery", C.cuStreamQuery(cs))
		return qerr
	})
	return done, err
}

// queried converts the result of a query (cuStreamQuery, cuEventQuery):
// CUDA_ERROR_NOT_READY is work still running; any other result means the
// work ended, with the work's error if it failed.
func queried(op string, r C.CUresult) (done bool, err error) {
	if r == C.CUDA_ERROR_NOT_READY {
		return false, nil
	}
	return true, result(op, r)
}

// Synchronize waits until all work enqueued on s has completed, or ctx is
// done. It polls cuStreamQuery with short sleeps rather than blocking in
// cuStreamSynchronize, so that the device stays free for other goroutines
// and a deadline bounds the wait (DESIGN invariant 4). On ctx's end it
// returns an error wrapping ctx.Err(); the work is still queued.
func (s *Stream) Synchronize(ctx context.Context) error {
	return synchronize(ctx, "stream", s.Query)
}

// synchronize polls query until it reports the work done, or ctx is done;
// what names the waited-for object in the error.
func synchronize(ctx context.Context, what string, query func() (bool, error)) error {
	if err := poll.Until(ctx, syncPolicy, query); err != nil {
		return fmt.Errorf("cuda: synchronize %s: %w", what, err)
	}
	return nil
}

// Close destroys the stream (cuStreamDestroy). Work already enqueued still
// completes; the driver releases the stream afterwards. A second Close
// returns nil.
func (s *Stream) Close() error {
	return release(s.d, &s.s, "cuStreamDestroy", func(cs C.CUstream) C.CUresult {
		if s.borrowed {
			return C.CUDA_SUCCESS // not this package's to destroy
		}
		return C.cuStreamDestroy(cs)
	})
}

// Event marks a point in a stream's work (CUevent).
type Event struct {
	d *Device
	e C.CUevent // nil once closed; inside Do only
}

// NewEvent creates an event (cuEventCreate); with timing false it is created
// with CU_EVENT_DISABLE_TIMING, which makes record and wait cheaper but
// Elapsed unavailable.
func (d *Device) NewEvent(timing bool) (*Event, error) {
	var flags C.uint = C.CU_EVENT_DEFAULT
	if !timing {
		flags = C.CU_EVENT_DISABLE_TIMING
	}
	e := &Event{d: d}
	if err := d.Do(func() error { return result("cuEventCreate", C.cuEventCreate(&e.e, flags)) }); err != nil {
		return nil, fmt.Errorf("cuda: new event: %w", err)
	}
	return e, nil
}

func (e *Event) do(f func(C.CUevent) error) error {
	return e.d.Do(func() error {
		if e.e == nil {
			return fmt.Errorf("cuda: event: %w", ErrClosed)
		}
		return f(e.e)
	})
}

// Record captures the work enqueued on s so far into e (cuEventRecord).
func (s *Stream) Record(e *Event) error {
	if e.d != s.d {
		return fmt.Errorf("cuda: record: event of device %d on stream of device %d", e.d.ordinal, s.d.ordinal)
	}
	return s.do(func(cs C.CUstream) error {
		return e.do(func(ce C.CUevent) error { return result("cuEventRecord", C.cuEventRecord(ce, cs)) })
	})
}

// WaitEvent makes work enqueued on s after this call wait until e has
// completed (cuStreamWaitEvent). e belongs to s's device (waits across
// devices are for the CUDA backend to add, through a shared event handle).
func (s *Stream) WaitEvent(e *Event) error {
	if e.d != s.d {
		return fmt.Errorf("cuda: wait event: event of device %d on stream of device %d", e.d.ordinal, s.d.ordinal)
	}
	return s.do(func(cs C.CUstream) error {
		return e.do(func(ce C.CUevent) error { return result("cuStreamWaitEvent", C.cuStreamWaitEvent(cs, ce, 0)) })
	})
}

// Query reports whether the work captured by e has completed (cuEventQuery).
// An event never recorded counts as completed.
func (e *Event) Query() (done bool, err error) {
	err = e.do(func(ce C.CUevent) (qerr error) {
		done, qerr = queried("cuEventQuery", C.cuEventQuery(ce))
		return qerr
	})
	return done, err
}

// Synchronize waits until e has completed or ctx is done, polling
// cuEventQuery like Stream.Synchronize.
func (e *Event) Synchronize(ctx context.Context) error {
	return synchronize(ctx, "event", e.Query)
}

// Elapsed is the GPU time from start to e, both recorded with timing and
// completed (cuEventElapsedTime; resolution about 0.5 µs).
func (e *Event) Elapsed(start *Event) (time.Duration, error) {
	if e.d != start.d {
		return 0, fmt.Errorf("cuda: elapsed time: events of devices %d and %d", start.d.ordinal, e.d.ordinal)
	}
	var ms C.float
	err := e.do(func(end C.CUevent) error {
		return start.do(func(st C.CUevent) error {
			return result("cuEventElapsedTime", C.cuEventElapsedTime(&ms, st, end))
		})
	})
	if err != nil {
		return 0, fmt.Errorf("cuda: elapsed time: %w", err)
	}
	return time.Duration(float64(ms) * float64(time.Millisecond)), nil
}

// Close destroys the event (cuEventDestroy). A second Close returns nil.
func (e *Event) Close() error {
	return release(e.d, &e.e, "cuEventDestroy", func(e C.CUevent) C.CUresult { return C.cuEventDestroy(e) })
}

// Stream memory operations: flags between streams, devices and processes
// without a kernel. They call the v2 entry points (CUDA 11.7+), which the
// driver enables by default; the v1 ones need the NVreg_EnableStreamMemOPs
// module parameter on older drivers.

// WriteValue32 enqueues a write of v to the 4-byte word at p
// (cuStreamWriteValue32_v2, default flags: the write is ordered after the
// stream's earlier work and made visible like a kernel's store).
func (s *Stream) WriteValue32(p DevicePtr, v uint32) error {
	return s.do(func(cs C.CUstream) error {
		return result("cuStreamWriteValue32", C.cuStreamWriteValue32_v2(cs, p.c(), C.cuuint32_t(v), C.CU_STREAM_WRITE_VALUE_DEFAULT))
	})
}

// WriteValue64 is WriteValue32 for an 8-byte word (cuStreamWriteValue64_v2;
// needs Features.StreamMemOps64).
func (s *Stream) WriteValue64(p DevicePtr, v uint64) error {
	if err := s.memOps64("write value 64"); err != nil {
		return err
	}
	return s.do(func(cs C.CUstream) error {
		return result("cuStreamWriteValue64", C.cuStreamWriteValue64_v2(cs, p.c(), C.cuuint64_t(v), C.CU_STREAM_WRITE_VALUE_DEFAULT))
	})
}

// memOps64 fails op with ErrUnsupported unless s's device has the 64-bit
// stream memory operations (Features.StreamMemOps64).
func (s *Stream) memOps64(op string) error {
	if !s.d.feat.StreamMemOps64 {
		return fmt.Errorf("cuda: stream %s: %w: device %d has no 64-bit stream memory operations", op, ErrUnsupported, s.d.ordinal)
	}
	return nil
}

// WaitValue32 makes later work on s wait until the 4-byte word at p, as an
// unsigned number, is >= v (cuStreamWaitValue32_v2 with
// CU_STREAM_WAIT_VALUE_GEQ, a cyclic comparison: (int32)(*p - v) >= 0).
// Flags are monotonic epochs, so GEQ never misses an update.
func (s *Stream) WaitValue32(p DevicePtr, v uint32) error {
	return s.do(func(cs C.CUstream) error {
		return result("cuStreamWaitValue32", C.cuStreamWaitValue32_v2(cs, p.c(), C.cuuint32_t(v), C.CU_STREAM_WAIT_VALUE_GEQ))
	})
}

// WaitValue64 is WaitValue32 for an 8-byte word (cuStreamWaitValue64_v2;
// needs Features.StreamMemOps64).
func (s *Stream) WaitValue64(p DevicePtr, v uint64) error {
	if err := s.memOps64("wait value 64"); err != nil {
		return err
	}
	return s.do(func(cs C.CUstream) error {
		return result("cuStreamWaitValue64", C.cuStreamWaitValue64_v2(cs, p.c(), C.cuuint64_t(v), C.CU_STREAM_WAIT_VALUE_GEQ))
	})
}
