package reference

import "slices"

// RankLayout is the layout of one rank d (DESIGN.md section 2, Layout).
// N = RecvCount, K = TopK, L = NumLocalExperts.
type RankLayout struct {
	// RecvCount is N_d: one row per source token (s, t) that has at least
	// one slot naming an expert on d, whatever number of d's experts it
	// chose.
	RecvCount int
	// SrcRank[i], SrcToken[i] are received row i's source (s, t). Rows are
	// in receive order: s ascending, then t ascending.
	SrcRank, SrcToken []int32
	// RecvIdx [N, K]: RecvIdx[i*K+k] = e % L if slot k of (s, t) names an
	// expert e on d, else -1.
	RecvIdx []int32
	// RecvWeights [N, K]: the source's weight of each slot kept in RecvIdx,
	// 0 elsewhere; nil for an unweighted World.
	RecvWeights []float32
	// TokensPerExpert [L]: the number of rows i with some RecvIdx[i*K+k] == e.
	TokensPerExpert []int
	// ExpertOffsets [L+1]: ExpertOffsets[0] = 0, ExpertOffsets[e+1] =
	// ExpertOffsets[e] + roundUp(TokensPerExpert[e], PadMultiple). Expert
	// e's segment of the permuted layout is [ExpertOffsets[e],
	// ExpertOffsets[e+1]).
	ExpertOffsets []int
	// PermutedCount is P_d = ExpertOffsets[L], padding included.
	PermutedCount int
	// Pos [N, K]: for RecvIdx[i*K+k] = e >= 0, ExpertOffsets[e] + the number
	// of rows before i (in receive order) that chose e; else -1.
	Pos []int32
}

// Layout returns rank d's layout, written straight from the definition.
// The World must be valid (Validate); otherwise the result is undefined.
func (w *World) Layout(d int) RankLayout {
	K, L := w.TopK, w.NumLocalExperts()
	var lay RankLayout
	// Received rows: every (s, t), s ascending then t ascending, that has a
	// slot naming an expert on d.
	for s := range w.NumRanks {
		for t := range w.NumTokens(s) {
			idx, weights := w.RecvRow(d, s, t)
			if idx == nil {
				continue
			}
			lay.SrcRank = append(lay.SrcRank, int32(s))
			lay.SrcToken = append(lay.SrcToken, int32(t))
			lay.RecvIdx = append(lay.RecvIdx, idx...)
			lay.RecvWeights = append(lay.RecvWeights, weights...)
		}
	}
	lay.RecvCount = len(lay.SrcRank)
	if w.Weights != nil && lay.RecvWeights == nil {
		lay.RecvWeights = []float32{}
	}

	// Rows per local expert, then padded segments in expert order.
	lay.TokensPerExpert = make([]int, L)
	for _, e := range lay.RecvIdx {
		if e >= 0 {
			lay.TokensPerExpert[e]++
		}
	}
	p := w.pad()
	lay.ExpertOffsets = make([]int, L+1)
	for e := range L {
		padded := (lay.TokensPerExpert[e] + p - 1) / p * p
		lay.ExpertOffsets[e+1] = lay.ExpertOffsets[e] + padded
	}
	lay.PermutedCount = lay.ExpertOffsets[L]

	// Position of (i, k): e's segment start plus i's rank among e's rows.
	lay.Pos = make([]int32, lay.RecvCount*K)
	seen := make([]int, L)
	for i := range lay.RecvCount {
		for k := range K {
			e := lay.RecvIdx[i*K+k]
			if e < 0 {
				lay.Pos[i*K+k] = -1
				continue
			}
			lay.Pos[i*K+k] = int32(lay.ExpertOffsets[e] + seen[e])
			seen[e]++
		}
	}
	return lay
}

// RecvRow is source token (s, t)'s row in rank d's layout: its RecvIdx row
// [K] (e % L for a slot naming an expert e on d, that is e / L == d; else
// -1) and its RecvWeights row [K] (the source's weight of each slot kept,
// 0 elsewhere; nil for an unweighted World). Both are nil when no slot of
// (s, t) names an expert on d: d does not receive it.
func (w *World) RecvRow(d, s, t int) (idx []int32, weights []float32) {
	K, L := w.TopK, w.NumLocalExperts()
	for k, e := range w.TopkIdx[s][t*K : (t+1)*K] {
		if e < 0 || int(e)/L != d {
			continue
		}
		if idx == nil {
			idx = slices.Repeat([]int32{-1}, K)
			if w.Weights != nil {
				weights = make([]float32, K)
			}
		}
		idx[k] = e % int32(L)
		if weights != nil {
			weights[k] = w.Weights[s][t*K+k]
		}
	}
	return idx, weights
}

// Dests returns the ranks that source token (s, t) goes to, ascending: the
// ranks of the experts its slots name (expert e lives on rank e / L), each
// once. In capacity mode a rank that drops the row is still one.
func (w *World) Dests(s, t int) []int {
	K, L := w.TopK, w.NumLocalExperts()
	var dests []int
	for _, e := range w.TopkIdx[s][t*K : (t+1)*K] {
		if e >= 0 && !slices.Contains(dests, int(e)/L) {
			dests = append(dests, int(e)/L)
		}
	}
	slices.Sort(dests)
	return dests
}

// PermutedSlots is the inverse of lay.Pos, a row form of Permute: for each
// row p of rank d's permuted outputs (PermutedRows of them), the received
// row i and the slot k whose copy it holds, that is Pos[i][k] = p; -1, -1
// for a row that holds none (padding, and in capacity mode the rows of
// dropped slots and past the valid prefix).
func (w *World) PermutedSlots(lay RankLayout) (rows, slots []int) {
	n := w.PermutedRows(lay)
	rows, slots = slices.Repeat([]int{-1}, n), slices.Repeat([]int{-1}, n)
	for i := range w.validRecv(lay) {
		for k := range w.TopK {
			if p := w.slotPos(lay, i, k); p >= 0 {
				rows[p], slots[p] = i, k
			}
		}
	}
	return rows, slots
}

// Route is one destination of a source token: the rank it went to and its
// row in that rank's receive order.
type Route struct {
	Rank, Row int
}

// Routes returns, for every source rank s and token t, the destinations of
// (s, t) in ascending rank order: routes[s][t]. A token routed nowhere has
// none; in capacity mode a row dropped at its destination (row >=
// MaxRecvTokens) is not a route.
func (w *World) Routes() [][][]Route {
	routes := make([][][]Route, w.NumRanks)
	for s := range w.NumRanks {
		routes[s] = make([][]Route, w.NumTokens(s))
	}
	for d := range w.NumRanks { // ascending, so each list is sorted by rank
		lay := w.Layout(d)
		for i := range w.validRecv(lay) {
			s, t := lay.SrcRank[i], lay.SrcToken[i]
			routes[s][t] = append(routes[s][t], Route{Rank: d, Row: i})
		}
	}
	return routes
}
