//go:build ucx && cgo

package rdma

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/goep/goep/comm"
	"github.com/goep/goep/internal/poll"
	"github.com/goep/goep/internal/ucx"
)

// exchangeMagic starts every rank's exchanged description; a peer that
// sends anything else is not this version of this transport.
const exchangeMagic = "goep-rdma-ucx/1"

// peerInfo is what every rank all-gathers at creation.
type peerInfo struct {
	Magic        string
	Rank         int
	SharedMemory bool
	Proc         process
	Worker       []byte // ucp worker address
	RecvAddr     uint64 // receive region: base address, length, packed rkey
	RecvLen      int
	RecvKey      []byte
	SigAddr      uint64 // signal words: one uint64 per sender rank
	SigKey       []byte
}

// ucxPeer is this rank's view of a peer.
type ucxPeer struct {
	info    peerInfo
	ep      *ucx.Endpoint // nil for this rank
	recvKey *ucx.RemoteKey
	sigKey  *ucx.RemoteKey
	sent    uint64 // last epoch signalled to it (proxy only)
	lost    atomic.Pointer[comm.PeerLostError]
}

// ucxTransport is the UCX Transport.
type ucxTransport struct {
	g          comm.Group
	cfg        Config
	rank, size int
	me         process

	uctx                     *ucx.Context
	mem                      ucx.MemoryTypes // what uctx's transports can access
	w                        *ucx.Worker
	send, recv, sig          []byte // mmap'd
	sendMem, recvMem, sigMem *ucx.MemHandle
	peers                    []*ucxPeer
	ring                     *Ring
	wake                     chan struct{}
	flushes                  chan flushReq
	stop, done               chan struct{}
	closed                   atomic.Bool
	life                     sync.RWMutex // held for reading while a call touches mapped memory; Close frees it under the write lock
	failMu                   sync.Mutex
	failure                  error // the first error that fails the whole transport
}

// flushReq asks the proxy to flush once it has posted every descriptor
// pushed before upto.
type flushReq struct {
	upto  uint64
	reply chan error
}

// Devices lists the transport resources UCX can use on this machine, as
// `ucx_info -d` does, with UCX's version; Resources.RDMADevices names the
// RDMA-capable ones, and the memory types a context of this UCX can
// access. It asks UCX's components and one throwaway context: no group, no
// transport.
func Devices() (Resources, error) {
	devs, skipped, err := ucx.Devices()
	if err != nil {
		return Resources{}, fmt.Errorf("rdma: devices: %w", err)
	}
	v, _ := ucx.Version() // empty if it fails: the devices are the answer
	res := Resources{UCXVersion: v, Devices: devs, Skipped: skipped}
	if c, err := ucx.NewContext(ucx.ContextConfig{Features: ucx.FeatureRMA | ucx.FeatureAMO64}); err == nil {
		res.MemoryTypes, _ = c.MemoryTypes() // none if it fails, as above
		_ = c.Close()
	}
	return res, nil
}

// NewUCX creates the UCX transport of g's rank: collective over g. It maps
// and registers the send and receive regions and the signal words,
// all-gathers worker addresses and remote keys, connects one endpoint per
// peer, starts the host proxy and checks every endpoint with a flush (the
// connections are up when it returns). ctx bounds the whole setup.
func NewUCX(ctx context.Context, g comm.Group, cfg Config) (Transport, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	t := &ucxTransport{g: g, cfg: cfg, rank: g.Rank(), size: g.Size(), me: self(),
		wake: make(chan struct{}, 1), flushes: make(chan flushReq, 16), stop: make(chan struct{}), done: make(chan struct{})}
	close(t.done) // reopened when the proxy starts
	if err := t.setup(ctx); err != nil {
		return nil, errors.Join(fmt.Errorf("rdma: rank %d: %w", t.rank, err), t.free())
	}
	return t, nil
}

