package bench

import (
	"context"
	"errors"
	"fmt"
	"slices"
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
	e, err := executor.New(ctx, st.g, st.backend, st.ecfg, executor.WithLogger(st.log))
	if err != nil {
		return err
	}
	defer e.Close()
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
	ctl := st.ctl

	// dispatched replaces s.disp with a checked dispatch of s.in, timing
	// it if asked.
	dispatched := func(s *side, timed bool) error {
		if s.disp != nil {
			s.disp.Close()
			s.disp = nil
		}
		o, err := loop(ctx, st, CallDispatch, ctl, e.Synchronize, timed, func() (executor.DispatchOutput, error) {
			return e.Dispatch(ctx, hd, s.in)
		})
		if err != nil {
			return fmt.Errorf("dispatch: %w", err)
		}
		s.disp = &o
		c, err := st.checkDispatch(ctx, s.w, r, cnt, o.RecvX, o.RecvScales, o.RecvIdx, o.RecvWeights)
		if err != nil {
			return err
		}
		if timed {
			st.checks[CallDispatch].add(c)
		}
		return nil
	}
	// permuted replaces s.dperm with a checked dispatch-permute of s.in.
	permuted := func(s *side, timed bool) error {
		if s.dperm != nil {
			s.dperm.Close()
			s.dperm = nil
		}
		o, err := loop(ctx, st, CallDispatchPermute, ctl, e.Synchronize, timed, func() (executor.DispatchPermuteOutput, error) {
			return e.DispatchPermute(ctx, hd, s.in)
		})
		if err != nil {
			return fmt.Errorf("dispatch-permute: %w", err)
		}
		s.dperm = &o
		c, err := st.checkDispatch(ctx, s.w, r, cnt, nil, nil, o.RecvIdx, o.RecvWeights)
		if err != nil {
			return err
		}
		pc, err := st.checkPermute(ctx, s.w, r, cnt, o.X, o.Scales, o.Weights)
		if err != nil {
			return err
		}
		c.Wrong += pc.Wrong
		if timed {
			st.checks[CallDispatchPermute].add(c)
		}
		return nil
	}

	for _, call := range st.cfg.Calls {
		switch call {
		case CallDispatch:
			if err := dispatched(ds, true); err != nil {
				return err
			}
		case CallCombine:
			if cs.disp == nil {
				if err := dispatched(cs, false); err != nil {
					return err
				}
			}
			z := cs.disp.RecvX
			out, err := loop(ctx, st, CallCombine, ctl, e.Synchronize, true, func() (*device.Tensor, error) {
				return e.Combine(ctx, hd, executor.CombineInput{Z: z})
			})
			if err != nil {
				return fmt.Errorf("combine: %w", err)
			}
			c, err := st.checkCombine(ctx, r, out, false)
			out.Close()
			if err != nil {
				return err
			}
			st.checks[CallCombine].add(c)
		case CallDispatchPermute:
			if err := permuted(ds, true); err != nil {
				return err
			}
		case CallUnpermuteCombine:
			if cs.dperm == nil {
				if err := permuted(cs, false); err != nil {
					return err
				}
			}
			y, rw := cs.dperm.X, cs.dperm.RecvWeights
			out, err := loop(ctx, st, CallUnpermuteCombine, ctl, e.Synchronize, true, func() (*device.Tensor, error) {
				return e.UnpermuteCombine(ctx, hd, executor.UnpermuteInput{Y: y, RecvWeights: rw})
			})
			if err != nil {
				return fmt.Errorf("unpermute-combine: %w", err)
			}
			c, err := st.checkCombine(ctx, r, out, true)
			out.Close()
			if err != nil {
				return err
			}
			st.checks[CallUnpermuteCombine].add(c)
		case CallDispatchCombine:
			o, err := loop(ctx, st, CallDispatchCombine, ctl, e.Synchronize, true, func() (roundTrip, error) {
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
			})
			if err != nil {
				return fmt.Errorf("dispatch-combine: %w", err)
			}
			c, err := st.checkDispatch(ctx, cw, r, cnt, o.disp.RecvX, o.disp.RecvScales, o.disp.RecvIdx, o.disp.RecvWeights)
			if err == nil {
				var cc Check
				cc, err = st.checkCombine(ctx, r, o.out, false)
				c.Rows += cc.Rows
				c.Wrong += cc.Wrong
			}
			o.Close()
			if err != nil {
				return err
			}
			st.checks[CallDispatchCombine].add(c)
		}
	}
	if err := e.Synchronize(ctx); err != nil {
		return err
	}
	if st.checkOnly {
		return nil
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
	}
	if s.dperm != nil {
		s.dperm.Close()
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

// download returns t's bytes, or nil for a nil tensor.
func download(ctx context.Context, t *device.Tensor) ([]byte, error) {
	if t == nil {
		return nil, nil
	}
	return device.Download(ctx, t)
}

func (st *rankState) checkDispatch(ctx context.Context, w *World, r int, cnt executor.Counts, x, scales, idx, wts *device.Tensor) (Check, error) {
	xb, err := download(ctx, x)
	if err != nil {
		return Check{}, err
	}
	sb, err := download(ctx, scales)
	if err != nil {
		return Check{}, err
	}
	ib, err := download(ctx, idx)
	if err != nil {
		return Check{}, err
	}
	wb, err := download(ctx, wts)
	if err != nil {
		return Check{}, err
	}
	var wf []float32
	if wb != nil {
		wf = device.DecodeFloat32(device.FP32, wb)
	}
	return w.CheckDispatch(r, cnt.RecvCount, xb, sb, device.DecodeInt32(ib), wf), nil
}

func (st *rankState) checkPermute(ctx context.Context, w *World, r int, cnt executor.Counts, x, scales, wts *device.Tensor) (Check, error) {
	xb, err := download(ctx, x)
	if err != nil {
		return Check{}, err
	}
	sb, err := download(ctx, scales)
	if err != nil {
		return Check{}, err
	}
	wb, err := download(ctx, wts)
	if err != nil {
		return Check{}, err
	}
	var wf []float32
	if wb != nil {
		wf = device.DecodeFloat32(device.FP32, wb)
	}
	return w.CheckPermute(r, st.cfg.Pad, cnt.PermutedCount, xb, sb, wf), nil
}

// checkCombine checks a combined output, which is of the combine dtype
// (st.cworld's).
func (st *rankState) checkCombine(ctx context.Context, r int, out *device.Tensor, unpermuted bool) (Check, error) {
	b, err := download(ctx, out)
	if err != nil {
		return Check{}, err
	}
	return st.cworld.CheckCombine(r, b, unpermuted), nil
}
