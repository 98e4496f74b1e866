package bench

import (
	"slices"
	"strings"
	"testing"
)

var specs = []RoutingSpec{
	{Kind: RoutingUniform},
	{Kind: RoutingBalanced},
	{Kind: RoutingZipf, ZipfS: 1.1},
	{Kind: RoutingZipf, ZipfS: 3}, // heavy skew: the exact fallback runs
}

// checkValid fails on an expert out of range or repeated in a token.
func checkValid(t *testing.T, name string, idx []int32, tokens, topk, experts int) {
	t.Helper()
	if len(idx) != tokens*topk {
		t.Fatalf("%s: %d indices, want %d", name, len(idx), tokens*topk)
	}
	for tok := range tokens {
		row := idx[tok*topk : (tok+1)*topk]
		for k, e := range row {
			if e < 0 || int(e) >= experts {
				t.Fatalf("%s: token %d slot %d: expert %d out of range", name, tok, k, e)
			}
			if slices.Contains(row[:k], e) {
				t.Fatalf("%s: token %d: expert %d repeated in %v", name, tok, e, row)
			}
		}
	}
}

func TestGlobalRoutingDeterministicValid(t *testing.T) {
	for _, spec := range specs {
		for _, tc := range []struct {
			tokens        []int
			topk, experts int
		}{
			{[]int{100, 0, 37, 64}, 8, 64},
			{[]int{50, 50}, 8, 8},     // K = E: every token takes every expert
			{[]int{30, 31, 32}, 6, 7}, // refills mid-token
			{[]int{16, 16, 16, 16}, 16, 896},
			{[]int{1}, 1, 1},
		} {
			name := spec.String()
			a := GlobalRouting(spec, 9, tc.tokens, tc.topk, tc.experts)
			b := GlobalRouting(spec, 9, tc.tokens, tc.topk, tc.experts)
			for r := range tc.tokens {
				checkValid(t, name, a[r], tc.tokens[r], tc.topk, tc.experts)
				if !slices.Equal(a[r], b[r]) {
					t.Fatalf("%s: rank %d differs between two calls", name, r)
				}
			}
			// Every rank builds the world itself: the same on each.
			for rank := range tc.tokens {
				w := NewRoutedWorld(spec, 9, len(tc.tokens), len(tc.tokens), tc.experts, tc.topk, 8, 0, tc.tokens)
				if !slices.EqualFunc(w.Idx, a, slices.Equal) {
					t.Fatalf("%s: rank %d's world differs", name, rank)
				}
			}
			if tc.experts > 2*tc.topk && tc.tokens[0] > 10 {
				if c := GlobalRouting(spec, 10, tc.tokens, tc.topk, tc.experts); slices.Equal(a[0], c[0]) {
					t.Errorf("%s: seeds 9 and 10 gave the same routing", name)
				}
			}
		}
	}
}

func loads(idx [][]int32, experts int) []int {
	n := make([]int, experts)
	for _, r := range idx {
		for _, e := range r {
			n[e]++
		}
	}
	return n
}

func TestBalancedLoads(t *testing.T) {
	for _, tc := range []struct {
		tokens        []int
		topk, experts int
	}{
		{[]int{100, 0, 37, 64}, 8, 64},
		{[]int{30, 31, 32}, 6, 7},
		{[]int{1000, 1000, 1000, 1000}, 8, 256},
		{[]int{3}, 5, 896},
		{[]int{16, 16, 16, 16, 16, 16, 16, 16}, 16, 896},
	} {
		idx := BalancedRouting(3, tc.tokens, tc.topk, tc.experts)
		n := loads(idx, tc.experts)
		if lo, hi := slices.Min(n), slices.Max(n); hi-lo > 1 {
			t.Errorf("%+v: expert loads from %d to %d, want within 1", tc, lo, hi)
		}
		// Not the same few experts every token: rows differ.
		if len(idx[0]) >= 2*tc.topk && slices.Equal(idx[0][:tc.topk], idx[0][tc.topk:2*tc.topk]) && tc.topk < tc.experts {
			t.Errorf("%+v: tokens 0 and 1 have the same experts", tc)
		}
	}
}

func TestZipfSkew(t *testing.T) {
	const experts, topk = 64, 4
	tokens := []int{4000, 4000}
	uni := loads(GlobalRouting(RoutingSpec{Kind: RoutingUniform}, 1, tokens, topk, experts), experts)
	zpf := loads(GlobalRouting(RoutingSpec{Kind: RoutingZipf, ZipfS: 1.1}, 1, tokens, topk, experts), experts)
	mean := float64(2*4000*topk) / experts // 500
	if m := float64(slices.Max(uni)); m > 1.3*mean {
		t.Errorf("uniform: most popular expert %v slots, mean %v", m, mean)
	}
	if m := float64(slices.Max(zpf)); m < 3*mean {
		t.Errorf("zipf s=1.1: most popular expert %v slots, want well above the mean %v", m, mean)
	}
	// The skew grows with s.
	z2 := loads(GlobalRouting(RoutingSpec{Kind: RoutingZipf, ZipfS: 2}, 1, tokens, topk, experts), experts)
	if slices.Min(z2) >= slices.Min(zpf) {
		t.Errorf("zipf: least popular expert %d slots at s=2, %d at s=1.1; want fewer", slices.Min(z2), slices.Min(zpf))
	}
	// Every rank agrees on which experts are popular: ranks 0 and 1
	// separately have the same most popular expert.
	idx := GlobalRouting(RoutingSpec{Kind: RoutingZipf, ZipfS: 1.1}, 1, tokens, topk, experts)
	a, b := loads(idx[:1], experts), loads(idx[1:], experts)
	if slices.Index(a, slices.Max(a)) != slices.Index(b, slices.Max(b)) {
		t.Error("zipf: ranks 0 and 1 have different most popular experts")
	}
}

func TestRoutingSpecValidate(t *testing.T) {
	for _, tc := range []struct {
		spec RoutingSpec
		want string
	}{
		{RoutingSpec{}, ""},
		{RoutingSpec{Kind: "balanced"}, ""},
		{RoutingSpec{Kind: "zipf", ZipfS: 1.1}, ""},
		{RoutingSpec{Kind: "zipf"}, "needs zipf_s > 0"},
		{RoutingSpec{Kind: "zipf", ZipfS: -1}, "needs zipf_s > 0"},
		{RoutingSpec{Kind: "uniform", ZipfS: 1.1}, "applies to routing zipf only"},
		{RoutingSpec{Kind: "hot"}, `routing "hot"`},
	} {
		err := tc.spec.Validate()
		if (err == nil) != (tc.want == "") || (err != nil && !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("%+v: %v, want %q", tc.spec, err, tc.want)
		}
	}
}
