// Package rail is the inter-domain half of the hierarchical algorithm (D <
// R, DESIGN.md sections 2 and 4), shared by the host and GPU data paths.
// Rank r is (domain n = r / D, local index j = r % D); its rail is the
// ranks with local index j in every domain, one per domain, joined by an
// rdma.Transport. Within a domain a data path runs its one-domain
// algorithm over the domain's nvlink exchange; across domains only the
// rail moves bytes, in rounds:
//
//   - Layout and dispatch: each rank puts, to each rail peer, the routing
//     or rows of its tokens that reach the peer's domain, once per token
//     and domain; the peer forwards them within its domain.
//   - Combine: each rank sums, for every token of its rail peers that
//     reached its domain, the rows of its domain's ranks (fp32, ascending
//     rank order) and rounds the partial to the dtype; the partials go
//     back over the rail, and each source adds the partials of the domains
//     its token reached in ascending domain order, its own domain's
//     unrounded.
//
// Rounds are numbered by a per-engine epoch that every rank advances in
// the same call order. A rank that fails in one half of a call (its own
// input, a peer's report) still takes part in the other half, publishing
// the failure, so every rank of every domain fails the call instead of
// waiting: dispatch-like calls run the rail round first, combine-like ones
// the domain exchange first, and every domain holds a rank of every rail.
// This holds for fatal failures too (a lost peer, a timeout): the other
// half still runs, publishing it, so a dead rank is named by every rank
// at the speed its death is detected, not at the deadline.
package rail

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/goep/goep/comm"
	"github.com/goep/goep/device"
	"github.com/goep/goep/executor/internal/datapath"
	"github.com/goep/goep/executor/internal/plan"
	"github.com/goep/goep/nvlink"
	"github.com/goep/goep/rdma"
)

// Rail is a rank's place in the hierarchy: its domain's exchange, its
// rail's transport, and the forwarding buffer.
type Rail struct {
	env *datapath.Env
	// D ranks per domain, M domains; this rank is local index Local of
	// domain Domain.
	D, M, Domain, Local int
	// DomainGroup and RailGroup are the groups of this rank's domain and
	// rail.
	DomainGroup, RailGroup comm.Group
	// Dom is this rank's domain's exchange.
	Dom       *nvlink.Domain
	Transport rdma.Transport
	s         device.Stream // owns Fwd
	// Fwd is the forwarding buffer, exposed in domain exchanges: slot n
	// holds what the rail peer in domain n sent in the last rail round.
	Fwd *device.Buffer
	// Slot geometry, shared by the send region (one slot per domain), the
	// receive region (two parities of one slot per domain) and Fwd: Slot
	// bytes a slot, Area bytes its weights/routing area.
	Slot, Area int
	epoch      uint64
	// HostPost, when set (the GPU-fed rail), runs before this rank's slots
	// of a round are put from the host: it waits until no queued GPU copy
	// still reads the receive region, which the peers may write again once
	// they see this round's signal.
	HostPost func(ctx context.Context) error
	// CombineSlack is how much longer than the timeout a combine-like
	// round waits: nvlink.RelayMargin by default; the GPU-fed rail sets
	// the whole timeout, since a peer's header goes out only when its
	// stream reaches it, behind its own GPU waits and queued work.
	CombineSlack time.Duration
}

// Rail slot: a header, an area of MaxTokensPerRank*TopK 4-byte values
// (routing in the layout, weights in dispatch, weight gradients in
// combine), then MaxTokensPerRank rows of up to Hidden fp32 elements.
//
// A header is eight words (op, sig[3], status, count, message length,
// device flag), the message (MsgMax bytes from byte 64), then the number
// of ranks a fatal status names and those ranks (int32, up to
// nvlink.MaxNamed).
const (
	Header   = plan.RailHeader
	MsgMax   = 448                                       // bytes of a header's message
	namedOff = 64 + MsgMax                               // the named ranks' count (uint64), then the ranks
	_        = Header - namedOff - 8 - 4*nvlink.MaxNamed // the names fit (a negative constant fails to compile)
)

