package bench

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strings"

	"github.com/goep/goep/executor"
)

// Sizing is what one rank of a case would need and move on the GPU path at
// the config's full scale, per call: the engine's memory (from the
// formulas the GPU path allocates by, executor.NewGPUFootprint), the
// outputs of one call of each kind, and the bytes a dispatch and a combine
// move over NVLink and over the rail, with the time those bytes take at
// the given link rates. eprun size prints it.
//
// Rows are the most of any rank: a call takes as long as its slowest rank
// (DESIGN.md section 6). They are counted from the routing eprun bench
// would draw (GlobalRouting with the config's seed) when its R x T x K
// slots are at most MaxCountedSlots; else they are the expectation of
// uniform routing (Rows says which; balanced routing has the same
// expectation, every expert's load equal instead of equal on average).
type Sizing struct {
	Ranks          int    `json:"ranks"`
	RanksPerDomain int    `json:"ranks_per_domain"`
	Domains        int    `json:"domains"`
	Experts        int    `json:"experts"`
	LocalExperts   int    `json:"local_experts"`
	TopK           int    `json:"topk"`
	Hidden         int    `json:"hidden"`
	Tokens         int    `json:"tokens"`
	DType          string `json:"dtype"`
	CombineDType   string `json:"combine_dtype"`
	Mode           string `json:"mode"`
	Pad            int    `json:"pad"`
	Routing        string `json:"routing"`
	Seed           uint64 `json:"seed"`
	// Rows is "counted" (from the routing) or "expected" (the formula).
	Rows string `json:"rows"`
	// RowBytes and CombineRowBytes are the bytes of a dispatched and a
	// combined row (RowBytes: an fp8 row's scales included).
	RowBytes        int `json:"row_bytes"`
	CombineRowBytes int `json:"combine_row_bytes"`

	// RecvRows is N, the rows a rank receives in dispatch; PermutedRows P,
	// its permuted rows (padding included).
	RecvRows     float64 `json:"recv_rows"`
	PermutedRows float64 `json:"permuted_rows"`
	// NVLinkRows is the received rows that cross NVLink: all but those
	// that come from the rank itself or, with several domains, from its
	// own rail (sources of its local index, which it forwards to itself).
	NVLinkRows float64 `json:"nvlink_rows"`
	// RailRows is the rows a rank sends to other domains: over its tokens,
	// the distinct destination domains other than its own. RDMARows counts
	// its own domain too (DESIGN.md section 6's RDMA bytes).
	RailRows float64 `json:"rail_rows"`
	RDMARows float64 `json:"rdma_rows"`

	// Footprint is the engine's memory, allocated at New.
	Footprint executor.GPUFootprint `json:"footprint"`
	// DeviceBytes and HostBytes total it.
	DeviceBytes int `json:"device_bytes"`
	HostBytes   int `json:"host_bytes"`
	// The outputs of one call, in blocking mode sized to the rows above
	// (capacity mode: to the capacities): Dispatch's RecvX, RecvIdx and
	// RecvWeights; DispatchPermute's X, Weights, RecvIdx and RecvWeights;
	// Combine's (and UnpermuteCombine's) output.
	DispatchOutputBytes        float64 `json:"dispatch_output_bytes"`
	DispatchPermuteOutputBytes float64 `json:"dispatch_permute_output_bytes"`
	CombineOutputBytes         float64 `json:"combine_output_bytes"`

	// Bytes per call: NVLinkRows and RailRows at the dispatch's and the
	// combine's row bytes (a combine sends back one row, or one partial
	// sum per domain, for each row a dispatch sent).
	DispatchNVLinkBytes float64 `json:"dispatch_nvlink_bytes"`
	DispatchRailBytes   float64 `json:"dispatch_rail_bytes"`
	CombineNVLinkBytes  float64 `json:"combine_nvlink_bytes"`
	CombineRailBytes    float64 `json:"combine_rail_bytes"`
	// NVLinkGBps and RailGBps are the link rates (GB/s, 1e9 bytes, one
	// direction, per GPU) the times are at; the times are bytes / rate,
	// in µs, and CallUs the slower link's for each call: a bound below,
	// with no latency and the links fully overlapped.
	NVLinkGBps       float64 `json:"nvlink_gbps"`
	RailGBps         float64 `json:"rail_gbps"`
	DispatchNVLinkUs float64 `json:"dispatch_nvlink_us"`
	DispatchRailUs   float64 `json:"dispatch_rail_us"`
	CombineNVLinkUs  float64 `json:"combine_nvlink_us"`
	CombineRailUs    float64 `json:"combine_rail_us"`
	DispatchCallUs   float64 `json:"dispatch_call_us"`
	CombineCallUs    float64 `json:"combine_call_us"`
}

