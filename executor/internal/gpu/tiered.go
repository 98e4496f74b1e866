//go:build cuda && cgo

package gpu

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/goep/goep/comm"
	"github.com/goep/goep/device"
	"github.com/goep/goep/executor/internal/datapath"
	"github.com/goep/goep/executor/internal/plan"
	"github.com/goep/goep/executor/internal/rail"
	"github.com/goep/goep/internal/view"
	"github.com/goep/goep/nvlink"
	"github.com/goep/goep/rdma"
	"go.uber.org/zap"
)

// The hierarchical algorithm on the CUDA backend (D < R). Within the domain
// the GPU data path is the one-domain one over the domain's windows, with
// "virtual tokens": this rank's own tokens, then the tokens its rail peers
// forward to this domain (domain n's f-th at n*MaxTokensPerRank + f).
// Across domains the rail (rdma, host memory: the transports here have no
// GPU memory support) carries the rows, fed by the GPU: the rail's send
// and receive regions and the descriptor ring of its feed (rdma.Feed) are
// mapped for the GPU; goep_ep_push stores a round's payload straight into
// the send slots, goep_ep_rail_post writes the headers and the
// descriptors, which the feed's goroutine hands to the transport as soon
// as they appear, and what arrives is copied on the stream from the
// receive region (fromRail). A call with several domains still waits on
// the host for its peers' signals and its own descriptors (and a combine
// for its own status), so it cannot be captured into a CUDA graph.
// GOEP_RAIL_HOST_STAGING=1, or a domain of more than rail.MsgMax ranks,
// stages the rail through host copies instead (downloads, the host's
// fill, uploads: the path before the GPU-fed rail).
//
//   - Dispatch: the rail round sends each other domain the rows of the
//     tokens that reach it (as on the host backend), the rows received go
//     into fwdX / fwdW, and the domain's push runs twice: this rank's
//     tokens from x, the forwarded ones from fwdX, each to its
//     destinations in this domain. Receive windows, copy-out and permute
//     are unchanged.
//   - Combine: every rank pushes its received rows into the combine window
//     of the row's source (same domain) or of the forwarder (another
//     domain); the sum kernel sums this rank's own tokens' entries into an
//     fp32 partial (not rounded) and the forwarded tokens' entries into
//     partials rounded to the dtype; those go back over the rail; the merge
//     kernel adds, per token, the partials of the domains in ascending
//     order (DESIGN.md's combine order) and rounds once.
type tiered struct {
	p               *Path
	r               *rail.Rail
	M, maxT, domain int
	fwdX, fwdW      *device.Buffer // [M*maxT] rows of up to H fp32; [M*maxT*K] fp32
	sumF32          *device.Kernel // goep_ep_sum_bf16_f32
	merge           [2]*device.Kernel
	// The GPU-fed rail (nil when the rail is host-staged): the feed, its
	// ring and the rail's send and receive regions mapped for the GPU,
	// the device address of every send slot's rows ([M] pointers,
	// goep_ep_push's peer table), views at those addresses (for unitOf),
	// and the kernel that writes the headers and descriptors.
	feed             *rdma.Feed
	ring, send, recv *device.HostMapping
	// recvRead follows the last round's copies from recv on the stream;
	// recvSync: its record failed, a host-posted round synchronizes the
	// stream instead.
	recvRead  *device.Event
	recvSync  bool
	slotRows  *device.Buffer
	slotViews []*device.Buffer
	post      *device.Kernel
}

// railRingSize is the feed's ring size for M domains: a round writes at
// most two descriptors per other domain.
func railRingSize(M int) int {
	n := 4
	for n < 2*M {
		n *= 2
	}
	return n
}

