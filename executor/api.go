package executor

import (
	"errors"

	"github.com/goep/goep/comm"
	"github.com/goep/goep/device"
	"github.com/goep/goep/executor/internal/datapath"
	"github.com/goep/goep/executor/internal/plan"
	"github.com/goep/goep/nvlink"
)

// Sentinel errors. Errors returned by the engine wrap one of these where
// one applies; use errors.Is.
var (
	// ErrInvalidInput: a shape, dtype, index or size is wrong on this rank
	// or (wrapped in a *nvlink.PeerError) on another rank of the call.
	ErrInvalidInput = plan.ErrInvalidInput
	// ErrTimeout: a rank did not join a cross-rank step within the
	// deadline; the error names it. The engine is failed afterwards.
	ErrTimeout = comm.ErrTimeout
	// ErrPeerLost: a peer's process died or its connection broke; the
	// error names it. The engine is failed afterwards.
	ErrPeerLost = comm.ErrPeerLost
	// ErrPeerMismatch: ranks run different configs or different calls.
	ErrPeerMismatch = nvlink.ErrPeerMismatch
	// ErrCapacityExceeded: in capacity mode with OverflowError, a rank
	// received more rows than its capacity (see *CapacityError).
	ErrCapacityExceeded = plan.ErrCapacityExceeded
	// ErrUnsupported: the configuration needs a feature not built yet or
	// not compiled in; the message names it.
	ErrUnsupported = datapath.ErrUnsupported
	// ErrFailed: the engine failed earlier (timeout, lost peer) and fails
	// fast; Close still frees everything.
	ErrFailed = errors.New("executor: engine failed")
	// ErrClosed: the engine or handle was closed.
	ErrClosed = errors.New("executor: closed")
	// ErrConcurrentCall: a call of an engine (or of one of its handles)
	// came while another was in progress, from another goroutine; it was
	// refused and did nothing. The call in progress is not affected.
	ErrConcurrentCall = errors.New("executor: concurrent call")
)

// LayoutInput is one rank's routing.
type LayoutInput struct {
	// TopkIdx is [T_r, TopK] Int32 with values in [-1, NumExperts); -1 is
	// an empty slot; an expert repeated within a row is an error. T_r may
	// differ between ranks and may be 0; T_r <= MaxTokensPerRank.
	TopkIdx *device.Tensor
}

// DispatchInput is one rank's tokens.
type DispatchInput struct {
	// X is [T_r, Hidden], BF16, FP32 or FP8E4M3 (equal on all ranks). FP8
	// rows need Hidden to be a multiple of device.FP8ScaleChannels (128)
	// and come with XScales; dispatch moves their bytes unchanged.
	X *device.Tensor
	// XScales is [T_r, Hidden/128] FP32, the scales of an FP8E4M3 X (one
	// per 128 channels of a row); given exactly when X is FP8. They travel
	// with their rows, unchanged, and come out as RecvScales (Dispatch) or
	// permuted beside the rows as Scales (DispatchPermute).
	XScales *device.Tensor
	// TopkWeights is optional [T_r, TopK] FP32 router weights; when given
	// (on all ranks or on none) they travel with the rows, unapplied: they
	// come out as RecvWeights (and permuted as Weights), which Unpermute
	// or UnpermuteCombine apply.
	TopkWeights *device.Tensor
}

// DispatchOutput is what one rank receives.
type DispatchOutput struct {
	// RecvX is [RecvCount, Hidden] (capacity mode: [MaxRecvTokens, Hidden],
	// rows past the valid count zero), in receive order: by source rank,
	// then source token.
	RecvX *device.Tensor
	// RecvIdx is [rows, TopK] Int32: each received row's slots restricted
	// to this rank's experts (local expert id), else -1.
	RecvIdx *device.Tensor
	// RecvWeights is [rows, TopK] FP32, the weights of the slots in
	// RecvIdx, 0 elsewhere; nil when no TopkWeights were dispatched.
	RecvWeights *device.Tensor
	// RecvScales is [rows, Hidden/128] FP32, each received row's scales
	// (rows past the valid count zero); nil unless X was FP8.
	RecvScales *device.Tensor
}

// Close frees the outputs in stream order.
func (o DispatchOutput) Close() error {
	return closeAll(o.RecvX, o.RecvIdx, o.RecvWeights, o.RecvScales)
}

