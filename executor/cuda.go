//go:build cuda && cgo

package executor

import (
	"context"
	_ "embed"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/goep/goep/device"
	"github.com/goep/goep/nvlink"
	"github.com/goep/goep/permute"
	"go.uber.org/zap"
)

// The CUDA data path. The layout is computed on the host exactly as on the
// host backend (the routing is downloaded, exchanged through the domain's
// control blocks and fed to ComputeLayout), then the handle's tables are
// uploaded to device memory once. Every data call after that is GPU work
// only, in stream order:
//
//  1. wait until every peer has signalled done for the previous call
//     (its receive buffers are free again);
//  2. push: a kernel stores this rank's rows straight into the peers'
//     receive windows (CUDA IPC mappings, nvlink.MapGPU);
//  3. signal arrived to every peer (after a system-wide fence);
//  4. wait until every peer has signalled arrived for this call;
//  5. consume the own window (copy out, permute, or the combine sum);
//  6. signal done to every peer.
//
// Flags are epochs (one per collective call, equal on all ranks since the
// calls are), never reset; waits are clock-bounded (Config.Timeout) and set
// a status word instead of spinning for ever. Synchronize reads it.

//go:embed kernels/ep.ptx
var epPTX []byte

// opRejected is the operation a rank signals for a call whose input it
// rejected (kernels/ep.cu's opRejected).
const opRejected = 0x7f

// Regions of the GPU windows.
const (
	regionFlags = iota // arrived[R], done[R], status, epoch counter (uint64), missing[R] (int32)
	regionRecv         // dispatch: rows [recvCap, H] at the call's row bytes, then weights [recvCap, K] fp32
	regionComb         // combine: rows [MaxTokensPerRank*W, H], then weights [MaxTokensPerRank*W, K] fp32
	regionRoute        // layout: routing [R*MaxTokensPerRank*K] int32, then token counts [R] int32 (layout_cuda.go)
	numRegions
)

type gpuEngine struct {
	e   *Engine
	b   *device.CUDA
	s   *device.CUDAStream
	mod *device.Module
	pk  *permute.CUDAKernels
	win *nvlink.GPUWindows

	// goep_ep_<name>, but signalWait, which is goep_ep_arrive (launched
	// by the method arrive).
	wait, signal, signalWait, push, scatter, copyOut *device.Kernel
	sum, permuteScaled, weightGrad                   [2]*device.Kernel // BF16, FP32

	// peers is uint64 [numRegions][R]: every rank's window base address
	// as mapped here.
	peers *device.Buffer

	// R is the ranks of the NVLink domain (all ranks, or D with several
	// domains; flags and windows are the domain's), me this rank's index
	// in it and base the global rank of index 0.
	R, me, base        int
	K, H, W            int
	recvCap, combRows  int
	recvWOff, combWOff int // byte offsets of the weights areas
	dnan               uint32
	timeoutNs          int64
	ownStream          bool // s was created here (not WithStream)
	// pending is an error found on the host for work that was skipped
	// (capacity exceeded under OverflowError); Synchronize returns it.
	pending error
	// hier is the GPU side of the hierarchical algorithm (nil with one
	// domain; hier_cuda.go).
	hier *gpuHier
	// lk are the layout kernels (one domain only; layout_cuda.go), and
	// hostLayout makes layout run on the host all the same (tests).
	lk         *gpuLayout
	hostLayout bool
	// marks is the scratch of permute.CUDAKernels.ZeroUnwritten in
	// capacity mode (a byte a permuted row), allocated with the engine so
	// that the capacity-mode calls allocate nothing (graph capture).
	marks *device.Buffer
}

// gpuTables are a handle's layout tables in device memory (one Int32
// tensor, views into it). Entries e = t*W + c are the destinations of
// local token t in ascending order (c < its destination count).
type gpuTables struct {
	all *device.Tensor
	// entDest, entRow: destination rank and row there of entry e (row -1:
	// no such entry, or dropped at the destination).
	entTok, entDest, entRow *device.Buffer // [T*W]
	// slotEnt: the entry of slot k of token t (t*K+k), -1 if none.
	slotEnt *device.Buffer // [T*K]
	// recvSrc, recvEnt: for received row i < rowCap, its source rank and
	// its entry on the source (-1 past the valid rows).
	recvSrc, recvEnt *device.Buffer // [rowCap]
	recvIdx, pos     *device.Buffer // [rowCap*K], -1 past the valid rows
	n                int            // valid received rows
	hier             *gpuHierTables // several domains only
}

func (t *gpuTables) close() {
	if t != nil && t.all != nil {
		t.all.Close()
		t.hier.close()
	}
}

func flagsSize(R int) int { return (2*R+2)*8 + 4*R }

// Byte offsets in the flags region.
func (g *gpuEngine) statusOff() int  { return 2 * g.R * 8 }
func (g *gpuEngine) counterOff() int { return (2*g.R + 1) * 8 }
func (g *gpuEngine) missingOff() int { return (2*g.R + 2) * 8 }

