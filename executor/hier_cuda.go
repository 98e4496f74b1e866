//go:build cuda && cgo

package executor

import (
	"context"
	"fmt"

	"github.com/goep/goep/device"
	"github.com/goep/goep/nvlink"
)

// The hierarchical algorithm on the CUDA backend (D < R). Within the domain
// the GPU data path is the one-domain one over the domain's windows, with
// "virtual tokens": this rank's own tokens, then the tokens its rail peers
// forward to this domain (domain n's f-th at n*MaxTokensPerRank + f).
// Across domains the rail (rdma, host memory) carries the rows, staged
// through pinned host memory (CUDA uploads and downloads; the transports
// here have no GPU memory support), so a call with several domains waits
// on the host for its GPU work once (dispatch: for x before the rail;
// combine: for the partials before the rail) and cannot be captured into a
// CUDA graph.
//
//   - Dispatch: x and the weights are downloaded, the rail round sends each
//     other domain the rows of the tokens that reach it (as on the host
//     backend), the rows received are uploaded into fwdX / fwdW, and the
//     domain's push runs twice: this rank's tokens from x, the forwarded
//     ones from fwdX, each to its destinations in this domain. Receive
//     windows, copy-out and permute are unchanged.
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
	return x, nil
}

func (x *gpuHier) close(g *gpuEngine) {
	if x == nil {
		return
	}
	g.s.Free(x.fwdX)
	g.s.Free(x.fwdW)
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
	fwdCount                   []int          // rows forwarded here from each domain
	ownCount                   []int          // this rank's tokens that reach each domain
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
	parts := [][]int32{p.fTok, p.fDest, p.fRow, p.fSlot, p.ownLive, p.remIdx, p.slotDom}
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
		ownLive: views[4], remIdx: views[5], slotDom: views[6], fwdCount: p.fwdCount, ownCount: p.ownCount}, nil
}

// railCtx bounds a rail round's host work.
func (g *gpuEngine) railCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), g.e.cfg.Timeout)
}

// hierPush is pushRows with several domains: the rail round of x's rows
// (host), the forwarded rows uploaded, then the domain's pushes of own and
// forwarded rows and the arrive.
func (g *gpuEngine) hierPush(h *Handle, x, w *device.Tensor, op uint32) error {
	e, hx, lay := g.e, g.hier, h.lay
	ctx, cancel := g.railCtx()
	defer cancel()
	rb := g.H * x.DType().Size()
	var xs, ws []byte
	var err error
	if xs, err = g.s.DownloadBuffer(ctx, x.Buffer()); err == nil && w != nil {
		ws, err = g.s.DownloadBuffer(ctx, w.Buffer())
	}
	err = e.noteFailure(err)
	c := nvlink.Call{Op: uint64(op), Sig: sig(h, x.DType(), w != nil)}
	fill := e.dispatchFill(lay, xs, f32s(ws), w != nil, rb)
	if err != nil {
		fill = nil
	}
	recv, rerr := e.railRound(c.Op, c.Sig, err, fill)
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
			o := railHeader + e.hier.area
			if rerr = g.s.UploadBuffer(ctx, dst, slot[o:o+cnt*rb]); rerr != nil {
				break
			}
			if w != nil {
				dw, _ := hx.fwdW.View(n*hx.maxT*g.K*4, cnt*g.K*4)
				if rerr = g.s.UploadBuffer(ctx, dw, slot[railHeader:railHeader+cnt*g.K*4]); rerr != nil {
					break
				}
			}
		}
	}
	if rerr != nil {
		// The domain's peers must fail this call too.
		g.reject()
		return rerr
	}
	if err := g.begin(); err != nil {
		return err
	}
	if err := g.pushEntries(x.Buffer(), buf(w), rb, h.gpu.entTok, h.gpu.entDest, h.gpu.entRow, h.numTokens*g.W); err != nil {
		return err
	}
	var fw *device.Buffer
	if w != nil {
		fw = hx.fwdW
	}
	t := h.gpu.hier
	if err := g.pushEntries(hx.fwdX, fw, rb, t.fEntTok, t.fEntDest, t.fEntRow, hx.M*hx.maxT*g.W); err != nil {
		return err
	}
	return g.arrive(op)
}

