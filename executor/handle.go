package executor

import (
	"context"
	"fmt"

	"go.uber.org/zap"

	"github.com/goep/goep/device"
	"github.com/goep/goep/executor/internal/datapath"
	"github.com/goep/goep/executor/internal/plan"
)

// Handle is the result of one Layout: the routing's plan, reused by every
// dispatch, combine, permute and backward call on it. In capacity mode its
// contents live in device memory and the host learns them only through
// Counts.
type Handle struct {
	e *Engine
	// st is what the data path keeps of the layout (its counts, its
	// tables); written by the layout's queued work, read by later work
	// (stream order makes that safe).
	st     datapath.Handle
	closed bool
}

// Counts is what the layout found on this rank.
type Counts struct {
	// RecvCount (N) and PermutedCount (P) are the true counts. In capacity
	// mode the valid prefix of an output is min(count, capacity).
	RecvCount, PermutedCount int
	// TokensPerExpert is the received rows routed to each local expert.
	TokensPerExpert []int
	// Overflow is set when this rank dropped rows (OverflowDrop).
	Overflow bool
}

// CapacityError reports ranks that received more rows than the capacity
// mode allows. Every rank of the layout reports the same error; it wraps
// ErrCapacityExceeded.
type CapacityError = plan.CapacityError

// RoutingError is a fault in one rank's routing (an expert out of range,
// or repeated within a token); every rank of the layout reports the same
// one. It wraps ErrInvalidInput.
type RoutingError = plan.RoutingError

// Layout runs metadata preprocessing (collective): every rank's top-k
// indices are exchanged within the domain and each rank computes its
// Layout. In blocking mode it waits for the result, so errors (a rank's bad
// routing, a timeout) are returned here on every rank; in capacity mode it
// returns at once and errors come with the next Synchronize.
func (e *Engine) Layout(ctx context.Context, in LayoutInput) (*Handle, error) {
	if err := e.enter("layout"); err != nil {
		return nil, err
	}
	defer e.leave()
	if err := e.usable(); err != nil {
		return nil, err
	}
	e.handles++
	sig := [4]uint64{e.handles}
	idx := in.TopkIdx
	if err := e.checkTopk(idx); err != nil {
		return nil, e.reject(datapath.OpLayout, err)
	}
	counts, err := e.NewTensor(device.Int32, plan.CountsHeader+e.local)
	if err != nil {
		return nil, e.reject(datapath.OpLayout, err) // the peers must not wait for this rank
	}
	h := &Handle{e: e, st: datapath.Handle{ID: e.handles, NumTokens: idx.Rows(), Counts: counts}}
	if err := e.path.Layout(ctx, &h.st, idx, sig); err != nil {
		counts.Close()
		return nil, e.fate.Note(err)
	}
	e.log.Named("layout").Debug("layout", zap.Int("rank", e.rank), zap.Int("recv", h.st.RecvRows), zap.Int("permuted", h.st.PermRows))
	return h, nil
}

// Relayout runs the layout of new routing into an existing handle
// (collective, capacity mode only): the handle keeps its memory, sizes and
// device addresses, so work captured into a CUDA graph with it (through the
// Into calls) replays with the new routing. TopkIdx must have the handle's
// token count. Errors come as with Layout in capacity mode. Queued work
// that uses the handle runs with the routing it was queued with (stream
// order).
//
// On the CUDA backend with the layout on the GPU (one NVLink domain),
// Relayout itself can be captured into a CUDA graph with the calls that
// follow it, so that a decode step (layout, dispatch, experts, combine)
// is one graph: each replay lays out whatever routing TopkIdx's memory
// holds, with no host in between. A replay's routing error, or under
// OverflowError its capacity overflow, is then reported by the next
// Synchronize (the error the eager Relayout would have returned); after a
// routing error the replay's calls move no row and the device counts are
// zero. Counts and DeviceCounts follow the replays; the host's own view
// of the handle (its capacity check before eager calls) is the last eager
// layout's.
func (e *Engine) Relayout(ctx context.Context, h *Handle, in LayoutInput) error {
	if err := e.enter("relayout"); err != nil {
		return err
	}
	defer e.leave()
	if err := e.checkHandle(h); err != nil {
		return e.reject(datapath.OpLayout, err)
	}
	idx := in.TopkIdx
	err := e.checkTopk(idx)
	if err == nil && e.cfg.Mode != Capacity {
		err = fmt.Errorf("executor: relayout in blocking mode (output sizes follow the routing; use Capacity mode): %w", ErrInvalidInput)
	}
	if err == nil && idx.Rows() != h.st.NumTokens {
		err = fmt.Errorf("executor: relayout: TopkIdx has %d tokens, the handle %d: %w", idx.Rows(), h.st.NumTokens, ErrInvalidInput)
	}
	if err != nil {
		return e.reject(datapath.OpLayout, err)
	}
	e.handles++
	sig := [4]uint64{e.handles}
	return e.fate.Note(e.path.Layout(ctx, &h.st, idx, sig))
}

