package reference

import (
	"fmt"

	"github.com/goep/goep/device"
)

// World is one call's inputs on every rank of an EP group, plus the group's
// static shape. Expert e lives on rank e/L as local expert e%L, with
// L = NumExperts/NumRanks.
type World struct {
	NumRanks   int // R
	NumExperts int // E; NumRanks divides it
	TopK       int // K
	Hidden     int // H
	// RanksPerDomain is D, the ranks per NVLink domain (domain of rank r is
	// r/D); 0 means one domain of all ranks. It only changes Combine.
	RanksPerDomain int
	// PadMultiple rounds each expert's segment of the permuted layout up to
	// a multiple of it; 0 means 1 (no padding).
	PadMultiple int
	// DType is the activation dtype, BF16 or FP32; or FP8E4M3 for the calls
	// that only move rows (Dispatch, Permute, DispatchPermute), with
	// Hidden a multiple of device.FP8ScaleChannels.
	DType device.DType
	// MaxRecvTokens and MaxPermutedTokens, when positive, model capacity
	// mode with the Drop policy: received-row outputs (Dispatch, Unpermute,
	// CombineBackward, PermuteBackward) have MaxRecvTokens rows and
	// permuted outputs (Permute, UnpermuteBackward's gradY)
	// MaxPermutedTokens rows, rows past the valid prefix zero; received row
	// i of rank d exists only if i < MaxRecvTokens (a dropped row is not
	// received, permuted, nor combined), and slot (i, k) is permuted only if
	// its position is < MaxPermutedTokens (a dropped position is skipped by
	// Permute, Unpermute and UnpermuteBackward). Layout still reports the
	// true tables. 0 means blocking mode: exact sizes, nothing dropped.
	MaxRecvTokens, MaxPermutedTokens int
	// TopkIdx[r] is rank r's routing, [T_r, K] row-major, values in [-1, E),
	// -1 an empty slot. T_r = len(TopkIdx[r]) / K.
	TopkIdx [][]int32
	// X[r] is rank r's tokens, [T_r, H] in DType; nil when only the layout
	// or other calls' data is needed.
	X [][]byte
	// Weights[r] is rank r's router weights, [T_r, K] fp32; nil for an
	// unweighted call.
	Weights [][]float32
	// Scales[r] is rank r's fp8 scales, [T_r, Hidden/128] fp32 bytes, one
	// per 128 channels of a row of X; nil unless DType is FP8E4M3.
	Scales [][]byte
}

// NumLocalExperts is L = E / R.
func (w *World) NumLocalExperts() int { return w.NumExperts / w.NumRanks }

// NumTokens is T_r = len(TopkIdx[r]) / K.
func (w *World) NumTokens(r int) int { return len(w.TopkIdx[r]) / w.TopK }

// RowBytes is the size of one activation row, H * DType.Size().
func (w *World) RowBytes() int { return w.Hidden * w.DType.Size() }

// ScaleRowBytes is the size of one row of fp8 scales: 4 bytes per
// device.FP8ScaleChannels channels.
func (w *World) ScaleRowBytes() int { return w.Hidden / device.FP8ScaleChannels * 4 }

func (w *World) pad() int {
	if w.PadMultiple <= 0 {
		return 1
	}
	return w.PadMultiple
}

func (w *World) ranksPerDomain() int {
	if w.RanksPerDomain <= 0 {
		return w.NumRanks
	}
	return w.RanksPerDomain
}

