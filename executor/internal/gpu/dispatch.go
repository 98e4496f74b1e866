//go:build cuda && cgo

package gpu

import (
	"errors"

	"github.com/goep/goep/device"
	"github.com/goep/goep/executor/internal/datapath"
)

// pushFlat is the push of one domain (flat.push): the wait for the peers'
// done of the previous call, this rank's rows (weights w, fp8 scales sx)
// stored into the destinations' receive windows, and the arrive.
func (p *Path) pushFlat(h *datapath.Handle, x, w, sx *device.Tensor, op datapath.Op) error {
	if err := p.flags.Begin(); err != nil {
		return err
	}
	sb := 0
	if sx != nil {
		sb = datapath.RowBytes(sx)
	}
	t := tbl(h)
	if err := p.pushEntries(x.Buffer(), datapath.Buf(w), datapath.Buf(sx), datapath.RowBytes(x), sb, t.entTok, t.entDest, t.entRow, h.NumTokens*p.W); err != nil {
		return p.abandon(op, err)
	}
	return p.flags.Arrive(flagOp(op, x.DType(), w != nil))
}

func (p *Path) pushEntries(x, w, sx *device.Buffer, rb, sb int, tok, dest, row *device.Buffer, entries int) error {
	if entries == 0 {
		return nil
	}
	unit := unitOf(rb, x, p.win.Own[regionRecv])
	grid, block, chunk, err := p.commShape(entries, rb/int(unit))
	if err != nil {
		return err
	}
	return p.s.Launch(p.push, grid, block, 0, x, w, tok, dest, row,
		int64(entries), p.peerTable(regionRecv), int64(rb), int64(p.recvWOff), int32(p.K), unit, chunk,
		sx, int64(p.scaleOff()), int64(sb))
}

// scaleOff is where the receive window keeps an fp8 call's scales: after
// the rows area's first recvCap*H bytes, which its fp8 rows fill (an fp8
// row and its scales, H + H/32 bytes, fit in the 2H bytes of a bf16 row,
// the narrowest a window has: Config.RowDType).
func (p *Path) scaleOff() int { return p.recvCap * p.H }

// copyRecv enqueues goep_ep_copy_out from the receive window's rows at
// byte off into out (rows of rb bytes; nil: none) and outW (weights; nil:
// none), and the handle's RecvIdx table into outIdx (nil: none), rows
// [0, h.RecvRows) of each, in one launch.
func (p *Path) copyRecv(h *datapath.Handle, off, rb int, out, outW, outIdx *device.Tensor) error {
	if h.RecvRows == 0 || out == nil && outW == nil && outIdx == nil {
		return nil
	}
	src := p.ownView(regionRecv, off, h.RecvRows*rb)
	srcW := p.ownView(regionRecv, p.recvWOff, h.RecvRows*p.K*4)
	var ob *device.Buffer
	if out != nil {
		ob = out.Buffer()
	}
	unit := unitOf(rb, ob, src)
	units := rb / int(unit)
	if out == nil {
		units = 1
	}
	grid, block, err := rowShape(h.RecvRows, units, p.K)
	if err != nil {
		return err
	}
	rows, counts := p.rowsArg(h)
	return p.s.Launch(p.copyOut, grid, block, 0, out, outW, outIdx, src, srcW, tbl(h).recvIdx, counts,
		rows, int64(h.RecvRows), int64(rb), int32(p.K), unit)
}

// Dispatch enqueues Dispatch: the rows of x with their weights w (may be
// nil) and, for fp8 rows, their scales sx: in one domain with the rows,
// with several in a second round.
func (p *Path) Dispatch(h *datapath.Handle, x, w, sx *device.Tensor, out datapath.DispatchOut) error {
	if !p.ready(h) {
		return nil
	}
	if p.one != nil {
		return p.dispatchOne(h, x, w, sx, out)
	}
	if sx == nil || !p.cross.splitScales() {
		return p.dispatchRound(h, x, w, sx, datapath.RoundRows, out.RecvX, out.RecvWeights, out.RecvScales, out.RecvIdx)
	}
	if err := p.dispatchRound(h, x, w, nil, datapath.RoundRows, out.RecvX, out.RecvWeights, nil, out.RecvIdx); err != nil {
		return err
	}
	return p.dispatchRound(h, sx, nil, nil, datapath.RoundScales, out.RecvScales, nil, nil, nil)
}

