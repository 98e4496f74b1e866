//go:build cuda && cgo

package gpu

import (
	"context"
	_ "embed"
	"encoding/binary"
	"errors"
	"slices"

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
	// probe is where the kernels record their calls' times (Options.Probe
	// or LinkPace; nil: not recorded), paceFs the pacing of the stores to
	// peers in femtoseconds a byte (0: none).
	probe  *device.Buffer
	paceFs int64
}

// The probe's layout (kernels/onelaunch.cu, probeLive and probeSlots):
// probeLive live words, then probeSlots records of probeLive words.
const (
	probeLive  = 8
	probeSlots = 64
	probeSize  = 8 * probeLive * (1 + probeSlots)
)

func newOneLaunch(p *Path, opts Options) (*oneLaunch, error) {
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
	if opts.Probe || opts.LinkPace > 0 {
		o.paceFs = paceFs(opts.LinkPace)
		if o.probe, err = p.s.Alloc(probeSize); err == nil {
			err = p.s.Memset(o.probe, 0, probeSize, 0)
		}
		if err != nil {
			if o.probe != nil {
				p.s.Free(o.probe)
			}
			return nil, errors.Join(err, o.mod.Close())
		}
	}
	return o, nil
}

// paceFs is the time a byte takes at gbps GB/s, in femtoseconds (0: no
// pacing).
func paceFs(gbps float64) int64 {
	if gbps <= 0 {
		return 0
	}
	return int64(1e6/gbps + 0.5)
}

func (o *oneLaunch) close(s *device.CUDAStream) error {
	if o == nil || o.mod == nil {
		return nil
	}
	if o.probe != nil {
		s.Free(o.probe)
	}
	return o.mod.Close()
}

// Probe is what the one-launch kernels recorded of one call (Options.Probe
// or LinkPace): times of the GPU's global timer in nanoseconds, which
// every rank on one GPU reads alike.
type Probe struct {
	Epoch uint64 // the call's epoch in the domain's flag protocol
	Op    uint32 // its operation word (flagOp)
	// Start is when the launch's first block started; Sent when its last
	// store into a peer's window ended (0: none).
	Start, Sent uint64
	// First and Last are when the first and the last row from a peer
	// (dispatch) or sum with a term from a peer (combine) was in its
	// final place (0: none).
	First, Last uint64
	// Bytes is what the launch stored into peers' windows.
	Bytes uint64
	// Found is when the launch's last block had the received rows'
	// offsets by source (0: none looked for, one rank); FirstSent when
	// its first row was published into a peer's window (0: none).
	Found, FirstSent uint64
}

// Probes downloads the records of the last calls (up to 64), oldest
// first; none unless Options.Probe or LinkPace was set, and none for a
// rank alone (probeArg). The stream must be idle (after Synchronize).
func (p *Path) Probes(ctx context.Context) ([]Probe, error) {
	if p.one == nil || p.one.probe == nil {
		return nil, nil
	}
	raw, err := p.s.DownloadBuffer(ctx, p.one.probe)
	if err != nil {
		return nil, err
	}
	var out []Probe
	for slot := range probeSlots {
		w := func(i int) uint64 { return binary.LittleEndian.Uint64(raw[8*(probeLive*(1+slot)+i):]) }
		if w(0) == 0 {
			continue
		}
		out = append(out, Probe{Epoch: w(0) >> 8, Op: uint32(w(0) & 0xff), Start: w(1), Sent: w(2), First: w(3), Last: w(4), Bytes: w(5),
			Found: w(6), FirstSent: w(7)})
	}
	slices.SortFunc(out, func(a, b Probe) int { return compareU64(a.Epoch, b.Epoch) })
	return out, nil
}

func compareU64(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
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
		p.peerTable(regionRecv), win, int64(rb), int64(p.recvWOff), int64(p.scaleOff()), int64(sb), int64(p.recvFOff),
		int32(p.K), int32(p.W), unit, f.Peers(), f.Words(), int32(f.Size()), int32(f.Rank()), op, f.TimeoutNs(),
		p.probeArg(), p.one.paceFs)
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
		p.peerTable(regionComb), win, int64(rb), int64(p.combWOff), int64(p.combFOff), int64(p.H), int32(p.K), int32(p.W),
		unit, bf16, vec, p.dnan, f.Peers(), f.Words(), int32(f.Size()), int32(f.Rank()), op, f.TimeoutNs(),
		p.probeArg(), p.one.paceFs)
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

// probeArg is the probe a launch records into: none for a rank alone,
// whose call ends before its blocks are done (finish_alone), so that its
// record could not hold the launch's times.
func (p *Path) probeArg() *device.Buffer {
	if p.flags.Size() == 1 {
		return nil
	}
	return p.one.probe
}
