//go:build cuda && cgo

package gpu

import (
	"github.com/goep/goep/device"
	"github.com/goep/goep/executor/internal/datapath"
)

// permuteFrom enqueues the permute of rows src (weights srcW) into px, pw,
// padding and dropped rows zero.
func (p *Path) permuteFrom(h *datapath.Handle, px, pw *device.Tensor, src, srcW *device.Buffer) error {
	rb := datapath.RowBytes(px)
	kdt, kcols := kernelRows(px.DType(), px.Shape()[1])
	var pwb *device.Buffer
	if pw != nil {
		pwb = pw.Buffer()
	}
	if p.env.P.Capacity {
		// Positions change with each layout: the rows the permute leaves
		// (padding, dropped rows, the capacity past the valid rows) are
		// found from the device positions and zeroed, so that the work
		// needs no count from the host (graph capture).
		if err := p.pk.ZeroUnwritten(p.s, px.Buffer(), rb, pwb, p.deviceMap(h), p.marks); err != nil {
			return err
		}
	}
	if err := p.pk.Permute(p.s, kdt, kcols, px.Buffer(), pwb, src, srcW, p.deviceMap(h)); err != nil {
		return err
	}
	if p.env.P.Capacity {
		return nil
	}
	return p.pk.ZeroPadding(p.s, px.Buffer(), rb, pwb, h.Lay.ExpertOffsets, h.Lay.TokensPerExpert, h.PermRows)
}

// Permute enqueues Permute (local) of rows x (weights w), and of their
// scales sx for fp8 rows.
func (p *Path) Permute(h *datapath.Handle, x, w, sx *device.Tensor, out datapath.PermuteOut) error {
	if !p.ready(h) {
		return nil
	}
	var wb *device.Buffer
	if w != nil {
		wb = w.Buffer()
	}
	if err := p.permuteFrom(h, out.X, out.Weights, x.Buffer(), wb); err != nil {
		return err
	}
	if sx == nil {
		return nil
	}
	return p.permuteFrom(h, out.Scales, nil, sx.Buffer(), nil)
}

// Unpermute enqueues Unpermute (local) into out ([recvRows, H]).
func (p *Path) Unpermute(h *datapath.Handle, y, w, out *device.Tensor) error {
	if !p.ready(h) {
		return nil
	}
	var wb *device.Buffer
	if w != nil {
		wb = w.Buffer()
	}
	return p.pk.Unpermute(p.s, y.DType(), p.H, out.Buffer(), y.Buffer(), wb, p.deviceMap(h))
}

// UnpermuteBackward enqueues UnpermuteBackward (local): GradY is the
// scaled permute of gradOut (zero on padding and dropped rows) and, for a
// weighted forward, GradWeights the per-slot inner products.
func (p *Path) UnpermuteBackward(h *datapath.Handle, gradOut, y, w *device.Tensor, out datapath.UnpermuteBackwardOut) error {
	if !p.ready(h) {
		return nil
	}
	dt := gradOut.DType()
	di := dtypeIndex(dt)
	rb := p.H * dt.Size()
	m := p.deviceMap(h)
	if p.env.P.Capacity {
		// The rows goep_ep_permute_scaled leaves, as in permuteFrom.
		if err := p.pk.ZeroUnwritten(p.s, out.GradY.Buffer(), rb, nil, m, p.marks); err != nil {
			return err
		}
	}
	if m.Rows > 0 {
		grid, block, err := rowShape(m.Rows, p.H, 1)
		if err != nil {
			return err
		}
		if err := p.s.Launch(p.permuteScaled[di], grid, block, 0, out.GradY, gradOut, w, tbl(h).pos,
			int64(m.Rows), int32(p.K), int64(h.PermRows), int64(p.H), p.dnan); err != nil {
			return err
		}
	}
	if !p.env.P.Capacity {
		if err := p.pk.ZeroPadding(p.s, out.GradY.Buffer(), rb, nil, h.Lay.ExpertOffsets, h.Lay.TokensPerExpert, h.PermRows); err != nil {
			return err
		}
	}
	if w == nil || h.RecvRows == 0 {
		return nil
	}
	slots := h.RecvRows * p.K
	return p.s.Launch(p.weightGrad[di], [3]uint32{uint32((slots + 127) / 128), 1, 1}, [3]uint32{128, 1, 1}, 0,
		out.GradWeights, gradOut, y, tbl(h).pos, int64(h.RecvRows), int32(p.K), int64(h.PermRows), int64(p.H))
}
