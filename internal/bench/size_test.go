package bench

import (
	"bytes"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/goep/goep/configs"
	"github.com/goep/goep/device"
	"github.com/goep/goep/executor"
)

// TestCountRowsByHand: R=4 ranks of L=2 experts, two domains of 2, top-2,
// 2 tokens a rank, every count worked out from the routing below.
func TestCountRowsByHand(t *testing.T) {
	idx := [][]int32{
		{0, 1, 2, 7}, // rank 0: t0 -> rank 0; t1 -> ranks 1, 3
		{4, 5, 0, 6}, // rank 1: t0 -> rank 2; t1 -> ranks 0, 3
		{1, 2, 3, 4}, // rank 2: t0 -> ranks 0, 1; t1 -> ranks 1, 2
		{6, 7, 5, 0}, // rank 3: t0 -> rank 3; t1 -> ranks 2, 0
	}
	rc := countRows(idx, 2, 8, 2, 2, 1)
	for _, c := range []struct {
		name      string
		got, want []int
	}{
		// rank 0 gets (0,0) (1,1) (2,0) (3,1); rank 1 (0,1) (2,0) (2,1);
		// rank 2 (1,0) (2,1) (3,1); rank 3 (0,1) (1,1) (3,0).
		{"recv", rc.Recv, []int{4, 3, 3, 3}},
		// A row crosses NVLink unless its source has the receiver's
		// local index (rank 0: from 1 and 3; rank 3: from 0 only).
		{"nvlink", rc.NVLink, []int{2, 3, 2, 1}},
		// Destination domains per token other than the source's own:
		// rank 0: 0 + 1, rank 1: 1 + 1, rank 2: 1 + 1, rank 3: 0 + 1.
		{"rail", rc.Rail, []int{1, 2, 2, 1}},
		// ... and with its own: 1 + 2 for every rank.
		{"rdma", rc.RDMA, []int{3, 3, 3, 3}},
		// Expert loads 3 2 2 1 2 2 2 2, two experts a rank.
		{"permuted", rc.Permuted, []int{5, 3, 4, 4}},
	} {
		if !slices.Equal(c.got, c.want) {
			t.Errorf("%s: %v, want %v", c.name, c.got, c.want)
		}
	}
	if got := countRows(idx, 2, 8, 2, 2, 4).Permuted; !slices.Equal(got, []int{8, 8, 8, 8}) {
		t.Errorf("permuted, pad 4: %v, want every expert's load rounded up to 4", got)
	}
}

// TestSizeSmall: the sizing of a small shape against its parts: the
// footprint is the engine's (executor.NewGPUFootprint with windows of
// the case's bf16 rows: the geometry the GPU path allocates by), the rows
// those counted from the routing, the bytes rows x row bytes and the times
// bytes / rate.
func TestSizeSmall(t *testing.T) {
	c := Defaults()
	c.Ranks, c.RanksPerDomain, c.Experts, c.TopK, c.Hidden, c.Tokens, c.Routing = 4, 2, 8, Ints{2}, Ints{16}, Ints{8}, RoutingBalanced
	sz, err := Size(c, 200, 50)
	if err != nil {
		t.Fatal(err)
	}
	if len(sz) != 1 {
		t.Fatalf("%d sizings, want 1", len(sz))
	}
	s := sz[0]
	fp, err := executor.NewGPUFootprint(executor.Config{NumExperts: 8, TopK: 2, Hidden: 16, MaxTokensPerRank: 8, RanksPerDomain: 2, RowDType: device.BF16}, 4)
	if err != nil {
		t.Fatal(err)
	}
	if s.Footprint != fp || s.DeviceBytes != fp.Device() || s.HostBytes != fp.Host() {
		t.Errorf("footprint %+v, want the engine's %+v", s.Footprint, fp)
	}
	rc := CountRows(c.RoutingSpec(), c.Seed, 4, 2, 8, 2, 8, 1)
	if s.Rows != "counted" || s.RecvRows != float64(slices.Max(rc.Recv)) || s.NVLinkRows != float64(slices.Max(rc.NVLink)) ||
		s.RailRows != float64(slices.Max(rc.Rail)) || s.PermutedRows != float64(slices.Max(rc.Permuted)) {
		t.Errorf("rows %+v, want the most of %+v", s, rc)
	}
	// Balanced: 4 x 8 x 2 slots over 8 experts, 8 each: 16 permuted rows a rank.
	if s.PermutedRows != 16 {
		t.Errorf("permuted rows %v, want 16 (balanced)", s.PermutedRows)
	}
	if s.RowBytes != 32 || s.DispatchNVLinkBytes != s.NVLinkRows*32 || s.CombineRailBytes != s.RailRows*32 {
		t.Errorf("bytes: row %d, nvlink %v, rail %v", s.RowBytes, s.DispatchNVLinkBytes, s.CombineRailBytes)
	}
	if s.DispatchOutputBytes != s.RecvRows*(32+16) || s.DispatchPermuteOutputBytes != 16*(32+4)+s.RecvRows*16 || s.CombineOutputBytes != 8*32 {
		t.Errorf("outputs: %v %v %v", s.DispatchOutputBytes, s.DispatchPermuteOutputBytes, s.CombineOutputBytes)
	}
	if s.DispatchNVLinkUs != s.DispatchNVLinkBytes/200e3 || s.DispatchRailUs != s.DispatchRailBytes/50e3 ||
		s.DispatchCallUs != max(s.DispatchNVLinkUs, s.DispatchRailUs) {
		t.Errorf("times: %v %v %v", s.DispatchNVLinkUs, s.DispatchRailUs, s.DispatchCallUs)
	}
	var b bytes.Buffer
	if err := WriteSizing(&b, "small", sz); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"ranks 4 (2 domains of 2)", "host: rail receive (two parities)", "rows: counted from the routing"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, b.String())
		}
	}
	if _, err := Size(c, 0, 50); err == nil {
		t.Error("a link rate of 0 accepted")
	}
}

