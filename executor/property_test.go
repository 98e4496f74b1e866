package executor_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/goep/goep/device"
	"github.com/goep/goep/executor"
	"github.com/goep/goep/internal/ranktest"
	"github.com/goep/goep/internal/reference"
	"github.com/goep/goep/internal/testenv"
)

// Property tests: the engine on the host backend against the naive model of
// DESIGN.md section 2 in internal/reference, on random shapes and routings,
// bit for bit (weight gradients within 1e-5 relative), twice per case, with
// fused == unfused, adjoint identities of the backward calls, and guard
// bytes on every output.
//
// The reference and the engine must not fuse multiply-adds (DESIGN.md: no
// FMA); run with GOAMD64=v3, where the Go compiler may fuse x*y+z, to check.
//
// Reproduce one case with
//
//	go test ./executor -run Property -prop.seed=N
//
// (N as printed in the failure), or more cases with -prop.cases.

var (
	propSeed  = flag.Uint64("prop.seed", 0, "run only the property case with this seed")
	propCases = flag.Int("prop.cases", 0, "number of random property cases (0: 40 with -short, else 200 with GOEP_TEST_FULL=1, else 60)")
)

// propCase is one random configuration and routing.
type propCase struct {
	name     string // fixed cases
	seed     uint64
	R, L, K  int
	D        int // RanksPerDomain (0: one domain)
	H, pad   int
	dt       device.DType
	weighted bool
	mode     executor.Mode
	overflow executor.Overflow
	capR     int // capacity mode: MaxRecvTokens
	capP     int // capacity mode: MaxPermutedTokens
	maxT     int // MaxTokensPerRank
	sms      int // Config.SMs (0: no bound)
	chunk    int // Config.ChunkRows (0: default)
	idx      [][]int32
}

func (c *propCase) String() string {
	s := fmt.Sprintf("seed=%d", c.seed)
	if c.name != "" {
		s = "case " + c.name
	}
	s += fmt.Sprintf(" R=%d E=%d K=%d H=%d pad=%d %v", c.R, c.R*c.L, c.K, c.H, c.pad, c.dt)
	if c.D > 0 && c.D < c.R {
		s += fmt.Sprintf(" D=%d", c.D)
	}
	if c.weighted {
		s += " weighted"
	}
	if c.sms != 0 || c.chunk != 0 {
		s += fmt.Sprintf(" sms=%d chunk=%d", c.sms, c.chunk)
	}
	if c.mode == executor.Capacity {
		s += fmt.Sprintf(" capacity(recv=%d,perm=%d,%v)", c.capR, c.capP, c.overflow)
	}
	T := make([]int, c.R)
	for r := range T {
		T[r] = len(c.idx[r]) / c.K
	}
	return s + fmt.Sprintf(" T=%v", T)
}

// specials reports whether the case's data includes special values
// (subnormals, huge values, NaN and infinity bit patterns); see genInputs.
func (c *propCase) specials() bool { return c.seed%4 == 0 }

// nans reports whether the special values of the case include NaNs in the
// data that is summed (instead of huge values; see genInputs).
func (c *propCase) nans() bool { return c.seed%8 == 4 }

// world is the reference model of the case (without data).
func (c *propCase) world() *reference.World {
	w := &reference.World{NumRanks: c.R, NumExperts: c.R * c.L, TopK: c.K, Hidden: c.H,
		PadMultiple: c.pad, DType: c.dt, TopkIdx: c.idx, RanksPerDomain: c.D}
	if c.mode == executor.Capacity {
		w.MaxRecvTokens, w.MaxPermutedTokens = c.capR, c.capP
	}
	return w
}

func (c *propCase) config() executor.Config {
	cfg := executor.Config{NumExperts: c.R * c.L, TopK: c.K, Hidden: c.H, MaxTokensPerRank: c.maxT,
		PadMultiple: c.pad, Mode: c.mode, Overflow: c.overflow, Timeout: 30 * time.Second, RanksPerDomain: c.D,
		SMs: c.sms, ChunkRows: c.chunk}
	if c.mode == executor.Capacity {
		cfg.MaxRecvTokens, cfg.MaxPermutedTokens = c.capR, c.capP
	}
	return cfg
}

