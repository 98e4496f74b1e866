// Package datapath is the contract between package executor and the data
// paths that move its bytes: the interface every path implements (Path),
// and what crosses it (the handle's state, the calls' tensors, the
// operation codes, the record of a fatal failure). Package executor checks
// every input, allocates the outputs and picks one path in New: host
// (package host), or CUDA (package gpu, tag cuda). Each path runs one
// NVLink domain by itself and several through package rail.
package datapath

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/goep/goep/comm"
	"github.com/goep/goep/device"
	"github.com/goep/goep/executor/internal/plan"
	"github.com/goep/goep/nvlink"
)

// ErrUnsupported: the configuration needs a feature not built yet or not
// compiled in (executor.ErrUnsupported); the message names it.
var ErrUnsupported = errors.New("executor: unsupported")

// Path is one rank's data path. Every method but Synchronize and Close
// enqueues work in stream order and returns; errors the work finds come
// with the next Synchronize. Calls come from one goroutine at a time
// (package executor guarantees it), and every rank makes the same
// collective calls (Layout, Dispatch, DispatchPermute, Combine,
// UnpermuteCombine, Reject) in the same order.
type Path interface {
	// Stream is where outputs are allocated and the path's work runs.
	Stream() device.Stream
	// Enqueue runs f, which allocates a call's outputs and enqueues its
	// work, at once: on the GPU in one hold of the device's driver.
	Enqueue(f func() error) error

	// Layout runs the layout of idx ([T, TopK] Int32, T = h.NumTokens)
	// into h (collective). A handle with a layout already is a Relayout
	// (capacity mode): it keeps its memory and device addresses. In
	// blocking mode h.Lay, RecvRows and PermRows are set when it returns
	// without error; in capacity mode the rows are the capacities and the
	// layout may still be in flight.
	Layout(ctx context.Context, h *Handle, idx *device.Tensor, sig [4]uint64) error
	// Dispatch moves rows x (weights w, fp8 scales sx; either may be nil)
	// into out (collective). DispatchPermute writes them permuted.
	Dispatch(h *Handle, x, w, sx *device.Tensor, out DispatchOut) error
	DispatchPermute(h *Handle, x, w, sx *device.Tensor, out DispatchPermuteOut) error
	// Combine sums z back to the sources (collective); with zw (weight
	// gradients, DispatchBackward) each slot's value goes back too.
	Combine(h *Handle, z, zw *device.Tensor, out CombineOut) error
	// UnpermuteCombine is Combine of Unpermute(y, w) in one pass.
	UnpermuteCombine(h *Handle, y, w, out *device.Tensor) error
	// Permute, Unpermute and UnpermuteBackward are local.
	Permute(h *Handle, x, w, sx *device.Tensor, out PermuteOut) error
	Unpermute(h *Handle, y, w, out *device.Tensor) error
	UnpermuteBackward(h *Handle, g, y, w *device.Tensor, out UnpermuteBackwardOut) error
	// Reject joins collective call op, whose input this rank rejected with
	// cause, so that every peer fails it at once instead of waiting.
	Reject(op Op, cause error)

	// Synchronize waits for the queued work and returns its first error.
	Synchronize(ctx context.Context) error
	// Drain waits for the queued work before Close (the engine then
	// passes a barrier with its peers).
	Drain(ctx context.Context) error
	// Close frees everything; no peer uses this rank's memory any more.
	Close() error
}

// Env is what a path knows of its engine: its rank, sizes and knobs, the
// allocator of its outputs and temporaries, and the record of a fatal
// failure, shared with the engine.
type Env struct {
	P        plan.Params
	Rank     int
	NumRanks int
	Hidden   int
	// Drop is the capacity-mode policy OverflowDrop (else OverflowError:
	// every call on an over-capacity layout fails).
	Drop    bool
	Timeout time.Duration
	// SMs and ChunkRows are executor.Config's tuning knobs.
	SMs, ChunkRows int
	// Alloc allocates a tensor on the path's stream (executor's NewTensor).
	Alloc func(dt device.DType, shape ...int) (*device.Tensor, error)
	Fate  *Fate
	Log   *zap.Logger
}

// NumLocalExperts is L.
func (e *Env) NumLocalExperts() int { return e.P.NumExperts / e.NumRanks }

// ValidRecv is the number of valid received rows of rank d.
func (e *Env) ValidRecv(lay *plan.Layout, d int) int { return plan.ValidRecv(lay, e.P, d) }

// Ready checks, where the work runs, that the handle's layout exists and
// may be used: under OverflowError an over-capacity layout fails every
// call on it.
func (e *Env) Ready(h *Handle) (*plan.Layout, error) {
	if h.Lay == nil {
		return nil, fmt.Errorf("executor: handle %d has no layout (its layout failed)", h.ID)
	}
	if !e.Drop {
		if err := plan.CheckCapacity(h.Lay, e.P); err != nil {
			return nil, err
		}
	}
	return h.Lay, nil
}

