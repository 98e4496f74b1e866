//go:build cuda && cgo

package executor

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/goep/goep/device"
	"github.com/goep/goep/nvlink"
	"github.com/goep/goep/rdma"
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
// GOEP_RAIL_HOST_STAGING=1, or a domain of more than railMsgMax ranks,
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
type gpuHier struct {
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
func (x *gpuHier) newRailFeed(ctx context.Context, g *gpuEngine) error {
	hr := g.e.hier
	var err error
	if x.post, err = g.mod.Kernel("goep_ep_rail_post"); err != nil {
		return err
	}
	if x.feed, err = rdma.NewFeed(hr.rail, railRingSize(x.M)); err != nil {
		return fmt.Errorf("executor: rail feed: %w", err)
	}
	const staging = "(GOEP_RAIL_HOST_STAGING=1 stages the rail through host copies instead)"
	if x.ring, err = g.b.MapHost(x.feed.Memory()); err != nil {
		return fmt.Errorf("executor: rail feed ring %s: %w", staging, err)
	}
	if x.send, err = g.b.MapHost(hr.rail.SendBuffer()); err != nil {
		return fmt.Errorf("executor: rail send region %s: %w", staging, err)
	}
	if x.recv, err = g.b.MapHost(hr.rail.RecvBuffer()); err != nil {
		return fmt.Errorf("executor: rail receive region %s: %w", staging, err)
	}
	// A rail round posted by the host (a layout, a failure) must not let
	// peers overwrite a receive slot that a copy on the stream still reads.
	hr.hostPost = func(ctx context.Context) error {
		var err error
		switch {
		case x.recvSync:
			err = g.s.Synchronize(ctx)
		case x.recvRead != nil:
			err = x.recvRead.Wait(ctx)
		}
		if err != nil {
			if ctx.Err() != nil {
				err = fmt.Errorf("%w: %w", ErrTimeout, err)
			}
			return fmt.Errorf("executor: rail of rank %d: wait for the copies from the receive region: %w", g.e.rank, err)
		}
		x.recvRead, x.recvSync = nil, false
		return nil
	}
	ptrs := make([]byte, 8*x.M)
	for n := range x.M {
		v, err := x.send.Buffer().View(n*hr.slot+railHeader+hr.area, hr.slot-railHeader-hr.area)
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

func newGPUHier(ctx context.Context, g *gpuEngine) (*gpuHier, error) {
	hr, cfg := g.e.hier, g.e.cfg
	x := &gpuHier{M: hr.M, maxT: cfg.MaxTokensPerRank, domain: hr.domain}
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
	if !hr.staging && hr.D <= railMsgMax {
		err = x.newRailFeed(ctx, g)
	}
	if err != nil {
		return nil, errors.Join(err, x.close(g))
	}
	return x, nil
}

// close frees what newGPUHier made; the caller has synchronized the stream
// (no queued work uses the mappings), and the feed stops before the rail
// transport closes.
func (x *gpuHier) close(g *gpuEngine) error {
	if x == nil {
		return nil
	}
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

// gpuHierTables are the extra tables of a handle with several domains
// (views into one Int32 tensor): the entries of the forwarded tokens, and
// what the merge needs.
type gpuHierTables struct {
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
	// The rail's send slots (hierPlan.railTok etc.): railSends entries,
	// railCount[n] (ownCount) rows for domain n; of a combine: partSends
	// entries, partCount[n] (fwdCount) rows.
	railTok, railDest, railRow, railCount *device.Buffer
	partSrc, partDest, partRow, partCount *device.Buffer
	railSends, partSends                  int
	fwdCount                              []int // rows forwarded here from each domain
	ownCount                              []int // this rank's tokens that reach each domain
}

func (t *gpuHierTables) close() {
	if t != nil && t.all != nil {
		t.all.Close()
	}
}

// hierTables fills the own tokens' entry tables and the combine targets
// of the received rows into the given host tables (hierPlan), and uploads
// the forwarded tokens' and merge tables as a new tensor.
func (g *gpuEngine) hierTables(ctx context.Context, lay *Layout, routing [][]int32, entTok, entDest, entRow, slotEnt, recvSrc, recvEnt []int32) (*gpuHierTables, error) {
	e := g.e
	p := planHier(lay, e.cfg, routing, g.W)
	copy(entTok, p.entTok)
	copy(entDest, p.entDest)
	copy(entRow, p.entRow)
	copy(slotEnt, p.slotEnt)
	copy(recvSrc, p.recvSrc)
	copy(recvEnt, p.recvEnt)
	parts := [][]int32{p.fTok, p.fDest, p.fRow, p.fSlot, p.ownLive, p.remIdx, p.slotDom, p.railTok, p.railDest, p.railRow, int32Counts(p.ownCount),
		p.partSrc, p.partDest, p.partRow, int32Counts(p.fwdCount)}
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
		return nil, e.noteFailure(err)
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
	return &gpuHierTables{all: all, fEntTok: views[0], fEntDest: views[1], fEntRow: views[2], fSlotEnt: views[3],
		ownLive: views[4], remIdx: views[5], slotDom: views[6],
		railTok: views[7], railDest: views[8], railRow: views[9], railCount: views[10], railSends: len(p.railTok),
		partSrc: views[11], partDest: views[12], partRow: views[13], partCount: views[14], partSends: len(p.partSrc),
		fwdCount: p.fwdCount, ownCount: p.ownCount}, nil
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
func (g *gpuEngine) railCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), 2*g.e.cfg.Timeout)
}

// hierPush is pushRows with several domains: the rail round of x's rows
// (GPU-fed, or host-staged), the forwarded rows into fwdX / fwdW, then the
// domain's pushes of own and forwarded rows and the arrive.
func (g *gpuEngine) hierPush(h *Handle, x, w *device.Tensor, round uint64, op uint32) error {
	e, hx, lay := g.e, g.hier, h.lay
	ctx, cancel := g.railCtx()
	defer cancel()
	rb := rowBytes(x)
	c := nvlink.Call{Op: uint64(op), Sig: sig(h, x.DType(), w != nil)}
	c.Sig[3] = round
	var recv func(n int) []byte
	var rerr error
	if hx.feed != nil {
		recv, rerr = e.railExchange(c.Op, c.Sig, nil, nil, func(ctx context.Context, ep uint64, parity int) (func(context.Context) error, error) {
			ht := h.gpu.hier
			return g.railSend(railPayload{src: x.Buffer(), w: buf(w), rowBytes: rb, tok: ht.railTok, dest: ht.railDest, row: ht.railRow,
				entries: ht.railSends, counts: ht.ownCount, devCounts: ht.railCount}, c, ep, parity)
		})
	} else {
		var xs, ws []byte
		var err error
		if xs, err = g.s.DownloadBuffer(ctx, x.Buffer()); err == nil && w != nil {
			ws, err = g.s.DownloadBuffer(ctx, w.Buffer())
		}
		err = e.noteFailure(err)
		fill := e.dispatchFill(lay, xs, f32s(ws), w != nil, rb)
		if err != nil {
			fill = nil
		}
		recv, rerr = e.railRound(c.Op, c.Sig, err, fill)
	}
	if rerr == nil {
		for n := range hx.M {
			if n == hx.domain {
				continue
			}
			cnt := h.gpu.hier.fwdCount[n]
			slot := recv(n)
			if got := getRailHead(slot).count; got != cnt {
				rerr = fmt.Errorf("executor: rail: rank %d sent %d rows to domain %d, its layout says %d: %w", e.hier.global(n), got, hx.domain, cnt, ErrPeerMismatch)
				break
			}
			if cnt == 0 {
				continue
			}
			dst, _ := hx.fwdX.View(n*hx.maxT*rb, cnt*rb)
			if rerr = g.fromRail(ctx, dst, n, railHeader+e.hier.area, slot); rerr != nil {
				break
			}
			if w != nil {
				dw, _ := hx.fwdW.View(n*hx.maxT*g.K*4, cnt*g.K*4)
				if rerr = g.fromRail(ctx, dw, n, railHeader, slot); rerr != nil {
					break
				}
			}
		}
	}
	if err := g.railRead(); rerr == nil {
		rerr = err
	}
	if rerr != nil {
		// The domain's peers must fail this call too.
		g.reject()
		return rerr
	}
	if err := g.begin(); err != nil {
		return err
	}
	if err := g.pushEntries(x.Buffer(), buf(w), nil, rb, 0, h.gpu.entTok, h.gpu.entDest, h.gpu.entRow, h.numTokens*g.W); err != nil {
		return g.abandon(op, err)
	}
	var fw *device.Buffer
	if w != nil {
		fw = hx.fwdW
	}
	t := h.gpu.hier
	if err := g.pushEntries(hx.fwdX, fw, nil, rb, 0, t.fEntTok, t.fEntDest, t.fEntRow, hx.M*hx.maxT*g.W); err != nil {
		return g.abandon(op, err)
	}
	return g.arrive(flagOp(op, x.DType(), w != nil))
}

// fromRail fills dst from byte off of slot, the last rail round's receive
// slot of the peer in domain n: on the GPU-fed rail a copy on the stream
// from the receive region mapped for the GPU (railRead marks the round's
// copies), else an upload through pinned staging.
func (g *gpuEngine) fromRail(ctx context.Context, dst *device.Buffer, n, off int, slot []byte) error {
	hx, hr := g.hier, g.e.hier
	if hx.recv == nil {
		return g.s.UploadBuffer(ctx, dst, slot[off:off+dst.Size()])
	}
	return g.s.Copy(dst, 0, hx.recv.Buffer(), hr.recvSlotOff(n)+off, dst.Size())
}

// railRead records, after a round's copies from the receive region (the
// GPU-fed rail), the event a host-posted round waits for
// (hierarchy.hostPost); the stream's own later rail posts are ordered
// after the copies anyway. If the record fails, a host post synchronizes
// the stream instead.
func (g *gpuEngine) railRead() error {
	hx := g.hier
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
func (g *gpuEngine) railSend(pl railPayload, c nvlink.Call, ep uint64, parity int) (func(context.Context) error, error) {
	e, hx, hr := g.e, g.hier, g.e.hier
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
			int64(pl.entries), hx.slotRows, int64(rb), int64(-hr.area), int32(g.K), unit, chunk,
			(*device.Buffer)(nil), int64(0), int64(0)); err != nil {
			return nil, e.noteFailure(err)
		}
	}
	var status, missing *device.Buffer
	if pl.status {
		status = g.ownView(regionFlags, g.statusOff(), 8)
		missing = g.ownView(regionFlags, g.missingOff(), 4*g.R)
	}
	if err := g.s.Launch(hx.post, [3]uint32{1, 1, 1}, [3]uint32{1, 1, 1}, 0, hx.ring.Buffer(), pos, uint64(hx.feed.Size()-1),
		hx.send.Buffer(), pl.devCounts, int32(hx.M), int32(hx.domain), int64(hr.slot), int64(railHeader), int64(hr.area),
		int64(rb), int64(wb), int64(parity), ep, c.Op, c.Sig[0], c.Sig[1], c.Sig[2], status, missing, int32(g.R)); err != nil {
		return nil, e.noteFailure(err)
	}
	hx.feed.Expect(descs)
	return func(ctx context.Context) error {
		err := hx.feed.Drain(ctx)
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			err = fmt.Errorf("%w: %w", ErrTimeout, err)
		}
		// A descriptor that did not reach the transport leaves its peer
		// without this round's signal (or with a stale header): fatal.
		err = fmt.Errorf("executor: rail of rank %d: %w", e.rank, err)
		e.failed.CompareAndSwap(nil, &err)
		return err
	}, nil
}

