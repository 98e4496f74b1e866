//go:build cuda && cgo

package permute

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/goep/goep/device"
)

// TestStagedPlan checks when Permute takes goep_permute_staged and the
// shape it gives it, for an H200's sizes (132 SMs, two blocks of 113 KiB
// an SM) and random ones. It needs no GPU.
func TestStagedPlan(t *testing.T) {
	h200 := &CUDAKernels{stagedShared: 115712, stagedBlocks: 264}
	auto := defaultPermute
	on := launchCfg{staged: stagedOn}
	for _, c := range []struct {
		name                          string
		k                             *CUDAKernels
		vec                           bool
		rows, topk, permCap, rowBytes int
		cfg                           launchCfg
		ok                            bool
		grid, g, shared               int
	}{
		{"4096 bf16 rows of 7168 at top-8: two rounds of 8 rows a block", h200, true, 4096, 8, 4096 * 8, 14336, auto, true, 264, 8, 8*(14336+96) + stagedSlack},
		{"fp32 rows of 7168: 4 rows a block a round", h200, true, 4096, 8, 4096 * 8, 28672, auto, true, 264, 4, 4*(28672+96) + stagedSlack},
		{"1056 rows (8 an SM) is enough", h200, true, 1056, 8, 1056 * 8, 14336, auto, true, 264, 4, 4*(14336+96) + stagedSlack},
		{"1055 rows is not", h200, true, 1055, 8, 1055 * 8, 14336, auto, false, 0, 0, 0},
		{"top-4 is not (auto)", h200, true, 4096, 4, 4096 * 4, 14336, auto, false, 0, 0, 0},
		{"top-4 forced", h200, true, 4096, 4, 4096 * 4, 14336, on, true, 264, 8, 8*(14336+48) + stagedSlack},
		{"no 16-byte units", h200, false, 4096, 8, 4096 * 8, 14336, on, false, 0, 0, 0},
		{"off", h200, true, 4096, 8, 4096 * 8, 14336, launchCfg{staged: stagedOff}, false, 0, 0, 0},
		{"a GPU that cannot run it", &CUDAKernels{}, true, 4096, 8, 4096 * 8, 14336, on, false, 0, 0, 0},
		{"a row larger than the shared memory", h200, true, 4096, 8, 4096 * 8, 115712, on, false, 0, 0, 0},
		{"more slots than threads", h200, true, 4096, 1025, 4096 * 1025, 16, on, false, 0, 0, 0},
		{"few rows: a block each", h200, true, 10, 8, 10 * 8, 14336, on, true, 10, 1, 14336 + 96 + stagedSlack},
		{"rows capped", h200, true, 4096, 8, 4096 * 8, 14336, launchCfg{staged: stagedOn, stagedRows: 3}, true, 264, 3, 3*(14336+96) + stagedSlack},
		{"no rows", h200, true, 0, 8, 0 * 8, 14336, on, false, 0, 0, 0},
		{"top-8 with a quarter of the slots in use (auto)", h200, true, 4096, 8, 4096 * 2, 14336, auto, false, 0, 0, 0},
		{"top-8 with the slots in use and padding (auto)", h200, true, 4096, 8, 4096*8 + 64*127, 14336, auto, true, 264, 8, 8*(14336+96) + stagedSlack},
		{"a quarter of the slots, forced", h200, true, 4096, 8, 4096 * 2, 14336, on, true, 264, 8, 8*(14336+96) + stagedSlack},
	} {
		grid, g, shared, ok := c.k.stagedPlan(c.vec, c.rows, c.topk, c.permCap, c.rowBytes, c.cfg)
		if ok != c.ok || grid != c.grid || g != c.g || shared != c.shared {
			t.Errorf("%s: stagedPlan = grid %d, g %d, shared %d, %v; want %d, %d, %d, %v",
				c.name, grid, g, shared, ok, c.grid, c.g, c.shared, c.ok)
		}
	}
	// Whatever the sizes: the shared memory fits, a thread per slot, and
	// the rounds are as few as the shared memory allows.
	r := rand.New(rand.NewPCG(5, 6))
	for range 10000 {
		k := &CUDAKernels{stagedShared: stagedSlack + r.IntN(300000), stagedBlocks: 2 * (1 + r.IntN(200))}
		rows, topk, rb := 1+r.IntN(100000), 1+r.IntN(40), 16*(1+r.IntN(4000))
		cfg := launchCfg{staged: stagedOn, stagedRows: r.IntN(3) * r.IntN(10)}
		grid, g, shared, ok := k.stagedPlan(true, rows, topk, rows*topk, rb, cfg)
		per := rb + 12*topk
		gmax := min((k.stagedShared-stagedSlack)/per, stagedThreads/topk)
		if cfg.stagedRows > 0 {
			gmax = min(gmax, cfg.stagedRows)
		}
		if !ok {
			if gmax >= 1 {
				t.Fatalf("shared %d, rows %d, top-%d, row %d bytes: refused, but %d rows fit a block", k.stagedShared, rows, topk, rb, gmax)
			}
			continue
		}
		rounds := func(g int) int { return (rows + grid*g - 1) / (grid * g) }
		if g < 1 || g > gmax || shared != g*per+stagedSlack || shared > k.stagedShared || g*topk > stagedThreads ||
			grid < 1 || grid > k.stagedBlocks || grid > rows || rounds(g) != rounds(gmax) {
			t.Fatalf("shared %d, blocks %d, rows %d, top-%d, row %d bytes, cap %d: grid %d, g %d, shared %d (gmax %d)",
				k.stagedShared, k.stagedBlocks, rows, topk, rb, cfg.stagedRows, grid, g, shared, gmax)
		}
	}
}

