package nvlink

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/goep/goep/comm"
	"github.com/goep/goep/device"
)

// ErrPeerMismatch is returned when the ranks of a domain do not run the same
// operation with the same signature in one exchange (a rank skipped a call,
// or its shapes or options differ).
var ErrPeerMismatch = errors.New("nvlink: peer mismatch")

// ErrPeerReported is wrapped by PeerError: a peer published a failure
// status for this exchange.
var ErrPeerReported = errors.New("nvlink: peer reported an error")

// MaxBuffers is the number of buffers one rank may expose in one exchange.
const MaxBuffers = 8

// Status codes a rank publishes with its header.
const (
	StatusOK       = 0
	StatusInvalid  = 1 // the rank's input was rejected; Msg says why
	StatusFailed   = 2 // the rank lost a peer (fatal); the named ranks are the lost ones
	StatusMismatch = 3 // the rank found ranks running different calls; Msg says which
	StatusTimeout  = 4 // the rank timed out (fatal); the named ranks were not heard from
)

// StatusOf is the status a rank publishes for its failure err:
// StatusTimeout for a timeout, StatusFailed for a lost peer, StatusMismatch
// for ErrPeerMismatch, else StatusInvalid. A timeout that is also a loss
// (a peer reported one, another timed out) publishes the loss: evidence of
// death outranks silence.
func StatusOf(err error) uint64 {
	switch {
	case err == nil:
		return StatusOK
	case errors.Is(err, comm.ErrPeerLost):
		return StatusFailed
	case errors.Is(err, comm.ErrTimeout):
		return StatusTimeout
	case errors.Is(err, ErrPeerMismatch):
		return StatusMismatch
	}
	return StatusInvalid
}

// Named is the ranks a fatal failure names, as StatusOf classes it: those
// lost (a *comm.PeerLostError) for StatusFailed, those not heard from (a
// *comm.TimeoutError) for StatusTimeout; nil otherwise.
func Named(err error) []int {
	switch StatusOf(err) {
	case StatusFailed:
		var pe *comm.PeerLostError
		if errors.As(err, &pe) {
			return pe.Ranks
		}
	case StatusTimeout:
		var te *comm.TimeoutError
		if errors.As(err, &te) {
			return te.Missing
		}
	}
	return nil
}

// MaxNamed is the most ranks a published failure names (a header's
// bound); a failure naming more names the first MaxNamed, and its message
// the rest.
const MaxNamed = 256

// RelayMargin is how much longer than timeout a wait lasts when what it
// waits for may be a peer's report of its own timeout: a round that
// follows another round (the rail's after the domain's, or the domain's
// after the rail's) hears the peer that timed out in the first round at
// about the same deadline as its own, so it waits the margin more, and
// reports the timeout the peer relays (naming the rank it missed) instead
// of naming the live peer. A quarter of the timeout, at most 5 s.
func RelayMargin(timeout time.Duration) time.Duration { return min(timeout/4, 5*time.Second) }

const msgCap = 200

// state is the first line of a control block: the words that outlive one
// exchange.
type state struct {
	// epoch is the last exchange this rank published.
	epoch atomic.Uint64
	// abandoned is the last epoch this rank left before it was safe to
	// (its wait failed): its caller may reuse the buffers it exposed, or
	// its stage, while a late peer still reads them, so that peer fails
	// the exchange.
	abandoned atomic.Uint64
	// done is the last exchange whose done phase this rank reached (its
	// work on the peers' buffers over).
	done atomic.Uint64
}

// header is the part of a control block a rank writes to publish one
// exchange. It lives in shared memory and is read by peers after they see
// the state's epoch reach the exchange's number. A block has two, one for
// the odd exchanges and one for the even ones: an exchange without a done
// phase lets a rank publish the next one while a slow peer still reads
// this one's header (the peer cannot be further behind: this rank's next
// publish wait needs the peer's next publish).
type header struct {
	op     uint64
	status uint64
	// named are the ranks a fatal status names (Named), nnamed of them.
	nnamed  uint64
	named   [MaxNamed]int32
	sig     [4]uint64
	nbufs   uint64
	handles [MaxBuffers][handleSize]byte
	// staged is 1 when the buffers are spans of the owner's stage (Stage)
	// instead of the handles: span i is the offset and length of buffer i
	// in the stage's half of this exchange, the offset noSpan for a nil
	// buffer.
	staged uint64
	spans  [MaxBuffers][2]uint64
	msgLen uint64
	msg    [msgCap]byte
}

