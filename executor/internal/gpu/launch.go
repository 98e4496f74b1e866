package gpu

import (
	"fmt"
	"math"

	"github.com/goep/goep/device"
	"github.com/goep/goep/executor/internal/datapath"
)

// Launch shapes and copy units of the data path's kernels: pure functions
// of sizes and addresses, tested without a GPU.

func roundUp(n, m int) int { return (n + m - 1) / m * m }

// rowShape is the launch shape of a row kernel: grid.x = items, blocks of
// up to 256 threads (at least minThreads) over the units of a row,
// grid.y chunks of them.
func rowShape(items, units, minThreads int) (grid, block [3]uint32, err error) {
	if items > math.MaxInt32 {
		return grid, block, fmt.Errorf("executor: %d rows in one launch", items)
	}
	bx := min(256, roundUp(max(units, 1), 32))
	bx = max(bx, roundUp(minThreads, 32))
	if bx > 1024 {
		return grid, block, fmt.Errorf("executor: %d threads per block", bx)
	}
	gy := min((units+bx-1)/bx, 65535)
	return [3]uint32{uint32(items), uint32(max(gy, 1)), 1}, [3]uint32{uint32(bx), 1, 1}, nil
}

// commShape is the launch shape of the push and scatter kernels under the
// tuning knobs: rowShape's (at least K threads a block), with grid.x the
// chunks of chunkRows items (Config.ChunkRows, default 1). With sms = n >
// 0 (Config.SMs) the grid is at most n blocks in all (grid.x <= n, grid.y
// 1: each block copies whole rows), so the copies occupy at most n SMs;
// the blocks loop over the chunks.
func commShape(items, units, K, sms, chunkRows int) (grid, block [3]uint32, chunk int64, err error) {
	c := max(chunkRows, 1)
	blocks := (items + c - 1) / c
	if sms > 0 {
		blocks = min(blocks, sms)
	}
	grid, block, err = rowShape(blocks, units, K)
	if sms > 0 {
		grid[1] = 1
	}
	return grid, block, int64(c), err
}

// unitOf is the largest copy unit (16, 4 or 2 bytes) that divides the row
// bytes and every buffer's address.
func unitOf(rowBytes int, bufs ...*device.Buffer) int32 {
	for _, u := range []int{16, 4, 2} {
		if rowBytes%u != 0 {
			continue
		}
		ok := true
		for _, b := range bufs {
			if b != nil && b.DevicePtr()%uint64(u) != 0 {
				ok = false
			}
		}
		if ok {
			return int32(u)
		}
	}
	return 1
}

// kernelRows is how the permute kernels see rows of cols elements of dt:
// fp8 rows, only ever copied, go as bf16 rows of half the width (an fp8
// row's width is a multiple of 128).
func kernelRows(dt device.DType, cols int) (device.DType, int) {
	if dt == device.FP8E4M3 {
		return device.BF16, cols / 2
	}
	return dt, cols
}

// dtypeIndex is a kernel pair's index for dt: 0 BF16, 1 FP32.
func dtypeIndex(dt device.DType) int {
	if dt == device.FP32 {
		return 1
	}
	return 0
}

// flagOp is the operation a data call's arrive flags carry: the call's op
// with the dtype of its rows (bits 3-5) and whether weights travel (bit
// 6), so that ranks running the same call on rows of different dtypes, or
// with and without weights, fail it with ErrPeerMismatch instead of
// reading each other's rows wrongly (the host path compares the same in
// its exchange's signature). Never nvlink.OpRejected: ops fit in bits 0-2.
func flagOp(op datapath.Op, dt device.DType, weighted bool) uint32 {
	v := uint32(op) | uint32(dt)<<3
	if weighted {
		v |= 1 << 6
	}
	return v
}

// oneLaunchThreads is the one-launch kernels' block size (their
// __launch_bounds__): 16 warps, each moving one row at a time.
const oneLaunchThreads = 512

// oneLaunchBlocks is the most blocks of a one-launch kernel: the GPU's
// sms multiprocessors shared among the sameGPU ranks of the domain on it
// (every rank's grid waits for its peers' and all must be resident at
// once: a block takes a whole SM's registers, kernels/onelaunch.cu's
// GOEP_ONE_LAUNCH_BOUNDS, so the grids together take at most one block
// an SM), at most knob (Config.SMs) when it is set, at least one.
func oneLaunchBlocks(sms, sameGPU, knob int) int {
	b := sms / max(sameGPU, 1)
	if knob > 0 {
		b = min(b, knob)
	}
	return max(b, 1)
}

// oneLaunchGrid is the grid of a one-launch call of entries sends and
// rows receives: a warp an item (16 a block), at most blocks blocks.
func oneLaunchGrid(blocks, entries, rows int) int {
	const warps = oneLaunchThreads / 32
	need := (max(entries, rows) + warps - 1) / warps
	return max(min(blocks, need), 1)
}

// oneLaunchSumChunks is how many items goep_ep_combine's sums cut a row
// of units units into (kernels/onelaunch.cu, sumChunk: 128 units an item,
// four a lane of the warp that sums it).
func oneLaunchSumChunks(units int) int { return (units + 127) / 128 }

// oneLaunchFits reports whether every count of items the one-launch
// kernels hand out stays below 2^31 - 2^16 (their work counters and item
// indices are 32-bit, which keeps the sums' registers from spilling, and
// a counter runs past the items by one last fetch a warp, far fewer than
// 2^16): the sums' (token, 128-unit chunk) items, at most maxTokens times
// hidden/128 chunks; dispatch's sends, a token's width entries each; and
// the receives' items, ranks times the receive capacity. A larger engine
// runs the kernel sequences instead.
func oneLaunchFits(maxTokens, hidden, width, ranks, recvCap int) bool {
	const limit = 1<<31 - 1<<16
	return int64(maxTokens)*int64((hidden+127)/128) < limit && int64(maxTokens)*int64(width) < limit &&
		int64(ranks)*int64(recvCap) < limit
}