// genCase draws a case. Sizes are bounded so that the elements moved per
// case stay in the hundreds of thousands.
func genCase(seed uint64) *propCase {
	rng := rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15))
	c := &propCase{seed: seed}
	c.R = 1 + rng.IntN(16)
	switch maxL := 1024 / c.R; {
	case rng.IntN(6) == 0:
		c.L = maxL // E up to 1024
	default:
		c.L = 1 + rng.IntN(min(8, maxL))
	}
	E := c.R * c.L
	c.K = 1 + rng.IntN(min(16, E))
	hs := []int{1, 2, 3, 7, 8, 31, 64, 127, 128, 255, 300}
	if rng.IntN(3) == 0 {
		c.H = 1 + rng.IntN(300)
	} else {
		c.H = hs[rng.IntN(len(hs))]
	}
	c.pad = []int{1, 16, 128}[rng.IntN(3)]
	c.dt = []device.DType{device.BF16, device.FP32}[rng.IntN(2)]
	c.weighted = rng.IntN(2) == 0

	// Tokens per rank: ragged, some ranks empty; the total bounded by the
	// element budget.
	budget := 400_000 / (c.H * c.R)
	tmax := max(1, min(200, budget))
	for range c.R {
		T := 0
		if rng.IntN(5) != 0 {
			T = rng.IntN(tmax + 1)
		}
		c.maxT = max(c.maxT, T)
		c.idx = append(c.idx, genRouting(rng, T, E, c.K, c.R))
	}
	c.maxT += rng.IntN(3)

	if rng.IntN(2) == 0 {
		c.mode = executor.Capacity
		maxN, maxP := 0, 0
		w := c.world()
		for d := range c.R {
			lay := w.Layout(d)
			maxN, maxP = max(maxN, lay.RecvCount), max(maxP, lay.PermutedCount)
		}
		switch rng.IntN(5) {
		case 0, 1: // ample
			c.capR, c.capP = maxN+rng.IntN(5)+1, maxP+rng.IntN(5)+1
		case 2, 3: // tight, drop
			c.overflow = executor.OverflowDrop
			c.capR, c.capP = 1+rng.IntN(maxN+1), 1+rng.IntN(maxP+1)
		default: // tight, error
			c.overflow = executor.OverflowError
			c.capR, c.capP = 1+rng.IntN(maxN+1), 1+rng.IntN(maxP+1)
		}
	}
	// Several NVLink domains in half of the cases (drawn last, so the draws
	// above are those of one domain): D is a proper divisor of R.
	if rng.IntN(2) == 0 {
		var divs []int
		for d := 1; d < c.R; d++ {
			if c.R%d == 0 {
				divs = append(divs, d)
			}
		}
		if len(divs) > 0 {
			c.D = divs[rng.IntN(len(divs))]
		}
	}
	// The tuning knobs in a third of the cases (drawn after D): the
	// results must not depend on them.
	if rng.IntN(3) == 0 {
		c.sms = rng.IntN(4)
		c.chunk = []int{0, 1, 3, 64}[rng.IntN(4)]
	}
	return c
}

// genRouting draws T rows of K slots over E experts: some rows routed
// nowhere, some partly empty, and often a hot subset of experts (so that a
// token picks several experts of one rank).
func genRouting(rng *rand.Rand, T, E, K, R int) []int32 {
	idx := make([]int32, T*K)
	var hot []int
	if rng.IntN(2) == 0 {
		hot = rng.Perm(E)[:min(E, K+rng.IntN(2*K+1))]
	}
	for t := range T {
		row := idx[t*K : (t+1)*K]
		for k := range row {
			row[k] = -1
		}
		m := K
		switch rng.IntN(10) {
		case 0:
			m = 0
		case 1, 2, 3:
			m = rng.IntN(K + 1)
		}
		slots := rng.Perm(K)[:m]
		for _, k := range slots {
			for {
				var e int
				if hot != nil && rng.IntN(4) != 0 {
					e = hot[rng.IntN(len(hot))]
				} else {
					e = rng.IntN(E)
				}
				if !containsInt32(row, int32(e)) {
					row[k] = int32(e)
					break
				}
			}
		}
	}
	return idx
}

func containsInt32(s []int32, v int32) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// propInputs is every rank's data for one case.
type propInputs struct {
	x     [][]byte    // [T, H]: element 0 = source rank, 1 = token, rest random
	w     [][]float32 // [T, K] or nil
	y     [][]byte    // [permRows, H]: random; padding and dropped rows garbage
	z     [][]byte    // [recvRows, H]: random; rows past the valid prefix garbage
	gzw   [][]float32 // [recvRows, K] random (GradRecvWeights), or nil
	gout  [][]byte    // [T, H] random (CombineBackward's gradient)
	xRows map[string][2]int
}

// garbage is what rows outside the valid data hold: huge, so that a sum that
// wrongly includes one is obviously wrong, finite, so that adjoint dot
// products with zero rows stay zero.
const garbage = 1e30

