package executor

import (
	"context"
	"errors"
	"fmt"

	"github.com/goep/goep/device"
	"github.com/goep/goep/executor/internal/datapath"
)

// Every call below checks its inputs on the host, allocates its outputs
// and hands them to the data path, which enqueues the work. A collective
// call that fails here still joins its exchange as rejected (reject), so
// that every peer fails it at once instead of waiting for this rank.

func (e *Engine) checkHandle(h *Handle) error {
	if err := e.usable(); err != nil {
		return err
	}
	if h == nil {
		return fmt.Errorf("executor: nil handle: %w", ErrInvalidInput)
	}
	if h.e != e {
		return fmt.Errorf("executor: handle %d belongs to another engine: %w", h.st.ID, ErrInvalidInput)
	}
	return h.usable()
}

// outSpec is one output to allocate: dtype and shape (dims[:n]), or skip
// (nil). The shape is an array, not a slice: a call's specs go with its
// enqueued work, and a slice's array would be one allocation more each.
type outSpec struct {
	dt   device.DType
	n    int
	dims [2]int
	skip bool
}

// matrix is the spec of a rows x cols output.
func matrix(dt device.DType, rows, cols int) outSpec {
	return outSpec{dt: dt, n: 2, dims: [2]int{rows, cols}}
}

// vector is the spec of an output of n elements.
func vector(dt device.DType, n int) outSpec { return outSpec{dt: dt, n: 1, dims: [2]int{n}} }

// unless is s, skipped where skip holds.
func (s outSpec) unless(skip bool) outSpec {
	s.skip = skip
	return s
}

// shape is the spec's shape.
func (s *outSpec) shape() []int { return s.dims[:s.n] }

// newOutputs allocates tensors, closing them all if one fails, then runs
// then (nil: nothing) with them, which enqueues the call's work; all in
// one hand-off to the data path (datapath.Path.Enqueue): on the GPU the
// device's lock is taken and its context made current once a call. It
// returns the outputs and then's error, or an allocation's error (then
// is not run, and no output is returned).
func (e *Engine) newOutputs(then func(o []*device.Tensor) error, specs ...outSpec) (out []*device.Tensor, allocErr, err error) {
	out = make([]*device.Tensor, len(specs))
	err = e.path.Enqueue(func() error {
		for i, s := range specs {
			if s.skip {
				continue
			}
			t, err := e.NewTensor(s.dt, s.shape()...)
			if err != nil {
				allocErr = err
				return err
			}
			out[i] = t
		}
		if then == nil {
			return nil
		}
		return then(out)
	})
	if allocErr != nil {
		closeAll(out...)
		return nil, allocErr, nil
	}
	return out, nil, err
}

// run enqueues a call's work on the data path in one hand-off.
func (e *Engine) run(f func() error) error { return e.path.Enqueue(f) }

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
		return DispatchOutput{}, e.reject(datapath.OpDispatch, err)
	}
	if err := e.checkDispatchInput(h, in); err != nil {
		return DispatchOutput{}, e.reject(datapath.OpDispatch, err)
	}
	x, w, sx := in.X, in.TopkWeights, in.XScales
	K, H, rows := e.cfg.TopK, e.cfg.Hidden, h.st.RecvRows
	o, aerr, err := e.newOutputs(func(o []*device.Tensor) error {
		return e.path.Dispatch(&h.st, x, w, sx, datapath.DispatchOut{RecvX: o[0], RecvIdx: o[1], RecvWeights: o[2], RecvScales: o[3]})
	},
		matrix(x.DType(), rows, H),
		matrix(device.Int32, rows, K),
		matrix(device.FP32, rows, K).unless(w == nil),
		matrix(device.FP32, rows, e.scaleCols()).unless(sx == nil))
	if aerr != nil {
		return DispatchOutput{}, e.reject(datapath.OpDispatch, aerr) // the peers must not wait for this rank
	}
	return DispatchOutput{RecvX: o[0], RecvIdx: o[1], RecvWeights: o[2], RecvScales: o[3]}, err
}

