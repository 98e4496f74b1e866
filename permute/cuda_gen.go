package permute

// The CUDA kernels (kernels/permute.cu, with kernels/arith.cuh: the fp32
// and bf16 arithmetic that the GPU data path's kernels share) are built to
// PTX by go generate and embedded by the cuda build (cuda.go). This file
// is built everywhere so that go generate finds the directive with or
// without the cuda tag.

//go:generate go run github.com/goep/goep/internal/ptxgen kernels/permute.cu kernels/permute.ptx
