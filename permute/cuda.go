//go:build cuda && cgo

package permute

import (
	_ "embed"
	"errors"
	"fmt"
	"math"

	"github.com/goep/goep/device"
)

// permutePTX is kernels/permute.ptx, built from kernels/permute.cu by go
// generate (cuda_gen.go).
//
//go:embed kernels/permute.ptx
var permutePTX []byte

// CUDAKernels are the row operations of this package on a CUDA backend:
// the kernels of kernels/permute.cu, loaded once per backend. Every method
// enqueues work on a stream of that backend and returns; each matches, bit
// for bit, the host function named in its doc comment (whose doc comment is
// the reference loop), NaN payloads included. Counts and capacities reach
// the kernels by value; every pointer they receive is a device buffer
// (DESIGN.md invariant 1). Sizes are checked on the host before anything is
// enqueued, so no kernel writes outside its buffers. The launches hold
// the buffers (device.CUDAStream.Launch) until the work has completed.
type CUDAKernels struct {
	mod       *device.Module
	permute   [2]*device.Kernel // BF16, FP32
	unpermute [2]*device.Kernel
	// unpermuteScatter is unpermute storing each row at its own target
	// (UnpermuteScatter).
	unpermuteScatter [2]*device.Kernel
	zeroRows         *device.Kernel
	zeroDropped      *device.Kernel
	markRows         *device.Kernel
	zeroMarked       *device.Kernel // goep_zero_unmarked
	// staged is goep_permute_staged, Permute with the rows staged in
	// shared memory (stagedPlan chooses it); stagedShared is the
	// dynamic shared memory a block of it may use and stagedBlocks its
	// grid, stagedBlocksPerSM blocks an SM (both 0 where the GPU cannot
	// run it).
	staged                     *device.Kernel
	stagedShared, stagedBlocks int
	// dnan is the default NaN of this CPU's float arithmetic (the result
	// of inf - inf), which the host loops produce and the kernels copy.
	dnan uint32
	// permuteCfg and unpermuteCfg are the launch configurations of Permute
	// and Unpermute (defaultPermute, defaultUnpermute; BenchmarkCUDA
	// compares others). They change no result.
	permuteCfg, unpermuteCfg launchCfg
}

// launchCfg is the launch configuration of a row kernel: blocks of at most
// block threads, each thread covering about units units of its row (the
// grid covers every unit whatever the values), and for permute the cache
// hints of the kernel (bit 0: streaming loads of x, ld.global.cs, else
// ld.global.nc; bit 1: streaming stores of px, st.global.cs).
type launchCfg struct {
	block int
	units int
	hints int32
	// unitsSmallTopK, if not 0, replaces units for topk <= 4 (unpermute).
	unitsSmallTopK int
	// staged chooses Permute's kernel: stagedAuto (stagedPlan's rule),
	// stagedOff (goep_permute_bf16 and _fp32 always) or stagedOn
	// (goep_permute_staged wherever the call allows it). stagedRows, if
	// not 0, caps the rows a block of it stages a round (tests: several
	// rounds from few rows).
	staged     int
	stagedRows int
}

// The choices of launchCfg.staged.
const (
	stagedAuto = iota
	stagedOff
	stagedOn
)

// goep_permute_staged's shape and when Permute takes it: blocks of
// stagedThreads threads, stagedBlocksPerSM of them an SM (its
// __launch_bounds__), for calls with 16-byte units, top-k of at least
// stagedMinTopK (and as many permuted rows a row) and at least
// stagedMinRowsPerSM rows an SM (stagedPlan): the calls where it measured
// faster than goep_permute_bf16 and goep_permute_fp32, many rows at top-8
// with their slots in use. It loses at a few hundred rows, gains nothing
// at top-4 or less, nor for a rank's permute after a dispatch, whose top-8
// slots are mostly empty (docs/results/2026-12-04-h200-permute-staged.md).
//
// stagedSlack is shared memory past the last key, never used: the GPU's
// compiler (the driver's, from the PTX) may merge the rank loop's last
// scalar loads of keys into one wider load that reaches past the last
// key (compute-sanitizer memcheck reports an 8-byte read of the last key
// and the 4 bytes after the allocation without the slack).
const (
	stagedThreads      = 1024
	stagedBlocksPerSM  = 2
	stagedMinTopK      = 8
	stagedMinRowsPerSM = 8
	stagedSlack        = 16
)

