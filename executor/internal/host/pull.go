package host

import (
	"github.com/goep/goep/device"
	"github.com/goep/goep/executor/internal/datapath"
	"github.com/goep/goep/executor/internal/plan"
	"github.com/goep/goep/executor/internal/rail"
	"github.com/goep/goep/internal/view"
	"github.com/goep/goep/permute"
)

// sources locates every valid received row among the domain's exposed
// buffers: buffer 0 (x) and 1 (weights) of its source when the source is
// in this domain, else the source's forwarded copy in buffer 2 of this
// domain's rank with the source's local index (r, several domains only).
// Rows are located as they are read, so a call allocates nothing per row.
type sources struct {
	lay      *plan.Layout
	peers    [][][]byte
	rb       int // row bytes
	n        int // valid received rows
	weighted bool
	r        *rail.Rail
	me       int // this rank's domain
}

func newSources(env *datapath.Env, lay *plan.Layout, peers [][][]byte, rb int, weighted bool, r *rail.Rail) *sources {
	return &sources{lay: lay, peers: peers, rb: rb, n: env.ValidRecv(lay, env.Rank), weighted: weighted, r: r, me: env.Rank / lay.RanksPerDomain}
}

// row is received row i's source: its x row and, when weights are
// dispatched, the source token's K weights (else nil).
func (s *sources) row(i int) (x []byte, w []float32) {
	K, D, rb := s.lay.TopK, s.lay.RanksPerDomain, s.rb
	src, t := int(s.lay.RecvSrcRank[i]), int(s.lay.RecvSrcToken[i])
	p := s.peers[src%D]
	if src/D == s.me {
		x = p[0][t*rb : (t+1)*rb]
		if s.weighted {
			w = view.Float32s(p[1])[t*K : (t+1)*K]
		}
		return x, w
	}
	slot := p[2][src/D*s.r.Slot:]
	f := int(s.lay.RecvFwdRow[i])
	o := rail.Header + s.r.Area + f*rb
	x = slot[o : o+rb]
	if s.weighted {
		w = view.Float32s(slot[rail.Header:])[f*K : (f+1)*K]
	}
	return x, w
}

// recvWeights writes received row i's slot weights into rw[i*K:]: the
// source's weight where the slot names an expert of this rank, else 0.
func recvWeights(lay *plan.Layout, i int, w, rw []float32) {
	K := lay.TopK
	for k := range K {
		if lay.RecvIdx[i*K+k] >= 0 {
			rw[i*K+k] = w[k]
		} else {
			rw[i*K+k] = 0
		}
	}
}

// gatherRows copies each source row into dst row i and, when rw is not
// nil, its slot weights into rw (recvWeights), in one pass over the rows;
// it zeroes the rows of dst (and rw) past the valid ones.
func (p *Path) gatherRows(src *sources, dst []byte, rw []float32) {
	rb := src.rb
	p.par().For(src.n, 16, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			x, w := src.row(i)
			copy(dst[i*rb:(i+1)*rb], x)
			if rw != nil {
				recvWeights(src.lay, i, w, rw)
			}
		}
	})
	clear(dst[src.n*rb:])
	if rw != nil {
		clear(rw[src.n*src.lay.TopK:])
	}
}

// writeRecvIdx fills RecvIdx with the layout's local expert ids of the n
// valid rows, and -1 past them up to rows.
func writeRecvIdx(lay *plan.Layout, n, rows int, idx *device.Tensor) {
	K := lay.TopK
	ri := view.Int32s(idx.Bytes())
	copy(ri, lay.RecvIdx[:n*K])
	for i := n * K; i < rows*K; i++ {
		ri[i] = -1
	}
}

// gatherPermuted writes each valid received row i to its permuted
// positions in px and, when rw is not nil, its slot weights into rw
// (recvWeights) and pw (at the same positions), in one pass over the
// rows; it zeroes the padding, and the rows of rw past the valid ones.
func (p *Path) gatherPermuted(src *sources, px []byte, rw, pw []float32) {
	lay, rb := src.lay, src.rb
	K, n := lay.TopK, src.n
	pcap := plan.PermCap(lay, p.env.P, p.env.Rank)
	p.par().For(n, 16, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			row, w := src.row(i)
			if rw != nil {
				recvWeights(lay, i, w, rw)
			}
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
	if rw != nil {
		clear(rw[n*K:])
	}
	permute.ZeroPadding(px, rb, pw, lay.ExpertOffsets, lay.TokensPerExpert, pcap)
	permute.ZeroDropped(px, rb, pw, permute.Map{Rows: n, TopK: K, Pos: lay.Pos, PermCap: pcap})
}
