package plan

import (
	"fmt"
	"slices"
)

// Layout is the pure result of metadata preprocessing for one rank: who
// sends what to whom and where every row lands (DESIGN.md section 2). It is a
// deterministic function of (every rank's routing, config); every rank
// computes the whole world's counts, so a fault on one rank is seen by all.
type Layout struct {
	Rank, NumRanks, NumLocalExperts, TopK, PadMultiple int

	// RanksPerDomain is D. With D < NumRanks the layout also holds what the
	// hierarchical calls need (Rail, RecvFwdRow).
	RanksPerDomain int

	// SendSide is this rank's send side (NumTokens is T of this rank).
	SendSide

	// Receive side (this rank as destination), in receive order.
	RecvCount    int     // N
	RecvSrcRank  []int32 // [N]
	RecvSrcToken []int32 // [N]
	RecvIdx      []int32 // [N*K] local expert id of each slot, else -1
	Pos          []int32 // [N*K] position in the permuted layout, else -1

	TokensPerExpert []int32 // [L]
	ExpertOffsets   []int32 // [L+1] padded segment starts; ExpertOffsets[L] = PermutedCount
	PermutedCount   int     // P

	// Rail[n] is the send side of the rank with this rank's local index in
	// domain n (Rail[own domain] is this rank's own): in dispatch this rank
	// forwards the rows those ranks send to its domain, in combine it sums
	// their tokens' partials over its domain. Nil with one domain.
	Rail []*SendSide
	// RecvFwdRow[i], for a row received from a source in another domain, is
	// its index among the rows that source sends to this domain (in token
	// order): its row in the forwarding buffer of this domain's rank with
	// the source's local index. -1 for sources in this domain; nil with one
	// domain.
	RecvFwdRow []int32

	// World counts, for capacity checks on every rank.
	RecvCounts     []int // N of every rank
	PermutedCounts []int // P of every rank
}

// SendSide is one source rank's send tables.
type SendSide struct {
	// NumTokens is T of the rank.
	NumTokens int

	// One entry per (token, destination rank), tokens ascending and,
	// within a token, destinations ascending: SendDest[j] / SendRow[j] for
	// j in [SendOffsets[t], SendOffsets[t+1]).
	SendOffsets []int32 // [T+1]
	SendDest    []int32 // destination rank
	SendRow     []int32 // row index in the destination's receive order
	// SlotRow and SlotPos give, for slot k of token t, the row of the
	// token on the rank owning the slot's expert and the row's position in
	// that rank's permuted layout; -1 for empty slots.
	SlotRow []int32 // [T*K]
	SlotPos []int32 // [T*K]
	// SlotExpert is the rank's routing (global expert ids, -1 empty),
	// [T*K]; the owner of slot k's expert is SlotExpert / NumLocalExperts.
	SlotExpert []int32
}

// DomainTokens appends to dst the tokens of s that go to at least one rank
// of domain n (ranks [n*D, (n+1)*D)), ascending: the rows s sends to that
// domain, in the order they cross.
func (s *SendSide) DomainTokens(dst []int32, n, D int) []int32 {
	for t := range s.NumTokens {
		for j := s.SendOffsets[t]; j < s.SendOffsets[t+1]; j++ {
			if int(s.SendDest[j])/D == n {
				dst = append(dst, int32(t))
				break
			}
		}
	}
	return dst
}

// RoutingError is a fault in one rank's routing; every rank of the layout
// reports the same one.
type RoutingError struct {
	Rank, Token, Slot int
	Msg               string
}

func (e *RoutingError) Error() string {
	if e.Token < 0 {
		return fmt.Sprintf("executor: routing of rank %d: %s", e.Rank, e.Msg)
	}
	return fmt.Sprintf("executor: routing of rank %d, token %d, slot %d: %s", e.Rank, e.Token, e.Slot, e.Msg)
}

// Unwrap makes errors.Is(err, ErrInvalidInput) true.
func (e *RoutingError) Unwrap() error { return ErrInvalidInput }