// Permute: a thread loads 4 units (16 bytes each) of its row before it
// stores them to the row's K positions (64 bytes in flight per thread);
// 224 threads cover a 7168-element bf16 row in one block. Streaming loads
// (x is read once), plain stores.
var defaultPermute = launchCfg{block: 256, units: 4, hints: 1}

// Unpermute: a thread reads the row's positions and weights once and sums
// 2 units, each with its (up to 8) slot loads in flight together; for
// topk <= 4, 8 units, unpermuteGroup(topk) of them loaded together (one
// read of the positions and weights then serves more units, which
// measured faster at small top-k: docs/results/2026-12-03-h200-permute-topk.md);
// blocks of at most 256 threads (the kernels' __launch_bounds__,
// maxUnpermuteBlock).
var defaultUnpermute = launchCfg{block: 256, units: 2, unitsSmallTopK: 8}

// maxUnpermuteBlock is maxUnpermuteBlock of kernels/permute.cu.
const maxUnpermuteBlock = 256

// unpermuteGroup is the number of units an unpermute thread sums at once
// for topk slots (M of kernels/permute.cu's unpermute_units): 8, 4, 2 or
// 1 for topk 1, 2, 3-4 or more, so that a thread keeps about 8 loads in
// flight whatever topk. Unpermute gives each thread at least that many
// units. (Summing a thread's units one after the other leaves a top-2 or
// top-1 unpermute one or two loads in flight a thread, too few to hide
// memory latency: docs/results/2026-12-03-h200-permute-topk.md.)
func unpermuteGroup(topk int) int {
	switch {
	case topk <= 1:
		return 8
	case topk == 2:
		return 4
	case topk <= 4:
		return 2
	}
	return 1
}

// DeviceMap is Map with the positions in device memory: slot k of received
// row i goes to permuted row Pos[i*TopK+k] (-1: none); rows at or past
// RowCap and positions at or past PermCap are dropped.
type DeviceMap struct {
	Rows    int            // valid received rows
	TopK    int            // slots per row
	Pos     *device.Buffer // int32 [slots], slots >= min(Rows, RowCap)*TopK
	RowCap  int            // received-row capacity
	PermCap int            // permuted-row capacity
}

// rows is the number of received rows the kernels read.
func (m DeviceMap) rows() int { return max(0, min(m.Rows, m.RowCap)) }

// LoadCUDAKernels loads the kernels on b (the backend compiles them once
// and keeps them loaded until its own Close: device.CUDA.LoadModule).
func LoadCUDAKernels(b *device.CUDA) (*CUDAKernels, error) {
	mod, err := b.LoadModule(permutePTX)
	if err != nil {
		return nil, fmt.Errorf("permute: load CUDA kernels: %w", err)
	}
	k := &CUDAKernels{mod: mod, dnan: defaultNaN(float32(math.Inf(1)), float32(math.Inf(1))),
		permuteCfg: defaultPermute, unpermuteCfg: defaultUnpermute}
	names := []struct {
		dst  **device.Kernel
		name string
	}{
		{&k.permute[0], "goep_permute_bf16"},
		{&k.permute[1], "goep_permute_fp32"},
		{&k.unpermute[0], "goep_unpermute_bf16"},
		{&k.unpermute[1], "goep_unpermute_fp32"},
		{&k.unpermuteScatter[0], "goep_unpermute_scatter_bf16"},
		{&k.unpermuteScatter[1], "goep_unpermute_scatter_fp32"},
		{&k.zeroRows, "goep_zero_rows"},
		{&k.zeroDropped, "goep_zero_dropped"},
		{&k.markRows, "goep_mark_rows"},
		{&k.zeroMarked, "goep_zero_unmarked"},
		{&k.staged, "goep_permute_staged"},
	}
	for _, n := range names {
		if *n.dst, err = mod.Kernel(n.name); err != nil {
			return nil, errors.Join(fmt.Errorf("permute: load CUDA kernels: %w", err), mod.Close())
		}
	}
	// goep_permute_staged: stagedBlocksPerSM blocks an SM, each with its
	// share of the SM's shared memory less the driver's reservation; not
	// on a GPU whose SMs cannot hold that many blocks of stagedThreads
	// (1536 threads an SM: the blocks would run in two waves, and the
	// rule, measured where both fit, would choose the slower kernel).
	lim := b.Driver().Limits()
	shared := min(lim.SharedPerBlockOptin, lim.SharedPerSM/stagedBlocksPerSM-lim.ReservedSharedPerBlock)
	if lim.SMs > 0 && shared > 0 && lim.ThreadsPerSM >= stagedBlocksPerSM*stagedThreads {
		if err := k.staged.SetMaxDynamicSharedMemory(shared); err != nil {
			return nil, errors.Join(fmt.Errorf("permute: load CUDA kernels: %w", err), mod.Close())
		}
		k.stagedShared, k.stagedBlocks = shared, stagedBlocksPerSM*lim.SMs
	}
	return k, nil
}

