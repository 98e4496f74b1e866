package host

import (
	"context"

	"github.com/goep/goep/comm"
	"github.com/goep/goep/device"
	"github.com/goep/goep/executor/internal/datapath"
	"github.com/goep/goep/executor/internal/plan"
	"github.com/goep/goep/internal/view"
	"github.com/goep/goep/nvlink"
	"github.com/goep/goep/permute"
)

// Path is the host backend's data path (datapath.Path).
type Path struct{ *Control }

// New creates a rank's host data path on b (collective over g; shm is
// GOEP_RDMA_SHARED_MEMORY).
func New(ctx context.Context, g comm.Group, b *device.Host, env *datapath.Env, shm bool) (*Path, error) {
	ctl, err := NewControl(ctx, g, b, env, shm)
	if err != nil {
		return nil, err
	}
	return &Path{Control: ctl}, nil
}

// Stream is the host stream every call's task runs on.
func (p *Path) Stream() device.Stream { return p.Control.Stream }

// Enqueue runs f as it is: host allocations need no hand-off.
func (p *Path) Enqueue(f func() error) error { return f() }

// par is how the host spreads its copies between goroutines (Config.SMs,
// Config.ChunkRows).
func (p *Path) par() device.Parallel {
	return device.Parallel{Workers: p.env.SMs, Chunk: p.env.ChunkRows}
}

// Reject joins call op's exchange as a stream task, publishing cause.
func (p *Path) Reject(op datapath.Op, cause error) { p.Control.Reject(op, cause) }

// Synchronize waits for the stream's tasks.
func (p *Path) Synchronize(ctx context.Context) error { return p.Control.Stream.Synchronize(ctx) }

// Drain is Synchronize before Close.
func (p *Path) Drain(ctx context.Context) error { return p.Control.Stream.Synchronize(ctx) }

// Close leaves the domain and the rail.
func (p *Path) Close() error { return p.Control.Close() }

// Layout runs the layout of idx into h: every rank's routing gathered in
// one collective task, ComputeLayout, the device counts; in blocking mode
// it waits for the result.
func (p *Path) Layout(ctx context.Context, h *datapath.Handle, idx *device.Tensor, sig [4]uint64) error {
	exact, err := p.exactRouting(idx)
	if err != nil {
		p.Reject(datapath.OpLayout, err)
		return err
	}
	p.Routing(exact, sig, func(routing [][]int32) error {
		lay, err := plan.ComputeLayout(p.env.Rank, p.env.P, routing)
		if err != nil {
			return err
		}
		h.Lay = lay
		return p.finishLayout(h)
	})
	if exact != idx {
		exact.Close() // in stream order: after the layout
	}
	if p.env.P.Capacity {
		h.RecvRows, h.PermRows = p.env.P.MaxRecvTokens, p.env.P.MaxPermutedTokens
		return nil
	}
	if err := p.Synchronize(ctx); err != nil {
		return err
	}
	h.UseCounts(h.Lay, p.env.P)
	return nil
}

// exactRouting is idx, or, when idx's buffer is larger than its data
// (device.TensorOf), a copy of the data in a buffer of its own, made in
// stream order: the layout's exchange exposes whole buffers, and the peers
// would read the rest of the buffer as more tokens' routing. The caller
// closes the copy.
func (p *Path) exactRouting(idx *device.Tensor) (*device.Tensor, error) {
	if idx.Buffer().Size() == len(idx.Bytes()) {
		return idx, nil
	}
	c, err := p.env.Alloc(device.Int32, idx.Shape()...)
	if err != nil {
		return nil, err
	}
	p.Control.Stream.Go("layout: routing copy", func() error {
		copy(c.Bytes(), idx.Bytes())
		return nil
	})
	return c, nil
}

// finishLayout writes the device counts and applies the capacity policy
// (stream task).
func (p *Path) finishLayout(h *datapath.Handle) error {
	copy(view.Int32s(h.Counts.Bytes()), plan.Counts(h.Lay, p.env.P))
	if p.env.Drop {
		return nil
	}
	return plan.CheckCapacity(h.Lay, p.env.P)
}

// pull runs one round of the collective half of a dispatch-like call op
// on the rows of x and the optional weights w, and calls fn with the
// source of every valid received row.
func (p *Path) pull(lay *plan.Layout, h *datapath.Handle, op datapath.Op, round uint64, x, w *device.Tensor, fn func(src *sources) error) error {
	c := nvlink.Call{Op: uint64(op), Sig: datapath.Sig(h, x.DType(), w != nil, round), Buffers: []*device.Buffer{x.Buffer(), datapath.Buf(w)}}
	return p.cross.pull(lay, c, x, w, fn)
}

