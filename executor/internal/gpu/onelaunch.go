//go:build cuda && cgo

package gpu

import (
	_ "embed"
	"errors"

	"github.com/goep/goep/device"
	"github.com/goep/goep/executor/internal/datapath"
)

//go:embed kernels/onelaunch.ptx
var oneLaunchPTX []byte

// oneLaunch are the kernels that run a whole call of one NVLink domain in
// one launch (kernels/onelaunch.cu): the flat crossing's Dispatch, and
// its Combine and DispatchBackward.
type oneLaunch struct {
	mod      *device.Module
	dispatch *device.Kernel
	combine  *device.Kernel
	// blocks is the most blocks a launch takes: the GPU's SMs shared among
	// the domain's ranks on this GPU (their grids wait for each other and
	// must all be resident), capped by Config.SMs.
	blocks int
}

func newOneLaunch(p *Path) (*oneLaunch, error) {
	o := &oneLaunch{}
	var err error
	if o.mod, err = p.b.LoadModule(oneLaunchPTX); err != nil {
		return nil, err
	}
	if o.dispatch, err = o.mod.Kernel("goep_ep_dispatch"); err != nil {
		return nil, errors.Join(err, o.mod.Close())
	}
	if o.combine, err = o.mod.Kernel("goep_ep_combine"); err != nil {
		return nil, errors.Join(err, o.mod.Close())
	}
	o.blocks = oneLaunchBlocks(p.b.Driver().Limits().SMs, p.win.SameGPU, p.env.SMs)
	return o, nil
}

func (o *oneLaunch) close() error {
	if o == nil || o.mod == nil {
		return nil
	}
	return o.mod.Close()
}

// dispatchOne enqueues Dispatch in one domain as one launch of
// goep_ep_dispatch: the flags' Begin, the push, the Arrive, the copy-out
// and the Finish of dispatchRound, pipelined (a row is copied out as soon
// as its source has arrived), a rank's own rows stored straight into its
// outputs.
func (p *Path) dispatchOne(h *datapath.Handle, x, w, sx *device.Tensor, out datapath.DispatchOut) error {
	t := tbl(h)
	rb, sb := datapath.RowBytes(x), 0
	if sx != nil {
		sb = datapath.RowBytes(sx)
	}
	win := p.win.Own[regionRecv]
	unit := unitOf(rb, x.Buffer(), datapath.Buf(out.RecvX), win)
	entries := h.NumTokens * p.W
	rows, counts := p.rowsArg(h)
	grid := oneLaunchGrid(p.one.blocks, entries, h.RecvRows)
	op := flagOp(datapath.OpDispatch, x.DType(), w != nil)
	f := p.flags
	err := p.s.Launch(p.one.dispatch, [3]uint32{uint32(grid), 1, 1}, [3]uint32{oneLaunchThreads, 1, 1}, 0,
		some(datapath.Buf(x)), some(datapath.Buf(w)), some(datapath.Buf(sx)),
		some(t.entTok), some(t.entDest), some(t.entRow), int64(entries),
		some(t.recvSrc), some(t.recvEnt), some(t.recvIdx), counts, rows, int64(h.RecvRows),
		some(datapath.Buf(out.RecvX)), some(datapath.Buf(out.RecvWeights)),
		some(datapath.Buf(out.RecvIdx)), some(datapath.Buf(out.RecvScales)),
		p.peerTable(regionRecv), win, int64(rb), int64(p.recvWOff), int64(p.scaleOff()), int64(sb),
		int32(p.K), int32(p.W), unit, f.Peers(), f.Words(), int32(f.Size()), int32(f.Rank()), op, f.TimeoutNs())
	if err != nil {
		// Nothing of the call ran: join it as rejected, so that the
		// peers fail it at once and the epochs stay in step.
		p.rejectFlags(err)
		p.cross.abandoned(datapath.OpDispatch, err)
		return err
	}
	return nil
}

// combineOne enqueues Combine (DispatchBackward with zw) in one domain as
// one launch of goep_ep_combine: the flags' Begin, the scatter, the
// Arrive, the sum and the Finish of Combine's kernel sequence, pipelined
// (a token is summed once the ranks its terms come from have arrived), a
// rank's own rows read by the sum straight from z instead of through its
// window. The sums are the sequence's bit for bit: the same terms in the
// same order.
func (p *Path) combineOne(h *datapath.Handle, z, zw *device.Tensor, out datapath.CombineOut) error {
	t := tbl(h)
	dt := z.DType()
	rb := p.H * dt.Size()
	win := p.win.Own[regionComb]
	unit := unitOf(rb, z.Buffer(), win)
	vec, units := int32(0), p.H
	if unitOf(rb, z.Buffer(), win, out.X.Buffer()) == 16 {
		vec, units = 1, rb/16
	}
	bf16 := int32(0)
	if dt == device.BF16 {
		bf16 = 1
	}
	var gw *device.Tensor
	if zw != nil {
		gw = out.GradTopkWeights
	}
	sums := h.NumTokens * oneLaunchSumChunks(units)
	grid := oneLaunchGrid(p.one.blocks, h.RecvRows, sums)
	op := flagOp(datapath.OpCombine, dt, zw != nil)
	f := p.flags
	err := p.s.Launch(p.one.combine, [3]uint32{uint32(grid), 1, 1}, [3]uint32{oneLaunchThreads, 1, 1}, 0,
		some(datapath.Buf(z)), some(datapath.Buf(zw)), some(t.recvSrc), some(t.recvEnt), int64(h.RecvRows),
		some(t.entDest), some(t.entRow), some(t.slotEnt), int64(h.NumTokens),
		some(datapath.Buf(out.X)), some(datapath.Buf(gw)),
		p.peerTable(regionComb), win, int64(rb), int64(p.combWOff), int64(p.H), int32(p.K), int32(p.W),
		unit, bf16, vec, p.dnan, f.Peers(), f.Words(), int32(f.Size()), int32(f.Rank()), op, f.TimeoutNs())
	if err != nil {
		// Nothing of the call ran (dispatchOne).
		p.rejectFlags(err)
		p.cross.abandoned(datapath.OpCombine, err)
		return err
	}
	return nil
}

// some is b, or nil when b is empty: an empty view may sit at the end of
// its allocation, where no device memory is (the launch refuses it), and a
// kernel reads none of it anyway.
func some(b *device.Buffer) *device.Buffer {
	if b == nil || b.Size() == 0 {
		return nil
	}
	return b
}
