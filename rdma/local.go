package rdma

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/goep/goep/comm"
)

// localTransport is the in-process Transport: every rank of the group lives
// in this process, so a put is a copy into the peer's receive region and a
// signal is an atomic store into the peer's signal word.
type localTransport struct {
	g          comm.Group
	cfg        Config
	rank, size int
	key        uint64 // the meeting's key in the process-wide registry

	send, recv []byte // mmap'd; nil once freed
	sendLen    int
	recvLen    int
	// sig[s] is the last epoch rank s signalled to this rank.
	sig  []atomic.Uint64
	note notifier // woken on every signal to this rank and when a peer goes away

	// sent[p] is the last epoch this rank signalled to rank p, guarded by
	// sentMu[p]; the signalling put's copy and store happen under it, so
	// that a peer's signal word only grows.
	sentMu []sync.Mutex
	sent   []uint64

	peers []*localTransport // by rank; peers[rank] is t

	closing atomic.Bool  // Close has begun: this rank's calls fail with ErrClosed
	freed   atomic.Bool  // the regions are unmapped: peers' puts and waits fail
	life    sync.RWMutex // held for reading while a put touches the regions; free unmaps them under the write lock
}

// NewInProcess creates the in-process transport of g's rank: collective
// over g, whose ranks must all live in this process (goroutine ranks over
// comm.NewLocal, or groups split from one). It maps the send and receive
// regions, checks that every rank is in this process (otherwise it returns
// an error wrapping ErrUnsupported: ranks in several processes need NewUCX
// and -tags ucx), and meets the peers through a process-wide registry under
// a random key that rank 0 broadcasts. ctx bounds the setup.
//
// Puts are synchronous: Put copies the bytes into the peer's receive region
// and then stores the signal, so Flush has nothing to wait for and
// Config.RingSize is only validated. A signal whose epoch does not grow is
// refused by Put (ErrInvalidWork) and has no effect. A peer whose transport
// has been freed (its Close gave up waiting) is reported as lost.
func NewInProcess(ctx context.Context, g comm.Group, cfg Config) (Transport, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	ids, err := gatherProcesses(ctx, g)
	if err != nil {
		return nil, err
	}
	return newInProcess(ctx, g, cfg, ids)
}

// newInProcess is NewInProcess once the ranks' process identities (ids, by
// rank) have been gathered; cfg is valid.
func newInProcess(ctx context.Context, g comm.Group, cfg Config, ids [][]byte) (Transport, error) {
	if len(ids) != g.Size() {
		return nil, fmt.Errorf("rdma: rank %d: %d process identities for %d ranks: %w", g.Rank(), len(ids), g.Size(), ErrPeerMismatch)
	}
	if r := otherProcess(ids); r >= 0 {
		return nil, fmt.Errorf("rdma: NewInProcess on rank %d: ranks 0 (%s) and %d (%s) are in different processes; ranks in several processes need NewUCX (build with -tags ucx): %w",
			g.Rank(), describeProcess(ids[0]), r, describeProcess(ids[r]), ErrUnsupported)
	}
	cfg = cfg.withDefaults()
	n := g.Size()
	t := &localTransport{g: g, cfg: cfg, rank: g.Rank(), size: n,
		sendLen: cfg.SendBytes, recvLen: cfg.RecvBytes,
		sig: make([]atomic.Uint64, n), sentMu: make([]sync.Mutex, n), sent: make([]uint64, n)}
	if err := t.setup(ctx); err != nil {
		return nil, errors.Join(fmt.Errorf("rdma: rank %d: %w", t.rank, err), t.free())
	}
	return t, nil
}