// TestCUDAStagedMatchesHost runs TestCUDAMatchesHost's random cases with
// Permute on goep_permute_staged wherever a call allows it (16-byte
// units), a block staging as many rows a round as fit, 1 or 3 (several
// rounds), rows up to 700.
func TestCUDAStagedMatchesHost(t *testing.T) {
	_, s, k := gpu(t)
	t.Cleanup(func() { k.permuteCfg = defaultPermute })
	r := rand.New(rand.NewPCG(3, 4))
	staged := 0
	for _, rowsCap := range []int{0, 1, 3} {
		for i := range 16 {
			c := randCase(r, []int{1, 5, 300, 700}[i%4])
			k.permuteCfg = defaultPermute
			k.permuteCfg.staged, k.permuteCfg.stagedRows = stagedOn, rowsCap
			rb := c.hidden * c.dt.Size()
			if _, _, _, ok := k.stagedPlan(!c.misalign && rb%16 == 0, min(c.m.Rows, c.m.RowCap), c.m.TopK, c.m.PermCap, rb, k.permuteCfg); ok {
				staged++
			}
			t.Run(fmt.Sprintf("cap=%d/%d/%v", rowsCap, i, c), func(t *testing.T) { runCase(t, r, s, k, c) })
		}
	}
	if staged < 10 {
		t.Errorf("only %d of 48 cases took goep_permute_staged", staged)
	}
	t.Logf("%d of 48 cases took goep_permute_staged", staged)

	// The shapes the random cases do not reach: a block's shared memory
	// full (8 bf16 or 4 fp32 rows of 7168 a block, the benchmark's shape)
	// and a thread for every one of 1024 slots (64 rows of 64 at top-16).
	k.permuteCfg = defaultPermute
	k.permuteCfg.staged = stagedOn
	for _, f := range []struct {
		dt                   device.DType
		hidden, topk, blockG int
	}{{device.BF16, 7168, 8, 8}, {device.FP32, 7168, 8, 4}, {device.BF16, 64, 16, 64}} {
		c := fullCase(r, f.dt, f.hidden, f.blockG*k.stagedBlocks, f.topk, max(64, f.topk))
		rb := f.hidden * f.dt.Size()
		_, g, shared, ok := k.stagedPlan(true, c.m.Rows, f.topk, c.m.PermCap, rb, k.permuteCfg)
		if !ok || g != f.blockG {
			t.Fatalf("%v: stagedPlan gives %d rows a block (%v), want %d", c, g, ok, f.blockG)
		}
		t.Logf("%v: %d rows a block, %d slots, %d bytes of shared memory of %d", c, g, g*f.topk, shared, k.stagedShared)
		t.Run(fmt.Sprintf("full/%v", c), func(t *testing.T) { runCase(t, r, s, k, c) })
	}
}

