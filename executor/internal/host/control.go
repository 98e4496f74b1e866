// Package host is the data path of the host backend: every call runs as a
// task on the rank's host stream, and the data moves by pulling: within
// one exchange of the domain (package nvlink) every rank exposes its
// inputs, then reads what it needs from its peers' buffers and writes only
// its own outputs. Dispatch runs on the receiver, combine on the source.
// The exchange's done phase keeps every exposed input alive and unchanged
// until all peers have read it. With several domains the rail (package
// rail) carries what crosses domains, and the domain exchange forwards it.
//
// Its Control (the stream, the domain's exchange, the rail) is also the
// GPU data path's control plane: the layout's routing exchange where it
// runs on the host.
package host

import (
	"context"
	"errors"
	"fmt"

	"github.com/goep/goep/comm"
	"github.com/goep/goep/device"
	"github.com/goep/goep/executor/internal/datapath"
	"github.com/goep/goep/executor/internal/plan"
	"github.com/goep/goep/executor/internal/rail"
	"github.com/goep/goep/internal/view"
	"github.com/goep/goep/nvlink"
	"github.com/goep/goep/permute"
)

// Control is a rank's host control plane: its stream of host tasks, its
// domain's exchange and, with several domains, its rail. The crossing
// (one domain, or the rail and the domain) is chosen once, in NewControl.
type Control struct {
	env    *datapath.Env
	Stream *device.HostStream
	// Dom is this rank's domain's exchange (the whole group with one
	// domain).
	Dom *nvlink.Domain
	// Rail is the inter-domain half; nil with one domain.
	Rail  *rail.Rail
	cross crossing
}

// crossing is how a host call crosses the ranks: within one domain, or
// through the rail and then the domain.
type crossing interface {
	// routing gathers every rank's routing (idx, a host tensor) and calls
	// fn with it inside the exchange (fn must copy what it keeps).
	routing(idx *device.Tensor, sig [4]uint64, fn func(routing [][]int32) error) error
	// pull runs one round of a dispatch-like call c on the rows of x and
	// the optional weights w, and calls fn with the source of every valid
	// received row.
	pull(lay *plan.Layout, c nvlink.Call, x, w *device.Tensor, fn func(src *sources) error) error
	// sum runs the collective half of a combine-like call c on the
	// rows y and the optional weights yw (c's buffers): every rank's
	// tokens' sums into out and, with gwt, their weight gradients; with
	// u, each destination's rows are unpermuted first.
	sum(p *Path, lay *plan.Layout, c nvlink.Call, y, yw *device.Tensor, out []byte, gwt *device.Tensor, u *unpermuteSpec) error
	// join joins the exchanges of call op with cause as this rank's
	// status: the peers fail the call at once with this rank's reason.
	join(op datapath.Op, cause error)
}

// NewControl creates the stream on b (a host backend) and joins the
// domain's exchange or, with several domains, builds the rail
// (collective over g; shm is GOEP_RDMA_SHARED_MEMORY).
func NewControl(ctx context.Context, g comm.Group, b *device.Host, env *datapath.Env, shm bool) (*Control, error) {
	s, err := b.NewStream()
	if err != nil {
		return nil, err
	}
	c := &Control{env: env, Stream: s.(*device.HostStream)}
	R := g.Size()

	if env.P.RanksPerDomain == R {
		global := make([]int, R)
		for i := range global {
			global[i] = i
		}
		if c.Dom, err = nvlink.New(ctx, g, s, global, env.Timeout); err != nil {
			return nil, errors.Join(err, s.Close())
		}
		c.Dom.Words = datapath.DomainWords
		c.cross = &flat{c: c}
		return c, nil
	}
	if c.Rail, err = rail.New(ctx, g, s, env, shm); err != nil {
		return nil, errors.Join(err, s.Close())
	}
	c.Dom = c.Rail.Dom
	c.cross = &tiered{c: c, r: c.Rail}
	return c, nil
}

// NewStreamOnly is the control plane of one domain whose ranks share no
// host memory (a domain that spans hosts over an NVLink fabric; why says
// so): the stream alone, no domain exchange. Its collective calls fail
// with why: the GPU path then runs every call, the layout included, on
// the GPU's flags.
func NewStreamOnly(b *device.Host, env *datapath.Env, why string) (*Control, error) {
	s, err := b.NewStream()
	if err != nil {
		return nil, err
	}
	return &Control{env: env, Stream: s.(*device.HostStream), cross: noExchange{why}}, nil
}

