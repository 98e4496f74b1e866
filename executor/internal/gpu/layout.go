//go:build cuda && cgo

package gpu

import (
	"context"
	_ "embed"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/goep/goep/device"
	"github.com/goep/goep/executor/internal/datapath"
	"github.com/goep/goep/executor/internal/plan"
	"github.com/goep/goep/internal/gpulayout"
)

// The layout on the GPU, in one NVLink domain (DESIGN.md section 2): the
// routing never leaves the device. A layout is a collective call
// on the domain's flags like a dispatch:
//
//  0. an earlier failure's status, not yet reported, moves aside (for the
//     next Synchronize), so that it cannot end this layout's waits;
//  1. wait for every peer's done of the previous call;
//  2. goep_layout_put stores this rank's routing and token count into
//     every peer's route window, then arrived is signalled and awaited
//     (op OpLayout; a peer that rejected its input fails the call);
//  3. the count and scan kernels (internal/gpulayout/layout.h) validate
//     every rank's routing and compute the world counts and this rank's summary, which
//     the host downloads (the host waits here: blocking mode sizes its
//     outputs with the summary, and both modes apply the capacity policy;
//     the counts tensor's upload after the tables waits once more);
//  4. the column kernels write the handle's tables in device memory (in
//     place for a Relayout), then done is signalled.
//
// A Relayout captured into a CUDA graph (capacity mode; captureLayout)
// runs the same kernels with no host in between: after the scan,
// goep_layout_finish writes the handle's counts and, when the layout
// fails (a routing error, or a rank over capacity under OverflowError),
// a report, and raises the domain flags' alarm, so that the next
// Synchronize reads the report back and turns it into the error the
// layout would have returned; after a routing error the tables stay
// empty, so the graph's calls move no row.
//
// The tables and counts are exactly those of plan.ComputeLayout (the host
// layout, which runs instead with several domains, or when a domain's
// buffers would pass int32 offsets: gpulayout.Dims.Check): package plan's
// TestLayoutKernels checks the kernels' code against it on the host,
// TestCUDALayoutKernels on the GPU.

//go:embed kernels/layout.ptx
var layoutPTX []byte

// gpuLayout are the layout kernels and their workspace.
type gpuLayout struct {
	mod                                                   *device.Module
	put, count, scan, finish, colcount, colscan, colwrite *device.Kernel
	ws, errKey                                            *device.Buffer
	// report is where captured layouts report a failure (layout.h,
	// layout_finish: int32 1 + the summary's words, zeroed); captured is
	// set once a layout was captured, and Synchronize reads it from then
	// on.
	report   *device.Buffer
	captured bool
	// back is what a layout reads back, in one download: the summary,
	// then the flags region's status, epoch counter and missing words as
	// the layout found them (prior), then as its waits left them.
	back *device.Buffer
	// phases are the host times of the last layout from its start to: the
	// exchange and count kernels enqueued, the summary read, the tables
	// enqueued, the counts written (for the timing test).
	phases [4]time.Duration
}

func newGPULayout(p *Path) (*gpuLayout, error) {
	lk := &gpuLayout{}
	var err error
	if lk.mod, err = p.b.LoadModule(layoutPTX); err != nil {
		return nil, err
	}
	for _, k := range []struct {
		dst  **device.Kernel
		name string
	}{
		{&lk.put, "goep_layout_put"}, {&lk.count, "goep_layout_count"}, {&lk.scan, "goep_layout_scan"}, {&lk.finish, "goep_layout_finish"},
		{&lk.colcount, "goep_layout_colcount"}, {&lk.colscan, "goep_layout_colscan"}, {&lk.colwrite, "goep_layout_colwrite"},
	} {
		if *k.dst, err = lk.mod.Kernel(k.name); err != nil {
			return nil, errors.Join(err, lk.close(p))
		}
	}
	d := plan.LayoutDims(p.env.P, p.R, p.me, 0, 0)
	if lk.ws, err = p.s.Alloc(4 * d.WorkspaceInts()); err != nil {
		return nil, errors.Join(err, lk.close(p))
	}
	if lk.errKey, err = p.s.Alloc(8); err != nil {
		return nil, errors.Join(err, lk.close(p))
	}
	_, n := d.Summary()
	if lk.back, err = p.s.Alloc(4*n + 2*p.flags.StatusBytes()); err != nil {
		return nil, errors.Join(err, lk.close(p))
	}
	if lk.report, err = p.s.Alloc(4 * (1 + n)); err == nil {
		err = p.s.Memset(lk.report, 0, lk.report.Size(), 0)
	}
	if err != nil {
		return nil, errors.Join(err, lk.close(p))
	}
	return lk, nil
}