func (e *Engine) checkDispatchInput(h *Handle, in DispatchInput) error {
	if err := checkMoved("dispatch: X", in.X, h.st.NumTokens, e.cfg.Hidden); err != nil {
		return err
	}
	if err := e.checkRowDType("dispatch: X", in.X); err != nil {
		return err
	}
	if in.TopkWeights != nil {
		if err := checkTensor("dispatch: TopkWeights", in.TopkWeights, device.FP32, h.st.NumTokens, e.cfg.TopK); err != nil {
			return err
		}
	}
	return e.checkScales("dispatch: XScales", in.X, in.XScales, h.st.NumTokens)
}

// Combine sends every received row back to its source and sums (collective):
// out[t] on the source is the fp32 sum, over the destination ranks of t in
// ascending order, of their z rows for t, rounded once; a token routed
// nowhere gets a zero row. The sum is unweighted: the router weights are
// applied by Unpermute (or UnpermuteCombine).
func (e *Engine) Combine(ctx context.Context, h *Handle, in CombineInput) (*device.Tensor, error) {
	if err := e.enter("combine"); err != nil {
		return nil, err
	}
	defer e.leave()
	if err := e.checkHandle(h); err != nil {
		return nil, e.reject(datapath.OpCombine, err)
	}
	err := checkTensor("combine: Z", in.Z, 0, h.st.RecvRows, e.cfg.Hidden)
	if err == nil {
		err = e.checkRowDType("combine: Z", in.Z)
	}
	if err != nil {
		return nil, e.reject(datapath.OpCombine, err)
	}
	out, err := e.combine(h, in.Z, nil)
	return out.GradX, err
}

// combine is Combine and DispatchBackward: it also sends per-slot weights
// (gradients) back to their source when zw is given.
func (e *Engine) combine(h *Handle, z, zw *device.Tensor) (DispatchBackwardOutput, error) {
	H, K := e.cfg.Hidden, e.cfg.TopK
	o, aerr, err := e.newOutputs(func(o []*device.Tensor) error {
		return e.path.Combine(&h.st, z, zw, datapath.CombineOut{X: o[0], GradTopkWeights: o[1]})
	},
		matrix(z.DType(), h.st.NumTokens, H),
		matrix(device.FP32, h.st.NumTokens, K).unless(zw == nil))
	if aerr != nil {
		return DispatchBackwardOutput{}, e.reject(datapath.OpCombine, aerr)
	}
	return DispatchBackwardOutput{GradX: o[0], GradTopkWeights: o[1]}, err
}

// DispatchPermute is Permute(Dispatch(in)) in one pass (collective): each
// received row goes straight to its positions in the expert-major layout.
// Results are bit-identical to the unfused calls.
func (e *Engine) DispatchPermute(ctx context.Context, h *Handle, in DispatchInput) (DispatchPermuteOutput, error) {
	if err := e.enter("dispatch-permute"); err != nil {
		return DispatchPermuteOutput{}, err
	}
	defer e.leave()
	if err := e.checkHandle(h); err != nil {
		return DispatchPermuteOutput{}, e.reject(datapath.OpDispatchPermute, err)
	}
	if err := e.checkDispatchInput(h, in); err != nil {
		return DispatchPermuteOutput{}, e.reject(datapath.OpDispatchPermute, err)
	}
	x, w, sx := in.X, in.TopkWeights, in.XScales
	K, H, recv, perm := e.cfg.TopK, e.cfg.Hidden, h.st.RecvRows, h.st.PermRows
	outOf := func(o []*device.Tensor) DispatchPermuteOutput {
		return DispatchPermuteOutput{X: o[0], Weights: o[1], RecvIdx: o[2], RecvWeights: o[3], Scales: o[4]}
	}
	o, aerr, err := e.newOutputs(func(o []*device.Tensor) error { return e.dispatchPermute(h, x, w, sx, outOf(o)) },
		matrix(x.DType(), perm, H),
		vector(device.FP32, perm).unless(w == nil),
		matrix(device.Int32, recv, K),
		matrix(device.FP32, recv, K).unless(w == nil),
		matrix(device.FP32, perm, e.scaleCols()).unless(sx == nil))
	if aerr != nil {
		return DispatchPermuteOutput{}, e.reject(datapath.OpDispatchPermute, aerr)
	}
	return outOf(o), err
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
		return e.reject(datapath.OpDispatchPermute, err)
	}
	err := e.checkDispatchInput(h, in)
	if err == nil {
		K, H, w := e.cfg.TopK, e.cfg.Hidden, in.TopkWeights != nil
		recv, perm := h.st.RecvRows, h.st.PermRows
		err = errors.Join(
			checkTensor("dispatch-permute: output X", out.X, in.X.DType(), perm, H),
			checkTensor("dispatch-permute: output RecvIdx", out.RecvIdx, device.Int32, recv, K),
			checkOptional("dispatch-permute: output RecvWeights", out.RecvWeights, w, device.FP32, recv, K),
			checkOptional1("dispatch-permute: output Weights", out.Weights, w, perm),
			e.checkScales("dispatch-permute: output Scales", in.X, out.Scales, perm))
	}
	if err != nil {
		return e.reject(datapath.OpDispatchPermute, err)
	}
	return e.dispatchPermute(h, in.X, in.TopkWeights, in.XScales, out)
}