// newRailFeed maps the rail's send region and a feed's ring for the GPU
// (the GPU-fed rail).
func (x *tiered) newRailFeed(ctx context.Context) error {
	g, hr := x.p, x.r
	var err error
	if x.post, err = g.mod.Kernel("goep_ep_rail_post"); err != nil {
		return err
	}
	if x.feed, err = rdma.NewFeed(hr.Transport, railRingSize(x.M)); err != nil {
		return fmt.Errorf("executor: rail feed: %w", err)
	}
	const staging = "(GOEP_RAIL_HOST_STAGING=1 stages the rail through host copies instead)"
	if x.ring, err = g.b.MapHost(x.feed.Memory()); err != nil {
		return fmt.Errorf("executor: rail feed ring %s: %w", staging, err)
	}
	if x.send, err = g.b.MapHost(hr.Transport.SendBuffer()); err != nil {
		return fmt.Errorf("executor: rail send region %s: %w", staging, err)
	}
	if x.recv, err = g.b.MapHost(hr.Transport.RecvBuffer()); err != nil {
		return fmt.Errorf("executor: rail receive region %s: %w", staging, err)
	}
	// A peer's header goes out when its stream reaches goep_ep_rail_post,
	// behind its GPU waits (up to the timeout) and the work queued before.
	hr.CombineSlack = g.env.Timeout
	// A rail round posted by the host (a layout, a failure) must not let
	// peers overwrite a receive slot that a copy on the stream still reads.
	hr.HostPost = func(ctx context.Context) error {
		var err error
		switch {
		case x.recvSync:
			err = g.s.Synchronize(ctx)
		case x.recvRead != nil:
			err = x.recvRead.Wait(ctx)
		}
		if err != nil {
			if ctx.Err() != nil {
				err = fmt.Errorf("%w: %w", comm.ErrTimeout, err)
			}
			return fmt.Errorf("executor: rail of rank %d: wait for the copies from the receive region: %w", g.env.Rank, err)
		}
		x.recvRead, x.recvSync = nil, false
		return nil
	}
	ptrs := make([]byte, 8*x.M)
	for n := range x.M {
		v, err := x.send.Buffer().View(n*hr.Slot+rail.Header+hr.Area, hr.Slot-rail.Header-hr.Area)
		if err != nil {
			return err
		}
		x.slotViews = append(x.slotViews, v)
		binary.LittleEndian.PutUint64(ptrs[8*n:], v.DevicePtr())
	}
	if x.slotRows, err = g.s.Alloc(len(ptrs)); err != nil {
		return err
	}
	return g.s.UploadBuffer(ctx, x.slotRows, ptrs)
}

// newTiered is the crossing of several domains; staging is
// GOEP_RAIL_HOST_STAGING.
func newTiered(ctx context.Context, g *Path, staging bool) (*tiered, error) {
	hr := g.ctl.Rail
	x := &tiered{p: g, r: hr, M: hr.M, maxT: g.env.P.MaxTokensPerRank, domain: hr.Domain}
	var err error
	if x.sumF32, err = g.mod.Kernel("goep_ep_sum_bf16_f32"); err != nil {
		return nil, err
	}
	if x.merge[0], err = g.mod.Kernel("goep_ep_merge_bf16"); err != nil {
		return nil, err
	}
	if x.merge[1], err = g.mod.Kernel("goep_ep_merge_fp32"); err != nil {
		return nil, err
	}
	rows := max(x.M*x.maxT, 1)
	if x.fwdX, err = g.s.Alloc(rows * g.H * 4); err != nil {
		return nil, err
	}
	if x.fwdW, err = g.s.Alloc(rows * g.K * 4); err != nil {
		g.s.Free(x.fwdX)
		return nil, err
	}
	// A GPU-fed header reports a failed wait with one byte per rank of the
	// domain in its message area; larger domains stage through the host.
	if !staging && hr.D <= rail.MsgMax {
		err = x.newRailFeed(ctx)
	}
	if err != nil {
		return nil, errors.Join(err, x.close())
	}
	if g.env.Rank == 0 {
		// The rail's send and receive regions are the transport's host
		// memory, mapped for the GPU (or staged through pinned copies),
		// whether or not UCX could read and write device memory itself.
		_, why := rdma.GPUMemory(hr.Transport)
		g.env.Log.Info("rail: rows cross domains through host memory, not GPUDirect RDMA", zap.String("ucx", why),
			zap.Bool("gpu_fed", x.feed != nil))
	}
	return x, nil
}

