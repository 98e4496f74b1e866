//go:build cgo

package plan

import (
	"fmt"
	"math"

	"github.com/goep/goep/internal/gpulayout"
)

// The layout on the GPU (internal/gpulayout/layout.h, run by the GPU data
// path in one NVLink domain): the kernels write the handle's tables
// straight into device memory, and the host downloads only their summary,
// which SummaryLayout reads. This file is the host side that does not
// need CUDA, so that tests check it against the host layout through the
// kernels' emulation (package gpulayout).

// LayoutDims are the kernels' sizes for this rank's layout of T tokens
// into tables of rowCap receive rows, in a domain of R ranks (this rank
// is me).
func LayoutDims(p Params, R, me, T, rowCap int) gpulayout.Dims {
	maxRecv := math.MaxInt32
	if p.Capacity {
		maxRecv = p.MaxRecvTokens
	}
	return gpulayout.Dims{R: R, Me: me, K: p.TopK, L: p.NumExperts / R, MaxT: p.MaxTokensPerRank,
		Pad: max(p.PadMultiple, 1), Chunk: layoutChunk(p.MaxTokensPerRank), MaxRecv: maxRecv, T: T, RowCap: rowCap}
}

// HaveLayoutDims reports that this build computes the layout's dimensions
// (cgo: internal/gpulayout's C), which the layout on the GPU needs.
const HaveLayoutDims = true

// gpuLayoutFits reports whether the layout of a domain of R ranks (T
// tokens each at most, rowCap receive rows) fits the GPU kernels' int32
// offsets. It does not depend on the rank: rank 0 answers for all.
func gpuLayoutFits(p Params, R, T, rowCap int) bool {
	return LayoutDims(p, R, 0, T, rowCap).Check() == nil
}

// layoutChunk is the tokens per chunk of the column kernels for at most
// maxT tokens a rank: each thread walks one chunk of one column, and
// colscan's thread walks a column's chunks. Small chunks give a decode's
// few tokens many threads; from 2048 tokens a column has 64 chunks or more
// of 32 tokens, so that colscan's walk stays short and the workspace's
// per-chunk counts small.
func layoutChunk(maxT int) int { return min(max((maxT+63)/64, 8), 32) }

// SummaryLayout reads the summary of a GPU layout: the first routing error
// (the same RoutingError ComputeLayout returns), else a Layout holding the
// counts alone (the tables are on the device): this rank's RecvCount,
// PermutedCount, TokensPerExpert and ExpertOffsets, and the world counts.
func SummaryLayout(sum []int32, d gpulayout.Dims) (*Layout, error) {
	R, L := d.R, d.L
	if len(sum) != gpulayout.SumHeader+2*R+2*L+1 {
		return nil, fmt.Errorf("executor: GPU layout summary of %d words for %d ranks and %d local experts", len(sum), R, L)
	}
	switch sum[gpulayout.SumErr] {
	case 0:
	case 1, 2:
		re := &RoutingError{Rank: int(sum[gpulayout.SumErrRank]), Token: int(sum[gpulayout.SumErrToken]), Slot: int(sum[gpulayout.SumErrSlot])}
		e := sum[gpulayout.SumErrExpert]
		if sum[gpulayout.SumErr] == 1 {
			re.Msg = rangeMsg(e, R*L)
		} else {
			re.Msg = repeatMsg(e, int(sum[gpulayout.SumErrPrev]))
		}
		return nil, re
	default:
		return nil, fmt.Errorf("executor: GPU layout summary: error code %d", sum[gpulayout.SumErr])
	}
	lay := &Layout{Rank: d.Me, NumRanks: R, NumLocalExperts: L, TopK: d.K, PadMultiple: d.Pad, RanksPerDomain: R,
		SendSide:  SendSide{NumTokens: d.T},
		RecvCount: int(sum[gpulayout.SumRecv]), PermutedCount: int(sum[gpulayout.SumPermuted]),
		RecvCounts: make([]int, R), PermutedCounts: make([]int, R),
		TokensPerExpert: append([]int32(nil), sum[gpulayout.SumHeader+2*R:gpulayout.SumHeader+2*R+L]...),
		ExpertOffsets:   append([]int32(nil), sum[gpulayout.SumHeader+2*R+L:]...),
	}
	for r := range R {
		lay.RecvCounts[r] = int(sum[gpulayout.SumHeader+r])
		lay.PermutedCounts[r] = int(sum[gpulayout.SumHeader+R+r])
	}
	return lay, nil
}
