package bench

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"strings"
	"time"
	"unsafe"

	"github.com/goep/goep/comm"
	"github.com/goep/goep/device"
	"github.com/goep/goep/permute"
)

// A2A is the baseline a user without goep would write for one rank: every
// call done with the group's AllToAll (MPI_Alltoallv under MPI, the TCP
// exchange under eprun launch, comm.NewLocal's in process) plus local
// loops, producing the same outputs as goep's calls, bit for bit:
//
//   - Dispatch: each rank packs, for each destination, the rows of its
//     tokens routed there in token order, each with its K global expert ids
//     and weights; one AllToAll; the receiver restricts the slots to its
//     experts. Received rows are in receive order (source rank, then
//     token), as goep's RecvX.
//   - Permute (DispatchPermute = Dispatch then Permute): counts per local
//     expert, padded segment offsets, then a copy of every received row
//     into each of its experts' segments (device.ParallelFor over rows),
//     padding zeroed.
//   - Combine: each destination sends back, to each source, the rows of z
//     that came from it (contiguous, no copy); one AllToAll; the source
//     sums each token's rows in ascending destination order in fp32
//     (permute.SumRows) and rounds once.
//   - UnpermuteCombine: permute.Unpermute of y with the received weights,
//     then Combine.
//   - DispatchCombine: Dispatch, the received rows gathered into one
//     [N, H] array (as goep's RecvX is), then Combine of it.
//
// fp8 rows travel with their scales: each row is packed as its H bytes
// followed by its H/128 fp32 scales, so Dispatch moves both in the one
// AllToAll and Permute copies both, as a user packing DeepEP-style
// messages would (the same bytes as goep's calls move, DESIGN.md section
// 6). Unpack splits packed rows for the checks. Combine refuses fp8: the calls that
// combine in an fp8 case run on a bf16 A2A (Case.CallDType).
//
// Send buffers and outputs are reused from one call to the next, as a
// user's would be.
type A2A struct {
	w       *World
	g       comm.Group
	me      int
	pad     int
	dt      device.DType
	h, k, l int
	rb      int // row bytes, an fp8 row's scales included (packed)
	sb      int // bytes of an fp8 row's scales; 0 for other dtypes

	x   []byte    // this rank's tokens [T, H] (fp8: packed with their scales)
	idx []int32   // [T*K] global expert ids
	wts []float32 // [T*K]

	send    [][]byte
	recvCnt []int // rows received from each source

	// Dispatch outputs. Rows, X and the results of RecvX and RecvXInto
	// are packed rows (fp8: with their scales; Unpack splits them).
	Rows        [][]byte  // the N received rows (views), in receive order
	RecvIdx     []int32   // [N*K] local expert ids, else -1
	RecvWeights []float32 // [N*K]

	// Permute outputs: X [P, H] and Weights [P] (the first P rows).
	pos     []int32 // [N*K] permuted row of each slot, else -1
	X       []byte
	Weights []float32
	P       int

	// Combine output [T, H]; un is the unpermuted [N, H].
	Out   []byte
	un    []byte
	terms [][]byte
	toff  []int
	dests []int
}

// NewA2A sets up rank g.Rank()'s baseline for world w (inputs from
// w.Inputs), with permuted segments padded to pad rows.
func NewA2A(w *World, g comm.Group, pad int) *A2A {
	me := g.Rank()
	x, idx, wts := w.Inputs(me)
	a := &A2A{
		w: w, g: g, me: me, pad: pad, dt: w.DType,
		h: w.Hidden, k: w.TopK, l: w.LocalExperts(), rb: RowBytes(w.DType, w.Hidden), sb: 4 * w.ScaleCols(),
		x: x, idx: idx, wts: wts,
		send: make([][]byte, w.Ranks), recvCnt: make([]int, w.Ranks),
	}
	if a.sb > 0 {
		scales := w.InputScales(me)
		xb := a.rb - a.sb
		a.x = make([]byte, w.Tokens[me]*a.rb)
		for t := range w.Tokens[me] {
			copy(a.x[t*a.rb:], x[t*xb:(t+1)*xb])
			copy(a.x[t*a.rb+xb:], scales[t*a.sb:(t+1)*a.sb])
		}
	}
	return a
}