func genInputs(c *propCase, w *reference.World) *propInputs {
	rng := rand.New(rand.NewPCG(c.seed, 12345))
	in := &propInputs{xRows: map[string][2]int{}}
	H, K := c.H, c.K
	// One case in four also has special values: subnormals (which neither
	// side may flush), the smallest normals, and either values near the top
	// of the range whose sums may overflow to infinity or (c.nans) a
	// signalling NaN, which sums must quiet as the reference does; and, in
	// bf16, NaN and infinity bit patterns in x, which data movement must
	// copy unchanged. A case holds one NaN pattern only, so that which
	// operand's payload an addition propagates cannot matter.
	specials, nans := c.specials(), c.nans()
	rnd := func() float32 {
		switch rng.IntN(12) {
		case 0:
			return float32(math.Copysign(0, -1)) // -0 must survive sums of -0
		case 1:
			return 0
		}
		if specials && rng.IntN(20) == 0 {
			sign := float64(1 - 2*rng.IntN(2))
			switch rng.IntN(3) {
			case 0:
				return float32(sign * math.Ldexp(1+rng.Float64(), -130-rng.IntN(10))) // subnormal
			case 1:
				return float32(sign * math.Ldexp(1+rng.Float64(), -126)) // smallest normals
			default:
				if nans {
					return float32(math.NaN()) // replaced by the case's NaN pattern below
				}
				return float32(sign * math.Ldexp(1+rng.Float64()/2, 126)) // near the top
			}
		}
		return float32(rng.NormFloat64() * math.Ldexp(1, rng.IntN(9)-4))
	}
	randRows := func(rows, valid int, valOK func(r int) bool) []byte {
		v := make([]float32, rows*H)
		for r := range rows {
			for j := range H {
				if r < valid && (valOK == nil || valOK(r)) {
					v[r*H+j] = rnd()
				} else {
					v[r*H+j] = float32(garbage * float64(1+j%3))
				}
			}
		}
		b := device.EncodeFloat32(c.dt, v)
		for i, f := range v {
			if f != f { // the signalling NaN, which encoding would quiet
				if c.dt == device.BF16 {
					b[2*i], b[2*i+1] = 0x81, 0x7f // 0x7f81
				} else {
					b[4*i], b[4*i+1], b[4*i+2], b[4*i+3] = 0x01, 0x00, 0x80, 0x7f // 0x7f800001
				}
			}
		}
		return b
	}
	for s := range c.R {
		T := len(c.idx[s]) / K
		v := make([]float32, T*H)
		for t := range T {
			for j := range H {
				switch j {
				case 0:
					v[t*H] = float32(s)
				case 1:
					v[t*H+1] = float32(t)
				default:
					v[t*H+j] = rnd()
				}
			}
		}
		xs := device.EncodeFloat32(c.dt, v)
		if specials && c.dt == device.BF16 {
			for i := range T * H {
				if i%H >= 2 && rng.IntN(20) == 0 {
					bits := []uint16{0x7f81, 0xffc1, 0x7fc0, 0x7f80, 0xff80, 0x0001}[rng.IntN(6)]
					xs[2*i], xs[2*i+1] = byte(bits), byte(bits>>8)
				}
			}
		}
		in.x = append(in.x, xs)
		rb := H * c.dt.Size()
		for t := range T {
			in.xRows[string(in.x[s][t*rb:(t+1)*rb])] = [2]int{s, t}
		}
		if c.weighted {
			wt := make([]float32, T*K)
			for i := range wt {
				wt[i] = rng.Float32()
			}
			in.w = append(in.w, wt)
		}
		in.gout = append(in.gout, randRows(T, T, nil))
	}
	if c.weighted {
		in.gzw = make([][]float32, c.R)
	}
	for d := range c.R {
		lay := w.Layout(d)
		N, P := w.RecvRows(lay), w.PermutedRows(lay)
		valid := lay.RecvCount
		if c.mode == executor.Capacity {
			valid = min(valid, c.capR)
		}
		// y: random where some slot lands, garbage on padding.
		used := make([]bool, P)
		for _, p := range lay.Pos {
			if p >= 0 && int(p) < P {
				used[p] = true
			}
		}
		in.y = append(in.y, randRows(P, P, func(r int) bool { return used[r] }))
		in.z = append(in.z, randRows(N, valid, nil))
		if c.weighted {
			gw := make([]float32, N*K)
			for i := range gw {
				if i < valid*K {
					gw[i] = rng.Float32()*2 - 1
				} else {
					gw[i] = garbage
				}
			}
			in.gzw[d] = gw
		}
	}
	return in
}

// propOut is what one rank's engine returned, downloaded.
type propOut struct {
	counts                          executor.Counts
	countsErr                       error
	recvX, recvIdx, recvW           []byte
	px, pw                          []byte
	fpx, fpw, fRecvIdx, fRecvW      []byte
	unperm, combU, fused, combZ     []byte
	gradX, gradTW, combBack, permBk []byte
	gradY, gradW                    []byte
}

// fields lists the outputs by name, for run-to-run comparison.
func (o *propOut) fields() map[string][]byte {
	return map[string][]byte{
		"RecvX": o.recvX, "RecvIdx": o.recvIdx, "RecvWeights": o.recvW, "Permute.X": o.px, "Permute.Weights": o.pw,
		"DispatchPermute.X": o.fpx, "DispatchPermute.Weights": o.fpw, "DispatchPermute.RecvIdx": o.fRecvIdx,
		"DispatchPermute.RecvWeights": o.fRecvW, "Unpermute": o.unperm, "Combine(Unpermute)": o.combU,
		"UnpermuteCombine": o.fused, "Combine(z)": o.combZ, "DispatchBackward.GradX": o.gradX,
		"DispatchBackward.GradTopkWeights": o.gradTW, "CombineBackward": o.combBack, "PermuteBackward": o.permBk,
		"UnpermuteBackward.GradY": o.gradY, "UnpermuteBackward.GradWeights": o.gradW,
	}
}

// propRank runs the whole sequence of calls on one rank and downloads every
// output, checking its guard bytes.
type propRank struct {
	t   *testing.T
	e   *executor.Engine
	c   *propCase
	in  *propInputs
	r   int
	err error
	own []*device.Tensor
	// decoy makes run interleave calls on a second handle (another routing).
	decoy bool
}

func (p *propRank) tensor(dt device.DType, data []byte, shape ...int) *device.Tensor {
	if p.err != nil {
		return nil
	}
	t, err := p.e.NewTensor(dt, shape...)
	if err != nil {
		p.err = fmt.Errorf("new tensor %v%v: %w", dt, shape, err)
		return nil
	}
	p.own = append(p.own, t)
	if err := device.Upload(p.t.Context(), t, data); err != nil {
		p.err = fmt.Errorf("upload %v%v: %w", dt, shape, err)
	}
	return t
}

// get downloads an output (nil for a nil tensor) and checks its guards.
func (p *propRank) get(name string, t *device.Tensor) []byte {
	if p.err != nil || t == nil {
		return nil
	}
	b, err := device.Download(p.t.Context(), t)
	if err != nil {
		p.err = fmt.Errorf("%s: %w", name, err)
		return nil
	}
	if err := t.CheckGuards(); err != nil {
		p.err = fmt.Errorf("%s: %w", name, err)
	}
	p.own = append(p.own, t)
	return b
}

func (p *propRank) check(op string, err error) bool {
	if p.err == nil && err != nil {
		p.err = fmt.Errorf("%s: %w", op, err)
	}
	return p.err == nil
}

func f32bytes(v []float32) []byte {
	if v == nil {
		return nil
	}
	return device.EncodeFloat32(device.FP32, v)
}

