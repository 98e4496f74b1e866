package rail

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
	"github.com/goep/goep/executor/internal/datapath"
	"github.com/goep/goep/executor/internal/plan"
	"github.com/goep/goep/nvlink"
)

// TestRailTables checks the GPU tables of the hierarchical path
// (plan.BuildRailTables)
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
func TestRailTables(t *testing.T) {
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
		cfg := plan.Params{NumExperts: E, TopK: K, MaxTokensPerRank: maxT, RanksPerDomain: D, PadMultiple: 1}
		if rng.IntN(3) == 0 {
			cfg.Capacity, cfg.MaxRecvTokens, cfg.MaxPermutedTokens = true, 1+rng.IntN(R*maxT), R*maxT*K
		}
		t.Run(fmt.Sprintf("seed=%d R=%d D=%d K=%d", seed, R, D, K), func(t *testing.T) {
			checkRailTables(t, cfg, routing, R, D, min(K, D))
		})
	}
}

func checkRailTables(t *testing.T, cfg plan.Params, routing [][]int32, R, D, W int) {
	K, maxT, M := cfg.TopK, cfg.MaxTokensPerRank, R/D
	lays := make([]*plan.Layout, R)
	plans := make([]*plan.RailTables, R)
	for r := range R {
		lay, err := plan.ComputeLayout(r, cfg, routing)
		if err != nil {
			t.Fatal(err)
		}
		lays[r], plans[r] = lay, plan.BuildRailTables(lay, cfg, routing, W)
	}
	valid := func(d int) int { return plan.ValidRecv(lays[d], cfg, d) }
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
		if len(p.EntRow) != lay.NumTokens*W || len(p.FRow) != M*maxT*W {
			t.Fatalf("rank %d: table sizes %d, %d", r, len(p.EntRow), len(p.FRow))
		}
		push(r, p.EntTok, p.EntDest, p.EntRow, func(v int) src { return src{r, v} })
		push(r, p.FTok, p.FDest, p.FRow, func(v int) src {
			n, f := v/maxT, v%maxT
			if n >= M || n == r/D || f >= p.FwdCount[n] {
				t.Fatalf("rank %d: forwarded token %d (domain %d, %d-th of %d)", r, v, n, f, p.FwdCount[n])
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
			target := d/D*D + int(p.RecvSrc[i])
			e := int(p.RecvEnt[i])
			tp := plans[target]
			var dest, row []int32
			if e < maxT*W {
				dest, row = tp.EntDest, tp.EntRow
			} else {
				e -= maxT * W
				dest, row = tp.FDest, tp.FRow
			}
			if e < 0 || e >= len(row) || int(row[e]) != i || int(dest[e]) != d%D {
				t.Fatalf("row %d of rank %d goes back to entry %d of rank %d, which pushed (%d, %d)", i, d, p.RecvEnt[i], target,
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
					if (p.OwnLive[tk] == 1) != kept {
						t.Fatalf("rank %d token %d: ownLive %d, kept %v", r, tk, p.OwnLive[tk], kept)
					}
				case kept && int(p.RemIdx[n*T+tk]) != i, !kept && p.RemIdx[n*T+tk] != -1:
					t.Fatalf("rank %d token %d domain %d: remIdx %d, want %d (kept %v)", r, tk, n, p.RemIdx[n*T+tk], i, kept)
				}
				if reaches {
					i++
				}
			}
			if n != r/D && i != p.OwnCount[n] {
				t.Fatalf("rank %d domain %d: ownCount %d, want %d", r, n, p.OwnCount[n], i)
			}
		}
		for s := range T * K {
			ex := lay.SlotExpert[s]
			if want := int32(-1); ex >= 0 && p.SlotDom[s] != ex/int32(lay.NumLocalExperts)/int32(D) || ex < 0 && p.SlotDom[s] != want {
				t.Fatalf("rank %d slot %d: slotDom %d for expert %d", r, s, p.SlotDom[s], ex)
			}
		}
	}
}

// checkRailSend checks the rail tables p (rank r of lay): what
// goep_ep_push writes with them into the send slot of every other domain
// (rows of x and their weights) must be byte for byte what the host's
// fill (DispatchFill) writes there, and OwnCount the slot's row count.
func checkRailSend(t *testing.T, cfg plan.Params, lay *plan.Layout, p *plan.RailTables, r int) {
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
	fill := DispatchFill(lay, xs, ws, true, rb)
	for n := range M {
		if n == r/D {
			continue
		}
		area, rows := make([]byte, maxT*K*4), make([]byte, maxT*rb)
		count, _, _ := fill(n, area, rows)
		garea, grows := make([]byte, maxT*K*4), make([]byte, maxT*rb)
		for j := range p.RailTok {
			if int(p.RailDest[j]) != n {
				continue
			}
			tk, i := int(p.RailTok[j]), int(p.RailRow[j])
			copy(grows[i*rb:(i+1)*rb], xs[tk*rb:])
			for k := range K {
				binary.LittleEndian.PutUint32(garea[(i*K+k)*4:], math.Float32bits(ws[tk*K+k]))
			}
		}
		if p.OwnCount[n] != count {
			t.Fatalf("rank %d domain %d: ownCount (the GPU's row count) %d, the host fills %d rows", r, n, p.OwnCount[n], count)
		}
		if !bytes.Equal(grows, rows) || !bytes.Equal(garea, area) {
			t.Fatalf("rank %d domain %d: the rail tables fill the slot with rows %x weights %x; the host fills %x, %x", r, n, grows, garea, rows, area)
		}
	}
	// Combine: the partials of the tokens forwarded here go back to their
	// domain, as the host-staged path's PartialsFill puts them.
	ps, pws := make([]byte, M*maxT*rb), make([]byte, M*maxT*K*4)
	for i := range ps {
		ps[i] = byte(i*7 + r)
	}
	for i := range pws {
		pws[i] = byte(i*5 + r)
	}
	pfill := PartialsFill(p.FwdCount, ps, pws, maxT, K, rb)
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
		for j := range p.PartSrc {
			if int(p.PartDest[j]) != n {
				continue
			}
			src, i := int(p.PartSrc[j]), int(p.PartRow[j])
			copy(grows[i*rb:(i+1)*rb], ps[src*rb:])
			copy(garea[i*K*4:(i+1)*K*4], pws[src*K*4:])
		}
		if p.FwdCount[n] != cnt {
			t.Fatalf("rank %d domain %d: fwdCount (the GPU's row count) %d, the host fills %d rows", r, n, p.FwdCount[n], cnt)
		}
		if !bytes.Equal(grows, rows) || !bytes.Equal(garea, area) {
			t.Fatalf("rank %d domain %d: the partial tables fill the slot with rows %x weights %x; the host fills %x, %x", r, n, grows, garea, rows, area)
		}
	}
}

