package executor

import (
	"context"
	"fmt"

	"github.com/goep/goep/device"
	"github.com/goep/goep/nvlink"
	"github.com/goep/goep/permute"
)

// The data path on the host backend pulls: within one exchange every rank
// exposes its inputs, then reads what it needs from its peers' buffers and
// writes only its own outputs. Dispatch runs on the receiver, combine on
// the source. The exchange's done phase keeps every exposed input alive and
// unchanged until all peers have read it.

// validRecv is the number of valid received rows of rank d: its count,
// clipped to the capacity in capacity mode.
func (e *Engine) validRecv(lay *Layout, d int) int { return validRecvOf(lay, e.cfg, d) }

func (e *Engine) permCap(lay *Layout) int {
	if e.cfg.Mode == Capacity {
		return e.cfg.MaxPermutedTokens
	}
	return lay.PermutedCount
}

// ready checks, in a stream task, that the handle's layout exists and may be
// used: under OverflowError an over-capacity layout fails every call on it.
func (e *Engine) ready(h *Handle) (*Layout, error) {
	if h.lay == nil {
		return nil, fmt.Errorf("executor: handle %d has no layout (its layout failed)", h.id)
	}
	if e.cfg.Mode == Capacity && e.cfg.Overflow == OverflowError {
		if err := capacityCheck(h.lay, e.cfg); err != nil {
			return nil, err
		}
	}
	return h.lay, nil
}

func (e *Engine) checkHandle(h *Handle) error {
	if err := e.usable(); err != nil {
		return err
	}
	if h == nil {
		return fmt.Errorf("executor: nil handle: %w", ErrInvalidInput)
	}
	if h.e != e {
		return fmt.Errorf("executor: handle %d belongs to another engine: %w", h.id, ErrInvalidInput)
	}
	return h.usable()
}

// signature of a data call: handle, dtype, weighted, and which round of
// the call (roundRows, or roundScales for an fp8 call's scales).
func sig(h *Handle, dt device.DType, weighted bool) [4]uint64 {
	w := uint64(0)
	if weighted {
		w = 1
	}
	return [4]uint64{h.id, uint64(dt), w, roundRows}
}

// The rounds of a dispatch-like call. An fp8 call moves its rows, then
// their scales with the same routing in a second round of the same
// call; every rank runs both, since the dtype is part of the signature.
const (
	roundRows uint64 = iota
	roundScales
)

func buf(t *device.Tensor) *device.Buffer {
	if t == nil {
		return nil
	}
	return t.Buffer()
}

func f32(t *device.Tensor) []float32 {
	if t == nil {
		return nil
	}
	return permute.Float32s(t.Bytes())
}

// newOutputs allocates tensors, closing them all if one fails. On the
// GPU the allocations share one hand-off to the driver thread
// (gpuEngine.enqueue): the tensors after the first take the device's lock
// and make its context current no more.
func (e *Engine) newOutputs(specs ...outSpec) ([]*device.Tensor, error) {
	out := make([]*device.Tensor, len(specs))
	alloc := func() error {
		for i, s := range specs {
			if s.skip {
				continue
			}
			t, err := e.NewTensor(s.dt, s.shape...)
			if err != nil {
				return err
			}
			out[i] = t
		}
		return nil
	}
	var err error
	if e.gpu != nil {
		err = e.gpu.enqueue(alloc)
	} else {
		err = alloc()
	}
	if err != nil {
		closeAll(out...)
		return nil, err
	}
	return out, nil
}

type outSpec struct {
	dt    device.DType
	shape []int
	skip  bool
}

// Dispatch sends every token to the ranks owning its experts (collective).
// Received row i is x of its source (rank, token), in receive order.
func (e *Engine) Dispatch(ctx context.Context, h *Handle, in DispatchInput) (DispatchOutput, error) {
	if err := e.enter("dispatch"); err != nil {
		return DispatchOutput{}, err
	}
	defer e.leave()
	return e.dispatchCall(h, in)
}