// Close releases the kernels: later launches of them are refused; work
// already queued runs.
func (k *CUDAKernels) Close() error { return k.mod.Close() }

// DefaultNaN is the bits of this CPU's default NaN (inf - inf), which the
// host loops produce for a NaN made by an operation and every CUDA kernel
// that must match them bit for bit takes as an argument.
func DefaultNaN() uint32 { return defaultNaN(float32(math.Inf(1)), float32(math.Inf(1))) }

// defaultNaN returns the bits of a - b computed at run time (inf - inf:
// the CPU's default NaN, 0xffc00000 on amd64, 0x7fc00000 on arm64).
//
//go:noinline
func defaultNaN(a, b float32) uint32 { return math.Float32bits(a - b) }

// dtypeIndex is 0 for BF16, 1 for FP32.
func dtypeIndex(op string, dt device.DType) (int, error) {
	switch dt {
	case device.BF16:
		return 0, nil
	case device.FP32:
		return 1, nil
	}
	return 0, fmt.Errorf("permute: CUDA %s: dtype %v (want bf16 or fp32)", op, dt)
}

// checkRowOp checks the dtype, row size and map of a row operation and
// returns the dtype's kernel index, the row bytes and the rows read.
func checkRowOp(op string, dt device.DType, hidden int, m DeviceMap) (di, rowBytes, rows int, err error) {
	di, err = dtypeIndex(op, dt)
	if err != nil {
		return 0, 0, 0, err
	}
	if err := errors.Join(checkHidden(op, hidden), checkMap(op, m)); err != nil {
		return 0, 0, 0, err
	}
	return di, hidden * dt.Size(), m.rows(), nil
}

// need checks that b (nil allowed when !required) holds at least n bytes.
func need(op, what string, b *device.Buffer, n int, required bool) error {
	if b == nil {
		if required && n > 0 {
			return fmt.Errorf("permute: CUDA %s: %s is nil", op, what)
		}
		return nil
	}
	if b.Size() < n {
		return fmt.Errorf("permute: CUDA %s: %s has %d bytes, want at least %d", op, what, b.Size(), n)
	}
	return nil
}

// aligned16 reports whether rows of rowBytes in these buffers can move in
// 16-byte units.
func aligned16(rowBytes int, bufs ...*device.Buffer) bool {
	if rowBytes%16 != 0 {
		return false
	}
	for _, b := range bufs {
		if b.DevicePtr()%16 != 0 {
			return false
		}
	}
	return true
}

// unitFor is the zeroing unit of zero_rows / zero_dropped: 16 bytes when
// the rows allow it, else 2 (even rows), else 1.
func unitFor(rowBytes int, b *device.Buffer) int32 {
	switch {
	case aligned16(rowBytes, b):
		return 16
	case rowBytes%2 == 0 && b.DevicePtr()%2 == 0:
		return 2
	}
	return 1
}

// maxBlock is the block size of every launch; blocks are narrower for
// short rows.
const maxBlock = 128

// shape is the launch shape for items blocks rows of units units each.
func shape(op string, items, units int) (grid, block [3]uint32, err error) {
	return rowShape(op, items, units, launchCfg{block: maxBlock, units: 1})
}

