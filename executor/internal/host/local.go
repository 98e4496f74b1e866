package host

import (
	"github.com/goep/goep/device"
	"github.com/goep/goep/executor/internal/datapath"
	"github.com/goep/goep/executor/internal/plan"
	"github.com/goep/goep/permute"
)

// Permute, Unpermute and their gradients are local: they touch only this
// rank's memory and need no peer.

// Permute enqueues the permute of received rows x (weights w, fp8 scales
// sx).
func (p *Path) Permute(h *datapath.Handle, x, w, sx *device.Tensor, out datapath.PermuteOut) error {
	p.Control.Stream.Go("permute", func() error {
		lay, err := p.env.Ready(h)
		if err != nil {
			return err
		}
		m := p.permuteMap(h, lay)
		permuteRows(lay, m, out.X, out.Weights, x, w)
		if sx != nil {
			permuteRows(lay, m, out.Scales, nil, sx, nil)
		}
		return nil
	})
	return nil
}

// permuteRows is the host permute of the rows of x (weights w, may be nil)
// into px (pw), padding and dropped rows zeroed.
func permuteRows(lay *plan.Layout, m permute.Map, px, pw, x, w *device.Tensor) {
	cols := x.Shape()[1]
	rb := datapath.RowBytes(x)
	pws := f32(pw)
	permute.Permute(x.DType(), cols, px.Bytes(), pws, x.Bytes(), f32(w), m)
	permute.ZeroPadding(px.Bytes(), rb, pws, lay.ExpertOffsets, lay.TokensPerExpert, m.PermCap)
	permute.ZeroDropped(px.Bytes(), rb, pws, m)
}

// Unpermute enqueues the unpermute of y (weights w, may be nil) into out.
func (p *Path) Unpermute(h *datapath.Handle, y, w, out *device.Tensor) error {
	p.Control.Stream.Go("unpermute", func() error {
		lay, err := p.env.Ready(h)
		if err != nil {
			return err
		}
		permute.Unpermute(y.DType(), p.env.Hidden, out.Bytes(), y.Bytes(), f32(w), p.permuteMap(h, lay))
		return nil
	})
	return nil
}

// UnpermuteBackward enqueues the gradient of Unpermute: GradY, the scaled
// permute of g, and, for a weighted forward (w), GradWeights.
func (p *Path) UnpermuteBackward(h *datapath.Handle, g, y, w *device.Tensor, out datapath.UnpermuteBackwardOut) error {
	p.Control.Stream.Go("unpermute backward", func() error {
		lay, err := p.env.Ready(h)
		if err != nil {
			return err
		}
		m := p.permuteMap(h, lay)
		H := p.env.Hidden
		rb := H * g.DType().Size()
		permute.PermuteScaled(g.DType(), H, out.GradY.Bytes(), g.Bytes(), f32(w), m)
		permute.ZeroPadding(out.GradY.Bytes(), rb, nil, lay.ExpertOffsets, lay.TokensPerExpert, m.PermCap)
		permute.ZeroDropped(out.GradY.Bytes(), rb, nil, m)
		if w != nil {
			permute.WeightGrad(g.DType(), H, f32(out.GradWeights), g.Bytes(), y.Bytes(), m)
		}
		return nil
	})
	return nil
}
