package executor

import (
	"context"
	"errors"
	"fmt"

	"github.com/goep/goep/device"
	"github.com/goep/goep/nvlink"
	"github.com/goep/goep/permute"
)

// DispatchPermute is Permute(Dispatch(in)) in one pass (collective): each
// received row goes straight to its positions in the expert-major layout.
// Results are bit-identical to the unfused calls.
func (e *Engine) DispatchPermute(ctx context.Context, h *Handle, in DispatchInput) (DispatchPermuteOutput, error) {
	if err := e.enter("dispatch-permute"); err != nil {
		return DispatchPermuteOutput{}, err
	}
	defer e.leave()
	if err := e.checkHandle(h); err != nil {
		return DispatchPermuteOutput{}, e.reject(opDispatchPermute, err)
	}
	if err := e.checkDispatchInput(h, in); err != nil {
		return DispatchPermuteOutput{}, e.reject(opDispatchPermute, err)
	}
	x, w, sx := in.X, in.TopkWeights, in.XScales
	K, H := e.cfg.TopK, e.cfg.Hidden
	o, err := e.newOutputs(
		outSpec{dt: x.DType(), shape: []int{h.permRows, H}},
		outSpec{dt: device.FP32, shape: []int{h.permRows}, skip: w == nil},
		outSpec{dt: device.Int32, shape: []int{h.recvRows, K}},
		outSpec{dt: device.FP32, shape: []int{h.recvRows, K}, skip: w == nil},
		outSpec{dt: device.FP32, shape: []int{h.permRows, e.scaleCols()}, skip: sx == nil})
	if err != nil {
		return DispatchPermuteOutput{}, e.reject(opDispatchPermute, err)
	}
	out := DispatchPermuteOutput{X: o[0], Weights: o[1], RecvIdx: o[2], RecvWeights: o[3], Scales: o[4]}
	return out, e.dispatchPermute(h, x, w, sx, out)
}

// DispatchPermuteInto is DispatchPermute writing into outputs the caller
// allocated (shapes and dtypes as DispatchPermute's; Weights and
// RecvWeights given exactly when TopkWeights is, Scales exactly when X is
// FP8). In capacity mode it needs no host synchronization and no
// allocation, so it can be captured into a CUDA graph
// (device.CUDAStream.BeginCapture on Engine.Stream).
func (e *Engine) DispatchPermuteInto(ctx context.Context, h *Handle, in DispatchInput, out DispatchPermuteOutput) error {
	if err := e.enter("dispatch-permute"); err != nil {
		return err
	}
	defer e.leave()
	if err := e.checkHandle(h); err != nil {
		return e.reject(opDispatchPermute, err)
	}
	err := e.checkDispatchInput(h, in)
	if err == nil {
		K, H, w := e.cfg.TopK, e.cfg.Hidden, in.TopkWeights != nil
		err = errors.Join(
			checkTensor("dispatch-permute: output X", out.X, in.X.DType(), h.permRows, H),
			checkTensor("dispatch-permute: output RecvIdx", out.RecvIdx, device.Int32, h.recvRows, K),
			checkOptional("dispatch-permute: output RecvWeights", out.RecvWeights, w, device.FP32, h.recvRows, K),
			checkOptional1("dispatch-permute: output Weights", out.Weights, w, h.permRows),
			e.checkScales("dispatch-permute: output Scales", in.X, out.Scales, h.permRows))
	}
	if err != nil {
		return e.reject(opDispatchPermute, err)
	}
	return e.dispatchPermute(h, in.X, in.TopkWeights, in.XScales, out)
}

// checkOptional checks a 2-D output that must be given exactly when want.
func checkOptional(name string, t *device.Tensor, want bool, dt device.DType, rows, cols int) error {
	switch {
	case !want && t != nil:
		return fmt.Errorf("executor: %s given without weights: %w", name, ErrInvalidInput)
	case !want:
		return nil
	}
	return checkTensor(name, t, dt, rows, cols)
}

// checkOptional1 checks a 1-D FP32 output of rows elements that must be
// given exactly when want.
func checkOptional1(name string, t *device.Tensor, want bool, rows int) error {
	switch {
	case !want && t != nil:
		return fmt.Errorf("executor: %s given without weights: %w", name, ErrInvalidInput)
	case !want:
		return nil
	case t == nil:
		return fmt.Errorf("executor: %s is nil: %w", name, ErrInvalidInput)
	case t.Closed():
		return fmt.Errorf("executor: %s was closed (its memory is freed): %w", name, ErrInvalidInput)
	case t.DType() != device.FP32 || len(t.Shape()) != 1 || t.Shape()[0] != rows:
		return fmt.Errorf("executor: %s is %v, want fp32[%d]: %w", name, t, rows, ErrInvalidInput)
	}
	return nil
}