// close frees what newTiered made; the caller has synchronized the stream
// (no queued work uses the mappings), and the feed stops before the rail
// transport closes.
func (x *tiered) close() error {
	g := x.p
	g.s.Free(x.fwdX)
	g.s.Free(x.fwdW)
	g.s.Free(x.slotRows)
	var errs []error
	for _, m := range []*device.HostMapping{x.ring, x.send, x.recv} {
		if m != nil {
			errs = append(errs, m.Close())
		}
	}
	if x.feed != nil {
		errs = append(errs, x.feed.Close())
	}
	return errors.Join(errs...)
}

// railTables are the extra tables of a handle with several domains
// (views into one Int32 tensor): the entries of the forwarded tokens, and
// what the merge needs.
type railTables struct {
	all *device.Tensor
	// Forwarded token v = n*maxT + f (f-th token the rail peer in domain n
	// forwards here): entries v*W + c (its c-th destination in this
	// domain) relative to the forwarded entries' base (maxT*W in the
	// combine window), as the own tokens' tables.
	fEntTok, fEntDest, fEntRow *device.Buffer // [M*maxT*W]
	fSlotEnt                   *device.Buffer // [M*maxT*K]
	ownLive                    *device.Buffer // [T]: 1 if a destination in this domain kept the token's row
	remIdx                     *device.Buffer // [M*T]: token t's row in domain n's partials, -1 if none
	slotDom                    *device.Buffer // [T*K]: domain of slot k's expert, -1 for an empty slot
	// The rail's send slots (plan.RailTables.RailTok etc.): railSends entries,
	// railCount[n] (ownCount) rows for domain n; of a combine: partSends
	// entries, partCount[n] (fwdCount) rows.
	railTok, railDest, railRow, railCount *device.Buffer
	partSrc, partDest, partRow, partCount *device.Buffer
	railSends, partSends                  int
	fwdCount                              []int // rows forwarded here from each domain
	ownCount                              []int // this rank's tokens that reach each domain
}

func (t *railTables) close() {
	if t != nil && t.all != nil {
		t.all.Close()
	}
}

// railTables fills the own tokens' entry tables and the combine targets
// of the received rows into the given host tables (plan.RailTables), and
// uploads the forwarded tokens' and merge tables as a new tensor.
func (tr *tiered) railTables(ctx context.Context, lay *plan.Layout, routing [][]int32, entTok, entDest, entRow, slotEnt, recvSrc, recvEnt []int32) (*railTables, error) {
	g := tr.p
	p := plan.BuildRailTables(lay, g.env.P, routing, g.W)
	copy(entTok, p.EntTok)
	copy(entDest, p.EntDest)
	copy(entRow, p.EntRow)
	copy(slotEnt, p.SlotEnt)
	copy(recvSrc, p.RecvSrc)
	copy(recvEnt, p.RecvEnt)
	parts := [][]int32{p.FTok, p.FDest, p.FRow, p.FSlot, p.OwnLive, p.RemIdx, p.SlotDom, p.RailTok, p.RailDest, p.RailRow, int32Counts(p.OwnCount),
		p.PartSrc, p.PartDest, p.PartRow, int32Counts(p.FwdCount)}
	var host []int32
	for _, part := range parts {
		host = append(host, part...)
	}
	all, err := device.NewTensor(g.s, device.Int32, max(len(host), 1))
	if err != nil {
		return nil, err
	}
	if err := g.s.UploadBuffer(ctx, all.Buffer(), device.EncodeInt32(host)); err != nil {
		all.Close()
		return nil, g.env.Fate.Note(err)
	}
	views := make([]*device.Buffer, len(parts))
	o := 0
	for i, part := range parts {
		if views[i], err = all.Buffer().View(4*o, 4*len(part)); err != nil {
			all.Close()
			return nil, err
		}
		o += len(part)
	}
	return &railTables{all: all, fEntTok: views[0], fEntDest: views[1], fEntRow: views[2], fSlotEnt: views[3],
		ownLive: views[4], remIdx: views[5], slotDom: views[6],
		railTok: views[7], railDest: views[8], railRow: views[9], railCount: views[10], railSends: len(p.RailTok),
		partSrc: views[11], partDest: views[12], partRow: views[13], partCount: views[14], partSends: len(p.PartSrc),
		fwdCount: p.FwdCount, ownCount: p.OwnCount}, nil
}