// Unpack splits packed rows (rows of RecvX, RecvXInto or the permuted X)
// into their payload [n, H] and, for fp8, their scales [n, H/128] fp32
// bytes; for other dtypes it returns the rows as they are and nil.
func (a *A2A) Unpack(packed []byte) (x, scales []byte) {
	if a.sb == 0 {
		return packed, nil
	}
	n, xb := len(packed)/a.rb, a.rb-a.sb
	x, scales = make([]byte, n*xb), make([]byte, n*a.sb)
	for i := range n {
		copy(x[i*xb:], packed[i*a.rb:i*a.rb+xb])
		copy(scales[i*a.sb:], packed[i*a.rb+xb:(i+1)*a.rb])
	}
	return x, scales
}

// goesTo reports whether token t names an expert of rank d.
func (a *A2A) goesTo(t, d int) bool {
	for _, e := range a.idx[t*a.k : (t+1)*a.k] {
		if e >= 0 && int(e)/a.l == d {
			return true
		}
	}
	return false
}

// destsOf returns the ranks token t goes to, ascending, in buf.
func (a *A2A) destsOf(t int, buf []int) []int {
	buf = buf[:0]
	for d := range a.w.Ranks {
		if a.goesTo(t, d) {
			buf = append(buf, d)
		}
	}
	return buf
}

// domainSum adds the terms of one element of a token's rows, which came
// from the destination ranks dests (ascending), as goep's combine does with
// several domains: a partial per domain in fp32, rounded to the dtype when
// it crosses domains (it travels in the dtype), then the partials in domain
// order in fp32. A sum of one term is that term (a -0 stays -0).
func (a *A2A) domainSum(dests []int, terms []float32) float32 {
	D := a.w.RanksPerDomain
	var total float32
	haveTotal := false
	for i := 0; i < len(dests); {
		dom := dests[i] / D
		part := terms[i]
		j := i + 1
		for ; j < len(dests) && dests[j]/D == dom; j++ {
			part = float32(part + terms[j])
		}
		if dom != a.me/D && a.dt == device.BF16 {
			part = device.BF16ToFloat32(device.Float32ToBF16(part))
		}
		if haveTotal {
			total = float32(total + part)
		} else {
			total, haveTotal = part, true
		}
		i = j
	}
	return total
}

