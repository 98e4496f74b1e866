package executor

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/goep/goep/comm"
	"github.com/goep/goep/device"
	"github.com/goep/goep/nvlink"
	"github.com/goep/goep/permute"
	"github.com/goep/goep/rdma"
)

// The hierarchical algorithm (D < R, DESIGN.md sections 2 and 4). Rank r is
// (domain n = r / D, local index j = r % D); its rail is the ranks with
// local index j in every domain, one per domain, joined by an
// rdma.Transport. Within a domain everything is the one-domain algorithm
// (an nvlink exchange in which ranks pull from each other); across domains
// only the rail moves bytes:
//
//   - Layout and dispatch: each rank puts, to each rail peer, the rows (or
//     routing) of its tokens that reach the peer's domain, once per token
//     and domain; the peer copies them into its forwarding buffer, and in
//     the domain exchange every rank pulls a row from its source (same
//     domain) or from the forwarder with the source's local index.
//   - Combine: in the domain exchange each rank sums, for every token of
//     its rail peers that reached this domain, the rows of this domain's
//     ranks (fp32, ascending rank order) and rounds the partial to the
//     dtype; the partials go back over the rail, and each source adds the
//     partials of the domains its token reached in ascending domain order,
//     its own domain's unrounded.
//
// Rail rounds are numbered by a per-engine epoch that every rank advances
// in the same call order. A rank that fails in one half of a call (its own
// input, a peer's report) still takes part in the other half, publishing
// the failure, so every rank of every domain fails the call instead of
// waiting: dispatch-like calls run the rail round first, combine-like ones
// the domain exchange first, and every domain holds a rank of every rail.
// This holds for fatal failures too (a lost peer, a timeout): the other
// half still runs, publishing it, so a dead rank is named by every rank
// at the speed its death is detected, not at the deadline.

// hierarchy is the inter-domain state of an engine with D < R.
type hierarchy struct {
	D, M, domain, local int
	domG, railG         comm.Group
	rail                rdma.Transport
	s                   device.Stream // owns fwd
	// fwd is the forwarding buffer, exposed in domain exchanges: slot n
	// holds what the rail peer in domain n sent in the last rail round.
	fwd *device.Buffer
	// Slot geometry, shared by the send region (one slot per domain), the
	// receive region (two parities of one slot per domain) and fwd.
	slot, area int // bytes of a slot; bytes of its weights/routing area
	epoch      uint64
	// partial is the fp32 partial sums of this rank's tokens over its own
	// domain in combine, [T*H] fp32, reused across calls.
	partial []byte
	// staging is GOEP_RAIL_HOST_STAGING (read by New with the other
	// variables): the CUDA backend stages the rail through host copies
	// instead of feeding it from the GPU.
	staging bool
	// hostPost, when set (the CUDA backend's GPU-fed rail), runs before
	// this rank's slots of a round are put from the host: it waits until
	// no queued GPU copy still reads the receive region, which the peers
	// may write again once they see this round's signal.
	hostPost func(ctx context.Context) error
}

// recvSlotOff is the offset in the receive region of the slot that the
// rail peer in domain n filled in the last round.
func (h *hierarchy) recvSlotOff(n int) int { return (int(h.epoch%2)*h.M + n) * h.slot }

// Rail slot: a header, an area of MaxTokensPerRank*TopK 4-byte values
// (routing in the layout, weights in dispatch, weight gradients in
// combine), then MaxTokensPerRank rows of up to Hidden fp32 elements.
const (
	railHeader = 256
	railMsgMax = railHeader - 8*8
)

// railHead is the decoded header of a rail slot.
type railHead struct {
	op     uint64
	sig    [3]uint64
	status uint64 // nvlink.StatusOK, StatusInvalid or StatusFailed
	count  int    // rows (tokens in the layout) in the slot
	msg    string
	// dev: the sender's GPU waits of this call failed (a GPU-fed header,
	// goep_ep_rail_post); msg holds their codes, one byte per rank of the
	// sender's domain (waitError decodes them), and status is not set.
	dev bool
}