// newGPUEngine loads the kernels and maps the domain's GPU windows
// (collective).
func newGPUEngine(ctx context.Context, e *Engine, b *device.CUDA, caller device.Stream) (*gpuEngine, error) {
	cfg := e.cfg
	R, me, group := e.size, e.rank, e.group
	if e.hier != nil {
		R, me, group = e.hier.D, e.hier.local, e.hier.domG
	}
	g := &gpuEngine{e: e, b: b, R: R, me: me, base: e.rank - me, K: cfg.TopK, H: cfg.Hidden, W: min(cfg.TopK, R),
		dnan: permute.DefaultNaN(), timeoutNs: cfg.Timeout.Nanoseconds()}
	if R > 1024 {
		return nil, fmt.Errorf("executor: CUDA path: %d ranks in one domain, at most 1024: %w", R, ErrUnsupported)
	}
	s, _ := caller.(*device.CUDAStream)
	if caller != nil && (s == nil || s.CUDA() != b) {
		return nil, fmt.Errorf("executor: CUDA path: WithStream: a %T, not a stream of this CUDA backend: %w", caller, ErrInvalidInput)
	}
	if s == nil {
		var err error
		if s, err = b.NewCUDAStream(); err != nil {
			return nil, fmt.Errorf("executor: CUDA path: %w", err)
		}
		g.ownStream = true
	}
	g.s = s
	var err error
	g.recvCap = e.size * cfg.MaxTokensPerRank
	if cfg.Mode == Capacity {
		g.recvCap = cfg.MaxRecvTokens
	}
	g.combRows = cfg.MaxTokensPerRank * g.W
	if e.hier != nil {
		// Entries of the forwarded tokens follow this rank's own.
		g.combRows += e.hier.M * cfg.MaxTokensPerRank * g.W
	}
	rowMax := g.H * 4 // fp32, the widest dtype
	g.recvWOff, g.combWOff = g.recvCap*rowMax, g.combRows*rowMax
	// The layout runs on the GPU in one domain, when its buffers stay
	// within int32 offsets at the largest sizes (else on the host, as
	// with several domains; the same choice on every rank).
	gpuLayout := e.hier == nil && layoutDims(cfg, R, me, cfg.MaxTokensPerRank, g.recvCap).Check() == nil
	routeSize := 8
	if gpuLayout {
		routeSize = 4 * R * (cfg.MaxTokensPerRank*g.K + 1)
	}
	sizes := []int{flagsSize(R), g.recvWOff + g.recvCap*g.K*4, g.combWOff + g.combRows*g.K*4, routeSize}
	g.win, err = nvlink.MapGPU(ctx, group, s, sizes)
	if err != nil {
		if g.ownStream {
			err = errors.Join(err, s.Close())
		}
		return nil, fmt.Errorf("executor: CUDA path: %w", err)
	}
	if ce := e.log.Check(zap.DebugLevel, "GPU windows"); ce != nil {
		// Every region's address on every rank of the domain, as this rank
		// maps it (to read sanitizer reports against).
		addrs := make([][]string, numRegions)
		for i := range numRegions {
			for p := range R {
				addrs[i] = append(addrs[i], fmt.Sprintf("%#x", g.win.Peers[i][p].DevicePtr()))
			}
		}
		ce.Write(zap.Int("rank", e.rank), zap.Int("local", me), zap.Ints("bytes", sizes),
			zap.Any("flags", addrs[regionFlags]), zap.Any("recv", addrs[regionRecv]), zap.Any("comb", addrs[regionComb]),
			zap.Any("route", addrs[regionRoute]))
	}
	lerr := g.load(ctx)
	if lerr == nil {
		// Pinned staging for every transfer (the layout's tables, with
		// several domains the rail's rows, the caller's uploads and
		// downloads), allocated now: a pinned allocation later could stall
		// a peer's wait kernel (device.CUDA.WarmStaging).
		lerr = b.WarmStaging()
	}
	if lerr == nil && cfg.Mode == Capacity {
		g.marks, lerr = g.s.Alloc(cfg.MaxPermutedTokens)
	}
	if lerr == nil && e.hier != nil {
		g.hier, lerr = newGPUHier(ctx, g)
	}
	if lerr == nil && gpuLayout {
		g.lk, lerr = newGPULayout(g)
	}
	// Every rank learns whether every rank is ready, so none is left
	// waiting in its first call.
	st := []byte{0}
	if lerr != nil {
		st = append([]byte{1}, lerr.Error()...)
	}
	all, err := group.AllGather(ctx, st)
	if err == nil {
		for p, r := range all {
			if len(r) > 0 && r[0] == 1 {
				err = fmt.Errorf("rank %d: %s", p, r[1:])
				break
			}
		}
	}
	if err != nil {
		return nil, errors.Join(fmt.Errorf("executor: CUDA path: %w", err), g.close())
	}
	return g, nil
}

// load loads the kernels and uploads the peers' window addresses.
func (g *gpuEngine) load(ctx context.Context) error {
	var err error
	if g.mod, err = g.b.LoadModule(epPTX); err != nil {
		return err
	}
	for _, k := range []struct {
		dst  **device.Kernel
		name string
	}{
		{&g.wait, "goep_ep_wait"}, {&g.signal, "goep_ep_signal"}, {&g.signalWait, "goep_ep_arrive"}, {&g.push, "goep_ep_push"},
		{&g.scatter, "goep_ep_scatter"}, {&g.copyOut, "goep_ep_copy_out"},
		{&g.sum[0], "goep_ep_sum_bf16"}, {&g.sum[1], "goep_ep_sum_fp32"},
		{&g.permuteScaled[0], "goep_ep_permute_scaled_bf16"}, {&g.permuteScaled[1], "goep_ep_permute_scaled_fp32"},
		{&g.weightGrad[0], "goep_ep_weight_grad_bf16"}, {&g.weightGrad[1], "goep_ep_weight_grad_fp32"},
	} {
		if *k.dst, err = g.mod.Kernel(k.name); err != nil {
			return err
		}
	}
	if g.pk, err = permute.LoadCUDAKernels(g.b); err != nil {
		return err
	}
	addrs := make([]byte, 0, numRegions*g.R*8)
	for i := range numRegions {
		for p := range g.R {
			addrs = appendU64(addrs, g.win.Peers[i][p].DevicePtr())
		}
	}
	if g.peers, err = g.s.Alloc(len(addrs)); err != nil {
		return err
	}
	return g.s.UploadBuffer(ctx, g.peers, addrs)
}

func appendU64(b []byte, v uint64) []byte {
	for i := range 8 {
		b = append(b, byte(v>>(8*i)))
	}
	return b
}

// peerTable is the device array of region r's base addresses.
func (g *gpuEngine) peerTable(r int) *device.Buffer {
	v, _ := g.peers.View(r*g.R*8, g.R*8)
	return v
}

func (g *gpuEngine) ownView(r, off, n int) *device.Buffer {
	v, err := g.win.Own[r].View(off, n)
	if err != nil {
		panic(fmt.Sprintf("executor: window view [%d, +%d) of region %d: %v", off, n, r, err)) // sizes are checked by the callers
	}
	return v
}

// Flag words: arrived[p] at word p, done[p] at word R+p.
func (g *gpuEngine) arrivedSlot() int64 { return 0 }
func (g *gpuEngine) doneSlot() int64    { return int64(g.R) }

