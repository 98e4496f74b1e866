package executor

import (
	"github.com/goep/goep/executor/internal/plan"
	"github.com/goep/goep/nvlink"
)

// GPUFootprint is the memory one rank's engine on the CUDA backend takes at
// New, before any call: its GPU windows (mapped by every rank of its NVLink
// domain), and with several domains the rail's regions and the forwarding
// buffer. All are sized for the config's worst case (every rank sending
// MaxTokensPerRank tokens; window rows of Hidden elements of Config.RowDType,
// fp32 by default; the rail's rows and the forwarding buffer fp32, which
// carry fp32 partial sums), not for a routing, and are the same on every
// rank. Sizes are in bytes.
// The calls' outputs come on top (blocking mode: sized to each layout's
// counts).
type GPUFootprint struct {
	// RanksPerDomain is D; Domains is R / D.
	RanksPerDomain int `json:"ranks_per_domain"`
	Domains        int `json:"domains"`
	// RecvRows and CombineRows are the rows of the dispatch receive and
	// the combine windows.
	RecvRows    int `json:"recv_rows"`
	CombineRows int `json:"combine_rows"`
	// Flags, Recv, Combine and Route are the GPU window's regions: the
	// domain's flags (nvlink.GPUFlagsSize), dispatch's receive rows with
	// their weights and row flags, combine's likewise, and the routing the
	// GPU layout reads (8 bytes when the layout runs on the host).
	Flags   int `json:"flags_bytes"`
	Recv    int `json:"recv_bytes"`
	Combine int `json:"combine_bytes"`
	Route   int `json:"route_bytes"`
	// Forward is device memory of several domains: the rows forwarded
	// within the domain, with their weights.
	Forward int `json:"forward_bytes"`
	// RailSend, RailRecv and RailForward are host memory of several
	// domains, mapped for the GPU: the rail transport's send region (a
	// slot per domain), its receive region (two parities of a slot per
	// domain) and the forwarding slots the domain's ranks read.
	RailSend    int `json:"rail_send_bytes"`
	RailRecv    int `json:"rail_recv_bytes"`
	RailForward int `json:"rail_forward_bytes"`
	// RailSlot is the bytes of one rail slot.
	RailSlot int `json:"rail_slot_bytes"`
	// GPULayout: the layout runs on the GPU (one domain, within int32
	// offsets); else on the host.
	GPULayout bool `json:"gpu_layout"`
}

// Device is the device memory of the footprint: the window and the
// forwarding buffer.
func (f GPUFootprint) Device() int { return f.Flags + f.Recv + f.Combine + f.Route + f.Forward }

// Host is the host memory of the footprint (the rail's regions).
func (f GPUFootprint) Host() int { return f.RailSend + f.RailRecv + f.RailForward }

// NewGPUFootprint is the footprint of a rank of a group of numRanks ranks
// with config c, computed from the formulas the CUDA data path and the
// rail allocate by; it needs no GPU. c.RanksPerDomain 0 means one domain
// of every rank (no detection and no GOEP_RANKS_PER_DOMAIN: the shape is
// the caller's to state).
func NewGPUFootprint(c Config, numRanks int) (GPUFootprint, error) {
	if err := c.ValidateFor(numRanks); err != nil {
		return GPUFootprint{}, err
	}
	p := c.params()
	if p.RanksPerDomain == 0 {
		p.RanksPerDomain = numRanks
	}
	w := plan.NewGPUWindows(p, numRanks, c.Hidden)
	f := GPUFootprint{
		RanksPerDomain: w.DomainRanks, Domains: numRanks / w.DomainRanks,
		RecvRows: w.RecvRows, CombineRows: w.CombRows,
		Flags: nvlink.GPUFlagsSize(w.DomainRanks), Recv: w.Recv, Combine: w.Comb, Route: w.Route,
		Forward: w.Forward, GPULayout: w.GPULayout,
	}
	if f.Domains > 1 {
		f.RailSlot, _ = plan.RailSlot(p, c.Hidden)
		f.RailSend, f.RailRecv, f.RailForward = f.Domains*f.RailSlot, 2*f.Domains*f.RailSlot, f.Domains*f.RailSlot
	}
	return f, nil
}
