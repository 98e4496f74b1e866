package executor

import (
	"context"

	"github.com/goep/goep/device"
	"github.com/goep/goep/permute"
)

// Permute, Unpermute and their gradients are local: they touch only this
// rank's memory and need no peer.

func (e *Engine) permuteMap(h *Handle, lay *Layout) permute.Map {
	return permute.Map{Rows: e.validRecv(lay, e.rank), TopK: lay.TopK, Pos: lay.Pos, RowCap: h.recvRows, PermCap: h.permRows}
}

// Permute copies received rows into expert-major order: for each local
// expert e in order, a copy of every received row that chose e (receive
// order), then zero padding up to PadMultiple. Weights, when given, follow
// as one fp32 per permuted row (0 on padding).
func (e *Engine) Permute(ctx context.Context, h *Handle, in PermuteInput) (PermuteOutput, error) {
	if err := e.enter("permute"); err != nil {
		return PermuteOutput{}, err
	}
	defer e.leave()
	if err := e.checkHandle(h); err != nil {
		return PermuteOutput{}, err
	}
	if err := checkMoved("permute: RecvX", in.RecvX, h.recvRows, e.cfg.Hidden); err != nil {
		return PermuteOutput{}, err
	}
	if in.RecvWeights != nil {
		if err := checkTensor("permute: RecvWeights", in.RecvWeights, device.FP32, h.recvRows, e.cfg.TopK); err != nil {
			return PermuteOutput{}, err
		}
	}
	if err := e.checkScales("permute: RecvScales", in.RecvX, in.RecvScales, h.recvRows); err != nil {
		return PermuteOutput{}, err
	}
	x, w, sx := in.RecvX, in.RecvWeights, in.RecvScales
	o, err := e.newOutputs(
		outSpec{dt: x.DType(), shape: []int{h.permRows, e.cfg.Hidden}},
		outSpec{dt: device.FP32, shape: []int{h.permRows}, skip: w == nil},
		outSpec{dt: device.FP32, shape: []int{h.permRows, e.scaleCols()}, skip: sx == nil})
	if err != nil {
		return PermuteOutput{}, err
	}
	out := PermuteOutput{X: o[0], Weights: o[1], Scales: o[2]}
	if e.gpu != nil {
		return out, e.gpu.enqueue(func() error { return e.gpu.permute(h, x, w, sx, out) })
	}
	e.stream.Go("permute", func() error {
		lay, err := e.ready(h)
		if err != nil {
			return err
		}
		m := e.permuteMap(h, lay)
		permuteRows(lay, m, out.X, out.Weights, x, w)
		if sx != nil {
			permuteRows(lay, m, out.Scales, nil, sx, nil)
		}
		return nil
	})
	return out, nil
}

// permuteRows is the host permute of the rows of x (weights w, may be nil)
// into px (pw), padding and dropped rows zeroed.
func permuteRows(lay *Layout, m permute.Map, px, pw, x, w *device.Tensor) {
	cols := x.Shape()[1]
	rb := rowBytes(x)
	pws := f32(pw)
	permute.Permute(x.DType(), cols, px.Bytes(), pws, x.Bytes(), f32(w), m)
	permute.ZeroPadding(px.Bytes(), rb, pws, lay.ExpertOffsets, lay.TokensPerExpert, m.PermCap)
	permute.ZeroDropped(px.Bytes(), rb, pws, m)
}

// Unpermute folds expert-major rows back to received rows:
// out[i] = sum over k in slot order with RecvIdx[i][k] >= 0 of
// c_ik * y[pos(i, k)], c_ik = RecvWeights[i][k] when given, else 1; each
// term rounded to fp32, summed in fp32 from the first term, rounded to the
// dtype once.
func (e *Engine) Unpermute(ctx context.Context, h *Handle, in UnpermuteInput) (*device.Tensor, error) {
	if err := e.enter("unpermute"); err != nil {
		return nil, err
	}
	defer e.leave()
	if err := e.checkHandle(h); err != nil {
		return nil, err
	}
	if err := e.checkUnpermuteInput(h, in); err != nil {
		return nil, err
	}
	return e.unpermute(h, in.Y, in.RecvWeights)
}

