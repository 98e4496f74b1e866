package executor

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/goep/goep/comm"
)

// TestHierPlan checks the GPU tables of the hierarchical path (planHier)
// on random worlds, without a GPU, by simulating what the kernels do with
// them across every rank of the world:
//   - dispatch: every rank pushes its own entries (rows of x) and its
//     forwarded entries (rows of fwdX) to destinations of its domain; each
//     kept received row (d, i) must be written exactly once, by an entry
//     whose token is the row's source token, and nothing may be written
//     outside [0, valid rows) or to a rank outside the domain;
//   - combine: each received row goes back to entry recvEnt on domain rank
//     recvSrc, which must be the entry that pushed it there;
//   - merge: remIdx and ownLive say which partials exist, slotDom where
//     each slot's expert lives.
func TestHierPlan(t *testing.T) {
	for seed := range uint64(300) {
		rng := rand.New(rand.NewPCG(seed, 11))
		R := []int{2, 4, 6, 8}[rng.IntN(4)]
		var divs []int
		for d := 1; d < R; d++ {
			if R%d == 0 {
				divs = append(divs, d)
			}
		}
		D := divs[rng.IntN(len(divs))]
		L := 1 + rng.IntN(3)
		E := R * L
		K := 1 + rng.IntN(min(E, 4))
		maxT := 1 + rng.IntN(12)
		routing := make([][]int32, R)
		for r := range R {
			T := rng.IntN(maxT + 1)
			if rng.IntN(4) == 0 {
				T = 0
			}
			for range T {
				perm := rng.Perm(E)
				n := rng.IntN(K + 1)
				for k := range K {
					e := int32(-1)
					if k < n {
						e = int32(perm[k])
					}
					routing[r] = append(routing[r], e)
				}
			}
		}
		cfg := Config{NumExperts: E, TopK: K, Hidden: 1, MaxTokensPerRank: maxT, RanksPerDomain: D, PadMultiple: 1}
		if rng.IntN(3) == 0 {
			cfg.Mode, cfg.MaxRecvTokens, cfg.MaxPermutedTokens = Capacity, 1+rng.IntN(R*maxT), R*maxT*K
		}
		t.Run(fmt.Sprintf("seed=%d R=%d D=%d K=%d", seed, R, D, K), func(t *testing.T) {
			checkHierPlan(t, cfg, routing, R, D, min(K, D))
		})
	}
}