// dispatchRound enqueues one round of Dispatch: x's rows (weights w,
// scales sx) into recv (recvW, recvS), and the handle's RecvIdx into
// recvIdx (nil: not copied).
func (p *Path) dispatchRound(h *datapath.Handle, x, w, sx *device.Tensor, round uint64, recv, recvW, recvS, recvIdx *device.Tensor) error {
	if err := p.cross.push(h, x, w, sx, round, datapath.OpDispatch); err != nil {
		return err
	}
	// Past the arrive, done is signalled whatever fails here: the peers'
	// next call waits for it.
	err := p.copyRecv(h, 0, datapath.RowBytes(x), recv, recvW, recvIdx)
	if err == nil && sx != nil {
		err = p.copyRecv(h, p.scaleOff(), datapath.RowBytes(sx), recvS, nil, nil)
	}
	return errors.Join(err, p.flags.Finish(uint32(datapath.OpDispatch)))
}

// DispatchPermute enqueues DispatchPermute: the permute kernel reads the
// received rows straight from the receive window. For fp8 rows their
// scales sx move and are permuted too: in one domain with the rows, with
// several in a second round.
func (p *Path) DispatchPermute(h *datapath.Handle, x, w, sx *device.Tensor, out datapath.DispatchPermuteOut) error {
	if !p.ready(h) {
		return nil
	}
	if sx == nil || !p.cross.splitScales() {
		return p.dispatchPermuteRound(h, x, w, sx, datapath.RoundRows, out.X, out.Weights, out.Scales, out.RecvWeights, out.RecvIdx)
	}
	if err := p.dispatchPermuteRound(h, x, w, nil, datapath.RoundRows, out.X, out.Weights, nil, out.RecvWeights, out.RecvIdx); err != nil {
		return err
	}
	return p.dispatchPermuteRound(h, sx, nil, nil, datapath.RoundScales, out.Scales, nil, nil, nil, nil)
}

// dispatchPermuteRound enqueues one round of DispatchPermute: x's rows
// (weights w, scales sx) permuted into px (pw, ps), the received weights
// into recvW and the handle's RecvIdx into recvIdx (nil: not copied).
func (p *Path) dispatchPermuteRound(h *datapath.Handle, x, w, sx *device.Tensor, round uint64, px, pw, ps, recvW, recvIdx *device.Tensor) error {
	if err := p.cross.push(h, x, w, sx, round, datapath.OpDispatchPermute); err != nil {
		return err
	}
	// Past the arrive, done is signalled whatever fails (dispatchRound).
	return errors.Join(p.permuteArrived(h, x, w, sx, px, pw, ps, recvW, recvIdx), p.flags.Finish(uint32(datapath.OpDispatchPermute)))
}

// permuteArrived is the rest of a DispatchPermute round once this rank's
// rows have arrived: the received weights and RecvIdx, and the permute of
// the receive window into px (pw, ps).
func (p *Path) permuteArrived(h *datapath.Handle, x, w, sx, px, pw, ps, recvW, recvIdx *device.Tensor) error {
	rb := datapath.RowBytes(x)
	if err := p.copyRecv(h, 0, rb, nil, recvW, recvIdx); err != nil {
		return err
	}
	src := p.ownView(regionRecv, 0, max(h.RecvRows*rb, 0))
	var srcW *device.Buffer
	if w != nil {
		srcW = p.ownView(regionRecv, p.recvWOff, h.RecvRows*p.K*4)
	}
	if err := p.permuteFrom(h, px, pw, src, srcW); err != nil {
		return err
	}
	if sx != nil {
		sb := datapath.RowBytes(sx)
		if err := p.permuteFrom(h, ps, nil, p.ownView(regionRecv, p.scaleOff(), max(h.RecvRows*sb, 0)), nil); err != nil {
			return err
		}
	}
	return nil
}

// commShape is commShape under this path's knobs.
func (p *Path) commShape(items, units int) (grid, block [3]uint32, chunk int64, err error) {
	return commShape(items, units, p.K, p.env.SMs, p.env.ChunkRows)
}
