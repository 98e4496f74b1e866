package rdma

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/goep/goep/internal/poll"
)

// Feed is the GPU-fed half of the host proxy: a device (GPU kernels)
// writes Work descriptors into a Ring in host memory mapped for it, and the
// Feed's goroutine pops them as they appear and hands each to the
// Transport's Put (which checks its bounds), so a put starts as soon as
// the kernel that produced its bytes has run, without a host wait for the
// GPU. The device writes the data first (into the transport's send region,
// also mapped), then the descriptors.
//
// The device is the ring's only producer, and one host goroutine drives it
// (the engine's call): Next gives the position at which the device is to
// write its next n descriptors, the kernels are launched with it, Expect
// announces them, and Drain waits until all have been handed to the
// transport. The device writes each descriptor as Ring.Store does: the
// fields, a system-scope fence, then the sequence word; it never waits for
// a slot, because Next refuses positions whose slots the Feed has not
// freed yet.
type Feed struct {
	t    Transport
	ring *Ring

	mu        sync.Mutex
	announced uint64 // descriptors announced by Expect: positions [0, announced)
	popped    uint64 // descriptors popped and handed to Put
	err       error  // the first Put failure
	more      chan struct{}
	note      notifier // woken after every pop

	ctx    context.Context // cancelled by Close: ends a Put blocked on a full transport ring
	cancel context.CancelFunc
	done   chan struct{}
}

// NewFeed maps a ring of size descriptors (a power of two, at least 2) for
// t and starts the goroutine that feeds t from it. Map Memory for the
// device before its kernels use it.
func NewFeed(t Transport, size int) (*Feed, error) {
	r, err := NewRing(size)
	if err != nil {
		return nil, err
	}
	f := &Feed{t: t, ring: r, more: make(chan struct{}, 1), done: make(chan struct{})}
	f.ctx, f.cancel = context.WithCancel(context.Background())
	go f.run()
	return f, nil
}

// Memory is the ring's memory (mmap'd: never the Go heap), to be mapped for
// the device; its layout is Ring's.
func (f *Feed) Memory() []byte { return f.ring.mem }

// Size is the ring's size in descriptors.
func (f *Feed) Size() int { return int(f.ring.size) }

// Next returns the ring position at which the device is to write its next
// n descriptors, n from 1 to Size, once their slots are free: every
// descriptor announced before has been popped (Drain returned), or at
// least enough of them.
func (f *Feed) Next(n int) (uint64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	busy := f.announced - f.popped
	if n < 1 || uint64(n) > f.ring.size-busy {
		return 0, fmt.Errorf("rdma: feed on rank %d: %d descriptors with %d of %d ring slots busy: %w", f.t.Rank(), n, busy, f.ring.size, ErrInvalidWork)
	}
	return f.announced, nil
}

// Expect announces n descriptors at the position Next(n) returned: the
// device writes them (the kernels that do are enqueued).
func (f *Feed) Expect(n int) {
	f.mu.Lock()
	f.announced += uint64(n)
	f.mu.Unlock()
	select {
	case f.more <- struct{}{}:
	default:
	}
}

// Drain returns once every descriptor announced has been handed to the
// transport (Flush then covers their puts), with the first Put failure
// since the last Drain, if any. At ctx's end it returns an error saying
// how many of the announced descriptors the device has written.
func (f *Feed) Drain(ctx context.Context) error {
	for {
		ch := f.note.arm()
		f.mu.Lock()
		announced, popped, err := f.announced, f.popped, f.err
		if popped == announced {
			f.err = nil
		}
		f.mu.Unlock()
		if popped == announced {
			return err
		}
		select {
		case <-ch:
		case <-f.done:
			return fmt.Errorf("rdma: feed on rank %d: %w", f.t.Rank(), ErrClosed)
		case <-ctx.Done():
			return fmt.Errorf("rdma: feed on rank %d: device descriptors [%d, %d) not handed to the transport (not written by the device, or the transport's ring stays full): %w",
				f.t.Rank(), popped, announced, context.Cause(ctx))
		}
	}
}

// run pops descriptors while some are announced and not yet popped, and
// hands them to the transport; it sleeps while none is expected.
func (f *Feed) run() {
	defer close(f.done)
	for {
		f.mu.Lock()
		want := f.popped < f.announced
		f.mu.Unlock()
		if !want {
			select {
			case <-f.more:
				continue
			case <-f.ctx.Done():
				return
			}
		}
		var w Work
		if err := poll.Until(f.ctx, devicePolicy, func() (bool, error) {
			var ok bool
			w, ok = f.ring.TryPop()
			return ok, nil
		}); err != nil {
			return // closed
		}
		err := f.t.Put(f.ctx, w)
		f.mu.Lock()
		if err != nil && f.err == nil {
			f.err = fmt.Errorf("rdma: feed on rank %d: device descriptor %d: %w", f.t.Rank(), f.popped, err)
		}
		f.popped++
		f.mu.Unlock()
		f.note.wake()
	}
}

// devicePolicy is how the feed polls for a descriptor announced and not
// yet written: the kernel that writes it may be running (yield for 200µs)
// or still queued behind other work (then sleep, from 20µs doubling to
// 500µs), as internal/cuda polls a stream for its work.
var devicePolicy = poll.Policy{Spin: 200 * time.Microsecond, First: 20 * time.Microsecond, Most: 500 * time.Microsecond}

// Close stops the feed and unmaps its ring; the device no longer writes it
// (its mapping is gone). Descriptors announced and not yet popped are
// dropped, with an error.
func (f *Feed) Close() error {
	f.cancel()
	<-f.done
	f.mu.Lock()
	left := f.announced - f.popped
	f.mu.Unlock()
	var errs []error
	if left > 0 {
		errs = append(errs, fmt.Errorf("rdma: feed on rank %d closed with %d device descriptors not handed to the transport", f.t.Rank(), left))
	}
	errs = append(errs, f.ring.Close())
	return errors.Join(errs...)
}