// noSpan is the offset of a staged buffer that is nil.
const noSpan = ^uint64(0)

// StageBytes is the size of each half of a rank's stage: the most bytes
// one exchange may stage (Stage).
const StageBytes = 64 << 10

// A control block is the state line, the two headers, then (each on its
// own cache lines) the bell line and the stage's two halves (StageBytes
// each; exchange e uses half e%2). The bell line of domain rank 0's block
// is the domain's rendezvous: the count of every rank's stores so far
// (arrivals: each rank adds one when it publishes an exchange and one
// when it reaches an exchange's done phase), the futex word waiters in
// other processes sleep on, and the count of those asleep. The other
// blocks' bell lines are unused.
var (
	headerSize   = (int(unsafe.Sizeof(header{})) + 127) &^ 127
	headerOffset = 128
	bellOffset   = headerOffset + 2*headerSize
	stageOffset  = bellOffset + 128
	blockSize    = stageOffset + 2*StageBytes
)

// Call describes this rank's side of one exchange.
type Call struct {
	Op  uint64    // operation code; must be equal on all ranks
	Sig [4]uint64 // call signature (shapes, options); must be equal on all ranks
	// Status is non-nil when this rank rejected its own input, or failed
	// for good elsewhere (a timeout or a lost peer); it is published (as
	// StatusInvalid, or StatusFailed for the latter, with its message) so
	// every peer fails the exchange too instead of waiting for this rank.
	Status error
	// Buffers are exposed to the peers for the duration of the exchange.
	Buffers []*device.Buffer
	// Relay makes the exchange wait RelayMargin longer than the domain's
	// timeout: it follows a round whose timeout a peer may be about to
	// report.
	Relay bool
	// staged: Stage copied the buffers' bytes into this rank's stage, at
	// spans (offset, length; noSpan for a nil buffer), and the exchange
	// exposes them there instead of Buffers.
	staged bool
	nspans int
	spans  [MaxBuffers][2]uint64
}

// PeerError is the failure one peer published in an exchange.
type PeerError struct {
	Rank   int // global rank
	Status uint64
	Msg    string
	// Ranks are the ranks a fatal status names (lost, or not heard from).
	Ranks []int
}

func (e *PeerError) Error() string {
	return fmt.Sprintf("nvlink: rank %d reported: %s", e.Rank, e.Msg)
}

// Unwrap makes errors.Is(err, ErrPeerReported) true, and keeps the class
// and names of the peer's failure, so that relaying it blames the same
// ranks: for StatusFailed a *comm.PeerLostError and for StatusTimeout a
// *comm.TimeoutError naming Ranks (the reporting rank's world is broken,
// so this one's is too), for StatusMismatch ErrPeerMismatch.
func (e *PeerError) Unwrap() []error {
	op := fmt.Sprintf("as rank %d reports", e.Rank)
	switch e.Status {
	case StatusFailed:
		return []error{ErrPeerReported, &comm.PeerLostError{Op: op, Ranks: e.Ranks, Cause: "a peer of rank " + strconv.Itoa(e.Rank) + " was lost"}}
	case StatusTimeout:
		return []error{ErrPeerReported, &comm.TimeoutError{Op: op, Missing: e.Ranks}}
	case StatusMismatch:
		return []error{ErrPeerReported, ErrPeerMismatch}
	}
	return []error{ErrPeerReported}
}

// MismatchWords words how a peer's call (peerOp, peerSig) differs from
// this rank's (op, sig), for the message of an ErrPeerMismatch. Op and Sig
// are numbers to this package; the package that assigns them gives the
// words (Domain.Words).
type MismatchWords func(rank int, op uint64, sig [4]uint64, peer int, peerOp uint64, peerSig [4]uint64) string

