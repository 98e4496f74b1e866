package bench

import (
	"slices"
	"testing"

	"github.com/goep/goep/device"
)

func TestRoutingDeterministic(t *testing.T) {
	a := Routing(42, 3, 100, 8, 64)
	b := Routing(42, 3, 100, 8, 64)
	if !slices.Equal(a, b) {
		t.Fatal("same (seed, rank) gave different routings")
	}
	if slices.Equal(a, Routing(42, 4, 100, 8, 64)) {
		t.Error("ranks 3 and 4 got the same routing")
	}
	if slices.Equal(a, Routing(43, 3, 100, 8, 64)) {
		t.Error("seeds 42 and 43 gave the same routing")
	}
}

func TestRoutingValid(t *testing.T) {
	for _, tc := range []struct{ tokens, topk, experts int }{
		{0, 2, 8}, {1, 1, 1}, {50, 8, 8}, {200, 8, 64}, {100, 2, 256}, {64, 6, 7},
	} {
		idx := Routing(1, 0, tc.tokens, tc.topk, tc.experts)
		if len(idx) != tc.tokens*tc.topk {
			t.Fatalf("%+v: %d indices", tc, len(idx))
		}
		for tok := range tc.tokens {
			row := idx[tok*tc.topk : (tok+1)*tc.topk]
			for k, e := range row {
				if e < 0 || int(e) >= tc.experts {
					t.Fatalf("%+v: token %d slot %d: expert %d out of range", tc, tok, k, e)
				}
				if slices.Contains(row[:k], e) {
					t.Fatalf("%+v: token %d: expert %d repeated in %v", tc, tok, e, row)
				}
			}
		}
	}
}

// TestRoutingUniform checks that every expert is chosen about equally
// often, in every slot position.
func TestRoutingUniform(t *testing.T) {
	const tokens, topk, experts = 20000, 4, 16
	idx := Routing(7, 1, tokens, topk, experts)
	for k := range topk {
		count := make([]int, experts)
		for tok := range tokens {
			count[idx[tok*topk+k]]++
		}
		want := float64(tokens) / experts // 1250, sd about 34
		for e, c := range count {
			if d := float64(c) - want; d > 200 || d < -200 {
				t.Errorf("slot %d: expert %d chosen %d times, want about %.0f", k, e, c, want)
			}
		}
	}
}

func TestWorldRecvOrder(t *testing.T) {
	w := NewWorld(3, 4, 4, 8, 3, 16, device.BF16, []int{10, 0, 7, 12})
	m := w.model(1)
	for d := range 4 {
		lay := m.Layout(d)
		type source struct{ Rank, Token int }
		recv := make([]source, lay.RecvCount)
		for i := range recv {
			recv[i] = source{int(lay.SrcRank[i]), int(lay.SrcToken[i])}
		}
		for i := 1; i < len(recv); i++ {
			a, b := recv[i-1], recv[i]
			if a.Rank > b.Rank || (a.Rank == b.Rank && a.Token >= b.Token) {
				t.Fatalf("rank %d: rows %d and %d out of order: %v then %v", d, i-1, i, a, b)
			}
		}
		for _, src := range recv {
			if !slices.Contains(m.Dests(src.Rank, src.Token), d) {
				t.Fatalf("rank %d receives %v, which does not go there", d, src)
			}
		}
	}
}

