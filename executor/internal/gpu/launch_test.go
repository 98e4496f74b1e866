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
