// Package reference is a naive, obviously correct model of goep's semantics
// (DESIGN.md section 2), written straight from the text, on plain Go slices.
//
// It is what the engine is tested against: every function here is a direct
// loop over the definition, with no buffers, no plans and no parallelism, so
// that reading it against the design is enough to trust it. It is slow and
// meant for tests only.
//
// Data layout: a tensor of n rows by Hidden elements of DType is a []byte of
// n*Hidden*DType.Size() little-endian bytes, row-major, as on the device.
// Index tables ([rows, TopK]) are []int32 and weight tables []float32, both
// row-major. Per-rank data is indexed by rank: x[r] is rank r's tensor.
//
// A few calls have a form that takes or gives one row at a time (RecvRow,
// Dests, PermutedSlots, UnpermuteRow, CombineRow), for callers whose
// tensors are too large to hold for every rank at once (internal/bench
// checks one rank's outputs of a full-size case, generating the inputs'
// rows as it goes). Layout, Permute, Unpermute and Combine run their row
// forms over every row, so the two forms cannot disagree.
//
// Usage:
//
//	w := &reference.World{NumRanks: 4, NumExperts: 8, TopK: 2, Hidden: 2,
//		PadMultiple: 1, DType: device.BF16, TopkIdx: idx, X: x}
//	if err := w.Validate(); err != nil { ... }
//	lay := w.Layout(d)           // rank d's tables
//	recvX := w.Dispatch(d)       // rank d's received rows
//	out := w.Combine(z)          // out[s]: source rank s's combined rows
package reference