// run makes every call once. Capacity errors (OverflowError) end the run
// after the layout's counts.
func (p *propRank) run() (*propOut, error) {
	defer func() {
		for _, t := range p.own {
			t.Close()
		}
		p.own = nil
	}()
	ctx := p.t.Context()
	c, in, r, e := p.c, p.in, p.r, p.e
	H, K := c.H, c.K
	T := len(c.idx[r]) / K
	out := &propOut{}

	idx := p.tensor(device.Int32, device.EncodeInt32(c.idx[r]), T, K)
	if p.err != nil {
		return nil, p.err
	}
	// The decoy (blocking mode, second run): another routing's handle, made
	// before this one and used between its calls, must not disturb it.
	var decoy *executor.Handle
	if p.decoy {
		E := int32(c.R * c.L)
		shifted := make([]int32, len(c.idx[r]))
		for i, v := range c.idx[r] {
			shifted[i] = -1
			if v >= 0 {
				shifted[i] = (v + 1) % E
			}
		}
		didx := p.tensor(device.Int32, device.EncodeInt32(shifted), T, K)
		if p.err != nil {
			return nil, p.err
		}
		var err error
		if decoy, err = e.Layout(ctx, executor.LayoutInput{TopkIdx: didx}); !p.check("decoy Layout", err) {
			return nil, p.err
		}
		defer decoy.Close()
	}
	h, err := e.Layout(ctx, executor.LayoutInput{TopkIdx: idx})
	if !p.check("Layout", err) {
		return nil, p.err
	}
	defer h.Close()
	out.counts, out.countsErr = h.Counts(ctx)
	if out.countsErr != nil {
		if errors.Is(out.countsErr, executor.ErrCapacityExceeded) {
			// Every later call on the handle must fail the same way.
			x := p.tensor(c.dt, in.x[r], T, H)
			_, err := e.Dispatch(ctx, h, executor.DispatchInput{X: x})
			if err == nil {
				err = e.Synchronize(ctx)
			}
			if !errors.Is(err, executor.ErrCapacityExceeded) {
				return out, fmt.Errorf("Dispatch on an over-capacity handle (OverflowError): got %v, want ErrCapacityExceeded", err)
			}
		}
		return out, p.err
	}
	N, P := h.RecvRows(), h.PermutedRows()

	x := p.tensor(c.dt, in.x[r], T, H)
	var w *device.Tensor
	if c.weighted {
		w = p.tensor(device.FP32, f32bytes(in.w[r]), T, K)
	}
	if p.err != nil {
		return nil, p.err
	}

	// Forward.
	do, err := e.Dispatch(ctx, h, executor.DispatchInput{X: x, TopkWeights: w})
	if !p.check("Dispatch", err) {
		return nil, p.err
	}
	if decoy != nil {
		dd, err := e.Dispatch(ctx, decoy, executor.DispatchInput{X: x, TopkWeights: w})
		if !p.check("decoy Dispatch", err) {
			return nil, p.err
		}
		dc, err := e.Combine(ctx, decoy, executor.CombineInput{Z: dd.RecvX})
		if !p.check("decoy Combine", err) {
			return nil, p.err
		}
		p.own = append(p.own, dd.RecvX, dd.RecvIdx, dd.RecvWeights, dc)
	}
	out.recvX, out.recvIdx, out.recvW = p.get("Dispatch.RecvX", do.RecvX), p.get("Dispatch.RecvIdx", do.RecvIdx), p.get("Dispatch.RecvWeights", do.RecvWeights)
	if (do.RecvWeights != nil) != c.weighted {
		return nil, fmt.Errorf("Dispatch: RecvWeights present=%v for weighted=%v", do.RecvWeights != nil, c.weighted)
	}

	po, err := e.Permute(ctx, h, executor.PermuteInput{RecvX: do.RecvX, RecvWeights: do.RecvWeights})
	if !p.check("Permute", err) {
		return nil, p.err
	}
	out.px, out.pw = p.get("Permute.X", po.X), p.get("Permute.Weights", po.Weights)

	fo, err := e.DispatchPermute(ctx, h, executor.DispatchInput{X: x, TopkWeights: w})
	if !p.check("DispatchPermute", err) {
		return nil, p.err
	}
	out.fpx, out.fpw = p.get("DispatchPermute.X", fo.X), p.get("DispatchPermute.Weights", fo.Weights)
	out.fRecvIdx, out.fRecvW = p.get("DispatchPermute.RecvIdx", fo.RecvIdx), p.get("DispatchPermute.RecvWeights", fo.RecvWeights)

	y := p.tensor(c.dt, in.y[r], P, H)
	z := p.tensor(c.dt, in.z[r], N, H)
	var gzw *device.Tensor
	if c.weighted {
		gzw = p.tensor(device.FP32, f32bytes(in.gzw[r]), N, K)
	}
	gout := p.tensor(c.dt, in.gout[r], T, H)
	if p.err != nil {
		return nil, p.err
	}

	u, err := e.Unpermute(ctx, h, executor.UnpermuteInput{Y: y, RecvWeights: do.RecvWeights})
	if !p.check("Unpermute", err) {
		return nil, p.err
	}
	cu, err := e.Combine(ctx, h, executor.CombineInput{Z: u})
	if !p.check("Combine(Unpermute)", err) {
		return nil, p.err
	}
	fu, err := e.UnpermuteCombine(ctx, h, executor.UnpermuteInput{Y: y, RecvWeights: do.RecvWeights})
	if !p.check("UnpermuteCombine", err) {
		return nil, p.err
	}
	cz, err := e.Combine(ctx, h, executor.CombineInput{Z: z})
	if !p.check("Combine(z)", err) {
		return nil, p.err
	}

	// Backward.
	db, err := e.DispatchBackward(ctx, h, executor.DispatchBackwardInput{GradRecvX: z, GradRecvWeights: gzw})
	if !p.check("DispatchBackward", err) {
		return nil, p.err
	}
	cb, err := e.CombineBackward(ctx, h, gout)
	if !p.check("CombineBackward", err) {
		return nil, p.err
	}
	pb, err := e.PermuteBackward(ctx, h, y)
	if !p.check("PermuteBackward", err) {
		return nil, p.err
	}
	ub, err := e.UnpermuteBackward(ctx, h, executor.UnpermuteBackwardInput{GradOut: z, Y: y, RecvWeights: do.RecvWeights})
	if !p.check("UnpermuteBackward", err) {
		return nil, p.err
	}
	if err := e.Synchronize(ctx); !p.check("Synchronize", err) {
		return nil, p.err
	}
	out.unperm, out.combU, out.fused, out.combZ = p.get("Unpermute", u), p.get("Combine(Unpermute)", cu), p.get("UnpermuteCombine", fu), p.get("Combine(z)", cz)
	out.gradX, out.gradTW = p.get("DispatchBackward.GradX", db.GradX), p.get("DispatchBackward.GradTopkWeights", db.GradTopkWeights)
	out.combBack, out.permBk = p.get("CombineBackward", cb), p.get("PermuteBackward", pb)
	out.gradY, out.gradW = p.get("UnpermuteBackward.GradY", ub.GradY), p.get("UnpermuteBackward.GradWeights", ub.GradWeights)
	return out, p.err
}

