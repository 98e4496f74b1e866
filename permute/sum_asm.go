//go:build amd64 || arm64

package permute

import (
	"runtime"
	"unsafe"

	"github.com/goep/goep/device"
)

// The kernels (sum_amd64.s with AVX2, sum_arm64.s with NEON) sum n
// elements, n a multiple of 32, of nrows >= 1 rows whose addresses are in
// rows[0:nrows] (and weights in c[0:nrows]); their reference loop is
// SumRows's, with rounding to bf16 as device.Float32ToBF16.

//go:noescape
func sumBF16(dst *uint16, rows *unsafe.Pointer, nrows, n int)

//go:noescape
func sumScaledBF16(dst *uint16, rows *unsafe.Pointer, c *float32, nrows, n int)

//go:noescape
func sumF32(dst *float32, rows *unsafe.Pointer, nrows, n int)

// sumGroupsBF16 is SumGroups's loop for bf16 rows and weights c over n
// elements, n a multiple of 16, ngroups >= 1.
//
//go:noescape
func sumGroupsBF16(dst *uint16, rows *unsafe.Pointer, c *float32, ends *int, ngroups, n int)

//go:noescape
func sumScaledF32(dst *float32, rows *unsafe.Pointer, c *float32, nrows, n int)

// sumRowsAsm sums the largest multiple of 32 elements of the rows in
// assembly and returns how many it did.
func sumRowsAsm(dt device.DType, dst []byte, rows [][]byte, c []float32, n int) int {
	m := n &^ 31
	if m == 0 || len(rows) > maxSumRows || c != nil && anyNaN(c[:len(rows)]) {
		return 0
	}
	var ptrs [maxSumRows]unsafe.Pointer
	for i, r := range rows {
		_ = r[m*dt.Size()-1] // every row holds the elements summed
		ptrs[i] = unsafe.Pointer(&r[0])
	}
	switch {
	case dt == device.BF16 && c == nil:
		sumBF16((*uint16)(unsafe.Pointer(&dst[0])), &ptrs[0], len(rows), m)
	case dt == device.BF16:
		sumScaledBF16((*uint16)(unsafe.Pointer(&dst[0])), &ptrs[0], &c[:len(rows)][0], len(rows), m)
	case c == nil:
		sumF32((*float32)(unsafe.Pointer(&dst[0])), &ptrs[0], len(rows), m)
	default:
		sumScaledF32((*float32)(unsafe.Pointer(&dst[0])), &ptrs[0], &c[:len(rows)][0], len(rows), m)
	}
	runtime.KeepAlive(rows)
	return m
}

// sumGroupsAsm sums the largest multiple of 16 elements of SumGroups in
// assembly (bf16 rows, weighted) and returns how many it did.
func sumGroupsAsm(dt device.DType, dst []byte, rows [][]byte, c []float32, ends []int, n int) int {
	m := n &^ 15
	if m == 0 || dt != device.BF16 || c == nil || len(rows) > maxSumRows || len(ends) == 0 || anyNaN(c[:len(rows)]) {
		return 0
	}
	var ptrs [maxSumRows]unsafe.Pointer
	for i, r := range rows {
		_ = r[m*2-1] // every row holds the elements summed
		ptrs[i] = unsafe.Pointer(&r[0])
	}
	var cs *float32
	if len(rows) > 0 {
		cs = &c[:len(rows)][0]
	}
	_ = ends[len(ends)-1]
	sumGroupsBF16((*uint16)(unsafe.Pointer(&dst[0])), &ptrs[0], cs, &ends[0], len(ends), m)
	runtime.KeepAlive(rows)
	return m
}

// anyNaN reports whether a weight is NaN: such sums take the reference
// loop (see rows_asm.go).
func anyNaN(c []float32) bool {
	for _, w := range c {
		if w != w {
			return true
		}
	}
	return false
}
