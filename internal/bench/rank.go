package bench

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/goep/goep/comm"
	"github.com/goep/goep/device"
	"github.com/goep/goep/executor"
)

// rank is one rank's goroutine: build the engine and inputs, run the
// layout once, then time every call and the baseline, checking each call's
// last output.
func (st *rankState) rankMain(ctx context.Context) (err error) {
	w, cw := st.world, st.cworld
	r := st.rank
	t, h, k := w.Tokens[r], w.Hidden, w.TopK
	if err := st.begin(ctx, "setup"); err != nil {
		return err
	}
	eg := &engineGroup{Group: st.g}
	e, err := executor.New(ctx, eg, st.backend, st.ecfg, executor.WithLogger(st.log))
	if err != nil {
		return err
	}
	defer e.Close()
	defer func() {
		if he := (*harnessTimeoutError)(nil); errors.As(err, &he) {
			eg.abandon(he)
		}
	}()
	// The engine may have detected D (one domain per host) where the
	// config and GOEP_RANKS_PER_DOMAIN say nothing: the checks of combine
	// (partials per domain) and the RDMA byte counts follow the engine's.
	st.ran = e.Config()
	w.RanksPerDomain = st.ran.RanksPerDomain
	cw.RanksPerDomain = st.ran.RanksPerDomain
	if st.clock, err = newClock(e); err != nil {
		return err
	}

	x, idx, wts := w.Inputs(r)
	xt, err := upload(ctx, e, w.DType, x, t, h)
	if err != nil {
		return err
	}
	defer xt.Close()
	it, err := upload(ctx, e, device.Int32, device.EncodeInt32(idx), t, k)
	if err != nil {
		return err
	}
	defer it.Close()
	wt, err := upload(ctx, e, device.FP32, device.EncodeFloat32(device.FP32, wts), t, k)
	if err != nil {
		return err
	}
	defer wt.Close()
	// ds is the side of the dispatch calls, in the case's dtype (fp8: rows
	// with their scales); cs the side of the calls that combine: ds itself,
	// or in an fp8 case a bf16 side of its own (Case.CallDType).
	ds := &side{w: w, in: executor.DispatchInput{X: xt, TopkWeights: wt}}
	defer ds.close()
	if sc := w.ScaleCols(); sc > 0 {
		sx, err := upload(ctx, e, device.FP32, w.InputScales(r), t, sc)
		if err != nil {
			return err
		}
		defer sx.Close()
		ds.in.XScales = sx
	}
	cs := ds
	if cw != w && slices.ContainsFunc(st.cfg.Calls, combines) {
		cx, _, _ := cw.Inputs(r)
		cxt, err := upload(ctx, e, cw.DType, cx, t, h)
		if err != nil {
			return err
		}
		defer cxt.Close()
		cs = &side{w: cw, in: executor.DispatchInput{X: cxt, TopkWeights: wt}}
		defer cs.close()
	}

	hd, err := e.Layout(ctx, executor.LayoutInput{TopkIdx: it})
	if err != nil {
		return fmt.Errorf("layout: %w", err)
	}
	defer hd.Close()
	cnt, err := hd.Counts(ctx)
	if err != nil {
		return fmt.Errorf("counts: %w", err)
	}
	if cnt.Overflow {
		return fmt.Errorf("capacity overflow: %d rows received, %d permuted; raise max_recv_tokens / max_permuted_tokens", cnt.RecvCount, cnt.PermutedCount)
	}
	st.recvRows = cnt.RecvCount

	// dispatched replaces s.disp with a checked dispatch of s.in, timing
	// it if asked.
	dispatched := func(s *side, timed bool) error {
		if s.disp != nil {
			s.disp.Close()
			s.disp = nil
		}
		o, err := checked(ctx, st, e, CallDispatch, timed, func() (executor.DispatchOutput, error) {
			return e.Dispatch(ctx, hd, s.in)
		}, func(o executor.DispatchOutput) (Check, error) {
			return st.checkDispatch(ctx, s.w, r, cnt, o.RecvX, o.RecvScales, o.RecvIdx, o.RecvWeights)
		})
		if err != nil {
			return err
		}
		s.disp = &o
		return nil
	}
	// permuted replaces s.dperm with a checked dispatch-permute of s.in.
	permuted := func(s *side, timed bool) error {
		if s.dperm != nil {
			s.dperm.Close()
			s.dperm = nil
		}
		o, err := checked(ctx, st, e, CallDispatchPermute, timed, func() (executor.DispatchPermuteOutput, error) {
			return e.DispatchPermute(ctx, hd, s.in)
		}, func(o executor.DispatchPermuteOutput) (Check, error) {
			c, err := st.checkDispatch(ctx, s.w, r, cnt, nil, nil, o.RecvIdx, o.RecvWeights)
			if err != nil {
				return c, err
			}
			pc, err := st.checkPermute(ctx, s.w, r, cnt, o.X, o.Scales, o.Weights)
			c.Wrong += pc.Wrong
			return c, err
		})
		if err != nil {
			return err
		}
		s.dperm = &o
		return nil
	}
	// combined runs a timed call of the combine side whose output is the
	// combined tokens, and checks them.
	combined := func(call string, unpermuted bool, op func() (*device.Tensor, error)) error {
		out, err := checked(ctx, st, e, call, true, op, func(out *device.Tensor) (Check, error) {
			return st.checkCombine(ctx, r, out, unpermuted)
		})
		if err != nil {
			return err
		}
		return out.Close()
	}

	for _, call := range st.cfg.Calls {
		var err error
		switch call {
		case CallDispatch:
			err = dispatched(ds, true)
		case CallCombine:
			if cs.disp == nil {
				if err := dispatched(cs, false); err != nil {
					return err
				}
			}
			z := cs.disp.RecvX
			err = combined(call, false, func() (*device.Tensor, error) {
				return e.Combine(ctx, hd, executor.CombineInput{Z: z})
			})
		case CallDispatchPermute:
			err = permuted(ds, true)
		case CallUnpermuteCombine:
			if cs.dperm == nil {
				if err := permuted(cs, false); err != nil {
					return err
				}
			}
			y, rw := cs.dperm.X, cs.dperm.RecvWeights
			err = combined(call, true, func() (*device.Tensor, error) {
				return e.UnpermuteCombine(ctx, hd, executor.UnpermuteInput{Y: y, RecvWeights: rw})
			})
		case CallDispatchCombine:
			var o roundTrip
			o, err = checked(ctx, st, e, call, true, func() (roundTrip, error) {
				d, err := e.Dispatch(ctx, hd, cs.in)
				if err != nil {
					return roundTrip{}, err
				}
				out, err := e.Combine(ctx, hd, executor.CombineInput{Z: d.RecvX})
				if err != nil {
					d.Close()
					return roundTrip{}, err
				}
				return roundTrip{d, out}, nil
			}, func(o roundTrip) (Check, error) {
				c, err := st.checkDispatch(ctx, cw, r, cnt, o.disp.RecvX, o.disp.RecvScales, o.disp.RecvIdx, o.disp.RecvWeights)
				if err != nil {
					return c, err
				}
				cc, err := st.checkCombine(ctx, r, o.out, false)
				c.Rows += cc.Rows
				c.Wrong += cc.Wrong
				return c, err
			})
			if err == nil {
				err = o.Close()
			}
		}
		if err != nil {
			return err
		}
	}
	if err := e.Synchronize(ctx); err != nil {
		return err
	}
	if st.checkOnly {
		return nil
	}
	// The outputs kept for the calls that combine are not needed any more:
	// the copy baseline can have their memory.
	// Their frees are stream-ordered: synchronised, they are done.
	ds.close()
	cs.close()
	if err := e.Synchronize(ctx); err != nil {
		return err
	}
	return st.baseline(ctx, e)
}