// int32Counts is counts as int32s, for a device table.
func int32Counts(counts []int) []int32 {
	out := make([]int32, len(counts))
	for i, c := range counts {
		out[i] = int32(c)
	}
	return out
}

// railCtx bounds the host work of a call with several domains around its
// rail round (downloads, uploads, the synchronize of a combine): twice the
// timeout, as such a synchronize waits for GPU waits that give up only
// after the timeout themselves, and must see their outcome, not its own
// deadline.
func (tr *tiered) railCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), 2*tr.p.env.Timeout)
}

// hierPush is pushRows with several domains: the rail round of x's rows
// (GPU-fed, or host-staged), the forwarded rows into fwdX / fwdW, then the
// domain's pushes of own and forwarded rows and the arrive.
func (tr *tiered) hierPush(h *datapath.Handle, x, w *device.Tensor, round uint64, op datapath.Op) error {
	g, hx, lay := tr.p, tr, h.Lay
	ctx, cancel := tr.railCtx()
	defer cancel()
	rb := datapath.RowBytes(x)
	sg := datapath.Sig(h, x.DType(), w != nil, round)
	var recv func(n int) []byte
	var rerr error
	if hx.feed != nil {
		recv, rerr = tr.r.Exchange(op, sg, nil, nil, func(ctx context.Context, ep uint64, parity int) (func(context.Context) error, error) {
			ht := tbl(h).rail
			return tr.railSend(railPayload{src: x.Buffer(), w: datapath.Buf(w), rowBytes: rb, tok: ht.railTok, dest: ht.railDest, row: ht.railRow,
				entries: ht.railSends, counts: ht.ownCount, devCounts: ht.railCount}, op, sg, ep, parity)
		})
	} else {
		var xs, ws []byte
		var err error
		if xs, err = g.s.DownloadBuffer(ctx, x.Buffer()); err == nil && w != nil {
			ws, err = g.s.DownloadBuffer(ctx, w.Buffer())
		}
		err = g.env.Fate.Note(err)
		fill := rail.DispatchFill(lay, xs, view.Float32s(ws), w != nil, rb)
		if err != nil {
			fill = nil
		}
		recv, rerr = tr.r.Round(op, sg, err, fill)
	}
	if rerr == nil {
		for n := range hx.M {
			if n == hx.domain {
				continue
			}
			cnt := tbl(h).rail.fwdCount[n]
			slot := recv(n)
			if got := rail.GetHead(slot).Count; got != cnt {
				rerr = fmt.Errorf("executor: rail: rank %d sent %d rows to domain %d, its layout says %d: %w", tr.r.Global(n), got, hx.domain, cnt, nvlink.ErrPeerMismatch)
				break
			}
			if cnt == 0 {
				continue
			}
			dst, _ := hx.fwdX.View(n*hx.maxT*rb, cnt*rb)
			if rerr = tr.fromRail(ctx, dst, n, rail.Header+tr.r.Area, slot); rerr != nil {
				break
			}
			if w != nil {
				dw, _ := hx.fwdW.View(n*hx.maxT*g.K*4, cnt*g.K*4)
				if rerr = tr.fromRail(ctx, dw, n, rail.Header, slot); rerr != nil {
					break
				}
			}
		}
	}
	if err := tr.railRead(); rerr == nil {
		rerr = err
	}
	if rerr != nil {
		// The domain's peers must fail this call too.
		g.rejectFlags(rerr)
		return rerr
	}
	if err := g.flags.Begin(); err != nil {
		return err
	}
	if err := g.pushEntries(x.Buffer(), datapath.Buf(w), nil, rb, 0, tbl(h).entTok, tbl(h).entDest, tbl(h).entRow, h.NumTokens*g.W); err != nil {
		return g.abandon(op, err)
	}
	var fw *device.Buffer
	if w != nil {
		fw = hx.fwdW
	}
	rt := tbl(h).rail
	if err := g.pushEntries(hx.fwdX, fw, nil, rb, 0, rt.fEntTok, rt.fEntDest, rt.fEntRow, hx.M*hx.maxT*g.W); err != nil {
		return g.abandon(op, err)
	}
	return g.flags.ArriveAfterRound(flagOp(op, x.DType(), w != nil))
}