// Domain is this rank's view of its NVLink domain.
type Domain struct {
	rank    int   // index in the domain
	global  []int // global rank of each domain index
	timeout time.Duration
	ctrl    []byte   // my control block
	peers   [][]byte // every member's control block, mine included
	pids    []int    // every member's process
	maps    map[mapKey]*device.Mapping
	ctrlMap []*device.Mapping // peers' control blocks mapped from other processes
	used    []*device.Buffer  // the control blocks of this process it uses (ctrlUsers), its own first
	epoch   uint64
	// count is the arrivals count at which the domain's current (or last)
	// phase is over: R a phase, the same on every rank, since every rank
	// runs the same phases.
	count  uint64
	failed error
	// local: every rank of the domain is in this process, so waiters
	// sleep on their inboxes, never on the futex.
	local bool
	// box is this rank's inbox; boxes[p] is peer p's if p is in this
	// process (a store wakes it there), else nil.
	box   *inbox
	boxes []*inbox
	// Scratch reused by every exchange: the peers' buffers it hands its
	// work, the peers a wait still waits for.
	bufs    [][][]byte
	pending []int
	// Words, when set by the domain's user, words an exchange's mismatch
	// (else the message gives the operations and signatures as numbers).
	Words MismatchWords
}

// mismatch words how peer p's call (op, sig) differs from this rank's c.
func (d *Domain) mismatch(c Call, p int, op uint64, sig [4]uint64) string {
	if d.Words != nil {
		return d.Words(d.global[d.rank], c.Op, c.Sig, d.global[p], op, sig)
	}
	return fmt.Sprintf("rank %d runs operation %d %v, rank %d runs %d %v", d.global[d.rank], c.Op, c.Sig, d.global[p], op, sig)
}

// ctrlUsers counts, for every control block of this process, the domains
// of this process that use it: its owner's and those of the owner's peers
// in this process. The last of them to close frees it, and never into the
// pool (device.Buffer.FreeToSystem). A rank whose domain failed may close
// while a late peer still rings its bell and stores its done words (and a
// peer that goes on calling after a Close rings it too); freeing the
// block into the pool would hand those bytes to another allocation
// (invariant 2), the peers of this process writing through the owner's
// mapping, those of other processes through their own.
var ctrlUsers = struct {
	sync.Mutex
	m map[*device.Buffer]int
	// inbox is the inbox of each control block's owner, for its peers
	// in this process.
	inbox map[*device.Buffer]*inbox
}{m: map[*device.Buffer]int{}, inbox: map[*device.Buffer]*inbox{}}

// use records that d uses control block b (under ctrlUsers' lock).
func (d *Domain) use(b *device.Buffer) {
	ctrlUsers.m[b]++
	d.used = append(d.used, b)
}