// hierSum is the rest of a combine with several domains, once every
// rank's rows of dtype dt (and weights, when weighted) are in the domain's
// combine windows: the partial sums, the rail round and the merge.
func (g *gpuEngine) hierSum(h *Handle, dt device.DType, weighted bool, out DispatchBackwardOutput, op uint32) error {
	e, hx := g.e, g.hier
	ht := h.gpu.hier
	rb := g.H * dt.Size()
	di := 0
	if dt == device.FP32 {
		di = 1
	}
	T, K, W, maxT, M := h.numTokens, g.K, g.W, hx.maxT, hx.M
	// Temporaries, freed in stream order after the merge.
	own, err := e.NewTensor(device.FP32, max(T, 1), g.H)
	if err != nil {
		return g.sumFailed(h, dt, weighted, op, err, false)
	}
	defer own.Close()
	ownW, err := e.NewTensor(device.FP32, max(T, 1), K)
	if err != nil {
		return g.sumFailed(h, dt, weighted, op, err, false)
	}
	defer ownW.Close()
	part, err := e.NewTensor(dt, M*maxT, g.H)
	if err != nil {
		return g.sumFailed(h, dt, weighted, op, err, false)
	}
	defer part.Close()
	partW, err := e.NewTensor(device.FP32, M*maxT, K)
	if err != nil {
		return g.sumFailed(h, dt, weighted, op, err, false)
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
	if err := sum(ownK, own, gw, 0, T, h.gpu.entRow, h.gpu.slotEnt, g.H*4); err != nil {
		return g.sumFailed(h, dt, weighted, op, err, false)
	}
	if err := sum(g.sum[di], part, pgw, maxT*W, M*maxT, ht.fEntRow, ht.fSlotEnt, rb); err != nil {
		return g.sumFailed(h, dt, weighted, op, err, false)
	}
	if err := g.finish(op); err != nil {
		return g.sumFailed(h, dt, weighted, op, err, true)
	}
	// The partials cross the rail.
	ctx, cancel := g.railCtx()
	defer cancel()
	c := nvlink.Call{Op: uint64(op), Sig: sig(h, dt, weighted)}
	var recv func(n int) []byte
	var rerr error
	if hx.feed != nil && g.pending == nil {
		// GPU-fed: the slots' headers carry this call's GPU wait outcome
		// to the rail peers; this rank learns it from the synchronize.
		var pw *device.Buffer
		if weighted {
			pw = partW.Buffer()
		}
		recv, rerr = e.railExchange(c.Op, c.Sig, nil, nil, func(ctx context.Context, ep uint64, parity int) (func(context.Context) error, error) {
			return g.railSend(railPayload{src: part.Buffer(), w: pw, rowBytes: rb, tok: ht.partSrc, dest: ht.partDest, row: ht.partRow,
				entries: ht.partSends, counts: ht.fwdCount, devCounts: ht.partCount, status: true}, c, ep, parity)
		})
		// This rank's own outcome first (as the host-staged path reports
		// it), with its own deadline: the round's may be spent.
		sctx, scancel := g.railCtx()
		serr := g.synchronize(sctx)
		scancel()
		if serr != nil {
			return errors.Join(serr, rerr)
		}
	} else {
		status := g.synchronize(ctx)
		var ps, pws []byte
		if status == nil {
			ps, status = g.s.DownloadBuffer(ctx, part.Buffer())
		}
		if status == nil && weighted {
			pws, status = g.s.DownloadBuffer(ctx, partW.Buffer())
		}
		var fill func(n int, area, rows []byte) (int, int, int)
		if status == nil {
			fill = partialsFill(ht.fwdCount, ps, pws, maxT, K, rb)
		}
		recv, rerr = e.railRound(c.Op, c.Sig, status, fill)
	}
	if rerr != nil {
		return rerr
	}
	// Every rank's own tokens: its partials from the other domains.
	rem, err := e.NewTensor(dt, M*maxT, g.H)
	if err != nil {
		return errors.Join(err, g.railRead())
	}
	defer rem.Close()
	remW, err := e.NewTensor(device.FP32, M*maxT, K)
	if err != nil {
		return errors.Join(err, g.railRead())
	}
	defer remW.Close()
	for n := range M {
		cnt := ht.ownCount[n]
		if n == hx.domain || cnt == 0 {
			continue
		}
		slot := recv(n)
		if got := getRailHead(slot).count; got != cnt {
			// The copies already queued are marked for a host post.
			return errors.Join(fmt.Errorf("executor: rail: rank %d returned %d partials to domain %d, its layout says %d: %w",
				e.hier.global(n), got, hx.domain, cnt, ErrPeerMismatch), g.railRead())
		}
		dst, _ := rem.Buffer().View(n*maxT*rb, cnt*rb)
		if err := g.fromRail(ctx, dst, n, railHeader+e.hier.area, slot); err != nil {
			return errors.Join(e.noteFailure(err), g.railRead())
		}
		if weighted {
			dw, _ := remW.Buffer().View(n*maxT*K*4, cnt*K*4)
			if err := g.fromRail(ctx, dw, n, railHeader, slot); err != nil {
				return errors.Join(e.noteFailure(err), g.railRead())
			}
		}
	}
	if err := g.railRead(); err != nil {
		return e.noteFailure(err)
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
	return g.s.Launch(hx.merge[di], grid, block, 0, out.GradX, ogw, own, ht.ownLive, ownW, rem, remW,
		ht.remIdx, ht.slotDom, int64(T), int32(M), int32(hx.domain), int64(maxT), int64(g.H), int32(K), g.dnan)
}

// sumFailed ends a combine-like call that failed on this rank after its
// domain exchange and before its rail round (a temporary not allocated, a
// launch refused): it signals done unless finished says that was done
// (the domain's next call must not wait for this rank), and sends the
// failure in the call's rail round, so that the rail peers fail the call
// at once instead of at their timeout. It returns err with any error of
// the signal.
func (g *gpuEngine) sumFailed(h *Handle, dt device.DType, weighted bool, op uint32, err error, finished bool) error {
	if !finished {
		err = errors.Join(err, g.finish(op))
	}
	_, _ = g.e.railRound(uint64(op), sig(h, dt, weighted), err, nil)
	return err
}

// hierReject is reject with several domains: the domain's GPU signals and
// the rail round, in the call's order.
func (g *gpuEngine) hierReject(op uint64, cause error) {
	if dispatchLike(op) {
		_, _ = g.e.railRound(op, [4]uint64{}, cause, nil)
		g.reject()
		return
	}
	g.reject()
	_, _ = g.e.railRound(op, [4]uint64{}, cause, nil)
}