// begin starts a collective call: the wait for every peer's done of the
// previous call, which also advances the epoch counter.
func (g *gpuEngine) begin() error {
	return g.waitFlags(g.doneSlot(), true, 1, 0)
}

// waitFlags enqueues the wait for flags[slot+p] >= epoch - lag (with op
// checked when op != 0) for every peer p; bump advances the epoch first.
func (g *gpuEngine) waitFlags(slot int64, bump bool, lag int64, op uint32) error {
	flags := g.ownView(regionFlags, int(slot)*8, g.R*8)
	status := g.ownView(regionFlags, g.statusOff(), 8)
	counter := g.ownView(regionFlags, g.counterOff(), 8)
	missing := g.ownView(regionFlags, g.missingOff(), 4*g.R)
	return g.s.Launch(g.wait, [3]uint32{1, 1, 1}, [3]uint32{uint32(roundUp(g.R, 32)), 1, 1}, 0,
		flags, int32(g.R), counter, b32(bump), lag, op, g.timeoutNs, status, missing)
}

func b32(v bool) int32 {
	if v {
		return 1
	}
	return 0
}

// signalPeers enqueues the store of epoch<<8|op into word slot+me of every
// peer's flags.
func (g *gpuEngine) signalPeers(slot int64, op uint32) error {
	return g.s.Launch(g.signal, [3]uint32{1, 1, 1}, [3]uint32{uint32(roundUp(g.R, 32)), 1, 1}, 0,
		g.peerTable(regionFlags), int32(g.R), slot+int64(g.me), g.ownView(regionFlags, g.counterOff(), 8), op)
}

// arrive signals this rank's pushes and waits for every peer's, which must
// carry the same op (for data calls, flagOp's): signalPeers and
// waitFlags(arrivedSlot, no bump, lag 0, op) in one launch
// (goep_ep_arrive).
func (g *gpuEngine) arrive(op uint32) error {
	slot := g.arrivedSlot()
	return g.s.Launch(g.signalWait, [3]uint32{1, 1, 1}, [3]uint32{uint32(roundUp(g.R, 32)), 1, 1}, 0,
		g.peerTable(regionFlags), int32(g.R), slot+int64(g.me), g.ownView(regionFlags, int(slot)*8, g.R*8),
		g.ownView(regionFlags, g.counterOff(), 8), op, g.timeoutNs,
		g.ownView(regionFlags, g.statusOff(), 8), g.ownView(regionFlags, g.missingOff(), 4*g.R))
}

// finish signals that this rank's windows may be written again.
func (g *gpuEngine) finish(op uint32) error {
	return g.signalPeers(g.doneSlot(), op)
}

// reject joins a collective call whose input this rank rejected: its peers
// see opRejected and fail the call at once.
func (g *gpuEngine) reject() {
	err := errors.Join(g.begin(), g.signalPeers(g.arrivedSlot(), opRejected), g.finish(opRejected))
	if err != nil && g.pending == nil {
		g.pending = err
	}
}

// abandon ends call op, which failed on this rank between its begin and
// its arrive (a launch refused, say): the domain's peers see opRejected and
// fail the call at once instead of at their timeout (they report this rank
// as having rejected its input; the cause is in this rank's error), and
// the epochs stay in step. With several domains a combine-like call's rail
// round, which follows the domain exchange, carries the failure to the
// rail peers (a dispatch-like call's came before). It returns err with any
// error of the signals.
func (g *gpuEngine) abandon(op uint32, err error) error {
	err = errors.Join(err, g.signalPeers(g.arrivedSlot(), opRejected), g.finish(opRejected))
	if g.hier != nil && !dispatchLike(uint64(op)) {
		_, _ = g.e.railRound(uint64(op), [4]uint64{}, err, nil)
	}
	return err
}

func roundUp(n, m int) int { return (n + m - 1) / m * m }

// rowShape is the launch shape of a row kernel: grid.x = items, blocks of
// up to 256 threads (at least minThreads) over the units of a row,
// grid.y chunks of them.
func rowShape(items, units, minThreads int) (grid, block [3]uint32, err error) {
	if items > math.MaxInt32 {
		return grid, block, fmt.Errorf("executor: %d rows in one launch", items)
	}
	bx := min(256, roundUp(max(units, 1), 32))
	bx = max(bx, roundUp(minThreads, 32))
	if bx > 1024 {
		return grid, block, fmt.Errorf("executor: %d threads per block", bx)
	}
	gy := min((units+bx-1)/bx, 65535)
	return [3]uint32{uint32(items), uint32(max(gy, 1)), 1}, [3]uint32{uint32(bx), 1, 1}, nil
}

// commShape is the launch shape of the push and scatter kernels under the
// tuning knobs: rowShape's, with grid.x the chunks of Config.ChunkRows
// items (default 1). With Config.SMs = n > 0 the grid is at most n blocks
// in all (grid.x <= n, grid.y 1: each block copies whole rows), so the
// copies occupy at most n SMs; the blocks loop over the chunks.
func (g *gpuEngine) commShape(items, units int) (grid, block [3]uint32, chunk int64, err error) {
	c := max(g.e.cfg.ChunkRows, 1)
	blocks := (items + c - 1) / c
	sms := g.e.cfg.SMs
	if sms > 0 {
		blocks = min(blocks, sms)
	}
	grid, block, err = rowShape(blocks, units, g.K)
	if sms > 0 {
		grid[1] = 1
	}
	return grid, block, int64(c), err
}

// unitOf is the largest copy unit (16, 4 or 2 bytes) that divides the row
// bytes and every buffer's address.
func unitOf(rowBytes int, bufs ...*device.Buffer) int32 {
	for _, u := range []int{16, 4, 2} {
		if rowBytes%u != 0 {
			continue
		}
		ok := true
		for _, b := range bufs {
			if b != nil && b.DevicePtr()%uint64(u) != 0 {
				ok = false
			}
		}
		if ok {
			return int32(u)
		}
	}
	return 1
}