// MaxCountedSlots bounds the routing Size draws to count rows (R x T x
// K expert slots, 4 bytes each): larger worlds use the expectation.
const MaxCountedSlots = 1 << 28

// Size sizes every case of c (one per mode, top-k, dtype, hidden and
// tokens; the tuning knobs do not change it) on the GPU path, with
// c.RanksPerDomain ranks per domain (0: one domain), at the link rates
// nvlinkGBps and railGBps.
func Size(c Config, nvlinkGBps, railGBps float64) ([]Sizing, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	if !(nvlinkGBps > 0) || !(railGBps > 0) || math.IsInf(nvlinkGBps, 0) || math.IsInf(railGBps, 0) {
		return nil, fmt.Errorf("link rates %g and %g GB/s: want numbers above 0", nvlinkGBps, railGBps)
	}
	var out []Sizing
	seen := map[Case]bool{}
	for _, cs := range c.Cases() {
		cs.SMs, cs.ChunkRows = 0, 0
		if seen[cs] {
			continue
		}
		seen[cs] = true
		s, err := sizeCase(c, cs, nvlinkGBps, railGBps)
		if err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, nil
}

func sizeCase(c Config, cs Case, nvlinkGBps, railGBps float64) (Sizing, error) {
	R, D := c.Ranks, c.RanksPerDomain
	if D <= 0 {
		D = R
	}
	fp, err := executor.NewGPUFootprint(c.engineConfig(cs), R)
	if err != nil {
		return Sizing{}, err
	}
	cdt := cs.CallDType(CallCombine)
	s := Sizing{
		Ranks: R, RanksPerDomain: D, Domains: R / D, Experts: c.Experts, LocalExperts: c.Experts / R,
		TopK: cs.TopK, Hidden: cs.Hidden, Tokens: cs.Tokens, DType: cs.DType.String(), CombineDType: cdt.String(),
		Mode: cs.Mode, Pad: c.Pad, Routing: c.RoutingSpec().String(), Seed: c.Seed,
		RowBytes: RowBytes(cs.DType, cs.Hidden), CombineRowBytes: RowBytes(cdt, cs.Hidden),
		Footprint: fp, DeviceBytes: fp.Device(), HostBytes: fp.Host(),
		NVLinkGBps: nvlinkGBps, RailGBps: railGBps,
	}
	if float64(R)*float64(cs.Tokens)*float64(cs.TopK) <= MaxCountedSlots {
		s.Rows = "counted"
		rc := CountRows(c.RoutingSpec(), c.Seed, R, D, c.Experts, cs.TopK, cs.Tokens, c.Pad)
		s.RecvRows, s.PermutedRows = float64(slices.Max(rc.Recv)), float64(slices.Max(rc.Permuted))
		s.NVLinkRows, s.RailRows, s.RDMARows = float64(slices.Max(rc.NVLink)), float64(slices.Max(rc.Rail)), float64(slices.Max(rc.RDMA))
	} else {
		if c.Routing == RoutingZipf {
			return s, fmt.Errorf("sizing %s: %d ranks x %d tokens x top-%d is more than %d slots to count, and zipf routing has no formula", cs.name(), R, cs.Tokens, cs.TopK, MaxCountedSlots)
		}
		s.Rows = "expected"
		s.RecvRows, s.PermutedRows, s.NVLinkRows, s.RailRows, s.RDMARows = ExpectedRows(R, D, c.Experts, cs.TopK, cs.Tokens, c.Pad)
	}
	n, p := s.RecvRows, s.PermutedRows
	if cs.Mode == ModeCapacity {
		rc, pc := c.capacities(cs)
		n, p = float64(rc), float64(pc)
	}
	k4 := float64(cs.TopK * 4)
	s.DispatchOutputBytes = n * (float64(s.RowBytes) + 2*k4)
	s.DispatchPermuteOutputBytes = p*(float64(s.RowBytes)+4) + n*2*k4
	s.CombineOutputBytes = float64(cs.Tokens) * float64(s.CombineRowBytes)
	s.DispatchNVLinkBytes = s.NVLinkRows * float64(s.RowBytes)
	s.DispatchRailBytes = s.RailRows * float64(s.RowBytes)
	s.CombineNVLinkBytes = s.NVLinkRows * float64(s.CombineRowBytes)
	s.CombineRailBytes = s.RailRows * float64(s.CombineRowBytes)
	us := func(bytes, gbps float64) float64 { return bytes / (gbps * 1e3) }
	s.DispatchNVLinkUs, s.DispatchRailUs = us(s.DispatchNVLinkBytes, nvlinkGBps), us(s.DispatchRailBytes, railGBps)
	s.CombineNVLinkUs, s.CombineRailUs = us(s.CombineNVLinkBytes, nvlinkGBps), us(s.CombineRailBytes, railGBps)
	s.DispatchCallUs = max(s.DispatchNVLinkUs, s.DispatchRailUs)
	s.CombineCallUs = max(s.CombineNVLinkUs, s.CombineRailUs)
	return s, nil
}

// RowCounts are the rows of every rank of a routing (Size's Rows).
type RowCounts struct {
	Recv, Permuted, NVLink, Rail, RDMA []int
}

// CountRows counts, for every rank of the routing GlobalRouting draws
// for (spec, seed) with tokens on each of ranks ranks, D ranks a domain
// (one pass over the R x tokens x topk slots):
// the rows it receives (Recv), its permuted rows padded to pad (Permuted),
// the received rows that cross NVLink (NVLink: from a source of another
// local index, the row coming from the source itself or from its forwarder
// in this domain), and the rows it sends to other domains (Rail) and to
// every domain, its own included (RDMA).
func CountRows(spec RoutingSpec, seed uint64, ranks, D, experts, topk, tokens, pad int) RowCounts {
	T := make([]int, ranks)
	for i := range T {
		T[i] = tokens
	}
	return countRows(GlobalRouting(spec, seed, T, topk, experts), D, experts, topk, tokens, pad)
}

// countRows is CountRows of the routing idx ([rank][t*topk+k]).
func countRows(idx [][]int32, D, experts, topk, tokens, pad int) RowCounts {
	ranks := len(idx)
	L := experts / ranks
	rc := RowCounts{Recv: make([]int, ranks), Permuted: make([]int, ranks), NVLink: make([]int, ranks), Rail: make([]int, ranks), RDMA: make([]int, ranks)}
	load := make([]int, experts)
	rankSeen, domSeen := make([]int, ranks), make([]int, ranks/D) // the last token (+1) that reached each
	stamp := 0
	for s := range ranks {
		for t := range tokens {
			stamp++
			for _, e := range idx[s][t*topk : (t+1)*topk] {
				if e < 0 {
					continue
				}
				load[e]++
				d := int(e) / L
				if rankSeen[d] != stamp {
					rankSeen[d] = stamp
					rc.Recv[d]++
					if s%D != d%D {
						rc.NVLink[d]++
					}
				}
				if n := d / D; domSeen[n] != stamp {
					domSeen[n] = stamp
					rc.RDMA[s]++
					if n != s/D {
						rc.Rail[s]++
					}
				}
			}
		}
	}
	for e, n := range load {
		rc.Permuted[e/L] += (n + pad - 1) / pad * pad
	}
	return rc
}

// ExpectedRows is the expectation of Size's rows for one rank under
// uniform routing (each token's K distinct experts a uniform K-subset of
// the E), R ranks of L = E/R experts, D a domain, M = R/D domains, T
// tokens a rank. With q(n) = C(E-n, K) / C(E, K), the chance that a token
// names none of n given experts:
//
//	recv     = R x T x (1 - q(L))
//	permuted = T x K + L x (pad - 1)       (the padding at its most)
//	nvlink   = (R - M) x T x (1 - q(L))    (all sources but the M of this local index)
//	rail     = (M - 1) x T x (1 - q(D x L))
//	rdma     = M x T x (1 - q(D x L))
func ExpectedRows(R, D, E, K, T, pad int) (recv, permuted, nvlink, rail, rdma float64) {
	q := func(n int) float64 {
		p := 1.0
		for i := range K {
			p *= max(0, float64(E-n-i)) / float64(E-i)
		}
		return p
	}
	L, M, t := E/R, R/D, float64(T)
	recv = float64(R) * t * (1 - q(L))
	permuted = t * float64(K)
	if T > 0 {
		permuted += float64(L * (pad - 1))
	}
	nvlink = float64(R-M) * t * (1 - q(L))
	rail = float64(M-1) * t * (1 - q(D*L))
	rdma = float64(M) * t * (1 - q(D*L))
	return recv, permuted, nvlink, rail, rdma
}

// WriteSizing prints sizings as eprun size's table: a commented header
// per case, one line per memory item and per link, and the arithmetic
// behind them.
func WriteSizing(w io.Writer, name string, sizings []Sizing) error {
	var b strings.Builder
	for i, s := range sizings {
		if i > 0 {
			b.WriteString("\n")
		}
		domains := "1 domain"
		if s.Domains > 1 {
			domains = fmt.Sprintf("%d domains of %d", s.Domains, s.RanksPerDomain)
		}
		fmt.Fprintf(&b, "# eprun size %s: one rank on the GPU path, per call\n", name)
		fmt.Fprintf(&b, "# ranks %d (%s)  experts %d (%d a rank)  topk %d  hidden %d  dtype %s (combine %s)  tokens %d a rank  mode %s  pad %d  routing %s  seed %d\n",
			s.Ranks, domains, s.Experts, s.LocalExperts, s.TopK, s.Hidden, s.DType, s.CombineDType, s.Tokens, s.Mode, s.Pad, s.Routing, s.Seed)
		if s.Rows == "counted" {
			fmt.Fprintf(&b, "# rows: counted from the routing eprun bench draws (seed %d), the most of any rank\n", s.Seed)
		} else {
			b.WriteString("# rows: expected under uniform routing (too many slots to count; bench.ExpectedRows)\n")
		}
		b.WriteString("#\n")
		fp := s.Footprint
		fmt.Fprintf(&b, "# %-38s %12s %12s\n", "memory, one rank", "rows", "bytes")
		item := func(what string, rows float64, bytes float64) {
			r := "-"
			if rows >= 0 {
				r = fmt.Sprintf("%.0f", rows)
			}
			fmt.Fprintf(&b, "  %-38s %12s %12s\n", what, r, human(bytes))
		}
		item("window: flags", -1, float64(fp.Flags))
		item("window: dispatch receive", float64(fp.RecvRows), float64(fp.Recv))
		item("window: combine", float64(fp.CombineRows), float64(fp.Combine))
		if fp.GPULayout {
			item("window: routing (GPU layout)", float64(s.Ranks*s.Tokens), float64(fp.Route))
		} else {
			item("window: routing (layout on the host)", -1, float64(fp.Route))
		}
		if s.Domains > 1 {
			item("device: forwarded rows", float64(s.Domains*s.Tokens), float64(fp.Forward))
			item("host: rail send (a slot a domain)", float64(s.Domains*s.Tokens), float64(fp.RailSend))
			item("host: rail receive (two parities)", float64(2*s.Domains*s.Tokens), float64(fp.RailRecv))
			item("host: rail forwarding slots", float64(s.Domains*s.Tokens), float64(fp.RailForward))
		}
		item("engine, device memory", -1, float64(s.DeviceBytes))
		if s.Domains > 1 {
			item("engine, host memory", -1, float64(s.HostBytes))
		}
		item("outputs: dispatch", s.RecvRows, s.DispatchOutputBytes)
		item("outputs: dispatch-permute", s.PermutedRows, s.DispatchPermuteOutputBytes)
		item("outputs: combine, unpermute-combine", float64(s.Tokens), s.CombineOutputBytes)
		b.WriteString("#\n")
		fmt.Fprintf(&b, "# %-9s %-7s %12s %12s %8s %10s\n", "call", "link", "rows", "bytes", "GB/s", "time_us")
		link := func(call, l string, rows, bytes, gbps, us float64) {
			fmt.Fprintf(&b, "  %-9s %-7s %12.0f %12s %8g %10.1f\n", call, l, rows, human(bytes), gbps, us)
		}
		link("dispatch", "nvlink", s.NVLinkRows, s.DispatchNVLinkBytes, s.NVLinkGBps, s.DispatchNVLinkUs)
		link("dispatch", "rail", s.RailRows, s.DispatchRailBytes, s.RailGBps, s.DispatchRailUs)
		link("combine", "nvlink", s.NVLinkRows, s.CombineNVLinkBytes, s.NVLinkGBps, s.CombineNVLinkUs)
		link("combine", "rail", s.RailRows, s.CombineRailBytes, s.RailGBps, s.CombineRailUs)
		b.WriteString("#\n")
		fmt.Fprintf(&b, "# time at the links: dispatch %.1f us, combine %.1f us (the slower link of each: no latency, the links overlapped)\n", s.DispatchCallUs, s.CombineCallUs)
		fmt.Fprintf(&b, "# received rows %.0f, of which %.0f cross NVLink (the others are the rank's own or its rail's); rdma rows (DESIGN.md section 6: every destination domain, its own included) %.0f\n", s.RecvRows, s.NVLinkRows, s.RDMARows)
		fmt.Fprintf(&b, "# windows: rows of hidden fp32 (%d bytes) + topk fp32 weights + an 8-byte flag; receive = ranks x tokens rows, combine = tokens x min(topk, domain ranks)%s rows\n",
			4*s.Hidden, map[bool]string{true: " x (1 + domains)", false: ""}[s.Domains > 1])
		fmt.Fprintf(&b, "# outputs: dispatch = recv x (row + 2 x topk x 4), dispatch-permute = permuted x (row + 4) + recv x 2 x topk x 4, combine = tokens x row; row = %d bytes (%s)\n", s.RowBytes, s.DType)
		fmt.Fprintf(&b, "# bytes = rows x row bytes; time_us = bytes / GB/s / 1e3; rail rows = over a rank's tokens, the distinct destination domains other than its own\n")
	}
	_, err := io.WriteString(w, WrapComments(b.String(), TableWidth))
	return err
}

// human writes n bytes in B, KiB, MiB or GiB.
func human(n float64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.2f GiB", n/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.2f MiB", n/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.2f KiB", n/(1<<10))
	}
	return fmt.Sprintf("%.0f B", n)
}