func (t *ucxTransport) setup(ctx context.Context) error {
	mode := ucx.ErrorModePeer
	if t.cfg.SharedMemory {
		mode = ucx.ErrorModeNone
	}
	var err error
	if t.uctx, err = ucx.NewContext(ucx.ContextConfig{Features: ucx.FeatureRMA | ucx.FeatureAMO64,
		Options: t.cfg.UCXOptions, EstimatedEndpoints: t.size}); err != nil {
		return err
	}
	// What the transports can access decides whether the rail could put
	// straight from and into GPU memory (GPUMemory).
	if t.mem, err = t.uctx.MemoryTypes(); err != nil {
		return err
	}
	if t.w, err = t.uctx.NewWorker(); err != nil {
		return err
	}
	if t.send, err = mapRegion("send", t.cfg.SendBytes); err != nil {
		return err
	}
	if t.ring, err = NewRing(t.cfg.RingSize); err != nil {
		return err
	}
	if t.sendMem, err = t.uctx.MemMap(t.send); err != nil {
		return err
	}
	// The regions peers write are allocated by UCX (shared memory first):
	// peers on this host then store into them directly instead of through
	// RMA emulated over active messages (8x the bandwidth here).
	if t.recvMem, err = t.uctx.MemAlloc(t.cfg.RecvBytes); err != nil {
		return fmt.Errorf("receive region of %d bytes: %w", t.cfg.RecvBytes, err)
	}
	t.recv = t.recvMem.Bytes()
	if t.sigMem, err = t.uctx.MemAlloc(8 * t.size); err != nil {
		return fmt.Errorf("signal words: %w", err)
	}
	t.sig = t.sigMem.Bytes()
	clear(t.recv)
	clear(t.sig)
	mine := peerInfo{Magic: exchangeMagic, Rank: t.rank, SharedMemory: t.cfg.SharedMemory, Proc: t.me,
		RecvAddr: t.recvMem.Address(), RecvLen: len(t.recv), SigAddr: t.sigMem.Address()}
	if mine.Worker, err = t.w.Address(); err != nil {
		return err
	}
	if mine.RecvKey, err = t.recvMem.PackRkey(); err != nil {
		return err
	}
	if mine.SigKey, err = t.sigMem.PackRkey(); err != nil {
		return err
	}
	raw, err := json.Marshal(mine)
	if err != nil {
		return err
	}
	all, err := t.g.AllGather(ctx, raw)
	if err != nil {
		return fmt.Errorf("exchange addresses and keys: %w", err)
	}
	t.peers = make([]*ucxPeer, t.size)
	for r, b := range all {
		p := &ucxPeer{}
		t.peers[r] = p
		if err := json.Unmarshal(b, &p.info); err != nil || p.info.Magic != exchangeMagic {
			return fmt.Errorf("rank %d sent %.40q, not a %s description: %w", r, b, exchangeMagic, ErrPeerMismatch)
		}
		switch i := p.info; {
		case i.Rank != r:
			return fmt.Errorf("rank %d described itself as rank %d: %w", r, i.Rank, ErrPeerMismatch)
		case i.SharedMemory != t.cfg.SharedMemory:
			return fmt.Errorf("rank %d has SharedMemory=%v, this rank %v: %w", r, i.SharedMemory, t.cfg.SharedMemory, ErrPeerMismatch)
		case len(i.Worker) == 0 || len(i.RecvKey) == 0 || len(i.SigKey) == 0 || i.RecvLen < 1:
			return fmt.Errorf("rank %d sent an incomplete description: %w", r, ErrPeerMismatch)
		}
	}
	for r, p := range t.peers {
		if r == t.rank {
			continue
		}
		if p.ep, err = t.w.Connect(p.info.Worker, mode); err != nil {
			return fmt.Errorf("connect to rank %d: %w", r, err)
		}
		if p.recvKey, err = p.ep.UnpackRkey(p.info.RecvKey); err != nil {
			return fmt.Errorf("receive key of rank %d: %w", r, err)
		}
		if p.sigKey, err = p.ep.UnpackRkey(p.info.SigKey); err != nil {
			return fmt.Errorf("signal key of rank %d: %w", r, err)
		}
	}
	t.done = make(chan struct{})
	go t.proxy()
	// Wire every endpoint up now: a peer that cannot be reached fails
	// creation, not the first call. Peers' proxies progress their side.
	for r, p := range t.peers {
		if p.ep == nil {
			continue
		}
		if err := p.ep.Flush(ctx); err != nil {
			return fmt.Errorf("connect to rank %d: %w", r, err)
		}
	}
	if err := t.g.Barrier(ctx); err != nil {
		return fmt.Errorf("barrier after connecting: %w", err)
	}
	return nil
}

