//go:build !cgo

package plan

// gpuLayoutFits is gpulayout.go's without cgo, where the layout's
// dimensions (internal/gpulayout, C shared with the kernels) cannot be
// computed: false. Such a build has no CUDA path either (it needs cgo),
// so its sizing shows the host layout.
func gpuLayoutFits(p Params, R, T, rowCap int) bool { return false }

// HaveLayoutDims: gpulayout.go's; without cgo the layout's dimensions
// cannot be computed.
const HaveLayoutDims = false
