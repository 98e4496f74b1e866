//go:build cuda && cgo

package gpu

import (
	"context"
	"fmt"

	"github.com/goep/goep/comm"
	"github.com/goep/goep/device"
	"github.com/goep/goep/executor/internal/datapath"
	"github.com/goep/goep/executor/internal/plan"
	"github.com/goep/goep/permute"
)

// hostLayout runs the layout of idx into h on the host (several domains,
// or a domain too large for the GPU layout's int32 offsets): the routing
// is downloaded, exchanged through the control plane (the domain's control
// blocks, and the rail) and fed to plan.ComputeLayout, then the handle's
// tables are uploaded (into its memory for a Relayout: same sizes, same
// addresses).
func (p *Path) hostLayout(ctx context.Context, h *datapath.Handle, idx *device.Tensor, sig [4]uint64) error {
	env := p.env
	// A failure before the exchange joins it as a rejection: the peers
	// must not wait for this rank.
	raw, err := p.s.DownloadBuffer(ctx, idx.Buffer())
	if err != nil {
		return p.rejectCall(datapath.OpLayout, env.Fate.Note(err))
	}
	hidx, err := device.NewTensor(p.ctl.Stream, device.Int32, idx.Shape()...)
	if err != nil {
		return p.rejectCall(datapath.OpLayout, err)
	}
	defer hidx.Close()
	copy(hidx.Bytes(), raw)
	var routing [][]int32
	var lay *plan.Layout
	p.ctl.Routing(hidx, sig, func(all [][]int32) error {
		routing = make([][]int32, len(all))
		for r := range all {
			routing[r] = append([]int32(nil), all[r]...)
		}
		var err error
		lay, err = plan.ComputeLayout(env.Rank, env.P, routing)
		return err
	})
	if err := p.ctl.Stream.Synchronize(ctx); err != nil {
		if ctx.Err() != nil {
			// The layout's exchange may still run on the stream: a later
			// call's rail round on the caller's goroutine would interleave
			// with it, so the engine takes no more calls.
			err = fmt.Errorf("executor: layout: the caller's context ended with the exchange in flight: %w: %w", comm.ErrTimeout, err)
		}
		return env.Fate.Note(err)
	}
	if err := p.useLayout(ctx, h, lay, nil); err != nil {
		return err
	}
	t, err := p.cross.tables(ctx, h, lay, routing, tbl(h))
	if t != nil {
		h.Tables = t
	}
	return err
}

// useLayout makes lay (its counts, at least) the handle's layout: its
// output sizes, its device counts and, under OverflowError, the capacity
// error Synchronize will report. The device counts are uploaded, or, when
// sum is not nil (the GPU layout's summary, gpulayout.Dims.Summary), copied
// from it on the stream: no host wait.
func (p *Path) useLayout(ctx context.Context, h *datapath.Handle, lay *plan.Layout, sum *device.Buffer) error {
	P := p.env.P
	if sum != nil {
		if err := p.countsFromSummary(h.Counts.Buffer(), sum, plan.Overflows(lay, P)); err != nil {
			return p.env.Fate.Note(err)
		}
	} else if err := p.s.UploadBuffer(ctx, h.Counts.Buffer(), device.EncodeInt32(plan.Counts(lay, P))); err != nil {
		return p.env.Fate.Note(err)
	}
	h.Lay, h.DeviceRouted = lay, false
	h.UseCounts(lay, P)
	if !p.env.Drop {
		if err := plan.CheckCapacity(lay, P); err != nil && p.pending == nil {
			p.pending = err
		}
	}
	return nil
}

// uploadTables uploads a handle's tables host (parts of the given sizes,
// n valid received rows) and its rail tables rt: into old's memory for a
// Relayout (same sizes, same addresses), else into new device memory.
func (p *Path) uploadTables(ctx context.Context, host []int32, sizes []int, n int, rt *railTables, old *tables) (*tables, error) {
	t, err := p.tablesFor(old, sizes)
	if err != nil {
		rt.close()
		return old, err
	}
	if err := p.s.UploadBuffer(ctx, t.all.Buffer(), device.EncodeInt32(host)); err != nil {
		rt.close()
		if old == nil {
			t.Close()
		}
		return old, p.env.Fate.Note(err)
	}
	t.n = n
	if old != nil {
		old.rail.close()
	}
	t.rail = rt
	return t, nil
}

// tablesFor returns the tables to write a layout of the given parts'
// sizes into: old's for a Relayout (old not nil; same sizes), else new
// ones.
func (p *Path) tablesFor(old *tables, sizes []int) (*tables, error) {
	if old == nil {
		return p.newTables(sizes)
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

// newTables allocates tables of the given parts' sizes (plan.TableSizes):
// one Int32 tensor and a view per part.
func (p *Path) newTables(sizes []int) (*tables, error) {
	total := 0
	for _, s := range sizes {
		total += s
	}
	all, err := device.NewTensor(p.s, device.Int32, max(total, 1))
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
	return &tables{all: all, entTok: views[0], entDest: views[1], entRow: views[2], slotEnt: views[3],
		recvSrc: views[4], recvEnt: views[5], recvIdx: views[6], pos: views[7]}, nil
}

// ready checks a handle on the host before its GPU work is enqueued: under
// OverflowError an over-capacity layout skips the work on every rank (all
// ranks see all counts) and Synchronize reports the CapacityError. While
// the stream captures, the work is recorded all the same: the graph's
// replays follow later Relayouts, which may fit, and the kernels drop the
// rows past capacity as under OverflowDrop (the tables are built so under
// both policies), so nothing is written out of bounds.
func (p *Path) ready(h *datapath.Handle) bool {
	if h.Lay == nil || tbl(h) == nil {
		if p.pending == nil {
			p.pending = fmt.Errorf("executor: handle %d has no layout (its layout failed)", h.ID)
		}
		return false
	}
	if !p.env.Drop && !h.DeviceRouted {
		if err := plan.CheckCapacity(h.Lay, p.env.P); err != nil {
			if p.pending == nil {
				p.pending = err
			}
			return p.s.Capturing()
		}
	}
	return true
}

// rowsArg is the valid-row count by value (blocking mode) and the counts
// tensor for capacity mode (nil in blocking mode), for goep_ep_copy_out.
func (p *Path) rowsArg(h *datapath.Handle) (int64, *device.Tensor) {
	if p.env.P.Capacity {
		return 0, h.Counts
	}
	return int64(tbl(h).n), nil
}

// deviceMap is the permute kernels' map of a handle: in capacity mode the
// kernels run over the whole capacity (positions past the valid rows are
// -1), so no count reaches them from the host.
func (p *Path) deviceMap(h *datapath.Handle) permute.DeviceMap {
	rows := tbl(h).n
	if p.env.P.Capacity {
		rows = h.RecvRows
	}
	return permute.DeviceMap{Rows: rows, TopK: p.K, Pos: tbl(h).pos, RowCap: h.RecvRows, PermCap: h.PermRows}
}
