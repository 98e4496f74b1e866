package host

import (
	"fmt"

	"github.com/goep/goep/device"
	"github.com/goep/goep/executor/internal/datapath"
	"github.com/goep/goep/executor/internal/plan"
	"github.com/goep/goep/executor/internal/rail"
	"github.com/goep/goep/internal/view"
	"github.com/goep/goep/nvlink"
	"github.com/goep/goep/permute"
)

// tiered is the crossing of several domains (package rail): what crosses
// domains goes over the rail once per token and domain, and is forwarded
// in the domain's exchange, where every rank pulls a row from its source
// (same domain) or from the forwarder with the source's local index.
type tiered struct {
	c *Control
	r *rail.Rail
	// partial is the fp32 partial sums of this rank's tokens over its own
	// domain in combine, [T*H] fp32, reused across calls.
	partial []byte
}

func (x *tiered) join(op datapath.Op, cause error) {
	x.r.Reject(op, cause, func() {
		_ = x.c.Dom.Exchange(nvlink.Call{Op: uint64(op), Status: cause, Relay: op.DispatchLike()}, nil)
	})
}

// routing: idx crosses the rail, is forwarded, and fn gets every rank's
// routing inside the domain exchange.
func (x *tiered) routing(idx *device.Tensor, sg [4]uint64, fn func(routing [][]int32) error) error {
	r, env := x.r, x.c.env
	mine := idx.Bytes()
	recv, rerr := r.Round(datapath.OpLayout, sg, nil, func(n int, area, rows []byte) (int, int, int) {
		return idx.Rows(), copy(area, mine), 0
	})
	if rerr == nil {
		r.Forward(recv, func(n int) int { return rail.GetHead(recv(n)).Count * env.P.TopK * 4 }, nil)
	}
	// The domain exchange follows the rail round: a domain peer whose
	// round timed out reports it (Relay).
	c := nvlink.Call{Op: uint64(datapath.OpLayout), Sig: sg, Status: rerr, Buffers: []*device.Buffer{idx.Buffer(), r.Fwd}, Relay: true}
	err := x.c.Exchange(c, func(peers [][][]byte) error {
		routing := make([][]int32, env.NumRanks)
		for g := range routing {
			p := peers[g%r.D]
			if g/r.D == r.Domain {
				routing[g] = view.Int32s(p[0])
				continue
			}
			s := p[1][g/r.D*r.Slot:]
			T := rail.GetHead(s).Count
			routing[g] = view.Int32s(s[rail.Header : rail.Header+T*env.P.TopK*4])
		}
		return fn(routing)
	})
	if rerr != nil {
		return rerr
	}
	return err
}

// pull is the dispatch side: this rank's rows cross the rail once per
// token and domain, are forwarded, and fn gets the source of every valid
// received row from the domain exchange.
func (x *tiered) pull(lay *plan.Layout, c nvlink.Call, xt, w *device.Tensor, fn func(src *sources) error) error {
	r, env, K := x.r, x.c.env, x.c.env.P.TopK
	rb := datapath.RowBytes(xt)
	xs, ws, weighted := xt.Bytes(), f32(w), w != nil // ws is empty when T = 0
	recv, rerr := r.Round(datapath.Op(c.Op), c.Sig, nil, rail.DispatchFill(lay, xs, ws, weighted, rb))
	if rerr == nil {
		// The rows each peer sends here are known from its send side.
		count := make([]int, r.M)
		for n := range r.M {
			if n == r.Domain {
				continue
			}
			count[n] = len(lay.Rail[n].DomainTokens(nil, r.Domain, r.D))
			if got := rail.GetHead(recv(n)).Count; got != count[n] {
				rerr = fmt.Errorf("executor: rail: rank %d sent %d rows to domain %d, its layout says %d: %w", r.Global(n), got, r.Domain, count[n], nvlink.ErrPeerMismatch)
			}
		}
		if rerr == nil {
			ab := func(n int) int {
				if !weighted {
					return 0
				}
				return count[n] * K * 4
			}
			r.Forward(recv, ab, func(n int) int { return count[n] * rb })
		}
	}
	c.Status, c.Relay = rerr, true
	c.Buffers = append(c.Buffers, r.Fwd)
	err := x.c.Exchange(c, func(peers [][][]byte) error {
		return fn(newSources(env, lay, peers, rb, weighted, r))
	})
	if rerr != nil {
		return rerr
	}
	return err
}