// runEngine runs the case on R in-process ranks, twice on each engine (two
// layouts of the same routing), and returns both runs' outputs.
func runEngine(t *testing.T, c *propCase, in *propInputs) (first, second []*propOut) {
	first, second = make([]*propOut, c.R), make([]*propOut, c.R)
	eachRank(t, c, func(r int, e *executor.Engine) error {
		for run, dst := range [][]*propOut{first, second} {
			p := &propRank{t: t, e: e, c: c, in: in, r: r, decoy: run == 1 && c.mode == executor.Blocking}
			o, err := p.run()
			if err != nil {
				return fmt.Errorf("run %d: %w", run+1, err)
			}
			dst[r] = o
		}
		return nil
	})
	return first, second
}

// eachRank runs fn on each of the case's R in-process ranks, each with an
// engine of the case's config on one host backend, and fails the test
// with the ranks' errors.
func eachRank(t *testing.T, c *propCase, fn func(r int, e *executor.Engine) error) {
	t.Helper()
	errs := executor.RunEngines(t, c.R, c.config(), func(ctx context.Context, e *executor.Engine) error {
		return fn(e.Rank(), e)
	})
	if err := ranktest.Err(errs); err != nil {
		t.Fatalf("%v: %v", c, err)
	}
}

// checker compares outputs and reports the first mismatch of each.
type checker struct {
	t    *testing.T
	c    *propCase
	in   *propInputs
	fail int
}

func (k *checker) errorf(format string, args ...any) {
	k.t.Helper()
	k.fail++
	if k.fail <= 20 {
		k.t.Errorf("%v: "+format, append([]any{k.c}, args...)...)
	}
}

// rows compares two row-major tensors of dtype dt and cols columns bit for
// bit and reports the first differing element by rank, row and column.
func (k *checker) rows(what string, rank int, dt device.DType, cols int, got, want []byte) {
	k.t.Helper()
	if len(got) != len(want) {
		k.errorf("rank %d %s: %d bytes (%d rows), want %d (%d rows)", rank, what, len(got), len(got)/max(1, cols*dt.Size()), len(want), len(want)/max(1, cols*dt.Size()))
		return
	}
	if bytes.Equal(got, want) {
		return
	}
	es := dt.Size()
	for i := 0; i < len(got); i += es {
		if bytes.Equal(got[i:i+es], want[i:i+es]) {
			continue
		}
		e := i / es
		row, col := e/cols, e%cols
		var g, w string
		switch dt {
		case device.Int32:
			g, w = fmt.Sprint(device.DecodeInt32(got[i : i+4])[0]), fmt.Sprint(device.DecodeInt32(want[i : i+4])[0])
		case device.FP8E4M3:
			g, w = fmt.Sprintf("0x%02x", got[i]), fmt.Sprintf("0x%02x", want[i])
		default:
			gv, wv := device.LoadFloat32(dt, got, e), device.LoadFloat32(dt, want, e)
			if dt == device.BF16 {
				g, w = fmt.Sprintf("%v (0x%04x)", gv, binary.LittleEndian.Uint16(got[i:])), fmt.Sprintf("%v (0x%04x)", wv, binary.LittleEndian.Uint16(want[i:]))
			} else {
				g, w = fmt.Sprintf("%v (0x%08x)", gv, math.Float32bits(gv)), fmt.Sprintf("%v (0x%08x)", wv, math.Float32bits(wv))
			}
		}
		rb := cols * es
		note := ""
		if dt == k.c.dt && cols == k.c.H && k.in != nil && (row+1)*rb <= len(got) {
			if st, ok := k.in.xRows[string(got[row*rb:(row+1)*rb])]; ok {
				note = fmt.Sprintf("; the row got is x of rank %d token %d", st[0], st[1])
			}
			if st, ok := k.in.xRows[string(want[row*rb:(row+1)*rb])]; ok {
				note += fmt.Sprintf("; the row wanted is x of rank %d token %d", st[0], st[1])
			}
		}
		k.errorf("rank %d %s: row %d col %d: got %s, want %s%s", rank, what, row, col, g, w, note)
		return
	}
}