// New creates the domain of the group's ranks: every rank allocates its
// control block on s, and the blocks' handles are all-gathered through g.
// global[i] is the global rank of domain index i (used in error messages).
// timeout bounds every wait in Exchange.
func New(ctx context.Context, g comm.Group, s device.Stream, global []int, timeout time.Duration) (*Domain, error) {
	if len(global) != g.Size() {
		return nil, fmt.Errorf("nvlink: new domain: %d global ranks for a group of %d", len(global), g.Size())
	}
	if s.Backend().Kind() != device.KindHost {
		return nil, fmt.Errorf("nvlink: new domain: %w: %s backend", device.ErrUnsupported, s.Backend().Kind())
	}
	size := blockSize
	buf, err := s.Alloc(size)
	if err != nil {
		return nil, fmt.Errorf("nvlink: allocate control block: %w", err)
	}
	clear(buf.Host())
	h := export(buf)
	var hb [handleSize]byte
	h.encode(hb[:])
	d := &Domain{rank: g.Rank(), global: global, timeout: timeout, ctrl: buf.Host(), maps: map[mapKey]*device.Mapping{}, box: newInbox(), local: true}
	ctrlUsers.Lock()
	d.use(buf)
	ctrlUsers.inbox[buf] = d.box
	ctrlUsers.Unlock()
	watch(d.box)
	fail := func(err error) (*Domain, error) {
		unexport(h)
		d.Close()
		return nil, err
	}
	all, err := g.AllGather(ctx, hb[:])
	if err != nil {
		return fail(fmt.Errorf("nvlink: exchange control-block handles: %w", err))
	}
	for p, raw := range all {
		if len(raw) != handleSize {
			return fail(fmt.Errorf("nvlink: control-block handle of rank %d has %d bytes, want %d", global[p], len(raw), handleSize))
		}
		ph := decodeHandle(raw)
		var b *device.Buffer
		var box *inbox
		if ph.share.PID == myPID {
			// Looked up and counted at once: the owner closes (and
			// may free the block) only after unexporting it.
			ctrlUsers.Lock()
			if b, err = lookup(ph.id); err == nil && b != buf {
				d.use(b)
			}
			if err == nil {
				box = ctrlUsers.inbox[b]
			}
			ctrlUsers.Unlock()
		} else {
			var m *device.Mapping
			if m, err = device.MapShared(ph.share); err == nil {
				d.ctrlMap = append(d.ctrlMap, m)
				b = m.Buffer(ph.share.Size)
			}
		}
		if err == nil && b.Size() != size {
			err = fmt.Errorf("it has %d bytes, want %d (a different goep?)", b.Size(), size)
		}
		if err != nil {
			return fail(fmt.Errorf("nvlink: map control block of rank %d: %w", global[p], err))
		}
		d.peers = append(d.peers, b.Host())
		d.pids = append(d.pids, ph.share.PID)
		d.boxes = append(d.boxes, box)
		d.local = d.local && box != nil
	}
	// Nobody may unexport before everyone has mapped.
	if err := g.Barrier(ctx); err != nil {
		return fail(fmt.Errorf("nvlink: barrier after mapping control blocks: %w", err))
	}
	unexport(h)
	return d, nil
}

// Rank is this rank's index in the domain; Size the number of ranks.
func (d *Domain) Rank() int { return d.rank }

// Size is the number of ranks in the domain.
func (d *Domain) Size() int { return len(d.global) }

// Global is the global rank of domain index i.
func (d *Domain) Global(i int) int { return d.global[i] }

func stateOf(block []byte) *state { return (*state)(unsafe.Pointer(&block[0])) }

// hdr is the header of a control block that exchange e uses.
func hdr(block []byte, e uint64) *header {
	return (*header)(unsafe.Pointer(&block[headerOffset+int(e%2)*headerSize]))
}

// stageHalf is the half of a control block's stage that exchange e uses.
func stageHalf(block []byte, e uint64) []byte {
	o := stageOffset + int(e%2)*StageBytes
	return block[o : o+StageBytes : o+StageBytes]
}

// Stage copies items into this rank's stage for its next exchange, each
// on a 64-byte boundary, and sets c to expose them there, item i as the
// peers' buffer i (a nil item as a nil buffer), instead of c.Buffers
// (which it clears). It returns false, leaving c as it was, when they do
// not fit in StageBytes, are more than MaxBuffers, or the domain has
// failed.
//
// An exchange in which no rank exposes Buffers (every rank staged, or
// exposes nothing) has no done phase: it ends with the publish wait, one
// round of the peers' stores instead of two. The copy is the price, so
// stage small calls only: a peer reads the stage of exchange e until it
// publishes e+1, and this rank writes that half again for e+2 only, which
// it reaches after every peer's publish of e+1.
func (d *Domain) Stage(c *Call, items ...[]byte) bool {
	if d.failed != nil || len(items) > MaxBuffers {
		return false
	}
	n := 0
	for _, it := range items {
		n = (n+63)&^63 + len(it)
	}
	if n > StageBytes {
		return false
	}
	half := stageHalf(d.ctrl, d.epoch+1)
	o := 0
	for i, it := range items {
		if it == nil {
			c.spans[i] = [2]uint64{noSpan, 0}
			continue
		}
		o = (o + 63) &^ 63
		copy(half[o:], it)
		c.spans[i] = [2]uint64{uint64(o), uint64(len(it))}
		o += len(it)
	}
	c.staged, c.nspans, c.Buffers = true, len(items), nil
	return true
}