// rowShape is the launch shape for items rows of units units each under
// cfg: grid (items, gy), gy blocks per row of at most cfg.block threads
// (a multiple of 32), about cfg.units units per thread, the threads of a
// row spread evenly: gy = ceil(units / (block*perThread)), threads =
// ceil(units / (gy*perThread)) rounded up to 32. A 7168-element bf16 row
// (896 units of 16 bytes) with block 256 and 4 units per thread is one
// block of 224 threads; with 2 units per thread two.
func rowShape(op string, items, units int, cfg launchCfg) (grid, block [3]uint32, err error) {
	per := max(1, cfg.units)
	maxThreads := max(32, cfg.block/32*32)
	gy := max(1, (units+maxThreads*per-1)/(maxThreads*per))
	threads := min(maxThreads, max(32, ((units+gy*per-1)/(gy*per)+31)/32*32))
	if items > math.MaxInt32 || gy > 65535 {
		return grid, block, fmt.Errorf("permute: CUDA %s: %d rows of %d units is too large a grid", op, items, units)
	}
	return [3]uint32{uint32(items), uint32(gy), 1}, [3]uint32{uint32(threads), 1, 1}, nil
}

func checkMap(op string, m DeviceMap) error {
	if m.Rows < 0 || m.RowCap < 0 || m.PermCap < 0 || m.TopK < 0 {
		return fmt.Errorf("permute: CUDA %s: negative count in map %+v", op, m)
	}
	if m.rows() > 0 && m.TopK == 0 {
		return fmt.Errorf("permute: CUDA %s: TopK 0 with %d rows", op, m.rows())
	}
	return need(op, "Pos", m.Pos, 4*m.rows()*m.TopK, true)
}

func checkHidden(op string, hidden int) error {
	if hidden < 0 || hidden > math.MaxInt32 {
		return fmt.Errorf("permute: CUDA %s: hidden %d out of range", op, hidden)
	}
	return nil
}

// Permute enqueues Permute on s: for i < min(Rows, RowCap), k < TopK with
// p = Pos[i*TopK+k] in [0, PermCap): px[p] = x[i] (rows of hidden dt
// elements) and, if pw is not nil, pw[p] = w[i*TopK+k] (fp32). px holds
// PermCap rows, x min(Rows, RowCap). Rows the loop does not write
// (padding) are left alone: zero them with ZeroPadding.
//
// Many rows at top-8 or more go to goep_permute_staged (stagedPlan says
// when), the others to goep_permute_bf16 or _fp32; both write the same
// bytes (where two slots share a position, which the layout never
// produces, either may win, as on the host only the last does).
func (k *CUDAKernels) Permute(s *device.CUDAStream, dt device.DType, hidden int, px, pw, x, w *device.Buffer, m DeviceMap) error {
	const op = "permute"
	di, rb, rows, err := checkRowOp(op, dt, hidden, m)
	if err != nil {
		return err
	}
	if err := errors.Join(
		need(op, "px", px, m.PermCap*rb, true),
		need(op, "x", x, rows*rb, true),
		need(op, "pw", pw, 4*m.PermCap, false),
	); err != nil {
		return err
	}
	if pw != nil {
		if err := need(op, "w", w, 4*rows*m.TopK, true); err != nil {
			return err
		}
	}
	if rows == 0 {
		return nil
	}
	vec := aligned16(rb, px, x)
	units := hidden
	if vec {
		units = rb / 16
	}
	cfg := k.permuteCfg
	if grid, g, shared, ok := k.stagedPlan(vec, rows, m.TopK, m.PermCap, rb, cfg); ok {
		return s.Launch(k.staged, [3]uint32{uint32(grid), 1, 1}, [3]uint32{stagedThreads, 1, 1}, uint32(shared),
			px, pw, x, w, m.Pos, int64(rows), int32(m.TopK), int64(m.PermCap), int32(units), int32(g))
	}
	cfg.block = min(cfg.block, 1024) // the kernels' __launch_bounds__
	switch cfg.units {
	case 1, 2, 4: // the kernels' instances
	default:
		cfg.units = 1
	}
	grid, block, err := rowShape(op, rows, units, cfg)
	if err != nil {
		return err
	}
	return s.Launch(k.permute[di], grid, block, 0,
		px, pw, x, w, m.Pos, int64(rows), int32(m.TopK), int64(m.PermCap), int64(hidden), b32(vec),
		int32(cfg.units), cfg.hints)
}