// Dispatch enqueues the dispatch of rows x (weights w, fp8 scales sx).
func (p *Path) Dispatch(h *datapath.Handle, x, w, sx *device.Tensor, out datapath.DispatchOut) error {
	p.Collective(datapath.OpDispatch, func() error {
		lay, err := p.env.Ready(h)
		if err != nil {
			return err
		}
		err = p.pull(lay, h, datapath.OpDispatch, datapath.RoundRows, x, w, func(src *sources) error {
			p.gatherRows(src, out.RecvX.Bytes(), f32(out.RecvWeights))
			writeRecvIdx(lay, src.n, h.RecvRows, out.RecvIdx)
			return nil
		})
		if err != nil || sx == nil {
			return err
		}
		return p.pull(lay, h, datapath.OpDispatch, datapath.RoundScales, sx, nil, func(src *sources) error {
			p.gatherRows(src, out.RecvScales.Bytes(), nil)
			return nil
		})
	})
	return nil
}

// DispatchPermute enqueues the dispatch of rows x (weights w, fp8 scales
// sx) straight into their permuted positions.
func (p *Path) DispatchPermute(h *datapath.Handle, x, w, sx *device.Tensor, out datapath.DispatchPermuteOut) error {
	p.Collective(datapath.OpDispatchPermute, func() error {
		lay, err := p.env.Ready(h)
		if err != nil {
			return err
		}
		err = p.pull(lay, h, datapath.OpDispatchPermute, datapath.RoundRows, x, w, func(src *sources) error {
			writeRecvIdx(lay, src.n, h.RecvRows, out.RecvIdx)
			p.gatherPermuted(src, out.X.Bytes(), f32(out.RecvWeights), f32(out.Weights))
			return nil
		})
		if err != nil || sx == nil {
			return err
		}
		return p.pull(lay, h, datapath.OpDispatchPermute, datapath.RoundScales, sx, nil, func(src *sources) error {
			p.gatherPermuted(src, out.Scales.Bytes(), nil, nil)
			return nil
		})
	})
	return nil
}

// Combine enqueues the combine of z (and, with zw, the weight gradients'
// return: DispatchBackward).
func (p *Path) Combine(h *datapath.Handle, z, zw *device.Tensor, out datapath.CombineOut) error {
	p.Collective(datapath.OpCombine, func() error {
		lay, err := p.env.Ready(h)
		if err != nil {
			return err
		}
		c := nvlink.Call{Op: uint64(datapath.OpCombine), Sig: datapath.Sig(h, z.DType(), zw != nil, datapath.RoundRows),
			Buffers: []*device.Buffer{z.Buffer(), datapath.Buf(zw)}}
		return p.cross.sum(p, lay, c, z, zw, out.X.Bytes(), out.GradTopkWeights, nil)
	})
	return nil
}

// UnpermuteCombine enqueues the combine of Unpermute(y, w) in one pass:
// each source reads its tokens' expert outputs from the destinations and
// folds them per destination (rounded to the dtype, as Unpermute's output
// would be) before the sum.
func (p *Path) UnpermuteCombine(h *datapath.Handle, y, w, out *device.Tensor) error {
	p.Collective(datapath.OpUnpermuteCombine, func() error {
		lay, err := p.env.Ready(h)
		if err != nil {
			return err
		}
		c := nvlink.Call{Op: uint64(datapath.OpUnpermuteCombine), Sig: datapath.Sig(h, y.DType(), w != nil, datapath.RoundRows),
			Buffers: []*device.Buffer{y.Buffer(), datapath.Buf(w)}}
		return p.cross.sum(p, lay, c, y, w, out.Bytes(), nil, &unpermuteSpec{weighted: w != nil})
	})
	return nil
}

// bytesOf is a tensor's bytes (nil for a nil tensor).
func bytesOf(t *device.Tensor) []byte {
	if t == nil {
		return nil
	}
	return t.Bytes()
}

// f32 views an FP32 tensor's bytes (nil for a nil tensor).
func f32(t *device.Tensor) []float32 {
	if t == nil {
		return nil
	}
	return view.Float32s(t.Bytes())
}

// permuteMap is the permute ops' map of a handle's layout.
func (p *Path) permuteMap(h *datapath.Handle, lay *plan.Layout) permute.Map {
	return permute.Map{Rows: p.env.ValidRecv(lay, p.env.Rank), TopK: lay.TopK, Pos: lay.Pos, RowCap: h.RecvRows, PermCap: h.PermRows}
}