// dispatchPermute enqueues DispatchPermute of rows x (weights w, fp8
// scales sx; either may be nil) into out.
func (e *Engine) dispatchPermute(h *Handle, x, w, sx *device.Tensor, out DispatchPermuteOutput) error {
	return e.run(func() error {
		return e.path.DispatchPermute(&h.st, x, w, sx, datapath.DispatchPermuteOut{
			X: out.X, Weights: out.Weights, RecvIdx: out.RecvIdx, RecvWeights: out.RecvWeights, Scales: out.Scales})
	})
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
		return nil, e.reject(datapath.OpUnpermuteCombine, err)
	}
	err := e.checkUnpermuteInput(h, in)
	if err == nil {
		err = e.checkRowDType("unpermute-combine: Y", in.Y)
	}
	if err != nil {
		return nil, e.reject(datapath.OpUnpermuteCombine, err)
	}
	o, aerr, err := e.newOutputs(func(o []*device.Tensor) error { return e.unpermuteCombine(h, in.Y, in.RecvWeights, o[0]) },
		matrix(in.Y.DType(), h.st.NumTokens, e.cfg.Hidden))
	if aerr != nil {
		return nil, e.reject(datapath.OpUnpermuteCombine, aerr)
	}
	return o[0], err
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
		return e.reject(datapath.OpUnpermuteCombine, err)
	}
	err := e.checkUnpermuteInput(h, in)
	if err == nil {
		err = e.checkRowDType("unpermute-combine: Y", in.Y)
	}
	if err == nil {
		err = checkTensor("unpermute-combine: output", out, in.Y.DType(), h.st.NumTokens, e.cfg.Hidden)
	}
	if err != nil {
		return e.reject(datapath.OpUnpermuteCombine, err)
	}
	return e.unpermuteCombine(h, in.Y, in.RecvWeights, out)
}

// unpermuteCombine enqueues UnpermuteCombine into out.
func (e *Engine) unpermuteCombine(h *Handle, y, w, out *device.Tensor) error {
	return e.run(func() error { return e.path.UnpermuteCombine(&h.st, y, w, out) })
}