func (k *checker) same(what string, rank int, got, want []byte) {
	k.t.Helper()
	if !bytes.Equal(got, want) {
		i := 0
		for i < min(len(got), len(want)) && got[i] == want[i] {
			i++
		}
		k.errorf("rank %d: %s differ (%d vs %d bytes; first difference at byte %d, row %d for Hidden-wide %v rows)",
			rank, what, len(got), len(want), i, i/(k.c.H*k.c.dt.Size()), k.c.dt)
	}
}

// close reports |got - want| > tol.
func (k *checker) close(what string, got, want, tol float64) {
	k.t.Helper()
	if math.Abs(got-want) > tol || math.IsNaN(got) != math.IsNaN(want) {
		k.errorf("%s: got %.17g, want %.17g (tolerance %.3g)", what, got, want, tol)
	}
}

func absDot(dt device.DType, a, b []byte) float64 {
	var s float64
	for i := range len(a) / dt.Size() {
		s += math.Abs(float64(device.LoadFloat32(dt, a, i)) * float64(device.LoadFloat32(dt, b, i)))
	}
	return s
}

// fixedCases are the edges, run before the random cases: the example of
// docs/EXAMPLE.md in every mode, no tokens anywhere, no token routed
// anywhere, every token to every expert, the widest group, one rank.
func fixedCases() []*propCase {
	example := [][]int32{{1, 4, 5, 2, -1, -1}, {3, 0, -1, 7}, {}, {4, 5, 2, 1, 6, 0}}
	ex := func(name string, dt device.DType, pad int, mode executor.Mode, ov executor.Overflow, capR, capP int) *propCase {
		return &propCase{name: name, seed: 1_000_001, R: 4, L: 2, K: 2, H: 2, pad: pad, dt: dt, weighted: true,
			mode: mode, overflow: ov, capR: capR, capP: capP, maxT: 3, idx: example}
	}
	routing := func(R, T, K int, f func(r, t, k int) int32) [][]int32 {
		idx := make([][]int32, R)
		for r := range R {
			for t := range T {
				for k := range K {
					idx[r] = append(idx[r], f(r, t, k))
				}
			}
		}
		return idx
	}
	everyExpert := routing(4, 5, 8, func(r, t, k int) int32 { return int32((k + t + r) % 8) })
	everyExpert[2] = nil
	nowhere := routing(4, 5, 3, func(r, t, k int) int32 { return -1 })
	nowhere[1] = nowhere[1][:3]
	wide := &propCase{name: "widest", seed: 1_000_002, R: 16, L: 64, K: 16, H: 1, pad: 128, dt: device.BF16, weighted: true, maxT: 40}
	rng := rand.New(rand.NewPCG(7, 7))
	for range 16 {
		wide.idx = append(wide.idx, genRouting(rng, 1+rng.IntN(40), 1024, 16, 16))
	}
	return []*propCase{
		ex("example", device.FP32, 1, executor.Blocking, 0, 0, 0),
		ex("example pad 4", device.BF16, 4, executor.Blocking, 0, 0, 0),
		ex("example capacity", device.FP32, 4, executor.Capacity, executor.OverflowError, 4, 8),
		ex("example drop", device.FP32, 4, executor.Capacity, executor.OverflowDrop, 3, 5),
		ex("example error", device.BF16, 4, executor.Capacity, executor.OverflowError, 3, 5),
		{name: "no tokens", seed: 1_000_003, R: 3, L: 2, K: 2, H: 5, pad: 16, dt: device.BF16, weighted: true, maxT: 4, idx: make([][]int32, 3)},
		{name: "no tokens capacity", seed: 1_000_004, R: 3, L: 2, K: 2, H: 5, pad: 16, dt: device.FP32, mode: executor.Capacity, capR: 2, capP: 3, maxT: 4, idx: make([][]int32, 3)},
		{name: "routed nowhere", seed: 1_000_005, R: 4, L: 1, K: 3, H: 3, pad: 1, dt: device.FP32, weighted: true, maxT: 5, idx: nowhere},
		{name: "every expert", seed: 1_000_006, R: 4, L: 2, K: 8, H: 9, pad: 16, dt: device.FP32, weighted: true, maxT: 5, idx: everyExpert},
		wide,
		withD(ex("example two domains", device.BF16, 4, executor.Blocking, 0, 0, 0), 2),
		withD(ex("example four domains", device.FP32, 1, executor.Blocking, 0, 0, 0), 1),
		withD(ex("example two domains drop", device.BF16, 4, executor.Capacity, executor.OverflowDrop, 3, 5), 2),
		withD(ex("example two domains error", device.FP32, 4, executor.Capacity, executor.OverflowError, 3, 5), 2),
		withD(&propCase{name: "every expert two domains", seed: 1_000_008, R: 4, L: 2, K: 8, H: 9, pad: 16, dt: device.BF16, weighted: true, maxT: 5, idx: everyExpert}, 2),
		withD(&propCase{name: "routed nowhere two domains", seed: 1_000_009, R: 4, L: 1, K: 3, H: 3, pad: 1, dt: device.FP32, weighted: true, maxT: 5, idx: nowhere}, 2),
		{name: "one rank", seed: 1_000_007, R: 1, L: 3, K: 2, H: 4, pad: 1, dt: device.BF16, weighted: true, maxT: 4, idx: [][]int32{{0, 2, -1, 1, 2, 0, -1, -1}}},
	}
}

// withD sets a fixed case's RanksPerDomain.
func withD(c *propCase, d int) *propCase {
	c.D = d
	return c
}

