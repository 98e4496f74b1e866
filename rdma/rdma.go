package rdma

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Transport moves bytes from this rank's send region into peers' receive
// regions and signals them. Methods are safe for concurrent use; Put and
// Wait may be called from many goroutines.
type Transport interface {
	// Rank and Size are this rank's index and the number of ranks, as in
	// the comm.Group it was created with.
	Rank() int
	Size() int
	// SendBuffer is this rank's registered send region (Config.SendBytes).
	SendBuffer() []byte
	// RecvBuffer is this rank's registered receive region
	// (Config.RecvBytes), written by peers.
	RecvBuffer() []byte
	// Put queues w for the host proxy: the put of w.Bytes bytes from
	// SendBuffer()[w.LocalOff:] to the peer's RecvBuffer()[w.RemoteOff:],
	// then, if w.Epoch > 0, the signal of that epoch. It blocks while the
	// ring is full, until ctx ends. Bounds are checked here; a failure of
	// the put itself is reported by later calls (Wait, Flush).
	Put(ctx context.Context, w Work) error
	// Wait returns once peer has signalled epoch (or a later one) to this
	// rank, or an error naming the peer: *comm.TimeoutError at ctx's
	// deadline, *comm.PeerLostError if the peer was lost.
	Wait(ctx context.Context, peer int, epoch uint64) error
	// WaitAll is Wait for several peers; a timeout names all the peers not
	// heard from.
	WaitAll(ctx context.Context, peers []int, epoch uint64) error
	// Flush returns once every put and signal queued before it has
	// completed at its target (the send region may then be reused).
	Flush(ctx context.Context) error
	// Close is collective: it flushes, waits (bounded by Config.Timeout)
	// until every peer has flushed too, and frees everything. After a
	// failure it still frees everything; it returns every error met
	// (errors.Join).
	Close() error
}

// Work is one descriptor of the host proxy's ring: a put, then a signal.
type Work struct {
	Peer      int    // destination rank
	LocalOff  int    // offset in this rank's send region
	RemoteOff int    // offset in the peer's receive region
	Bytes     int    // bytes to put; 0: signal only
	Epoch     uint64 // epoch to signal after the put; 0: no signal
}

// Config sizes a transport. Sizes may differ between ranks.
type Config struct {
	// SendBytes is the size of this rank's send region, at least 1: the
	// most this rank stages for peers at once.
	SendBytes int
	// RecvBytes is the size of this rank's receive region, at least 1: the
	// most peers write into this rank between two reuses.
	RecvBytes int
	// RingSize is the number of descriptors the proxy's ring holds, a
	// power of two from 2 (0: DefaultRingSize). Producers block while it is full,
	// so it bounds the work in flight, not what can be queued overall.
	RingSize int
	// Timeout bounds Close's flush and its wait for the peers (0:
	// DefaultTimeout); Put and Wait take their deadlines from their
	// contexts.
	Timeout time.Duration
	// SharedMemory lets UCX use shared memory between the processes of one
	// host. UCX 1.13 cannot detect a failed peer on those transports, so
	// endpoints are then created without peer error handling and a dead
	// peer on this host is found by checking its process (every 20 ms); a
	// dead peer on another host only by the deadline. For single-host tests
	// and measurements; off, UCX uses TCP or InfiniBand/RoCE with peer
	// failure detection. Must be equal on all ranks.
	SharedMemory bool
	// UCXOptions are UCX settings applied on top of the UCX_* environment,
	// each "NAME=VALUE" without the UCX_ prefix (for example
	// "TLS=tcp,self", "NET_DEVICES=lo").
	UCXOptions []string
}

// DefaultRingSize is the ring size when Config.RingSize is 0.
const DefaultRingSize = 1024

// DefaultTimeout bounds Close when Config.Timeout is 0 (GOEP_TIMEOUT's
// default).
const DefaultTimeout = 60 * time.Second