func putRailHead(b []byte, h railHead) {
	le := binary.LittleEndian
	le.PutUint64(b[0:], h.op)
	for i, v := range h.sig {
		le.PutUint64(b[8+8*i:], v)
	}
	le.PutUint64(b[32:], h.status)
	le.PutUint64(b[40:], uint64(h.count))
	n := copy(b[64:railHeader], h.msg)
	le.PutUint64(b[48:], uint64(n))
	dev := uint64(0)
	if h.dev {
		dev = 1
	}
	le.PutUint64(b[56:], dev)
}

func getRailHead(b []byte) railHead {
	le := binary.LittleEndian
	h := railHead{op: le.Uint64(b[0:]), status: le.Uint64(b[32:]), count: int(le.Uint64(b[40:])), dev: le.Uint64(b[56:]) != 0}
	for i := range h.sig {
		h.sig[i] = le.Uint64(b[8+8*i:])
	}
	// A length beyond the message area (or a negative count) is a
	// corrupt header; the count is checked by railRound.
	n := min(le.Uint64(b[48:]), railMsgMax)
	h.msg = string(b[64 : 64+n])
	return h
}

// newHierarchy splits g into this rank's domain and rail, creates the rail
// transport and the forwarding buffer, and joins the domain exchange. It
// returns the domain (which replaces the engine's one-domain exchange).
// shm is GOEP_RDMA_SHARED_MEMORY (read by New before the ranks compare
// their configs, so that a bad value fails every rank at once).
func newHierarchy(ctx context.Context, g comm.Group, s device.Stream, cfg Config, shm bool) (*hierarchy, *nvlink.Domain, error) {
	R, rank, D := g.Size(), g.Rank(), cfg.RanksPerDomain
	h := &hierarchy{D: D, M: R / D, domain: rank / D, local: rank % D, s: s}
	h.area = cfg.MaxTokensPerRank * cfg.TopK * 4
	h.slot = railHeader + h.area + cfg.MaxTokensPerRank*cfg.Hidden*4
	var dom *nvlink.Domain
	fail := func(err error) (*hierarchy, *nvlink.Domain, error) {
		return nil, nil, errors.Join(err, h.close(dom))
	}
	var err error
	if h.domG, err = g.Split(ctx, h.domain, rank); err != nil {
		return fail(fmt.Errorf("split domain %d: %w", h.domain, err))
	}
	if h.railG, err = g.Split(ctx, h.local, rank); err != nil {
		return fail(fmt.Errorf("split rail %d: %w", h.local, err))
	}
	global := make([]int, D)
	for i := range global {
		global[i] = h.domain*D + i
	}
	if dom, err = nvlink.New(ctx, h.domG, s, global, cfg.Timeout); err != nil {
		return fail(err)
	}
	h.rail, err = rdma.New(ctx, h.railG, rdma.Config{
		SendBytes: h.M * h.slot, RecvBytes: 2 * h.M * h.slot, Timeout: cfg.Timeout, SharedMemory: shm,
	})
	if err != nil {
		err = fmt.Errorf("rail %d: %w", h.local, err)
	} else if h.fwd, err = s.Alloc(h.M * h.slot); err != nil {
		err = fmt.Errorf("forwarding buffer: %w", err)
	}
	// The rails are made independently; every rank of the group learns
	// whether all succeeded before any returns, so that a rank that fails
	// (and exits, closing its end of the bootstrap) cannot leave another
	// with a "group closed" instead of the cause.
	if err = agree(ctx, g, err); err != nil {
		return fail(err)
	}
	return h, dom, nil
}

// agree all-gathers every rank's outcome over g and returns the first
// failure (this rank's own first), wrapping the sentinels of this rank's
// error; nil when every rank succeeded.
func agree(ctx context.Context, g comm.Group, mine error) error {
	st := []byte{0}
	if mine != nil {
		st = append([]byte{1}, mine.Error()...)
	}
	all, err := g.AllGather(ctx, st)
	if err != nil {
		return errors.Join(mine, fmt.Errorf("exchange setup results: %w", err))
	}
	if mine != nil {
		return mine
	}
	for r, b := range all {
		if len(b) > 0 && b[0] == 1 {
			return fmt.Errorf("rank %d: %s", r, b[1:])
		}
	}
	return nil
}