func (lk *gpuLayout) close(p *Path) error {
	if lk == nil {
		return nil
	}
	p.s.Free(lk.ws)
	p.s.Free(lk.errKey)
	p.s.Free(lk.back)
	p.s.Free(lk.report)
	if lk.mod != nil {
		return lk.mod.Close()
	}
	return nil
}

// threadShape is a launch of n threads (at least one block) in blocks of 256.
func threadShape(n int) (grid, block [3]uint32, err error) {
	blocks := (max(n, 1) + 255) / 256
	if blocks > 1<<31-1 {
		return grid, block, fmt.Errorf("executor: GPU layout: %d threads in one launch", n)
	}
	return [3]uint32{uint32(blocks), 1, 1}, [3]uint32{256, 1, 1}, nil
}

// launchN launches k over n threads with the pointers ptrs, then the dims.
func (p *Path) launchN(k *device.Kernel, n int, d gpulayout.Dims, ptrs ...any) error {
	grid, block, err := threadShape(n)
	if err != nil {
		return err
	}
	return p.s.Launch(k, grid, block, 0, append(ptrs, d.Args()...)...)
}

// deviceLayout runs the layout of idx into h on the GPU (see above).
func (p *Path) deviceLayout(ctx context.Context, lk *gpuLayout, h *datapath.Handle, idx *device.Tensor) error {
	P := p.env.P
	start := time.Now()
	lk.phases = [4]time.Duration{}
	d := plan.LayoutDims(P, p.R, p.me, idx.Rows(), 0)
	// A failure of earlier work that no Synchronize has reported yet (a
	// peer's rejected dispatch, say) would end this layout's waits at once
	// on this rank only: its status moves aside first (a device copy, then
	// the status is cleared), and Synchronize reports it later, as it
	// would have without this layout.
	// (A timeout moves aside too: this layout's waits then run for real
	// and fail on their own if the ranks are out of step.)
	sumOff, sumN := d.Summary()
	priorOff := 4 * sumN
	if err := errors.Join(p.flags.CopyStatus(lk.back, priorOff), p.flags.ClearStatus()); err != nil {
		p.rejectFlags(err)
		return err
	}
	// 1-3: the routing exchange, counts and summary.
	abandoned, err := p.exchangeAndCount(lk, idx, d)
	if abandoned {
		return err
	}
	if err == nil {
		// What the host reads back: the summary and the waits' status.
		err = errors.Join(p.s.Copy(lk.back, 0, lk.ws, 4*sumOff, 4*sumN),
			p.flags.CopyStatus(lk.back, priorOff+p.flags.StatusBytes()))
	}
	lk.phases[0] = time.Since(start)
	var lay *plan.Layout
	var sum *device.Buffer
	if err == nil {
		sum, lay, err = p.layoutSummary(ctx, lk, d)
	}
	lk.phases[1] = time.Since(start)
	// 4: the tables, then the handle takes the layout. After a failure
	// before the tables' kernels a Relayout keeps its old tables and
	// counts; once they are enqueued the tables are the new layout's.
	fresh := tbl(h) == nil
	if err == nil {
		err = p.deviceTables(lk, h, lay, d)
	}
	lk.phases[2] = time.Since(start)
	if err == nil {
		err = p.useLayout(ctx, h, lay, sum)
	}
	lk.phases[3] = time.Since(start)
	// Done, whatever happened: the peers' next call waits for it.
	if ferr := p.flags.Finish(uint32(datapath.OpLayout)); err == nil {
		err = ferr
	}
	if err != nil && fresh && tbl(h) != nil {
		tbl(h).Close()
		h.Tables = nil
	}
	return err
}

// exchangeAndCount enqueues steps 1-3 of a GPU layout of idx (dims d):
// Begin, goep_layout_put of the routing into every peer's route window,
// Arrive (op layout), then the count and scan kernels, which leave the
// summary in lk.ws. Once Begin is enqueued every step of the protocol
// is, whatever fails, so that the peers' epochs stay in step with this
// rank's; abandoned says that the call ended here (joined as rejected,
// or a failed put abandoned it: the caller must not Finish it).
func (p *Path) exchangeAndCount(lk *gpuLayout, idx *device.Tensor, d gpulayout.Dims) (abandoned bool, err error) {
	P := p.env.P
	grid, block, err := threadShape(p.R * max(idx.Rows()*p.K, 1))
	if err != nil {
		p.rejectFlags(err)
		return true, err
	}
	if err := p.flags.Begin(); err != nil {
		return true, err
	}
	if err := p.s.Launch(lk.put, grid, block, 0, idx, p.peerTable(regionRoute),
		int64(p.R), int64(p.me), int64(P.MaxTokensPerRank), int64(p.K), int64(idx.Rows())); err != nil {
		// This rank's routing is not in the peers' windows: they must
		// not count what an earlier layout left there, so they see the
		// call rejected (abandon signals done too).
		return true, p.abandon(datapath.OpLayout, err)
	}
	if err := p.flags.Arrive(uint32(datapath.OpLayout)); err != nil {
		return false, err
	}
	route, nt := p.routeWindow()
	scanThreads := min(1024, roundUp(p.R*d.L, 32))
	return false, errors.Join(p.s.Memset(lk.ws, 0, lk.ws.Size(), 0), p.s.Memset(lk.errKey, 0, 8, 0xff),
		p.launchN(lk.count, p.R*P.MaxTokensPerRank, d, route, nt, lk.ws, lk.errKey),
		p.s.Launch(lk.scan, [3]uint32{1, 1, 1}, [3]uint32{uint32(scanThreads), 1, 1}, 0,
			append([]any{route, lk.ws, lk.errKey}, d.Args()...)...))
}

