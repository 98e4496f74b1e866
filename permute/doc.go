// Package permute holds the row operations of goep's data path: gathering
// rows, permuting received rows into expert-major order, unpermuting them
// with optional weights, and the fixed-order fp32 sums of combine.
//
// Each function's doc comment is its reference loop; the host
// implementations here are those loops (with typed views of the bytes for
// speed), and the CUDA kernels are tested against them bit for bit.
//
// Arithmetic follows DESIGN.md section 2 exactly: a weighted term is
// rounded to fp32 before it is added (no fused multiply-add: every product
// goes through an explicit float32 conversion), sums start from their first
// term and run in the fixed order given, and the result is rounded to the
// output dtype once.
package permute