// stagedPlan decides whether Permute takes goep_permute_staged for rows
// rows of rowBytes at topk into permCap permuted rows under cfg (vec: the
// rows move in 16-byte units), and if so returns its grid, the rows g a
// block stages a round and the block's dynamic shared memory. The rounds
// are as few as the shared memory allows, and g as even as they allow:
// ceil(rows / (grid x rounds)).
//
// The rule (stagedAuto) asks for top-k of at least stagedMinTopK, at
// least stagedMinRowsPerSM rows an SM and at least stagedMinTopK
// permuted rows a row: permCap bounds the rows the call writes, and a
// top-8 permute whose slots are mostly empty (a rank's permute after a
// dispatch: about 2 of a token's 8 slots are its own) writes like a
// top-2 one, where the staged kernel does not gain.
func (k *CUDAKernels) stagedPlan(vec bool, rows, topk, permCap, rowBytes int, cfg launchCfg) (grid, g, shared int, ok bool) {
	if !vec || cfg.staged == stagedOff || k.stagedBlocks == 0 || rows == 0 || topk == 0 {
		return 0, 0, 0, false
	}
	if cfg.staged == stagedAuto && (topk < stagedMinTopK || permCap/rows < stagedMinTopK ||
		rows < stagedMinRowsPerSM*k.stagedBlocks/stagedBlocksPerSM) {
		return 0, 0, 0, false
	}
	// A staged row: its bytes, and per slot an int2 (position, row) and an
	// int32 key; a thread per slot ranks it. Plus stagedSlack bytes.
	per := rowBytes + 12*topk
	gmax := min((k.stagedShared-stagedSlack)/per, stagedThreads/topk)
	if cfg.stagedRows > 0 {
		gmax = min(gmax, cfg.stagedRows)
	}
	if gmax < 1 {
		return 0, 0, 0, false
	}
	grid = min(k.stagedBlocks, rows)
	rounds := (rows + grid*gmax - 1) / (grid * gmax)
	g = (rows + grid*rounds - 1) / (grid * rounds)
	return grid, g, g*per + stagedSlack, true
}

// Unpermute enqueues Unpermute on s: for every row i < min(Rows, RowCap),
// out[i] = UnpermuteRow of y (rows of hidden dt elements; PermCap rows)
// over the slots Pos[i*TopK:(i+1)*TopK], weighted by w[i*TopK:] (fp32) if
// w is not nil: the terms (mul(w, y[p]), rounded to fp32, or y[p]) summed
// in fp32 in slot order from the first, rounded to dt once, zero for a row
// without terms; then the rows past them up to RowCap are zeroed. out
// holds RowCap rows.
func (k *CUDAKernels) Unpermute(s *device.CUDAStream, dt device.DType, hidden int, out, y, w *device.Buffer, m DeviceMap) error {
	const op = "unpermute"
	di, rb, rows, err := checkRowOp(op, dt, hidden, m)
	if err != nil {
		return err
	}
	if err := errors.Join(
		need(op, "out", out, m.RowCap*rb, true),
		need(op, "y", y, m.PermCap*rb, true),
		need(op, "w", w, 4*rows*m.TopK, false),
	); err != nil {
		return err
	}
	if rows > 0 {
		vec := aligned16(rb, out, y)
		grid, block, err := k.unpermuteShape(op, dt, hidden, rows, m.TopK, vec)
		if err != nil {
			return err
		}
		if err := s.Launch(k.unpermute[di], grid, block, 0,
			out, y, w, m.Pos, int64(rows), int32(m.TopK), int64(m.PermCap), int64(hidden), b32(vec), k.dnan); err != nil {
			return err
		}
	}
	return k.ZeroRows(s, out, rb, nil, rows, m.RowCap)
}

// unpermuteShape is the launch shape of Unpermute and UnpermuteScatter
// over rows rows of hidden elements (16-byte units when vec).
func (k *CUDAKernels) unpermuteShape(op string, dt device.DType, hidden, rows, topk int, vec bool) (grid, block [3]uint32, err error) {
	units := hidden
	if vec {
		units = hidden * dt.Size() / 16
	}
	cfg := k.unpermuteCfg
	cfg.block = min(cfg.block, maxUnpermuteBlock)
	if topk <= 4 && cfg.unitsSmallTopK > 0 {
		cfg.units = cfg.unitsSmallTopK
	}
	cfg.units = max(cfg.units, unpermuteGroup(topk))
	return rowShape(op, rows, units, cfg)
}

