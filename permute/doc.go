// Package permute holds the row operations of goep's data path: gathering
// rows, permuting received rows into expert-major order, unpermuting them
// with optional weights, and the fixed-order fp32 sums of combine.
//
// Each function's doc comment is its reference loop; the host
// implementations here are those loops (with typed views of the bytes for
// speed), and the CUDA kernels are tested against them bit for bit. On
// amd64 with AVX2 (detected at run time) and on arm64 (NEON) the hot row
// loops — Accumulate, Store, Scale, SumRows and SumGroups — run in
// assembly (rows_amd64.s and sum_amd64.s, rows_arm64.s and sum_arm64.s),
// tested bit for bit against the same reference loops (accumulateGo,
// storeGo, scaleGo, sumRowsGo, sumGroupsGo), which remain the
// implementation everywhere else.
//
// Arithmetic follows DESIGN.md section 2 exactly: a weighted term is
// rounded to fp32 before it is added (no fused multiply-add: every product
// goes through an explicit float32 conversion), sums start from their first
// term and run in the fixed order given, and the result is rounded to the
// output dtype once.
package permute