// TestRailHeadCorrupt: a header whose message length or count is garbage
// (a peer's memory corrupted) decodes without a panic (the round's check
// of the count is not exercised here).
func TestRailHeadCorrupt(t *testing.T) {
	b := make([]byte, Header)
	op := uint64(datapath.OpDispatch)
	PutHead(b, Head{Op: op, Status: nvlink.StatusTimeout, Count: 7, Msg: "timed out on rank 3", Ranks: []int{3, 12}})
	if h := GetHead(b); h.Op != op || h.Count != 7 || h.Msg != "timed out on rank 3" || !slices.Equal(h.Ranks, []int{3, 12}) {
		t.Fatalf("round trip: %+v", h)
	}
	for _, n := range []uint64{1 << 63, ^uint64(0), Header} {
		binary.LittleEndian.PutUint64(b[48:], n)
		binary.LittleEndian.PutUint64(b[40:], n)
		binary.LittleEndian.PutUint64(b[namedOff:], n)
		h := GetHead(b)
		if len(h.Msg) > MsgMax || len(h.Ranks) > nvlink.MaxNamed {
			t.Errorf("length %#x: message of %d bytes and %d ranks, more than %d and %d", n, len(h.Msg), len(h.Ranks), MsgMax, nvlink.MaxNamed)
		}
	}
}