// Dispatch exchanges the token rows: afterwards Rows, RecvIdx and
// RecvWeights hold this rank's dispatch output.
func (a *A2A) Dispatch(ctx context.Context) error {
	R, k, rb := a.w.Ranks, a.k, a.rb
	T := len(a.idx) / k
	meta := 8 * k // bytes of a row's ids and weights
	// Message to d: [n*K int32 ids][n*K fp32 weights][n rows].
	device.ParallelFor(R, 1, func(lo, hi int) {
		for d := lo; d < hi; d++ {
			n := 0
			for t := range T {
				if a.goesTo(t, d) {
					n++
				}
			}
			b := grow(a.send[d], n*(meta+rb))
			ids, ws, rows := b[:n*4*k], b[n*4*k:n*meta], b[n*meta:]
			j := 0
			for t := range T {
				if !a.goesTo(t, d) {
					continue
				}
				for q := range k {
					binary.LittleEndian.PutUint32(ids[(j*k+q)*4:], uint32(a.idx[t*k+q]))
					binary.LittleEndian.PutUint32(ws[(j*k+q)*4:], math.Float32bits(a.wts[t*k+q]))
				}
				copy(rows[j*rb:(j+1)*rb], a.x[t*rb:(t+1)*rb])
				j++
			}
			a.send[d] = b
		}
	})
	recv, err := a.g.AllToAll(ctx, a.send)
	if err != nil {
		return fmt.Errorf("a2a dispatch: %w", err)
	}
	n := 0
	for s, b := range recv {
		if len(b)%(meta+rb) != 0 {
			return fmt.Errorf("a2a dispatch: %d bytes from rank %d, not a multiple of %d", len(b), s, meta+rb)
		}
		a.recvCnt[s] = len(b) / (meta + rb)
		n += a.recvCnt[s]
	}
	a.Rows = a.Rows[:0]
	a.RecvIdx = growN(a.RecvIdx, n*k)
	a.RecvWeights = growN(a.RecvWeights, n*k)
	i := 0
	for s, b := range recv {
		c := a.recvCnt[s]
		ids, ws, rows := b[:c*4*k], b[c*4*k:c*meta], aligned(b[c*meta:], a.dt.Size())
		for j := range c {
			for q := range k {
				e := int32(binary.LittleEndian.Uint32(ids[(j*k+q)*4:]))
				li, lw := int32(-1), float32(0)
				if e >= 0 && int(e)/a.l == a.me {
					li, lw = e%int32(a.l), math.Float32frombits(binary.LittleEndian.Uint32(ws[(j*k+q)*4:]))
				}
				a.RecvIdx[i*k+q], a.RecvWeights[i*k+q] = li, lw
			}
			a.Rows = append(a.Rows, rows[j*rb:(j+1)*rb])
			i++
		}
	}
	return nil
}

// Permute writes the expert-major layout of the dispatched rows into X and
// Weights (the first P rows).
func (a *A2A) Permute() {
	n, k, l, rb := len(a.Rows), a.k, a.l, a.rb
	cnt := make([]int, l)
	for _, e := range a.RecvIdx[:n*k] {
		if e >= 0 {
			cnt[e]++
		}
	}
	off := make([]int, l+1)
	for e := range l {
		off[e+1] = off[e] + (cnt[e]+a.pad-1)/a.pad*a.pad
	}
	a.P = off[l]
	fill := make([]int, l)
	a.pos = growN(a.pos, n*k)
	for i, e := range a.RecvIdx[:n*k] {
		if e < 0 {
			a.pos[i] = -1
			continue
		}
		a.pos[i] = int32(off[e] + fill[e])
		fill[e]++
	}
	a.X = grow(a.X, a.P*rb)
	a.Weights = growN(a.Weights, a.P)
	device.ParallelFor(n, 16, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			for q := range k {
				if p := int(a.pos[i*k+q]); p >= 0 {
					copy(a.X[p*rb:(p+1)*rb], a.Rows[i])
					a.Weights[p] = a.RecvWeights[i*k+q]
				}
			}
		}
	})
	for e := range l {
		permute.ZeroRows(a.X, rb, a.Weights, off[e]+cnt[e], off[e+1])
	}
}

// RecvX returns the dispatched rows as one [N, H] array (a copy; fp8:
// packed rows).
func (a *A2A) RecvX() []byte {
	out := make([]byte, 0, len(a.Rows)*a.rb)
	for _, r := range a.Rows {
		out = append(out, r...)
	}
	return out
}

// RecvXInto writes the dispatched rows as one [N, H] array into buf
// (grown if too small) and returns it.
func (a *A2A) RecvXInto(buf []byte) []byte {
	buf = grow(buf, len(a.Rows)*a.rb)
	for i, r := range a.Rows {
		copy(buf[i*a.rb:], r)
	}
	return buf
}