// fromRail fills dst from byte off of slot, the last rail round's receive
// slot of the peer in domain n: on the GPU-fed rail a copy on the stream
// from the receive region mapped for the GPU (railRead marks the round's
// copies), else an upload through pinned staging.
func (tr *tiered) fromRail(ctx context.Context, dst *device.Buffer, n, off int, slot []byte) error {
	g, hx, hr := tr.p, tr, tr.r
	if hx.recv == nil {
		return g.s.UploadBuffer(ctx, dst, slot[off:off+dst.Size()])
	}
	return g.s.Copy(dst, 0, hx.recv.Buffer(), hr.RecvSlotOff(n)+off, dst.Size())
}

// railRead records, after a round's copies from the receive region (the
// GPU-fed rail), the event a host-posted round waits for
// (rail.Rail.HostPost); the stream's own later rail posts are ordered
// after the copies anyway. If the record fails, a host post synchronizes
// the stream instead.
func (tr *tiered) railRead() error {
	g, hx := tr.p, tr
	if hx.recv == nil {
		return nil
	}
	ev, err := g.s.Record()
	if err != nil {
		hx.recvSync = true
		return err
	}
	hx.recvRead = ev
	return nil
}

// railPayload is what one GPU-fed rail round stores into the send slots:
// entry j < entries takes row tok[j] of src (rowBytes) and, when w is not
// nil, its TopK weights (fp32) to row row[j] of the slot for domain
// dest[j]; counts[n] rows go to domain n (devCounts: the same on the
// device). With status, the slots' headers report this call's failed GPU
// waits, if any (a combine, whose domain exchange ran first).
type railPayload struct {
	src, w         *device.Buffer
	rowBytes       int
	tok, dest, row *device.Buffer
	entries        int
	counts         []int
	devCounts      *device.Buffer
	status         bool
}

// railSend is a rail round's sender on the GPU-fed rail: it enqueues
// goep_ep_push of the payload into the send slots and goep_ep_rail_post
// of the headers and descriptors at the feed's next positions, and
// announces them. The returned drain waits until the feed has handed them
// all to the transport; a deadline there is a timeout (the engine fails).
func (tr *tiered) railSend(pl railPayload, op datapath.Op, sg [4]uint64, ep uint64, parity int) (func(context.Context) error, error) {
	g, hx, hr := tr.p, tr, tr.r
	descs := 0
	for n := range hx.M {
		if n != hx.domain {
			descs++
			if pl.counts[n] > 0 {
				descs++
			}
		}
	}
	pos, err := hx.feed.Next(descs)
	if err != nil {
		return nil, err
	}
	rb := pl.rowBytes
	wb := 0
	if pl.w != nil {
		wb = g.K * 4
	}
	if pl.entries > 0 {
		unit := unitOf(rb, append([]*device.Buffer{pl.src}, hx.slotViews...)...)
		grid, block, chunk, err := g.commShape(pl.entries, rb/int(unit))
		if err != nil {
			return nil, err
		}
		// The weights area precedes the rows in a slot: at -area from them.
		if err := g.s.Launch(g.push, grid, block, 0, pl.src, pl.w, pl.tok, pl.dest, pl.row,
			int64(pl.entries), hx.slotRows, int64(rb), int64(-hr.Area), int32(g.K), unit, chunk,
			(*device.Buffer)(nil), int64(0), int64(0)); err != nil {
			return nil, g.env.Fate.Note(err)
		}
	}
	var status, missing *device.Buffer
	if pl.status {
		status, missing = g.flags.Status(), g.flags.Missing()
	}
	if err := g.s.Launch(hx.post, [3]uint32{1, 1, 1}, [3]uint32{1, 1, 1}, 0, hx.ring.Buffer(), pos, uint64(hx.feed.Size()-1),
		hx.send.Buffer(), pl.devCounts, int32(hx.M), int32(hx.domain), int64(hr.Slot), int64(rail.Header), int64(hr.Area),
		int64(rb), int64(wb), int64(parity), ep, uint64(op), sg[0], sg[1], sg[2], status, missing, int32(g.R)); err != nil {
		return nil, g.env.Fate.Note(err)
	}
	hx.feed.Expect(descs)
	return func(ctx context.Context) error {
		err := hx.feed.Drain(ctx)
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			err = fmt.Errorf("%w: %w", comm.ErrTimeout, err)
		}
		// A descriptor that did not reach the transport leaves its peer
		// without this round's signal (or with a stale header): fatal.
		err = fmt.Errorf("executor: rail of rank %d: %w", g.env.Rank, err)
		g.env.Fate.Fail(err)
		return err
	}, nil
}