// layout runs the layout of idx into h: on the GPU in one domain
// (layout_cuda.go), else on the host, uploading the handle's tables. A
// Relayout keeps the handle's tables (same sizes, same addresses).
func (g *gpuEngine) layout(ctx context.Context, h *Handle, idx *device.Tensor, sig [4]uint64) error {
	if g.layoutOnGPU() {
		return g.deviceLayout(ctx, h, idx)
	}
	e, cfg := g.e, g.e.cfg
	// A failure before the exchange joins it as a rejection: the peers
	// must not wait for this rank.
	raw, err := g.s.DownloadBuffer(ctx, idx.Buffer())
	if err != nil {
		return e.reject(opLayout, e.noteFailure(err))
	}
	hidx, err := device.NewTensor(e.stream, device.Int32, idx.Shape()...)
	if err != nil {
		return e.reject(opLayout, err)
	}
	defer hidx.Close()
	copy(hidx.Bytes(), raw)
	var routing [][]int32
	var lay *Layout
	e.collective(opLayout, func() error {
		if e.hier != nil {
			return e.hierRouting(hidx, sig, func(all [][]int32) error {
				routing = make([][]int32, len(all))
				for r := range all {
					routing[r] = append([]int32(nil), all[r]...)
				}
				var err error
				lay, err = ComputeLayout(e.rank, cfg, routing)
				return err
			})
		}
		return e.exchange(nvlink.Call{Op: opLayout, Sig: sig, Buffers: []*device.Buffer{hidx.Buffer()}}, func(peers [][]*device.Buffer) error {
			routing = make([][]int32, len(peers))
			for p := range peers {
				routing[p] = append([]int32(nil), permute.Int32s(peers[p][0].Host())...)
			}
			var err error
			lay, err = ComputeLayout(e.rank, cfg, routing)
			return err
		})
	})
	if err := e.stream.Synchronize(ctx); err != nil {
		if ctx.Err() != nil {
			// The layout's exchange may still run on the stream: a later
			// call's rail round on the caller's goroutine would interleave
			// with it, so the engine takes no more calls.
			err = fmt.Errorf("executor: layout: the caller's context ended with the exchange in flight: %w: %w", ErrTimeout, err)
		}
		return e.noteFailure(err)
	}
	if err := g.useLayout(ctx, h, lay, nil); err != nil {
		return err
	}
	h.gpu, err = g.tables(ctx, h, lay, routing, h.gpu)
	return err
}

// useLayout makes lay (its counts, at least) the handle's layout: its
// output sizes, its device counts and, under OverflowError, the capacity
// error Synchronize will report. The device counts are uploaded, or, when
// sum is not nil (the GPU layout's summary, gpulayout.Dims.Summary), copied
// from it on the stream: no host wait.
func (g *gpuEngine) useLayout(ctx context.Context, h *Handle, lay *Layout, sum *device.Buffer) error {
	e, cfg := g.e, g.e.cfg
	overflow := cfg.Mode == Capacity && (lay.RecvCount > cfg.MaxRecvTokens || lay.PermutedCount > cfg.MaxPermutedTokens)
	if sum != nil {
		if err := g.countsFromSummary(h.counts.Buffer(), sum, overflow); err != nil {
			return e.noteFailure(err)
		}
	} else {
		counts := make([]int32, countsHeader+e.local)
		counts[countRecv], counts[countPermuted] = int32(lay.RecvCount), int32(lay.PermutedCount)
		copy(counts[countsHeader:], lay.TokensPerExpert)
		if overflow {
			counts[countOverflow] = 1
		}
		if err := g.s.UploadBuffer(ctx, h.counts.Buffer(), device.EncodeInt32(counts)); err != nil {
			return e.noteFailure(err)
		}
	}
	h.lay = lay
	if cfg.Mode == Capacity {
		h.recvRows, h.permRows = cfg.MaxRecvTokens, cfg.MaxPermutedTokens
	} else {
		h.recvRows, h.permRows = lay.RecvCount, lay.PermutedCount
	}
	if cfg.Mode == Capacity && cfg.Overflow == OverflowError {
		if err := capacityCheck(lay, cfg); err != nil && g.pending == nil {
			g.pending = err
		}
	}
	return nil
}

// tables builds and uploads a handle's device tables.
func (g *gpuEngine) tables(ctx context.Context, h *Handle, lay *Layout, routing [][]int32, old *gpuTables) (*gpuTables, error) {
	e := g.e
	T, K, W := lay.NumTokens, g.K, g.W
	rowCap := h.recvRows
	var host []int32
	var ht *gpuHierTables
	if g.hier == nil {
		host = buildTables(lay, e.cfg, routing, W, rowCap)
	} else {
		var parts [][]int32
		host, parts = newTables(T, K, W, rowCap)
		var err error
		if ht, err = g.hierTables(ctx, lay, routing, parts[0], parts[1], parts[2], parts[3], parts[4], parts[5]); err != nil {
			return old, err
		}
		copyRecvMaps(lay, e.validRecv(lay, e.rank), parts[6], parts[7])
	}
	return g.uploadTables(ctx, host, tableSizes(T, K, W, rowCap), e.validRecv(lay, e.rank), ht, old)
}

// uploadTables uploads a handle's tables host (parts of the given sizes,
// n valid received rows) and its hierarchical tables ht: into old's memory
// for a Relayout (same sizes, same addresses), else into new device
// memory.
func (g *gpuEngine) uploadTables(ctx context.Context, host []int32, sizes []int, n int, ht *gpuHierTables, old *gpuTables) (*gpuTables, error) {
	t, err := g.tablesFor(old, sizes)
	if err != nil {
		ht.close()
		return old, err
	}
	if err := g.s.UploadBuffer(ctx, t.all.Buffer(), device.EncodeInt32(host)); err != nil {
		ht.close()
		if old == nil {
			t.close()
		}
		return old, g.e.noteFailure(err)
	}
	t.n = n
	if old != nil {
		old.hier.close()
	}
	t.hier = ht
	return t, nil
}

// tablesFor returns the tables to write a layout of the given parts'
// sizes into: old's for a Relayout (old not nil; same sizes), else new
// ones.
func (g *gpuEngine) tablesFor(old *gpuTables, sizes []int) (*gpuTables, error) {
	if old == nil {
		return g.newTables(sizes)
	}
	total := 0
	for _, s := range sizes {
		total += s
	}
	if old.all.Len() != max(total, 1) {
		return nil, fmt.Errorf("executor: relayout: tables of %d entries, the handle has %d", total, old.all.Len())
	}
	return old, nil
}

