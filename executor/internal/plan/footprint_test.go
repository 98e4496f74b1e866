package plan

import "testing"

// TestNewGPUWindows: the windows of R=4, E=8, K=2, H=16, T=8, counted by
// hand: rows of 16 fp32 (64 bytes), 2 fp32 weights (8 bytes) and an 8-byte
// flag a row.
func TestNewGPUWindows(t *testing.T) {
	p := Params{NumExperts: 8, TopK: 2, MaxTokensPerRank: 8, PadMultiple: 1}
	for _, tc := range []struct {
		name string
		D    int
		want GPUWindows
	}{
		// One domain: 32 receive rows (2048 + 256 + 256 bytes), 8 x
		// min(2, 4) = 16 combine rows (1024 + 128 + 128), the route
		// region 4 ranks x (8 x 2 + 1) int32.
		{"one domain", 0, GPUWindows{DomainRanks: 4, RecvRows: 32, CombRows: 16,
			RecvWeightsOff: 2048, RecvFlagsOff: 2304, CombWeightsOff: 1024, CombFlagsOff: 1152,
			Recv: 2560, Comb: 1280, Route: 272, GPULayout: true}},
		// Two domains of 2: the receive region still holds every rank's
		// tokens; combine 16 rows plus 2 domains x 16 forwarded (3072 +
		// 384 + 384); the layout on the host; forwarding 2 x 8 rows of
		// 64 + 8 bytes.
		{"two domains", 2, GPUWindows{DomainRanks: 2, RecvRows: 32, CombRows: 48,
			RecvWeightsOff: 2048, RecvFlagsOff: 2304, CombWeightsOff: 3072, CombFlagsOff: 3456,
			Recv: 2560, Comb: 3840, Route: 8, Forward: 1152}},
	} {
		p.RanksPerDomain = tc.D
		if !HaveLayoutDims && tc.want.GPULayout {
			// Without cgo the layout's dimensions are not known: the
			// host layout's 8-byte route region.
			tc.want.GPULayout, tc.want.Route = false, 8
		}
		if got := NewGPUWindows(p, 4, 16); got != tc.want {
			t.Errorf("%s:\n got %+v\nwant %+v", tc.name, got, tc.want)
		}
	}
	// Capacity mode: the receive region holds the capacity.
	p.RanksPerDomain, p.Capacity, p.MaxRecvTokens, p.MaxPermutedTokens = 0, true, 5, 9
	if w := NewGPUWindows(p, 4, 16); w.RecvRows != 5 || w.Recv != 5*64+5*8+5*8 {
		t.Errorf("capacity 5: %+v, want 5 receive rows of 80 bytes", w)
	}
	// bf16 rows (RowElem 2): 5 rows of 32 bytes, their weights and flags.
	p.RowElem = 2
	if w := NewGPUWindows(p, 4, 16); w.Recv != 5*32+5*8+5*8 || w.RecvWeightsOff != 5*32 || w.CombWeightsOff != 16*32 {
		t.Errorf("bf16 rows, capacity 5: %+v, want 5 receive rows of 32 + 16 bytes, 16 combine rows of 32", w)
	}
	// Layout buffers past int32 offsets: the layout runs on the host.
	big := Params{NumExperts: 1024, TopK: 64, MaxTokensPerRank: 1 << 20, PadMultiple: 1}
	if w := NewGPUWindows(big, 64, 16); w.GPULayout || w.Route != 8 {
		t.Errorf("64 ranks x 2^20 tokens x top-64: GPULayout %v, route %d; want the host layout", w.GPULayout, w.Route)
	}
}

func TestRailSlot(t *testing.T) {
	// A header, 8 tokens x 2 int32, 8 rows of 16 fp32.
	slot, area := RailSlot(Params{NumExperts: 8, TopK: 2, MaxTokensPerRank: 8}, 16)
	if slot != 2048+64+512 || area != 64 {
		t.Errorf("RailSlot: %d, %d; want 2624, 64", slot, area)
	}
}