// dispatchCall is Dispatch, inside enter (CombineBackward's too).
func (e *Engine) dispatchCall(h *Handle, in DispatchInput) (DispatchOutput, error) {
	if err := e.checkHandle(h); err != nil {
		return DispatchOutput{}, e.reject(opDispatch, err)
	}
	if err := e.checkDispatchInput(h, in); err != nil {
		return DispatchOutput{}, e.reject(opDispatch, err)
	}
	x, w, sx := in.X, in.TopkWeights, in.XScales
	K, H := e.cfg.TopK, e.cfg.Hidden
	o, err := e.newOutputs(
		outSpec{dt: x.DType(), shape: []int{h.recvRows, H}},
		outSpec{dt: device.Int32, shape: []int{h.recvRows, K}},
		outSpec{dt: device.FP32, shape: []int{h.recvRows, K}, skip: w == nil},
		outSpec{dt: device.FP32, shape: []int{h.recvRows, e.scaleCols()}, skip: sx == nil})
	if err != nil {
		return DispatchOutput{}, e.reject(opDispatch, err) // the peers must not wait for this rank
	}
	out := DispatchOutput{RecvX: o[0], RecvIdx: o[1], RecvWeights: o[2], RecvScales: o[3]}
	if e.gpu != nil {
		return out, e.gpu.enqueue(func() error { return e.gpu.dispatch(h, x, w, sx, out) })
	}
	e.collective(opDispatch, func() error {
		lay, err := e.ready(h)
		if err != nil {
			return err
		}
		err = e.pull(lay, h, opDispatch, roundRows, x, w, func(src []recvSrc) error {
			e.gatherRows(src, out.RecvX.Bytes())
			writeRecvMeta(lay, src, h.recvRows, out.RecvIdx, out.RecvWeights)
			return nil
		})
		if err != nil || sx == nil {
			return err
		}
		return e.pull(lay, h, opDispatch, roundScales, sx, nil, func(src []recvSrc) error {
			e.gatherRows(src, out.RecvScales.Bytes())
			return nil
		})
	})
	return out, nil
}

// recvSrc is where received row i comes from: its source's x row and,
// when weights are dispatched, the source token's K weights.
type recvSrc struct {
	x []byte
	w []float32
}

// pull runs one round (roundRows, or roundScales: an fp8 call's scales) of
// the collective half of a dispatch-like call (op) on the rows of x and the
// optional weights w, and calls fn with the source of every valid received
// row (min(RecvCount, capacity) of them), from the domain exchange.
func (e *Engine) pull(lay *Layout, h *Handle, op, round uint64, x, w *device.Tensor, fn func(src []recvSrc) error) error {
	sg := sig(h, x.DType(), w != nil)
	sg[3] = round
	c := nvlink.Call{Op: op, Sig: sg, Buffers: []*device.Buffer{x.Buffer(), buf(w)}}
	if e.hier != nil {
		return e.hierPull(lay, c, x, w, fn)
	}
	rb := rowBytes(x)
	return e.exchange(c, func(peers [][]*device.Buffer) error {
		return fn(e.sources(lay, peers, rb, w != nil))
	})
}

// sources locates every valid received row among the domain's exposed
// buffers: buffer 0 (x) and 1 (weights) of its source when the source is in
// this domain, else the source's forwarded copy in buffer 2 of this
// domain's rank with the source's local index (several domains only).
func (e *Engine) sources(lay *Layout, peers [][]*device.Buffer, rb int, weighted bool) []recvSrc {
	K, D := lay.TopK, lay.RanksPerDomain
	me := e.rank / D
	src := make([]recvSrc, e.validRecv(lay, e.rank))
	for i := range src {
		s, t := int(lay.RecvSrcRank[i]), int(lay.RecvSrcToken[i])
		p := peers[s%D]
		if s/D == me {
			src[i].x = p[0].Host()[t*rb : (t+1)*rb]
			if weighted {
				src[i].w = f32s(p[1].Host())[t*K : (t+1)*K]
			}
			continue
		}
		slot := p[2].Host()[s/D*e.hier.slot:]
		f := int(lay.RecvFwdRow[i])
		o := railHeader + e.hier.area + f*rb
		src[i].x = slot[o : o+rb]
		if weighted {
			src[i].w = f32s(slot[railHeader:])[f*K : (f+1)*K]
		}
	}
	return src
}

// par is how the host backend spreads its copies between ranks
// (Config.SMs, Config.ChunkRows).
func (e *Engine) par() device.Parallel {
	return device.Parallel{Workers: e.cfg.SMs, Chunk: e.cfg.ChunkRows}
}

// gatherRows copies each source row into dst row i and zeroes the rows of
// dst past len(src).
func (e *Engine) gatherRows(src []recvSrc, dst []byte) {
	e.par().For(len(src), 16, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			rb := len(src[i].x)
			copy(dst[i*rb:(i+1)*rb], src[i].x)
		}
	})
	if len(src) > 0 {
		clear(dst[len(src)*len(src[0].x):])
	} else {
		clear(dst)
	}
}