// TestRailHeadDevice: a header as goep_ep_rail_post writes it after failed
// GPU waits (word 7 set, one wait code per rank of the sender's domain in
// the message) decodes to the error the sender's own Synchronize reports,
// with its global ranks; unknown codes name no rank.
func TestRailHeadDevice(t *testing.T) {
	// The header word by word as goep_ep_rail_post writes it (ep.cu).
	b := make([]byte, Header)
	op := uint64(datapath.OpCombine)
	codes := []byte{0, nvlink.WaitRejected, 0, nvlink.WaitMismatch}
	for i, w := range []uint64{op, 11, 12, 13, 0, 3, uint64(len(codes)), 1} {
		binary.LittleEndian.PutUint64(b[8*i:], w)
	}
	copy(b[64:], codes)
	h := GetHead(b)
	if !h.Dev || h.Status != 0 || h.Count != 3 || h.Op != op || h.Sig != [3]uint64{11, 12, 13} || h.Msg != string(codes) {
		t.Fatalf("decoded: %+v", h)
	}
	var round [Header]byte
	PutHead(round[:], h)
	if !bytes.Equal(round[:], b) {
		t.Fatalf("PutHead writes %x, the kernel %x", round, b)
	}
	err := datapath.PeerInput(nvlink.WaitError([]byte(h.Msg), 4))
	if !errors.Is(err, plan.ErrInvalidInput) || !strings.Contains(err.Error(), "rank(s) [5] rejected") {
		t.Fatalf("decoded: %v, want rank 5's rejection", err)
	}
	if err := nvlink.WaitError([]byte{0, nvlink.WaitTimeout, nvlink.WaitTimeout}, 8); !errors.Is(err, comm.ErrTimeout) || !strings.Contains(err.Error(), "[9 10]") {
		t.Fatalf("timeouts: %v, want ErrTimeout naming ranks 9 and 10", err)
	}
	if err := nvlink.WaitError([]byte{0, 9}, 0); err == nil || errors.Is(err, comm.ErrTimeout) {
		t.Fatalf("unknown code: %v", err)
	}
	PutHead(b, Head{Op: op})
	if GetHead(b).Dev {
		t.Fatal("a host header reads as a device one")
	}
}

// TestRailFatalDomainLost: a rail round ended by watchDomain fails the
// engine for good, naming the lost domain peer by its global rank (not
// read as a rail index, as the transport's own losses are).
func TestRailFatalDomainLost(t *testing.T) {
	newRail := func() *Rail {
		return &Rail{env: &datapath.Env{Fate: &datapath.Fate{}}, D: 2, M: 2, Domain: 1, Local: 1, epoch: 5}
	}
	r := newRail()
	lost := &comm.PeerLostError{Op: "nvlink domain of rank 3", Ranks: []int{2}, Cause: "process exited"}
	err := r.fatal(fmt.Errorf("rdma: wait for epoch 5 on rank 1: %w", &domainLost{err: lost}))
	var pe *comm.PeerLostError
	if !errors.As(err, &pe) || !slices.Equal(pe.Ranks, []int{2}) {
		t.Fatalf("fatal = %v, want a *comm.PeerLostError naming rank 2", err)
	}
	if r.env.Fate.Err() == nil {
		t.Fatal("a lost domain peer did not fail the engine")
	}
	// The transport's own loss names rail index 0: global rank 0*2+1.
	r = newRail()
	err = r.fatal(&comm.PeerLostError{Op: "flush", Ranks: []int{0}, Cause: "process exited"})
	if !errors.As(err, &pe) || !slices.Equal(pe.Ranks, []int{1}) {
		t.Fatalf("fatal = %v, want rail index 0 named as rank 1", err)
	}
}