// fullCase is a kcase with every slot in use: rows tokens, each picking
// topk distinct experts of experts (>= topk) at random, positions
// expert-major, no padding, weighted, aligned (BenchmarkCUDA's routing).
func fullCase(r *rand.Rand, dt device.DType, hidden, rows, topk, experts int) kcase {
	c := kcase{dt: dt, hidden: hidden, weighted: true, counts: make([]int32, experts)}
	slot := make([]int32, rows*topk)
	for i := range rows {
		for k, e := range r.Perm(experts)[:topk] {
			slot[i*topk+k] = int32(e)
			c.counts[e]++
		}
	}
	c.offsets = make([]int32, experts+1)
	for e := range experts {
		c.offsets[e+1] = c.offsets[e] + c.counts[e]
	}
	seen := make([]int32, experts)
	pos := make([]int32, len(slot))
	for i, e := range slot {
		pos[i] = c.offsets[e] + seen[e]
		seen[e]++
	}
	p := int(c.offsets[experts])
	c.m = Map{Rows: rows, TopK: topk, Pos: pos, RowCap: rows, PermCap: p}
	return c
}

// TestCUDAStagedGraph captures a Permute on goep_permute_staged (2 rows a
// block a round: several rounds) into a CUDA graph and replays it with
// new positions copied into the positions buffer before each launch, as
// capacity mode's graphs do after a Relayout; each replay's rows and
// weights must be the host's, bit for bit.
func TestCUDAStagedGraph(t *testing.T) {
	_, s, k := gpu(t)
	t.Cleanup(func() { k.permuteCfg = defaultPermute })
	k.permuteCfg.staged, k.permuteCfg.stagedRows = stagedOn, 2
	const rows, topk, hidden = 1500, 8, 2048
	dt := device.BF16
	rb := hidden * dt.Size()
	permCap := rows * topk
	r := rand.New(rand.NewPCG(9, 10))
	// routing: a random position for every slot, a tenth of them empty or
	// past the capacity.
	routing := func() []int32 {
		pos := make([]int32, rows*topk)
		for i, p := range r.Perm(permCap) {
			pos[i] = int32(p)
			switch r.IntN(20) {
			case 0:
				pos[i] = -1
			case 1:
				pos[i] = int32(permCap + r.IntN(5))
			}
		}
		return pos
	}
	posA, posB := routing(), routing()
	x := randBytes(r, dt, rows*hidden)
	w := randWeights(r, rows*topk)
	var keep []*device.Tensor
	in := func(data []byte, rowBytes int) *device.Buffer {
		tt, v := devBuf(t, s, data, rowBytes, 0)
		keep = append(keep, tt)
		return v
	}
	dA, dB := in(device.EncodeInt32(posA), 16), in(device.EncodeInt32(posB), 16)
	dpos, dx, dw := in(device.EncodeInt32(posA), 16), in(x, rb), in(f32Bytes(w), 16)
	tpx, dpx := devBuf(t, s, bytes.Repeat([]byte{fill}, permCap*rb), rb, 0)
	pwBytes := bytes.Repeat([]byte{fill}, 4*permCap)
	tpw, dpw := devBuf(t, s, pwBytes, 16, 0)
	dm := DeviceMap{Rows: rows, TopK: topk, Pos: dpos, RowCap: rows, PermCap: permCap}
	if _, _, _, ok := k.stagedPlan(true, rows, topk, permCap, rb, k.permuteCfg); !ok {
		t.Fatal("the staged kernel does not take the call")
	}

	must(t, s.BeginCapture())
	if err := k.Permute(s, dt, hidden, dpx, dpw, dx, dw, dm); err != nil {
		_, _ = s.EndCapture()
		t.Fatal(err)
	}
	g, err := s.EndCapture()
	must(t, err)
	t.Cleanup(func() { must(t, g.Close()) })

	px := bytes.Repeat([]byte{fill}, permCap*rb)
	pw := slices.Clone(device.DecodeFloat32(device.FP32, pwBytes))
	for i, pos := range [][]int32{posA, posB, posA} {
		src := []*device.Buffer{dA, dB, dA}[i]
		must(t, s.Copy(dpos, 0, src, 0, 4*len(pos)))
		must(t, g.Launch(s))
		Permute(dt, hidden, px, pw, x, w, Map{Rows: rows, TopK: topk, Pos: pos, RowCap: rows, PermCap: permCap})
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		must(t, s.Synchronize(ctx))
		cancel()
		checkBuf(t, fmt.Sprintf("replay %d: permuted rows", i), dt, rb, tpx, px, 0)
		checkBuf(t, fmt.Sprintf("replay %d: permuted weights", i), device.FP32, 16, tpw, device.EncodeFloat32(device.FP32, pw), 0)
	}
	runtime.KeepAlive(keep)
}