// Head is the decoded header of a rail slot.
type Head struct {
	Op     uint64
	Sig    [3]uint64
	Status uint64 // nvlink.StatusOK, or a failure's (nvlink.StatusOf)
	Count  int    // rows (tokens in the layout) in the slot
	Msg    string
	// Ranks are the ranks a fatal status names (nvlink.Named).
	Ranks []int
	// Dev: the sender's GPU waits of this call failed (a GPU-fed header,
	// goep_ep_rail_post); Msg holds their codes, one byte per rank of the
	// sender's domain (nvlink.WaitError decodes them), and Status is not
	// set.
	Dev bool
}

// PutHead writes h at the start of slot b.
func PutHead(b []byte, h Head) {
	le := binary.LittleEndian
	le.PutUint64(b[0:], h.Op)
	for i, v := range h.Sig {
		le.PutUint64(b[8+8*i:], v)
	}
	le.PutUint64(b[32:], h.Status)
	le.PutUint64(b[40:], uint64(h.Count))
	n := copy(b[64:64+MsgMax], h.Msg)
	le.PutUint64(b[48:], uint64(n))
	dev := uint64(0)
	if h.Dev {
		dev = 1
	}
	le.PutUint64(b[56:], dev)
	named := h.Ranks[:min(len(h.Ranks), nvlink.MaxNamed)]
	le.PutUint64(b[namedOff:], uint64(len(named)))
	for i, r := range named {
		le.PutUint32(b[namedOff+8+4*i:], uint32(int32(r)))
	}
}

// GetHead reads the header at the start of slot b.
func GetHead(b []byte) Head {
	le := binary.LittleEndian
	h := Head{Op: le.Uint64(b[0:]), Status: le.Uint64(b[32:]), Count: int(le.Uint64(b[40:])), Dev: le.Uint64(b[56:]) != 0}
	for i := range h.Sig {
		h.Sig[i] = le.Uint64(b[8+8*i:])
	}
	// A length beyond the message area (or a negative count) is a
	// corrupt header; the count is checked by the round.
	n := min(le.Uint64(b[48:]), MsgMax)
	h.Msg = string(b[64 : 64+n])
	for i := range min(le.Uint64(b[namedOff:]), nvlink.MaxNamed) {
		h.Ranks = append(h.Ranks, int(int32(le.Uint32(b[namedOff+8+4*int(i):]))))
	}
	return h
}

// New splits g into this rank's domain and rail, joins the domain's
// exchange on s, creates the rail transport and the forwarding buffer
// (collective over g). shm is GOEP_RDMA_SHARED_MEMORY.
func New(ctx context.Context, g comm.Group, s device.Stream, env *datapath.Env, shm bool) (*Rail, error) {
	R, rank, D := g.Size(), g.Rank(), env.P.RanksPerDomain
	r := &Rail{env: env, D: D, M: R / D, Domain: rank / D, Local: rank % D, s: s, CombineSlack: nvlink.RelayMargin(env.Timeout)}
	r.Slot, r.Area = plan.RailSlot(env.P, env.Hidden)
	fail := func(err error) (*Rail, error) {
		return nil, errors.Join(err, r.Close())
	}
	var err error
	if r.DomainGroup, err = g.Split(ctx, r.Domain, rank); err != nil {
		return fail(fmt.Errorf("split domain %d: %w", r.Domain, err))
	}
	if r.RailGroup, err = g.Split(ctx, r.Local, rank); err != nil {
		return fail(fmt.Errorf("split rail %d: %w", r.Local, err))
	}
	global := make([]int, D)
	for i := range global {
		global[i] = r.Domain*D + i
	}
	if r.Dom, err = nvlink.New(ctx, r.DomainGroup, s, global, env.Timeout); err != nil {
		return fail(err)
	}
	r.Dom.Words = datapath.DomainWords
	r.Transport, err = rdma.New(ctx, r.RailGroup, rdma.Config{
		SendBytes: r.M * r.Slot, RecvBytes: 2 * r.M * r.Slot, Timeout: env.Timeout, SharedMemory: shm,
	})
	if err != nil {
		err = fmt.Errorf("rail %d: %w", r.Local, err)
	} else if r.Fwd, err = s.Alloc(r.M * r.Slot); err != nil {
		err = fmt.Errorf("forwarding buffer: %w", err)
	}
	// The rails are made independently; every rank of the group learns
	// whether all succeeded before any returns, so that a rank that fails
	// (and exits, closing its end of the bootstrap) cannot leave another
	// with a "group closed" instead of the cause.
	if err = datapath.Agree(ctx, g, err); err != nil {
		return fail(err)
	}
	return r, nil
}