func (t *localTransport) setup(ctx context.Context) error {
	var err error
	if t.send, err = mapRegion("send", t.sendLen); err != nil {
		return err
	}
	if t.recv, err = mapRegion("receive", t.recvLen); err != nil {
		return err
	}
	var proposal []byte
	if t.rank == 0 {
		proposal = make([]byte, 8)
		if _, err := rand.Read(proposal); err != nil {
			return fmt.Errorf("registry key: %w", err)
		}
	}
	k, err := t.g.Broadcast(ctx, 0, proposal)
	if err != nil {
		return fmt.Errorf("broadcast registry key: %w", err)
	}
	if len(k) != 8 {
		return fmt.Errorf("rank 0 broadcast a registry key of %d bytes, want 8: %w", len(k), ErrPeerMismatch)
	}
	t.key = binary.LittleEndian.Uint64(k)
	if err := registry.join(t); err != nil {
		return err
	}
	if err := t.g.Barrier(ctx); err != nil {
		return fmt.Errorf("barrier after registering: %w", err)
	}
	t.peers, err = registry.lookup(t.key, t.size)
	return err
}

// mapRegion maps n bytes of anonymous memory for a region of any
// transport (never the Go heap: NICs and UCX use it asynchronously, its
// size is fixed at creation, and it is unmapped at Close).
func mapRegion(what string, n int) ([]byte, error) {
	b, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		return nil, fmt.Errorf("map %s region of %d bytes: %w", what, n, err)
	}
	return b, nil
}

func (t *localTransport) Rank() int          { return t.rank }
func (t *localTransport) Size() int          { return t.size }
func (t *localTransport) SendBuffer() []byte { return t.send }
func (t *localTransport) RecvBuffer() []byte { return t.recv }

// String says which transport this is and where it runs.
func (t *localTransport) String() string {
	return fmt.Sprintf("rdma.InProcess(rank %d of %d)", t.rank, t.size)
}

// err is ErrClosed once Close has begun, or nil.
func (t *localTransport) err(op string) error {
	if t.closing.Load() {
		return fmt.Errorf("rdma: %s on rank %d: %w", op, t.rank, ErrClosed)
	}
	return nil
}

// lostError names the peers among peers whose transport has been freed, or
// is nil.
func (t *localTransport) lostError(op string, peers []int) error {
	var ranks []int
	for _, p := range peers {
		if p != t.rank && t.peers[p].freed.Load() {
			ranks = append(ranks, p)
		}
	}
	if len(ranks) == 0 {
		return nil
	}
	slices.Sort(ranks)
	return &comm.PeerLostError{Op: fmt.Sprintf("rdma: %s on rank %d", op, t.rank), Ranks: slices.Compact(ranks),
		Cause: "closed its in-process transport"}
}

// Put copies w's bytes into the peer's receive region and then, if w.Epoch
// > 0, stores the epoch in the peer's signal word for this rank and wakes
// its waiters. It does not block; ctx is unused.
func (t *localTransport) Put(ctx context.Context, w Work) error {
	if err := t.err("put"); err != nil {
		return err
	}
	if err := w.check(t.size, t.sendLen, func(p int) int { return t.peers[p].recvLen }); err != nil {
		return err
	}
	t.life.RLock()
	defer t.life.RUnlock()
	if t.freed.Load() {
		return fmt.Errorf("rdma: put on rank %d: %w", t.rank, ErrClosed)
	}
	p := t.peers[w.Peer]
	if p != t {
		p.life.RLock()
		defer p.life.RUnlock()
		if p.freed.Load() {
			return t.lostError("put", []int{w.Peer})
		}
	}
	if w.Epoch == 0 {
		copy(p.recv[w.RemoteOff:w.RemoteOff+w.Bytes], t.send[w.LocalOff:w.LocalOff+w.Bytes])
		return nil
	}
	t.sentMu[w.Peer].Lock()
	if last := t.sent[w.Peer]; w.Epoch <= last {
		t.sentMu[w.Peer].Unlock()
		return fmt.Errorf("rdma: put on rank %d: signal of epoch %d to rank %d after epoch %d: epochs must grow: %w", t.rank, w.Epoch, w.Peer, last, ErrInvalidWork)
	}
	copy(p.recv[w.RemoteOff:w.RemoteOff+w.Bytes], t.send[w.LocalOff:w.LocalOff+w.Bytes])
	t.sent[w.Peer] = w.Epoch
	p.sig[t.rank].Store(w.Epoch)
	t.sentMu[w.Peer].Unlock()
	p.note.wake()
	return nil
}