// Fate records an engine's fatal failure: a timeout or a lost peer leaves
// the ranks out of step for good, and the engine then refuses every call.
type Fate struct{ failed atomic.Pointer[error] }

// Fatal reports whether err leaves the ranks out of step for good.
func Fatal(err error) bool {
	return errors.Is(err, comm.ErrTimeout) || errors.Is(err, comm.ErrPeerLost)
}

// Note records err if it is fatal (the first such error stays) and
// returns it.
func (f *Fate) Note(err error) error {
	if Fatal(err) {
		// A copy of its own: taking err's address would move err to the
		// heap on every call, fatal or not.
		held := err
		f.failed.CompareAndSwap(nil, &held)
	}
	return err
}

// Fail records err, fatal or not: after it the engine takes no call (the
// path cannot keep its peers in step).
func (f *Fate) Fail(err error) { f.failed.CompareAndSwap(nil, &err) }

// Err is the recorded failure, or nil.
func (f *Fate) Err() error {
	if p := f.failed.Load(); p != nil {
		return *p
	}
	return nil
}

// PeerInput marks a peer's reported failure (nvlink.ErrPeerReported) as
// invalid input unless it is fatal or a mismatch: the peer rejected its
// own input, and so this rank's call fails as if its own had been bad.
func PeerInput(err error) error {
	if errors.Is(err, nvlink.ErrPeerReported) && !Fatal(err) && !errors.Is(err, nvlink.ErrPeerMismatch) {
		return &peerInputError{err}
	}
	return err
}

// peerInputError is a peer's rejection as this rank's invalid input. Its
// text names the class once: a peer's message usually says it already
// (at its end, or before a relay's cut).
type peerInputError struct{ err error }

func (e *peerInputError) Error() string {
	s, class := e.err.Error(), plan.ErrInvalidInput.Error()
	if strings.Contains(s, class) {
		return s
	}
	return s + ": " + class
}

func (e *peerInputError) Unwrap() []error { return []error{e.err, plan.ErrInvalidInput} }

// Handle is a handle's state (executor.Handle holds one): what its layout
// found, and the path's tables.
type Handle struct {
	ID        uint64
	NumTokens int
	// Lay is written by the layout's work and read by later work (stream
	// order makes that safe); the host reads it only after a synchronize.
	Lay *plan.Layout
	// Counts is device memory: Int32 [plan.CountsHeader + L].
	Counts *device.Tensor
	// RecvRows and PermRows are the row counts of outputs: exact in
	// blocking mode, capacities in capacity mode.
	RecvRows, PermRows int
	// Tables are the path's own tables (nil when it keeps none).
	Tables interface{ Close() }
	// DeviceRouted: a Relayout captured into a CUDA graph owns the
	// handle's tables and counts, which then follow the graph's last
	// replay; Lay stays the last eager layout's, and the capacity is
	// checked on the device (the GPU path's Synchronize reports it).
	DeviceRouted bool
}

// UseCounts sets the handle's output rows for lay.
func (h *Handle) UseCounts(lay *plan.Layout, p plan.Params) {
	if p.Capacity {
		h.RecvRows, h.PermRows = p.MaxRecvTokens, p.MaxPermutedTokens
		return
	}
	h.RecvRows, h.PermRows = lay.RecvCount, lay.PermutedCount
}

// The outputs of the calls (nil where not asked for).
type (
	DispatchOut struct {
		RecvX, RecvIdx, RecvWeights, RecvScales *device.Tensor
	}
	DispatchPermuteOut struct {
		X, Weights, RecvIdx, RecvWeights, Scales *device.Tensor
	}
	CombineOut struct {
		X               *device.Tensor // [T, Hidden]
		GradTopkWeights *device.Tensor // [T, TopK] FP32 (DispatchBackward with weights)
	}
	PermuteOut struct {
		X, Weights, Scales *device.Tensor
	}
	UnpermuteBackwardOut struct {
		GradY, GradWeights *device.Tensor
	}
)

// Op is a collective call's operation code, published in every exchange
// so that ranks running different calls fail with ErrPeerMismatch instead
// of mixing data.
type Op uint64

// The collective operations.
const (
	OpLayout Op = iota + 1
	OpDispatch
	OpCombine
	OpDispatchPermute
	OpUnpermuteCombine
)

var opNames = map[Op]string{
	OpLayout: "layout", OpDispatch: "dispatch", OpCombine: "combine",
	OpDispatchPermute: "dispatch-permute", OpUnpermuteCombine: "unpermute-combine",
}

func (o Op) String() string {
	if n, ok := opNames[o]; ok {
		return n
	}
	return fmt.Sprintf("operation %d", uint64(o))
}

// also names the other API call that runs op, if any.
func (o Op) also() string {
	switch o {
	case OpLayout:
		return " (or Relayout)"
	case OpDispatch:
		return " (or CombineBackward)"
	case OpCombine:
		return " (or DispatchBackward)"
	}
	return ""
}

