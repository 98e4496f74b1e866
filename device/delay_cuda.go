//go:build cuda && cgo

package device

import (
	"errors"
	"fmt"
	"time"
)

// delayPTX is goep_delay, hand-written PTX of the ISA and target of the
// generated modules: one thread waits, a microsecond per nap, until the
// GPU's global timer (nanoseconds) has advanced by its argument. It reads
// and writes no memory.
const delayPTX = `.version 7.8
.target sm_90
.address_size 64

.visible .entry goep_delay(
	.param .u64 goep_delay_param_0
)
{
	.reg .pred 	%p<2>;
	.reg .b64 	%rd<5>;

	ld.param.u64 	%rd1, [goep_delay_param_0];
	mov.u64 	%rd2, %globaltimer;
	add.s64 	%rd3, %rd2, %rd1;
$L_wait:
	nanosleep.u32 	1000;
	mov.u64 	%rd4, %globaltimer;
	setp.lt.u64 	%p1, %rd4, %rd3;
	@%p1 bra 	$L_wait;
	ret;
}
`

// MaxDelay bounds Delay's duration.
const MaxDelay = time.Minute

// delayKernel loads goep_delay on first use; the backend's Close releases
// it with the other modules.
func (c *CUDA) delayKernel() (*Kernel, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, ErrClosed
	}
	if c.delay != nil {
		return c.delay, nil
	}
	m, err := c.LoadModule([]byte(delayPTX))
	if err != nil {
		return nil, err
	}
	k, err := m.Kernel("goep_delay")
	if err != nil {
		return nil, errors.Join(err, m.Close())
	}
	c.delay = k
	return k, nil
}

// Delay enqueues a kernel that keeps the stream busy for d and touches no
// memory. Work queued behind it waits for it: benchmarks put it ahead of
// the work they time, so that the host has queued all of it before the GPU
// starts and CUDA events time the GPU alone (on an idle stream an event
// fires when the host enqueues it, and the host's enqueueing would be
// timed too); tests use it to hold work queued behind it (DESIGN.md
// invariant 2). d <= 0 enqueues nothing; d over MaxDelay is refused.
func (s *CUDAStream) Delay(d time.Duration) error {
	if d <= 0 {
		return nil
	}
	if d > MaxDelay {
		return s.fail("delay", fmt.Errorf("%v is over MaxDelay (%v)", d, MaxDelay))
	}
	k, err := s.c.delayKernel()
	if err != nil {
		return s.fail("delay", err)
	}
	one := [3]uint32{1, 1, 1}
	return s.Launch(k, one, one, 0, uint64(d.Nanoseconds()))
}