// PermuteInput is a rank's received rows.
type PermuteInput struct {
	RecvX       *device.Tensor // [rows, Hidden]
	RecvWeights *device.Tensor // optional [rows, TopK] FP32
	// RecvScales is [rows, Hidden/128] FP32, given exactly when RecvX is
	// FP8E4M3: the scales move with their rows.
	RecvScales *device.Tensor
}

// PermuteOutput is the expert-major layout.
type PermuteOutput struct {
	// X is [PermutedCount, Hidden] (capacity mode: [MaxPermutedTokens,
	// Hidden]): expert e's segment holds, in receive order, a copy of every
	// received row that chose e, then zero padding up to PadMultiple.
	X *device.Tensor
	// Weights is [rows] FP32: the weight of each (row, expert) copy, 0 on
	// padding; nil when no weights were given.
	Weights *device.Tensor
	// Scales is [rows, Hidden/128] FP32: the scales of each permuted row,
	// zero on padding; nil unless the rows are FP8.
	Scales *device.Tensor
}

// Close frees the outputs in stream order.
func (o PermuteOutput) Close() error { return closeAll(o.X, o.Weights, o.Scales) }

// UnpermuteInput is expert-major rows to fold back.
type UnpermuteInput struct {
	Y *device.Tensor // [PermutedCount or MaxPermutedTokens, Hidden]
	// RecvWeights, when given ([rows, TopK] FP32, the dispatch's
	// RecvWeights), weights each term: this is where router weights are
	// applied. Otherwise every weight is 1.
	RecvWeights *device.Tensor
}

// CombineInput is one rank's processed rows. Combine sums them back to
// their sources unweighted (apply weights first, or use UnpermuteCombine).
type CombineInput struct {
	Z *device.Tensor // [RecvCount or MaxRecvTokens, Hidden]
}

// DispatchPermuteOutput is the result of the fused DispatchPermute.
type DispatchPermuteOutput struct {
	X           *device.Tensor // as PermuteOutput.X
	Weights     *device.Tensor // as PermuteOutput.Weights
	RecvIdx     *device.Tensor // as DispatchOutput.RecvIdx
	RecvWeights *device.Tensor // as DispatchOutput.RecvWeights
	Scales      *device.Tensor // as PermuteOutput.Scales (FP8 X only)
}

// Close frees the outputs in stream order.
func (o DispatchPermuteOutput) Close() error {
	return closeAll(o.X, o.Weights, o.RecvIdx, o.RecvWeights, o.Scales)
}

// DispatchBackwardInput is the gradient of a dispatch's outputs.
type DispatchBackwardInput struct {
	GradRecvX       *device.Tensor // [rows, Hidden]
	GradRecvWeights *device.Tensor // optional [rows, TopK] FP32
}

// DispatchBackwardOutput is the gradient of a dispatch's inputs.
type DispatchBackwardOutput struct {
	GradX           *device.Tensor // [T_r, Hidden]
	GradTopkWeights *device.Tensor // [T_r, TopK] FP32, when GradRecvWeights was given
}

// Close frees the outputs in stream order.
func (o DispatchBackwardOutput) Close() error { return closeAll(o.GradX, o.GradTopkWeights) }

// UnpermuteBackwardInput is the gradient of an unpermute's output and the
// forward's inputs.
type UnpermuteBackwardInput struct {
	GradOut     *device.Tensor // [rows, Hidden]
	Y           *device.Tensor // the forward's Y
	RecvWeights *device.Tensor // the forward's weights, if it was weighted
}

// UnpermuteBackwardOutput is the gradient of an unpermute's inputs.
type UnpermuteBackwardOutput struct {
	// GradY is [permuted rows, Hidden]: c_ik * GradOut[i] at each (i, k)
	// position, zero on padding.
	GradY *device.Tensor
	// GradWeights is [rows, TopK] FP32, <GradOut[i], Y[pos(i,k)]>, 0 on
	// empty slots; nil when the forward was unweighted.
	GradWeights *device.Tensor
}

// Close frees the outputs in stream order.
func (o UnpermuteBackwardOutput) Close() error { return closeAll(o.GradY, o.GradWeights) }

func closeAll(ts ...*device.Tensor) error {
	for _, t := range ts {
		if t != nil {
			t.Close()
		}
	}
	return nil
}
