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
func (e *Engine) validRecv(lay *Layout, d int) int {
	if e.cfg.Mode == Capacity {
		return min(lay.RecvCounts[d], e.cfg.MaxRecvTokens)
	}
	return lay.RecvCounts[d]
}

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
	if h.closed {
		return fmt.Errorf("executor: handle %d: %w", h.id, ErrClosed)
	}
	return nil
}

// signature of a data call: handle, dtype, weighted.
func sig(h *Handle, dt device.DType, weighted bool) [4]uint64 {
	w := uint64(0)
	if weighted {
		w = 1
	}
	return [4]uint64{h.id, uint64(dt), w}
}

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

// newOutputs allocates tensors, closing them all if one fails.
func (e *Engine) newOutputs(specs ...outSpec) ([]*device.Tensor, error) {
	out := make([]*device.Tensor, len(specs))
	for i, s := range specs {
		if s.skip {
			continue
		}
		t, err := e.NewTensor(s.dt, s.shape...)
		if err != nil {
			closeAll(out...)
			return nil, err
		}
		out[i] = t
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
	if err := e.checkHandle(h); err != nil {
		return DispatchOutput{}, e.reject(opDispatch, err)
	}
	if err := e.checkDispatchInput(h, in); err != nil {
		return DispatchOutput{}, e.reject(opDispatch, err)
	}
	x, w := in.X, in.TopkWeights
	K, H := e.cfg.TopK, e.cfg.Hidden
	o, err := e.newOutputs(
		outSpec{dt: x.DType(), shape: []int{h.recvRows, H}},
		outSpec{dt: device.Int32, shape: []int{h.recvRows, K}},
		outSpec{dt: device.FP32, shape: []int{h.recvRows, K}, skip: w == nil})
	if err != nil {
		return DispatchOutput{}, err
	}
	out := DispatchOutput{RecvX: o[0], RecvIdx: o[1], RecvWeights: o[2]}
	if e.gpu != nil {
		return out, e.gpu.dispatch(h, x, w, out)
	}
	e.stream.Go("dispatch", func() error {
		lay, err := e.ready(h)
		if err != nil {
			return err
		}
		return e.exchange(nvlink.Call{Op: opDispatch, Sig: sig(h, x.DType(), w != nil), Buffers: []*device.Buffer{x.Buffer(), buf(w)}},
			func(peers [][]*device.Buffer) error {
				n := e.validRecv(lay, e.rank)
				gatherRows(lay, peers, x.DType(), H, out.RecvX.Bytes(), n)
				writeRecvMeta(lay, peers, n, h.recvRows, out.RecvIdx, out.RecvWeights)
				return nil
			})
	})
	return out, nil
}

// gatherRows copies, for each received row i < n, x[RecvSrcToken[i]] of
// rank RecvSrcRank[i] (buffer 0 of that peer) into dst row i, and zeroes
// the rows of dst past n.
func gatherRows(lay *Layout, peers [][]*device.Buffer, dt device.DType, hidden int, dst []byte, n int) {
	rb := hidden * dt.Size()
	device.ParallelFor(n, 16, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			src := peers[lay.RecvSrcRank[i]][0].Host()
			t := int(lay.RecvSrcToken[i])
			copy(dst[i*rb:(i+1)*rb], src[t*rb:(t+1)*rb])
		}
	})
	clear(dst[n*rb:])
}

// writeRecvMeta fills RecvIdx (rows past n: -1) and, when weights were
// dispatched (buffer 1 of every peer), RecvWeights (0 off this rank's
// slots and past n).
func writeRecvMeta(lay *Layout, peers [][]*device.Buffer, n, rows int, idx, w *device.Tensor) {
	K := lay.TopK
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
		src := permute.Float32s(peers[lay.RecvSrcRank[i]][1].Host())
		t := int(lay.RecvSrcToken[i])
		for k := range K {
			if lay.RecvIdx[i*K+k] >= 0 {
				rw[i*K+k] = src[t*K+k]
			} else {
				rw[i*K+k] = 0
			}
		}
	}
	clear(rw[n*K:])
}

func (e *Engine) checkDispatchInput(h *Handle, in DispatchInput) error {
	if err := checkTensor("dispatch: X", in.X, 0, h.numTokens, e.cfg.Hidden); err != nil {
		return err
	}
	if in.TopkWeights != nil {
		if err := checkTensor("dispatch: TopkWeights", in.TopkWeights, device.FP32, h.numTokens, e.cfg.TopK); err != nil {
			return err
		}
	}
	return nil
}