// checkRouting validates one rank's top-k indices.
func checkRouting(rank int, idx []int32, topK, numExperts, maxTokens int) error {
	if len(idx)%topK != 0 {
		return &RoutingError{Rank: rank, Token: -1, Msg: fmt.Sprintf("%d indices is not a multiple of TopK %d", len(idx), topK)}
	}
	if t := len(idx) / topK; t > maxTokens {
		return &RoutingError{Rank: rank, Token: -1, Msg: fmt.Sprintf("%d tokens exceed MaxTokensPerRank %d", t, maxTokens)}
	}
	for t := 0; t < len(idx)/topK; t++ {
		row := idx[t*topK : (t+1)*topK]
		for k, e := range row {
			if e < -1 || int(e) >= numExperts {
				return &RoutingError{Rank: rank, Token: t, Slot: k, Msg: rangeMsg(e, numExperts)}
			}
			if e >= 0 && slices.Contains(row[:k], e) {
				return &RoutingError{Rank: rank, Token: t, Slot: k, Msg: repeatMsg(e, slices.Index(row, e))}
			}
		}
	}
	return nil
}

// rangeMsg and repeatMsg are the messages of a RoutingError for an expert
// id out of range and for a repeated one (the host and GPU layouts').
func rangeMsg(e int32, numExperts int) string {
	return fmt.Sprintf("expert %d out of range [-1, %d)", e, numExperts)
}

func repeatMsg(e int32, prev int) string {
	return fmt.Sprintf("expert %d repeated (already in slot %d)", e, prev)
}

func padUp(n, m int) int { return (n + m - 1) / m * m }

// ComputeLayout computes rank's layout from every rank's top-k indices
// (routing[s] is rank s's [T_s*TopK] int32 array). It validates every
// rank's routing first.
func ComputeLayout(rank int, p Params, routing [][]int32) (*Layout, error) {
	R := len(routing)
	K, E := p.TopK, p.NumExperts
	if R == 0 || E%R != 0 || rank < 0 || rank >= R {
		return nil, fmt.Errorf("executor: layout of rank %d over %d ranks with %d experts", rank, R, E)
	}
	pad := max(p.PadMultiple, 1)
	L := E / R
	for s, idx := range routing {
		if err := checkRouting(s, idx, K, E, p.MaxTokensPerRank); err != nil {
			return nil, err
		}
	}

	// World counts: rows each destination receives from each source, and
	// rows routed to each (destination, local expert) from each source.
	// fromSrc[s*R+d] and expertFromSrc[s*E+e] (global expert id e).
	fromSrc := make([]int, R*R)
	expertFromSrc := make([]int, R*E)
	dests := make([]int32, 0, K)
	for s, idx := range routing {
		for t := 0; t < len(idx)/K; t++ {
			dests = tokenDests(dests[:0], idx[t*K:(t+1)*K], L)
			for _, d := range dests {
				fromSrc[s*R+int(d)]++
			}
			for _, e := range idx[t*K : (t+1)*K] {
				if e >= 0 {
					expertFromSrc[s*E+int(e)]++
				}
			}
		}
	}
	// rowBase[s*R+d]: first row on d of source s (receive order).
	// expertBase[s*E+e]: rows routed to e on its rank from sources < s.
	rowBase := make([]int, R*R)
	expertBase := make([]int, R*E)
	recvCounts := make([]int, R)
	perExpert := make([]int, E)
	for s := range R {
		for d := range R {
			rowBase[s*R+d] = recvCounts[d]
			recvCounts[d] += fromSrc[s*R+d]
		}
		for e := range E {
			expertBase[s*E+e] = perExpert[e]
			perExpert[e] += expertFromSrc[s*E+e]
		}
	}
	// Padded segment starts of every expert on its rank.
	segStart := make([]int, E)
	permCounts := make([]int, R)
	for d := range R {
		off := 0
		for l := range L {
			segStart[d*L+l] = off
			off += padUp(perExpert[d*L+l], pad)
		}
		permCounts[d] = off
	}

	D := p.RanksPerDomain
	if D <= 0 || R%D != 0 {
		D = R
	}
	lay := &Layout{
		Rank: rank, NumRanks: R, NumLocalExperts: L, TopK: K, PadMultiple: pad, RanksPerDomain: D,
		RecvCounts: recvCounts, PermutedCounts: permCounts,
		RecvCount: recvCounts[rank], PermutedCount: permCounts[rank],
	}
	w := world{K: K, L: L, E: E, R: R, rowBase: rowBase, expertBase: expertBase, segStart: segStart}
	lay.SendSide = *w.sendSide(rank, routing[rank])
	if D < R {
		lay.Rail = make([]*SendSide, R/D)
		for n := range lay.Rail {
			if s := n*D + rank%D; s == rank {
				lay.Rail[n] = &lay.SendSide
			} else {
				lay.Rail[n] = w.sendSide(s, routing[s])
			}
		}
	}

	// Receive side of this rank.
	N := lay.RecvCount
	lay.RecvSrcRank = make([]int32, 0, N)
	lay.RecvSrcToken = make([]int32, 0, N)
	lay.RecvIdx = make([]int32, 0, N*K)
	lay.Pos = make([]int32, 0, N*K)
	lay.TokensPerExpert = make([]int32, L)
	lay.ExpertOffsets = make([]int32, L+1)
	for l := range L {
		lay.TokensPerExpert[l] = int32(perExpert[rank*L+l])
		lay.ExpertOffsets[l] = int32(segStart[rank*L+l])
	}
	lay.ExpertOffsets[L] = int32(lay.PermutedCount)
	next := make([]int, L)
	copy(next, segStart[rank*L:(rank+1)*L])
	lo, hi := int32(rank*L), int32((rank+1)*L)
	// Experts of this rank's domain, for the forwarding rows of sources in
	// other domains.
	dlo, dhi := int32(rank/D*D*L), int32((rank/D+1)*D*L)
	if D < R {
		lay.RecvFwdRow = make([]int32, 0, N)
	}
	for s, sidx := range routing {
		fwd := int32(0) // tokens of s that reached this domain so far
		for t := 0; t < len(sidx)/K; t++ {
			row := sidx[t*K : (t+1)*K]
			here := false
			for _, e := range row {
				if e >= dlo && e < dhi {
					here = true
					break
				}
			}
			if here {
				fwd++
			}
			mine := false
			for _, e := range row {
				if e >= lo && e < hi {
					mine = true
					break
				}
			}
			if !mine {
				continue
			}
			lay.RecvSrcRank = append(lay.RecvSrcRank, int32(s))
			lay.RecvSrcToken = append(lay.RecvSrcToken, int32(t))
			if lay.RecvFwdRow != nil {
				if s/D == rank/D {
					lay.RecvFwdRow = append(lay.RecvFwdRow, -1)
				} else {
					lay.RecvFwdRow = append(lay.RecvFwdRow, fwd-1)
				}
			}
			for _, e := range row {
				if e >= lo && e < hi {
					l := e - lo
					lay.RecvIdx = append(lay.RecvIdx, l)
					lay.Pos = append(lay.Pos, int32(next[l]))
					next[l]++
				} else {
					lay.RecvIdx = append(lay.RecvIdx, -1)
					lay.Pos = append(lay.Pos, -1)
				}
			}
		}
	}
	return lay, nil
}

