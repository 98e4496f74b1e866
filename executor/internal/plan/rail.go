package plan

import "slices"

// RailTables are the GPU data path's extra tables of a handle with several
// domains: a pure function of the layout, so that they are tested without
// a GPU. Entries of this domain's pushes and combine sums are numbered by virtual token: v < maxT is this
// rank's token v; v = maxT + n*maxT + f is the f-th token the rail peer in
// domain n forwards here. The own tables index entries v*W + c, the
// forwarded ones (v - maxT)*W + c (c: the destination's index among the
// token's destinations in this domain, ascending).
type RailTables struct {
	// Own tokens: [T*W] entries, [T*K] slots.
	EntTok, EntDest, EntRow, SlotEnt []int32
	// Received rows: the domain rank that sums them in combine (the
	// source, or the forwarder with its local index) and the entry there.
	RecvSrc, RecvEnt []int32 // [valid received rows]
	// Forwarded tokens: [M*maxT*W] entries, [M*maxT*K] slots.
	FTok, FDest, FRow, FSlot []int32
	// Merge: [T] own domain kept a row of t; [M*T] token t's row in domain
	// n's partials (-1: none); [T*K] domain of slot k's expert (-1: empty).
	OwnLive, RemIdx, SlotDom []int32
	// The rail's send slots, as the GPU fills them: entry j puts token
	// RailTok[j] at row RailRow[j] of the slot for domain RailDest[j]
	// (every token of DomainTokens(n), in order, for every other domain n,
	// dropped rows included: the slot is what the host-staged rail's fill
	// writes); the slot for domain n holds OwnCount[n] rows.
	RailTok, RailDest, RailRow []int32
	// The rail's send slots of a combine: entry j puts row PartSrc[j] of
	// the forwarded tokens' partials (domain n's f-th at n*maxT + f) at
	// row PartRow[j] (= f) of the slot for domain PartDest[j] (= n); the
	// slot for domain n holds FwdCount[n] rows.
	PartSrc, PartDest, PartRow []int32
	FwdCount                   []int // rows forwarded here from each domain
	OwnCount                   []int // this rank's tokens that reach each domain
}

// BuildRailTables builds the tables of lay (D < R) with W entries per
// token; routing is every rank's.
func BuildRailTables(lay *Layout, p Params, routing [][]int32, W int) *RailTables {
	D, R, K, L := lay.RanksPerDomain, lay.NumRanks, lay.TopK, lay.NumLocalExperts
	M, maxT, rank := R/D, p.MaxTokensPerRank, lay.Rank
	mine := rank / D
	T := lay.NumTokens
	valid := func(d int) int { return ValidRecv(lay, p, d) }
	filled := func(n int) []int32 {
		s := make([]int32, n)
		for i := range s {
			s[i] = -1
		}
		return s
	}
	rt := &RailTables{
		EntTok: filled(T * W), EntDest: filled(T * W), EntRow: filled(T * W), SlotEnt: filled(T * K),
		FTok: filled(M * maxT * W), FDest: filled(M * maxT * W), FRow: filled(M * maxT * W), FSlot: filled(M * maxT * K),
		OwnLive: make([]int32, T), RemIdx: filled(M * T), SlotDom: filled(T * K),
		FwdCount: make([]int, M), OwnCount: make([]int, M),
	}
	// fill writes the entries v*W + c of token t of side (tables tok,
	// dest, row) and the entry of each of its slots whose expert is in
	// this domain (slots, K of them).
	fill := func(side *SendSide, t, v int, tok, dest, row, slots []int32) {
		c := 0
		for j := side.SendOffsets[t]; j < side.SendOffsets[t+1]; j++ {
			d, r := int(side.SendDest[j]), int(side.SendRow[j])
			if d/D != mine {
				continue
			}
			ent := v*W + c
			tok[ent], dest[ent] = int32(v), int32(d%D)
			if r < valid(d) {
				row[ent] = int32(r)
				for k := range K {
					if ex := side.SlotExpert[t*K+k]; ex >= 0 && int(ex)/L == d {
						slots[k] = int32(ent)
					}
				}
			}
			c++
		}
	}
	for t := range T {
		fill(&lay.SendSide, t, t, rt.EntTok, rt.EntDest, rt.EntRow, rt.SlotEnt[t*K:(t+1)*K])
	}
	for n := range M {
		if n == mine {
			continue
		}
		side := lay.Rail[n]
		toks := side.DomainTokens(nil, mine, D)
		rt.FwdCount[n] = len(toks)
		for f, t := range toks {
			rt.PartSrc = append(rt.PartSrc, int32(n*maxT+f))
			rt.PartDest = append(rt.PartDest, int32(n))
			rt.PartRow = append(rt.PartRow, int32(f))
			v := n*maxT + f
			fill(side, int(t), v, rt.FTok, rt.FDest, rt.FRow, rt.FSlot[v*K:(v+1)*K])
		}
		own := lay.DomainTokens(nil, n, D)
		rt.OwnCount[n] = len(own)
		for i, t := range own {
			rt.RailTok = append(rt.RailTok, t)
			rt.RailDest = append(rt.RailDest, int32(n))
			rt.RailRow = append(rt.RailRow, int32(i))
			if Reaches(lay, p, &lay.SendSide, int(t), n) {
				rt.RemIdx[n*T+int(t)] = int32(i)
			}
		}
	}
	for t := range T {
		if Reaches(lay, p, &lay.SendSide, t, mine) {
			rt.OwnLive[t] = 1
		}
		for k := range K {
			if ex := lay.SlotExpert[t*K+k]; ex >= 0 {
				rt.SlotDom[t*K+k] = ex / int32(L) / int32(D)
			}
		}
	}
	n := valid(rank)
	rt.RecvSrc, rt.RecvEnt = make([]int32, n), make([]int32, n)
	for i := range n {
		s, t := int(lay.RecvSrcRank[i]), int(lay.RecvSrcToken[i])
		v := t
		if s/D != mine {
			v = maxT + (s/D)*maxT + int(lay.RecvFwdRow[i])
		}
		c := 0
		var seen []int
		for _, ex := range routing[s][t*K : (t+1)*K] {
			if ex < 0 {
				continue
			}
			if d := int(ex) / L; d/D == mine && d < rank && !slices.Contains(seen, d) {
				seen = append(seen, d)
				c++
			}
		}
		rt.RecvSrc[i] = int32(s % D)
		rt.RecvEnt[i] = int32(v*W + c)
	}
	return rt
}

// Reaches reports whether token t of side has a row kept (not dropped in
// capacity mode) on some rank of domain n.
func Reaches(lay *Layout, p Params, side *SendSide, t, n int) bool {
	D := lay.RanksPerDomain
	for j := side.SendOffsets[t]; j < side.SendOffsets[t+1]; j++ {
		if d := int(side.SendDest[j]); d/D == n && int(side.SendRow[j]) < ValidRecv(lay, p, d) {
			return true
		}
	}
	return false
}