// Targets says where UnpermuteScatter stores its rows: row i at row Row[i]
// (rows of the call's row size) of the buffer whose device address is
// Bases[Rank[i]], and nowhere when Row[i] < 0. The tables are device
// memory (uint64 addresses; int32 ranks and rows, one per row read) that
// the caller fills, as the executor's layout does with the peers' mapped
// combine windows and each received row's entry there; the kernel trusts
// them, so every address, rank and row must be valid, and no two rows may
// share a target row. The launch holds the three tables but not the
// memory their addresses point to: the caller keeps that allocated until
// the work (or a graph that captured it) is done.
type Targets struct {
	Bases *device.Buffer // uint64 [targets]
	Rank  *device.Buffer // int32 [rows]
	Row   *device.Buffer // int32 [rows]
	// Aligned says every base is 16-byte aligned (16-byte accesses are
	// used when the row size is a multiple of 16 and y is aligned too).
	Aligned bool
}

// UnpermuteScatter is Unpermute with each output row i stored at its
// target (Targets) instead of row i of an output: the bytes stored are
// Unpermute's for that row, bit for bit. Rows past min(Rows, RowCap) are
// not stored (Unpermute zeroes them). It fuses an unpermute with the
// scatter of its rows that follows, saving a pass over them.
func (k *CUDAKernels) UnpermuteScatter(s *device.CUDAStream, dt device.DType, hidden int, to Targets, y, w *device.Buffer, m DeviceMap) error {
	const op = "unpermute scatter"
	di, rb, rows, err := checkRowOp(op, dt, hidden, m)
	if err != nil {
		return err
	}
	if err := errors.Join(
		need(op, "y", y, m.PermCap*rb, true),
		need(op, "w", w, 4*rows*m.TopK, false),
		need(op, "target bases", to.Bases, 8, rows > 0),
		need(op, "target ranks", to.Rank, 4*rows, true),
		need(op, "target rows", to.Row, 4*rows, true),
	); err != nil {
		return err
	}
	if rows == 0 {
		return nil
	}
	vec := to.Aligned && aligned16(rb, y)
	grid, block, err := k.unpermuteShape(op, dt, hidden, rows, m.TopK, vec)
	if err != nil {
		return err
	}
	return s.Launch(k.unpermuteScatter[di], grid, block, 0, to.Bases, to.Rank, to.Row,
		y, w, m.Pos, int64(rows), int32(m.TopK), int64(m.PermCap), int64(hidden), b32(vec), k.dnan)
}

// ZeroRows enqueues ZeroRows on s: rows [lo, hi) of b (rowBytes each) are
// zeroed, and w[lo:hi] (fp32) if w is not nil. b holds at least hi rows.
func (k *CUDAKernels) ZeroRows(s *device.CUDAStream, b *device.Buffer, rowBytes int, w *device.Buffer, lo, hi int) error {
	const op = "zero rows"
	if hi <= lo {
		return nil
	}
	if lo < 0 || rowBytes < 0 {
		return fmt.Errorf("permute: CUDA %s: rows [%d, %d) of %d bytes", op, lo, hi, rowBytes)
	}
	if err := errors.Join(need(op, "rows", b, hi*rowBytes, true), need(op, "weights", w, 4*hi, false)); err != nil {
		return err
	}
	unit := unitFor(rowBytes, b)
	grid, block, err := shape(op, hi-lo, rowBytes/int(unit))
	if err != nil {
		return err
	}
	return s.Launch(k.zeroRows, grid, block, 0, b, w, int64(rowBytes), int64(lo), int64(hi), unit)
}

// ZeroPadding enqueues ZeroPadding on s: for each expert l the rows
// [offsets[l]+counts[l], offsets[l+1]), then the rows from offsets[L] up
// to capacity, all clipped to capacity, of px (rowBytes each) and pw (if
// not nil) are zeroed. offsets ([L+1]) and counts ([L]) are host values:
// each range becomes one launch with its bounds by value.
func (k *CUDAKernels) ZeroPadding(s *device.CUDAStream, px *device.Buffer, rowBytes int, pw *device.Buffer, offsets, counts []int32, capacity int) error {
	if len(offsets) != len(counts)+1 {
		return fmt.Errorf("permute: CUDA zero padding: %d offsets for %d counts, want %d", len(offsets), len(counts), len(counts)+1)
	}
	for l := range counts {
		lo := min(int(offsets[l])+int(counts[l]), capacity)
		if err := k.ZeroRows(s, px, rowBytes, pw, lo, min(int(offsets[l+1]), capacity)); err != nil {
			return err
		}
	}
	return k.ZeroRows(s, px, rowBytes, pw, min(int(offsets[len(counts)]), capacity), capacity)
}

