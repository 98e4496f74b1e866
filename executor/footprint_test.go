package executor

import (
	"testing"

	"github.com/goep/goep/executor/internal/plan"
	"github.com/goep/goep/nvlink"
)

// TestNewGPUFootprint: R=4, E=8, K=2, H=16, T=8 counted by hand (rows of
// 16 fp32 = 64 bytes, 2 fp32 weights, an 8-byte flag), in one domain and
// in two of 2 (rail slots of a 2048-byte header, 8 x 2 int32, 8 rows).
func TestNewGPUFootprint(t *testing.T) {
	c := Config{NumExperts: 8, TopK: 2, Hidden: 16, MaxTokensPerRank: 8}
	f, err := NewGPUFootprint(c, 4)
	if err != nil {
		t.Fatal(err)
	}
	want := GPUFootprint{RanksPerDomain: 4, Domains: 1, RecvRows: 32, CombineRows: 16,
		Flags: nvlink.GPUFlagsSize(4), Recv: 32 * 80, Combine: 16 * 80, Route: 4 * 4 * (8*2 + 1), GPULayout: true}
	if !plan.HaveLayoutDims {
		// Without cgo the layout's dimensions are not known: the host
		// layout's 8-byte route region.
		want.GPULayout, want.Route = false, 8
	}
	if f != want || f.Device() != want.Flags+2560+1280+want.Route || f.Host() != 0 {
		t.Errorf("one domain:\n got %+v\nwant %+v", f, want)
	}
	c.RanksPerDomain = 2
	if f, err = NewGPUFootprint(c, 4); err != nil {
		t.Fatal(err)
	}
	const slot = 2048 + 8*2*4 + 8*16*4
	want = GPUFootprint{RanksPerDomain: 2, Domains: 2, RecvRows: 32, CombineRows: 8*2 + 2*8*2,
		Flags: nvlink.GPUFlagsSize(2), Recv: 32 * 80, Combine: 48 * 80, Route: 8, Forward: 16 * (64 + 8),
		RailSend: 2 * slot, RailRecv: 4 * slot, RailForward: 2 * slot, RailSlot: slot}
	if f != want || f.Host() != 8*slot {
		t.Errorf("two domains:\n got %+v\nwant %+v", f, want)
	}
	c.RanksPerDomain = 3
	if _, err := NewGPUFootprint(c, 4); err == nil {
		t.Error("3 ranks a domain of 4 accepted")
	}
}