// hierSum is the rest of a combine with several domains, once every
// rank's rows of dtype dt (and weights, when weighted) are in the domain's
// combine windows: the partial sums, the rail round and the merge.
func (tr *tiered) hierSum(h *datapath.Handle, dt device.DType, weighted bool, out datapath.CombineOut, op datapath.Op) error {
	g, hx := tr.p, tr
	ht := tbl(h).rail
	rb := g.H * dt.Size()
	di := dtypeIndex(dt)
	T, K, W, maxT, M := h.NumTokens, g.K, g.W, hx.maxT, hx.M
	// Temporaries, freed in stream order after the merge.
	own, err := g.env.Alloc(device.FP32, max(T, 1), g.H)
	if err != nil {
		return tr.sumFailed(h, dt, weighted, op, err, false)
	}
	defer own.Close()
	ownW, err := g.env.Alloc(device.FP32, max(T, 1), K)
	if err != nil {
		return tr.sumFailed(h, dt, weighted, op, err, false)
	}
	defer ownW.Close()
	part, err := g.env.Alloc(dt, M*maxT, g.H)
	if err != nil {
		return tr.sumFailed(h, dt, weighted, op, err, false)
	}
	defer part.Close()
	partW, err := g.env.Alloc(device.FP32, M*maxT, K)
	if err != nil {
		return tr.sumFailed(h, dt, weighted, op, err, false)
	}
	defer partW.Close()
	var gw, pgw *device.Tensor
	if weighted {
		gw, pgw = ownW, partW
	}
	sum := func(k *device.Kernel, out, gw *device.Tensor, entBase, tokens int, live, slots *device.Buffer, outRB int) error {
		if tokens == 0 {
			return nil
		}
		src := g.ownView(regionComb, entBase*rb, tokens*W*rb)
		srcW := g.ownView(regionComb, g.combWOff+entBase*K*4, tokens*W*K*4)
		vec := rb%16 == 0 && outRB%16 == 0 && out.Buffer().DevicePtr()%16 == 0
		units, v := g.H, int32(0)
		if vec {
			units, v = rb/16, 1
		}
		grid, block, err := rowShape(tokens, units, g.K)
		if err != nil {
			return err
		}
		return g.s.Launch(k, grid, block, 0, out, gw, src, srcW, live, slots,
			int64(tokens), int32(W), int64(g.H), int32(K), v, g.dnan)
	}
	ownK := hx.sumF32
	if dt == device.FP32 {
		ownK = g.sum[1]
	}
	if err := sum(ownK, own, gw, 0, T, tbl(h).entRow, tbl(h).slotEnt, g.H*4); err != nil {
		return tr.sumFailed(h, dt, weighted, op, err, false)
	}
	if err := sum(g.sum[di], part, pgw, maxT*W, M*maxT, ht.fEntRow, ht.fSlotEnt, rb); err != nil {
		return tr.sumFailed(h, dt, weighted, op, err, false)
	}
	if err := g.flags.Finish(uint32(op)); err != nil {
		return tr.sumFailed(h, dt, weighted, op, err, true)
	}
	// The partials cross the rail.
	ctx, cancel := tr.railCtx()
	defer cancel()
	sg := datapath.Sig(h, dt, weighted, datapath.RoundRows)
	var recv func(n int) []byte
	var rerr error
	if hx.feed != nil && g.pending == nil {
		// GPU-fed: the slots' headers carry this call's GPU wait outcome
		// to the rail peers; this rank learns it from the synchronize.
		var pw *device.Buffer
		if weighted {
			pw = partW.Buffer()
		}
		recv, rerr = tr.r.Exchange(op, sg, nil, nil, func(ctx context.Context, ep uint64, parity int) (func(context.Context) error, error) {
			return tr.railSend(railPayload{src: part.Buffer(), w: pw, rowBytes: rb, tok: ht.partSrc, dest: ht.partDest, row: ht.partRow,
				entries: ht.partSends, counts: ht.fwdCount, devCounts: ht.partCount, status: true}, op, sg, ep, parity)
		})
		// This rank's own outcome first (as the host-staged path reports
		// it), with its own deadline: the round's may be spent.
		sctx, scancel := tr.railCtx()
		serr := g.synchronizeGPU(sctx)
		scancel()
		if serr != nil {
			return errors.Join(serr, rerr)
		}
	} else {
		status := g.synchronizeGPU(ctx)
		var ps, pws []byte
		if status == nil {
			ps, status = g.s.DownloadBuffer(ctx, part.Buffer())
		}
		if status == nil && weighted {
			pws, status = g.s.DownloadBuffer(ctx, partW.Buffer())
		}
		var fill rail.Fill
		if status == nil {
			fill = rail.PartialsFill(ht.fwdCount, ps, pws, maxT, K, rb)
		}
		recv, rerr = tr.r.Round(op, sg, status, fill)
	}
	if rerr != nil {
		return rerr
	}
	// Every rank's own tokens: its partials from the other domains.
	rem, err := g.env.Alloc(dt, M*maxT, g.H)
	if err != nil {
		return errors.Join(err, tr.railRead())
	}
	defer rem.Close()
	remW, err := g.env.Alloc(device.FP32, M*maxT, K)
	if err != nil {
		return errors.Join(err, tr.railRead())
	}
	defer remW.Close()
	for n := range M {
		cnt := ht.ownCount[n]
		if n == hx.domain || cnt == 0 {
			continue
		}
		slot := recv(n)
		if got := rail.GetHead(slot).Count; got != cnt {
			// The copies already queued are marked for a host post.
			return errors.Join(fmt.Errorf("executor: rail: rank %d returned %d partials to domain %d, its layout says %d: %w",
				tr.r.Global(n), got, hx.domain, cnt, nvlink.ErrPeerMismatch), tr.railRead())
		}
		dst, _ := rem.Buffer().View(n*maxT*rb, cnt*rb)
		if err := tr.fromRail(ctx, dst, n, rail.Header+tr.r.Area, slot); err != nil {
			return errors.Join(g.env.Fate.Note(err), tr.railRead())
		}
		if weighted {
			dw, _ := remW.Buffer().View(n*maxT*K*4, cnt*K*4)
			if err := tr.fromRail(ctx, dw, n, rail.Header, slot); err != nil {
				return errors.Join(g.env.Fate.Note(err), tr.railRead())
			}
		}
	}
	if err := tr.railRead(); err != nil {
		return g.env.Fate.Note(err)
	}
	if T == 0 {
		return nil
	}
	grid, block, err := rowShape(T, g.H, K)
	if err != nil {
		return err
	}
	var ogw *device.Tensor
	if weighted {
		ogw = out.GradTopkWeights
	}
	return g.s.Launch(hx.merge[di], grid, block, 0, out.X, ogw, own, ht.ownLive, ownW, rem, remW,
		ht.remIdx, ht.slotDom, int64(T), int32(M), int32(hx.domain), int64(maxT), int64(g.H), int32(K), g.dnan)
}

