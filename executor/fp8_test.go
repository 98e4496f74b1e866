package executor_test

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/goep/goep/device"
	"github.com/goep/goep/executor"
	"github.com/goep/goep/internal/reference"
)

// TestPropertyFP8 checks fp8 dispatch on the host backend against the
// reference model, bit for bit, on genCase's random shapes, routings,
// modes, domains and tuning knobs with Hidden 128 or 256: Dispatch's rows
// and scales, Permute of both, DispatchPermute (equal to Permute of
// Dispatch) and DispatchPermuteInto, every output with its guard bytes.
// fp8 rows and their scales are only moved, so the data is arbitrary
// bytes: every fp8 pattern, and scales with NaN, infinity and subnormal
// bit patterns, which must arrive unchanged.
func TestPropertyFP8(t *testing.T) {
	n := 60
	if testing.Short() {
		n = 15
	}
	for i := range n {
		c := fp8Case(uint64(i + 1))
		t.Run(fmt.Sprintf("seed=%d", c.seed), func(t *testing.T) { checkFP8(t, c) })
	}
}

// fp8Case is genCase(seed) with fp8 rows of 128 or 256 channels.
func fp8Case(seed uint64) *propCase {
	c := genCase(seed)
	c.dt = device.FP8E4M3
	c.H = device.FP8ScaleChannels * (1 + int(seed%2))
	return c
}

// fp8Out is one rank's outputs of the fp8 calls, downloaded.
type fp8Out struct {
	capErr                          error // the layout's capacity error (OverflowError), if any
	recvX, recvIdx, recvW, recvS    []byte
	px, pw, ps                      []byte
	fpx, fpw, fps, fRecvIdx, fRecvW []byte
	ipx, ipw, ips, iRecvIdx, iRecvW []byte
}

func checkFP8(t *testing.T, c *propCase) {
	w := c.world()
	rng := rand.New(rand.NewPCG(c.seed, 8))
	S := c.H / device.FP8ScaleChannels
	w.X, w.Scales = make([][]byte, c.R), make([][]byte, c.R)
	if c.weighted {
		w.Weights = make([][]float32, c.R)
	}
	for r := range c.R {
		T := len(c.idx[r]) / c.K
		w.X[r] = make([]byte, T*c.H)
		for i := range w.X[r] {
			w.X[r][i] = byte(rng.Uint32())
		}
		w.Scales[r] = make([]byte, T*S*4)
		for i := range T * S {
			binary.LittleEndian.PutUint32(w.Scales[r][4*i:], scaleBits(rng))
		}
		if c.weighted {
			w.Weights[r] = make([]float32, T*c.K)
			for i := range w.Weights[r] {
				w.Weights[r][i] = rng.Float32()
			}
		}
	}
	if err := w.Validate(); err != nil {
		t.Fatalf("%v: bad case: %v", c, err)
	}

	outs := make([]*fp8Out, c.R)
	eachRank(t, c, func(r int, e *executor.Engine) error {
		o, err := (&propRank{t: t, e: e, c: c, r: r}).runFP8(w)
		outs[r] = o
		return err
	})

	k := &checker{t: t, c: c}
	for d, o := range outs {
		if o.capErr != nil {
			continue
		}
		recv, recvS := w.Dispatch(d), w.DispatchScales(d)
		k.rows("Dispatch.RecvX", d, device.FP8E4M3, c.H, o.recvX, recv)
		k.rows("Dispatch.RecvScales", d, device.FP32, S, o.recvS, recvS)
		px, pw := w.DispatchPermute(d)
		ps := w.PermuteScales(d, recvS)
		k.rows("Permute.X", d, device.FP8E4M3, c.H, o.px, px)
		k.rows("Permute.Scales", d, device.FP32, S, o.ps, ps)
		k.rows("Permute.Weights", d, device.FP32, 1, o.pw, f32bytes(pw))
		for _, f := range []struct {
			name                    string
			x, w, s, recvIdx, recvW []byte
		}{
			{"DispatchPermute", o.fpx, o.fpw, o.fps, o.fRecvIdx, o.fRecvW},
			{"DispatchPermuteInto", o.ipx, o.ipw, o.ips, o.iRecvIdx, o.iRecvW},
		} {
			k.rows(f.name+".X", d, device.FP8E4M3, c.H, f.x, px)
			k.rows(f.name+".Scales", d, device.FP32, S, f.s, ps)
			k.rows(f.name+".Weights", d, device.FP32, 1, f.w, o.pw)
			k.rows(f.name+".RecvIdx", d, device.Int32, c.K, f.recvIdx, o.recvIdx)
			k.rows(f.name+".RecvWeights", d, device.FP32, c.K, f.recvW, o.recvW)
		}
	}
}

// scaleBits draws an fp32 bit pattern for a scale: mostly ordinary
// positive scales, sometimes zero, subnormal, infinity or a NaN (quiet or
// signalling, with a payload), which moving must not change.
func scaleBits(rng *rand.Rand) uint32 {
	switch rng.IntN(16) {
	case 0:
		return 0
	case 1:
		return uint32(rng.IntN(1 << 23)) // subnormal
	case 2:
		return 0x7f800000 // +inf
	case 3:
		return 0x7f800001 + uint32(rng.IntN(1<<21)) // signalling NaN with a payload
	case 4:
		return 0xffc00000 | uint32(rng.IntN(1<<20)) // negative quiet NaN
	}
	return math.Float32bits(float32(math.Ldexp(1+rng.Float64(), rng.IntN(20)-10)))
}