// weights names the input whose presence Sig's weighted word records.
func (o Op) weights() string {
	switch o {
	case OpCombine:
		return "GradRecvWeights"
	case OpUnpermuteCombine:
		return "RecvWeights"
	}
	return "TopkWeights"
}

// DispatchLike reports whether op moves rows or routing towards the
// destinations (its rail round, with several domains, runs before its
// domain exchange).
func (o Op) DispatchLike() bool { return o == OpLayout || o == OpDispatch || o == OpDispatchPermute }

// The rounds of a dispatch-like call: an fp8 call moves its rows, then
// their scales with the same routing in a second round of the same call
// where a path cannot move both at once.
const (
	RoundRows uint64 = iota
	RoundScales
)

// Sig is the signature of a data call: handle, dtype, weighted, round.
// A layout's is the engine's count of layouts (executor.Engine.Layout and
// Relayout), then zeros. Mismatch decodes it.
func Sig(h *Handle, dt device.DType, weighted bool, round uint64) [4]uint64 {
	w := uint64(0)
	if weighted {
		w = 1
	}
	return [4]uint64{h.ID, uint64(dt), w, round}
}

// Mismatch words how global rank peer's collective call (peerOp,
// peerSig) differs from rank's (op, sig), for the message of an
// nvlink.ErrPeerMismatch: the calls by name, else the first of Sig's
// words that differs (handle, dtype, weights, round) in the caller's
// terms. The exchanges publish numbers; a user reads words.
func Mismatch(rank int, op Op, sig [4]uint64, peer int, peerOp Op, peerSig [4]uint64) string {
	switch {
	case op != peerOp:
		return fmt.Sprintf("rank %d runs %s%s, rank %d %s%s: the ranks' collective calls are out of step",
			rank, op, op.also(), peer, peerOp, peerOp.also())
	case sig[0] != peerSig[0] && op == OpLayout:
		return fmt.Sprintf("rank %d runs layout #%d, rank %d layout #%d: the ranks made different numbers of Layout and Relayout calls",
			rank, sig[0], peer, peerSig[0])
	case sig[0] != peerSig[0]:
		return fmt.Sprintf("rank %d runs %s with the handle of layout #%d, rank %d with that of layout #%d: every rank must pass the handle of the same Layout",
			rank, op, sig[0], peer, peerSig[0])
	case sig[1] != peerSig[1]:
		return fmt.Sprintf("rank %d runs %s on %v rows, rank %d on %v rows: the rows' dtype must be equal on all ranks",
			rank, op, dtypeWord(sig[1]), peer, dtypeWord(peerSig[1]))
	case sig[2] != peerSig[2]:
		return fmt.Sprintf("rank %d runs %s %s, rank %d %s: %s must be given on every rank or on none",
			rank, op, withWeights(sig[2]), peer, withWeights(peerSig[2]), op.weights())
	case sig[3] != peerSig[3]:
		return fmt.Sprintf("rank %d runs %s's %s round, rank %d its %s round", rank, op, roundWord(sig[3]), peer, roundWord(peerSig[3]))
	}
	return fmt.Sprintf("rank %d runs %s %v, rank %d runs %s %v", rank, op, sig, peer, peerOp, peerSig)
}

func dtypeWord(w uint64) string {
	if w > 255 {
		return fmt.Sprintf("dtype(%d)", w)
	}
	return device.DType(w).String()
}

func withWeights(w uint64) string {
	if w != 0 {
		return "with weights"
	}
	return "without weights"
}

func roundWord(r uint64) string {
	switch r {
	case RoundRows:
		return "rows"
	case RoundScales:
		return "fp8 scales"
	}
	return fmt.Sprintf("#%d", r)
}

// DomainWords words a domain exchange's mismatch as Mismatch does: the
// engines' domains carry Op and Sig as numbers (nvlink.Domain.Words).
func DomainWords(rank int, op uint64, sig [4]uint64, peer int, peerOp uint64, peerSig [4]uint64) string {
	return Mismatch(rank, Op(op), sig, peer, Op(peerOp), peerSig)
}

// RowBytes is the size of one row of a 2-D tensor.
func RowBytes(t *device.Tensor) int { return t.Shape()[1] * t.DType().Size() }

// Buf is t's buffer, nil for a nil tensor.
func Buf(t *device.Tensor) *device.Buffer {
	if t == nil {
		return nil
	}
	return t.Buffer()
}

// Agree all-gathers every rank's outcome of a step of setup over g and
// returns the first failure (this rank's own first, with its sentinels),
// so that a rank that fails (and exits, closing its end of the bootstrap)
// cannot leave another with a "group closed" instead of the cause; nil
// when every rank succeeded.
func Agree(ctx context.Context, g comm.Group, mine error) error {
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
