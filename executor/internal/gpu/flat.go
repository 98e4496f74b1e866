//go:build cuda && cgo

package gpu

import (
	"context"

	"github.com/goep/goep/device"
	"github.com/goep/goep/executor/internal/datapath"
	"github.com/goep/goep/executor/internal/plan"
)

// flat is the crossing of one NVLink domain: every call is GPU work on the
// domain's windows and flags, enqueued in one hold of the driver; the
// layout runs on the GPU too where its sizes allow (lk).
type flat struct {
	p *Path
	// lk are the layout kernels (nil: the layout runs on the host).
	lk *gpuLayout
	// hostLayout makes layouts run on the host all the same (tests).
	hostLayout bool
}

func newFlat(p *Path, gpuLayout bool) (*flat, error) {
	f := &flat{p: p}
	if gpuLayout {
		var err error
		if f.lk, err = newGPULayout(p); err != nil {
			return nil, err
		}
	}
	return f, nil
}

// layoutOnGPU reports whether layouts run on the GPU (and so join the
// domain's flags, a rejected one too).
func (f *flat) layoutOnGPU() bool { return f.lk != nil && !f.hostLayout }

// enqueue runs f, which only enqueues work on the stream, in one hold of
// the GPU's driver (device.CUDAStream.Enqueue): a call's launches, copies
// and memsets then take the device once instead of once each, and the
// ranks of a process sharing the GPU take turns once per call.
func (f *flat) enqueue(fn func() error) error { return f.p.s.Enqueue(fn) }

func (f *flat) layout(ctx context.Context, h *datapath.Handle, idx *device.Tensor, sig [4]uint64) error {
	if f.layoutOnGPU() {
		return f.p.deviceLayout(ctx, f.lk, h, idx)
	}
	return f.p.hostLayout(ctx, h, idx, sig)
}

func (f *flat) tables(ctx context.Context, h *datapath.Handle, lay *plan.Layout, routing [][]int32, old *tables) (*tables, error) {
	p := f.p
	T, K, W, rowCap := lay.NumTokens, p.K, p.W, h.RecvRows
	host := plan.BuildTables(lay, p.env.P, routing, W, rowCap)
	return p.uploadTables(ctx, host, plan.TableSizes(T, K, W, rowCap), p.env.ValidRecv(lay, p.env.Rank), nil, old)
}

func (f *flat) push(h *datapath.Handle, x, w, sx *device.Tensor, round uint64, op datapath.Op) error {
	return f.p.pushFlat(h, x, w, sx, op)
}

func (f *flat) splitScales() bool { return false }

func (f *flat) sum(h *datapath.Handle, dt device.DType, weighted bool, out datapath.CombineOut, op datapath.Op) error {
	return f.p.sumFlat(h, dt, out, weighted, op)
}

func (f *flat) abandoned(datapath.Op, error) {}

// reject joins a rejected call on the GPU's flags, or a host layout's
// exchange (as a task on the control stream: the GPU calls do not use
// it).
func (f *flat) reject(op datapath.Op, cause error) {
	if op != datapath.OpLayout || f.layoutOnGPU() {
		f.p.rejectFlags(cause)
		return
	}
	f.p.ctl.Reject(op, cause)
}

func (f *flat) close() error { return f.lk.close(f.p) }
