package bench

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/goep/goep/comm"
	"github.com/goep/goep/device"
	"github.com/goep/goep/internal/view"
	"github.com/goep/goep/permute"
)

// A2A is the baseline a user without goep would write for one rank, in
// Go, as they would in C with MPI: per call one count exchange, a pack with
// bulk copies into buffers reused from one call to the next, one
// all-to-all over those buffers (comm.AllToAllv: MPI_Ialltoallv on them
// under MPI, the TCP exchange under eprun launch, comm.NewLocal's in
// process), then the permute or the sum. Its outputs are goep's calls',
// bit for bit:
//
//   - Dispatch: each rank counts the rows of its tokens for each
//     destination (a token goes once to each rank one of its experts is
//     on), exchanges the counts (comm.AllToAllv of one int64 per rank),
//     packs, for each destination, its message [n rows][n x K int32
//     global expert ids][n x K fp32 weights] in token order (a copy per
//     row), and exchanges the messages with one comm.AllToAllv into one
//     receive buffer; it then restricts the received slots to its own
//     experts (RecvIdx, RecvWeights). Received rows are in receive order
//     (source rank, then token), as goep's RecvX, each source's rows
//     contiguous in its message (Row, RecvXInto).
//   - Permute (DispatchPermute = Dispatch then Permute): counts per local
//     expert, padded segment offsets, then a copy of every received row
//     into each of its experts' segments (device.ParallelFor over rows),
//     padding zeroed.
//   - Combine: z ([N, H], receive order) goes back as it is, each source's
//     rows to it (comm.AllToAllv on z itself: the counts are the
//     dispatch's); the source sums each token's rows in ascending
//     destination order in fp32 (permute.SumRows) and rounds once.
//   - UnpermuteCombine: permute.Unpermute of y with the received weights,
//     then Combine.
//   - DispatchCombine (the bench's): Dispatch, the received rows gathered
//     into one [N, H] array (as goep's RecvX is one), then Combine of it.
//
// fp8 rows travel with their scales: each row is packed as its H bytes
// followed by its H/128 fp32 scales, so Dispatch moves both in the one
// exchange and Permute copies both, as a user packing DeepEP-style
// messages would (the same bytes as goep's calls move, DESIGN.md section
// 6). Unpack splits packed rows for the checks. Combine refuses fp8: the
// calls that combine in an fp8 case run on a bf16 A2A (Case.CallDType).
//
// The large buffers (messages, permuted rows, sums) are mapped outside the
// Go heap (hostBuf) and kept from one call to the next; Free gives back
// those a later call does not need, Close all of them.
type A2A struct {
	w       *World
	g       comm.Group
	me, R   int
	pad     int
	dt      device.DType
	h, k, l int
	rb      int // row bytes, an fp8 row's scales included (packed)
	sb      int // bytes of an fp8 row's scales; 0 for other dtypes

	x   []byte    // this rank's tokens [T, H] (fp8: packed with their scales)
	idx []int32   // [T*K] global expert ids
	wts []float32 // [T*K]

	// The count exchange: one int64 a rank each way.
	eight            []int
	cntSend, cntRecv []byte
	seen             []int // per rank: 1 + the last token that went there
	fill             []int

	sendRows, recvRows   []int // rows to and from each rank (the dispatch's)
	sendBytes, recvBytes []int
	sendOff, recvOff     []int // each rank's message in send, recv
	send, recv           hostBuf
	// failed: an exchange failed, and a peer may still use its buffers.
	failed bool

	// Dispatch outputs: N rows, source s's at recvOff[s] (Row, RecvXInto;
	// packed rows, fp8 with their scales; Unpack splits them).
	N           int
	rowOff      []int     // [N] byte offset of each received row in recv
	RecvIdx     []int32   // [N*K] local expert ids, else -1
	RecvWeights []float32 // [N*K]

	// Permute outputs: X [P, H] and Weights [P] (the first P rows).
	pos     []int32 // [N*K] permuted row of each slot, else -1
	xBuf    hostBuf
	X       []byte
	Weights []float32
	P       int

	// Combine output [T, H]; un is the unpermuted [N, H], back the rows
	// that come back.
	outBuf, unBuf, backBuf hostBuf
	Out                    []byte
	zBytes, backBytes      []int
	terms                  [][]byte
	toff                   []int
	dests                  []int
}