func bell(block []byte) *atomic.Uint32 {
	return (*atomic.Uint32)(unsafe.Pointer(&block[bellOffset]))
}

// waiters counts the goroutines asleep on the rendezvous's futex.
func waiters(block []byte) *atomic.Int32 {
	return (*atomic.Int32)(unsafe.Pointer(&block[bellOffset+4]))
}

// arrivals counts every rank's publish and done stores (rendezvous).
func arrivals(block []byte) *atomic.Uint64 {
	return (*atomic.Uint64)(unsafe.Pointer(&block[bellOffset+8]))
}

// rendezvous is the block holding the domain's arrivals count: domain
// rank 0's.
func (d *Domain) rendezvous() []byte { return d.peers[0] }

// Exchange runs one exchange (see the package doc). fn is called with the
// bytes of the peers' exposed buffers, peers[p][i] being buffer i of
// domain rank p (nil for a nil buffer), and only when every rank published
// StatusOK with equal Op and Sig; peers is valid during the call only (the
// next exchange reuses it). It must be called in the same order on every
// rank, from the goroutine that runs the rank's stream. Once an exchange
// has timed out, the domain is failed and every later Exchange returns
// that error at once.
func (d *Domain) Exchange(c Call, fn func(peers [][][]byte) error) error {
	if d.failed != nil {
		return fmt.Errorf("nvlink: domain failed earlier: %w", d.failed)
	}
	if len(c.Buffers) > MaxBuffers {
		return fmt.Errorf("nvlink: exchange exposes %d buffers, at most %d", len(c.Buffers), MaxBuffers)
	}
	if c.staged && len(c.Buffers) > 0 {
		return fmt.Errorf("nvlink: exchange both stages and exposes buffers")
	}
	d.epoch++
	e := d.epoch
	dl := deadline{after: d.timeout}
	if c.Relay {
		dl.after += RelayMargin(d.timeout)
	}

	// Phase 1: publish.
	h := hdr(d.ctrl, e)
	h.op, h.sig, h.status, h.msgLen, h.nnamed = c.Op, c.Sig, StatusOK, 0, 0
	if c.Status != nil {
		h.status = StatusOf(c.Status)
		n := copy(h.msg[:], c.Status.Error())
		h.msgLen = uint64(n)
		for _, r := range Named(c.Status) {
			if h.nnamed == MaxNamed {
				break
			}
			h.named[h.nnamed] = int32(r)
			h.nnamed++
		}
	}
	d.trimMappings()
	// Peers in this process take the buffers from the inbox, those in
	// other processes map them by their handles.
	for i, b := range c.Buffers {
		d.box.exposed[i].Store(b)
		h.handles[i] = [handleSize]byte{}
		if b != nil {
			shareOf(b).encode(h.handles[i][:])
		}
	}
	h.nbufs, h.staged = uint64(len(c.Buffers)), 0
	if c.staged {
		h.nbufs, h.staged = uint64(c.nspans), 1
		h.spans = c.spans
	}
	me := stateOf(d.ctrl)
	me.epoch.Store(e)
	d.arrive()
	if err := d.wait("publish", &dl, func(p int) bool { return stateOf(d.peers[p]).epoch.Load() >= e }); err != nil {
		me.abandoned.Store(e)
		return err
	}

	// Every rank sees the same headers, so every rank takes the same branch
	// below and the same decision on the done phase, which then still
	// completes: it is needed when some rank exposed buffers (its caller
	// may reuse them once the exchange is over, so it must outlast the
	// peers' reads), not when every rank staged.
	var failure error
	needDone := false
	reported, mismatched := -1, -1 // the first peer that reported a failure, that runs another call
	for p := range d.peers {
		ph := hdr(d.peers[p], e)
		needDone = needDone || ph.staged == 0 && ph.nbufs > 0
		if reported < 0 && ph.status != StatusOK {
			reported = p
		}
		if mismatched < 0 && (ph.op != c.Op || ph.sig != c.Sig) {
			mismatched = p
		}
	}
	// A peer's own report comes first: a rank that rejected its input
	// publishes no meaningful signature.
	if reported >= 0 {
		failure = d.peerError(reported, e)
	} else if mismatched >= 0 {
		ph := hdr(d.peers[mismatched], e)
		failure = fmt.Errorf("nvlink: %s: %w", d.mismatch(c, mismatched, ph.op, ph.sig), ErrPeerMismatch)
	}
	if failure == nil && fn != nil {
		peers := d.peerBuffers()
		for p := range d.peers {
			ph := hdr(d.peers[p], e)
			peers[p] = peers[p][:min(ph.nbufs, MaxBuffers)]
			if ph.staged != 0 {
				if failure = d.staged(p, e, peers[p]); failure != nil {
					break
				}
				continue
			}
			for i := range peers[p] {
				peers[p][i] = nil
				if box := d.boxes[p]; box != nil { // p is in this process
					if b := box.exposed[i].Load(); b != nil {
						peers[p][i] = b.Host()
					}
					continue
				}
				if ph.handles[i] == ([handleSize]byte{}) {
					continue
				}
				b, err := d.open(decodeHandle(ph.handles[i][:]))
				if err != nil {
					failure = fmt.Errorf("nvlink: map buffer %d of rank %d: %w", i, d.global[p], err)
					break
				}
				peers[p][i] = b.Host()
			}
		}
		if failure == nil {
			failure = callWork(fn, peers)
		}
		if failure == nil && fn != nil {
			failure = d.checkAbandoned(e)
		}
	}

	// Phase 2: done.
	if !needDone {
		return failure
	}
	me.done.Store(e)
	d.arrive()
	if err := d.wait("done", &dl, func(p int) bool { return stateOf(d.peers[p]).done.Load() >= e }); err != nil {
		me.abandoned.Store(e)
		return err
	}
	return failure
}