func (e *Engine) unpermute(h *Handle, y, w *device.Tensor) (*device.Tensor, error) {
	out, err := e.NewTensor(y.DType(), h.recvRows, e.cfg.Hidden)
	if err != nil {
		return nil, err
	}
	if e.gpu != nil {
		return out, e.gpu.enqueue(func() error { return e.gpu.unpermute(h, y, w, out) })
	}
	e.stream.Go("unpermute", func() error {
		lay, err := e.ready(h)
		if err != nil {
			return err
		}
		permute.Unpermute(y.DType(), e.cfg.Hidden, out.Bytes(), y.Bytes(), f32(w), e.permuteMap(h, lay))
		return nil
	})
	return out, nil
}

// PermuteBackward is the gradient of Permute: the unweighted Unpermute of
// the permuted gradient.
func (e *Engine) PermuteBackward(ctx context.Context, h *Handle, gradX *device.Tensor) (*device.Tensor, error) {
	if err := e.enter("permute backward"); err != nil {
		return nil, err
	}
	defer e.leave()
	if err := e.checkHandle(h); err != nil {
		return nil, err
	}
	if err := checkTensor("permute backward: gradient", gradX, 0, h.permRows, e.cfg.Hidden); err != nil {
		return nil, err
	}
	return e.unpermute(h, gradX, nil)
}

// UnpermuteBackward is the gradient of Unpermute: GradY[pos(i,k)] =
// c_ik * GradOut[i] (rounded to fp32, then to the dtype), zero on padding,
// and, for a weighted forward, GradWeights[i][k] = <GradOut[i], Y[pos(i,k)]>
// accumulated in fp64 in element order.
func (e *Engine) UnpermuteBackward(ctx context.Context, h *Handle, in UnpermuteBackwardInput) (UnpermuteBackwardOutput, error) {
	if err := e.enter("unpermute backward"); err != nil {
		return UnpermuteBackwardOutput{}, err
	}
	defer e.leave()
	if err := e.checkHandle(h); err != nil {
		return UnpermuteBackwardOutput{}, err
	}
	if err := checkTensor("unpermute backward: GradOut", in.GradOut, 0, h.recvRows, e.cfg.Hidden); err != nil {
		return UnpermuteBackwardOutput{}, err
	}
	if err := e.checkUnpermuteInput(h, UnpermuteInput{Y: in.Y, RecvWeights: in.RecvWeights}); err != nil {
		return UnpermuteBackwardOutput{}, err
	}
	if in.Y.DType() != in.GradOut.DType() {
		return UnpermuteBackwardOutput{}, checkTensor("unpermute backward: Y", in.Y, in.GradOut.DType(), h.permRows, e.cfg.Hidden)
	}
	g, y, w := in.GradOut, in.Y, in.RecvWeights
	o, err := e.newOutputs(
		outSpec{dt: g.DType(), shape: []int{h.permRows, e.cfg.Hidden}},
		outSpec{dt: device.FP32, shape: []int{h.recvRows, e.cfg.TopK}, skip: w == nil})
	if err != nil {
		return UnpermuteBackwardOutput{}, err
	}
	out := UnpermuteBackwardOutput{GradY: o[0], GradWeights: o[1]}
	if e.gpu != nil {
		return out, e.gpu.enqueue(func() error { return e.gpu.unpermuteBackward(h, g, y, w, out) })
	}
	e.stream.Go("unpermute backward", func() error {
		lay, err := e.ready(h)
		if err != nil {
			return err
		}
		m := e.permuteMap(h, lay)
		rb := e.cfg.Hidden * g.DType().Size()
		permute.PermuteScaled(g.DType(), e.cfg.Hidden, out.GradY.Bytes(), g.Bytes(), f32(w), m)
		permute.ZeroPadding(out.GradY.Bytes(), rb, nil, lay.ExpertOffsets, lay.TokensPerExpert, m.PermCap)
		permute.ZeroDropped(out.GradY.Bytes(), rb, nil, m)
		if w != nil {
			permute.WeightGrad(g.DType(), e.cfg.Hidden, f32(out.GradWeights), g.Bytes(), y.Bytes(), m)
		}
		return nil
	})
	return out, nil
}
