// Package gpu is the data path of the CUDA backend (build tag cuda; without
// it the package holds only its launch-shape arithmetic and go:generate
// directives). Every data call is GPU work in stream
// order on the NVLink domain's windows, which every rank maps from its
// peers (nvlink.MapGPU), synchronized by the domain's flag protocol
// (nvlink.GPUFlags): Begin, the pushes into the peers' windows, Arrive,
// the reads of this rank's own windows, Finish. The layout runs on the
// GPU in one domain (layout.go, the kernels of internal/gpulayout), else
// on the host through the control plane (package host's Control), whose
// rail (package rail) also carries what crosses domains: the crossing
// (flat, one domain; tiered, several) is chosen once, in New.
//
// Kernels are CUDA C++ in kernels/, built to PTX by go generate
// (internal/ptxgen) and embedded.
package gpu