func checkHierPlan(t *testing.T, cfg Config, routing [][]int32, R, D, W int) {
	K, maxT, M := cfg.TopK, cfg.MaxTokensPerRank, R/D
	lays := make([]*Layout, R)
	plans := make([]*hierPlan, R)
	for r := range R {
		lay, err := ComputeLayout(r, cfg, routing)
		if err != nil {
			t.Fatal(err)
		}
		lays[r], plans[r] = lay, planHier(lay, cfg, routing, W)
	}
	valid := func(d int) int { return validRecvOf(lays[d], cfg, d) }
	// Dispatch: who writes (d, i), with which source token.
	type src struct{ rank, tok int }
	written := map[[2]int]src{}
	push := func(r int, tok, dest, row []int32, srcOf func(v int) src) {
		for e := range row {
			if row[e] < 0 {
				continue
			}
			dd := int(dest[e])
			if dd < 0 || dd >= D {
				t.Fatalf("rank %d entry %d: destination %d outside the domain of %d", r, e, dd, D)
			}
			d := r/D*D + dd
			i := int(row[e])
			if i >= valid(d) {
				t.Fatalf("rank %d entry %d: row %d on rank %d, which keeps %d", r, e, i, d, valid(d))
			}
			if int(tok[e]) != e/W && !(tok[e] >= 0) {
				t.Fatalf("rank %d entry %d: token %d", r, e, tok[e])
			}
			if prev, ok := written[[2]int{d, i}]; ok {
				t.Fatalf("row %d of rank %d written twice (by %v and rank %d)", i, d, prev, r)
			}
			written[[2]int{d, i}] = srcOf(int(tok[e]))
		}
	}
	for r := range R {
		p, lay := plans[r], lays[r]
		if len(p.entRow) != lay.NumTokens*W || len(p.fRow) != M*maxT*W {
			t.Fatalf("rank %d: table sizes %d, %d", r, len(p.entRow), len(p.fRow))
		}
		push(r, p.entTok, p.entDest, p.entRow, func(v int) src { return src{r, v} })
		push(r, p.fTok, p.fDest, p.fRow, func(v int) src {
			n, f := v/maxT, v%maxT
			if n >= M || n == r/D || f >= p.fwdCount[n] {
				t.Fatalf("rank %d: forwarded token %d (domain %d, %d-th of %d)", r, v, n, f, p.fwdCount[n])
			}
			s := n*D + r%D
			return src{s, int(lays[s].DomainTokens(nil, r/D, D)[f])}
		})
	}
	for d := range R {
		for i := range valid(d) {
			got, ok := written[[2]int{d, i}]
			want := src{int(lays[d].RecvSrcRank[i]), int(lays[d].RecvSrcToken[i])}
			if !ok || got != want {
				t.Fatalf("row %d of rank %d: written from %v (%v), want %v", i, d, got, ok, want)
			}
		}
	}
	if n := len(written); n != func() int {
		s := 0
		for d := range R {
			s += valid(d)
		}
		return s
	}() {
		t.Fatalf("%d rows written, more than kept", n)
	}
	// Combine: row i of d goes back to the entry that pushed it.
	for d := range R {
		p := plans[d]
		for i := range valid(d) {
			target := d/D*D + int(p.recvSrc[i])
			e := int(p.recvEnt[i])
			tp := plans[target]
			var dest, row []int32
			if e < maxT*W {
				dest, row = tp.entDest, tp.entRow
			} else {
				e -= maxT * W
				dest, row = tp.fDest, tp.fRow
			}
			if e < 0 || e >= len(row) || int(row[e]) != i || int(dest[e]) != d%D {
				t.Fatalf("row %d of rank %d goes back to entry %d of rank %d, which pushed (%d, %d)", i, d, p.recvEnt[i], target,
					func() int32 {
						if e >= 0 && e < len(dest) {
							return dest[e]
						}
						return -9
					}(), func() int32 {
						if e >= 0 && e < len(row) {
							return row[e]
						}
						return -9
					}())
			}
		}
	}
	// Merge tables, and the rail's send slots.
	for r := range R {
		p, lay := plans[r], lays[r]
		checkRailSend(t, cfg, lay, p, r)
		T := lay.NumTokens
		for n := range M {
			i := 0
			for tk := range T {
				reaches := false
				kept := false
				for j := lay.SendOffsets[tk]; j < lay.SendOffsets[tk+1]; j++ {
					if dd := int(lay.SendDest[j]); dd/D == n {
						reaches = true
						kept = kept || int(lay.SendRow[j]) < valid(dd)
					}
				}
				switch {
				case n == r/D:
					if (p.ownLive[tk] == 1) != kept {
						t.Fatalf("rank %d token %d: ownLive %d, kept %v", r, tk, p.ownLive[tk], kept)
					}
				case kept && int(p.remIdx[n*T+tk]) != i, !kept && p.remIdx[n*T+tk] != -1:
					t.Fatalf("rank %d token %d domain %d: remIdx %d, want %d (kept %v)", r, tk, n, p.remIdx[n*T+tk], i, kept)
				}
				if reaches {
					i++
				}
			}
			if n != r/D && i != p.ownCount[n] {
				t.Fatalf("rank %d domain %d: ownCount %d, want %d", r, n, p.ownCount[n], i)
			}
		}
		for s := range T * K {
			ex := lay.SlotExpert[s]
			if want := int32(-1); ex >= 0 && p.slotDom[s] != ex/int32(lay.NumLocalExperts)/int32(D) || ex < 0 && p.slotDom[s] != want {
				t.Fatalf("rank %d slot %d: slotDom %d for expert %d", r, s, p.slotDom[s], ex)
			}
		}
	}
}