func (t *localTransport) Wait(ctx context.Context, peer int, epoch uint64) error {
	return t.WaitAll(ctx, []int{peer}, epoch)
}

// WaitAll sleeps on the rank's notifier between checks of the signal words:
// an idle waiter uses no CPU.
func (t *localTransport) WaitAll(ctx context.Context, peers []int, epoch uint64) error {
	if err := checkPeers(t.rank, t.size, peers); err != nil {
		return err
	}
	op := fmt.Sprintf("wait for epoch %d", epoch)
	pending := slices.Clone(peers)
	for {
		// Armed before the check: a signal stored after it closes woken.
		woken := t.note.arm()
		if err := t.err(op); err != nil {
			return err
		}
		pending = slices.DeleteFunc(pending, func(p int) bool { return t.sig[p].Load() >= epoch })
		if len(pending) == 0 {
			return nil
		}
		if testHookWaitLooked != nil {
			testHookWaitLooked()
		}
		if err := t.lostError(op, pending); err != nil {
			// A peer may signal and then be freed (its Close timed out)
			// between the look and this check. Its signal was stored
			// before it was freed, so a second look sees it: only the
			// peers seen lost that it still misses fail the wait.
			lost := slices.DeleteFunc(err.(*comm.PeerLostError).Ranks, func(p int) bool { return t.sig[p].Load() >= epoch })
			if len(lost) > 0 {
				return t.lostError(op, lost)
			}
			continue
		}
		if ctx.Err() != nil {
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				slices.Sort(pending)
				return &comm.TimeoutError{Op: fmt.Sprintf("rdma: %s on rank %d", op, t.rank), Missing: slices.Compact(pending)}
			}
			return fmt.Errorf("rdma: %s on rank %d: %w", op, t.rank, context.Cause(ctx))
		}
		select {
		case <-woken:
		case <-ctx.Done():
		}
	}
}

// Flush has nothing to wait for: puts complete before Put returns.
func (t *localTransport) Flush(ctx context.Context) error {
	return t.err("flush")
}

// Close waits (bounded by Config.Timeout) until every peer has called Close
// too, so that no peer still copies into this rank's receive region, then
// unmaps the regions and leaves the registry. After a timeout it still
// frees everything; peers that put or wait later see this rank lost.
func (t *localTransport) Close() error {
	if !t.closing.CompareAndSwap(false, true) {
		return nil
	}
	t.note.wake() // this rank's waiters return ErrClosed
	ctx, cancel := context.WithTimeout(context.Background(), t.cfg.Timeout)
	defer cancel()
	var errs []error
	if err := t.g.Barrier(ctx); err != nil {
		errs = append(errs, fmt.Errorf("rdma: close on rank %d: barrier: %w", t.rank, err))
	}
	errs = append(errs, t.free())
	return errors.Join(errs...)
}

// free unmaps the regions (once no put touches them), leaves the registry
// and wakes the peers' waiters.
func (t *localTransport) free() error {
	t.closing.Store(true)
	t.life.Lock()
	var errs []error
	if !t.freed.Swap(true) {
		for _, b := range [][]byte{t.send, t.recv} {
			if b != nil {
				if err := unix.Munmap(b); err != nil {
					errs = append(errs, fmt.Errorf("rdma: rank %d: unmap: %w", t.rank, err))
				}
			}
		}
		t.send, t.recv = nil, nil
	}
	t.life.Unlock()
	registry.leave(t)
	t.note.wake()
	for _, p := range t.peers {
		if p != t {
			p.note.wake()
		}
	}
	return errors.Join(errs...)
}