// ZeroDropped enqueues ZeroDropped on s: for every slot s' of Pos at or
// past Rows*TopK (all of Pos's int32s, slots = Pos.Size()/4)
// with p = Pos[s'] in [0, PermCap), row p of px (rowBytes each) and pw[p]
// (if pw is not nil) are zeroed. px holds PermCap rows.
func (k *CUDAKernels) ZeroDropped(s *device.CUDAStream, px *device.Buffer, rowBytes int, pw *device.Buffer, m DeviceMap) error {
	const op = "zero dropped"
	if err := checkMap(op, m); err != nil {
		return err
	}
	if err := errors.Join(need(op, "px", px, m.PermCap*rowBytes, true), need(op, "pw", pw, 4*m.PermCap, false)); err != nil {
		return err
	}
	from, to := m.Rows*m.TopK, m.Pos.Size()/4
	if to <= from || m.PermCap == 0 {
		return nil
	}
	unit := unitFor(rowBytes, px)
	grid, block, err := shape(op, to-from, rowBytes/int(unit))
	if err != nil {
		return err
	}
	return s.Launch(k.zeroDropped, grid, block, 0, px, pw, int64(rowBytes), m.Pos, int64(from), int64(to), int64(m.PermCap), unit)
}

// ZeroUnwritten enqueues on s the zeroing of every row of px (PermCap
// rows of rowBytes) and pw[p] (if pw is not nil) that Permute under m
// does not write: the rows p < PermCap that no slot of the first
// min(Rows, RowCap) rows maps to. Followed or preceded by Permute, px and
// pw are then what ZeroPadding, Permute and ZeroDropped give on the host
// for Rows <= RowCap (as the executor's maps have; beyond, the positions
// of rows [RowCap, Rows), which ZeroDropped leaves, are zeroed too),
// from the device positions alone: no count or offset comes from the host
// (capacity mode, graph capture), and only the unwritten rows are stored,
// where zeroing the whole capacity first stores every written row twice.
// It marks the written rows in a byte a row of marks (goep_mark_rows;
// the caller's scratch of at least PermCap bytes, kept so that the call
// allocates nothing), then zeroes the unmarked rows (goep_zero_unmarked).
func (k *CUDAKernels) ZeroUnwritten(s *device.CUDAStream, px *device.Buffer, rowBytes int, pw *device.Buffer, m DeviceMap, marks *device.Buffer) error {
	const op = "zero unwritten"
	if err := checkMap(op, m); err != nil {
		return err
	}
	if rowBytes < 0 || px == nil {
		return fmt.Errorf("permute: CUDA %s: rows of %d bytes (px %v)", op, rowBytes, px != nil)
	}
	if err := errors.Join(need(op, "px", px, m.PermCap*rowBytes, true), need(op, "pw", pw, 4*m.PermCap, false),
		need(op, "marks", marks, m.PermCap, true)); err != nil {
		return err
	}
	if m.PermCap == 0 || rowBytes == 0 && pw == nil {
		return nil
	}
	if err := s.Memset(marks, 0, m.PermCap, 0); err != nil {
		return err
	}
	if slots := m.rows() * m.TopK; slots > 0 {
		if err := s.Launch(k.markRows, [3]uint32{uint32((slots + 255) / 256), 1, 1}, [3]uint32{256, 1, 1}, 0,
			marks, m.Pos, int64(slots), int64(m.PermCap)); err != nil {
			return err
		}
	}
	// 8 warps a block, a warp a row; at most 8192 blocks, which stride
	// over larger capacities.
	const warps = 8
	blocks := min((m.PermCap+warps-1)/warps, 8192)
	return s.Launch(k.zeroMarked, [3]uint32{uint32(blocks), 1, 1}, [3]uint32{32 * warps, 1, 1}, 0,
		px, pw, int64(rowBytes), marks, int64(m.PermCap), unitFor(rowBytes, px))
}

func b32(v bool) int32 {
	if v {
		return 1
	}
	return 0
}
