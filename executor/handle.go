package executor

import (
	"context"
	"fmt"
	"strings"

	"go.uber.org/zap"

	"github.com/goep/goep/device"
	"github.com/goep/goep/nvlink"
	"github.com/goep/goep/permute"
)

// Handle is the result of one Layout: the routing's plan, reused by every
// dispatch, combine, permute and backward call on it. In capacity mode its
// contents live in device memory and the host learns them only through
// Counts.
type Handle struct {
	e         *Engine
	id        uint64
	numTokens int
	// lay is written by the layout's stream task and read by later tasks
	// (stream order makes that safe); the host reads it only after a
	// Synchronize.
	lay *Layout
	// counts is device memory: Int32 [countsHeader + L] (see Counts).
	counts *device.Tensor
	// recvRows and permRows are the row counts of outputs: exact in
	// blocking mode, capacities in capacity mode.
	recvRows, permRows int
	// gpu holds the tables of the CUDA data path (nil on the host backend).
	gpu    *gpuTables
	closed bool
}

// Layout of the device counts tensor.
const (
	countRecv     = 0 // RecvCount
	countPermuted = 1 // PermutedCount
	countOverflow = 2 // 1 when this rank dropped rows (capacity mode, OverflowDrop)
	countsHeader  = 4 // TokensPerExpert follows
)

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
// mode allows. Every rank of the layout reports the same error.
type CapacityError struct {
	Ranks                            []int // ranks over capacity
	RecvCounts, PermutedCounts       []int // their counts
	MaxRecvTokens, MaxPermutedTokens int
}

func (e *CapacityError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "executor: capacity exceeded (MaxRecvTokens %d, MaxPermutedTokens %d):", e.MaxRecvTokens, e.MaxPermutedTokens)
	for i, r := range e.Ranks {
		fmt.Fprintf(&b, " rank %d receives %d rows, %d permuted;", r, e.RecvCounts[i], e.PermutedCounts[i])
	}
	return strings.TrimSuffix(b.String(), ";")
}

// Unwrap makes errors.Is(err, ErrCapacityExceeded) true.
func (e *CapacityError) Unwrap() error { return ErrCapacityExceeded }

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
		return nil, e.reject(opLayout, err)
	}
	counts, err := e.NewTensor(device.Int32, countsHeader+e.local)
	if err != nil {
		return nil, e.reject(opLayout, err) // the peers must not wait for this rank
	}
	h := &Handle{e: e, id: e.handles, numTokens: idx.Rows(), counts: counts}
	if e.gpu != nil {
		if err := e.gpu.layout(ctx, h, idx, sig); err != nil {
			counts.Close()
			return nil, err
		}
		return h, nil
	}
	cfg := e.cfg
	exact, err := e.exactRouting(idx)
	if err != nil {
		counts.Close()
		return nil, e.reject(opLayout, err)
	}
	e.layoutTask(h, exact, sig)
	if exact != idx {
		exact.Close() // in stream order: after the layout
	}
	if cfg.Mode == Capacity {
		h.recvRows, h.permRows = cfg.MaxRecvTokens, cfg.MaxPermutedTokens
		return h, nil
	}
	if err := e.synchronize(ctx); err != nil {
		counts.Close()
		return nil, err
	}
	h.recvRows, h.permRows = h.lay.RecvCount, h.lay.PermutedCount
	e.log.Named("layout").Debug("layout", zap.Int("rank", e.rank), zap.Int("recv", h.recvRows), zap.Int("permuted", h.permRows))
	return h, nil
}

// exactRouting is idx, or, when idx's buffer is larger than its data
// (device.TensorOf), a copy of the data in a buffer of its own, made in
// stream order: the layout's exchange exposes whole buffers, and the peers
// would read the rest of the buffer as more tokens' routing. The caller
// closes the copy.
func (e *Engine) exactRouting(idx *device.Tensor) (*device.Tensor, error) {
	if idx.Buffer().Size() == len(idx.Bytes()) {
		return idx, nil
	}
	c, err := e.NewTensor(device.Int32, idx.Shape()...)
	if err != nil {
		return nil, err
	}
	e.stream.Go("layout: routing copy", func() error {
		copy(c.Bytes(), idx.Bytes())
		return nil
	})
	return c, nil
}

// layoutTask enqueues the host layout of idx into h.
func (e *Engine) layoutTask(h *Handle, idx *device.Tensor, sig [4]uint64) {
	e.collective(opLayout, func() error {
		if e.hier != nil {
			return e.hierLayout(h, idx, sig)
		}
		return e.exchange(nvlink.Call{Op: opLayout, Sig: sig, Buffers: []*device.Buffer{idx.Buffer()}}, func(peers [][]*device.Buffer) error {
			routing := make([][]int32, len(peers))
			for p := range peers {
				routing[p] = permute.Int32s(peers[p][0].Host())
			}
			lay, err := ComputeLayout(e.rank, e.cfg, routing)
			if err != nil {
				return err
			}
			h.lay = lay
			return e.finishLayout(h)
		})
	})
}

