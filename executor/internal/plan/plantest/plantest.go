// Package plantest draws routings for the layout's tests: the host
// layout's (package plan) and the GPU layout kernels' (package gpu).
package plantest

import (
	"math/rand/v2"
	"slices"
)

// Routing draws T tokens of K slots over E experts: a fifth of the slots
// empty, the others distinct experts, two thirds of them drawn from hot
// when it is not nil (so that tokens pick several experts of one rank).
func Routing(rng *rand.Rand, T, E, K int, hot []int) []int32 {
	idx := make([]int32, T*K)
	for t := range T {
		row := idx[t*K : (t+1)*K]
		for k := range row {
			row[k] = -1
			if rng.IntN(5) == 0 {
				continue
			}
			for try := 0; try < 8; try++ {
				e := int32(rng.IntN(E))
				if hot != nil && rng.IntN(3) != 0 {
					e = int32(hot[rng.IntN(len(hot))])
				}
				if !slices.Contains(row, e) {
					row[k] = e
					break
				}
			}
		}
	}
	return idx
}

// FullRows draws T tokens whose K slots all name distinct experts of E.
func FullRows(rng *rand.Rand, T, E, K int) []int32 {
	idx := make([]int32, 0, T*K)
	for range T {
		for _, e := range rng.Perm(E)[:K] {
			idx = append(idx, int32(e))
		}
	}
	return idx
}