// boolEnv reads a boolean GOEP_* variable (unset: false).
func boolEnv(name string) (bool, error) {
	v, ok := os.LookupEnv(name)
	if !ok || v == "" {
		return false, nil
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		return false, fmt.Errorf("executor: %s=%q: want a boolean (1, 0, true, false)", name, v)
	}
	return b, nil
}

// close frees what newHierarchy made (after the engine's closing barrier:
// Close of the transport is collective over the rail).
func (h *hierarchy) close(dom *nvlink.Domain) error {
	var errs []error
	if h.rail != nil {
		errs = append(errs, h.rail.Close())
	}
	if dom != nil {
		dom.Close()
	}
	if h.fwd != nil {
		h.s.Free(h.fwd)
	}
	for _, g := range []comm.Group{h.domG, h.railG} {
		if g != nil {
			errs = append(errs, g.Close())
		}
	}
	return errors.Join(errs...)
}

// global is the global rank of the rail peer in domain n.
func (h *hierarchy) global(n int) int { return n*h.D + h.local }

// railErr rewrites a transport error's rail ranks (domain indices) as
// global ranks.
func (h *hierarchy) railErr(err error) error {
	var te *comm.TimeoutError
	var pe *comm.PeerLostError
	switch {
	case errors.As(err, &te):
		g := &comm.TimeoutError{Op: "rail of local index " + strconv.Itoa(h.local) + ": " + te.Op}
		for _, n := range te.Missing {
			g.Missing = append(g.Missing, h.global(n))
		}
		return g
	case errors.As(err, &pe):
		g := &comm.PeerLostError{Op: "rail of local index " + strconv.Itoa(h.local) + ": " + pe.Op, Cause: pe.Cause}
		for _, n := range pe.Ranks {
			g.Ranks = append(g.Ranks, h.global(n))
		}
		return g
	}
	return err
}

// railRound runs one rail round at a new epoch. fill writes this rank's
// payload for the peer in domain n (area and rows parts of its send slot,
// after the header) and returns the counts: header count, area bytes, row
// bytes. With status set, no payload goes, only the failure. Once every
// peer has signalled, the peers' headers are checked (a reported failure,
// a different operation) and recv(n) returns the peer in domain n's slot
// until the next round. An error after the puts still leaves the round
// complete on every rank (all signals sent and waited for), unless it is
// fatal (a timeout or a lost peer).
func (e *Engine) railRound(op uint64, sg [4]uint64, status error, fill func(n int, area, rows []byte) (count, areaBytes, rowBytes int)) (recv func(n int) []byte, err error) {
	return e.railExchange(op, sg, status, fill, nil)
}

// railSender posts this rank's slots of rail round ep from the device
// (the CUDA backend's GPU-fed rail, hier_cuda.go): it writes the headers,
// enqueues the kernels that store the payload into the send region and
// the descriptors into the rail's feed, and returns the feed's drain, which
// the round calls before its flush. An error means nothing was posted:
// the round then sends the failure instead.
type railSender func(ctx context.Context, ep uint64, parity int) (drain func(context.Context) error, err error)