// staged fills bufs with the bytes of peer p's staged buffers of exchange
// e; a span past the stage's half is a corrupt header, and fails the
// exchange.
func (d *Domain) staged(p int, e uint64, bufs [][]byte) error {
	ph, half := hdr(d.peers[p], e), stageHalf(d.peers[p], e)
	for i := range bufs {
		off, n := ph.spans[i][0], ph.spans[i][1]
		if off == noSpan {
			bufs[i] = nil
			continue
		}
		if off > StageBytes || n > StageBytes-off {
			return fmt.Errorf("nvlink: rank %d staged buffer %d at %d bytes (%d long), past its stage of %d", d.global[p], i, off, n, StageBytes)
		}
		bufs[i] = half[off : off+n : off+n]
	}
	return nil
}

// checkAbandoned is the check after the work of exchange e: a peer whose
// wait failed (its deadline passed while this rank was late) has returned
// to its caller, which may have reused the buffers this rank was reading,
// so the work's result cannot be trusted. A peer that left after this
// check left after the reads. The domain fails for good, as the peer's.
func (d *Domain) checkAbandoned(e uint64) error {
	var gave []int
	for p := range d.peers {
		if p != d.rank && stateOf(d.peers[p]).abandoned.Load() >= e {
			gave = append(gave, p)
		}
	}
	if len(gave) == 0 {
		return nil
	}
	d.failed = fmt.Errorf("%s: rank(s) %v stopped waiting for this rank (their deadline passed) while it read their buffers, which they may have reused: %w",
		d.opName("work"), d.globalRanks(gave), comm.ErrTimeout)
	return d.failed
}

// callWork runs an exchange's work, turning a panic into its failure, so
// that a bug there still lets the done phase complete (the peers fail the
// call with this rank's error, or succeed, instead of waiting for it until
// their deadline).
func callWork(fn func(peers [][][]byte) error, peers [][][]byte) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("nvlink: the exchange's work panicked: %v\n%s", r, debug.Stack())
		}
	}()
	return fn(peers)
}

// deadline is an exchange's deadline: after its first look at the clock,
// which its first wait makes when it finds a peer pending (a wait whose
// peers are all there reads no clock), plus after.
type deadline struct {
	at    time.Time
	after time.Duration
}