// Relayout runs the layout of new routing into an existing handle
// (collective, capacity mode only): the handle keeps its memory, sizes and
// device addresses, so work captured into a CUDA graph with it (through the
// Into calls) replays with the new routing. TopkIdx must have the handle's
// token count. Errors come as with Layout in capacity mode. Queued work
// that uses the handle runs with the routing it was queued with (stream
// order).
func (e *Engine) Relayout(ctx context.Context, h *Handle, in LayoutInput) error {
	if err := e.enter("relayout"); err != nil {
		return err
	}
	defer e.leave()
	if err := e.checkHandle(h); err != nil {
		return e.reject(opLayout, err)
	}
	idx := in.TopkIdx
	err := e.checkTopk(idx)
	if err == nil && e.cfg.Mode != Capacity {
		err = fmt.Errorf("executor: relayout: %w: output sizes follow the routing in blocking mode (use Capacity mode)", ErrInvalidInput)
	}
	if err == nil && idx.Rows() != h.numTokens {
		err = fmt.Errorf("executor: relayout: TopkIdx has %d tokens, the handle %d: %w", idx.Rows(), h.numTokens, ErrInvalidInput)
	}
	if err != nil {
		return e.reject(opLayout, err)
	}
	e.handles++
	sig := [4]uint64{e.handles}
	if e.gpu != nil {
		return e.gpu.layout(ctx, h, idx, sig)
	}
	e.layoutTask(h, idx, sig)
	return nil
}

// finishLayout writes the device counts and applies the capacity policy
// (stream task).
func (e *Engine) finishLayout(h *Handle) error {
	lay, cfg := h.lay, e.cfg
	c := permute.Int32s(h.counts.Bytes())
	clear(c)
	c[countRecv], c[countPermuted] = int32(lay.RecvCount), int32(lay.PermutedCount)
	copy(c[countsHeader:], lay.TokensPerExpert)
	if cfg.Mode != Capacity {
		return nil
	}
	if lay.RecvCount > cfg.MaxRecvTokens || lay.PermutedCount > cfg.MaxPermutedTokens {
		c[countOverflow] = 1
	}
	if cfg.Overflow == OverflowError {
		return capacityCheck(lay, cfg)
	}
	return nil
}

// capacityCheck returns the CapacityError of a layout, or nil.
func capacityCheck(lay *Layout, cfg Config) error {
	var ce *CapacityError
	for r := range lay.RecvCounts {
		if lay.RecvCounts[r] > cfg.MaxRecvTokens || lay.PermutedCounts[r] > cfg.MaxPermutedTokens {
			if ce == nil {
				ce = &CapacityError{MaxRecvTokens: cfg.MaxRecvTokens, MaxPermutedTokens: cfg.MaxPermutedTokens}
			}
			ce.Ranks = append(ce.Ranks, r)
			ce.RecvCounts = append(ce.RecvCounts, lay.RecvCounts[r])
			ce.PermutedCounts = append(ce.PermutedCounts, lay.PermutedCounts[r])
		}
	}
	if ce == nil {
		return nil
	}
	return ce
}

// NumTokens is T of this rank for this layout.
func (h *Handle) NumTokens() int { return h.numTokens }

// RecvRows is the row count of received-row tensors (RecvX, Z, unpermute
// outputs): RecvCount in blocking mode, MaxRecvTokens in capacity mode.
func (h *Handle) RecvRows() int { return h.recvRows }

// PermutedRows is the row count of permuted tensors: PermutedCount in
// blocking mode, MaxPermutedTokens in capacity mode.
func (h *Handle) PermutedRows() int { return h.permRows }

// DeviceCounts is the counts tensor in device memory, Int32 [4 + L]:
// RecvCount, PermutedCount, overflow flag, 0, then TokensPerExpert. It is
// written by the layout's queued work. The handle owns it: closing it
// makes every later call with the handle fail (ErrInvalidInput).
func (h *Handle) DeviceCounts() *device.Tensor { return h.counts }

// Counts synchronises the engine's stream and returns the counts.
func (h *Handle) Counts(ctx context.Context) (Counts, error) {
	if err := h.e.enter("counts"); err != nil {
		return Counts{}, err
	}
	defer h.e.leave()
	if err := h.usable(); err != nil {
		return Counts{}, err
	}
	b, err := device.Download(ctx, h.counts)
	if err != nil {
		return Counts{}, h.e.noteFailure(err)
	}
	c := device.DecodeInt32(b)
	out := Counts{RecvCount: int(c[countRecv]), PermutedCount: int(c[countPermuted]), Overflow: c[countOverflow] != 0}
	for _, n := range c[countsHeader:] {
		out.TokensPerExpert = append(out.TokensPerExpert, int(n))
	}
	return out, nil
}

