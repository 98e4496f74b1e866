// Package view reads a byte slice as a slice of another element type, in
// place: the host backend's device memory (mmap'd, never the Go heap) and
// the rail's regions are bytes, and the code that sums, permutes or
// indexes them wants float32, int32 or bf16 elements. Each view shares the
// bytes' memory (no copy); a trailing partial element is left out. The
// bytes must be aligned to the element size, which every device buffer
// and region is.
package view

import "unsafe"

// Float32s views b as float32 values.
func Float32s(b []byte) []float32 { return as[float32](b) }

// Int32s views b as int32 values.
func Int32s(b []byte) []int32 { return as[int32](b) }

// Uint16s views b as uint16 values (bf16 elements).
func Uint16s(b []byte) []uint16 { return as[uint16](b) }

func as[T float32 | int32 | uint16](b []byte) []T {
	var zero T
	n := len(b) / int(unsafe.Sizeof(zero))
	if n == 0 {
		return nil
	}
	return unsafe.Slice((*T)(unsafe.Pointer(&b[0])), n)
}

// Bytes views v's elements as bytes (in the host's byte order), for bulk
// copies of a Go slice into or out of byte memory at any alignment.
func Bytes[T float32 | int32 | uint16](v []T) []byte {
	if len(v) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&v[0])), len(v)*int(unsafe.Sizeof(v[0])))
}