// Close frees what New made (after the engine's closing barrier: Close of
// the transport is collective over the rail).
func (r *Rail) Close() error {
	var errs []error
	if r.Transport != nil {
		errs = append(errs, r.Transport.Close())
	}
	if r.Dom != nil {
		r.Dom.Close()
	}
	if r.Fwd != nil {
		r.s.Free(r.Fwd)
	}
	for _, g := range []comm.Group{r.DomainGroup, r.RailGroup} {
		if g != nil {
			errs = append(errs, g.Close())
		}
	}
	return errors.Join(errs...)
}

// Global is the global rank of the rail peer in domain n.
func (r *Rail) Global(n int) int { return n*r.D + r.Local }

// RecvSlotOff is the offset in the receive region of the slot that the
// rail peer in domain n filled in the last round.
func (r *Rail) RecvSlotOff(n int) int { return (int(r.epoch%2)*r.M + n) * r.Slot }

// railErr rewrites a transport error's rail ranks (domain indices) as
// global ranks.
func (r *Rail) railErr(err error) error {
	var te *comm.TimeoutError
	var pe *comm.PeerLostError
	switch {
	case errors.As(err, &te):
		g := &comm.TimeoutError{Op: "rail of local index " + strconv.Itoa(r.Local) + ": " + te.Op}
		for _, n := range te.Missing {
			g.Missing = append(g.Missing, r.Global(n))
		}
		return g
	case errors.As(err, &pe):
		g := &comm.PeerLostError{Op: "rail of local index " + strconv.Itoa(r.Local) + ": " + pe.Op, Cause: pe.Cause}
		for _, n := range pe.Ranks {
			g.Ranks = append(g.Ranks, r.Global(n))
		}
		return g
	}
	return err
}

// Fill writes this rank's payload of a round for the peer in domain n
// (the area and rows parts of its send slot, after the header) and
// returns the counts: header count, area bytes, row bytes.
type Fill func(n int, area, rows []byte) (count, areaBytes, rowBytes int)

// Sender posts this rank's slots of round ep from the device (the GPU-fed
// rail): it writes the headers, enqueues the kernels that store the
// payload into the send region and the descriptors into the rail's feed,
// and returns the feed's drain, which the round calls before its flush.
// An error means nothing was posted: the round then sends the failure
// instead.
type Sender func(ctx context.Context, ep uint64, parity int) (drain func(context.Context) error, err error)

// Round runs one rail round at a new epoch. fill writes this rank's
// payload; with status set, no payload goes, only the failure. Once every
// peer has signalled, the peers' headers are checked (a reported failure,
// a different operation) and recv(n) returns the peer in domain n's slot
// until the next round. An error after the puts still leaves the round
// complete on every rank (all signals sent and waited for), unless it is
// fatal (a timeout or a lost peer).
func (r *Rail) Round(op datapath.Op, sg [4]uint64, status error, fill Fill) (recv func(n int) []byte, err error) {
	return r.Exchange(op, sg, status, fill, nil)
}

