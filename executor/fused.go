package executor

import (
	"context"

	"github.com/goep/goep/device"
	"github.com/goep/goep/nvlink"
	"github.com/goep/goep/permute"
)

// DispatchPermute is Permute(Dispatch(in)) in one pass (collective): each
// received row goes straight to its positions in the expert-major layout.
// Results are bit-identical to the unfused calls.
func (e *Engine) DispatchPermute(ctx context.Context, h *Handle, in DispatchInput) (DispatchPermuteOutput, error) {
	if err := e.checkHandle(h); err != nil {
		return DispatchPermuteOutput{}, e.reject(opDispatchPermute, err)
	}
	if err := e.checkDispatchInput(h, in); err != nil {
		return DispatchPermuteOutput{}, e.reject(opDispatchPermute, err)
	}
	x, w := in.X, in.TopkWeights
	K, H := e.cfg.TopK, e.cfg.Hidden
	o, err := e.newOutputs(
		outSpec{dt: x.DType(), shape: []int{h.permRows, H}},
		outSpec{dt: device.FP32, shape: []int{h.permRows}, skip: w == nil},
		outSpec{dt: device.Int32, shape: []int{h.recvRows, K}},
		outSpec{dt: device.FP32, shape: []int{h.recvRows, K}, skip: w == nil})
	if err != nil {
		return DispatchPermuteOutput{}, err
	}
	out := DispatchPermuteOutput{X: o[0], Weights: o[1], RecvIdx: o[2], RecvWeights: o[3]}
	if e.gpu != nil {
		return out, e.gpu.dispatchPermute(h, x, w, out)
	}
	e.stream.Go("dispatch-permute", func() error {
		lay, err := e.ready(h)
		if err != nil {
			return err
		}
		return e.exchange(nvlink.Call{Op: opDispatchPermute, Sig: sig(h, x.DType(), w != nil), Buffers: []*device.Buffer{x.Buffer(), buf(w)}},
			func(peers [][]*device.Buffer) error {
				n := e.validRecv(lay, e.rank)
				writeRecvMeta(lay, peers, n, h.recvRows, out.RecvIdx, out.RecvWeights)
				e.gatherPermuted(lay, peers, x.DType(), n, out.X.Bytes(), f32(out.RecvWeights), f32(out.Weights))
				return nil
			})
	})
	return out, nil
}

// gatherPermuted writes each received row i < n (pulled from its source's
// buffer 0) to its permuted positions, with its slot weights from rw, and
// zeroes the padding.
func (e *Engine) gatherPermuted(lay *Layout, peers [][]*device.Buffer, dt device.DType, n int, px []byte, rw, pw []float32) {
	H, K := e.cfg.Hidden, lay.TopK
	rb := H * dt.Size()
	pcap := e.permCap(lay)
	device.ParallelFor(n, 16, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			src := peers[lay.RecvSrcRank[i]][0].Host()
			t := int(lay.RecvSrcToken[i])
			row := src[t*rb : (t+1)*rb]
			for k := range K {
				p := int(lay.Pos[i*K+k])
				if p < 0 || p >= pcap {
					continue
				}
				copy(px[p*rb:(p+1)*rb], row)
				if pw != nil {
					pw[p] = rw[i*K+k]
				}
			}
		}
	})
	permute.ZeroPadding(px, rb, pw, lay.ExpertOffsets, lay.TokensPerExpert, pcap)
	permute.ZeroDropped(px, rb, pw, permute.Map{Rows: n, TopK: K, Pos: lay.Pos, PermCap: pcap})
}

// UnpermuteCombine is Combine(Unpermute(in)) in one pass (collective): each
// source reads its tokens' expert outputs from the destinations, folds them
// per destination (rounded to the dtype, as Unpermute's output would be)
// and sums the destinations. Results are bit-identical to the unfused
// calls.
func (e *Engine) UnpermuteCombine(ctx context.Context, h *Handle, in UnpermuteInput) (*device.Tensor, error) {
	if err := e.checkHandle(h); err != nil {
		return nil, e.reject(opUnpermuteCombine, err)
	}
	if err := e.checkUnpermuteInput(h, in); err != nil {
		return nil, e.reject(opUnpermuteCombine, err)
	}
	y, w := in.Y, in.RecvWeights
	out, err := e.NewTensor(y.DType(), h.numTokens, e.cfg.Hidden)
	if err != nil {
		return nil, err
	}
	if e.gpu != nil {
		return out, e.gpu.unpermuteCombine(h, y, w, out)
	}
	e.stream.Go("unpermute-combine", func() error {
		lay, err := e.ready(h)
		if err != nil {
			return err
		}
		return e.exchange(nvlink.Call{Op: opUnpermuteCombine, Sig: sig(h, y.DType(), w != nil), Buffers: []*device.Buffer{y.Buffer(), buf(w)}},
			func(peers [][]*device.Buffer) error {
				e.sumRows(lay, peers, y.DType(), out.Bytes(), &unpermuteSpec{weighted: w != nil})
				return nil
			})
	})
	return out, nil
}

func (e *Engine) checkUnpermuteInput(h *Handle, in UnpermuteInput) error {
	if err := checkTensor("unpermute: Y", in.Y, 0, h.permRows, e.cfg.Hidden); err != nil {
		return err
	}
	if in.RecvWeights != nil {
		return checkTensor("unpermute: RecvWeights", in.RecvWeights, device.FP32, h.recvRows, e.cfg.TopK)
	}
	return nil
}

// DispatchBackward is the gradient of Dispatch (collective): Combine of
// GradRecvX, and, when GradRecvWeights is given, each slot's weight
// gradient sent back to its source (GradTopkWeights, 0 on empty slots).
func (e *Engine) DispatchBackward(ctx context.Context, h *Handle, in DispatchBackwardInput) (DispatchBackwardOutput, error) {
	if err := e.checkHandle(h); err != nil {
		return DispatchBackwardOutput{}, e.reject(opCombine, err)
	}
	err := checkTensor("dispatch backward: GradRecvX", in.GradRecvX, 0, h.recvRows, e.cfg.Hidden)
	if err == nil && in.GradRecvWeights != nil {
		err = checkTensor("dispatch backward: GradRecvWeights", in.GradRecvWeights, device.FP32, h.recvRows, e.cfg.TopK)
	}
	if err != nil {
		return DispatchBackwardOutput{}, e.reject(opCombine, err)
	}
	return e.combine(h, in.GradRecvX, in.GradRecvWeights)
}

// CombineBackward is the gradient of Combine (collective): Dispatch of the
// output gradient [T_r, Hidden], giving the gradient of Z.
func (e *Engine) CombineBackward(ctx context.Context, h *Handle, gradOut *device.Tensor) (*device.Tensor, error) {
	out, err := e.Dispatch(ctx, h, DispatchInput{X: gradOut})
	if err != nil {
		return nil, err
	}
	out.RecvIdx.Close()
	return out.RecvX, nil
}