func (e *Engine) checkUnpermuteInput(h *Handle, in UnpermuteInput) error {
	if err := checkTensor("unpermute: Y", in.Y, 0, h.st.PermRows, e.cfg.Hidden); err != nil {
		return err
	}
	if in.RecvWeights != nil {
		return checkTensor("unpermute: RecvWeights", in.RecvWeights, device.FP32, h.st.RecvRows, e.cfg.TopK)
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
		return DispatchBackwardOutput{}, e.reject(datapath.OpCombine, err)
	}
	err := checkTensor("dispatch backward: GradRecvX", in.GradRecvX, 0, h.st.RecvRows, e.cfg.Hidden)
	if err == nil {
		err = e.checkRowDType("dispatch backward: GradRecvX", in.GradRecvX)
	}
	if err == nil && in.GradRecvWeights != nil {
		err = checkTensor("dispatch backward: GradRecvWeights", in.GradRecvWeights, device.FP32, h.st.RecvRows, e.cfg.TopK)
	}
	if err != nil {
		return DispatchBackwardOutput{}, e.reject(datapath.OpCombine, err)
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
		return nil, e.reject(datapath.OpDispatch, err)
	}
	out, err := e.dispatchCall(h, DispatchInput{X: gradOut})
	if err != nil {
		return nil, err
	}
	out.RecvIdx.Close()
	return out.RecvX, nil
}

// Permute, Unpermute and their gradients are local: they touch only this
// rank's memory and need no peer.

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
	recv, perm := h.st.RecvRows, h.st.PermRows
	if err := checkMoved("permute: RecvX", in.RecvX, recv, e.cfg.Hidden); err != nil {
		return PermuteOutput{}, err
	}
	if in.RecvWeights != nil {
		if err := checkTensor("permute: RecvWeights", in.RecvWeights, device.FP32, recv, e.cfg.TopK); err != nil {
			return PermuteOutput{}, err
		}
	}
	if err := e.checkScales("permute: RecvScales", in.RecvX, in.RecvScales, recv); err != nil {
		return PermuteOutput{}, err
	}
	x, w, sx := in.RecvX, in.RecvWeights, in.RecvScales
	o, aerr, err := e.newOutputs(func(o []*device.Tensor) error {
		return e.path.Permute(&h.st, x, w, sx, datapath.PermuteOut{X: o[0], Weights: o[1], Scales: o[2]})
	},
		matrix(x.DType(), perm, e.cfg.Hidden),
		vector(device.FP32, perm).unless(w == nil),
		matrix(device.FP32, perm, e.scaleCols()).unless(sx == nil))
	if aerr != nil {
		return PermuteOutput{}, aerr
	}
	return PermuteOutput{X: o[0], Weights: o[1], Scales: o[2]}, err
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
	o, aerr, err := e.newOutputs(func(o []*device.Tensor) error { return e.path.Unpermute(&h.st, y, w, o[0]) },
		matrix(y.DType(), h.st.RecvRows, e.cfg.Hidden))
	if aerr != nil {
		return nil, aerr
	}
	return o[0], err
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
	if err := checkTensor("permute backward: gradient", gradX, 0, h.st.PermRows, e.cfg.Hidden); err != nil {
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
	if err := checkTensor("unpermute backward: GradOut", in.GradOut, 0, h.st.RecvRows, e.cfg.Hidden); err != nil {
		return UnpermuteBackwardOutput{}, err
	}
	if err := e.checkUnpermuteInput(h, UnpermuteInput{Y: in.Y, RecvWeights: in.RecvWeights}); err != nil {
		return UnpermuteBackwardOutput{}, err
	}
	if in.Y.DType() != in.GradOut.DType() {
		return UnpermuteBackwardOutput{}, checkTensor("unpermute backward: Y", in.Y, in.GradOut.DType(), h.st.PermRows, e.cfg.Hidden)
	}
	g, y, w := in.GradOut, in.Y, in.RecvWeights
	o, aerr, err := e.newOutputs(func(o []*device.Tensor) error {
		return e.path.UnpermuteBackward(&h.st, g, y, w, datapath.UnpermuteBackwardOut{GradY: o[0], GradWeights: o[1]})
	},
		matrix(g.DType(), h.st.PermRows, e.cfg.Hidden),
		matrix(device.FP32, h.st.RecvRows, e.cfg.TopK).unless(w == nil))
	if aerr != nil {
		return UnpermuteBackwardOutput{}, aerr
	}
	return UnpermuteBackwardOutput{GradY: o[0], GradWeights: o[1]}, err
}
