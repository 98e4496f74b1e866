package gpu

// The CUDA kernels of the GPU data path (kernels/ep.cu, with package
// permute's kernels/arith.cuh) and of the layout (kernels/layout.cu, with
// package gpulayout's layout.h, which its host emulation compiles too) and
// the one-launch kernels (kernels/onelaunch.cu, with package nvlink's
// kernels/flags.cuh, the flag protocol's device side, and permute's
// arith.cuh) are built to PTX by go generate and embedded by the cuda
// build. This file is
// built everywhere so that go generate finds the directives with or
// without the cuda tag.

//go:generate go run github.com/goep/goep/internal/ptxgen -I permute/kernels kernels/ep.cu kernels/ep.ptx
//go:generate go run github.com/goep/goep/internal/ptxgen -I internal/gpulayout kernels/layout.cu kernels/layout.ptx
//go:generate go run github.com/goep/goep/internal/ptxgen -I nvlink/kernels -I permute/kernels kernels/onelaunch.cu kernels/onelaunch.ptx
