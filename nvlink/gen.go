package nvlink

// The kernels of the GPU flag protocol (kernels/flags.cu, with
// kernels/flags.cuh: the device side that data-path kernels include too)
// are built to PTX by go generate and embedded by the cuda build
// (gpuflags_cuda.go). This file is built everywhere so that go generate
// finds the directive with or without the cuda tag.

//go:generate go run github.com/goep/goep/internal/ptxgen kernels/flags.cu kernels/flags.ptx