// gpuMemory: see GPUMemory.
func (t *ucxTransport) gpuMemory() (bool, string) {
	if t.mem.CUDA() {
		return true, fmt.Sprintf("UCX can access CUDA memory (memory types: %s)", t.mem)
	}
	return false, fmt.Sprintf("this UCX cannot access CUDA memory (memory types: %s; a UCX built with CUDA, such as HPC-X's, can)", t.mem)
}

func (t *ucxTransport) Rank() int          { return t.rank }
func (t *ucxTransport) Size() int          { return t.size }
func (t *ucxTransport) SendBuffer() []byte { return t.send }
func (t *ucxTransport) RecvBuffer() []byte { return t.recv }

// signal is the word in which peer's signals to this rank arrive.
func (t *ucxTransport) signal(peer int) *uint64 {
	return (*uint64)(unsafe.Pointer(&t.sig[8*peer]))
}

// err is the transport's failure, or ErrClosed, or nil.
func (t *ucxTransport) err(op string) error {
	if t.closed.Load() {
		return fmt.Errorf("rdma: %s on rank %d: %w", op, t.rank, ErrClosed)
	}
	t.failMu.Lock()
	defer t.failMu.Unlock()
	return t.failure
}

// fail records the first error that fails the whole transport.
func (t *ucxTransport) fail(err error) {
	t.failMu.Lock()
	defer t.failMu.Unlock()
	if t.failure == nil {
		t.failure = fmt.Errorf("rdma: rank %d failed: %w", t.rank, err)
	}
}

// lose marks peer lost (the first cause is kept).
func (t *ucxTransport) lose(peer int, cause string) {
	t.peers[peer].lost.CompareAndSwap(nil, &comm.PeerLostError{
		Op: fmt.Sprintf("rdma on rank %d", t.rank), Ranks: []int{peer}, Cause: cause})
}

// lostError names the lost peers among peers, or is nil.
func (t *ucxTransport) lostError(op string, peers []int) error {
	var ranks []int
	var causes []string
	for _, p := range peers {
		if l := t.peers[p].lost.Load(); l != nil {
			ranks = append(ranks, p)
			causes = append(causes, fmt.Sprintf("rank %d: %s", p, l.Cause))
		}
	}
	if len(ranks) == 0 {
		return nil
	}
	return &comm.PeerLostError{Op: fmt.Sprintf("rdma: %s on rank %d", op, t.rank), Ranks: ranks, Cause: strings.Join(causes, "; ")}
}

func (t *ucxTransport) Put(ctx context.Context, w Work) error {
	if err := t.err("put"); err != nil {
		return err
	}
	if err := w.check(t.size, len(t.send), func(p int) int { return t.peers[p].info.RecvLen }); err != nil {
		return err
	}
	var failed error // the transport's or the peer's: it ends the put
	err := poll.Until(ctx, ringFullPolicy, func() (bool, error) {
		if failed = t.err("put"); failed != nil {
			return true, nil
		}
		if failed = t.lostError("put", []int{w.Peer}); failed != nil {
			return true, nil
		}
		t.life.RLock()
		defer t.life.RUnlock()
		return !t.closed.Load() && t.ring.TryPush(w), nil
	})
	if err != nil {
		return fmt.Errorf("rdma: put on rank %d: ring of %d descriptors full: %w", t.rank, t.cfg.RingSize, err)
	}
	if failed != nil {
		return failed
	}
	select {
	case t.wake <- struct{}{}:
	default:
	}
	return nil
}

func (t *ucxTransport) Wait(ctx context.Context, peer int, epoch uint64) error {
	return t.WaitAll(ctx, []int{peer}, epoch)
}