// newTables allocates tables of the given parts' sizes (tableSizes): one
// Int32 tensor and a view per part.
func (g *gpuEngine) newTables(sizes []int) (*gpuTables, error) {
	total := 0
	for _, s := range sizes {
		total += s
	}
	all, err := device.NewTensor(g.s, device.Int32, max(total, 1))
	if err != nil {
		return nil, err
	}
	views := make([]*device.Buffer, len(sizes))
	o := 0
	for i, s := range sizes {
		if views[i], err = all.Buffer().View(4*o, 4*s); err != nil {
			all.Close()
			return nil, err
		}
		o += s
	}
	return &gpuTables{all: all, entTok: views[0], entDest: views[1], entRow: views[2], slotEnt: views[3],
		recvSrc: views[4], recvEnt: views[5], recvIdx: views[6], pos: views[7]}, nil
}

// ready checks a handle on the host before its GPU work is enqueued: under
// OverflowError an over-capacity layout skips the work on every rank (all
// ranks see all counts) and Synchronize reports the CapacityError. While
// the stream captures, the work is recorded all the same: the graph's
// replays follow later Relayouts, which may fit, and the kernels drop the
// rows past capacity as under OverflowDrop (the tables are built so under
// both policies), so nothing is written out of bounds.
func (g *gpuEngine) ready(h *Handle) bool {
	if h.lay == nil || h.gpu == nil {
		if g.pending == nil {
			g.pending = fmt.Errorf("executor: handle %d has no layout (its layout failed)", h.id)
		}
		return false
	}
	if g.e.cfg.Mode == Capacity && g.e.cfg.Overflow == OverflowError {
		if err := capacityCheck(h.lay, g.e.cfg); err != nil {
			if g.pending == nil {
				g.pending = err
			}
			return g.s.Capturing()
		}
	}
	return true
}

// rowsArg is the valid-row count by value (blocking mode) and the counts
// tensor for capacity mode (nil in blocking mode), for goep_ep_copy_out.
func (g *gpuEngine) rowsArg(h *Handle) (int64, *device.Tensor) {
	if g.e.cfg.Mode == Capacity {
		return 0, h.counts
	}
	return int64(h.gpu.n), nil
}

// deviceMap is the permute kernels' map of a handle: in capacity mode the
// kernels run over the whole capacity (positions past the valid rows are
// -1), so no count reaches them from the host.
func (g *gpuEngine) deviceMap(h *Handle) permute.DeviceMap {
	rows := h.gpu.n
	if g.e.cfg.Mode == Capacity {
		rows = h.recvRows
	}
	return permute.DeviceMap{Rows: rows, TopK: g.K, Pos: h.gpu.pos, RowCap: h.recvRows, PermCap: h.permRows}
}

// enqueue runs f, which only enqueues work on the engine's stream, in one
// hold of the GPU's driver (device.CUDAStream.Enqueue): a call's launches,
// copies and memsets then take the device once instead of once each,
// and the ranks of a process sharing the GPU take turns once per call.
// With several domains f runs as it is: those calls wait for the rail.
func (g *gpuEngine) enqueue(f func() error) error {
	if g.hier != nil {
		return f()
	}
	return g.s.Enqueue(f)
}

// pushRows enqueues steps 1-4 of one round of dispatch: rows of x (and
// weights w, and fp8 scales sx; either may be nil) into the destinations'
// receive windows. With several domains sx must be nil: an fp8 call's
// scales take a round of their own there (roundScales).
func (g *gpuEngine) pushRows(h *Handle, x, w, sx *device.Tensor, round uint64, op uint32) error {
	if g.hier != nil {
		if sx != nil {
			return fmt.Errorf("executor: CUDA path: scales pushed with their rows across domains")
		}
		return g.hierPush(h, x, w, round, op)
	}
	if err := g.begin(); err != nil {
		return err
	}
	sb := 0
	if sx != nil {
		sb = rowBytes(sx)
	}
	if err := g.pushEntries(x.Buffer(), buf(w), buf(sx), rowBytes(x), sb, h.gpu.entTok, h.gpu.entDest, h.gpu.entRow, h.numTokens*g.W); err != nil {
		return g.abandon(op, err)
	}
	return g.arrive(flagOp(op, x.DType(), w != nil))
}

// flagOp is the operation a data call's arrive flags carry: the call's op
// with the dtype of its rows (bits 3-5) and whether weights travel (bit
// 6), so that ranks running the same call on rows of different dtypes, or
// with and without weights, fail it with ErrPeerMismatch instead of
// reading each other's rows wrongly (the host path compares the same in
// its exchange's signature). Never opRejected: ops fit in bits 0-2.
func flagOp(op uint32, dt device.DType, weighted bool) uint32 {
	v := op | uint32(dt)<<3
	if weighted {
		v |= 1 << 6
	}
	return v
}

// pushEntries launches goep_ep_push over entries of x (rows of rb bytes),
// w (nil: none) and sx (fp8 scales, rows of sb bytes; nil: none): the
// entry tables tok, dest and row as goep_ep_push reads them.
func (g *gpuEngine) pushEntries(x, w, sx *device.Buffer, rb, sb int, tok, dest, row *device.Buffer, entries int) error {
	if entries == 0 {
		return nil
	}
	unit := unitOf(rb, x, g.win.Own[regionRecv])
	grid, block, chunk, err := g.commShape(entries, rb/int(unit))
	if err != nil {
		return err
	}
	return g.s.Launch(g.push, grid, block, 0, x, w, tok, dest, row,
		int64(entries), g.peerTable(regionRecv), int64(rb), int64(g.recvWOff), int32(g.K), unit, chunk,
		sx, int64(g.scaleOff()), int64(sb))
}

// scaleOff is where the receive window keeps an fp8 call's scales: after
// the rows area's first recvCap*H bytes, which its fp8 rows fill (an fp8
// row and its scales, H + H/32 bytes, fit in the 4H bytes a row has).
func (g *gpuEngine) scaleOff() int { return g.recvCap * g.H }