// side is the inputs of one dtype's calls and their last outputs, which
// the calls that combine reuse.
type side struct {
	w     *World // the payload's world (its dtype)
	in    executor.DispatchInput
	disp  *executor.DispatchOutput
	dperm *executor.DispatchPermuteOutput
}

func (s *side) close() {
	if s.disp != nil {
		s.disp.Close()
		s.disp = nil
	}
	if s.dperm != nil {
		s.dperm.Close()
		s.dperm = nil
	}
}

// roundTrip is one iteration of dispatch-combine: the dispatch's outputs
// stay alive until the combine that reads them has been synchronised.
type roundTrip struct {
	disp executor.DispatchOutput
	out  *device.Tensor
}

func (o roundTrip) Close() error {
	return errors.Join(o.disp.Close(), o.out.Close())
}

func upload(ctx context.Context, e *executor.Engine, dt device.DType, data []byte, shape ...int) (*device.Tensor, error) {
	t, err := e.NewTensor(dt, shape...)
	if err != nil {
		return nil, err
	}
	if err := device.Upload(ctx, t, data); err != nil {
		t.Close()
		return nil, err
	}
	return t, nil
}

// loop runs op after a barrier of all ranks, timing op plus
// synchronisation with the rank's clock (the wall clock on the host, CUDA
// events on the engine's stream on the GPU), and returns the last output
// (earlier ones are closed).
// Timed, it runs Warmup+Iters times and records the last Iters; untimed,
// once.
func loop[T interface{ Close() error }](ctx context.Context, st *rankState, call string, ctl comm.Group, sync func(context.Context) error, timed bool, op func() (T, error)) (T, error) {
	var last, zero T
	warmup, iters := 0, 1
	if timed {
		warmup, iters = st.cfg.Warmup, st.cfg.Iters
	}
	if err := st.begin(ctx, call); err != nil {
		return zero, err
	}
	for i := range warmup + iters {
		if i > 0 {
			last.Close()
		}
		if err := ctl.Barrier(ctx); err != nil {
			return zero, err
		}
		if err := st.clock.begin(); err != nil {
			return zero, err
		}
		out, err := op()
		if err == nil {
			if err = st.clock.end(); err == nil {
				err = sync(ctx)
			}
			if err != nil {
				out.Close()
			}
		}
		if err != nil {
			return zero, err
		}
		t0, d, err := st.clock.elapsed()
		if err != nil {
			out.Close()
			return zero, err
		}
		last = out
		if timed && i >= warmup {
			st.record(call, i-warmup, t0, t0.Add(d))
		}
		if timed {
			st.progress(call)
		}
	}
	// Hold every rank until the last finishes, so that no rank's checking
	// competes for the cores with a rank still inside the timed call.
	if err := ctl.Barrier(ctx); err != nil {
		last.Close()
		return zero, err
	}
	return last, nil
}