// Combine sends z ([N, H], in receive order) back and sums each token's
// rows into Out.
func (a *A2A) Combine(ctx context.Context, z []byte) error {
	if a.sb > 0 {
		return fmt.Errorf("a2a combine: %v rows are never summed (fp8 is dispatch only)", a.dt)
	}
	rb := a.rb
	o := 0
	for s, c := range a.recvCnt {
		a.send[s] = z[o*rb : (o+c)*rb]
		o += c
	}
	back, err := a.g.AllToAll(ctx, a.send)
	a.send = make([][]byte, len(a.send)) // the views of z are not ours to reuse
	if err != nil {
		return fmt.Errorf("a2a combine: %w", err)
	}
	for d := range back {
		back[d] = aligned(back[d], a.dt.Size())
	}
	T := len(a.idx) / a.k
	a.terms = a.terms[:0]
	a.toff = growN(a.toff, T+1)
	cur := make([]int, len(back))
	for t := range T {
		a.toff[t] = len(a.terms)
		a.dests = a.destsOf(t, a.dests)
		for _, d := range a.dests {
			c := cur[d]
			if (c+1)*rb > len(back[d]) {
				return fmt.Errorf("a2a combine: rank %d sent %d rows, fewer than routed to it", d, len(back[d])/rb)
			}
			a.terms = append(a.terms, back[d][c*rb:(c+1)*rb])
			cur[d]++
		}
	}
	a.toff[T] = len(a.terms)
	a.Out = grow(a.Out, T*rb)
	if a.w.RanksPerDomain >= a.w.Ranks {
		device.ParallelFor(T, 16, func(lo, hi int) {
			for t := lo; t < hi; t++ {
				permute.SumRows(a.dt, a.Out[t*rb:(t+1)*rb], a.terms[a.toff[t]:a.toff[t+1]], nil)
			}
		})
		return nil
	}
	// Several domains: partials per domain, rounded when they cross (the
	// summation order of DESIGN.md section 2).
	var terms []float32
	for t := range T {
		a.dests = a.destsOf(t, a.dests)
		rows := a.terms[a.toff[t]:a.toff[t+1]]
		for j := range a.h {
			terms = terms[:0]
			for _, r := range rows {
				terms = append(terms, device.LoadFloat32(a.dt, r, j))
			}
			v := float32(0)
			if len(terms) > 0 {
				v = a.domainSum(a.dests, terms)
			}
			device.StoreFloat32(a.dt, a.Out[t*rb:(t+1)*rb], j, v)
		}
	}
	return nil
}

// UnpermuteCombine folds y ([P, H], the permuted layout of the last
// Permute) back with the received weights, then combines.
func (a *A2A) UnpermuteCombine(ctx context.Context, y []byte) error {
	n := len(a.Rows)
	a.un = grow(a.un, n*a.rb)
	permute.Unpermute(a.dt, a.h, a.un, y, a.RecvWeights[:n*a.k], permute.Map{
		Rows: n, TopK: a.k, Pos: a.pos[:n*a.k], RowCap: n, PermCap: a.P,
	})
	return a.Combine(ctx, a.un)
}

// grow returns b resliced to n bytes, reallocated if too small.
func grow(b []byte, n int) []byte {
	if cap(b) < n {
		return make([]byte, n)
	}
	return b[:n]
}

func growN[T any](b []T, n int) []T {
	if cap(b) < n {
		return make([]T, n)
	}
	return b[:n]
}

// aligned returns b, or a copy of it if it does not start at a multiple
// of a bytes (the row loops view rows as uint16 or float32).
func aligned(b []byte, a int) []byte {
	if len(b) == 0 || uintptr(unsafe.Pointer(&b[0]))%uintptr(a) == 0 {
		return b
	}
	return append(make([]byte, 0, len(b)), b...)
}