// hierCombine is combine with several domains.
func (g *gpuEngine) hierCombine(h *Handle, z, zw *device.Tensor, out DispatchBackwardOutput, op uint32) error {
	e, hx := g.e, g.hier
	ht := h.gpu.hier
	dt := z.DType()
	rb := g.H * dt.Size()
	di := 0
	if dt == device.FP32 {
		di = 1
	}
	T, K, W, maxT, M := h.numTokens, g.K, g.W, hx.maxT, hx.M
	if err := g.scatterRows(h, z, zw, op); err != nil {
		return err
	}
	// Temporaries, freed in stream order after the merge.
	own, err := e.NewTensor(device.FP32, max(T, 1), g.H)
	if err != nil {
		return err
	}
	defer own.Close()
	ownW, err := e.NewTensor(device.FP32, max(T, 1), K)
	if err != nil {
		return err
	}
	defer ownW.Close()
	part, err := e.NewTensor(dt, M*maxT, g.H)
	if err != nil {
		return err
	}
	defer part.Close()
	partW, err := e.NewTensor(device.FP32, M*maxT, K)
	if err != nil {
		return err
	}
	defer partW.Close()
	var gw, pgw *device.Tensor
	if zw != nil {
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
		return err
	}
	if err := sum(g.sum[di], part, pgw, maxT*W, M*maxT, ht.fEntRow, ht.fSlotEnt, rb); err != nil {
		return err
	}
	if err := g.finish(op); err != nil {
		return err
	}
	// The partials cross the rail.
	ctx, cancel := g.railCtx()
	defer cancel()
	status := g.synchronize(ctx)
	var ps, pws []byte
	if status == nil {
		ps, status = g.s.DownloadBuffer(ctx, part.Buffer())
	}
	if status == nil && zw != nil {
		pws, status = g.s.DownloadBuffer(ctx, partW.Buffer())
	}
	c := nvlink.Call{Op: uint64(op), Sig: sig(h, dt, zw != nil)}
	recv, rerr := e.railRound(c.Op, c.Sig, status, func(n int, area, rows []byte) (int, int, int) {
		cnt := ht.fwdCount[n]
		copy(rows[:cnt*rb], ps[n*maxT*rb:])
		ab := 0
		if zw != nil {
			ab = copy(area[:cnt*K*4], pws[n*maxT*K*4:])
		}
		return cnt, ab, cnt * rb
	})
	if rerr != nil {
		return rerr
	}
	// Every rank's own tokens: its partials from the other domains.
	rem, err := e.NewTensor(dt, M*maxT, g.H)
	if err != nil {
		return err
	}
	defer rem.Close()
	remW, err := e.NewTensor(device.FP32, M*maxT, K)
	if err != nil {
		return err
	}
	defer remW.Close()
	for n := range M {
		cnt := ht.ownCount[n]
		if n == hx.domain || cnt == 0 {
			continue
		}
		slot := recv(n)
		if got := getRailHead(slot).count; got != cnt {
			return fmt.Errorf("executor: rail: rank %d returned %d partials to domain %d, its layout says %d: %w", e.hier.global(n), got, hx.domain, cnt, ErrPeerMismatch)
		}
		dst, _ := rem.Buffer().View(n*maxT*rb, cnt*rb)
		o := railHeader + e.hier.area
		if err := g.s.UploadBuffer(ctx, dst, slot[o:o+cnt*rb]); err != nil {
			return e.noteFailure(err)
		}
		if zw != nil {
			dw, _ := remW.Buffer().View(n*maxT*K*4, cnt*K*4)
			if err := g.s.UploadBuffer(ctx, dw, slot[railHeader:railHeader+cnt*K*4]); err != nil {
				return e.noteFailure(err)
			}
		}
	}
	if T == 0 {
		return nil
	}
	grid, block, err := rowShape(T, g.H, K)
	if err != nil {
		return err
	}
	var ogw *device.Tensor
	if zw != nil {
		ogw = out.GradTopkWeights
	}
	return g.s.Launch(hx.merge[di], grid, block, 0, out.GradX, ogw, own, ht.ownLive, ownW, rem, remW,
		ht.remIdx, ht.slotDom, int64(T), int32(M), int32(hx.domain), int64(maxT), int64(g.H), int32(K), g.dnan)
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