// checked runs op as call with loop (on st.ctl, synchronising e), checks
// its last output with check and, timed, adds the check to the call's. It
// returns the output, which the caller closes; an error names the call.
func checked[T interface{ Close() error }](ctx context.Context, st *rankState, e *executor.Engine, call string, timed bool, op func() (T, error), check func(T) (Check, error)) (T, error) {
	var zero T
	o, err := loop(ctx, st, call, st.ctl, e.Synchronize, timed, op)
	if err != nil {
		if strings.HasPrefix(err.Error(), call+": ") { // the engine's error names its call
			return zero, err
		}
		return zero, fmt.Errorf("%s: %w", call, err)
	}
	c, err := check(o)
	if err != nil {
		o.Close()
		return zero, err
	}
	if timed {
		st.checks[call].add(c)
	}
	return o, nil
}

// runBaseline times a plain copy of this rank's N_r rows of dtype dt,
// their bytes as a call moves them (RowBytes: an fp8 row's scales
// included, one contiguous copy), all ranks at once, each on its own stream
// of the host backend and spread over the cores with device.ParallelFor as
// the engine's copies are. It records the times as name.
func (st *rankState) runBaseline(ctx context.Context, ctl comm.Group, name string, dt device.DType) error {
	w := st.world
	s, err := st.backend.NewStream()
	if err != nil {
		return err
	}
	defer s.Close()
	hs, ok := s.(*device.HostStream)
	if !ok {
		return fmt.Errorf("baseline: not a host stream")
	}
	n := st.recvRows
	rb := RowBytes(dt, w.Hidden)
	src, err := device.NewTensor(s, dt, n, rb/dt.Size())
	if err != nil {
		return err
	}
	defer src.Close()
	dst, err := device.NewTensor(s, dt, n, rb/dt.Size())
	if err != nil {
		return err
	}
	defer dst.Close()
	hs.Go("baseline fill", func() error {
		b := src.Bytes()
		for i := range b {
			b[i] = byte(i)
		}
		clear(dst.Bytes())
		return nil
	})
	grain := max(1, (64<<10)/rb)
	for i := range st.cfg.Warmup + st.cfg.Iters {
		if err := ctl.Barrier(ctx); err != nil {
			return err
		}
		t0 := time.Now()
		hs.Go("baseline copy", func() error {
			sb, db := src.Bytes(), dst.Bytes()
			device.ParallelFor(n, grain, func(lo, hi int) {
				copy(db[lo*rb:hi*rb], sb[lo*rb:hi*rb])
			})
			return nil
		})
		if err := hs.Synchronize(ctx); err != nil {
			return fmt.Errorf("baseline: %w", err)
		}
		if t1 := time.Now(); i >= st.cfg.Warmup {
			st.record(name, i-st.cfg.Warmup, t0, t1)
		}
		st.progress(name)
	}
	if err := ctl.Barrier(ctx); err != nil {
		return err
	}
	if !slices.Equal(src.Bytes(), dst.Bytes()) {
		return fmt.Errorf("baseline: copy differs from its source")
	}
	return nil
}