// from is the deadline, set from now at the first call.
func (dl *deadline) from(now time.Time) time.Time {
	if dl.at.IsZero() {
		dl.at = now.Add(dl.after)
	}
	return dl.at
}

// wait returns when every rank has made its store of this phase (the
// domain's arrivals count has reached d.count), the deadline passes (the
// error names the ranks not heard from: those for which ready is false),
// or a pending peer's process is found dead (the error names it); either
// failure fails the domain for good. It sleeps until the rank whose store
// completes the count wakes it, or the watchdog's or the futex's next
// look, every livenessInterval at most, when it also checks the deadline,
// the peers' flags (all ready is done too) and the pending peers'
// processes: no timer and no system call while every rank is in this
// process.
//
// The count is exact: a rank adds its store of a phase only after its
// wait of the phase before is over, so the count reaches R times the
// phases so far only once every rank has stored this one.
func (d *Domain) wait(phase string, dl *deadline, ready func(p int) bool) error {
	rv := d.rendezvous()
	count, bellw := arrivals(rv), bell(rv)
	var lastCheck time.Time
	for {
		rung := bellw.Load()
		if count.Load() >= d.count {
			return nil
		}
		now := time.Now()
		if lastCheck.IsZero() {
			lastCheck = now
		}
		deadline := dl.from(now)
		if now.After(deadline) || now.Sub(lastCheck) >= livenessInterval {
			lastCheck = now
			pending := d.pendingPeers(ready)
			if len(pending) == 0 {
				return nil
			}
			if now.After(deadline) {
				d.failed = &comm.TimeoutError{Op: d.opName(phase), Missing: d.globalRanks(pending)}
				return d.failed
			}
			// A peer may have stored what this rank waits for, then
			// finished and exited, after the look above: its stores are
			// visible once its exit is, so only a dead peer that is still
			// not ready is lost.
			dead := slices.DeleteFunc(d.exited(pending), ready)
			if len(dead) > 0 {
				d.failed = &comm.PeerLostError{Op: d.opName(phase), Ranks: d.globalRanks(dead), Cause: "process exited"}
				return d.failed
			}
		}
		// Marked asleep (or counted among the futex's waiters) before the
		// last look at the count: the rank whose store completes it either
		// sees the mark and wakes this one, or its store is seen here.
		if d.local {
			d.box.asleep.Store(true)
			if count.Load() < d.count {
				<-d.box.ch
			}
			d.box.asleep.Store(false)
			continue
		}
		waiters(rv).Add(1)
		if count.Load() < d.count {
			futexWait(bellw, rung, min(deadline.Sub(now), livenessInterval))
		}
		waiters(rv).Add(-1)
	}
}

// pendingPeers are the peers for which ready is false (d.pending, reused).
func (d *Domain) pendingPeers(ready func(p int) bool) []int {
	pending := d.pending[:0]
	for p := range d.peers {
		if !ready(p) {
			pending = append(pending, p)
		}
	}
	d.pending = pending
	return pending
}

// arrive counts this rank's store of the current phase (its published
// epoch, or its done), made just before, in the domain's arrivals, and
// sets the phase's target: if the store completes a phase (the count
// reaches a multiple of R), it wakes every rank asleep, through their
// inboxes (ranks in this process) and the rendezvous's futex (some rank
// sleeps there). The phase it completes is usually this rank's; it is an
// earlier one when this rank got past that phase at its periodic look,
// finding every flag there before every rank had counted its store.
func (d *Domain) arrive() {
	n := uint64(len(d.peers))
	d.count += n
	rv := d.rendezvous()
	if arrivals(rv).Add(1)%n != 0 {
		return
	}
	b := bell(rv)
	b.Add(1)
	if waiters(rv).Load() > 0 {
		futexWake(b)
	}
	for p, box := range d.boxes {
		if p != d.rank && box != nil && box.asleep.Load() {
			box.peerWakes.Add(1)
			box.wake()
		}
	}
}