// notifier wakes the goroutines waiting for a signal to one rank: a waiter
// arms it (gets a channel) before checking the signal words, and wake closes
// that channel.
type notifier struct {
	mu sync.Mutex
	ch chan struct{} // nil: nobody is armed
}

// arm returns the channel that the next wake closes.
func (n *notifier) arm() <-chan struct{} {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.ch == nil {
		n.ch = make(chan struct{})
	}
	return n.ch
}

// wake wakes every goroutine armed so far.
func (n *notifier) wake() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.ch != nil {
		close(n.ch)
		n.ch = nil
	}
}

// registry is where the in-process transports of one group meet: by key
// (rank 0's random 64-bit number), each rank's transport at its rank.
var registry = meetings{m: map[uint64][]*localTransport{}}

type meetings struct {
	mu sync.Mutex
	m  map[uint64][]*localTransport
}

// join registers t under its key.
func (r *meetings) join(t *localTransport) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	ts := r.m[t.key]
	if ts == nil {
		ts = make([]*localTransport, t.size)
		r.m[t.key] = ts
	}
	if len(ts) != t.size || ts[t.rank] != nil {
		return fmt.Errorf("registry key %#x is already used by another group (or by two ranks %d): %w", t.key, t.rank, ErrPeerMismatch)
	}
	ts[t.rank] = t
	return nil
}

// lookup returns the transports registered under key, by rank; all of them
// must be there.
func (r *meetings) lookup(key uint64, size int) ([]*localTransport, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	ts := r.m[key]
	if len(ts) != size {
		return nil, fmt.Errorf("registry key %#x: %d ranks registered, want %d: %w", key, len(ts), size, ErrPeerMismatch)
	}
	for p, q := range ts {
		if q == nil {
			return nil, fmt.Errorf("rank %d is not registered (it failed or closed during setup): %w", p, ErrPeerMismatch)
		}
	}
	return slices.Clone(ts), nil
}

// leave removes t from the registry (if it is there); the last rank to
// leave removes the key.
func (r *meetings) leave(t *localTransport) {
	r.mu.Lock()
	defer r.mu.Unlock()
	ts := r.m[t.key]
	if t.rank >= len(ts) || ts[t.rank] != t {
		return
	}
	ts[t.rank] = nil
	if !slices.ContainsFunc(ts, func(q *localTransport) bool { return q != nil }) {
		delete(r.m, t.key)
	}
}

// processID is this process's identity: the pid and a random nonce drawn
// once per process (pids repeat across hosts and containers; the nonce
// does not).
var processID = sync.OnceValue(func() []byte {
	b := make([]byte, 16)
	binary.LittleEndian.PutUint64(b, uint64(os.Getpid()))
	rand.Read(b[8:]) // never fails (crypto/rand panics instead)
	return b
})

// gatherProcesses all-gathers the ranks' process identities over g.
func gatherProcesses(ctx context.Context, g comm.Group) ([][]byte, error) {
	ids, err := g.AllGather(ctx, processID())
	if err != nil {
		return nil, fmt.Errorf("rdma: rank %d: exchange process identities: %w", g.Rank(), err)
	}
	return ids, nil
}

// otherProcess returns the first rank whose process identity differs from
// rank 0's, or -1 if every rank is in the same process (ids is not empty).
func otherProcess(ids [][]byte) int {
	for r, id := range ids {
		if !bytes.Equal(id, ids[0]) {
			return r
		}
	}
	return -1
}

// describeProcess renders a process identity for an error message.
func describeProcess(id []byte) string {
	if len(id) != 16 {
		return fmt.Sprintf("identity %x", id)
	}
	return fmt.Sprintf("pid %d, nonce %x", binary.LittleEndian.Uint64(id), id[8:])
}