// sum is the combine side (Combine, DispatchBackward, UnpermuteCombine):
// partials over this domain for the rail peers' tokens and this rank's
// own, the rail round, then the sum over domains. gwt (weight gradients,
// DispatchBackward) may be nil.
func (x *tiered) sum(p *Path, lay *plan.Layout, c nvlink.Call, y, _ *device.Tensor, out []byte, gwt *device.Tensor, u *unpermuteSpec) error {
	r, env, dt := x.r, p.env, y.DType()
	K, H := env.P.TopK, env.Hidden
	rb := H * dt.Size()
	T := lay.NumTokens
	if need := T * H * 4; len(x.partial) < need {
		x.partial = make([]byte, need)
	}
	partial := x.partial[:T*H*4]
	own := make([]bool, T)
	send := r.Transport.SendBuffer()
	sizes := make([][3]int, r.M)
	gw, weighted := f32(gwt), gwt != nil // gw is empty when T = 0
	err := x.c.Exchange(c, func(peers [][][]byte) error {
		newT := func() *termer { return newTermer(env, lay, peers, dt, u) }
		// Partials of the rail peers' tokens, rounded to the dtype, into
		// the send slots.
		for n := range r.M {
			if n == r.Domain {
				continue
			}
			side := lay.Rail[n]
			toks := side.DomainTokens(nil, r.Domain, r.D)
			s := send[n*r.Slot:]
			area, rows := view.Float32s(s[rail.Header:rail.Header+r.Area]), s[rail.Header+r.Area:]
			device.ForScratch(p.par(), len(toks), 16, newT, func(tm *termer, lo, hi int) {
				for i := lo; i < hi; i++ {
					t := int(toks[i])
					permute.SumRows(dt, rows[i*rb:(i+1)*rb], tm.collect(side, t, r.Domain), nil)
					if weighted {
						for k := range K {
							area[i*K+k] = slotGrad(env, lay, side, t, k, r.Domain, peers)
						}
					}
				}
			})
			sizes[n] = [3]int{len(toks), 0, len(toks) * rb}
			if weighted {
				sizes[n][1] = len(toks) * K * 4
			}
		}
		// This rank's own partials (fp32, not rounded) and the weight
		// gradients of slots in this domain.
		pf := view.Float32s(partial)
		device.ForScratch(p.par(), T, 16, newT, func(tm *termer, lo, hi int) {
			for t := lo; t < hi; t++ {
				terms := tm.collect(&lay.SendSide, t, r.Domain)
				own[t] = len(terms) > 0
				acc := pf[t*H : (t+1)*H]
				for i, row := range terms {
					permute.Accumulate(dt, acc, row, 1, i == 0)
				}
				if weighted {
					for k := range K {
						gw[t*K+k] = slotGrad(env, lay, &lay.SendSide, t, k, r.Domain, peers)
					}
				}
			}
		})
		return nil
	})
	// Even after a failure (fatal included) the rail round runs, carrying
	// it, so that the rail peers fail this call too instead of waiting.
	recv, rerr := r.Round(datapath.Op(c.Op), c.Sig, err, func(n int, _, _ []byte) (int, int, int) {
		return sizes[n][0], sizes[n][1], sizes[n][2]
	})
	if err != nil {
		return err
	}
	if rerr != nil {
		return rerr
	}
	// Sum over domains, ascending: this domain's fp32 partial, the others'
	// rounded ones from the rail.
	remote := make([]int32, r.M*T) // index of token t in domain n's slot, -1 if t did not go there
	for i := range remote {
		remote[i] = -1
	}
	for n := range r.M {
		if n == r.Domain {
			continue
		}
		for i, t := range lay.DomainTokens(nil, n, r.D) {
			remote[n*T+int(t)] = int32(i)
		}
	}
	newAcc := func() []float32 { return make([]float32, H) }
	device.ForScratch(p.par(), T, 16, newAcc, func(acc []float32, lo, hi int) {
		for t := lo; t < hi; t++ {
			first := true
			for n := range r.M {
				var row []byte
				rowDT := dt
				switch i := remote[n*T+t]; {
				case n == r.Domain && own[t]:
					row, rowDT = partial[t*H*4:(t+1)*H*4], device.FP32
				case n != r.Domain && i >= 0 && plan.Reaches(lay, env.P, &lay.SendSide, t, n):
					row = recv(n)[rail.Header+r.Area+int(i)*rb:][:rb]
				default:
					continue
				}
				permute.Accumulate(rowDT, acc, row, 1, first)
				first = false
			}
			if first {
				clear(out[t*rb : (t+1)*rb]) // routed nowhere
			} else {
				permute.Store(dt, out[t*rb:(t+1)*rb], acc)
			}
			if !weighted {
				continue
			}
			for k := range K {
				ex := int(lay.SlotExpert[t*K+k])
				if ex < 0 {
					gw[t*K+k] = 0
					continue
				}
				if n := ex / lay.NumLocalExperts / r.D; n != r.Domain {
					gw[t*K+k] = view.Float32s(recv(n)[rail.Header : rail.Header+r.Area])[int(remote[n*T+t])*K+k]
				}
			}
		}
	})
	return nil
}
