package permute

// The CUDA kernels (kernels/permute.cu, with kernels/arith.cuh: the fp32
// and bf16 arithmetic that executor/kernels/ep.cu shares) are built to PTX
// by go generate and embedded by the cuda build (cuda.go). This file is built everywhere so
// that go generate finds the directive with or without the cuda tag.

//go:generate sh kernels/gen.sh kernels/permute.cu kernels/permute.ptx