// Exchange is Round, with this rank's slots posted by send when it is not
// nil and status is nil.
func (r *Rail) Exchange(op datapath.Op, sg [4]uint64, status error, fill Fill, send Sender) (recv func(n int) []byte, err error) {
	r.epoch++
	ep := r.epoch
	// A combine-like call's round follows its domain exchange, whose
	// failure (a timeout) takes the timeout to show: the round waits
	// CombineSlack longer, so that the peer's report of that failure, not
	// this rank's silence, reaches it.
	timeout := r.env.Timeout
	if !op.DispatchLike() {
		timeout += r.CombineSlack
	}
	base, lost := context.WithCancelCause(context.Background())
	defer lost(nil)
	ctx, cancel := context.WithTimeout(base, timeout)
	defer cancel()
	if op.DispatchLike() {
		defer r.watchDomain(lost)()
	}
	parity := int(ep % 2)
	var peers []int
	for n := range r.M {
		if n != r.Domain {
			peers = append(peers, n)
		}
	}
	var drain func(context.Context) error
	if status == nil && send != nil {
		drain, status = send(ctx, ep, parity)
	}
	if drain == nil {
		if r.HostPost != nil {
			if err := r.HostPost(ctx); err != nil {
				// Copies may still read the receive region that this
				// round's signal lets peers overwrite: the failure is
				// posted, and this engine takes no more calls.
				r.env.Fate.Fail(err)
				status = errors.Join(status, err)
			}
		}
		if err := r.post(ctx, ep, parity, op, sg, status, fill); err != nil {
			return nil, err
		}
	}
	if err := r.Transport.WaitAll(ctx, peers, ep); err != nil {
		return nil, r.fatal(err)
	}
	if drain != nil {
		if err := drain(ctx); err != nil {
			return nil, r.fatal(err)
		}
	}
	if err := r.Transport.Flush(ctx); err != nil {
		return nil, r.fatal(err)
	}
	rbuf := r.Transport.RecvBuffer()
	recv = func(n int) []byte {
		o := r.RecvSlotOff(n)
		return rbuf[o : o+r.Slot]
	}
	if status != nil {
		return recv, status
	}
	for _, n := range peers {
		ph := GetHead(recv(n))
		if ph.Dev {
			// The peer's GPU waits failed: the cause as the peer names it.
			derr := nvlink.WaitError([]byte(ph.Msg), r.Global(n)-r.Local)
			ph.Status, ph.Msg, ph.Ranks = nvlink.StatusOf(derr), derr.Error(), nvlink.Named(derr)
		}
		switch ph.Status {
		case nvlink.StatusOK:
		case nvlink.StatusFailed, nvlink.StatusTimeout:
			return recv, r.fatal(&nvlink.PeerError{Rank: r.Global(n), Status: ph.Status, Msg: ph.Msg, Ranks: ph.Ranks})
		case nvlink.StatusMismatch:
			return recv, fmt.Errorf("executor: rail: %w", &nvlink.PeerError{Rank: r.Global(n), Status: ph.Status, Msg: ph.Msg})
		default:
			return recv, fmt.Errorf("executor: rail: %w", datapath.PeerInput(&nvlink.PeerError{Rank: r.Global(n), Status: ph.Status, Msg: ph.Msg}))
		}
	}
	for _, n := range peers {
		ph := GetHead(recv(n))
		if ph.Op != uint64(op) || ph.Sig != [3]uint64{sg[0], sg[1], sg[2]} {
			// A rail header carries no round: the rounds of a call pair
			// up by their order.
			psg := [4]uint64{ph.Sig[0], ph.Sig[1], ph.Sig[2], sg[3]}
			return recv, fmt.Errorf("executor: rail: %s: %w",
				datapath.Mismatch(r.env.Rank, op, sg, r.Global(n), datapath.Op(ph.Op), psg), nvlink.ErrPeerMismatch)
		}
		// A slot holds at most MaxTokensPerRank tokens or rows.
		if ph.Count < 0 || ph.Count > r.env.P.MaxTokensPerRank {
			return recv, fmt.Errorf("executor: rail: rank %d sent a slot of %d rows, outside [0, MaxTokensPerRank %d]: %w",
				r.Global(n), ph.Count, r.env.P.MaxTokensPerRank, nvlink.ErrPeerMismatch)
		}
	}
	return recv, nil
}

// post puts this rank's slots of round ep from the host: for every other
// domain n, the header (the failure when status is set, else fill's
// payload counts), then the payload, the last put carrying the signal.
func (r *Rail) post(ctx context.Context, ep uint64, parity int, op datapath.Op, sg [4]uint64, status error, fill Fill) error {
	send := r.Transport.SendBuffer()
	for n := range r.M {
		if n == r.Domain {
			continue
		}
		s := send[n*r.Slot : (n+1)*r.Slot]
		head := Head{Op: uint64(op), Sig: [3]uint64{sg[0], sg[1], sg[2]}}
		ab, rb := 0, 0
		if status != nil {
			head.Status, head.Msg, head.Ranks = nvlink.StatusOf(status), status.Error(), nvlink.Named(status)
		} else {
			head.Count, ab, rb = fill(n, s[Header:Header+r.Area], s[Header+r.Area:])
		}
		PutHead(s, head)
		remote := (parity*r.M + r.Domain) * r.Slot
		first := rdma.Work{Peer: n, LocalOff: n * r.Slot, RemoteOff: remote, Bytes: Header + ab, Epoch: ep}
		if rb > 0 {
			first.Epoch = 0
		}
		if err := r.Transport.Put(ctx, first); err != nil {
			return r.fatal(err)
		}
		if rb > 0 {
			off := Header + r.Area
			w := rdma.Work{Peer: n, LocalOff: n*r.Slot + off, RemoteOff: remote + off, Bytes: rb, Epoch: ep}
			if err := r.Transport.Put(ctx, w); err != nil {
				return r.fatal(err)
			}
		}
	}
	return nil
}

