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
// Router weights are applied in one place only: Unpermute and
// UnpermuteCombine multiply each expert's output by its weight when given
// RecvWeights. Dispatch and DispatchPermute carry TopkWeights to the
// experts' ranks (RecvWeights, and Weights per permuted row) without
// applying them, and Combine sums the rows it gets back unweighted.
//
// Tensors move in and out through package device: Engine.NewTensor
// allocates one on the engine's stream, device.Upload fills it with bytes
// from device.EncodeFloat32 (bf16, fp32, fp8) or device.EncodeInt32 (the
// routing), device.Download waits for the stream and copies an output's
// bytes out, and device.DecodeFloat32 turns them into float32 values.
// Inputs and outputs are closed by their owner (Tensor.Close, or an
// output struct's Close); the engine and its handles by Close.
//
//	groups := comm.NewLocal(4)              // or a TCP / MPI group
//	backend := device.NewHost()             // shared by the ranks of a process
//	// on each rank r, in its own goroutine:
//	e, err := executor.New(ctx, groups[r], backend, executor.Config{
//		NumExperts: 64, TopK: 8, Hidden: 2048, MaxTokensPerRank: 512,
//	})
//	defer e.Close()
//	idx, err := e.NewTensor(device.Int32, T, 8) // the routing, [T, 8] int32
//	err = device.Upload(ctx, idx, device.EncodeInt32(routing))
//	// ... x [T, 2048] and w [T, 8] fp32 the same way ...
//	h, err := e.Layout(ctx, executor.LayoutInput{TopkIdx: idx})
//	defer h.Close()
//	d, err := e.DispatchPermute(ctx, h, executor.DispatchInput{X: x, TopkWeights: w})
//	defer d.Close()
//	// ... run the experts on d.X (expert-major, h's TokensPerExpert) into y ...
//	out, err := e.UnpermuteCombine(ctx, h, executor.UnpermuteInput{Y: y, RecvWeights: d.RecvWeights})
//	defer out.Close()
//	err = e.Synchronize(ctx)
//	b, err := device.Download(ctx, out) // [T, 2048], y's dtype
//	vals := device.DecodeFloat32(out.DType(), b)
//
// Example_readme (README.md's program) runs this whole sequence on two
// in-process ranks.
//
// Inside, New picks one data path: the host backend's (internal/host) or
// the GPU's (internal/gpu, tag cuda), behind one small interface
// (internal/datapath); with several NVLink domains both reach the other
// domains through the rail (internal/rail). The layout itself is a pure
// function of every rank's routing and the Config (internal/plan), kept
// apart from the code that moves bytes.
package executor