// dispatchPermute enqueues DispatchPermute of rows x (weights w, fp8
// scales sx; either may be nil) into out.
func (e *Engine) dispatchPermute(h *Handle, x, w, sx *device.Tensor, out DispatchPermuteOutput) error {
	if e.gpu != nil {
		return e.gpu.enqueue(func() error { return e.gpu.dispatchPermute(h, x, w, sx, out) })
	}
	e.collective(opDispatchPermute, func() error {
		lay, err := e.ready(h)
		if err != nil {
			return err
		}
		err = e.pull(lay, h, opDispatchPermute, roundRows, x, w, func(src []recvSrc) error {
			writeRecvMeta(lay, src, h.recvRows, out.RecvIdx, out.RecvWeights)
			e.gatherPermuted(lay, src, rowBytes(x), out.X.Bytes(), f32(out.RecvWeights), f32(out.Weights))
			return nil
		})
		if err != nil || sx == nil {
			return err
		}
		return e.pull(lay, h, opDispatchPermute, roundScales, sx, nil, func(src []recvSrc) error {
			e.gatherPermuted(lay, src, rowBytes(sx), out.Scales.Bytes(), nil, nil)
			return nil
		})
	})
	return nil
}

// gatherPermuted writes each valid received row i (from src, rb bytes) to
// its permuted positions, with its slot weights from rw, and zeroes the
// padding.
func (e *Engine) gatherPermuted(lay *Layout, src []recvSrc, rb int, px []byte, rw, pw []float32) {
	K, n := lay.TopK, len(src)
	pcap := e.permCap(lay)
	e.par().For(n, 16, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			row := src[i].x
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
	if err := e.enter("unpermute-combine"); err != nil {
		return nil, err
	}
	defer e.leave()
	if err := e.checkHandle(h); err != nil {
		return nil, e.reject(opUnpermuteCombine, err)
	}
	if err := e.checkUnpermuteInput(h, in); err != nil {
		return nil, e.reject(opUnpermuteCombine, err)
	}
	out, err := e.NewTensor(in.Y.DType(), h.numTokens, e.cfg.Hidden)
	if err != nil {
		return nil, e.reject(opUnpermuteCombine, err)
	}
	return out, e.unpermuteCombine(h, in.Y, in.RecvWeights, out)
}

// UnpermuteCombineInto is UnpermuteCombine writing into out ([T, Hidden],
// Y's dtype), which the caller allocated: capturable into a CUDA graph in
// capacity mode, like DispatchPermuteInto.
func (e *Engine) UnpermuteCombineInto(ctx context.Context, h *Handle, in UnpermuteInput, out *device.Tensor) error {
	if err := e.enter("unpermute-combine"); err != nil {
		return err
	}
	defer e.leave()
	if err := e.checkHandle(h); err != nil {
		return e.reject(opUnpermuteCombine, err)
	}
	err := e.checkUnpermuteInput(h, in)
	if err == nil {
		err = checkTensor("unpermute-combine: output", out, in.Y.DType(), h.numTokens, e.cfg.Hidden)
	}
	if err != nil {
		return e.reject(opUnpermuteCombine, err)
	}
	return e.unpermuteCombine(h, in.Y, in.RecvWeights, out)
}

// unpermuteCombine enqueues UnpermuteCombine into out.
func (e *Engine) unpermuteCombine(h *Handle, y, w, out *device.Tensor) error {
	if e.gpu != nil {
		return e.gpu.enqueue(func() error { return e.gpu.unpermuteCombine(h, y, w, out) })
	}
	e.collective(opUnpermuteCombine, func() error {
		lay, err := e.ready(h)
		if err != nil {
			return err
		}
		c := nvlink.Call{Op: opUnpermuteCombine, Sig: sig(h, y.DType(), w != nil), Buffers: []*device.Buffer{y.Buffer(), buf(w)}}
		return e.sum(lay, c, y.DType(), out.Bytes(), nil, &unpermuteSpec{weighted: w != nil})
	})
	return nil
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
	if err := e.enter("dispatch backward"); err != nil {
		return DispatchBackwardOutput{}, err
	}
	defer e.leave()
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
	if err := e.enter("combine backward"); err != nil {
		return nil, err
	}
	defer e.leave()
	if gradOut != nil && gradOut.DType() == device.FP8E4M3 {
		err := checkTensor("combine backward: gradient", gradOut, 0, -1, e.cfg.Hidden)
		if herr := e.checkHandle(h); herr != nil {
			err = herr
		}
		return nil, e.reject(opDispatch, err)
	}
	out, err := e.dispatchCall(h, DispatchInput{X: gradOut})
	if err != nil {
		return nil, err
	}
	out.RecvIdx.Close()
	return out.RecvX, nil
}