// copyRecv enqueues goep_ep_copy_out from the receive window's rows at
// byte off into out (rows of rb bytes; nil: none) and outW (weights; nil:
// none), and the handle's RecvIdx table into outIdx (nil: none), rows
// [0, h.recvRows) of each, in one launch.
func (g *gpuEngine) copyRecv(h *Handle, off, rb int, out, outW, outIdx *device.Tensor) error {
	if h.recvRows == 0 || out == nil && outW == nil && outIdx == nil {
		return nil
	}
	src := g.ownView(regionRecv, off, h.recvRows*rb)
	srcW := g.ownView(regionRecv, g.recvWOff, h.recvRows*g.K*4)
	var ob *device.Buffer
	if out != nil {
		ob = out.Buffer()
	}
	unit := unitOf(rb, ob, src)
	units := rb / int(unit)
	if out == nil {
		units = 1
	}
	grid, block, err := rowShape(h.recvRows, units, g.K)
	if err != nil {
		return err
	}
	rows, counts := g.rowsArg(h)
	return g.s.Launch(g.copyOut, grid, block, 0, out, outW, outIdx, src, srcW, h.gpu.recvIdx, counts,
		rows, int64(h.recvRows), int64(rb), int32(g.K), unit)
}

// dispatch enqueues Dispatch: the rows of x with their weights w (may be
// nil) and, for fp8 rows, their scales sx: in one domain with the rows,
// with several in a second round.
func (g *gpuEngine) dispatch(h *Handle, x, w, sx *device.Tensor, out DispatchOutput) error {
	if !g.ready(h) {
		return nil
	}
	if sx == nil || g.hier == nil {
		return g.dispatchRound(h, x, w, sx, roundRows, out.RecvX, out.RecvWeights, out.RecvScales, out.RecvIdx)
	}
	if err := g.dispatchRound(h, x, w, nil, roundRows, out.RecvX, out.RecvWeights, nil, out.RecvIdx); err != nil {
		return err
	}
	return g.dispatchRound(h, sx, nil, nil, roundScales, out.RecvScales, nil, nil, nil)
}

// dispatchRound enqueues one round of Dispatch: x's rows (weights w,
// scales sx) into recv (recvW, recvS), and the handle's RecvIdx into
// recvIdx (nil: not copied).
func (g *gpuEngine) dispatchRound(h *Handle, x, w, sx *device.Tensor, round uint64, recv, recvW, recvS, recvIdx *device.Tensor) error {
	if err := g.pushRows(h, x, w, sx, round, uint32(opDispatch)); err != nil {
		return err
	}
	// Past the arrive, done is signalled whatever fails here: the peers'
	// next call waits for it.
	err := g.copyRecv(h, 0, rowBytes(x), recv, recvW, recvIdx)
	if err == nil && sx != nil {
		err = g.copyRecv(h, g.scaleOff(), rowBytes(sx), recvS, nil, nil)
	}
	return errors.Join(err, g.finish(uint32(opDispatch)))
}

// hold keeps the stream busy for d (tests).
func (g *gpuEngine) hold(d time.Duration) error { return g.s.Delay(d) }

// dispatchPermute enqueues DispatchPermute: the permute kernel reads the
// received rows straight from the receive window. For fp8 rows their
// scales sx move and are permuted too: in one domain with the rows, with
// several in a second round.
func (g *gpuEngine) dispatchPermute(h *Handle, x, w, sx *device.Tensor, out DispatchPermuteOutput) error {
	if !g.ready(h) {
		return nil
	}
	if sx == nil || g.hier == nil {
		return g.dispatchPermuteRound(h, x, w, sx, roundRows, out.X, out.Weights, out.Scales, out.RecvWeights, out.RecvIdx)
	}
	if err := g.dispatchPermuteRound(h, x, w, nil, roundRows, out.X, out.Weights, nil, out.RecvWeights, out.RecvIdx); err != nil {
		return err
	}
	return g.dispatchPermuteRound(h, sx, nil, nil, roundScales, out.Scales, nil, nil, nil, nil)
}

// dispatchPermuteRound enqueues one round of DispatchPermute: x's rows
// (weights w, scales sx) permuted into px (pw, ps), the received weights
// into recvW and the handle's RecvIdx into recvIdx (nil: not copied).
func (g *gpuEngine) dispatchPermuteRound(h *Handle, x, w, sx *device.Tensor, round uint64, px, pw, ps, recvW, recvIdx *device.Tensor) error {
	if err := g.pushRows(h, x, w, sx, round, uint32(opDispatchPermute)); err != nil {
		return err
	}
	// Past the arrive, done is signalled whatever fails (dispatchRound).
	return errors.Join(g.permuteArrived(h, x, w, sx, px, pw, ps, recvW, recvIdx), g.finish(uint32(opDispatchPermute)))
}

// permuteArrived is the rest of a DispatchPermute round once this rank's
// rows have arrived: the received weights and RecvIdx, and the permute of
// the receive window into px (pw, ps).
func (g *gpuEngine) permuteArrived(h *Handle, x, w, sx, px, pw, ps, recvW, recvIdx *device.Tensor) error {
	rb := rowBytes(x)
	if err := g.copyRecv(h, 0, rb, nil, recvW, recvIdx); err != nil {
		return err
	}
	src := g.ownView(regionRecv, 0, max(h.recvRows*rb, 0))
	var srcW *device.Buffer
	if w != nil {
		srcW = g.ownView(regionRecv, g.recvWOff, h.recvRows*g.K*4)
	}
	if err := g.permuteFrom(h, px, pw, src, srcW); err != nil {
		return err
	}
	if sx != nil {
		sb := rowBytes(sx)
		if err := g.permuteFrom(h, ps, nil, g.ownView(regionRecv, g.scaleOff(), max(h.recvRows*sb, 0)), nil); err != nil {
			return err
		}
	}
	return nil
}

// kernelRows is how the permute kernels see rows of cols elements of dt:
// fp8 rows, only ever copied, go as bf16 rows of half the width (an fp8
// row's width is a multiple of 128).
func kernelRows(dt device.DType, cols int) (device.DType, int) {
	if dt == device.FP8E4M3 {
		return device.BF16, cols / 2
	}
	return dt, cols
}