// TestDomainRows checks RDMARows, CrossDomainRows and FlatRemoteRows on a
// world small enough to count by hand: R 4, D 2 (domains {0,1} and {2,3}),
// E 4 (expert e on rank e), K 3.
func TestDomainRows(t *testing.T) {
	w := &World{
		Ranks: 4, RanksPerDomain: 2, Experts: 4, TopK: 3, Hidden: 8, DType: device.BF16,
		Tokens: []int{3, 0, 2, 1},
		Idx: [][]int32{
			{
				1, -1, -1, // ranks {1}: domains {0}; design 1, cross 0, flat 0
				2, 3, 0, //   ranks {0,2,3}: domains {0,1}; design 2, cross 1, flat 2
				3, -1, 2, //  ranks {2,3}: domains {1}; design 1, cross 1, flat 2
			},
			{},
			{
				0, 1, 2, //    ranks {0,1,2}: domains {0,1}; design 2, cross 1, flat 2
				-1, -1, -1, // nowhere; 0, 0, 0
			},
			{
				3, 1, -1, // ranks {1,3}: domains {0,1}; design 2, cross 1, flat 1
			},
		},
	}
	for _, tc := range []struct {
		rank, design, cross, flat int
	}{
		{0, 4, 2, 4},
		{1, 0, 0, 0},
		{2, 2, 1, 2},
		{3, 2, 1, 1},
	} {
		if got := w.RDMARows(tc.rank); got != tc.design {
			t.Errorf("rank %d: RDMARows %d, want %d", tc.rank, got, tc.design)
		}
		if got := w.CrossDomainRows(tc.rank); got != tc.cross {
			t.Errorf("rank %d: CrossDomainRows %d, want %d", tc.rank, got, tc.cross)
		}
		if got := w.FlatRemoteRows(tc.rank); got != tc.flat {
			t.Errorf("rank %d: FlatRemoteRows %d, want %d", tc.rank, got, tc.flat)
		}
	}
}

// TestPeerRows counts by hand, on TestDomainRows's world, the rows each
// rank reads from another GPU: with 2 domains of 2 (a row from the other
// domain comes from its forwarder, the rank here with the source's local
// index) and as one domain of 4.
func TestPeerRows(t *testing.T) {
	w := &World{
		Ranks: 4, RanksPerDomain: 2, Experts: 4, TopK: 3, Hidden: 8, DType: device.BF16,
		Tokens: []int{3, 0, 2, 1},
		Idx: [][]int32{
			{1, -1, -1, 2, 3, 0, 3, -1, 2}, // to ranks {1}, {0,2,3}, {2,3}
			{},
			{0, 1, 2, -1, -1, -1}, // {0,1,2}, nowhere
			{3, 1, -1},            // {1,3}
		},
	}
	// Rank 0 receives (0,1) (its own) and (2,0) (forwarded by itself);
	// rank 1 (0,0) and (2,0) (forwarded by rank 0), and (3,0) (by
	// itself); rank 2 (0,1) and (0,2) (forwarded by itself) and (2,0) (its
	// own); rank 3 (0,1) and (0,2) (forwarded by rank 2) and (3,0).
	for _, tc := range []struct {
		perDomain int
		want      []int
	}{
		{2, []int{0, 2, 0, 2}},
		{4, []int{1, 3, 2, 2}},
		{0, []int{1, 3, 2, 2}}, // 0: one domain
	} {
		w.RanksPerDomain = tc.perDomain
		for d, want := range tc.want {
			if got := w.PeerRows(d); got != want {
				t.Errorf("%d ranks per domain: rank %d: PeerRows %d, want %d", tc.perDomain, d, got, want)
			}
		}
	}
}

// TestDomainRowsBounds checks on random worlds what holds for any routing:
// a token crosses at most once per remote domain, so cross <= flat; the
// design count adds at most one (the own domain) per token; one rank per
// domain makes the two schemes the same; one domain sends nothing across.
func TestDomainRowsBounds(t *testing.T) {
	tokens := []int{40, 0, 17, 33, 25, 8, 1, 60}
	for _, d := range []int{1, 2, 4, 8} {
		w := NewWorld(11, 8, d, 32, 6, 4, device.BF16, tokens)
		for s := range 8 {
			design, cross, flat := w.RDMARows(s), w.CrossDomainRows(s), w.FlatRemoteRows(s)
			if cross > design || design > cross+tokens[s] || flat < cross {
				t.Errorf("D %d rank %d: design %d, cross %d, flat %d", d, s, design, cross, flat)
			}
			if d == 1 && flat != cross {
				t.Errorf("D 1 rank %d: flat %d != cross %d", s, flat, cross)
			}
			if d == 8 && (cross != 0 || flat != 0) {
				t.Errorf("one domain, rank %d: cross %d, flat %d", s, cross, flat)
			}
		}
	}
}