func (t *ucxTransport) WaitAll(ctx context.Context, peers []int, epoch uint64) error {
	if err := checkPeers(t.rank, t.size, peers); err != nil {
		return err
	}
	op := fmt.Sprintf("wait for epoch %d", epoch)
	pending := slices.Clone(peers)
	// look drops the peers that have signalled epoch from pending; false
	// when the transport is closed.
	look := func() bool {
		t.life.RLock()
		defer t.life.RUnlock()
		if t.closed.Load() {
			return false
		}
		pending = slices.DeleteFunc(pending, func(p int) bool { return atomic.LoadUint64(t.signal(p)) >= epoch })
		return true
	}
	var failed error // the transport's or a lost peer's: it ends the wait
	err := poll.Until(ctx, waitPolicy, func() (bool, error) {
		if !look() {
			failed = t.err(op)
			return true, nil
		}
		if len(pending) == 0 {
			return true, nil
		}
		if testHookWaitLooked != nil {
			testHookWaitLooked()
		}
		if err := t.lostError(op, pending); err != nil {
			// A peer may signal and then exit (it had nothing more to do)
			// between the look and this check: the peers seen lost fail
			// the wait only if a look after it still misses their
			// signal, as in nvlink's Domain.wait.
			lost := err.(*comm.PeerLostError).Ranks
			if !look() {
				failed = t.err(op)
				return true, nil
			}
			if lost = slices.DeleteFunc(lost, func(p int) bool { return !slices.Contains(pending, p) }); len(lost) > 0 {
				failed = t.lostError(op, lost)
				return true, nil
			}
			return len(pending) == 0, nil
		}
		failed = t.err(op)
		return failed != nil, nil
	})
	switch {
	case err == nil:
		return failed
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		slices.Sort(pending)
		return &comm.TimeoutError{Op: fmt.Sprintf("rdma: %s on rank %d", op, t.rank), Missing: slices.Compact(pending)}
	default:
		return fmt.Errorf("rdma: %s on rank %d: %w", op, t.rank, err)
	}
}

// waitPolicy is how WaitAll polls the signal words, which peers' puts
// write: it spins for 200µs, then sleeps from 1µs doubling to maxSleep.
var waitPolicy = poll.Policy{Spin: 200 * time.Microsecond, First: time.Microsecond, Most: maxSleep}

const (
	// maxSleep bounds the sleeps of waits and of the idle proxy: the
	// latency added to a signal that arrives while nobody spins.
	maxSleep = 200 * time.Microsecond
	// checkEvery is how often the proxy looks for failed endpoints and
	// dead processes.
	checkEvery = 20 * time.Millisecond
)

func (t *ucxTransport) Flush(ctx context.Context) error {
	if err := t.err("flush"); err != nil {
		return err
	}
	return t.flush(ctx)
}

// flush asks the proxy to flush everything pushed so far and waits for it.
func (t *ucxTransport) flush(ctx context.Context) error {
	f := flushReq{upto: t.ring.Pushed(), reply: make(chan error, 1)}
	select {
	case t.flushes <- f:
	case <-t.done:
		return fmt.Errorf("rdma: flush on rank %d: proxy stopped: %w", t.rank, ErrClosed)
	case <-ctx.Done():
		return fmt.Errorf("rdma: flush on rank %d: %w", t.rank, context.Cause(ctx))
	}
	select {
	case t.wake <- struct{}{}:
	default:
	}
	// A flush to a lost peer may never complete (without peer error
	// handling nothing fails it): look for lost peers while waiting.
	tick := time.NewTicker(checkEvery)
	defer tick.Stop()
	all := make([]int, t.size)
	for i := range all {
		all[i] = i
	}
	for {
		select {
		case err := <-f.reply:
			return err
		case <-t.done:
			return fmt.Errorf("rdma: flush on rank %d: proxy stopped: %w", t.rank, ErrClosed)
		case <-tick.C:
			if err := t.lostError("flush", all); err != nil {
				return err
			}
		case <-ctx.Done():
			if err := t.lostError("flush", all); err != nil {
				return err
			}
			return fmt.Errorf("rdma: flush on rank %d: %w", t.rank, context.Cause(ctx))
		}
	}
}

// inflight is a request the proxy watches: of a put or signal to peer, or
// a worker flush answering reply.
type inflight struct {
	peer  int
	req   *ucx.Request
	reply chan error
}