// permuteFrom enqueues the permute of rows src (weights srcW) into px, pw,
// padding and dropped rows zero.
func (g *gpuEngine) permuteFrom(h *Handle, px, pw *device.Tensor, src, srcW *device.Buffer) error {
	rb := rowBytes(px)
	kdt, kcols := kernelRows(px.DType(), px.Shape()[1])
	var pwb *device.Buffer
	if pw != nil {
		pwb = pw.Buffer()
	}
	if g.e.cfg.Mode == Capacity {
		// Positions change with each layout: the rows the permute leaves
		// (padding, dropped rows, the capacity past the valid rows) are
		// found from the device positions and zeroed, so that the work
		// needs no count from the host (graph capture).
		if err := g.pk.ZeroUnwritten(g.s, px.Buffer(), rb, pwb, g.deviceMap(h), g.marks); err != nil {
			return err
		}
	}
	if err := g.pk.Permute(g.s, kdt, kcols, px.Buffer(), pwb, src, srcW, g.deviceMap(h)); err != nil {
		return err
	}
	if g.e.cfg.Mode == Capacity {
		return nil
	}
	return g.pk.ZeroPadding(g.s, px.Buffer(), rb, pwb, h.lay.ExpertOffsets, h.lay.TokensPerExpert, h.permRows)
}

// permute enqueues Permute (local) of rows x (weights w), and of their
// scales sx for fp8 rows.
func (g *gpuEngine) permute(h *Handle, x, w, sx *device.Tensor, out PermuteOutput) error {
	if !g.ready(h) {
		return nil
	}
	var wb *device.Buffer
	if w != nil {
		wb = w.Buffer()
	}
	if err := g.permuteFrom(h, out.X, out.Weights, x.Buffer(), wb); err != nil {
		return err
	}
	if sx == nil {
		return nil
	}
	return g.permuteFrom(h, out.Scales, nil, sx.Buffer(), nil)
}

// unpermute enqueues Unpermute (local) into out ([recvRows, H]).
func (g *gpuEngine) unpermute(h *Handle, y, w, out *device.Tensor) error {
	if !g.ready(h) {
		return nil
	}
	var wb *device.Buffer
	if w != nil {
		wb = w.Buffer()
	}
	return g.pk.Unpermute(g.s, y.DType(), g.H, out.Buffer(), y.Buffer(), wb, g.deviceMap(h))
}

// unpermuteBackward enqueues UnpermuteBackward (local): GradY is the
// scaled permute of gradOut (zero on padding and dropped rows) and, for a
// weighted forward, GradWeights the per-slot inner products.
func (g *gpuEngine) unpermuteBackward(h *Handle, gradOut, y, w *device.Tensor, out UnpermuteBackwardOutput) error {
	if !g.ready(h) {
		return nil
	}
	dt := gradOut.DType()
	di := 0
	if dt == device.FP32 {
		di = 1
	}
	rb := g.H * dt.Size()
	m := g.deviceMap(h)
	if g.e.cfg.Mode == Capacity {
		// The rows goep_ep_permute_scaled leaves, as in permuteFrom.
		if err := g.pk.ZeroUnwritten(g.s, out.GradY.Buffer(), rb, nil, m, g.marks); err != nil {
			return err
		}
	}
	if m.Rows > 0 {
		grid, block, err := rowShape(m.Rows, g.H, 1)
		if err != nil {
			return err
		}
		if err := g.s.Launch(g.permuteScaled[di], grid, block, 0, out.GradY, gradOut, w, h.gpu.pos,
			int64(m.Rows), int32(g.K), int64(h.permRows), int64(g.H), g.dnan); err != nil {
			return err
		}
	}
	if g.e.cfg.Mode != Capacity {
		if err := g.pk.ZeroPadding(g.s, out.GradY.Buffer(), rb, nil, h.lay.ExpertOffsets, h.lay.TokensPerExpert, h.permRows); err != nil {
			return err
		}
	}
	if w == nil || h.recvRows == 0 {
		return nil
	}
	slots := h.recvRows * g.K
	return g.s.Launch(g.weightGrad[di], [3]uint32{uint32((slots + 127) / 128), 1, 1}, [3]uint32{128, 1, 1}, 0,
		out.GradWeights, gradOut, y, h.gpu.pos, int64(h.recvRows), int32(g.K), int64(h.permRows), int64(g.H))
}

// scatterRows enqueues the first steps of a combine: the wait for the
// peers' done, every received row of z (and its weights zw) into the
// combine window of the rank that sums it (recvSrc, at entry recvEnt), and
// the arrive.
func (g *gpuEngine) scatterRows(h *Handle, z, zw *device.Tensor, op uint32) error {
	if err := g.begin(); err != nil {
		return err
	}
	rb := g.H * z.DType().Size()
	if h.recvRows > 0 {
		unit := unitOf(rb, z.Buffer(), g.win.Own[regionComb])
		grid, block, chunk, err := g.commShape(h.recvRows, rb/int(unit))
		if err != nil {
			return g.abandon(op, err)
		}
		if err := g.s.Launch(g.scatter, grid, block, 0, z, zw, h.gpu.recvSrc, h.gpu.recvEnt, int64(h.recvRows),
			g.peerTable(regionComb), int64(rb), int64(g.combWOff), int32(g.K), unit, chunk); err != nil {
			return g.abandon(op, err)
		}
	}
	return g.arrive(flagOp(op, z.DType(), zw != nil))
}

// combine enqueues Combine (and DispatchBackward with zw): every received
// row goes back into its source's combine window at its entry, then each
// source sums its tokens' entries in destination order.
func (g *gpuEngine) combine(h *Handle, z, zw *device.Tensor, out DispatchBackwardOutput, op uint32) error {
	if !g.ready(h) {
		return nil
	}
	if err := g.scatterRows(h, z, zw, op); err != nil {
		return err
	}
	return g.sumWindows(h, z.DType(), zw != nil, out, op)
}

