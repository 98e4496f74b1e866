//go:build cuda && cgo

package gpu

import (
	"errors"

	"github.com/goep/goep/device"
	"github.com/goep/goep/executor/internal/datapath"
	"github.com/goep/goep/permute"
)

// scatterRows enqueues the first steps of a combine: the wait for the
// peers' done, every received row of z (and its weights zw) into the
// combine window of the rank that sums it (recvSrc, at entry recvEnt), and
// the arrive.
func (p *Path) scatterRows(h *datapath.Handle, z, zw *device.Tensor, op datapath.Op) error {
	if err := p.flags.Begin(); err != nil {
		return err
	}
	rb := p.H * z.DType().Size()
	if h.RecvRows > 0 {
		unit := unitOf(rb, z.Buffer(), p.win.Own[regionComb])
		grid, block, chunk, err := p.commShape(h.RecvRows, rb/int(unit))
		if err != nil {
			return p.abandon(op, err)
		}
		if err := p.s.Launch(p.scatter, grid, block, 0, z, zw, tbl(h).recvSrc, tbl(h).recvEnt, int64(h.RecvRows),
			p.peerTable(regionComb), int64(rb), int64(p.combWOff), int32(p.K), unit, chunk); err != nil {
			return p.abandon(op, err)
		}
	}
	return p.flags.Arrive(flagOp(op, z.DType(), zw != nil))
}

// Combine enqueues Combine (and DispatchBackward with zw): every received
// row goes back into its source's combine window at its entry, then each
// source sums its tokens' entries in destination order (the crossing's
// sum).
func (p *Path) Combine(h *datapath.Handle, z, zw *device.Tensor, out datapath.CombineOut) error {
	if !p.ready(h) {
		return nil
	}
	if p.one != nil {
		return p.combineOne(h, z, zw, out)
	}
	op := datapath.OpCombine
	if err := p.scatterRows(h, z, zw, op); err != nil {
		return err
	}
	return p.cross.sum(h, z.DType(), zw != nil, out, op)
}

// sumFlat is the sum of one domain (flat.sum), once every rank's rows
// are in the combine windows: each token's entries summed in destination
// order into out.X (and, when weighted, the weights into
// out.GradTopkWeights), and the done signal, which is sent whatever fails
// before it (past the arrive, the peers' next call waits for it).
func (p *Path) sumFlat(h *datapath.Handle, dt device.DType, out datapath.CombineOut, weighted bool, op datapath.Op) error {
	return errors.Join(p.sumOwn(h, dt, out, weighted), p.flags.Finish(uint32(op)))
}

// sumOwn is sumFlat's sum.
func (p *Path) sumOwn(h *datapath.Handle, dt device.DType, out datapath.CombineOut, weighted bool) error {
	T := h.NumTokens
	if T == 0 {
		return nil
	}
	rb := p.H * dt.Size()
	src := p.ownView(regionComb, 0, T*p.W*rb)
	srcW := p.ownView(regionComb, p.combWOff, T*p.W*p.K*4)
	vec := rb%16 == 0 && out.X.Buffer().DevicePtr()%16 == 0
	units, v := p.H, int32(0)
	if vec {
		units, v = rb/16, 1
	}
	grid, block, err := rowShape(T, units, p.K)
	if err != nil {
		return err
	}
	di := dtypeIndex(dt)
	var gw *device.Tensor
	if weighted {
		gw = out.GradTopkWeights
	}
	return p.s.Launch(p.sum[di], grid, block, 0, out.X, gw, src, srcW, tbl(h).entRow, tbl(h).slotEnt,
		int64(T), int32(p.W), int64(p.H), int32(p.K), v, p.dnan)
}

// UnpermuteCombine enqueues UnpermuteCombine, fused: the unpermute stores
// each received row straight into the combine window of the rank of its
// domain that sums it, at its entry (permute.CUDAKernels.
// UnpermuteScatter), which are the bytes that Unpermute into a temporary
// and then combine's scatter (scatterRows) would store there. The sums
// that follow, in the domain and across domains, are therefore the
// unfused calls' bit for bit, and the rows are not written to and read
// back from a temporary.
func (p *Path) UnpermuteCombine(h *datapath.Handle, y, w, out *device.Tensor) error {
	if !p.ready(h) {
		return nil
	}
	op := datapath.OpUnpermuteCombine
	if err := p.flags.Begin(); err != nil {
		return err
	}
	to := permute.Targets{
		Bases: p.peerTable(regionComb), Rank: tbl(h).recvSrc, Row: tbl(h).recvEnt,
		// Every rank's windows have the same layout (unitOf's assumption
		// in scatterRows too).
		Aligned: p.win.Own[regionComb].DevicePtr()%16 == 0,
	}
	if err := p.pk.UnpermuteScatter(p.s, y.DType(), p.H, to, y.Buffer(), datapath.Buf(w), p.deviceMap(h)); err != nil {
		return p.abandon(op, err)
	}
	if err := p.flags.Arrive(flagOp(op, y.DType(), false)); err != nil {
		return err
	}
	return p.cross.sum(h, y.DType(), false, datapath.CombineOut{X: out}, op)
}
