// Package executor is goep's public API: an expert-parallel engine per rank
// that plans (Layout) and moves tokens (Dispatch, Combine), with the
// expert-major permutation fused in (DispatchPermute, UnpermuteCombine) and
// the backward calls that reuse the same plan.
//
// The semantics are those of DESIGN.md section 2, bit for bit: receive order
// by source rank then token; fixed fp32 summation orders; fused calls equal
// to unfused ones; every result identical from run to run.
//
// Every rank of the group runs the same sequence of collective calls.
// Calls enqueue work on the engine's stream and return; Synchronize (or
// device.Download of an output) waits and reports the queued work's errors.
//
//	groups := comm.NewLocal(4)              // or a TCP / MPI group
//	backend := device.NewHost()             // shared by the ranks of a process
//	// on each rank r, in its own goroutine:
//	e, err := executor.New(ctx, groups[r], backend, executor.Config{
//		NumExperts: 64, TopK: 8, Hidden: 2048, MaxTokensPerRank: 512,
//	})
//	defer e.Close()
//	h, err := e.Layout(ctx, executor.LayoutInput{TopkIdx: idx}) // [T, 8] int32
//	defer h.Close()
//	d, err := e.DispatchPermute(ctx, h, executor.DispatchInput{X: x, TopkWeights: w})
//	// ... run the experts on d.X (expert-major, h's TokensPerExpert) into y ...
//	out, err := e.UnpermuteCombine(ctx, h, executor.UnpermuteInput{Y: y, RecvWeights: d.RecvWeights})
//	err = e.Synchronize(ctx)
//
// Inside, New picks one data path: the host backend's (internal/host) or
// the GPU's (internal/gpu, tag cuda), behind one small interface
// (internal/datapath); with several NVLink domains both reach the other
// domains through the rail (internal/rail). The layout itself is a pure
// function of every rank's routing and the Config (internal/plan), kept
// apart from the code that moves bytes.
package executor