// Validate checks the configuration, saying why each rule exists.
func (c Config) Validate() error {
	switch {
	case c.SendBytes < 1 || c.RecvBytes < 1:
		// The regions are registered with the NIC once, at creation; an
		// empty one cannot be registered.
		return fmt.Errorf("rdma: SendBytes %d and RecvBytes %d: both must be at least 1 (each region is registered once, at creation): %w", c.SendBytes, c.RecvBytes, ErrInvalidConfig)
	case c.RingSize < 0 || c.RingSize == 1 || c.RingSize&(c.RingSize-1) != 0:
		// Ring positions are counters masked by size-1, and a slot's
		// sequence number tells "full" from "free" only with 2 or more.
		return fmt.Errorf("rdma: RingSize %d: must be a power of two, at least 2 (or 0 for %d): %w", c.RingSize, DefaultRingSize, ErrInvalidConfig)
	case c.Timeout < 0:
		return fmt.Errorf("rdma: Timeout %v: must not be negative: %w", c.Timeout, ErrInvalidConfig)
	}
	return nil
}

func (c Config) withDefaults() Config {
	if c.RingSize == 0 {
		c.RingSize = DefaultRingSize
	}
	if c.Timeout == 0 {
		c.Timeout = DefaultTimeout
	}
	return c
}

// ErrInvalidConfig is wrapped by the error of a constructor given a bad
// Config.
var ErrInvalidConfig = errors.New("rdma: invalid config")

// ErrInvalidWork is wrapped by Put's error for a descriptor out of bounds,
// and by the transport's error after an epoch that did not grow.
var ErrInvalidWork = errors.New("rdma: invalid work descriptor")

// ErrPeerMismatch is wrapped by the constructor's error when ranks disagree
// on what must be equal (SharedMemory, the exchange's format).
var ErrPeerMismatch = errors.New("rdma: peers disagree")

// ErrClosed is wrapped by the error of a call on a closed transport.
var ErrClosed = errors.New("rdma: transport closed")

// ErrUnsupported is wrapped by the error of a constructor whose
// implementation is not compiled in (the message names the build tag).
var ErrUnsupported = errors.New("rdma: unsupported")

// check validates w against this rank's send region and the peer's receive
// region.
func (w Work) check(size, sendBytes int, recvBytes func(peer int) int) error {
	switch {
	case w.Peer < 0 || w.Peer >= size:
		return fmt.Errorf("rdma: put to rank %d of %d: %w", w.Peer, size, ErrInvalidWork)
	case w.Bytes < 0 || w.LocalOff < 0 || w.RemoteOff < 0:
		return fmt.Errorf("rdma: put %+v: negative size or offset: %w", w, ErrInvalidWork)
	case w.Bytes == 0 && w.Epoch == 0:
		return fmt.Errorf("rdma: put %+v: neither bytes nor a signal: %w", w, ErrInvalidWork)
	case w.LocalOff > sendBytes-w.Bytes:
		return fmt.Errorf("rdma: put %+v: [%d, %d) is outside the send region of %d bytes: %w", w, w.LocalOff, w.LocalOff+w.Bytes, sendBytes, ErrInvalidWork)
	case w.RemoteOff > recvBytes(w.Peer)-w.Bytes:
		return fmt.Errorf("rdma: put %+v: [%d, %d) is outside rank %d's receive region of %d bytes: %w", w, w.RemoteOff, w.RemoteOff+w.Bytes, w.Peer, recvBytes(w.Peer), ErrInvalidWork)
	}
	return nil
}

// checkPeers validates the peers of a WaitAll on rank of size ranks.
func checkPeers(rank, size int, peers []int) error {
	for _, p := range peers {
		if p < 0 || p >= size {
			return fmt.Errorf("rdma: wait on rank %d for rank %d of %d: %w", rank, p, size, ErrInvalidWork)
		}
	}
	return nil
}

// testHookWaitLooked, when a test sets it, runs in WaitAll (both
// transports) between a look at the signals that left peers pending and
// the check for lost peers.
var testHookWaitLooked func()

// GPUMemory reports whether t's transports can put from and into CUDA
// device memory (UCX built with CUDA: GPUDirect RDMA on the network), and
// says what it found. The in-process transport moves host memory only.
func GPUMemory(t Transport) (bool, string) {
	if g, ok := t.(interface{ gpuMemory() (bool, string) }); ok {
		return g.gpuMemory()
	}
	return false, fmt.Sprintf("the rail's in-process transport (%T) moves host memory only", t)
}