// runFP8 makes the fp8 calls on one rank and downloads their outputs.
func (p *propRank) runFP8(w *reference.World) (*fp8Out, error) {
	defer func() {
		for _, t := range p.own {
			t.Close()
		}
		p.own = nil
	}()
	ctx := p.t.Context()
	c, r, e := p.c, p.r, p.e
	H, K, S := c.H, c.K, c.H/device.FP8ScaleChannels
	T := len(c.idx[r]) / K
	out := &fp8Out{}

	idx := p.tensor(device.Int32, device.EncodeInt32(c.idx[r]), T, K)
	x := p.tensor(device.FP8E4M3, w.X[r], T, H)
	sx := p.tensor(device.FP32, w.Scales[r], T, S)
	var wt *device.Tensor
	if c.weighted {
		wt = p.tensor(device.FP32, f32bytes(w.Weights[r]), T, K)
	}
	if p.err != nil {
		return nil, p.err
	}
	h, err := e.Layout(ctx, executor.LayoutInput{TopkIdx: idx})
	if !p.check("Layout", err) {
		return nil, p.err
	}
	defer h.Close()
	in := executor.DispatchInput{X: x, TopkWeights: wt, XScales: sx}
	if _, err := h.Counts(ctx); err != nil {
		if !errors.Is(err, executor.ErrCapacityExceeded) {
			return nil, fmt.Errorf("Counts: %w", err)
		}
		// OverflowError: the fp8 dispatch fails the same way, on every rank.
		out.capErr = err
		_, err := e.Dispatch(ctx, h, in)
		if err == nil {
			err = e.Synchronize(ctx)
		}
		if !errors.Is(err, executor.ErrCapacityExceeded) {
			return nil, fmt.Errorf("fp8 Dispatch on an over-capacity handle: got %v, want ErrCapacityExceeded", err)
		}
		return out, nil
	}
	N, P := h.RecvRows(), h.PermutedRows()

	do, err := e.Dispatch(ctx, h, in)
	if !p.check("Dispatch", err) {
		return nil, p.err
	}
	if do.RecvScales == nil || do.RecvX.DType() != device.FP8E4M3 {
		return nil, fmt.Errorf("Dispatch: RecvScales %v, RecvX %v: want fp8 rows with scales", do.RecvScales, do.RecvX)
	}
	po, err := e.Permute(ctx, h, executor.PermuteInput{RecvX: do.RecvX, RecvWeights: do.RecvWeights, RecvScales: do.RecvScales})
	if !p.check("Permute", err) {
		return nil, p.err
	}
	fo, err := e.DispatchPermute(ctx, h, in)
	if !p.check("DispatchPermute", err) {
		return nil, p.err
	}
	into := executor.DispatchPermuteOutput{
		X:       p.tensor(device.FP8E4M3, make([]byte, P*H), P, H),
		RecvIdx: p.tensor(device.Int32, make([]byte, N*K*4), N, K),
		Scales:  p.tensor(device.FP32, make([]byte, P*S*4), P, S),
	}
	if c.weighted {
		into.Weights = p.tensor(device.FP32, make([]byte, P*4), P)
		into.RecvWeights = p.tensor(device.FP32, make([]byte, N*K*4), N, K)
	}
	if p.err != nil {
		return nil, p.err
	}
	if err := e.DispatchPermuteInto(ctx, h, in, into); !p.check("DispatchPermuteInto", err) {
		return nil, p.err
	}
	if err := e.Synchronize(ctx); !p.check("Synchronize", err) {
		return nil, p.err
	}
	out.recvX, out.recvIdx, out.recvW, out.recvS = p.get("Dispatch.RecvX", do.RecvX), p.get("Dispatch.RecvIdx", do.RecvIdx),
		p.get("Dispatch.RecvWeights", do.RecvWeights), p.get("Dispatch.RecvScales", do.RecvScales)
	out.px, out.pw, out.ps = p.get("Permute.X", po.X), p.get("Permute.Weights", po.Weights), p.get("Permute.Scales", po.Scales)
	out.fpx, out.fpw, out.fps = p.get("DispatchPermute.X", fo.X), p.get("DispatchPermute.Weights", fo.Weights), p.get("DispatchPermute.Scales", fo.Scales)
	out.fRecvIdx, out.fRecvW = p.get("DispatchPermute.RecvIdx", fo.RecvIdx), p.get("DispatchPermute.RecvWeights", fo.RecvWeights)
	out.ipx, out.ipw, out.ips = p.get("Into.X", into.X), p.get("Into.Weights", into.Weights), p.get("Into.Scales", into.Scales)
	out.iRecvIdx, out.iRecvW = p.get("Into.RecvIdx", into.RecvIdx), p.get("Into.RecvWeights", into.RecvWeights)
	return out, p.err
}