// fatal records a failure of the round (timeout, lost peer) as fatal: the
// transport's own, whose ranks are rail indices, or one that names global
// ranks already (a domain peer lost, a rail peer's report).
func (r *Rail) fatal(err error) error {
	var dl *domainLost
	var pe *nvlink.PeerError
	switch {
	case errors.As(err, &dl):
		err = dl.err
	case errors.As(err, &pe):
	default:
		err = r.railErr(err)
	}
	return r.env.Fate.Note(fmt.Errorf("executor: rail round %d: %w", r.epoch, err))
}

// domainLost is the cause with which watchDomain ends a rail round's
// waits: the loss of a member of this rank's domain, or a domain peer's
// fatal failure published for the call's exchange (err names the ranks
// by global rank).
type domainLost struct{ err error }

func (d *domainLost) Error() string { return d.err.Error() }
func (d *domainLost) Unwrap() error { return d.err }

// watchInterval is how often a dispatch-like round looks at its domain
// peers.
const watchInterval = 20 * time.Millisecond

// watchDomain looks at this rank's domain peers every watchInterval until
// the returned stop is called, and cancels a rail round's waits (cancel,
// with a *domainLost) when one's process has exited or one has published
// a fatal failure for the call's domain exchange (nvlink.Domain.
// PeerFailure: its own rail round found a lost or silent rank). A rank
// waiting for its rail peer may otherwise wait out the whole timeout for
// a peer that stopped at that loss: when a rank dies after finishing its
// part of a call with its domain, the ranks of the other domain fail the
// call (their rail round with it fails) while its domain peer completes
// it and waits in the next call's rail round for a rail peer that has
// stopped; and a domain peer whose rail peer died waits for this rank in
// the exchange, where this rank would learn of the death only after its
// own rail round timed out. A dispatch-like call needs its domain after
// its round, so the round fails at once, naming the failed rank. A
// combine-like call's round is not watched: its domain half is done, and
// a domain peer may have finished the call and exited while this rank
// waits for a late rail peer.
func (r *Rail) watchDomain(cancel context.CancelCauseFunc) (stop func()) {
	done, exited := make(chan struct{}), make(chan struct{})
	next := r.Dom.Epoch() + 1
	go func() {
		defer close(exited)
		t := time.NewTicker(watchInterval)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				err := r.Dom.LostPeers()
				if err == nil {
					err = r.Dom.PeerFailure(next)
				}
				if err != nil {
					cancel(&domainLost{err: err})
					return
				}
			}
		}
	}()
	// stop returns once the watcher has: it reads the peers' control
	// blocks, which the domain's Close unmaps.
	return func() {
		close(done)
		<-exited
	}
}

// Reject runs both halves of call op with cause as this rank's status, in
// the call's order: the rail round, and joinDomain (the path's domain
// half, publishing cause).
func (r *Rail) Reject(op datapath.Op, cause error, joinDomain func()) {
	if op.DispatchLike() {
		_, _ = r.Round(op, [4]uint64{}, cause, nil)
		joinDomain()
		return
	}
	joinDomain()
	_, _ = r.Round(op, [4]uint64{}, cause, nil)
}

// Forward copies every rail peer's slot of the last round (header, the
// first areaBytes(n) of the area and rowBytes(n) of rows; rowBytes may be
// nil) into the forwarding buffer.
func (r *Rail) Forward(recv func(n int) []byte, areaBytes, rowBytes func(n int) int) {
	fwd := r.Fwd.Host()
	for n := range r.M {
		if n == r.Domain {
			continue
		}
		src, dst := recv(n), fwd[n*r.Slot:(n+1)*r.Slot]
		copy(dst[:Header+areaBytes(n)], src)
		if rowBytes != nil {
			o := Header + r.Area
			copy(dst[o:o+rowBytes(n)], src[o:])
		}
	}
}
