package plan

// The sizes of what a rank maps and allocates at engine creation, sized
// for the worst case of the engine's parameters: the GPU data path's
// windows (package gpu maps them), the rail's slots (package rail) and the
// GPU path's forwarding buffer. They live here, as pure functions of the
// parameters, so that the paths that allocate them and the sizing report
// (executor.GPUFootprint, eprun size) read one formula.

// RailHeader is the bytes of a rail slot's header (package rail's format).
const RailHeader = 2048

// RailSlot is the bytes of one rail slot, and of its area: a RailHeader,
// an area of MaxTokensPerRank x TopK 4-byte values (routing in the layout,
// weights in dispatch, weight gradients in combine), then MaxTokensPerRank
// rows of hidden fp32 elements (the widest dtype, so that one slot holds
// any call's rows).
func RailSlot(p Params, hidden int) (slot, area int) {
	area = p.MaxTokensPerRank * p.TopK * 4
	return RailHeader + area + p.MaxTokensPerRank*hidden*4, area
}

// GPUWindows is the geometry of one rank's GPU windows (the regions other
// than the flags, whose size is nvlink.GPUFlagsSize of the domain's ranks)
// and of the forwarding buffer of several domains. Window rows are hidden
// elements of Params.RowElem bytes (the widest dtype the calls move), so
// that one window serves every call; the forwarding buffer holds fp32
// partial sums whatever the dtype.
type GPUWindows struct {
	// DomainRanks is the ranks of this rank's NVLink domain.
	DomainRanks int
	// RecvRows is the dispatch receive region's rows: every rank's
	// MaxTokensPerRank tokens (all R ranks': with several domains the
	// forwarded rows land here too), or MaxRecvTokens in capacity mode.
	RecvRows int
	// CombRows is the combine region's rows: MaxTokensPerRank x
	// min(TopK, DomainRanks) (a token's terms from the ranks of the
	// domain), and with several domains as many again for each domain's
	// forwarded tokens.
	CombRows int
	// RecvWeightsOff and RecvFlagsOff are the byte offsets of the receive
	// region's weights ([RecvRows, TopK] fp32) and row flags ([RecvRows]
	// uint64); CombWeightsOff and CombFlagsOff the combine region's.
	RecvWeightsOff, RecvFlagsOff int
	CombWeightsOff, CombFlagsOff int
	// Recv, Comb and Route are the bytes of the receive, combine and route
	// regions. The route region holds every rank's routing and token count
	// when the layout runs on the GPU (GPULayout); else it is a placeholder
	// of 8 bytes.
	Recv, Comb, Route int
	// GPULayout: the layout runs on the GPU, in one domain whose layout
	// buffers stay within int32 offsets at the largest sizes (else on the
	// host, as with several domains).
	GPULayout bool
	// Forward is the bytes of the GPU path's forwarding buffer with several
	// domains (rows [Domains x MaxTokensPerRank, hidden] fp32, then their
	// weights [.., TopK] fp32), 0 in one domain.
	Forward int
}

// NewGPUWindows is the geometry of the windows of a rank of a group of
// numRanks ranks with rows of hidden elements; p.RanksPerDomain is the
// domain size (0 or numRanks: one domain). It is the same on every rank.
func NewGPUWindows(p Params, numRanks, hidden int) GPUWindows {
	D := p.RanksPerDomain
	if D <= 0 || D > numRanks {
		D = numRanks
	}
	M := numRanks / D // domains
	T, K := p.MaxTokensPerRank, p.TopK
	w := GPUWindows{DomainRanks: D, RecvRows: numRanks * T}
	if p.Capacity {
		w.RecvRows = p.MaxRecvTokens
	}
	W := min(K, D)
	w.CombRows = T * W
	if M > 1 {
		// Entries of the forwarded tokens follow this rank's own.
		w.CombRows += M * T * W
	}
	elem := p.RowElem
	if elem <= 0 {
		elem = 4 // fp32, the widest dtype
	}
	rowMax := hidden * elem
	w.RecvWeightsOff, w.CombWeightsOff = w.RecvRows*rowMax, w.CombRows*rowMax
	w.RecvFlagsOff = roundUp8(w.RecvWeightsOff + w.RecvRows*K*4)
	w.CombFlagsOff = roundUp8(w.CombWeightsOff + w.CombRows*K*4)
	w.Recv = w.RecvFlagsOff + w.RecvRows*8
	w.Comb = w.CombFlagsOff + w.CombRows*8
	w.GPULayout = M == 1 && gpuLayoutFits(p, D, T, w.RecvRows)
	w.Route = 8
	if w.GPULayout {
		w.Route = 4 * D * (T*K + 1)
	}
	if M > 1 {
		rows := max(M*T, 1)
		w.Forward = rows*hidden*4 + rows*K*4
	}
	return w
}

func roundUp8(n int) int { return (n + 7) / 8 * 8 }