// sumFailed ends a combine-like call that failed on this rank after its
// domain exchange and before its rail round (a temporary not allocated, a
// launch refused): it signals done unless finished says that was done
// (the domain's next call must not wait for this rank), and sends the
// failure in the call's rail round, so that the rail peers fail the call
// at once instead of at their timeout. It returns err with any error of
// the signal.
func (tr *tiered) sumFailed(h *datapath.Handle, dt device.DType, weighted bool, op datapath.Op, err error, finished bool) error {
	if !finished {
		err = errors.Join(err, tr.p.flags.Finish(uint32(op)))
	}
	_, _ = tr.r.Round(op, datapath.Sig(h, dt, weighted, datapath.RoundRows), err, nil)
	return err
}

// reject joins a rejected call: the domain's GPU signals and the rail
// round, in the call's order; a layout, which runs on the host, joins the
// control plane's exchange and the rail on the caller's goroutine, as the
// GPU calls run their rail rounds (a stream task could interleave its
// epoch with the next call's).
func (tr *tiered) reject(op datapath.Op, cause error) {
	if op == datapath.OpLayout {
		tr.p.ctl.JoinNow(op, cause)
		return
	}
	tr.r.Reject(op, cause, func() { tr.p.rejectFlags(cause) })
}

// abandoned sends a combine-like call's failure in its rail round, which
// follows the domain's (a dispatch-like call's came before).
func (tr *tiered) abandoned(op datapath.Op, err error) {
	if !op.DispatchLike() {
		_, _ = tr.r.Round(op, [4]uint64{}, err, nil)
	}
}

