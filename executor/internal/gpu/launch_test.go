package gpu

import (
	"fmt"
	"testing"
)

// TestCommShape checks the launch shapes of the push and scatter kernels
// under the tuning knobs, and that the kernels' loop (block b takes chunks
// b, b + grid.x, ... of ChunkRows items; mirrored here) visits every item
// exactly once. Runs without a GPU.
func TestCommShape(t *testing.T) {
	for _, items := range []int{1, 2, 7, 64, 1000, 100_003} {
		for _, units := range []int{1, 97, 896, 5000} {
			for _, sms := range []int{0, 1, 3, 132} {
				for _, chunk := range []int{0, 1, 4, 33} {
					grid, block, c, err := commShape(items, units, 8, sms, chunk)
					if err != nil {
						t.Fatal(err)
					}
					name := fmt.Sprintf("items %d units %d sms %d chunk %d", items, units, sms, chunk)
					if c != int64(max(chunk, 1)) {
						t.Errorf("%s: chunk %d", name, c)
					}
					if grid[0] < 1 || grid[1] < 1 || block[0] < 32 || block[0] > 1024 {
						t.Errorf("%s: grid %v block %v", name, grid, block)
					}
					if sms > 0 && (int(grid[0]) > sms || grid[1] != 1) {
						t.Errorf("%s: grid %v has more than %d blocks", name, grid, sms)
					}
					if sms == 0 && int64(grid[0])*c < int64(items) {
						t.Errorf("%s: grid.x %d leaves chunks without a block", name, grid[0])
					}
					seen := make([]int8, items)
					for b := int64(0); b < int64(grid[0]); b++ {
						for s := b * c; s < int64(items); s += int64(grid[0]) * c {
							for j := s; j < min(s+c, int64(items)); j++ {
								seen[j]++
							}
						}
					}
					for j, n := range seen {
						if n != 1 {
							t.Fatalf("%s: item %d visited %d times", name, j, n)
						}
					}
				}
			}
		}
	}
}

// TestOneLaunchShape checks the one-launch kernels' grids: the grids of
// every rank on one GPU fit its SMs together (they wait for each other and
// must all be resident), Config.SMs caps them, a launch has at least one
// block and no more blocks than its items need. Runs without a GPU.
func TestOneLaunchShape(t *testing.T) {
	for _, sms := range []int{1, 8, 132} {
		for _, same := range []int{0, 1, 2, 4, 8, 200} {
			for _, knob := range []int{0, 1, 5, 1000} {
				blocks := oneLaunchBlocks(sms, same, knob)
				name := fmt.Sprintf("sms %d ranks on the GPU %d knob %d", sms, same, knob)
				if blocks < 1 || (sms >= max(same, 1) && blocks*max(same, 1) > sms) {
					t.Errorf("%s: %d blocks a rank", name, blocks)
				}
				if knob > 0 && blocks > knob {
					t.Errorf("%s: %d blocks, more than the knob", name, blocks)
				}
				for _, items := range [][2]int{{0, 0}, {1, 0}, {0, 3}, {17, 5}, {4096 * 8, 4096 * 4}, {100_003, 7}} {
					grid := oneLaunchGrid(blocks, items[0], items[1])
					if grid < 1 || grid > blocks {
						t.Errorf("%s items %v: grid %d of at most %d blocks", name, items, grid, blocks)
					}
					// No block without an item, unless there are none.
					if warps := oneLaunchThreads / 32; grid > 1 && (grid-1)*warps >= max(items[0], items[1]) {
						t.Errorf("%s items %v: grid %d has a block with no item", name, items, grid)
					}
				}
			}
		}
	}
}

// TestOneLaunchSumChunks: the combine's sums cut a row into items of 128
// units (the kernel's sumChunk), the last one partial, at least one item
// a row that has units.
func TestOneLaunchSumChunks(t *testing.T) {
	for _, c := range [][2]int{{1, 1}, {127, 1}, {128, 1}, {129, 2}, {896, 7}, {7168, 56}} {
		if got := oneLaunchSumChunks(c[0]); got != c[1] {
			t.Errorf("%d units: %d items, want %d", c[0], got, c[1])
		}
	}
}

// TestOneLaunchFits: the one-launch kernels take engines whose item
// counts stay below 2^31 - 2^16, the workload of record included, and
// leave larger ones to the kernel sequences.
func TestOneLaunchFits(t *testing.T) {
	for _, c := range []struct {
		maxTokens, hidden, width, ranks, recvCap int
		want                                     bool
	}{
		{4096, 7168, 8, 8, 8 * 4096, true},
		{32768, 7168, 8, 64, 64 * 32768, true},        // DESIGN.md's workload of record
		{1 << 26, 7168, 1, 1, 1 << 26, false},         // 2^26 tokens of 56 chunks
		{1024, 128, 8, 1 << 16, 1 << 16, false},       // 2^32 receive items
		{1 << 20, 128, 8, 1024, 1 << 20, true},        // 2^30 receive items
		{1<<28 - 1<<13, 128, 8, 8, 1 << 20, false},    // 2^31 - 2^16 dispatch entries
		{1<<28 - 1<<13 - 1, 128, 8, 8, 1 << 20, true}, // one token fewer
	} {
		if got := oneLaunchFits(c.maxTokens, c.hidden, c.width, c.ranks, c.recvCap); got != c.want {
			t.Errorf("oneLaunchFits(%d, %d, %d, %d, %d) = %v, want %v", c.maxTokens, c.hidden, c.width, c.ranks, c.recvCap, got, c.want)
		}
	}
}