// writeRecvMeta fills RecvIdx (rows past len(src): -1) and, when weights
// were dispatched, RecvWeights (0 off this rank's slots and past len(src)).
func writeRecvMeta(lay *Layout, src []recvSrc, rows int, idx, w *device.Tensor) {
	K, n := lay.TopK, len(src)
	ri := permute.Int32s(idx.Bytes())
	copy(ri, lay.RecvIdx[:n*K])
	for i := n * K; i < rows*K; i++ {
		ri[i] = -1
	}
	if w == nil {
		return
	}
	rw := permute.Float32s(w.Bytes())
	for i := range n {
		for k := range K {
			if lay.RecvIdx[i*K+k] >= 0 {
				rw[i*K+k] = src[i].w[k]
			} else {
				rw[i*K+k] = 0
			}
		}
	}
	clear(rw[n*K:])
}

func (e *Engine) checkDispatchInput(h *Handle, in DispatchInput) error {
	if err := checkMoved("dispatch: X", in.X, h.numTokens, e.cfg.Hidden); err != nil {
		return err
	}
	if in.TopkWeights != nil {
		if err := checkTensor("dispatch: TopkWeights", in.TopkWeights, device.FP32, h.numTokens, e.cfg.TopK); err != nil {
			return err
		}
	}
	return e.checkScales("dispatch: XScales", in.X, in.XScales, h.numTokens)
}

// Combine sends every received row back to its source and sums (collective):
// out[t] on the source is the fp32 sum, over the destination ranks of t in
// ascending order, of their z rows for t, rounded once; a token routed
// nowhere gets a zero row.
func (e *Engine) Combine(ctx context.Context, h *Handle, in CombineInput) (*device.Tensor, error) {
	if err := e.enter("combine"); err != nil {
		return nil, err
	}
	defer e.leave()
	if err := e.checkHandle(h); err != nil {
		return nil, e.reject(opCombine, err)
	}
	if err := checkTensor("combine: Z", in.Z, 0, h.recvRows, e.cfg.Hidden); err != nil {
		return nil, e.reject(opCombine, err)
	}
	out, err := e.combine(h, in.Z, nil)
	return out.GradX, err
}

// combine is Combine and DispatchBackward: it also pulls per-slot weights
// (gradients) back to their source when zw is given.
func (e *Engine) combine(h *Handle, z, zw *device.Tensor) (DispatchBackwardOutput, error) {
	H, K := e.cfg.Hidden, e.cfg.TopK
	o, err := e.newOutputs(
		outSpec{dt: z.DType(), shape: []int{h.numTokens, H}},
		outSpec{dt: device.FP32, shape: []int{h.numTokens, K}, skip: zw == nil})
	if err != nil {
		return DispatchBackwardOutput{}, e.reject(opCombine, err)
	}
	out := DispatchBackwardOutput{GradX: o[0], GradTopkWeights: o[1]}
	if e.gpu != nil {
		return out, e.gpu.enqueue(func() error { return e.gpu.combine(h, z, zw, out, uint32(opCombine)) })
	}
	e.collective(opCombine, func() error {
		lay, err := e.ready(h)
		if err != nil {
			return err
		}
		c := nvlink.Call{Op: opCombine, Sig: sig(h, z.DType(), zw != nil), Buffers: []*device.Buffer{z.Buffer(), buf(zw)}}
		return e.sum(lay, c, z.DType(), out.GradX.Bytes(), out.GradTopkWeights, nil)
	})
	return out, nil
}

// unpermuteSpec, when not nil, makes the combine sum unpermute each
// destination's row first (the fused UnpermuteCombine): peers' buffer 0 is
// then y and buffer 1 the optional weights.
type unpermuteSpec struct{ weighted bool }