// proxy is the host proxy: it takes descriptors from the ring, posts their
// puts and signals, answers flushes, progresses the worker (which TCP
// needs on the target side too), and watches for failed peers.
func (t *ucxTransport) proxy() {
	defer close(t.done)
	var reqs []inflight
	var flushes []flushReq
	nextCheck := time.Now().Add(checkEvery)
	delay := time.Microsecond
	for {
		busy := false
		for range 256 {
			w, ok := t.ring.TryPop()
			if !ok {
				break
			}
			busy = true
			if r := t.post(w); r.req != nil {
				reqs = append(reqs, r)
			}
		}
		if t.w.Progress() > 0 {
			busy = true
		}
		reqs = slices.DeleteFunc(reqs, t.reap)
	drain:
		for {
			select {
			case f := <-t.flushes:
				flushes = append(flushes, f)
			default:
				break drain
			}
		}
		flushes = slices.DeleteFunc(flushes, func(f flushReq) bool {
			if t.ring.Popped() < f.upto {
				return false
			}
			req, err := t.w.FlushNB()
			if err != nil || req == nil {
				f.reply <- t.flushResult(err)
			} else {
				reqs = append(reqs, inflight{peer: -1, req: req, reply: f.reply})
			}
			return true
		})
		if now := time.Now(); now.After(nextCheck) {
			t.check()
			nextCheck = now.Add(checkEvery)
		}
		select {
		case <-t.stop:
			for _, r := range reqs {
				if r.reply != nil {
					r.reply <- fmt.Errorf("rdma: flush on rank %d: %w", t.rank, ErrClosed)
				}
				r.req.Abandon()
			}
			for _, f := range flushes {
				f.reply <- fmt.Errorf("rdma: flush on rank %d: %w", t.rank, ErrClosed)
			}
			return
		default:
		}
		if busy || len(reqs) > 0 {
			delay = time.Microsecond
			runtime.Gosched()
			continue
		}
		// Idle: sleep until woken by a producer, with a bounded sleep so
		// that incoming TCP traffic is progressed.
		timer := time.NewTimer(delay)
		select {
		case <-t.wake:
		case <-t.stop:
		case <-timer.C:
		}
		timer.Stop()
		delay = min(2*delay, maxSleep)
	}
}

// post starts w's put and signal. Errors mark the peer lost or fail the
// transport; a descriptor to a lost peer is dropped.
func (t *ucxTransport) post(w Work) inflight {
	p := t.peers[w.Peer]
	if p.lost.Load() != nil {
		return inflight{}
	}
	if w.Epoch > 0 && w.Epoch <= p.sent {
		t.fail(fmt.Errorf("signal of epoch %d to rank %d after epoch %d: epochs must grow: %w", w.Epoch, w.Peer, p.sent, ErrInvalidWork))
		return inflight{}
	}
	if p.ep == nil {
		// This rank: a copy and a store.
		copy(t.recv[w.RemoteOff:w.RemoteOff+w.Bytes], t.send[w.LocalOff:w.LocalOff+w.Bytes])
		if w.Epoch > 0 {
			atomic.StoreUint64(t.signal(t.rank), w.Epoch)
			p.sent = w.Epoch
		}
		return inflight{}
	}
	var put *ucx.Request
	if w.Bytes > 0 {
		var err error
		put, err = p.ep.Put(t.send[w.LocalOff:w.LocalOff+w.Bytes], p.info.RecvAddr+uint64(w.RemoteOff), p.recvKey, t.sendMem)
		if err != nil {
			t.failed(w.Peer, err)
			return inflight{}
		}
	}
	if w.Epoch == 0 {
		return inflight{peer: w.Peer, req: put}
	}
	if w.Bytes > 0 {
		// The signal must not overtake the put.
		if err := t.w.Fence(); err != nil {
			t.fail(err)
			put.Abandon()
			return inflight{}
		}
		if put != nil {
			// The signal's request is the one watched; the put's completion
			// is implied by the flushes and the fence, and its failure
			// shows on the endpoint.
			put.Abandon()
		}
	}
	sig, err := p.ep.AtomicAdd(w.Epoch-p.sent, p.info.SigAddr+8*uint64(t.rank), p.sigKey)
	p.sent = w.Epoch
	if err != nil {
		t.failed(w.Peer, err)
		return inflight{}
	}
	return inflight{peer: w.Peer, req: sig}
}