func TestPropertyEngine(t *testing.T) {
	n := *propCases
	switch {
	case n > 0:
	case testing.Short():
		n = 40
	case testenv.Full(t):
		n = 200
	default:
		n = 60
	}
	seeds := make([]uint64, n)
	for i := range seeds {
		seeds[i] = uint64(i + 1)
	}
	if *propSeed != 0 {
		seeds = []uint64{*propSeed}
	}
	if *propSeed == 0 {
		for _, c := range fixedCases() {
			t.Run(c.name, func(t *testing.T) { checkCase(t, c) })
		}
	}
	for _, seed := range seeds {
		c := genCase(seed)
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			checkCase(t, c)
		})
	}
}

func checkCase(t *testing.T, c *propCase) {
	w := c.world()
	if err := w.Validate(); err != nil {
		t.Fatalf("%v: bad case: %v", c, err)
	}
	in := genInputs(c, w)
	w.X, w.Weights = in.x, in.w
	first, second := runEngine(t, c, in)
	k := &checker{t: t, c: c, in: in}

	// Run to run: every output bit-identical.
	for r := range c.R {
		a, b := first[r].fields(), second[r].fields()
		for name, v := range a {
			k.same(name+" of run 1 and run 2", r, v, b[name])
		}
	}
	// And independent of the host's parallelism (how rows are split over
	// workers): every third case runs again on new engines under another
	// GOMAXPROCS.
	if c.seed%3 == 0 {
		procs := runtime.GOMAXPROCS(0)
		other := 5
		if procs == other {
			other = 1
		}
		runtime.GOMAXPROCS(other)
		third, _ := runEngine(t, c, in)
		runtime.GOMAXPROCS(procs)
		for r := range c.R {
			a, b := first[r].fields(), third[r].fields()
			for name, v := range a {
				k.same(fmt.Sprintf("%s under GOMAXPROCS %d and %d", name, procs, other), r, v, b[name])
			}
		}
	}

	lays := make([]reference.RankLayout, c.R)
	var overRanks []int
	for d := range c.R {
		lays[d] = w.Layout(d)
		if c.mode == executor.Capacity && (lays[d].RecvCount > c.capR || lays[d].PermutedCount > c.capP) {
			overRanks = append(overRanks, d)
		}
	}
	over := len(overRanks) > 0

	// Counts, and the OverflowError policy.
	for d, o := range first {
		lay := lays[d]
		if c.mode == executor.Capacity && c.overflow == executor.OverflowError && over {
			var ce *executor.CapacityError
			if !errors.As(o.countsErr, &ce) {
				k.errorf("rank %d: Counts error %v, want a *CapacityError (ranks %v are over capacity)", d, o.countsErr, overRanks)
			} else if fmt.Sprint(ce.Ranks) != fmt.Sprint(overRanks) {
				k.errorf("rank %d: CapacityError names ranks %v, want %v", d, ce.Ranks, overRanks)
			}
			continue
		}
		if o.countsErr != nil {
			k.errorf("rank %d: Counts: %v", d, o.countsErr)
			continue
		}
		wantOver := c.mode == executor.Capacity && (lay.RecvCount > c.capR || lay.PermutedCount > c.capP)
		if o.counts.RecvCount != lay.RecvCount || o.counts.PermutedCount != lay.PermutedCount ||
			fmt.Sprint(o.counts.TokensPerExpert) != fmt.Sprint(lay.TokensPerExpert) || o.counts.Overflow != wantOver {
			k.errorf("rank %d: Counts %+v, want RecvCount %d PermutedCount %d TokensPerExpert %v Overflow %v",
				d, o.counts, lay.RecvCount, lay.PermutedCount, lay.TokensPerExpert, wantOver)
		}
	}
	if k.fail > 0 {
		return
	}
	if c.mode == executor.Capacity && c.overflow == executor.OverflowError && over {
		if testing.Verbose() {
			t.Logf("%v: ok (over capacity: every rank reports ErrCapacityExceeded)", c)
		}
		return
	}

	dt, H, K := c.dt, c.H, c.K
	var rw [][]float32
	if c.weighted {
		rw = make([][]float32, c.R)
	}
	u := make([][]byte, c.R)
	for d, o := range first {
		lay := lays[d]
		N := w.RecvRows(lay)
		valid := min(lay.RecvCount, N)
		// Dispatch.
		k.rows("Dispatch.RecvX", d, dt, H, o.recvX, w.Dispatch(d))
		wantIdx := make([]int32, N*K)
		for i := range wantIdx {
			wantIdx[i] = -1
		}
		copy(wantIdx, lay.RecvIdx[:valid*K])
		k.rows("Dispatch.RecvIdx", d, device.Int32, K, o.recvIdx, device.EncodeInt32(wantIdx))
		if c.weighted {
			rw[d] = make([]float32, N*K)
			copy(rw[d], lay.RecvWeights[:valid*K])
			k.rows("Dispatch.RecvWeights", d, device.FP32, K, o.recvW, f32bytes(rw[d]))
		}
		var rwd []float32
		if rw != nil {
			rwd = rw[d]
		}
		// Permute, fused and not.
		px, pw := w.Permute(d, w.Dispatch(d), rwd)
		k.rows("Permute.X", d, dt, H, o.px, px)
		k.rows("Permute.Weights", d, device.FP32, 1, o.pw, f32bytes(pw))
		k.same("DispatchPermute.X and Permute(Dispatch).X", d, o.fpx, o.px)
		k.same("DispatchPermute.Weights and Permute(Dispatch).Weights", d, o.fpw, o.pw)
		k.same("DispatchPermute.RecvIdx and Dispatch.RecvIdx", d, o.fRecvIdx, o.recvIdx)
		k.same("DispatchPermute.RecvWeights and Dispatch.RecvWeights", d, o.fRecvW, o.recvW)
		// Unpermute.
		u[d] = w.Unpermute(d, in.y[d], rwd)
		k.rows("Unpermute", d, dt, H, o.unperm, u[d])
		// Backward, local.
		k.rows("PermuteBackward", d, dt, H, o.permBk, w.PermuteBackward(d, in.y[d]))
		k.rows("CombineBackward", d, dt, H, o.combBack, w.CombineBackward(d, in.gout))
		gy, gw := w.UnpermuteBackward(d, in.z[d], in.y[d], rwd)
		k.rows("UnpermuteBackward.GradY", d, dt, H, o.gradY, gy)
		if !c.weighted {
			if o.gradW != nil {
				k.errorf("rank %d: UnpermuteBackward.GradWeights returned for an unweighted forward", d)
			}
		} else if got := device.DecodeFloat32(device.FP32, o.gradW); len(got) != len(gw) {
			k.errorf("rank %d: UnpermuteBackward.GradWeights has %d values, want %d", d, len(got), len(gw))
		} else {
			for i := range got {
				// Within 1e-5 relative of the fp64 dot product (plus the
				// fp64 summation error bound of any order).
				ad := 0.0
				if i < valid*K {
					if p := int(lay.Pos[i]); p >= 0 && p < w.PermutedRows(lay) {
						rb := H * dt.Size()
						ad = absDot(dt, in.z[d][i/K*rb:(i/K+1)*rb], in.y[d][p*rb:(p+1)*rb])
					}
				}
				tol := 1e-5*math.Abs(float64(gw[i])) + 1e-12*ad
				if g, w := float64(got[i]), float64(gw[i]); math.Abs(g-w) > tol || math.IsNaN(g) != math.IsNaN(w) || math.IsInf(w, 0) && g != w {
					k.errorf("rank %d UnpermuteBackward.GradWeights: row %d col %d: got %v, want %v (tolerance %.3g)", d, i/K, i%K, got[i], gw[i], tol)
					break
				}
			}
		}
	}

	// Collective results on each source rank.
	combU := w.Combine(u)
	combZ := w.Combine(in.z)
	gradX, gradTW := w.DispatchBackward(in.z, in.gzw)
	fusedRef := w.UnpermuteCombine(in.y, rw)
	for s, o := range first {
		k.rows("Combine(Unpermute)", s, dt, H, o.combU, combU[s])
		k.rows("UnpermuteCombine", s, dt, H, o.fused, fusedRef[s])
		k.same("UnpermuteCombine and Combine(Unpermute)", s, o.fused, o.combU)
		k.rows("Combine(z)", s, dt, H, o.combZ, combZ[s])
		k.rows("DispatchBackward.GradX", s, dt, H, o.gradX, gradX[s])
		if c.weighted {
			k.rows("DispatchBackward.GradTopkWeights", s, device.FP32, K, o.gradTW, f32bytes(gradTW[s]))
		} else if o.gradTW != nil {
			k.errorf("rank %d: DispatchBackward.GradTopkWeights returned without GradRecvWeights", s)
		}
	}

	// Adjoint identities on fp32 data, in fp64: <Dispatch(x), g> =
	// <x, DispatchBackward(g)>, <Permute(r), g> = <r, PermuteBackward(g)>,
	// <Unpermute(y), g> = <y, UnpermuteBackward(g).GradY> (unweighted: c = 1)
	// and <Combine(z), g> = <z, CombineBackward(g)>.
	if dt == device.FP32 && k.fail == 0 && !c.specials() { // (sums of huge values overflow)
		var l, r, a float64
		for d, o := range first {
			l += reference.Dot64(dt, o.recvX, in.z[d])
			a += absDot(dt, o.recvX, in.z[d])
		}
		for s, o := range first {
			r += reference.Dot64(dt, in.x[s], o.gradX)
		}
		k.close("<Dispatch(x), g> vs <x, DispatchBackward(g)>", l, r, 1e-5*a+1e-30)
		l, r, a = 0, 0, 0
		for s, o := range first {
			l += reference.Dot64(dt, o.combZ, in.gout[s])
			a += absDot(dt, o.combZ, in.gout[s])
		}
		for d, o := range first {
			r += reference.Dot64(dt, in.z[d], o.combBack)
		}
		k.close("<Combine(z), g> vs <z, CombineBackward(g)>", l, r, 1e-5*a+1e-30)
		for d, o := range first {
			l := reference.Dot64(dt, o.px, in.y[d])
			r := reference.Dot64(dt, o.recvX, o.permBk)
			k.close(fmt.Sprintf("rank %d: <Permute(r), g> vs <r, PermuteBackward(g)>", d), l, r, 1e-5*absDot(dt, o.px, in.y[d])+1e-30)
			if !c.weighted {
				l := reference.Dot64(dt, o.unperm, in.z[d])
				r := reference.Dot64(dt, in.y[d], o.gradY)
				k.close(fmt.Sprintf("rank %d: <Unpermute(y), g> vs <y, UnpermuteBackward(g)>", d), l, r, 1e-5*absDot(dt, in.y[d], o.gradY)+1e-30)
			}
		}
	}
	if k.fail > 20 {
		t.Errorf("%v: %d more mismatches", c, k.fail-20)
	}
	if testing.Verbose() && k.fail == 0 {
		t.Logf("%v: ok", strings.TrimSpace(c.String()))
	}
}
