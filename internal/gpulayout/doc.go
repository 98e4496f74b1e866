// Package gpulayout is the host side of executor's layout kernels: their
// per-thread C code (layout.h, here so that the Go build tracks it;
// executor/internal/gpu/kernels/layout.cu includes it), their sizes (Dims, read from
// the header itself so that the host and the kernels cannot disagree) and
// an emulation that runs their per-thread code, plain C, on the host:
// EmulateLayout executes every thread of every launch one after another,
// in the launch sequence of the CUDA path, so that the plan's tests check
// the kernels' logic against ComputeLayout without a GPU.
//
// It needs cgo; without it the package is empty.
package gpulayout