// routeWindow is this rank's route window and, in it, the ranks' token
// counts (after the routing of R*MaxTokensPerRank*K int32s).
func (p *Path) routeWindow() (route, counts *device.Buffer) {
	route = p.win.Own[regionRoute]
	return route, p.ownView(regionRoute, 4*p.R*p.env.P.MaxTokensPerRank*p.K, 4*p.R)
}

// layoutSummary waits for the layout's summary and reads it back, with
// the status words as the layout found them and as its waits left them,
// in one download: the exchange's failure (a peer's timeout or rejection),
// the routing error, or the counts. It returns the summary's device view
// too (valid until the next layout).
func (p *Path) layoutSummary(ctx context.Context, lk *gpuLayout, d gpulayout.Dims) (*device.Buffer, *plan.Layout, error) {
	off, n := d.Summary()
	view, err := lk.ws.View(4*off, 4*n)
	if err != nil {
		return nil, nil, err
	}
	raw, err := p.s.DownloadBuffer(ctx, lk.back)
	if err != nil {
		return nil, nil, p.env.Fate.Note(err)
	}
	sb := p.flags.StatusBytes()
	prior, now := raw[4*n:4*n+sb], raw[4*n+sb:]
	// The earlier failure moved aside, for the next Synchronize, whatever
	// this layout found.
	if err := p.flags.StatusError(prior); err != nil {
		p.pending = errors.Join(p.pending, datapath.PeerInput(err))
	}
	if err := p.flags.Settle(now); err != nil {
		return nil, nil, p.env.Fate.Note(datapath.PeerInput(err))
	}
	sum := make([]int32, n)
	for i := range sum {
		sum[i] = int32(binary.LittleEndian.Uint32(raw[4*i:]))
	}
	lay, err := plan.SummaryLayout(sum, d)
	return view, lay, err
}

// countsFromSummary enqueues the writes of a handle's device counts
// (CountRecv, CountPermuted, CountOverflow, then TokensPerExpert) from the
// GPU layout's summary sum (gpulayout's words: this rank's RecvCount and
// PermutedCount at SumRecv and SumPermuted, adjacent and in that order,
// then from SumHeader the ranks' RecvCounts and PermutedCounts, then this
// rank's TokensPerExpert); overflow is the host's capacity check.
func (p *Path) countsFromSummary(counts, sum *device.Buffer, overflow bool) error {
	R, L := p.R, p.env.NumLocalExperts()
	err := errors.Join(p.s.Copy(counts, 4*plan.CountRecv, sum, 4*gpulayout.SumRecv, 8),
		p.s.Memset(counts, 4*plan.CountOverflow, 4*(plan.CountsHeader-plan.CountOverflow), 0),
		p.s.Copy(counts, 4*plan.CountsHeader, sum, 4*(gpulayout.SumHeader+2*R), 4*L))
	if err == nil && overflow {
		err = p.s.Memset(counts, 4*plan.CountOverflow, 1, 1) // int32 1, little-endian
	}
	return err
}

// deviceTables enqueues the column kernels that write h's tables (new
// ones, or a Relayout's in place) for lay: its receive rows are the
// handle's (RecvCount, or MaxRecvTokens in capacity mode).
func (p *Path) deviceTables(lk *gpuLayout, h *datapath.Handle, lay *plan.Layout, base gpulayout.Dims) error {
	t, err := p.writeTables(lk, h, lay.NumTokens, lay.RecvCount, base)
	if err != nil {
		return err
	}
	t.n = p.env.ValidRecv(lay, p.env.Rank)
	h.Tables = t
	return nil
}