// world holds the world's prefix counts that every send side is read from.
type world struct {
	K, L, E, R int
	// rowBase[s*R+d]: first row on d of source s (receive order);
	// expertBase[s*E+e]: rows routed to e from sources < s; segStart[e]:
	// padded segment start of expert e on its rank.
	rowBase, expertBase, segStart []int
}

// sendSide computes the send tables of rank s from its routing idx.
func (w *world) sendSide(s int, idx []int32) *SendSide {
	K, L, E, R := w.K, w.L, w.E, w.R
	T := len(idx) / K
	side := &SendSide{
		NumTokens:   T,
		SendOffsets: make([]int32, T+1),
		SlotRow:     make([]int32, T*K),
		SlotPos:     make([]int32, T*K),
		SlotExpert:  slices.Clone(idx),
	}
	nextRow := slices.Clone(w.rowBase[s*R : (s+1)*R])
	nextPos := make([]int, E)
	for e := range E {
		nextPos[e] = w.segStart[e] + w.expertBase[s*E+e]
	}
	dests := make([]int32, 0, K)
	for t := range T {
		row := idx[t*K : (t+1)*K]
		dests = tokenDests(dests[:0], row, L)
		for _, d := range dests {
			side.SendDest = append(side.SendDest, d)
			side.SendRow = append(side.SendRow, int32(nextRow[d]))
		}
		for k, e := range row {
			if e < 0 {
				side.SlotRow[t*K+k], side.SlotPos[t*K+k] = -1, -1
				continue
			}
			d := int(e) / L
			side.SlotRow[t*K+k] = int32(nextRow[d])
			side.SlotPos[t*K+k] = int32(nextPos[e])
			nextPos[e]++
		}
		for _, d := range dests {
			nextRow[d]++
		}
		side.SendOffsets[t+1] = int32(len(side.SendDest))
	}
	return side
}

// tokenDests appends the distinct ranks owning the token's experts, in
// ascending order.
func tokenDests(dst []int32, row []int32, L int) []int32 {
	for _, e := range row {
		if e < 0 {
			continue
		}
		d := e / int32(L)
		if !slices.Contains(dst, d) {
			dst = append(dst, d)
		}
	}
	slices.Sort(dst)
	return dst
}