// enqueue runs fn as it is: the calls with several domains wait for the
// rail on the host, so they cannot hold the driver throughout.
func (tr *tiered) enqueue(fn func() error) error { return fn() }

// layout runs on the host with several domains.
func (tr *tiered) layout(ctx context.Context, h *datapath.Handle, idx *device.Tensor, sig [4]uint64) error {
	return tr.p.hostLayout(ctx, h, idx, sig)
}

// tables fills the own tokens' entry tables and the combine targets of
// the received rows (plan.RailTables), uploads them, and the forwarded
// tokens' and merge tables as a tensor of their own.
func (tr *tiered) tables(ctx context.Context, h *datapath.Handle, lay *plan.Layout, routing [][]int32, old *tables) (*tables, error) {
	p := tr.p
	T, K, W, rowCap := lay.NumTokens, p.K, p.W, h.RecvRows
	host, parts := plan.NewTables(T, K, W, rowCap)
	rt, err := tr.railTables(ctx, lay, routing, parts[0], parts[1], parts[2], parts[3], parts[4], parts[5])
	if err != nil {
		return old, err
	}
	n := p.env.ValidRecv(lay, p.env.Rank)
	plan.CopyRecvMaps(lay, n, parts[6], parts[7])
	return p.uploadTables(ctx, host, plan.TableSizes(T, K, W, rowCap), n, rt, old)
}

// push is the dispatch's push with several domains (hierPush); an fp8
// call's scales take a round of their own (splitScales).
func (tr *tiered) push(h *datapath.Handle, x, w, sx *device.Tensor, round uint64, op datapath.Op) error {
	if sx != nil {
		return fmt.Errorf("executor: CUDA path: scales pushed with their rows across domains")
	}
	return tr.hierPush(h, x, w, round, op)
}

func (tr *tiered) splitScales() bool { return true }

func (tr *tiered) sum(h *datapath.Handle, dt device.DType, weighted bool, out datapath.CombineOut, op datapath.Op) error {
	return tr.hierSum(h, dt, weighted, out, op)
}
