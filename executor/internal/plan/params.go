package plan

import (
	"errors"
	"fmt"
	"strings"
)

// Sentinel errors of the plan, which package executor exports under the
// same names (executor.ErrInvalidInput, executor.ErrCapacityExceeded).
var (
	// ErrInvalidInput: a shape, dtype, index or size is wrong on some rank.
	ErrInvalidInput = errors.New("executor: invalid input")
	// ErrCapacityExceeded: in capacity mode, a rank received more rows than
	// its capacity (see *CapacityError).
	ErrCapacityExceeded = errors.New("executor: capacity exceeded")
)

// Params are what the layout needs of an engine's config: executor.Config
// with its defaults filled in and validated against the group.
type Params struct {
	NumExperts       int // E; NumRanks divides it
	TopK             int // K
	MaxTokensPerRank int // bounds T_r
	// RanksPerDomain is D; 0 or NumRanks: one domain.
	RanksPerDomain int
	PadMultiple    int // >= 1
	// Capacity is capacity mode; its received and permuted rows are
	// bounded by MaxRecvTokens and MaxPermutedTokens (unbounded otherwise).
	Capacity                         bool
	MaxRecvTokens, MaxPermutedTokens int
	// RowElem is the bytes of an element of the widest rows the calls
	// move between ranks: 4 (fp32) or 2 (bf16); 0 means 4. The GPU
	// windows hold rows of it (NewGPUWindows).
	RowElem int
}

// ValidRecv is the number of valid received rows of rank d: its count,
// clipped to the capacity in capacity mode.
func ValidRecv(lay *Layout, p Params, d int) int {
	if p.Capacity {
		return min(lay.RecvCounts[d], p.MaxRecvTokens)
	}
	return lay.RecvCounts[d]
}

// PermCap is the permuted-row capacity of rank d: its permuted count in
// blocking mode.
func PermCap(lay *Layout, p Params, d int) int {
	if p.Capacity {
		return p.MaxPermutedTokens
	}
	return lay.PermutedCounts[d]
}

// CapacityError reports ranks that received more rows than the capacity
// mode allows. Every rank of the layout reports the same error.
type CapacityError struct {
	Ranks                            []int // ranks over capacity
	RecvCounts, PermutedCounts       []int // their counts
	MaxRecvTokens, MaxPermutedTokens int
}

func (e *CapacityError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "executor: capacity exceeded (MaxRecvTokens %d, MaxPermutedTokens %d):", e.MaxRecvTokens, e.MaxPermutedTokens)
	for i, r := range e.Ranks {
		fmt.Fprintf(&b, " rank %d receives %d rows, %d permuted;", r, e.RecvCounts[i], e.PermutedCounts[i])
	}
	return strings.TrimSuffix(b.String(), ";")
}

// Unwrap makes errors.Is(err, ErrCapacityExceeded) true.
func (e *CapacityError) Unwrap() error { return ErrCapacityExceeded }

// CheckCapacity returns the CapacityError of a layout in capacity mode
// (nil when every rank fits, or in blocking mode).
func CheckCapacity(lay *Layout, p Params) error {
	if !p.Capacity {
		return nil
	}
	var ce *CapacityError
	for r := range lay.RecvCounts {
		if lay.RecvCounts[r] > p.MaxRecvTokens || lay.PermutedCounts[r] > p.MaxPermutedTokens {
			if ce == nil {
				ce = &CapacityError{MaxRecvTokens: p.MaxRecvTokens, MaxPermutedTokens: p.MaxPermutedTokens}
			}
			ce.Ranks = append(ce.Ranks, r)
			ce.RecvCounts = append(ce.RecvCounts, lay.RecvCounts[r])
			ce.PermutedCounts = append(ce.PermutedCounts, lay.PermutedCounts[r])
		}
	}
	if ce == nil {
		return nil
	}
	return ce
}

// Overflows reports whether this rank's own counts exceed the capacities
// (capacity mode): the overflow flag of its device counts.
func Overflows(lay *Layout, p Params) bool {
	return p.Capacity && (lay.RecvCount > p.MaxRecvTokens || lay.PermutedCount > p.MaxPermutedTokens)
}

// Layout of a handle's device counts tensor, Int32 [CountsHeader + L]
// (executor.Handle.DeviceCounts).
const (
	CountRecv     = 0 // RecvCount
	CountPermuted = 1 // PermutedCount
	CountOverflow = 2 // 1 when this rank dropped rows (capacity mode, OverflowDrop)
	CountsHeader  = 4 // TokensPerExpert follows
)

// Counts is the device counts of a layout (CountRecv, ...): the tensor a
// handle's DeviceCounts holds.
func Counts(lay *Layout, p Params) []int32 {
	c := make([]int32, CountsHeader+len(lay.TokensPerExpert))
	c[CountRecv], c[CountPermuted] = int32(lay.RecvCount), int32(lay.PermutedCount)
	copy(c[CountsHeader:], lay.TokensPerExpert)
	if Overflows(lay, p) {
		c[CountOverflow] = 1
	}
	return c
}