// checkRailSend checks the rail tables of plan p (rank r of lay): what
// goep_ep_push writes with them into the send slot of every other domain
// (rows of x and their weights) must be byte for byte what the host's
// dispatchFill writes there, and ownCount the slot's row count.
func checkRailSend(t *testing.T, cfg Config, lay *Layout, p *hierPlan, r int) {
	t.Helper()
	K, maxT, D := cfg.TopK, cfg.MaxTokensPerRank, lay.RanksPerDomain
	M, T := lay.NumRanks/D, lay.NumTokens
	const rb = 8
	xs := make([]byte, T*rb)
	ws := make([]float32, T*K)
	for tk := range T {
		binary.LittleEndian.PutUint64(xs[tk*rb:], uint64(r)<<32|uint64(tk))
		for k := range K {
			ws[tk*K+k] = float32(tk*K + k)
		}
	}
	fill := (&Engine{cfg: cfg}).dispatchFill(lay, xs, ws, true, rb)
	for n := range M {
		if n == r/D {
			continue
		}
		area, rows := make([]byte, maxT*K*4), make([]byte, maxT*rb)
		count, _, _ := fill(n, area, rows)
		garea, grows := make([]byte, maxT*K*4), make([]byte, maxT*rb)
		for j := range p.railTok {
			if int(p.railDest[j]) != n {
				continue
			}
			tk, i := int(p.railTok[j]), int(p.railRow[j])
			copy(grows[i*rb:(i+1)*rb], xs[tk*rb:])
			for k := range K {
				binary.LittleEndian.PutUint32(garea[(i*K+k)*4:], math.Float32bits(ws[tk*K+k]))
			}
		}
		if p.ownCount[n] != count {
			t.Fatalf("rank %d domain %d: ownCount (the GPU's row count) %d, the host fills %d rows", r, n, p.ownCount[n], count)
		}
		if !bytes.Equal(grows, rows) || !bytes.Equal(garea, area) {
			t.Fatalf("rank %d domain %d: the rail tables fill the slot with rows %x weights %x; the host fills %x, %x", r, n, grows, garea, rows, area)
		}
	}
	// Combine: the partials of the tokens forwarded here go back to their
	// domain, as the host-staged path's partialsFill puts them.
	ps, pws := make([]byte, M*maxT*rb), make([]byte, M*maxT*K*4)
	for i := range ps {
		ps[i] = byte(i*7 + r)
	}
	for i := range pws {
		pws[i] = byte(i*5 + r)
	}
	pfill := partialsFill(p.fwdCount, ps, pws, maxT, K, rb)
	for n := range M {
		if n == r/D {
			continue
		}
		rows, area := make([]byte, maxT*rb), make([]byte, maxT*K*4)
		cnt, ab, rbytes := pfill(n, area, rows)
		if ab != cnt*K*4 || rbytes != cnt*rb {
			t.Fatalf("rank %d domain %d: the host fill reports %d area and %d row bytes for %d rows", r, n, ab, rbytes, cnt)
		}
		grows, garea := make([]byte, maxT*rb), make([]byte, maxT*K*4)
		for j := range p.partSrc {
			if int(p.partDest[j]) != n {
				continue
			}
			src, i := int(p.partSrc[j]), int(p.partRow[j])
			copy(grows[i*rb:(i+1)*rb], ps[src*rb:])
			copy(garea[i*K*4:(i+1)*K*4], pws[src*K*4:])
		}
		if p.fwdCount[n] != cnt {
			t.Fatalf("rank %d domain %d: fwdCount (the GPU's row count) %d, the host fills %d rows", r, n, p.fwdCount[n], cnt)
		}
		if !bytes.Equal(grows, rows) || !bytes.Equal(garea, area) {
			t.Fatalf("rank %d domain %d: the partial tables fill the slot with rows %x weights %x; the host fills %x, %x", r, n, grows, garea, rows, area)
		}
	}
}