// railExchange is railRound, with this rank's slots posted by send when it
// is not nil and status is nil.
func (e *Engine) railExchange(op uint64, sg [4]uint64, status error, fill func(n int, area, rows []byte) (count, areaBytes, rowBytes int), send railSender) (recv func(n int) []byte, err error) {
	h := e.hier
	h.epoch++
	ep := h.epoch
	// A combine-like call's round follows its domain exchange, whose
	// failure (a GPU wait's timeout) can take the timeout to show: the
	// round waits twice as long, so that the failure's report, not this
	// rank's silence, reaches the rail peers.
	timeout := e.cfg.Timeout
	if !dispatchLike(op) {
		timeout *= 2
	}
	base, lost := context.WithCancelCause(context.Background())
	defer lost(nil)
	ctx, cancel := context.WithTimeout(base, timeout)
	defer cancel()
	if dispatchLike(op) {
		defer e.watchDomain(lost)()
	}
	parity := int(ep % 2)
	var peers []int
	for n := range h.M {
		if n != h.domain {
			peers = append(peers, n)
		}
	}
	var drain func(context.Context) error
	if status == nil && send != nil {
		drain, status = send(ctx, ep, parity)
	}
	if drain == nil {
		if h.hostPost != nil {
			if err := h.hostPost(ctx); err != nil {
				// Copies may still read the receive region that this
				// round's signal lets peers overwrite: the failure is
				// posted, and this engine takes no more calls.
				e.failed.CompareAndSwap(nil, &err)
				status = errors.Join(status, err)
			}
		}
		if err := e.railPost(ctx, ep, parity, op, sg, status, fill); err != nil {
			return nil, err
		}
	}
	if err := h.rail.WaitAll(ctx, peers, ep); err != nil {
		return nil, e.railFatal(err)
	}
	if drain != nil {
		if err := drain(ctx); err != nil {
			return nil, e.railFatal(err)
		}
	}
	if err := h.rail.Flush(ctx); err != nil {
		return nil, e.railFatal(err)
	}
	rbuf := h.rail.RecvBuffer()
	recv = func(n int) []byte {
		o := h.recvSlotOff(n)
		return rbuf[o : o+h.slot]
	}
	if status != nil {
		return recv, status
	}
	for _, n := range peers {
		ph := getRailHead(recv(n))
		if ph.dev {
			// The peer's GPU waits failed: the cause as the peer names it.
			derr := waitError([]byte(ph.msg), h.global(n)-h.local)
			ph.status, ph.msg = nvlink.StatusOf(derr), derr.Error()
		}
		switch ph.status {
		case nvlink.StatusOK:
		case nvlink.StatusFailed:
			return recv, e.railFatal(&nvlink.PeerError{Rank: h.global(n), Status: ph.status, Msg: ph.msg})
		case nvlink.StatusMismatch:
			return recv, fmt.Errorf("executor: rail: %w", &nvlink.PeerError{Rank: h.global(n), Status: ph.status, Msg: ph.msg})
		default:
			return recv, fmt.Errorf("executor: rail: %w: %w", &nvlink.PeerError{Rank: h.global(n), Status: ph.status, Msg: ph.msg}, ErrInvalidInput)
		}
	}
	for _, n := range peers {
		ph := getRailHead(recv(n))
		if ph.op != op || ph.sig != [3]uint64{sg[0], sg[1], sg[2]} {
			return recv, fmt.Errorf("executor: rail: rank %d runs operation %s %v, rank %d runs %s %v: %w",
				e.rank, opNames[op], sg[:3], h.global(n), opNames[ph.op], ph.sig, ErrPeerMismatch)
		}
		// A slot holds at most MaxTokensPerRank tokens or rows.
		if ph.count < 0 || ph.count > e.cfg.MaxTokensPerRank {
			return recv, fmt.Errorf("executor: rail: rank %d sent a slot of %d rows, outside [0, MaxTokensPerRank %d]: %w",
				h.global(n), ph.count, e.cfg.MaxTokensPerRank, ErrPeerMismatch)
		}
	}
	return recv, nil
}

