package bench

import (
	"encoding/binary"
	"math/rand/v2"

	"github.com/goep/goep/device"
	"github.com/goep/goep/internal/reference"
)

// Routing returns the top-k routing of one rank: tokens rows of topk
// distinct experts drawn uniformly from [0, experts), row-major
// ([tokens*topk]). It depends only on (seed, rank, tokens, topk, experts),
// so every rank can build every other rank's routing without communication.
//
// Each row is a uniformly random ordered k-subset (a partial Fisher-Yates
// shuffle of 0..experts-1), so no row names an expert twice.
func Routing(seed uint64, rank, tokens, topk, experts int) []int32 {
	rng := rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15^uint64(rank)))
	perm := make([]int32, experts)
	for i := range perm {
		perm[i] = int32(i)
	}
	swaps := make([]int, topk)
	out := make([]int32, tokens*topk)
	for t := range tokens {
		row := out[t*topk : (t+1)*topk]
		for j := range topk {
			i := j + rng.IntN(experts-j)
			perm[i], perm[j] = perm[j], perm[i]
			swaps[j] = i
			row[j] = perm[j]
		}
		for j := topk - 1; j >= 0; j-- { // undo, so perm is the identity again
			i := swaps[j]
			perm[i], perm[j] = perm[j], perm[i]
		}
	}
	return out
}

// World is the global routing and payload of one case, which every rank
// can rebuild on its own to check its results.
type World struct {
	Seed                  uint64
	Ranks, RanksPerDomain int
	Experts, TopK, Hidden int
	DType                 device.DType
	Tokens                []int     // T_r
	Idx                   [][]int32 // [rank][t*K+k]
}

// NewWorld builds the uniform routing of every rank.
func NewWorld(seed uint64, ranks, ranksPerDomain, experts, topk, hidden int, dt device.DType, tokens []int) *World {
	return NewRoutedWorld(RoutingSpec{}, seed, ranks, ranksPerDomain, experts, topk, hidden, dt, tokens)
}

// NewRoutedWorld builds the routing of every rank with the generator spec
// chooses (GlobalRouting).
func NewRoutedWorld(spec RoutingSpec, seed uint64, ranks, ranksPerDomain, experts, topk, hidden int, dt device.DType, tokens []int) *World {
	w := &World{Seed: seed, Ranks: ranks, RanksPerDomain: ranksPerDomain, Experts: experts, TopK: topk, Hidden: hidden, DType: dt, Tokens: tokens}
	w.Idx = GlobalRouting(spec, seed, tokens[:ranks], topk, experts)
	return w
}

// LocalExperts is L = E / R.
func (w *World) LocalExperts() int { return w.Experts / w.Ranks }

// routing is the reference model (internal/reference) of w's routing: the
// receive order, every layout table but the weights, and each token's
// destinations, which the counts of rows below read.
func (w *World) routing() *reference.World {
	return &reference.World{
		NumRanks: w.Ranks, NumExperts: w.Experts, TopK: w.TopK, Hidden: w.Hidden,
		RanksPerDomain: w.RanksPerDomain, DType: w.DType, TopkIdx: w.Idx[:w.Ranks],
	}
}

// model is the reference model of w's routing and router weights, its
// permuted segments padded to pad rows: what the checks compare against.
// It holds no payload: the checks make the rows they need with XRow and
// ScaleRow, one at a time, as a full-size case is too large to hold for
// every rank.
func (w *World) model(pad int) *reference.World {
	m := w.routing()
	m.PadMultiple = pad
	m.Weights = make([][]float32, w.Ranks)
	for s := range w.Ranks {
		m.Weights[s] = make([]float32, w.Tokens[s]*w.TopK)
		for t := range w.Tokens[s] {
			for k := range w.TopK {
				m.Weights[s][t*w.TopK+k] = w.Weight(s, t, k)
			}
		}
	}
	return m
}

// PeerRows is the rows rank d receives that it reads from another GPU:
// over NVLink on a cluster's node, the bytes a peer-copy bandwidth bounds.
// A row comes from its source rank when the source is in d's domain, else
// from its forwarder there (the rank of d's domain with the source's local
// index); it is a peer row unless that rank is d itself, whose rows are
// copies within d's GPU. With one domain (RanksPerDomain 0 or Ranks) that
// is every row but d's own tokens'. Rows a capacity drops are counted.
func (w *World) PeerRows(d int) int {
	D := w.RanksPerDomain
	if D <= 0 {
		D = w.Ranks
	}
	lay := w.routing().Layout(d)
	n := 0
	for _, s := range lay.SrcRank {
		via := int(s)
		if via/D != d/D {
			via = d/D*D + via%D
		}
		if via != d {
			n++
		}
	}
	return n
}

// RDMARows is the DESIGN.md section 6 RDMA row count of rank s: the sum
// over its tokens of the distinct destination domains, its own included.
func (w *World) RDMARows(s int) int { return w.domainRows(s, true) }

