package executor

// hierPlan is the host side of a handle's GPU tables with several domains
// (executor/hier_cuda.go): a pure function of the layout, so that it is
// tested without a GPU (hier_plan_test.go). Entries of this domain's
// pushes and combine sums are numbered by virtual token: v < maxT is this
// rank's token v; v = maxT + n*maxT + f is the f-th token the rail peer in
// domain n forwards here. The own tables index entries v*W + c, the
// forwarded ones (v - maxT)*W + c (c: the destination's index among the
// token's destinations in this domain, ascending).
type hierPlan struct {
	// Own tokens: [T*W] entries, [T*K] slots.
	entTok, entDest, entRow, slotEnt []int32
	// Received rows: the domain rank that sums them in combine (the
	// source, or the forwarder with its local index) and the entry there.
	recvSrc, recvEnt []int32 // [valid received rows]
	// Forwarded tokens: [M*maxT*W] entries, [M*maxT*K] slots.
	fTok, fDest, fRow, fSlot []int32
	// Merge: [T] own domain kept a row of t; [M*T] token t's row in domain
	// n's partials (-1: none); [T*K] domain of slot k's expert (-1: empty).
	ownLive, remIdx, slotDom []int32
	// The rail's send slots, as the GPU fills them: entry j puts token
	// railTok[j] at row railRow[j] of the slot for domain railDest[j]
	// (every token of DomainTokens(n), in order, for every other domain n,
	// dropped rows included: the slot is what dispatchFill writes); the
	// slot for domain n holds ownCount[n] rows.
	railTok, railDest, railRow []int32
	// The rail's send slots of a combine: entry j puts row partSrc[j] of
	// the forwarded tokens' partials (domain n's f-th at n*maxT + f) at
	// row partRow[j] (= f) of the slot for domain partDest[j] (= n); the
	// slot for domain n holds fwdCount[n] rows.
	partSrc, partDest, partRow []int32
	fwdCount                   []int // rows forwarded here from each domain
	ownCount                   []int // this rank's tokens that reach each domain
}

// validRecvOf is the number of valid received rows of rank d: its count,
// clipped to the capacity in capacity mode (Engine.validRecv).
func validRecvOf(lay *Layout, cfg Config, d int) int {
	if cfg.Mode == Capacity {
		return min(lay.RecvCounts[d], cfg.MaxRecvTokens)
	}
	return lay.RecvCounts[d]
}

// planHier builds the tables of lay (D < R) with W entries per token;
// routing is every rank's.
func planHier(lay *Layout, cfg Config, routing [][]int32, W int) *hierPlan {
	D, R, K, L := lay.RanksPerDomain, lay.NumRanks, lay.TopK, lay.NumLocalExperts
	M, maxT, rank := R/D, cfg.MaxTokensPerRank, lay.Rank
	mine := rank / D
	T := lay.NumTokens
	valid := func(d int) int { return validRecvOf(lay, cfg, d) }
	filled := func(n int) []int32 {
		s := make([]int32, n)
		for i := range s {
			s[i] = -1
		}
		return s
	}
	p := &hierPlan{
		entTok: filled(T * W), entDest: filled(T * W), entRow: filled(T * W), slotEnt: filled(T * K),
		fTok: filled(M * maxT * W), fDest: filled(M * maxT * W), fRow: filled(M * maxT * W), fSlot: filled(M * maxT * K),
		ownLive: make([]int32, T), remIdx: filled(M * T), slotDom: filled(T * K),
		fwdCount: make([]int, M), ownCount: make([]int, M),
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
		fill(&lay.SendSide, t, t, p.entTok, p.entDest, p.entRow, p.slotEnt[t*K:(t+1)*K])
	}
	for n := range M {
		if n == mine {
			continue
		}
		side := lay.Rail[n]
		toks := side.DomainTokens(nil, mine, D)
		p.fwdCount[n] = len(toks)
		for f, t := range toks {
			p.partSrc = append(p.partSrc, int32(n*maxT+f))
			p.partDest = append(p.partDest, int32(n))
			p.partRow = append(p.partRow, int32(f))
			v := n*maxT + f
			fill(side, int(t), v, p.fTok, p.fDest, p.fRow, p.fSlot[v*K:(v+1)*K])
		}
		own := lay.DomainTokens(nil, n, D)
		p.ownCount[n] = len(own)
		for i, t := range own {
			p.railTok = append(p.railTok, t)
			p.railDest = append(p.railDest, int32(n))
			p.railRow = append(p.railRow, int32(i))
			if reachesValid(lay, &lay.SendSide, int(t), n, valid) {
				p.remIdx[n*T+int(t)] = int32(i)
			}
		}
	}
	for t := range T {
		if reachesValid(lay, &lay.SendSide, t, mine, valid) {
			p.ownLive[t] = 1
		}
		for k := range K {
			if ex := lay.SlotExpert[t*K+k]; ex >= 0 {
				p.slotDom[t*K+k] = ex / int32(L) / int32(D)
			}
		}
	}
	n := valid(rank)
	p.recvSrc, p.recvEnt = make([]int32, n), make([]int32, n)
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
			if d := int(ex) / L; d/D == mine && d < rank && !containsInt(seen, d) {
				seen = append(seen, d)
				c++
			}
		}
		p.recvSrc[i] = int32(s % D)
		p.recvEnt[i] = int32(v*W + c)
	}
	return p
}

// reachesValid reports whether token t of side has a row kept (not
// dropped) on some rank of domain n.
func reachesValid(lay *Layout, side *SendSide, t, n int, valid func(d int) int) bool {
	D := lay.RanksPerDomain
	for j := side.SendOffsets[t]; j < side.SendOffsets[t+1]; j++ {
		if d := int(side.SendDest[j]); d/D == n && int(side.SendRow[j]) < valid(d) {
			return true
		}
	}
	return false
}

func containsInt(s []int, v int) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}