// railPost puts this rank's slots of rail round ep from the host: for
// every other domain n, the header (the failure when status is set, else
// fill's payload counts), then the payload, the last put carrying the
// signal.
func (e *Engine) railPost(ctx context.Context, ep uint64, parity int, op uint64, sg [4]uint64, status error, fill func(n int, area, rows []byte) (count, areaBytes, rowBytes int)) error {
	h := e.hier
	send := h.rail.SendBuffer()
	for n := range h.M {
		if n == h.domain {
			continue
		}
		s := send[n*h.slot : (n+1)*h.slot]
		head := railHead{op: op, sig: [3]uint64{sg[0], sg[1], sg[2]}}
		ab, rb := 0, 0
		if status != nil {
			head.status, head.msg = nvlink.StatusOf(status), status.Error()
		} else {
			head.count, ab, rb = fill(n, s[railHeader:railHeader+h.area], s[railHeader+h.area:])
		}
		putRailHead(s, head)
		remote := (parity*h.M + h.domain) * h.slot
		first := rdma.Work{Peer: n, LocalOff: n * h.slot, RemoteOff: remote, Bytes: railHeader + ab, Epoch: ep}
		if rb > 0 {
			first.Epoch = 0
		}
		if err := h.rail.Put(ctx, first); err != nil {
			return e.railFatal(err)
		}
		if rb > 0 {
			off := railHeader + h.area
			w := rdma.Work{Peer: n, LocalOff: n*h.slot + off, RemoteOff: remote + off, Bytes: rb, Epoch: ep}
			if err := h.rail.Put(ctx, w); err != nil {
				return e.railFatal(err)
			}
		}
	}
	return nil
}

// railFatal records a transport failure (timeout, lost peer) as fatal.
func (e *Engine) railFatal(err error) error {
	var dl *domainLost
	if errors.As(err, &dl) {
		err = dl.err // global ranks already
	} else {
		err = e.hier.railErr(err)
	}
	err = fmt.Errorf("executor: rail round %d: %w", e.hier.epoch, err)
	if fatal(err) {
		e.failed.CompareAndSwap(nil, &err)
	}
	return err
}

// domainLost is the cause with which watchDomain ends a rail round's
// waits: the loss of a member of this rank's domain (err names it by
// global rank).
type domainLost struct{ err error }

func (d *domainLost) Error() string { return d.err.Error() }
func (d *domainLost) Unwrap() error { return d.err }

// watchDomain looks at the processes of this rank's domain peers every
// 20 ms until the returned stop is called, and cancels a rail round's
// waits (cancel, with a *domainLost) when one has exited. A rank waiting
// for its rail peer may otherwise wait out the whole timeout for a peer
// that stopped at that loss: when a rank dies after finishing its part of
// a call with its domain, the ranks of the other domain fail the call
// (their rail round with it fails) while its domain peer completes it and
// waits in the next call's rail round for a rail peer that has stopped
// (TestMultiProcessDomainsKill). A dispatch-like call needs its domain
// after its round, so the round fails at once, naming the lost rank. A
// combine-like call's round is not watched: its domain half is done, and a
// domain peer may have finished the call and exited while this rank waits
// for a late rail peer (TestMultiProcessDomainsLate).
func (e *Engine) watchDomain(cancel context.CancelCauseFunc) (stop func()) {
	if e.domain == nil {
		return func() {}
	}
	done := make(chan struct{})
	go func() {
		t := time.NewTicker(20 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				if err := e.domain.LostPeers(); err != nil {
					cancel(&domainLost{err: err})
					return
				}
			}
		}
	}()
	return func() { close(done) }
}

// dispatchLike reports whether op runs its rail round before its domain
// exchange (rows or routing flow towards the destinations).
func dispatchLike(op uint64) bool {
	return op == opLayout || op == opDispatch || op == opDispatchPermute
}

// hierReject is reject's task with several domains: both halves of the
// call, publishing cause.
func (e *Engine) hierReject(op uint64, cause error) {
	if dispatchLike(op) {
		_, _ = e.railRound(op, [4]uint64{}, cause, nil)
		_ = e.domain.Exchange(nvlink.Call{Op: op, Status: cause}, nil)
		return
	}
	_ = e.domain.Exchange(nvlink.Call{Op: op, Status: cause}, nil)
	_, _ = e.railRound(op, [4]uint64{}, cause, nil)
}