// CrossDomainRows is the rows rank s sends across domains over the rail
// (what the hierarchical algorithm really moves between domains): the sum
// over its tokens of the distinct destination domains other than s's own.
// It is RDMARows less the tokens that reach s's own domain.
func (w *World) CrossDomainRows(s int) int { return w.domainRows(s, false) }

// domainRows sums over the tokens of rank s the distinct destination
// domains, s's own counted only when own.
func (w *World) domainRows(s int, own bool) int {
	m := w.routing()
	n := 0
	mine := s / w.RanksPerDomain
	for t := range w.Tokens[s] {
		last := -1
		for _, d := range m.Dests(s, t) { // ascending, so a domain's ranks are adjacent
			if dom := d / w.RanksPerDomain; dom != last {
				if own || dom != mine {
					n++
				}
				last = dom
			}
		}
	}
	return n
}

// FlatRemoteRows is the rows rank s would send across domains in a flat
// scheme, where every token goes straight to every destination rank: the
// sum over its tokens of the destination ranks outside s's domain.
func (w *World) FlatRemoteRows(s int) int {
	m := w.routing()
	n := 0
	own := s / w.RanksPerDomain
	for t := range w.Tokens[s] {
		for _, d := range m.Dests(s, t) {
			if d/w.RanksPerDomain != own {
				n++
			}
		}
	}
	return n
}

// mix is splitmix64's finaliser.
func mix(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// rowKey is the hash seed of token t of rank s.
func (w *World) rowKey(s, t int) uint64 {
	return mix(w.Seed ^ mix(uint64(s)<<32|uint64(uint32(t))))
}

// XRow writes the payload row of token t of rank s into dst (H elements of
// the world's dtype). Elements are small integers in [-16, 16] drawn from a
// hash of (seed, s, t, j): every row differs from every other, so a
// misplaced row is caught, and sums of a few of them are exact.
//
// fp8 rows are only moved, never summed, so an fp8 element is simply a
// byte of that hash, any of the 256 patterns (NaNs included: a row must
// arrive unchanged whatever its bits).
func (w *World) XRow(dst []byte, s, t int) {
	k := w.rowKey(s, t)
	if w.DType == device.FP8E4M3 {
		for j := range w.Hidden {
			dst[j] = byte(mix(k + uint64(j)))
		}
		return
	}
	for j := range w.Hidden {
		v := float32(int(mix(k+uint64(j))%33) - 16)
		device.StoreFloat32(w.DType, dst, j, v)
	}
}

// ScaleCols is the fp32 scales of an fp8 row, H/128; 0 for other dtypes.
func (w *World) ScaleCols() int {
	if w.DType != device.FP8E4M3 {
		return 0
	}
	return w.Hidden / device.FP8ScaleChannels
}

// ScaleRow writes the fp8 scales of token t of rank s into dst (ScaleCols
// fp32 values, little-endian): positive normal numbers in [2^-8, 2^8) drawn
// from a hash of (seed, s, t, j) apart from the row's, so that a scale row
// that travels with the wrong row, or lands in the wrong place, is caught.
func (w *World) ScaleRow(dst []byte, s, t int) {
	k := mix(w.rowKey(s, t) ^ 0x5ca1e5ca1e)
	for j := range w.ScaleCols() {
		bits := uint32(0x3b800000) + uint32(mix(k+uint64(j))%(16<<23)) // exponent -8 .. 7, any mantissa
		binary.LittleEndian.PutUint32(dst[4*j:], bits)
	}
}

// Weight is the router weight of slot k of token t of rank s: a multiple of
// 1/64 in (0, 1].
func (w *World) Weight(s, t, k int) float32 {
	return float32(mix(w.rowKey(s, t)^0xa5a5a5a5^uint64(k)<<48)%64+1) / 64
}

// Inputs returns rank r's x [T, H] bytes, topk indices and weights. An fp8
// world's scales are InputScales.
func (w *World) Inputs(r int) (x []byte, idx []int32, weights []float32) {
	rb := w.Hidden * w.DType.Size()
	x = make([]byte, w.Tokens[r]*rb)
	weights = make([]float32, w.Tokens[r]*w.TopK)
	for t := range w.Tokens[r] {
		w.XRow(x[t*rb:(t+1)*rb], r, t)
		for k := range w.TopK {
			weights[t*w.TopK+k] = w.Weight(r, t, k)
		}
	}
	return x, w.Idx[r], weights
}

// InputScales returns rank r's fp8 scales [T, H/128] as fp32 bytes; nil
// unless the world is fp8.
func (w *World) InputScales(r int) []byte {
	sb := 4 * w.ScaleCols()
	if sb == 0 {
		return nil
	}
	out := make([]byte, w.Tokens[r]*sb)
	for t := range w.Tokens[r] {
		w.ScaleRow(out[t*sb:(t+1)*sb], r, t)
	}
	return out
}

// WithDType returns a world of the same routing (shared, not copied) whose
// payload is of dtype dt: the bf16 world of an fp8 case's calls that
// combine.
func (w *World) WithDType(dt device.DType) *World {
	c := *w
	c.DType = dt
	return &c
}