// Close leaves the domain (and closes the rail, collective over it: after
// the engine's closing barrier) and closes the stream.
func (c *Control) Close() error {
	var errs []error
	if c.Rail != nil {
		if err := c.Rail.Close(); err != nil && c.env.Fate.Err() == nil {
			errs = append(errs, fmt.Errorf("executor: close: %w", err))
		}
	} else if c.Dom != nil {
		c.Dom.Close()
	}
	if err := c.Stream.Close(); err != nil && c.env.Fate.Err() == nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// Exchange runs one domain exchange from a stream task, recording a fatal
// failure, and marks a peer's rejected input as invalid input.
func (c *Control) Exchange(call nvlink.Call, fn func(peers [][][]byte) error) error {
	return datapath.PeerInput(c.env.Fate.Note(c.Dom.Exchange(call, fn)))
}

// Collective enqueues fn, the stream task of collective call op. It runs
// even when an earlier task on this rank's stream failed (the caller's own
// work on the stream, or a call that failed here alone): then, instead of
// fn, it joins the call's exchange with that failure as this rank's
// status, so that the peers fail this call rather than pair their
// exchanges with this rank's later calls. The failure itself is what
// Synchronize reports.
func (c *Control) Collective(op datapath.Op, fn func() error) {
	c.Stream.GoCollective(op.String(), func(held error) error {
		if held != nil {
			c.cross.join(op, fmt.Errorf("executor: an earlier task on rank %d's stream failed: %w", c.env.Rank, held))
			return nil
		}
		return fn()
	})
}

// Reject makes this rank join, as a stream task, the exchange of a call
// whose input it rejected, publishing the reason, so that every peer fails
// the call at once instead of waiting for this rank.
func (c *Control) Reject(op datapath.Op, cause error) {
	c.Stream.GoCollective("reject "+op.String(), func(error) error {
		c.cross.join(op, cause)
		return nil
	})
}

// JoinNow is Reject run on the caller's goroutine: for a path that runs
// its rail rounds there (a stream task could interleave its epoch with the
// next call's).
func (c *Control) JoinNow(op datapath.Op, cause error) { c.cross.join(op, cause) }

// Routing gathers every rank's routing (idx, a host tensor) in a stream
// task of the layout, and calls fn with it (fn must copy what it keeps).
func (c *Control) Routing(idx *device.Tensor, sig [4]uint64, fn func(routing [][]int32) error) {
	c.Collective(datapath.OpLayout, func() error { return c.cross.routing(idx, sig, fn) })
}

// flat is the crossing of one domain: every call is one exchange. A call
// whose exposed bytes fit the domain's stage (nvlink.StageBytes) copies
// them there (nvlink.Domain.Stage): when every rank did, the exchange
// ends at its publish wait, one round of the peers' stores instead of
// two, which is most of a small call's time.
type flat struct{ c *Control }

func (f *flat) routing(idx *device.Tensor, sig [4]uint64, fn func(routing [][]int32) error) error {
	call := nvlink.Call{Op: uint64(datapath.OpLayout), Sig: sig, Buffers: []*device.Buffer{idx.Buffer()}}
	f.c.Dom.Stage(&call, idx.Bytes())
	return f.c.Exchange(call, func(peers [][][]byte) error {
		routing := make([][]int32, len(peers))
		for p := range peers {
			routing[p] = view.Int32s(peers[p][0])
		}
		return fn(routing)
	})
}

func (f *flat) pull(lay *plan.Layout, c nvlink.Call, x, w *device.Tensor, fn func(src *sources) error) error {
	rb := datapath.RowBytes(x)
	f.c.Dom.Stage(&c, x.Bytes(), bytesOf(w))
	return f.c.Exchange(c, func(peers [][][]byte) error {
		return fn(newSources(f.c.env, lay, peers, rb, w != nil, nil))
	})
}

func (f *flat) sum(p *Path, lay *plan.Layout, c nvlink.Call, y, yw *device.Tensor, out []byte, gwt *device.Tensor, u *unpermuteSpec) error {
	gw, dt := f32(gwt), y.DType()
	f.c.Dom.Stage(&c, y.Bytes(), bytesOf(yw))
	return f.c.Exchange(c, func(peers [][][]byte) error {
		rb := p.env.Hidden * dt.Size()
		newTermer := func() *termer { return newTermer(p.env, lay, peers, dt, u) }
		// Weighted bf16 rows (the fused call's common case) are summed in
		// one pass (permute.SumGroups has assembly for them); otherwise
		// each destination's unpermuted row is written, then summed.
		onePass := u != nil && u.weighted && dt == device.BF16
		device.ForScratch(p.par(), lay.NumTokens, 16, newTermer, func(tm *termer, lo, hi int) {
			for t := lo; t < hi; t++ {
				if onePass {
					rows, w, ends := tm.groups(&lay.SendSide, t, -1)
					permute.SumGroups(dt, out[t*rb:(t+1)*rb], rows, w, ends)
					continue
				}
				permute.SumRows(dt, out[t*rb:(t+1)*rb], tm.collect(&lay.SendSide, t, -1), nil)
			}
		})
		if gwt != nil {
			K := lay.TopK
			for t := range lay.NumTokens {
				for k := range K {
					gw[t*K+k] = slotGrad(p.env, lay, &lay.SendSide, t, k, 0, peers)
				}
			}
		}
		return nil
	})
}

func (f *flat) join(op datapath.Op, cause error) {
	_ = f.c.Dom.Exchange(nvlink.Call{Op: uint64(op), Status: cause}, nil)
}

// noExchange is the crossing of a control plane without a domain exchange
// (NewStreamOnly): the collective calls fail, saying why; joins do nothing
// (the GPU's flags carry rejections).
type noExchange struct{ why string }

func (n noExchange) err() error {
	return fmt.Errorf("executor: no host exchange between the domain's ranks (%s): %w", n.why, datapath.ErrUnsupported)
}

func (n noExchange) routing(*device.Tensor, [4]uint64, func([][]int32) error) error { return n.err() }

func (n noExchange) pull(*plan.Layout, nvlink.Call, *device.Tensor, *device.Tensor, func(*sources) error) error {
	return n.err()
}

func (n noExchange) sum(*Path, *plan.Layout, nvlink.Call, *device.Tensor, *device.Tensor, []byte, *device.Tensor, *unpermuteSpec) error {
	return n.err()
}

func (n noExchange) join(datapath.Op, error) {}
