package bench

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// hostBuf is a buffer the a2a baseline reuses from one call to the next,
// mapped outside the Go heap: free gives its pages back to the system at
// once, where a Go slice dropped would stay resident until the garbage
// collector and the scavenger got to it (the baseline's buffers were most
// of a run's peak memory). Pages are touched on first use.
type hostBuf struct{ b []byte }

// get returns n bytes (their contents are whatever the last use left),
// mapping a larger buffer if this one is too small.
func (h *hostBuf) get(n int) ([]byte, error) {
	if n <= cap(h.b) && h.b != nil {
		return h.b[:n], nil
	}
	if err := h.free(); err != nil {
		return nil, err
	}
	b, err := unix.Mmap(-1, 0, max(n, 1), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil, fmt.Errorf("a2a: map %d bytes: %w", n, err)
	}
	h.b = b
	return b[:n], nil
}

// free unmaps the buffer; no view of it may be used after.
func (h *hostBuf) free() error {
	if h.b == nil {
		return nil
	}
	b := h.b[:cap(h.b)]
	h.b = nil
	if err := unix.Munmap(b); err != nil {
		return fmt.Errorf("a2a: unmap: %w", err)
	}
	return nil
}

// abandon forgets the buffer without unmapping it: after a failed
// exchange a peer may still read it (comm.AllToAllv), and an unmapped
// page under that read would crash the process. The run has failed; the
// process gives the pages back when it ends.
func (h *hostBuf) abandon() { h.b = nil }

// size is the bytes mapped.
func (h *hostBuf) size() int { return cap(h.b) }