// Combine sends every received row back to its source and sums (collective):
// out[t] on the source is the fp32 sum, over the destination ranks of t in
// ascending order, of their z rows for t, rounded once; a token routed
// nowhere gets a zero row.
func (e *Engine) Combine(ctx context.Context, h *Handle, in CombineInput) (*device.Tensor, error) {
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
		return DispatchBackwardOutput{}, err
	}
	out := DispatchBackwardOutput{GradX: o[0], GradTopkWeights: o[1]}
	if e.gpu != nil {
		return out, e.gpu.combine(h, z, zw, out, uint32(opCombine))
	}
	e.stream.Go("combine", func() error {
		lay, err := e.ready(h)
		if err != nil {
			return err
		}
		return e.exchange(nvlink.Call{Op: opCombine, Sig: sig(h, z.DType(), zw != nil), Buffers: []*device.Buffer{z.Buffer(), buf(zw)}},
			func(peers [][]*device.Buffer) error {
				e.sumRows(lay, peers, z.DType(), out.GradX.Bytes(), nil)
				if zw != nil {
					e.gatherSlotWeights(lay, peers, f32(out.GradTopkWeights))
				}
				return nil
			})
	})
	return out, nil
}

// unpermuteSpec, when not nil, makes sumRows unpermute each destination's
// row first (the fused UnpermuteCombine): peers' buffer 0 is then y and
// buffer 1 the optional weights.
type unpermuteSpec struct{ weighted bool }

// sumRows computes, for each local token t, the fp32 sum over its
// destinations d ascending of row SendRow of d's buffer 0 (skipping rows
// past d's valid count), rounded once into out[t]; zero when no term. With
// u set, each term is first unpermuted on the fly and rounded to the dtype,
// exactly as Unpermute would have written it.
func (e *Engine) sumRows(lay *Layout, peers [][]*device.Buffer, dt device.DType, out []byte, u *unpermuteSpec) {
	H, K := e.cfg.Hidden, lay.TopK
	rb := H * dt.Size()
	device.ParallelFor(lay.NumTokens, 16, func(lo, hi int) {
		var terms, slots permute.Terms
		var tmp [][]byte // one unpermuted row per destination (fused only)
		var tw []float32
		var tpos []int32
		if u != nil {
			tw = make([]float32, K)
			tpos = make([]int32, K)
		}
		for t := lo; t < hi; t++ {
			terms.Reset()
			for j := lay.SendOffsets[t]; j < lay.SendOffsets[t+1]; j++ {
				d, row := int(lay.SendDest[j]), int(lay.SendRow[j])
				if row >= e.validRecv(lay, d) {
					continue // dropped at d (capacity mode)
				}
				if u == nil {
					terms.Rows = append(terms.Rows, peers[d][0].Host()[row*rb:(row+1)*rb])
					continue
				}
				if len(tmp) <= len(terms.Rows) {
					tmp = append(tmp, make([]byte, rb))
				}
				term := tmp[len(terms.Rows)]
				e.slotsOn(lay, t, d, row, peers[d], u.weighted, tpos, tw)
				var ws []float32
				if u.weighted {
					ws = tw
				}
				permute.UnpermuteRow(dt, term, peers[d][0].Host(), tpos, ws, e.permCapOf(lay, d), &slots)
				terms.Rows = append(terms.Rows, term)
			}
			permute.SumRows(dt, out[t*rb:(t+1)*rb], terms.Rows, nil)
		}
	})
}

// permCapOf is rank d's permuted-row capacity: its permuted count in
// blocking mode.
func (e *Engine) permCapOf(lay *Layout, d int) int {
	if e.cfg.Mode == Capacity {
		return e.cfg.MaxPermutedTokens
	}
	return lay.PermutedCounts[d]
}

// slotsOn fills pos[k] with the position on rank d of slot k of local token
// t (-1 for slots on other ranks) and, if weighted, w[k] with d's
// RecvWeights[row][k] (peer buffer 1).
func (e *Engine) slotsOn(lay *Layout, t, d, row int, peer []*device.Buffer, weighted bool, pos []int32, w []float32) {
	K, L := lay.TopK, lay.NumLocalExperts
	var pw []float32
	if weighted {
		pw = permute.Float32s(peer[1].Host())
	}
	for k := range K {
		pos[k] = -1
		if lay.SlotRow[t*K+k] < 0 {
			continue
		}
		if int(lay.SlotExpert[t*K+k])/L == d {
			pos[k] = lay.SlotPos[t*K+k]
			if weighted {
				w[k] = pw[row*K+k]
			}
		}
	}
}

// gatherSlotWeights sets gw[t*K+k] = peer weights[row*K+k] of the rank owning
// slot k's expert (peer buffer 1), 0 for empty slots and dropped rows.
func (e *Engine) gatherSlotWeights(lay *Layout, peers [][]*device.Buffer, gw []float32) {
	K, L := lay.TopK, lay.NumLocalExperts
	for t := range lay.NumTokens {
		for k := range K {
			row := int(lay.SlotRow[t*K+k])
			gw[t*K+k] = 0
			if row < 0 {
				continue
			}
			d := int(lay.SlotExpert[t*K+k]) / L
			if row >= e.validRecv(lay, d) {
				continue
			}
			gw[t*K+k] = permute.Float32s(peers[d][1].Host())[row*K+k]
		}
	}
}