// usable reports why the handle cannot be used: closed (ErrClosed), or
// its DeviceCounts tensor closed by the caller (ErrInvalidInput).
func (h *Handle) usable() error {
	if h.closed {
		return fmt.Errorf("executor: handle %d: %w", h.id, ErrClosed)
	}
	if h.counts.Closed() {
		return fmt.Errorf("executor: handle %d: its DeviceCounts tensor was closed (the handle owns it): %w", h.id, ErrInvalidInput)
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
	h.gpu.close()
	_ = h.counts.Close() // (always nil)
}

// checkTopk validates the routing tensor's shape and dtype on the host.
// Values are checked by the layout on every rank.
func (e *Engine) checkTopk(t *device.Tensor) error {
	if err := checkTensor("TopkIdx", t, device.Int32, -1, e.cfg.TopK); err != nil {
		return err
	}
	if t.Rows() > e.cfg.MaxTokensPerRank {
		return fmt.Errorf("executor: layout: %d tokens exceed MaxTokensPerRank %d: %w", t.Rows(), e.cfg.MaxTokensPerRank, ErrInvalidInput)
	}
	return nil
}

// checkTensor checks a tensor's presence, that it was not closed, its
// dtype (0: BF16 or FP32) and 2-D shape (-1: any rows).
func checkTensor(name string, t *device.Tensor, dt device.DType, rows, cols int) error {
	if t == nil {
		return fmt.Errorf("executor: %s is nil: %w", name, ErrInvalidInput)
	}
	if t.Closed() {
		return fmt.Errorf("executor: %s was closed (its memory is freed): %w", name, ErrInvalidInput)
	}
	switch {
	case dt == 0 && t.DType() == device.FP8E4M3:
		return fmt.Errorf("executor: %s has dtype fp8, want bf16 or fp32: fp8 rows are only moved (Dispatch, DispatchPermute, Permute), never summed or scaled: %w", name, ErrInvalidInput)
	case dt == 0 && t.DType() != device.BF16 && t.DType() != device.FP32:
		return fmt.Errorf("executor: %s has dtype %v, want bf16 or fp32: %w", name, t.DType(), ErrInvalidInput)
	case dt != 0 && t.DType() != dt:
		return fmt.Errorf("executor: %s has dtype %v, want %v: %w", name, t.DType(), dt, ErrInvalidInput)
	}
	// Kernels access elements at their own size (a caller's wrapped
	// device memory may start anywhere).
	if p, n := t.Buffer().DevicePtr(), t.DType().Size(); p%uint64(n) != 0 {
		return fmt.Errorf("executor: %s starts at address %#x, not a multiple of its %v elements' %d bytes: %w", name, p, t.DType(), n, ErrInvalidInput)
	}
	s := t.Shape()
	if len(s) != 2 || (rows >= 0 && s[0] != rows) || s[1] != cols {
		want := fmt.Sprintf("[%d %d]", rows, cols)
		if rows < 0 {
			want = fmt.Sprintf("[T %d]", cols)
		}
		return fmt.Errorf("executor: %s has shape %v, want %s: %w", name, s, want, ErrInvalidInput)
	}
	return nil
}

// checkMoved is checkTensor for rows that are only moved (dispatch and
// permute): bf16, fp32 or fp8.
func checkMoved(name string, t *device.Tensor, rows, cols int) error {
	if t != nil && t.DType() == device.FP8E4M3 {
		return checkTensor(name, t, device.FP8E4M3, rows, cols)
	}
	return checkTensor(name, t, 0, rows, cols)
}

// checkScales checks the scales s of rows x: [rows, Hidden/128] FP32 given
// exactly when x is FP8E4M3 (whose Hidden must then be a multiple of 128).
// x itself was checked before.
func (e *Engine) checkScales(name string, x, s *device.Tensor, rows int) error {
	fp8 := x.DType() == device.FP8E4M3
	switch {
	case !fp8 && s != nil:
		return fmt.Errorf("executor: %s given with %v rows: scales come with fp8 rows only: %w", name, x.DType(), ErrInvalidInput)
	case !fp8:
		return nil
	case e.cfg.Hidden%device.FP8ScaleChannels != 0:
		return fmt.Errorf("executor: %s: fp8 rows need Hidden to be a multiple of %d (one fp32 scale per %d channels), and Hidden is %d: %w",
			name, device.FP8ScaleChannels, device.FP8ScaleChannels, e.cfg.Hidden, ErrInvalidInput)
	case s == nil:
		return fmt.Errorf("executor: %s is nil: fp8 rows need their scales ([rows, Hidden/%d] fp32): %w", name, device.FP8ScaleChannels, ErrInvalidInput)
	}
	return checkTensor(name, s, device.FP32, rows, e.scaleCols())
}

// scaleCols is the number of fp32 scales of an fp8 row.
func (e *Engine) scaleCols() int { return e.cfg.Hidden / device.FP8ScaleChannels }

// rowBytes is the size of one row of a 2-D tensor.
func rowBytes(t *device.Tensor) int { return t.Shape()[1] * t.DType().Size() }
