package plan

import (
	"errors"
	"fmt"
	"testing"
)

// fuzzWorld decodes fuzz bytes into a world: R, E, K, PadMultiple and every
// rank's routing (values may be anything, including invalid ones).
func fuzzWorld(data []byte) (cfg Params, R int, routing [][]int32) {
	if len(data) < 4 {
		return cfg, 0, nil
	}
	R = int(data[0])%6 + 1
	L := int(data[1])%5 + 1
	E := R * L
	K := int(data[2])%E + 1
	pad := []int{1, 2, 16}[int(data[3])%3]
	cfg = Params{NumExperts: E, TopK: K, MaxTokensPerRank: 8, PadMultiple: pad}
	data = data[4:]
	routing = make([][]int32, R)
	for r := range R {
		if len(data) == 0 {
			break
		}
		T := int(data[0]) % 10 // may exceed MaxTokensPerRank
		data = data[1:]
		for range T * K {
			v := int32(-1)
			if len(data) > 0 {
				v = int32(int8(data[0]))
				data = data[1:]
			}
			routing[r] = append(routing[r], v)
		}
	}
	return cfg, R, routing
}

// FuzzLayout checks that ComputeLayout never panics, rejects exactly the
// invalid routings with a RoutingError, and otherwise returns layouts whose
// tables are consistent with each other.
func FuzzLayout(f *testing.F) {
	f.Add([]byte{3, 1, 1, 0, 2, 0, 1, 2, 3, 1, 5, 0})
	f.Add([]byte{0, 0, 0, 0})
	f.Add([]byte{5, 4, 7, 2, 9, 1, 2, 3, 4, 5, 6, 7, 8, 200, 100, 3})
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, R, routing := fuzzWorld(data)
		if R == 0 {
			return
		}
		valid := true
		for s := range routing {
			if checkRouting(s, routing[s], cfg.TopK, cfg.NumExperts, cfg.MaxTokensPerRank) != nil {
				valid = false
			}
		}
		total := 0
		for r := range R {
			lay, err := ComputeLayout(r, cfg, routing)
			if !valid {
				var re *RoutingError
				if !errors.As(err, &re) || !errors.Is(err, ErrInvalidInput) {
					t.Fatalf("invalid routing: error %v, want a RoutingError", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("valid routing rejected: %v", err)
			}
			if err := checkLayout(lay, cfg); err != nil {
				t.Fatalf("rank %d: %v", r, err)
			}
			total += lay.RecvCount
		}
		sent := 0
		for r := range R {
			lay, _ := ComputeLayout(r, cfg, routing)
			sent += len(lay.SendDest)
		}
		if sent != total {
			t.Fatalf("%d (token, destination) pairs sent, %d rows received", sent, total)
		}
	})
}

// checkLayout checks a layout's internal consistency: positions fill each
// expert's segment exactly once, in receive order, inside the padded
// bounds.
func checkLayout(lay *Layout, cfg Params) error {
	K, L := lay.TopK, lay.NumLocalExperts
	if len(lay.RecvSrcRank) != lay.RecvCount || len(lay.Pos) != lay.RecvCount*K {
		return fmt.Errorf("receive tables have %d rows, RecvCount %d", len(lay.RecvSrcRank), lay.RecvCount)
	}
	seen := make([]bool, lay.PermutedCount)
	next := make([]int32, L)
	for l := range L {
		next[l] = lay.ExpertOffsets[l]
		if int(lay.ExpertOffsets[l+1]-lay.ExpertOffsets[l])%lay.PadMultiple != 0 {
			return fmt.Errorf("expert %d segment not padded to %d", l, lay.PadMultiple)
		}
	}
	for i := range lay.RecvCount {
		any := false
		for k := range K {
			l, p := lay.RecvIdx[i*K+k], lay.Pos[i*K+k]
			if (l < 0) != (p < 0) {
				return fmt.Errorf("row %d slot %d: local expert %d but position %d", i, k, l, p)
			}
			if l < 0 {
				continue
			}
			any = true
			if p != next[l] || seen[p] {
				return fmt.Errorf("row %d slot %d: position %d, want %d", i, k, p, next[l])
			}
			seen[p] = true
			next[l]++
		}
		if !any {
			return fmt.Errorf("row %d received but names none of this rank's experts", i)
		}
	}
	for l := range L {
		if next[l]-lay.ExpertOffsets[l] != lay.TokensPerExpert[l] {
			return fmt.Errorf("expert %d: %d rows placed, TokensPerExpert %d", l, next[l]-lay.ExpertOffsets[l], lay.TokensPerExpert[l])
		}
	}
	return nil
}