// download returns the bytes of each tensor, nil for a nil one. A host
// backend's tensor is read where it is (Tensor.Bytes), not copied: the
// checks read it only after the calls that wrote it were synchronised,
// while it is open, and a copy of every output would double what a check
// holds.
func download(ctx context.Context, ts ...*device.Tensor) ([][]byte, error) {
	bs := make([][]byte, len(ts))
	for i, t := range ts {
		if t == nil {
			continue
		}
		if v := t.Bytes(); v != nil {
			bs[i] = v
			continue
		}
		var err error
		if bs[i], err = device.Download(ctx, t); err != nil {
			return nil, err
		}
	}
	return bs, nil
}

// weights decodes downloaded fp32 weights; nil stays nil.
func weights(b []byte) []float32 {
	if b == nil {
		return nil
	}
	return device.DecodeFloat32(device.FP32, b)
}

func (st *rankState) checkDispatch(ctx context.Context, w *World, r int, cnt executor.Counts, x, scales, idx, wts *device.Tensor) (Check, error) {
	bs, err := download(ctx, x, scales, idx, wts)
	if err != nil {
		return Check{}, err
	}
	return w.CheckDispatch(r, cnt.RecvCount, bs[0], bs[1], device.DecodeInt32(bs[2]), weights(bs[3])), nil
}

func (st *rankState) checkPermute(ctx context.Context, w *World, r int, cnt executor.Counts, x, scales, wts *device.Tensor) (Check, error) {
	bs, err := download(ctx, x, scales, wts)
	if err != nil {
		return Check{}, err
	}
	return w.CheckPermute(r, st.cfg.Pad, cnt.PermutedCount, bs[0], bs[1], weights(bs[2])), nil
}

// checkCombine checks a combined output, which is of the combine dtype
// (st.cworld's).
func (st *rankState) checkCombine(ctx context.Context, r int, out *device.Tensor, unpermuted bool) (Check, error) {
	bs, err := download(ctx, out)
	if err != nil {
		return Check{}, err
	}
	return st.cworld.CheckCombine(r, bs[0], unpermuted), nil
}
