package device

import (
	"context"
	"errors"
	"fmt"
)

// ErrClosed is returned by operations on a closed stream or backend.
var ErrClosed = errors.New("device: closed")

// ErrUnsupported is returned by operations a backend does not offer.
var ErrUnsupported = errors.New("device: unsupported")

// Kind names a backend.
type Kind string

// The backends.
const (
	KindHost Kind = "host"
	KindCUDA Kind = "cuda"
)

// Backend is memory plus ordered streams.
type Backend interface {
	// Kind names the backend.
	Kind() Kind
	// NewStream creates an ordered work queue.
	NewStream() (Stream, error)
	// Close releases pooled memory. Streams must be closed first.
	Close() error
}

// Stream is an ordered queue of work on one backend. Methods that enqueue
// return at once; the work runs later in enqueue order.
type Stream interface {
	Backend() Backend
	// Alloc returns n bytes usable by work enqueued after this call.
	Alloc(n int) (*Buffer, error)
	// Free returns b to the pool once all work enqueued before it is done.
	Free(b *Buffer)
	// Record returns an event that completes when all work enqueued so far
	// has completed.
	Record() (*Event, error)
	// Wait makes work enqueued after this call wait for ev.
	Wait(ev *Event) error
	// Synchronize blocks until all enqueued work has completed, or ctx ends.
	// It returns the first error of the work since the last Synchronize and
	// clears it.
	Synchronize(ctx context.Context) error
	// Close drains the stream and stops it.
	Close() error
}

// TaskError is the error of one enqueued task, naming it.
type TaskError struct {
	Task string
	Err  error
}

func (e *TaskError) Error() string { return fmt.Sprintf("%s: %v", e.Task, e.Err) }
func (e *TaskError) Unwrap() error { return e.Err }