// Validate checks the shape and the routing: sizes positive, R divides E, D
// divides R, K <= E, dtype BF16 or FP32, one routing table per rank of a
// whole number of rows, every index in [-1, E), no expert repeated within a
// row, and X and Weights (when given) of the matching sizes.
func (w *World) Validate() error {
	switch {
	case w.NumRanks <= 0:
		return fmt.Errorf("reference: NumRanks %d", w.NumRanks)
	case w.NumExperts <= 0 || w.NumExperts%w.NumRanks != 0:
		return fmt.Errorf("reference: NumExperts %d is not a positive multiple of NumRanks %d", w.NumExperts, w.NumRanks)
	case w.TopK <= 0 || w.TopK > w.NumExperts:
		return fmt.Errorf("reference: TopK %d not in [1, %d]", w.TopK, w.NumExperts)
	case w.Hidden <= 0:
		return fmt.Errorf("reference: Hidden %d", w.Hidden)
	case w.RanksPerDomain < 0 || w.NumRanks%w.ranksPerDomain() != 0:
		return fmt.Errorf("reference: RanksPerDomain %d does not divide NumRanks %d", w.RanksPerDomain, w.NumRanks)
	case w.MaxRecvTokens < 0 || w.MaxPermutedTokens < 0:
		return fmt.Errorf("reference: negative capacity (%d, %d)", w.MaxRecvTokens, w.MaxPermutedTokens)
	case w.PadMultiple < 0:
		return fmt.Errorf("reference: PadMultiple %d", w.PadMultiple)
	case w.DType != device.BF16 && w.DType != device.FP32 && w.DType != device.FP8E4M3:
		return fmt.Errorf("reference: DType %v (want bf16, fp32 or fp8)", w.DType)
	case w.DType == device.FP8E4M3 && w.Hidden%device.FP8ScaleChannels != 0:
		return fmt.Errorf("reference: fp8 needs Hidden %d to be a multiple of %d", w.Hidden, device.FP8ScaleChannels)
	case w.Scales != nil && len(w.Scales) != w.NumRanks:
		return fmt.Errorf("reference: %d scale tables for %d ranks", len(w.Scales), w.NumRanks)
	case len(w.TopkIdx) != w.NumRanks:
		return fmt.Errorf("reference: %d routing tables for %d ranks", len(w.TopkIdx), w.NumRanks)
	case w.X != nil && len(w.X) != w.NumRanks:
		return fmt.Errorf("reference: %d token tensors for %d ranks", len(w.X), w.NumRanks)
	case w.Weights != nil && len(w.Weights) != w.NumRanks:
		return fmt.Errorf("reference: %d weight tables for %d ranks", len(w.Weights), w.NumRanks)
	}
	for r, idx := range w.TopkIdx {
		if len(idx)%w.TopK != 0 {
			return fmt.Errorf("reference: rank %d: routing of %d values is not a whole number of rows of %d", r, len(idx), w.TopK)
		}
		T := len(idx) / w.TopK
		for t := range T {
			for k := range w.TopK {
				e := idx[t*w.TopK+k]
				if e < -1 || int(e) >= w.NumExperts {
					return fmt.Errorf("reference: rank %d token %d slot %d: expert %d not in [-1, %d)", r, t, k, e, w.NumExperts)
				}
				if e < 0 {
					continue
				}
				for k2 := range k {
					if idx[t*w.TopK+k2] == e {
						return fmt.Errorf("reference: rank %d token %d: expert %d in slots %d and %d", r, t, e, k2, k)
					}
				}
			}
		}
		if w.X != nil && len(w.X[r]) != T*w.RowBytes() {
			return fmt.Errorf("reference: rank %d: %d bytes of tokens, want %d rows of %d", r, len(w.X[r]), T, w.RowBytes())
		}
		if w.Weights != nil && len(w.Weights[r]) != T*w.TopK {
			return fmt.Errorf("reference: rank %d: %d weights, want %d", r, len(w.Weights[r]), T*w.TopK)
		}
	}
	return nil
}

// RecvRows is the row count of rank d's received-row outputs: N_d, or
// MaxRecvTokens in capacity mode.
func (w *World) RecvRows(lay RankLayout) int {
	if w.MaxRecvTokens > 0 {
		return w.MaxRecvTokens
	}
	return lay.RecvCount
}

// PermutedRows is the row count of rank d's permuted outputs: P_d, or
// MaxPermutedTokens in capacity mode.
func (w *World) PermutedRows(lay RankLayout) int {
	if w.MaxPermutedTokens > 0 {
		return w.MaxPermutedTokens
	}
	return lay.PermutedCount
}

// validRecv is the number of received rows of lay that are kept: N_d, or at
// most MaxRecvTokens in capacity mode.
func (w *World) validRecv(lay RankLayout) int {
	if w.MaxRecvTokens > 0 {
		return min(lay.RecvCount, w.MaxRecvTokens)
	}
	return lay.RecvCount
}

// slotPos is the permuted position of slot k of received row i, or -1 when
// the slot is empty or its position is dropped (capacity mode).
func (w *World) slotPos(lay RankLayout, i, k int) int {
	p := int(lay.Pos[i*w.TopK+k])
	if w.MaxPermutedTokens > 0 && p >= w.MaxPermutedTokens {
		return -1
	}
	return p
}

// roundTo rounds f to dtype dt and widens it back: the value a store of f
// into a dt tensor followed by a load gives.
func roundTo(dt device.DType, f float32) float32 {
	if dt == device.BF16 {
		return device.BF16ToFloat32(device.Float32ToBF16(f))
	}
	return f
}