// peerBuffers is the exchange's table of the peers' buffers, reused.
func (d *Domain) peerBuffers() [][][]byte {
	if d.bufs == nil {
		d.bufs = make([][][]byte, len(d.peers))
		for p := range d.bufs {
			d.bufs[p] = make([][]byte, MaxBuffers)
		}
	}
	return d.bufs
}

// Epoch is the number of this rank's last exchange; the next is Epoch+1.
func (d *Domain) Epoch() uint64 { return d.epoch }

// PeerFailure is the fatal failure (a timeout or a lost peer) a domain
// peer has published for exchange e, which this rank has not joined yet,
// as a *PeerError; nil if none has. A rank held elsewhere in the same call
// (the rail's round before a dispatch's exchange) looks at it to fail at
// once with the peer's cause, instead of waiting out its own timeout
// while the peer, which found the failure in its own rail round, waits
// for it in the exchange. The peer cannot publish a later exchange before
// this rank joins e, so the header it read is e's.
func (d *Domain) PeerFailure(e uint64) error {
	for p := range d.peers {
		if p == d.rank {
			continue
		}
		if stateOf(d.peers[p]).epoch.Load() != e {
			continue
		}
		if ph := hdr(d.peers[p], e); ph.status == StatusFailed || ph.status == StatusTimeout {
			return d.peerError(p, e)
		}
	}
	return nil
}

// peerError is the failure peer p published in its header of exchange e.
// A length past the message or names array is a corrupt header, and is
// cut.
func (d *Domain) peerError(p int, e uint64) *PeerError {
	ph := hdr(d.peers[p], e)
	pe := &PeerError{Rank: d.global[p], Status: ph.status, Msg: string(ph.msg[:min(ph.msgLen, msgCap)])}
	for _, r := range ph.named[:min(ph.nnamed, MaxNamed)] {
		pe.Ranks = append(pe.Ranks, int(r))
	}
	return pe
}

// LostPeers returns a *comm.PeerLostError naming the peers of this domain
// in other processes whose process has exited, or nil when every one runs.
// It reads /proc, so call it at most every livenessInterval or so (the
// executor's rail waits do, while this rank waits for another domain: a
// domain that lost a member can complete no call).
func (d *Domain) LostPeers() error {
	all := make([]int, len(d.pids)) // this rank's own process is skipped
	for p := range all {
		all[p] = p
	}
	dead := d.exited(all)
	if len(dead) == 0 {
		return nil
	}
	return &comm.PeerLostError{Op: fmt.Sprintf("nvlink domain of rank %d", d.global[d.rank]), Ranks: d.globalRanks(dead), Cause: "process exited"}
}

// exited returns the domain indices among ps of the peers in other
// processes whose process has exited.
func (d *Domain) exited(ps []int) []int {
	var dead []int
	for _, p := range ps {
		if d.pids[p] != myPID && !processAlive(d.pids[p]) {
			dead = append(dead, p)
		}
	}
	return dead
}

// livenessInterval is how often a waiter looks at its peers' processes
// (and the longest it sleeps without re-checking the deadline).
const livenessInterval = 20 * time.Millisecond

func (d *Domain) opName(phase string) string {
	return fmt.Sprintf("nvlink exchange %d (%s) on rank %d", d.epoch, phase, d.global[d.rank])
}

func (d *Domain) globalRanks(ps []int) []int {
	out := make([]int, len(ps))
	for i, p := range ps {
		out[i] = d.global[p]
	}
	return out
}

// Close releases the control block in stream order. Peers must have left
// the domain too (the executor closes with a barrier).
func (d *Domain) Close() {
	ctrlUsers.Lock()
	for _, b := range d.used {
		if ctrlUsers.m[b]--; ctrlUsers.m[b] > 0 {
			continue
		}
		delete(ctrlUsers.m, b)
		delete(ctrlUsers.inbox, b)
		b.FreeToSystem()
	}
	ctrlUsers.Unlock()
	d.used = nil
	if d.box != nil {
		unwatch(d.box)
	}
	for k, m := range d.maps {
		_ = m.Unmap()
		delete(d.maps, k)
	}
	for _, m := range d.ctrlMap {
		_ = m.Unmap()
	}
	d.ctrlMap = nil
}