// failed handles the error of an operation to peer: a peer failure (or an
// endpoint that reported one) loses the peer, anything else fails the
// transport.
func (t *ucxTransport) failed(peer int, err error) {
	if ucx.IsPeerFailure(err) || t.peers[peer].ep.Err() != nil {
		t.lose(peer, err.Error())
		return
	}
	t.fail(fmt.Errorf("to rank %d: %w", peer, err))
}

// reap reports whether r has completed, handling its result.
func (t *ucxTransport) reap(r inflight) bool {
	done, err := r.req.Test()
	if !done {
		return false
	}
	if r.reply != nil {
		r.reply <- t.flushResult(err)
	} else if err != nil {
		t.failed(r.peer, err)
	}
	return true
}

// flushResult is a worker flush's answer: its error, or the lost peers.
func (t *ucxTransport) flushResult(err error) error {
	t.check()
	all := make([]int, t.size)
	for i := range all {
		all[i] = i
	}
	if lerr := t.lostError("flush", all); lerr != nil {
		return lerr
	}
	if err != nil {
		return fmt.Errorf("rdma: flush on rank %d: %w", t.rank, err)
	}
	return t.err("flush")
}

// check looks for endpoints that UCX reported failed and for peers on
// this host whose process is gone.
func (t *ucxTransport) check() {
	for r, p := range t.peers {
		if p.ep == nil || p.lost.Load() != nil {
			continue
		}
		if err := p.ep.Err(); err != nil {
			t.lose(r, err.Error())
		} else if t.me.sameHost(p.info.Proc) && !p.info.Proc.alive() {
			t.lose(r, fmt.Sprintf("process %d exited", p.info.Proc.PID))
		}
	}
}

// Close flushes, waits until every peer has flushed (a barrier over the
// group, skipped when a peer is lost), stops the proxy, force-closes the
// endpoints (nothing is in flight any more) and frees everything. With
// SharedMemory and a lost peer, the UCX objects and regions are left to the
// process's exit (see free).
func (t *ucxTransport) Close() error {
	if t.closed.Load() {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), t.cfg.Timeout)
	defer cancel()
	var errs []error
	ferr := t.flush(ctx)
	t.closed.Store(true)
	all := make([]int, t.size)
	for i := range all {
		all[i] = i
	}
	if t.lostError("close", all) == nil {
		t.failMu.Lock()
		failed := t.failure != nil
		t.failMu.Unlock()
		// A failure of the transport was (or will be) reported by the call
		// that met it; Close reports what goes wrong in closing.
		if ferr != nil && !failed {
			errs = append(errs, fmt.Errorf("rdma: close on rank %d: %w", t.rank, ferr))
		}
		if err := t.g.Barrier(ctx); err != nil {
			errs = append(errs, fmt.Errorf("rdma: close on rank %d: barrier: %w", t.rank, err))
		}
	}
	errs = append(errs, t.free())
	return errors.Join(errs...)
}

// free stops the proxy and releases whatever exists, in reverse order of
// creation.
func (t *ucxTransport) free() error {
	t.closed.Store(true)
	select {
	case <-t.stop:
	default:
		close(t.stop)
	}
	<-t.done
	t.life.Lock()
	defer t.life.Unlock()
	var errs []error
	keep := func(err error) {
		if err != nil {
			errs = append(errs, err)
		}
	}
	// Over shared memory (no peer error handling) an endpoint to a dead
	// peer can be neither forced nor flushed closed, and UCX 1.13 aborts
	// the process when its worker is destroyed: after a lost peer, leave
	// UCX's objects and the regions it may use to the process's exit.
	leak := false
	for _, p := range t.peers {
		leak = leak || t.cfg.SharedMemory && p != nil && p.lost.Load() != nil
	}
	if !leak {
		for _, p := range t.peers {
			if p != nil && p.ep != nil {
				keep(p.ep.CloseForce())
			}
		}
		if t.w != nil {
			keep(t.w.Close())
		}
		for _, m := range []*ucx.MemHandle{t.sendMem, t.recvMem, t.sigMem} {
			if m != nil {
				keep(m.Close())
			}
		}
		if t.uctx != nil {
			keep(t.uctx.Close())
		}
		if t.send != nil {
			keep(unix.Munmap(t.send))
		}
	}
	t.send, t.recv, t.sig = nil, nil, nil
	if t.ring != nil {
		keep(t.ring.Close())
	}
	return errors.Join(errs...)
}
