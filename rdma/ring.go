package rdma

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/goep/goep/internal/poll"
)

// Ring is the host proxy's fixed-size ring of Work descriptors: many
// producers, one consumer (the proxy). It lives in mmap'd memory and every
// field is accessed with 64-bit atomics, so the same layout can be written
// by a GPU kernel through mapped pinned memory (system-scope atomics)
// without changing the proxy.
//
// Layout: head counter (line 0), tail counter (line 1), then one 64-byte
// slot per descriptor: seq, peer, local offset, remote offset, bytes,
// epoch. A slot at position p is free for the producer that claims p when
// seq == p and holds a descriptor for the consumer when seq == p+1; the
// consumer hands it to position p+size by storing seq = p+size (Vyukov's
// bounded queue).
type Ring struct {
	mem        []byte
	size, mask uint64
	head, tail *atomic.Uint64
}

const (
	ringLine  = 64
	slotWords = 6
)

// NewRing maps a ring of size descriptors, a power of two from 2 (with one
// slot, "full at p" and "free for p+1" would be the same seq).
func NewRing(size int) (*Ring, error) {
	if size < 2 || size&(size-1) != 0 {
		return nil, fmt.Errorf("rdma: ring of %d descriptors: want a power of two, at least 2: %w", size, ErrInvalidConfig)
	}
	mem, err := unix.Mmap(-1, 0, 2*ringLine+size*ringLine, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		return nil, fmt.Errorf("rdma: map ring of %d descriptors: %w", size, err)
	}
	r := &Ring{mem: mem, size: uint64(size), mask: uint64(size - 1),
		head: (*atomic.Uint64)(unsafe.Pointer(&mem[0])), tail: (*atomic.Uint64)(unsafe.Pointer(&mem[ringLine]))}
	for i := range r.size {
		r.word(i, 0).Store(i)
	}
	return r, nil
}

// word is field f of the slot of position pos.
func (r *Ring) word(pos uint64, f int) *atomic.Uint64 {
	return (*atomic.Uint64)(unsafe.Pointer(&r.mem[2*ringLine+int(pos&r.mask)*ringLine+8*f]))
}

// TryPush appends w if the ring has room and reports whether it did.
func (r *Ring) TryPush(w Work) bool {
	for {
		pos := r.head.Load()
		seq := r.word(pos, 0).Load()
		switch d := int64(seq - pos); {
		case d == 0:
			if !r.head.CompareAndSwap(pos, pos+1) {
				continue
			}
			r.Store(pos, w)
			return true
		case d < 0:
			return false // full: the consumer has not freed this slot yet
		}
		// Another producer claimed pos; look again.
	}
}

// Store writes w at position pos the way a Feed's device producer does
// (the kernel that posts rail descriptors is its CUDA twin): the fields,
// then the sequence word pos+1, which the consumer's TryPop waits for (a
// kernel stores it after a system-scope fence). The single producer owns
// pos (Feed.Next); its slot is free (seq == pos) and the head counter is
// not used.
func (r *Ring) Store(pos uint64, w Work) {
	r.word(pos, 1).Store(uint64(w.Peer))
	r.word(pos, 2).Store(uint64(w.LocalOff))
	r.word(pos, 3).Store(uint64(w.RemoteOff))
	r.word(pos, 4).Store(uint64(w.Bytes))
	r.word(pos, 5).Store(w.Epoch)
	r.word(pos, 0).Store(pos + 1)
}

// Push appends w, waiting while the ring is full until ctx ends.
func (r *Ring) Push(ctx context.Context, w Work) error {
	if err := poll.Until(ctx, ringFullPolicy, func() (bool, error) { return r.TryPush(w), nil }); err != nil {
		return fmt.Errorf("rdma: ring full: %w", err)
	}
	return nil
}

// ringFullPolicy is how a producer waits for a slot of a full ring. The
// consumer (this process's proxy) frees one at each pop, so a slot comes
// soon: the wait spins for 50µs (about what 64 yields take on a busy
// machine) and then sleeps from 1µs doubling to only 100µs.
var ringFullPolicy = poll.Policy{Spin: 50 * time.Microsecond, First: time.Microsecond, Most: 100 * time.Microsecond}

// TryPop removes the oldest descriptor, if any. Only one goroutine (the
// proxy) may pop.
func (r *Ring) TryPop() (Work, bool) {
	pos := r.tail.Load()
	if int64(r.word(pos, 0).Load()-(pos+1)) < 0 {
		return Work{}, false
	}
	w := Work{
		Peer:      int(r.word(pos, 1).Load()),
		LocalOff:  int(r.word(pos, 2).Load()),
		RemoteOff: int(r.word(pos, 3).Load()),
		Bytes:     int(r.word(pos, 4).Load()),
		Epoch:     r.word(pos, 5).Load(),
	}
	r.word(pos, 0).Store(pos + r.size)
	r.tail.Store(pos + 1)
	return w, true
}

// Pushed is the number of descriptors claimed so far; Popped the number
// removed. A descriptor claimed before Pushed was read has been popped once
// Popped passes that value.
func (r *Ring) Pushed() uint64 { return r.head.Load() }

// Popped is the number of descriptors removed so far.
func (r *Ring) Popped() uint64 { return r.tail.Load() }

// Close unmaps the ring; nothing may use it afterwards.
func (r *Ring) Close() error {
	if r.mem == nil {
		return nil
	}
	err := unix.Munmap(r.mem)
	r.mem = nil
	if err != nil {
		return fmt.Errorf("rdma: unmap ring: %w", err)
	}
	return nil
}
