package bench

import (
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
)

// Routing kinds: how the benchmark draws every token's top-k experts.
const (
	// RoutingUniform: each token's K experts are a uniformly random ordered
	// K-subset of the E experts, drawn per rank (Routing).
	RoutingUniform = "uniform"
	// RoutingBalanced: every expert receives the same number of slots over
	// all ranks' tokens, within 1; which experts a token gets is still
	// seeded (BalancedRouting).
	RoutingBalanced = "balanced"
	// RoutingZipf: expert popularity follows Zipf's law with exponent
	// ZipfS, the most popular experts a seeded permutation of the experts;
	// no token names an expert twice (ZipfRouting).
	RoutingZipf = "zipf"
)

// RoutingKinds lists the routing kinds.
var RoutingKinds = []string{RoutingUniform, RoutingBalanced, RoutingZipf}

// RoutingSpec chooses a routing generator.
type RoutingSpec struct {
	Kind  string  // RoutingUniform, RoutingBalanced or RoutingZipf ("" = uniform)
	ZipfS float64 // the Zipf exponent s > 0 (RoutingZipf only)
}

// Validate says what is wrong with the spec.
func (s RoutingSpec) Validate() error {
	switch s.Kind {
	case "", RoutingUniform, RoutingBalanced:
		if s.ZipfS != 0 {
			return fmt.Errorf("zipf_s %g is set but routing is %q; zipf_s applies to routing zipf only", s.ZipfS, s.kind())
		}
	case RoutingZipf:
		if !(s.ZipfS > 0) || math.IsInf(s.ZipfS, 0) {
			return fmt.Errorf("routing zipf needs zipf_s > 0 (e.g. 1.1), got %g", s.ZipfS)
		}
	default:
		return fmt.Errorf("routing %q: want uniform, balanced or zipf", s.Kind)
	}
	return nil
}

func (s RoutingSpec) kind() string {
	if s.Kind == "" {
		return RoutingUniform
	}
	return s.Kind
}

// String is "uniform", "balanced" or "zipf(s=1.1)".
func (s RoutingSpec) String() string {
	if s.Kind == RoutingZipf {
		return fmt.Sprintf("zipf(s=%g)", s.ZipfS)
	}
	return s.kind()
}

// GlobalRouting returns the routing of every rank ([rank][t*topk+k]), rank
// r having tokens[r] tokens. It depends only on (spec, seed, tokens, topk,
// experts), so every rank builds the same global routing without
// communication. 1 <= topk <= experts.
func GlobalRouting(spec RoutingSpec, seed uint64, tokens []int, topk, experts int) [][]int32 {
	out := make([][]int32, len(tokens))
	switch spec.kind() {
	case RoutingBalanced:
		return BalancedRouting(seed, tokens, topk, experts)
	case RoutingZipf:
		z := newZipf(seed, spec.ZipfS, experts)
		for r, t := range tokens {
			out[r] = z.routing(seed, r, t, topk)
		}
	default:
		for r, t := range tokens {
			out[r] = Routing(seed, r, t, topk, experts)
		}
	}
	return out
}

// BalancedRouting returns a routing of every rank in which every expert
// gets floor(S/E) or ceil(S/E) of the S = sum(tokens)*topk slots, and no
// token names an expert twice.
//
// The tokens are taken in global order (rank 0's, then rank 1's, ...), and
// each slot takes a random expert among those with the lowest load so far
// (a pool, refilled with every expert when it empties; the experts of the
// token being filled wait for the next token). Loads therefore never
// differ by more than 1. One PCG stream of the seed draws it all, so the
// result is the same on every rank.
func BalancedRouting(seed uint64, tokens []int, topk, experts int) [][]int32 {
	rng := rand.New(rand.NewPCG(seed, 0xba1a_0ced_5eed_0001))
	out := make([][]int32, len(tokens))
	pool := make([]int32, 0, experts) // experts at the lowest load
	fill := func(skip []int32) {
		for e := range int32(experts) {
			used := false
			for _, x := range skip {
				if x == e {
					used = true
					break
				}
			}
			if !used {
				pool = append(pool, e)
			}
		}
	}
	fill(nil)
	var deferred []int32 // this token's experts, out of the pool after a refill
	for r, n := range tokens {
		idx := make([]int32, n*topk)
		for t := range n {
			row := idx[t*topk : (t+1)*topk]
			deferred = deferred[:0]
			for k := range topk {
				if len(pool) == 0 {
					fill(row[:k])
					deferred = append(deferred, row[:k]...)
				}
				i := rng.IntN(len(pool))
				row[k] = pool[i]
				pool[i] = pool[len(pool)-1]
				pool = pool[:len(pool)-1]
			}
			pool = append(pool, deferred...)
		}
		out[r] = idx
	}
	return out
}

// zipf draws experts with probability proportional to 1/(p+1)^s, p the
// expert's popularity rank (0 = most popular) in a seeded permutation.
type zipf struct {
	cdf    []float64 // cumulative weight by popularity rank
	expert []int32   // popularity rank -> expert
}

func newZipf(seed uint64, s float64, experts int) *zipf {
	rng := rand.New(rand.NewPCG(seed, 0x21bf_5eed_0000_0002))
	z := &zipf{cdf: make([]float64, experts), expert: make([]int32, experts)}
	sum := 0.0
	for p := range experts {
		sum += math.Pow(float64(p+1), -s)
		z.cdf[p] = sum
		z.expert[p] = int32(p)
	}
	rng.Shuffle(experts, func(i, j int) { z.expert[i], z.expert[j] = z.expert[j], z.expert[i] })
	return z
}

// ZipfRouting returns rank's routing under Zipf popularity with exponent s:
// each token's experts are drawn one by one from the popularity law
// restricted to the experts it does not have yet. The popularity order
// depends only on (seed, s, experts), the draws on (seed, rank), so every
// rank builds the same global routing.
func ZipfRouting(seed uint64, s float64, rank, tokens, topk, experts int) []int32 {
	return newZipf(seed, s, experts).routing(seed, rank, tokens, topk)
}

func (z *zipf) routing(seed uint64, rank, tokens, topk int) []int32 {
	rng := rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15^uint64(rank)^0x21bf<<48))
	e := len(z.cdf)
	total := z.cdf[e-1]
	out := make([]int32, tokens*topk)
	chosen := make([]int, 0, topk) // popularity ranks of this token
	has := func(p int) bool {
		for _, x := range chosen {
			if x == p {
				return true
			}
		}
		return false
	}
	for t := range tokens {
		chosen = chosen[:0]
		for k := range topk {
			p := -1
			// Rejection from the full law (cheap while few are taken) ...
			for range 32 {
				q := sort.SearchFloat64s(z.cdf, rng.Float64()*total)
				q = min(q, e-1)
				if !has(q) {
					p = q
					break
				}
			}
			// ... else an exact draw from the remaining experts.
			if p < 0 {
				rest := total
				for _, x := range chosen {
					rest -= z.weight(x)
				}
				u := rng.Float64() * rest
				for q := range e {
					if has(q) {
						continue
					}
					p = q
					if u -= z.weight(q); u < 0 {
						break
					}
				}
			}
			chosen = append(chosen, p)
			out[t*topk+k] = z.expert[p]
		}
	}
	return out
}

func (z *zipf) weight(p int) float64 {
	if p == 0 {
		return z.cdf[0]
	}
	return z.cdf[p] - z.cdf[p-1]
}