// sum runs the collective half of a combine-like call: for each local
// token t, out[t] is the fp32 sum over its destinations d ascending of row
// SendRow of d's buffer 0 (skipping rows past d's valid count), rounded
// once; zero when no term (with several domains, per domain first: see
// hierCombine). gwt, when not nil, gets each slot's value from buffer 1 of
// the rank owning the slot's expert (DispatchBackward's weight gradients).
// With u set, each term is first unpermuted on the fly and rounded to the
// dtype, exactly as Unpermute would have written it.
func (e *Engine) sum(lay *Layout, c nvlink.Call, dt device.DType, out []byte, gwt *device.Tensor, u *unpermuteSpec) error {
	if e.hier != nil {
		return e.hierCombine(lay, c, dt, out, gwt, u)
	}
	gw := f32(gwt)
	return e.exchange(c, func(peers [][]*device.Buffer) error {
		rb := e.cfg.Hidden * dt.Size()
		newTermer := func() *termer { return e.newTermer(lay, peers, dt, u) }
		device.ForScratch(e.par(), lay.NumTokens, 16, newTermer, func(c *termer, lo, hi int) {
			for t := lo; t < hi; t++ {
				permute.SumRows(dt, out[t*rb:(t+1)*rb], c.collect(&lay.SendSide, t, -1), nil)
			}
		})
		if gwt != nil {
			K := lay.TopK
			for t := range lay.NumTokens {
				for k := range K {
					gw[t*K+k] = e.slotGrad(lay, &lay.SendSide, t, k, 0, peers)
				}
			}
		}
		return nil
	})
}

// termer collects the terms of one token's sum, with scratch for the
// unpermuted rows of the fused call; one per worker goroutine.
type termer struct {
	e     *Engine
	lay   *Layout
	peers [][]*device.Buffer
	dt    device.DType
	u     *unpermuteSpec
	rb    int
	rows  [][]byte
	tmp   [][]byte // unpermuted rows (fused only)
	slots permute.Terms
	tw    []float32
	tpos  []int32
}

func (e *Engine) newTermer(lay *Layout, peers [][]*device.Buffer, dt device.DType, u *unpermuteSpec) *termer {
	c := &termer{e: e, lay: lay, peers: peers, dt: dt, u: u, rb: e.cfg.Hidden * dt.Size()}
	if u != nil {
		c.tw = make([]float32, lay.TopK)
		c.tpos = make([]int32, lay.TopK)
	}
	return c
}

// collect returns the terms of token t of side from its destinations in
// domain n (every destination when n < 0), in ascending rank order,
// skipping rows dropped at their destination (capacity mode). The rows stay
// valid until the next collect.
func (c *termer) collect(side *SendSide, t, n int) [][]byte {
	e, lay, rb, D := c.e, c.lay, c.rb, c.lay.RanksPerDomain
	c.rows = c.rows[:0]
	for j := side.SendOffsets[t]; j < side.SendOffsets[t+1]; j++ {
		d, row := int(side.SendDest[j]), int(side.SendRow[j])
		if (n >= 0 && d/D != n) || row >= e.validRecv(lay, d) {
			continue
		}
		peer := c.peers[d%D]
		if c.u == nil {
			c.rows = append(c.rows, peer[0].Host()[row*rb:(row+1)*rb])
			continue
		}
		if len(c.tmp) <= len(c.rows) {
			c.tmp = append(c.tmp, make([]byte, rb))
		}
		term := c.tmp[len(c.rows)]
		slotsOn(lay, side, t, d, row, peer, c.u.weighted, c.tpos, c.tw)
		var ws []float32
		if c.u.weighted {
			ws = c.tw
		}
		permute.UnpermuteRow(c.dt, term, peer[0].Host(), c.tpos, ws, e.permCapOf(lay, d), &c.slots)
		c.rows = append(c.rows, term)
	}
	return c.rows
}

// permCapOf is rank d's permuted-row capacity: its permuted count in
// blocking mode.
func (e *Engine) permCapOf(lay *Layout, d int) int {
	if e.cfg.Mode == Capacity {
		return e.cfg.MaxPermutedTokens
	}
	return lay.PermutedCounts[d]
}

// slotsOn fills pos[k] with the position on rank d of slot k of token t of
// side (-1 for slots on other ranks) and, if weighted, w[k] with d's
// RecvWeights[row][k] (peer buffer 1).
func slotsOn(lay *Layout, side *SendSide, t, d, row int, peer []*device.Buffer, weighted bool, pos []int32, w []float32) {
	K, L := lay.TopK, lay.NumLocalExperts
	var pw []float32
	if weighted {
		pw = permute.Float32s(peer[1].Host())
	}
	for k := range K {
		pos[k] = -1
		if side.SlotRow[t*K+k] < 0 {
			continue
		}
		if int(side.SlotExpert[t*K+k])/L == d {
			pos[k] = side.SlotPos[t*K+k]
			if weighted {
				w[k] = pw[row*K+k]
			}
		}
	}
}