// NumTokens is T of this rank for this layout.
func (h *Handle) NumTokens() int { return h.st.NumTokens }

// RecvRows is the row count of received-row tensors (RecvX, Z, unpermute
// outputs): RecvCount in blocking mode, MaxRecvTokens in capacity mode.
func (h *Handle) RecvRows() int { return h.st.RecvRows }

// PermutedRows is the row count of permuted tensors: PermutedCount in
// blocking mode, MaxPermutedTokens in capacity mode.
func (h *Handle) PermutedRows() int { return h.st.PermRows }

// DeviceCounts is the counts tensor in device memory, Int32 [4 + L]:
// RecvCount, PermutedCount, overflow flag, 0, then TokensPerExpert. It is
// written by the layout's queued work. The handle owns it: closing it
// makes every later call with the handle fail (ErrInvalidInput).
func (h *Handle) DeviceCounts() *device.Tensor { return h.st.Counts }

// Counts synchronises the engine's stream and returns the counts.
func (h *Handle) Counts(ctx context.Context) (Counts, error) {
	if err := h.e.enter("counts"); err != nil {
		return Counts{}, err
	}
	defer h.e.leave()
	if err := h.usable(); err != nil {
		return Counts{}, err
	}
	b, err := device.Download(ctx, h.st.Counts)
	if err != nil {
		return Counts{}, h.e.fate.Note(err)
	}
	c := device.DecodeInt32(b)
	out := Counts{RecvCount: int(c[plan.CountRecv]), PermutedCount: int(c[plan.CountPermuted]), Overflow: c[plan.CountOverflow] != 0}
	for _, n := range c[plan.CountsHeader:] {
		out.TokensPerExpert = append(out.TokensPerExpert, int(n))
	}
	return out, nil
}

// usable reports why the handle cannot be used: closed (ErrClosed), or
// its DeviceCounts tensor closed by the caller (ErrInvalidInput).
func (h *Handle) usable() error {
	if h.closed {
		return fmt.Errorf("executor: handle %d: %w", h.st.ID, ErrClosed)
	}
	if h.st.Counts.Closed() {
		return fmt.Errorf("executor: handle %d: its DeviceCounts tensor was closed (the handle owns it): %w", h.st.ID, ErrInvalidInput)
	}
	return nil
}

// Close frees the handle's device memory in stream order; queued work that
// uses the handle still completes correctly. Safe from any goroutine:
// during a call of the engine on another goroutine, the handle is closed
// as that call ends (Close returns at once). It returns nil.
func (h *Handle) Close() error {
	if h == nil || h.e == nil {
		return nil
	}
	e := h.e
	e.callMu.Lock()
	if e.calling {
		// A call of the engine is in progress on another goroutine: it
		// closes h as it ends (leave).
		e.pendingClose = append(e.pendingClose, h)
		e.callMu.Unlock()
		return nil
	}
	e.calling = true
	e.callMu.Unlock()
	defer e.leave()
	h.closeNow()
	return nil
}

// closeNow is Close, inside a call of the engine.
func (h *Handle) closeNow() {
	if h.closed {
		return
	}
	h.closed = true
	if h.st.Tables != nil {
		h.st.Tables.Close()
	}
	_ = h.st.Counts.Close() // (always nil)
}