// hierLayout is the layout's task with several domains (host backend).
func (e *Engine) hierLayout(h *Handle, idx *device.Tensor, sg [4]uint64) error {
	return e.hierRouting(idx, sg, func(routing [][]int32) error {
		lay, err := ComputeLayout(e.rank, e.cfg, routing)
		if err != nil {
			return err
		}
		h.lay = lay
		return e.finishLayout(h)
	})
}

// hierRouting gathers every rank's routing with several domains: idx (a
// host tensor) crosses the rail, is forwarded, and fn gets every rank's
// routing inside the domain exchange (it must copy what it keeps).
func (e *Engine) hierRouting(idx *device.Tensor, sg [4]uint64, fn func(routing [][]int32) error) error {
	hr := e.hier
	mine := idx.Bytes()
	recv, rerr := e.railRound(opLayout, sg, nil, func(n int, area, rows []byte) (int, int, int) {
		return idx.Rows(), copy(area, mine), 0
	})
	if rerr == nil {
		hr.forward(recv, func(n int) int { return getRailHead(recv(n)).count * e.cfg.TopK * 4 }, nil)
	}
	c := nvlink.Call{Op: opLayout, Sig: sg, Status: rerr, Buffers: []*device.Buffer{idx.Buffer(), hr.fwd}}
	err := e.exchange(c, func(peers [][]*device.Buffer) error {
		routing := make([][]int32, e.size)
		for r := range routing {
			p := peers[r%hr.D]
			if r/hr.D == hr.domain {
				routing[r] = int32s(p[0].Host())
				continue
			}
			s := p[1].Host()[r/hr.D*hr.slot:]
			T := getRailHead(s).count
			routing[r] = int32s(s[railHeader : railHeader+T*e.cfg.TopK*4])
		}
		return fn(routing)
	})
	if rerr != nil {
		return rerr
	}
	return err
}

// forward copies every rail peer's slot of the last round (header, the
// first areaBytes(n) of the area and rowBytes(n) of rows) into the
// forwarding buffer.
func (h *hierarchy) forward(recv func(n int) []byte, areaBytes, rowBytes func(n int) int) {
	fwd := h.fwd.Host()
	for n := range h.M {
		if n == h.domain {
			continue
		}
		src, dst := recv(n), fwd[n*h.slot:(n+1)*h.slot]
		copy(dst[:railHeader+areaBytes(n)], src)
		if rowBytes != nil {
			o := railHeader + h.area
			copy(dst[o:o+rowBytes(n)], src[o:])
		}
	}
}

// hierPull is the dispatch side with several domains: this rank's rows
// cross the rail once per token and domain, are forwarded, and fn gets the
// source of every valid received row from the domain exchange.
func (e *Engine) hierPull(lay *Layout, c nvlink.Call, x, w *device.Tensor, fn func(src []recvSrc) error) error {
	hr, K := e.hier, e.cfg.TopK
	rb := rowBytes(x)
	xs, ws, weighted := x.Bytes(), f32(w), w != nil // ws is empty when T = 0
	recv, rerr := e.railRound(c.Op, c.Sig, nil, e.dispatchFill(lay, xs, ws, weighted, rb))
	if rerr == nil {
		// The rows each peer sends here are known from its send side.
		count := make([]int, hr.M)
		for n := range hr.M {
			if n == hr.domain {
				continue
			}
			count[n] = len(lay.Rail[n].DomainTokens(nil, hr.domain, hr.D))
			if got := getRailHead(recv(n)).count; got != count[n] {
				rerr = fmt.Errorf("executor: rail: rank %d sent %d rows to domain %d, its layout says %d: %w", hr.global(n), got, hr.domain, count[n], ErrPeerMismatch)
			}
		}
		if rerr == nil {
			ab := func(n int) int {
				if !weighted {
					return 0
				}
				return count[n] * K * 4
			}
			hr.forward(recv, ab, func(n int) int { return count[n] * rb })
		}
	}
	c.Status = rerr
	c.Buffers = append(c.Buffers, hr.fwd)
	err := e.exchange(c, func(peers [][]*device.Buffer) error {
		return fn(e.sources(lay, peers, rb, w != nil))
	})
	if rerr != nil {
		return rerr
	}
	return err
}