// runA2A times the a2a baseline of every call, as the calls are timed,
// and checks its outputs as the calls' are. As goep's, the calls that
// combine of an fp8 case run on bf16 rows: a second A2A, of the case's
// bf16 world.
func (st *rankState) runA2A(ctx context.Context) error {
	a := NewA2A(st.world, st.a2a, st.cfg.Pad)
	ca := a // the calls that combine
	if st.cworld != st.world {
		ca = NewA2A(st.cworld, st.a2a, st.cfg.Pad)
	}
	r := st.rank
	dispatched, permuted := false, false // ca holds a dispatch (z), a permute
	var z []byte
	timed := func(call string, op func() error) (err error) {
		defer func() {
			if err != nil && !strings.HasPrefix(err.Error(), "a2a "+call+": ") {
				err = fmt.Errorf("%s: %w", call, err)
			}
		}()
		name := "a2a/" + call
		if err := st.begin(ctx, name); err != nil {
			return err
		}
		for i := range st.cfg.Warmup + st.cfg.Iters {
			if err := st.ctl.Barrier(ctx); err != nil {
				return err
			}
			t0 := time.Now()
			err := op()
			t1 := time.Now()
			if err != nil {
				return err
			}
			if i >= st.cfg.Warmup {
				st.record(name, i-st.cfg.Warmup, t0, t1)
			}
			st.progress(name)
		}
		return st.ctl.Barrier(ctx)
	}
	check := func(call string, c Check) {
		if st.a2aChecks[call] == nil {
			st.a2aChecks[call] = &Check{}
		}
		st.a2aChecks[call].add(c)
	}
	dispatchPermute := func(a *A2A) error {
		if err := a.Dispatch(ctx); err != nil {
			return err
		}
		a.Permute()
		return nil
	}
	for _, call := range st.cfg.Calls {
		switch call {
		case CallDispatch:
			if err := timed(call, func() error { return a.Dispatch(ctx) }); err != nil {
				return err
			}
			rx := a.RecvX()
			if a == ca {
				dispatched, z = true, rx
			}
			x, scales := a.Unpack(rx)
			check(call, st.world.CheckDispatch(r, len(a.Rows), x, scales, a.RecvIdx, a.RecvWeights))
		case CallCombine:
			if !dispatched {
				if err := ca.Dispatch(ctx); err != nil {
					return err
				}
				dispatched, z = true, ca.RecvX()
			}
			if err := timed(call, func() error { return ca.Combine(ctx, z) }); err != nil {
				return err
			}
			check(call, st.cworld.CheckCombine(r, ca.Out, false))
		case CallDispatchPermute:
			if err := timed(call, func() error { return dispatchPermute(a) }); err != nil {
				return err
			}
			if a == ca {
				permuted = true
			}
			c := st.world.CheckDispatch(r, len(a.Rows), nil, nil, a.RecvIdx, a.RecvWeights)
			x, scales := a.Unpack(a.X[:a.P*a.rb])
			pc := st.world.CheckPermute(r, st.cfg.Pad, a.P, x, scales, a.Weights[:a.P])
			c.Wrong += pc.Wrong
			check(call, c)
		case CallDispatchCombine:
			// Dispatch, gather the received rows into one [N, H] array
			// (goep's RecvX is one), send them back and sum.
			var rx []byte
			if err := timed(call, func() error {
				if err := ca.Dispatch(ctx); err != nil {
					return err
				}
				rx = ca.RecvXInto(rx)
				return ca.Combine(ctx, rx)
			}); err != nil {
				return err
			}
			c := st.cworld.CheckDispatch(r, len(ca.Rows), rx, nil, ca.RecvIdx, ca.RecvWeights)
			c.add(st.cworld.CheckCombine(r, ca.Out, false))
			check(call, c)
		case CallUnpermuteCombine:
			if !permuted {
				if err := dispatchPermute(ca); err != nil {
					return err
				}
				permuted = true
			}
			y := append([]byte(nil), ca.X[:ca.P*ca.rb]...)
			if err := timed(call, func() error { return ca.UnpermuteCombine(ctx, y) }); err != nil {
				return err
			}
			check(call, st.cworld.CheckCombine(r, ca.Out, true))
		}
	}
	return nil
}