// TestRailHeadCorrupt: a header whose message length or count is garbage
// (a peer's memory corrupted) decodes without a panic (railRound's check
// of the count is not exercised here).
func TestRailHeadCorrupt(t *testing.T) {
	b := make([]byte, railHeader)
	putRailHead(b, railHead{op: opDispatch, status: 2, count: 7, msg: "bad input on rank 3"})
	if h := getRailHead(b); h.op != opDispatch || h.count != 7 || h.msg != "bad input on rank 3" {
		t.Fatalf("round trip: %+v", h)
	}
	for _, n := range []uint64{1 << 63, ^uint64(0), railHeader} {
		binary.LittleEndian.PutUint64(b[48:], n)
		binary.LittleEndian.PutUint64(b[40:], n)
		h := getRailHead(b)
		if len(h.msg) > railMsgMax {
			t.Errorf("length %#x: message of %d bytes, more than %d", n, len(h.msg), railMsgMax)
		}
	}
}

// TestRailHeadDevice: a header as goep_ep_rail_post writes it after failed
// GPU waits (word 7 set, one wait code per rank of the sender's domain in
// the message) decodes to the error the sender's own Synchronize reports,
// with its global ranks; unknown codes name no rank.
func TestRailHeadDevice(t *testing.T) {
	// The header word by word as goep_ep_rail_post writes it (ep.cu).
	b := make([]byte, railHeader)
	codes := []byte{0, waitRejected, 0, waitMismatch}
	for i, w := range []uint64{opCombine, 11, 12, 13, 0, 3, uint64(len(codes)), 1} {
		binary.LittleEndian.PutUint64(b[8*i:], w)
	}
	copy(b[64:], codes)
	h := getRailHead(b)
	if !h.dev || h.status != 0 || h.count != 3 || h.op != opCombine || h.sig != [3]uint64{11, 12, 13} || h.msg != string(codes) {
		t.Fatalf("decoded: %+v", h)
	}
	var round [railHeader]byte
	putRailHead(round[:], h)
	if !bytes.Equal(round[:], b) {
		t.Fatalf("putRailHead writes %x, the kernel %x", round, b)
	}
	err := waitError([]byte(h.msg), 4)
	if !errors.Is(err, ErrInvalidInput) || !strings.Contains(err.Error(), "rank(s) [5] rejected") {
		t.Fatalf("decoded: %v, want rank 5's rejection", err)
	}
	if err := waitError([]byte{0, waitTimeout, waitTimeout}, 8); !errors.Is(err, ErrTimeout) || !strings.Contains(err.Error(), "[9 10]") {
		t.Fatalf("timeouts: %v, want ErrTimeout naming ranks 9 and 10", err)
	}
	if err := waitError([]byte{0, 9}, 0); err == nil || errors.Is(err, ErrTimeout) {
		t.Fatalf("unknown code: %v", err)
	}
	putRailHead(b, railHead{op: opCombine})
	if getRailHead(b).dev {
		t.Fatal("a host header reads as a device one")
	}
}

// TestRailFatalDomainLost: a rail round ended by watchDomain fails the
// engine for good, naming the lost domain peer by its global rank (not
// read as a rail index, as the transport's own losses are).
func TestRailFatalDomainLost(t *testing.T) {
	e := &Engine{hier: &hierarchy{D: 2, M: 2, domain: 1, local: 1, epoch: 5}}
	lost := &comm.PeerLostError{Op: "nvlink domain of rank 3", Ranks: []int{2}, Cause: "process exited"}
	err := e.railFatal(fmt.Errorf("rdma: wait for epoch 5 on rank 1: %w", &domainLost{err: lost}))
	var pe *comm.PeerLostError
	if !errors.As(err, &pe) || !slices.Equal(pe.Ranks, []int{2}) {
		t.Fatalf("railFatal = %v, want a *comm.PeerLostError naming rank 2", err)
	}
	if e.failed.Load() == nil {
		t.Fatal("a lost domain peer did not fail the engine")
	}
	// The transport's own loss names rail index 0: global rank 0*2+1.
	e = &Engine{hier: &hierarchy{D: 2, M: 2, domain: 1, local: 1, epoch: 5}}
	err = e.railFatal(&comm.PeerLostError{Op: "flush", Ranks: []int{0}, Cause: "process exited"})
	if !errors.As(err, &pe) || !slices.Equal(pe.Ranks, []int{1}) {
		t.Fatalf("railFatal = %v, want rail index 0 named as rank 1", err)
	}
}