// hierCombine is the combine side with several domains (Combine,
// DispatchBackward, UnpermuteCombine): partials over this domain for the
// rail peers' tokens and this rank's own, the rail round, then the sum over
// domains. gwt (weight gradients, DispatchBackward) may be nil.
func (e *Engine) hierCombine(lay *Layout, c nvlink.Call, dt device.DType, out []byte, gwt *device.Tensor, u *unpermuteSpec) error {
	hr, K, H := e.hier, e.cfg.TopK, e.cfg.Hidden
	rb := H * dt.Size()
	T := lay.NumTokens
	if need := T * H * 4; len(hr.partial) < need {
		hr.partial = make([]byte, need)
	}
	partial := hr.partial[:T*H*4]
	own := make([]bool, T)
	send := hr.rail.SendBuffer()
	sizes := make([][3]int, hr.M)
	gw, weighted := f32(gwt), gwt != nil // gw is empty when T = 0
	err := e.exchange(c, func(peers [][]*device.Buffer) error {
		newTermer := func() *termer { return e.newTermer(lay, peers, dt, u) }
		// Partials of the rail peers' tokens, rounded to the dtype, into
		// the send slots.
		for n := range hr.M {
			if n == hr.domain {
				continue
			}
			side := lay.Rail[n]
			toks := side.DomainTokens(nil, hr.domain, hr.D)
			s := send[n*hr.slot:]
			area, rows := f32s(s[railHeader:railHeader+hr.area]), s[railHeader+hr.area:]
			device.ForScratch(e.par(), len(toks), 16, newTermer, func(c *termer, lo, hi int) {
				for i := lo; i < hi; i++ {
					t := int(toks[i])
					permute.SumRows(dt, rows[i*rb:(i+1)*rb], c.collect(side, t, hr.domain), nil)
					if weighted {
						for k := range K {
							area[i*K+k] = e.slotGrad(lay, side, t, k, hr.domain, peers)
						}
					}
				}
			})
			sizes[n] = [3]int{len(toks), 0, len(toks) * rb}
			if weighted {
				sizes[n][1] = len(toks) * K * 4
			}
		}
		// This rank's own partials (fp32, not rounded) and the weight
		// gradients of slots in this domain.
		pf := f32s(partial)
		device.ForScratch(e.par(), T, 16, newTermer, func(c *termer, lo, hi int) {
			for t := lo; t < hi; t++ {
				terms := c.collect(&lay.SendSide, t, hr.domain)
				own[t] = len(terms) > 0
				acc := pf[t*H : (t+1)*H]
				for i, row := range terms {
					permute.Accumulate(dt, acc, row, 1, i == 0)
				}
				if weighted {
					for k := range K {
						gw[t*K+k] = e.slotGrad(lay, &lay.SendSide, t, k, hr.domain, peers)
					}
				}
			}
		})
		return nil
	})
	// Even after a failure (fatal included) the rail round runs, carrying
	// it, so that the rail peers fail this call too instead of waiting.
	recv, rerr := e.railRound(c.Op, c.Sig, err, func(n int, _, _ []byte) (int, int, int) {
		return sizes[n][0], sizes[n][1], sizes[n][2]
	})
	if err != nil {
		return err
	}
	if rerr != nil {
		return rerr
	}
	// Sum over domains, ascending: this domain's fp32 partial, the others'
	// rounded ones from the rail.
	remote := make([]int32, hr.M*T) // index of token t in domain n's slot, -1 if t did not go there
	for i := range remote {
		remote[i] = -1
	}
	for n := range hr.M {
		if n == hr.domain {
			continue
		}
		for i, t := range lay.DomainTokens(nil, n, hr.D) {
			remote[n*T+int(t)] = int32(i)
		}
	}
	newAcc := func() []float32 { return make([]float32, H) }
	device.ForScratch(e.par(), T, 16, newAcc, func(acc []float32, lo, hi int) {
		for t := lo; t < hi; t++ {
			first := true
			for n := range hr.M {
				var row []byte
				rowDT := dt
				switch i := remote[n*T+t]; {
				case n == hr.domain && own[t]:
					row, rowDT = partial[t*H*4:(t+1)*H*4], device.FP32
				case n != hr.domain && i >= 0 && e.reaches(lay, &lay.SendSide, t, n):
					row = recv(n)[railHeader+hr.area+int(i)*rb:][:rb]
				default:
					continue
				}
				permute.Accumulate(rowDT, acc, row, 1, first)
				first = false
			}
			if first {
				clear(out[t*rb : (t+1)*rb]) // routed nowhere
			} else {
				permute.Store(dt, out[t*rb:(t+1)*rb], acc)
			}
			if !weighted {
				continue
			}
			for k := range K {
				ex := int(lay.SlotExpert[t*K+k])
				if ex < 0 {
					gw[t*K+k] = 0
					continue
				}
				if n := ex / lay.NumLocalExperts / hr.D; n != hr.domain {
					gw[t*K+k] = f32s(recv(n)[railHeader : railHeader+hr.area])[int(remote[n*T+t])*K+k]
				}
			}
		}
	})
	return nil
}