// writeTables enqueues the column kernels that write the tables of a
// layout of T tokens (recv rows received: the tables' rows in blocking
// mode; capacity mode has MaxRecvTokens) into h's (in place) or new ones,
// which it returns.
func (p *Path) writeTables(lk *gpuLayout, h *datapath.Handle, T, recv int, base gpulayout.Dims) (*tables, error) {
	d := base
	d.T, d.RowCap = T, recv
	if p.env.P.Capacity {
		d.RowCap = p.env.P.MaxRecvTokens
	}
	if err := d.Check(); err != nil { // not at these sizes: New checked the largest
		return nil, fmt.Errorf("executor: GPU layout: %w", err)
	}
	t, err := p.tablesFor(tbl(h), plan.TableSizes(d.T, p.K, p.W, d.RowCap))
	if err != nil {
		return nil, err
	}
	route, nt := p.routeWindow()
	cells := d.Columns() * d.Chunks()
	err = errors.Join(p.s.Memset(t.all.Buffer(), 0, t.all.Buffer().Size(), 0xff),
		p.launchN(lk.colcount, cells, d, route, nt, lk.ws),
		p.launchN(lk.colscan, d.Columns(), d, lk.ws),
		p.launchN(lk.colwrite, cells, d, route, nt, lk.ws, t.all))
	if err != nil {
		if tbl(h) == nil {
			t.Close()
		}
		return nil, err
	}
	return t, nil
}

// captureLayout records the Relayout of idx into h in the CUDA graph the
// stream is capturing: deviceLayout's steps with no host read (see the
// comment at the top of this file). Only a capacity-mode Relayout on the
// GPU layout can be captured: a new layout sizes host objects, and the
// host layout of several domains reads the routing on the host.
func (p *Path) captureLayout(h *datapath.Handle, idx *device.Tensor) error {
	f, ok := p.cross.(*flat)
	var err error
	switch {
	case !ok || !f.layoutOnGPU():
		err = fmt.Errorf("executor: layout in a CUDA graph: this world's layout runs on the host (several NVLink domains, or sizes past the GPU layout's); run Relayout before launching the graph: %w", datapath.ErrUnsupported)
	case !p.env.P.Capacity || tbl(h) == nil:
		err = fmt.Errorf("executor: layout in a CUDA graph: only a capacity-mode Relayout of an existing handle can be captured: %w", plan.ErrInvalidInput)
	}
	if err != nil {
		p.cross.reject(datapath.OpLayout, err)
		return err
	}
	lk, P, T := f.lk, p.env.P, idx.Rows()
	d := plan.LayoutDims(P, p.R, p.me, T, 0)
	// An earlier failure is not moved aside (no host reads it back
	// before the graph's calls): it ends this layout's waits at once and
	// the next Synchronize reports it, as it does for the captured calls.
	abandoned, err := p.exchangeAndCount(lk, idx, d)
	if abandoned {
		return err
	}
	if err == nil {
		capErr := int32(0)
		if !p.env.Drop {
			capErr = 1
		}
		err = p.s.Launch(lk.finish, [3]uint32{1, 1, 1}, [3]uint32{32, 1, 1}, 0,
			append([]any{lk.ws, h.Counts, lk.report, int64(P.MaxPermutedTokens), capErr, p.flags.Alarm()}, d.Args()...)...)
	}
	if err == nil {
		// The tables in place; their valid-row count (blocking mode's)
		// is not used in capacity mode.
		_, err = p.writeTables(lk, h, T, 0, d)
	}
	if err == nil {
		lk.captured = true
		// The host's layout of h stays the last eager one; the device
		// counts and tables are the graph's (ready no longer checks the
		// capacity on the host: the report does).
		h.DeviceRouted = true
	}
	if ferr := p.flags.Finish(uint32(datapath.OpLayout)); err == nil {
		err = ferr
	}
	return err
}

// capturedReport reads what the layouts of launched graphs reported since
// the last look (the stream is idle): nil, or the error the first failing
// one would have returned as an eager Relayout (its routing error, or the
// CapacityError), the report then cleared.
func (p *Path) capturedReport(ctx context.Context, lk *gpuLayout) error {
	if lk == nil || !lk.captured {
		return nil
	}
	raw, err := p.s.DownloadBuffer(ctx, lk.report)
	if err != nil {
		p.flags.RaiseAlarm() // the report waits for the next look
		return err
	}
	words := make([]int32, len(raw)/4)
	for i := range words {
		words[i] = int32(binary.LittleEndian.Uint32(raw[4*i:]))
	}
	if words[0] == 0 {
		return nil
	}
	if err := p.s.Memset(lk.report, 0, 4, 0); err != nil {
		return err
	}
	d := plan.LayoutDims(p.env.P, p.R, p.me, 0, 0)
	lay, err := plan.SummaryLayout(words[1:], d)
	if err == nil {
		err = plan.CheckCapacity(lay, p.env.P)
	}
	if err == nil {
		err = fmt.Errorf("executor: a captured layout reported a failure its summary does not hold")
	}
	return fmt.Errorf("executor: relayout in a CUDA graph: %w", err)
}
