package host

import (
	"github.com/goep/goep/device"
	"github.com/goep/goep/executor/internal/datapath"
	"github.com/goep/goep/executor/internal/plan"
	"github.com/goep/goep/executor/internal/rail"
	"github.com/goep/goep/internal/view"
	"github.com/goep/goep/permute"
)

// recvSrc is where received row i comes from: its source's x row and,
// when weights are dispatched, the source token's K weights.
type recvSrc struct {
	x []byte
	w []float32
}

// sources locates every valid received row among the domain's exposed
// buffers: buffer 0 (x) and 1 (weights) of its source when the source is
// in this domain, else the source's forwarded copy in buffer 2 of this
// domain's rank with the source's local index (r, several domains only).
func sources(env *datapath.Env, lay *plan.Layout, peers [][]*device.Buffer, rb int, weighted bool, r *rail.Rail) []recvSrc {
	K, D := lay.TopK, lay.RanksPerDomain
	me := env.Rank / D
	src := make([]recvSrc, env.ValidRecv(lay, env.Rank))
	for i := range src {
		s, t := int(lay.RecvSrcRank[i]), int(lay.RecvSrcToken[i])
		p := peers[s%D]
		if s/D == me {
			src[i].x = p[0].Host()[t*rb : (t+1)*rb]
			if weighted {
				src[i].w = view.Float32s(p[1].Host())[t*K : (t+1)*K]
			}
			continue
		}
		slot := p[2].Host()[s/D*r.Slot:]
		f := int(lay.RecvFwdRow[i])
		o := rail.Header + r.Area + f*rb
		src[i].x = slot[o : o+rb]
		if weighted {
			src[i].w = view.Float32s(slot[rail.Header:])[f*K : (f+1)*K]
		}
	}
	return src
}

// gatherRows copies each source row into dst row i and zeroes the rows of
// dst past len(src).
func (p *Path) gatherRows(src []recvSrc, dst []byte) {
	p.par().For(len(src), 16, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			rb := len(src[i].x)
			copy(dst[i*rb:(i+1)*rb], src[i].x)
		}
	})
	if len(src) > 0 {
		clear(dst[len(src)*len(src[0].x):])
	} else {
		clear(dst)
	}
}

// writeRecvMeta fills RecvIdx (rows past len(src): -1) and, when weights
// were dispatched, RecvWeights (0 off this rank's slots and past len(src)).
func writeRecvMeta(lay *plan.Layout, src []recvSrc, rows int, idx, w *device.Tensor) {
	K, n := lay.TopK, len(src)
	ri := view.Int32s(idx.Bytes())
	copy(ri, lay.RecvIdx[:n*K])
	for i := n * K; i < rows*K; i++ {
		ri[i] = -1
	}
	if w == nil {
		return
	}
	rw := view.Float32s(w.Bytes())
	for i := range n {
		for k := range K {
			if lay.RecvIdx[i*K+k] >= 0 {
				rw[i*K+k] = src[i].w[k]
			} else {
				rw[i*K+k] = 0
			}
		}
	}
	clear(rw[n*K:])
}

// gatherPermuted writes each valid received row i (from src, rb bytes) to
// its permuted positions, with its slot weights from rw, and zeroes the
// padding.
func (p *Path) gatherPermuted(lay *plan.Layout, src []recvSrc, rb int, px []byte, rw, pw []float32) {
	K, n := lay.TopK, len(src)
	pcap := plan.PermCap(lay, p.env.P, p.env.Rank)
	p.par().For(n, 16, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			row := src[i].x
			for k := range K {
				pos := int(lay.Pos[i*K+k])
				if pos < 0 || pos >= pcap {
					continue
				}
				copy(px[pos*rb:(pos+1)*rb], row)
				if pw != nil {
					pw[pos] = rw[i*K+k]
				}
			}
		}
	})
	permute.ZeroPadding(px, rb, pw, lay.ExpertOffsets, lay.TokensPerExpert, pcap)
	permute.ZeroDropped(px, rb, pw, permute.Map{Rows: n, TopK: K, Pos: lay.Pos, PermCap: pcap})
}