// slotGrad is the weight gradient of slot k of token t of side when the
// slot's expert lives in domain n: the owner's GradRecvWeights (peer
// buffer 1) at the token's row, 0 if the row was dropped there (capacity
// mode); 0 for an empty slot or another domain.
func (e *Engine) slotGrad(lay *Layout, side *SendSide, t, k, n int, peers [][]*device.Buffer) float32 {
	K, D := lay.TopK, lay.RanksPerDomain
	ex, row := int(side.SlotExpert[t*K+k]), int(side.SlotRow[t*K+k])
	if ex < 0 {
		return 0
	}
	d := ex / lay.NumLocalExperts
	if d/D != n || row >= e.validRecv(lay, d) {
		return 0
	}
	return f32s(peers[d%D][1].Host())[row*K+k]
}

// reaches reports whether token t of side has a valid row (not dropped) on
// some rank of domain n.
func (e *Engine) reaches(lay *Layout, side *SendSide, t, n int) bool {
	return reachesValid(lay, side, t, n, func(d int) int { return e.validRecv(lay, d) })
}

func f32s(b []byte) []float32 { return permute.Float32s(b) }
func int32s(b []byte) []int32 { return permute.Int32s(b) }

// partialsFill is the rail round's payload of a combine on the CUDA
// backend's host-staged path: for each other domain n, the partials of the
// counts[n] tokens its rail peer forwarded here (rows n*maxT.. of ps, rb
// bytes each) and, when pws is not nil, their weight gradients (K fp32
// each).
func partialsFill(counts []int, ps, pws []byte, maxT, K, rb int) func(n int, area, rows []byte) (int, int, int) {
	return func(n int, area, rows []byte) (int, int, int) {
		cnt := counts[n]
		copy(rows[:cnt*rb], ps[n*maxT*rb:])
		ab := 0
		if pws != nil {
			ab = copy(area[:cnt*K*4], pws[n*maxT*K*4:])
		}
		return cnt, ab, cnt * rb
	}
}

// dispatchFill is the rail round's payload of a dispatch: for each other
// domain, the rows (and weights) of this rank's tokens that reach it.
func (e *Engine) dispatchFill(lay *Layout, xs []byte, ws []float32, weighted bool, rb int) func(n int, area, rows []byte) (int, int, int) {
	K, D := e.cfg.TopK, lay.RanksPerDomain
	return func(n int, area, rows []byte) (int, int, int) {
		toks := lay.DomainTokens(nil, n, D)
		a := f32s(area)
		for i, t := range toks {
			copy(rows[i*rb:(i+1)*rb], xs[int(t)*rb:])
			if weighted {
				copy(a[i*K:(i+1)*K], ws[int(t)*K:])
			}
		}
		ab := 0
		if weighted {
			ab = len(toks) * K * 4
		}
		return len(toks), ab, len(toks) * rb
	}
}