// NewA2A sets up rank g.Rank()'s baseline for world w (inputs from
// w.Inputs), with permuted segments padded to pad rows.
func NewA2A(w *World, g comm.Group, pad int) *A2A {
	me, R := g.Rank(), w.Ranks
	x, idx, wts := w.Inputs(me)
	a := &A2A{
		w: w, g: g, me: me, R: R, pad: pad, dt: w.DType,
		h: w.Hidden, k: w.TopK, l: w.LocalExperts(), rb: RowBytes(w.DType, w.Hidden), sb: 4 * w.ScaleCols(),
		x: x, idx: idx, wts: wts,
		eight: make([]int, R), cntSend: make([]byte, 8*R), cntRecv: make([]byte, 8*R),
		seen: make([]int, R), fill: make([]int, R),
		sendRows: make([]int, R), recvRows: make([]int, R), sendBytes: make([]int, R), recvBytes: make([]int, R),
		sendOff: make([]int, R+1), recvOff: make([]int, R+1), zBytes: make([]int, R), backBytes: make([]int, R),
	}
	for p := range a.eight {
		a.eight[p] = 8
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

// Unpack splits packed rows (rows of RecvXInto or the permuted X) into
// their payload [n, H] and, for fp8, their scales [n, H/128] fp32 bytes;
// for other dtypes it returns the rows as they are and nil.
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

// destsOf returns the ranks token t goes to, ascending, in buf.
func (a *A2A) destsOf(t int, buf []int) []int {
	buf = buf[:0]
	for _, e := range a.idx[t*a.k : (t+1)*a.k] {
		if e < 0 {
			continue
		}
		d := int(e) / a.l
		i := len(buf)
		for i > 0 && buf[i-1] >= d {
			i--
		}
		if i < len(buf) && buf[i] == d {
			continue
		}
		buf = append(buf, 0)
		copy(buf[i+1:], buf[i:])
		buf[i] = d
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

// Dispatch exchanges the token rows: afterwards Row, RecvIdx and
// RecvWeights hold this rank's dispatch output.
func (a *A2A) Dispatch(ctx context.Context) error {
	R, k, rb := a.R, a.k, a.rb
	T := len(a.idx) / k
	meta := 8 * k // bytes of a row's ids and weights
	// Count the rows for each destination; seen[d] is 1 + the last token
	// counted for d, so that a token with several experts on d counts once.
	clear(a.sendRows)
	clear(a.seen)
	for t := range T {
		for _, e := range a.idx[t*k : (t+1)*k] {
			if e < 0 {
				continue
			}
			if d := int(e) / a.l; a.seen[d] != t+1 {
				a.seen[d] = t + 1
				a.sendRows[d]++
			}
		}
	}
	for d, n := range a.sendRows {
		binary.LittleEndian.PutUint64(a.cntSend[8*d:], uint64(n))
	}
	if err := a.allToAllv(ctx, a.cntSend, a.eight, a.cntRecv, a.eight); err != nil {
		return fmt.Errorf("a2a dispatch: counts: %w", err)
	}
	a.N = 0
	for s := range R {
		n := binary.LittleEndian.Uint64(a.cntRecv[8*s:])
		if n > uint64(math.MaxInt32) {
			return fmt.Errorf("a2a dispatch: rank %d sends %d rows", s, n)
		}
		a.recvRows[s] = int(n)
		a.recvBytes[s] = int(n) * (rb + meta)
		a.recvOff[s+1] = a.recvOff[s] + a.recvBytes[s]
		a.N += int(n)
	}
	for d, n := range a.sendRows {
		a.sendBytes[d] = n * (rb + meta)
		a.sendOff[d+1] = a.sendOff[d] + a.sendBytes[d]
	}
	send, err := a.send.get(a.sendOff[R])
	if err != nil {
		return err
	}
	recv, err := a.recv.get(a.recvOff[R])
	if err != nil {
		return err
	}
	// Pack: message d is [n rows][n*K ids][n*K weights], in token order,
	// with bulk copies (ids and weights in the host's byte order, as C's
	// memcpy).
	clear(a.fill)
	clear(a.seen)
	for t := range T {
		for _, e := range a.idx[t*k : (t+1)*k] {
			if e < 0 {
				continue
			}
			d := int(e) / a.l
			if a.seen[d] == t+1 {
				continue
			}
			a.seen[d] = t + 1
			n, j, m := a.sendRows[d], a.fill[d], send[a.sendOff[d]:a.sendOff[d+1]]
			a.fill[d]++
			copy(m[j*rb:(j+1)*rb], a.x[t*rb:(t+1)*rb])
			copy(m[n*rb+j*4*k:], view.Bytes(a.idx[t*k:(t+1)*k]))
			copy(m[n*rb+n*4*k+j*4*k:], view.Bytes(a.wts[t*k:(t+1)*k]))
		}
	}
	if err := a.allToAllv(ctx, send, a.sendBytes, recv, a.recvBytes); err != nil {
		return fmt.Errorf("a2a dispatch: %w", err)
	}
	// Unpack the slots, restricted to this rank's experts.
	n := a.N
	a.rowOff = growN(a.rowOff, n)
	a.RecvIdx = growN(a.RecvIdx, n*k)
	a.RecvWeights = growN(a.RecvWeights, n*k)
	// The slots are copied out in bulk (a message's ids and weights need
	// not be 4-byte aligned: rows of odd bf16 widths), then restricted.
	i := 0
	for s, c := range a.recvRows {
		m := recv[a.recvOff[s]:a.recvOff[s+1]]
		copy(view.Bytes(a.RecvIdx[i*k:(i+c)*k]), m[c*rb:c*rb+c*4*k])
		copy(view.Bytes(a.RecvWeights[i*k:(i+c)*k]), m[c*rb+c*4*k:])
		for j := range c {
			a.rowOff[i+j] = a.recvOff[s] + j*rb
		}
		i += c
	}
	for q, e := range a.RecvIdx[:n*k] {
		if e >= 0 && int(e)/a.l == a.me {
			a.RecvIdx[q] = e % int32(a.l)
		} else {
			a.RecvIdx[q], a.RecvWeights[q] = -1, 0
		}
	}
	return nil
}

// allToAllv is comm.AllToAllv on the baseline's group. After it fails,
// a peer may still read send or write recv (comm.AllToAllv's contract):
// the A2A keeps its buffers mapped from then on (Free abandons them), and
// so must the caller's (failed).
func (a *A2A) allToAllv(ctx context.Context, send []byte, sendCounts []int, recv []byte, recvCounts []int) error {
	err := comm.AllToAllv(ctx, a.g, send, sendCounts, recv, recvCounts)
	if err != nil {
		a.failed = true
	}
	return err
}

// Row is received row i of the last Dispatch (packed), a view of the
// receive buffer valid until the next Dispatch or Free.
func (a *A2A) Row(i int) []byte { return a.recv.b[a.rowOff[i] : a.rowOff[i]+a.rb] }

// Permute writes the expert-major layout of the dispatched rows into X and
// Weights (the first P rows).
func (a *A2A) Permute() error {
	n, k, l, rb := a.N, a.k, a.l, a.rb
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
	x, err := a.xBuf.get(a.P * rb)
	if err != nil {
		return err
	}
	a.X = x
	a.Weights = growN(a.Weights, a.P)
	recv := a.recv.b
	device.ParallelFor(n, 16, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			row := recv[a.rowOff[i] : a.rowOff[i]+rb]
			for q := range k {
				if p := int(a.pos[i*k+q]); p >= 0 {
					copy(x[p*rb:(p+1)*rb], row)
					a.Weights[p] = a.RecvWeights[i*k+q]
				}
			}
		}
	})
	for e := range l {
		permute.ZeroRows(x, rb, a.Weights, off[e]+cnt[e], off[e+1])
	}
	return nil
}

// RecvXInto writes the dispatched rows as one [N, H] array (fp8: packed
// rows) into buf (grown if too small) and returns it.
func (a *A2A) RecvXInto(buf []byte) []byte {
	buf = grow(buf, a.N*a.rb)
	for i := range a.N {
		copy(buf[i*a.rb:], a.Row(i))
	}
	return buf
}

// RecvX returns the dispatched rows as one new [N, H] array.
func (a *A2A) RecvX() []byte { return a.RecvXInto(nil) }

// Combine sends z ([N, H], in receive order) back and sums each token's
// rows into Out.
func (a *A2A) Combine(ctx context.Context, z []byte) error {
	if a.sb > 0 {
		return fmt.Errorf("a2a combine: %v rows are never summed (fp8 is dispatch only)", a.dt)
	}
	rb := a.rb
	backRows := 0
	for p := range a.R {
		a.zBytes[p] = a.recvRows[p] * rb    // the rows that came from p go back to it
		a.backBytes[p] = a.sendRows[p] * rb // the rows this rank sent p come back
		backRows += a.sendRows[p]
	}
	if len(z) < a.N*rb {
		return fmt.Errorf("a2a combine: z has %d bytes, %d rows of %d expected", len(z), a.N, rb)
	}
	back, err := a.backBuf.get(backRows * rb)
	if err != nil {
		return err
	}
	if err := a.allToAllv(ctx, z, a.zBytes, back, a.backBytes); err != nil {
		return fmt.Errorf("a2a combine: %w", err)
	}
	T := len(a.idx) / a.k
	a.terms = a.terms[:0]
	a.toff = growN(a.toff, T+1)
	// fill[d]: the next row from d; the rows from d start at its offset.
	o := 0
	for d := range a.R {
		a.fill[d] = o
		o += a.sendRows[d]
	}
	for t := range T {
		a.toff[t] = len(a.terms)
		a.dests = a.destsOf(t, a.dests)
		for _, d := range a.dests {
			c := a.fill[d]
			a.terms = append(a.terms, back[c*rb:(c+1)*rb])
			a.fill[d]++
		}
	}
	a.toff[T] = len(a.terms)
	out, err := a.outBuf.get(T * rb)
	if err != nil {
		return err
	}
	a.Out = out
	if a.w.RanksPerDomain >= a.w.Ranks {
		device.ParallelFor(T, 16, func(lo, hi int) {
			for t := lo; t < hi; t++ {
				permute.SumRows(a.dt, out[t*rb:(t+1)*rb], a.terms[a.toff[t]:a.toff[t+1]], nil)
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
			device.StoreFloat32(a.dt, out[t*rb:(t+1)*rb], j, v)
		}
	}
	return nil
}

// UnpermuteCombine folds y ([P, H], the permuted layout of the last
// Permute) back with the received weights, then combines.
func (a *A2A) UnpermuteCombine(ctx context.Context, y []byte) error {
	n := a.N
	un, err := a.unBuf.get(n * a.rb)
	if err != nil {
		return err
	}
	permute.Unpermute(a.dt, a.h, un, y, a.RecvWeights[:n*a.k], permute.Map{
		Rows: n, TopK: a.k, Pos: a.pos[:n*a.k], RowCap: n, PermCap: a.P,
	})
	return a.Combine(ctx, un)
}

// Free gives back the buffers of the calls done: the messages (and with
// them the rows Row returns), the combined output and the unpermuted rows,
// and unless keepPermuted the permuted rows (X). The counts and slots of
// the last Dispatch stay, so that Combine and Permute's layout still work.
func (a *A2A) Free(keepPermuted bool) error {
	bufs := []*hostBuf{&a.send, &a.recv, &a.outBuf, &a.unBuf, &a.backBuf}
	if !keepPermuted {
		bufs = append(bufs, &a.xBuf)
		a.X = nil
	}
	a.Out = nil
	var err error
	for _, b := range bufs {
		if a.failed {
			b.abandon()
			continue
		}
		err = errors.Join(err, b.free())
	}
	return err
}

// Close gives back every buffer.
func (a *A2A) Close() error { return a.Free(false) }

// mapped is the bytes of a's buffers mapped now.
func (a *A2A) mapped() int {
	n := 0
	for _, b := range []*hostBuf{&a.send, &a.recv, &a.xBuf, &a.outBuf, &a.unBuf, &a.backBuf} {
		n += b.size()
	}
	return n
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

// runA2A times the a2a baseline of every call, as the calls are timed,
// and checks its outputs as the calls' are. As goep's, the calls that
// combine of an fp8 case run on bf16 rows: a second A2A, of the case's
// bf16 world. After each call it gives back the buffers no later call
// reads (A2A.Free), so that what it holds at once is one call's: the
// messages, the permuted rows, the rows that come back and the sums.
func (st *rankState) runA2A(ctx context.Context) (err error) {
	a := NewA2A(st.world, st.a2a, st.cfg.Pad)
	ca := a // the calls that combine
	if st.cworld != st.world {
		ca = NewA2A(st.cworld, st.a2a, st.cfg.Pad)
	}
	var z hostBuf // the gathered rows of ca's dispatch: combine's z
	defer func() {
		if ca.failed {
			z.abandon() // combine's send buffer (allToAllv)
		}
		err = errors.Join(err, a.Close(), z.free())
		if ca != a {
			err = errors.Join(err, ca.Close())
		}
	}()
	r := st.rank
	dispatched, permuted := false, false // ca holds a dispatch (z), a permute (X)
	later := func(i int, calls ...string) bool {
		for _, c := range st.cfg.Calls[i+1:] {
			if slices.Contains(calls, c) {
				return true
			}
		}
		return false
	}
	gather := func(a *A2A) ([]byte, error) {
		b, err := z.get(a.N * a.rb)
		if err != nil {
			return nil, err
		}
		return a.RecvXInto(b), nil
	}
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
		return a.Permute()
	}
	for i, call := range st.cfg.Calls {
		switch call {
		case CallDispatch:
			if err := timed(call, func() error { return a.Dispatch(ctx) }); err != nil {
				return err
			}
			rx, err := gather(a)
			if err != nil {
				return err
			}
			if a == ca {
				dispatched = true
			}
			x, scales := a.Unpack(rx)
			check(call, st.world.CheckDispatch(r, a.N, x, scales, a.RecvIdx, a.RecvWeights))
			if a != ca || !later(i, CallCombine) {
				if err := z.free(); err != nil {
					return err
				}
				dispatched = false
			}
		case CallCombine:
			if !dispatched {
				if err := ca.Dispatch(ctx); err != nil {
					return err
				}
				if _, err := gather(ca); err != nil {
					return err
				}
				dispatched = true
			}
			zb := z.b[:ca.N*ca.rb]
			if err := ca.Free(permuted); err != nil { // the messages: z has the rows
				return err
			}
			if err := timed(call, func() error { return ca.Combine(ctx, zb) }); err != nil {
				return err
			}
			check(call, st.cworld.CheckCombine(r, ca.Out, false))
			if err := z.free(); err != nil {
				return err
			}
			dispatched = false
		case CallDispatchPermute:
			if err := timed(call, func() error { return dispatchPermute(a) }); err != nil {
				return err
			}
			c := st.world.CheckDispatch(r, a.N, nil, nil, a.RecvIdx, a.RecvWeights)
			x, scales := a.Unpack(a.X[:a.P*a.rb])
			pc := st.world.CheckPermute(r, st.cfg.Pad, a.P, x, scales, a.Weights[:a.P])
			c.Wrong += pc.Wrong
			check(call, c)
			permuted = a == ca && later(i, CallUnpermuteCombine)
			if err := a.Free(permuted); err != nil {
				return err
			}
		case CallDispatchCombine:
			// Dispatch, gather the received rows into one [N, H] array
			// (goep's RecvX is one), send them back and sum.
			var rx []byte
			if err := timed(call, func() error {
				if err := ca.Dispatch(ctx); err != nil {
					return err
				}
				var err error
				if rx, err = gather(ca); err != nil {
					return err
				}
				return ca.Combine(ctx, rx)
			}); err != nil {
				return err
			}
			c := st.cworld.CheckDispatch(r, ca.N, rx, nil, ca.RecvIdx, ca.RecvWeights)
			c.add(st.cworld.CheckCombine(r, ca.Out, false))
			check(call, c)
			if err := errors.Join(ca.Free(permuted), z.free()); err != nil {
				return err
			}
			dispatched = false
		case CallUnpermuteCombine:
			if !permuted {
				if err := dispatchPermute(ca); err != nil {
					return err
				}
				permuted = true
			}
			if err := ca.Free(true); err != nil { // the messages
				return err
			}
			y := ca.X[:ca.P*ca.rb]
			if err := timed(call, func() error { return ca.UnpermuteCombine(ctx, y) }); err != nil {
				return err
			}
			check(call, st.cworld.CheckCombine(r, ca.Out, true))
			if err := ca.Free(false); err != nil {
				return err
			}
			permuted = false
		}
	}
	return nil
}