// TestExpectedRowsAgainstCounts: the formula against the rows counted
// from a uniform routing of 16 ranks, 4 domains, 4096 tokens: the mean
// over ranks within 2% (the routing is fixed by its seed, so the test is
// deterministic).
func TestExpectedRowsAgainstCounts(t *testing.T) {
	const R, D, E, K, T = 16, 4, 128, 8, 4096
	recv, perm, nvl, rail, rdma := ExpectedRows(R, D, E, K, T, 1)
	rc := CountRows(RoutingSpec{}, 1, R, D, E, K, T, 1)
	mean := func(v []int) float64 {
		s := 0
		for _, x := range v {
			s += x
		}
		return float64(s) / float64(len(v))
	}
	for _, c := range []struct {
		name      string
		want, got float64
	}{
		{"recv", recv, mean(rc.Recv)}, {"permuted", perm, mean(rc.Permuted)}, {"nvlink", nvl, mean(rc.NVLink)},
		{"rail", rail, mean(rc.Rail)}, {"rdma", rdma, mean(rc.RDMA)},
	} {
		if math.Abs(c.got-c.want) > 0.02*c.want {
			t.Errorf("%s: counted %.0f a rank, expected %.0f", c.name, c.got, c.want)
		}
	}
}

// TestWorkloadOfRecord: the embedded gb300-ep64 config has the workload
// of record's shape (DESIGN.md), and its full-scale sizing has the
// window sizes of the GPU path's formula.
func TestWorkloadOfRecord(t *testing.T) {
	c := workloadOfRecord(t)
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	want := Defaults()
	want.Ranks, want.Experts, want.TopK, want.Hidden, want.Tokens = 64, 896, Ints{16}, Ints{7168}, Ints{32768}
	want.SMs, want.ChunkRows, want.Routing, want.ScaleToFit = Ints{32}, Ints{128}, RoutingBalanced, true
	want.Iters, want.Warmup = c.Iters, c.Warmup
	if c.Ranks != want.Ranks || c.Experts != want.Experts || !slices.Equal(c.TopK, want.TopK) || !slices.Equal(c.Hidden, want.Hidden) ||
		!slices.Equal(c.Tokens, want.Tokens) || !slices.Equal(c.DType, Strings{"bf16"}) || !slices.Equal(c.Mode, Strings{ModeBlocking}) ||
		!slices.Equal(c.SMs, want.SMs) || !slices.Equal(c.ChunkRows, want.ChunkRows) || c.Routing != want.Routing || !c.ScaleToFit ||
		c.RanksPerDomain != 0 || c.Pad != 1 {
		t.Fatalf("gb300-ep64: %+v", c)
	}
	if testing.Short() {
		t.Skip("the full-scale sizing counts 2^25 slots")
	}
	sz, err := Size(c, 900, 100)
	if err != nil {
		t.Fatal(err)
	}
	s := sz[0]
	// Receive: 64 x 32768 rows of 7168 bf16 (the case's dtype), 16 fp32
	// weights, a flag. Combine: 32768 x 16 rows likewise. Route:
	// 64 x (32768 x 16 + 1) int32.
	const recvRows, combRows = 64 * 32768, 32768 * 16
	if s.Footprint.Recv != recvRows*(7168*2+16*4+8) || s.Footprint.Combine != combRows*(7168*2+16*4+8) ||
		s.Footprint.Route != 4*64*(32768*16+1) || !s.Footprint.GPULayout {
		t.Errorf("footprint %+v", s.Footprint)
	}
	// Balanced: 64 x 32768 x 16 slots over 896 experts, 37449 or 37450
	// each, 14 a rank.
	if s.PermutedRows < 14*37449 || s.PermutedRows > 14*37450 {
		t.Errorf("permuted rows %v, want 14 experts of 37449 or 37450", s.PermutedRows)
	}
	if s.RailRows != 0 || s.DispatchRailBytes != 0 {
		t.Errorf("one domain: rail rows %v", s.RailRows)
	}
}

// workloadOfRecord is the embedded gb300-ep64 config, parsed.
func workloadOfRecord(t *testing.T) Config {
	t.Helper()
	data, err := configs.FS.ReadFile("gb300-ep64.yaml")
	if err != nil {
		t.Fatal(err)
	}
	c, err := ParseConfig(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	return c
}
