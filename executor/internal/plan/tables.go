package plan

import "slices"

// The tables of the CUDA data path in one NVLink domain, as one int32
// array: entTok, entDest, entRow [T*W], slotEnt [T*K], recvSrc, recvEnt
// [rowCap], recvIdx, pos [rowCap*K], -1 where nothing is written. Entry
// e = t*W + c is local token t's c-th destination (ascending). The GPU
// layout kernels (internal/gpulayout/layout.h) write the same array;
// BuildTables is their reference and the host layout's path.

// TableSizes are the parts' lengths, in order.
func TableSizes(T, K, W, rowCap int) []int {
	return []int{T * W, T * W, T * W, T * K, rowCap, rowCap, rowCap * K, rowCap * K}
}

// BuildTables builds the tables of lay (one domain: D = R) from every
// rank's routing, for a handle of rowCap receive rows (at least this
// rank's valid rows) and W = min(K, R) entries per token.
func BuildTables(lay *Layout, p Params, routing [][]int32, W, rowCap int) []int32 {
	T, K, L, me := lay.NumTokens, lay.TopK, lay.NumLocalExperts, lay.Rank
	all, parts := NewTables(T, K, W, rowCap)
	entTok, entDest, entRow, slotEnt := parts[0], parts[1], parts[2], parts[3]
	recvSrc, recvEnt, recvIdx, pos := parts[4], parts[5], parts[6], parts[7]
	for t := range T {
		for j := lay.SendOffsets[t]; j < lay.SendOffsets[t+1]; j++ {
			ent := t*W + int(j-lay.SendOffsets[t])
			d, row := int(lay.SendDest[j]), int(lay.SendRow[j])
			entTok[ent], entDest[ent] = int32(t), int32(d)
			if row >= ValidRecv(lay, p, d) {
				continue
			}
			entRow[ent] = int32(row)
			for k := range K {
				if e := lay.SlotExpert[t*K+k]; e >= 0 && int(e)/L == d {
					slotEnt[t*K+k] = int32(ent)
				}
			}
		}
	}
	n := ValidRecv(lay, p, me)
	for i := range n {
		s, t := int(lay.RecvSrcRank[i]), int(lay.RecvSrcToken[i])
		recvSrc[i] = int32(s)
		// This rank's index among token t's destinations (ascending).
		var below []int32
		for _, x := range routing[s][t*K : (t+1)*K] {
			if d := x / int32(L); x >= 0 && int(d) < me && !slices.Contains(below, d) {
				below = append(below, d)
			}
		}
		recvEnt[i] = int32(t*W + len(below))
	}
	CopyRecvMaps(lay, n, recvIdx, pos)
	return all
}

// NewTables returns tables of the sizes TableSizes gives, all -1, and its
// parts in order.
func NewTables(T, K, W, rowCap int) (all []int32, parts [][]int32) {
	sizes := TableSizes(T, K, W, rowCap)
	total := 0
	for _, s := range sizes {
		total += s
	}
	all = make([]int32, total)
	for i := range all {
		all[i] = -1
	}
	o := 0
	for _, s := range sizes {
		parts = append(parts, all[o:o+s])
		o += s
	}
	return all, parts
}

// CopyRecvMaps copies the first n received rows' RecvIdx and Pos.
func CopyRecvMaps(lay *Layout, n int, recvIdx, pos []int32) {
	K := lay.TopK
	copy(recvIdx, lay.RecvIdx[:n*K])
	copy(pos, lay.Pos[:n*K])
}