// sumWindows enqueues the rest of a combine once every rank's rows (and
// weights, when weighted) are in the combine windows: sumCombined in one
// domain, hierSum across domains.
func (g *gpuEngine) sumWindows(h *Handle, dt device.DType, weighted bool, out DispatchBackwardOutput, op uint32) error {
	if g.hier != nil {
		return g.hierSum(h, dt, weighted, out, op)
	}
	return g.sumCombined(h, dt, out, weighted, op)
}

// sumCombined enqueues the last steps of a combine, once every rank's rows
// are in the combine windows: each token's entries summed in destination
// order into out.GradX (and, when weighted, the weights into
// out.GradTopkWeights), and the done signal, which is sent whatever fails
// before it (past the arrive, the peers' next call waits for it).
func (g *gpuEngine) sumCombined(h *Handle, dt device.DType, out DispatchBackwardOutput, weighted bool, op uint32) error {
	return errors.Join(g.sumOwn(h, dt, out, weighted), g.finish(op))
}

// sumOwn is sumCombined's sum.
func (g *gpuEngine) sumOwn(h *Handle, dt device.DType, out DispatchBackwardOutput, weighted bool) error {
	T := h.numTokens
	if T == 0 {
		return nil
	}
	rb := g.H * dt.Size()
	src := g.ownView(regionComb, 0, T*g.W*rb)
	srcW := g.ownView(regionComb, g.combWOff, T*g.W*g.K*4)
	vec := rb%16 == 0 && out.GradX.Buffer().DevicePtr()%16 == 0
	units, v := g.H, int32(0)
	if vec {
		units, v = rb/16, 1
	}
	grid, block, err := rowShape(T, units, g.K)
	if err != nil {
		return err
	}
	di := 0
	if dt == device.FP32 {
		di = 1
	}
	var gw *device.Tensor
	if weighted {
		gw = out.GradTopkWeights
	}
	return g.s.Launch(g.sum[di], grid, block, 0, out.GradX, gw, src, srcW, h.gpu.entRow, h.gpu.slotEnt,
		int64(T), int32(g.W), int64(g.H), int32(g.K), v, g.dnan)
}

// unpermuteCombine enqueues UnpermuteCombine, fused: the unpermute stores
// each received row straight into the combine window of the rank of its
// domain that sums it, at its entry (permute.CUDAKernels.
// UnpermuteScatter), which are the bytes that Unpermute into a temporary
// and then combine's scatter (scatterRows) would store there. The sums
// that follow, in the domain and across domains, are therefore the
// unfused calls' bit for bit, and the rows are not written to and read
// back from a temporary.
func (g *gpuEngine) unpermuteCombine(h *Handle, y, w, out *device.Tensor) error {
	if !g.ready(h) {
		return nil
	}
	op := uint32(opUnpermuteCombine)
	if err := g.begin(); err != nil {
		return err
	}
	to := permute.Targets{
		Bases: g.peerTable(regionComb), Rank: h.gpu.recvSrc, Row: h.gpu.recvEnt,
		// Every rank's windows have the same layout (unitOf's assumption
		// in scatterRows too).
		Aligned: g.win.Own[regionComb].DevicePtr()%16 == 0,
	}
	if err := g.pk.UnpermuteScatter(g.s, y.DType(), g.H, to, y.Buffer(), buf(w), g.deviceMap(h)); err != nil {
		return g.abandon(op, err)
	}
	if err := g.arrive(flagOp(op, y.DType(), false)); err != nil {
		return err
	}
	return g.sumWindows(h, y.DType(), false, DispatchBackwardOutput{GradX: out}, op)
}

// synchronize waits for the GPU work and reports what the waits found.
func (g *gpuEngine) synchronize(ctx context.Context) error {
	if err := g.s.Synchronize(ctx); err != nil {
		return err
	}
	if err := g.waitStatus(ctx); err != nil {
		return err
	}
	err := g.pending
	g.pending = nil
	return err
}

// waitStatus reports what the waits found (the caller has synchronized):
// nil, or the first failure (statusFrom).
func (g *gpuEngine) waitStatus(ctx context.Context) error {
	raw, err := g.s.DownloadBuffer(ctx, g.ownView(regionFlags, g.statusOff(), g.statusBytes()))
	if err != nil {
		return err
	}
	return g.statusFrom(raw)
}

// statusFrom decodes the status words as read back (status, epoch counter,
// missing[R]: statusBytes of them): nil, or the first failure. A failure
// other than a timeout leaves the ranks in step (every call advanced
// every epoch), so the status is cleared, on the stream, for the next call.
func (g *gpuEngine) statusFrom(raw []byte) error {
	if binary.LittleEndian.Uint64(raw) == 0 {
		return nil
	}
	err := g.statusError(raw[g.missingOff()-g.statusOff():])
	if !errors.Is(err, ErrTimeout) {
		flags := g.win.Own[regionFlags]
		err = errors.Join(err, g.s.Memset(flags, g.statusOff(), 8, 0), g.s.Memset(flags, g.missingOff(), 4*g.R, 0))
	}
	return err
}

// statusError decodes missing[R] (raw, int32 codes) after a failed wait.
func (g *gpuEngine) statusError(raw []byte) error {
	codes := make([]byte, g.R)
	for p := range codes {
		codes[p] = raw[4*p]
	}
	return waitError(codes, g.base)
}

// statusBytes is the size of the flags region's status words: status,
// epoch counter, missing[R].
func (g *gpuEngine) statusBytes() int { return g.missingOff() + 4*g.R - g.statusOff() }

// close frees the windows and kernels; the caller has synchronized and
// passed a barrier (no peer uses the windows any more).
func (g *gpuEngine) close() error {
	var errs []error
	if g.s != nil {
		errs = append(errs, g.s.Synchronize(context.Background()))
	}
	if g.peers != nil {
		g.s.Free(g.peers)
	}
	if g.marks != nil {
		g.s.Free(g.marks)
	}
	errs = append(errs, g.hier.close(g))
	errs = append(errs, g.lk.close(g))
	if g.pk != nil {
		errs = append(errs, g.pk.Close())
	}
	if g.mod != nil {
		errs = append(errs, g.mod.Close())
	}
	if g.s != nil && g.ownStream {
		errs = append(errs, g.s.Close())
	}
	errs = append(errs, g.win.Close())
	return errors.Join(errs...)
}
