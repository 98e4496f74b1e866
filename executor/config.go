package executor

import (
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/goep/goep/comm"
	"github.com/goep/goep/device"
	"github.com/goep/goep/executor/internal/plan"
)

// Mode chooses how counts reach the host.
type Mode int

const (
	// Blocking: the layout synchronises the host once, learns RecvCount and
	// PermutedCount, and every output is allocated to its exact size.
	Blocking Mode = iota
	// Capacity: outputs have MaxRecvTokens / MaxPermutedTokens rows, the
	// valid prefix is given by device counts, and nothing on the data path
	// waits for the host (CUDA-graph capturable).
	Capacity
)

func (m Mode) String() string {
	if m == Capacity {
		return "capacity"
	}
	return "blocking"
}

// Overflow is what capacity mode does when a rank receives more rows than
// its capacity.
type Overflow int

const (
	// OverflowError makes the call report ErrCapacityExceeded, with the
	// counts, at its next host synchronisation. Nothing is written beyond
	// capacity.
	OverflowError Overflow = iota
	// OverflowDrop drops rows beyond capacity deterministically (received
	// rows past MaxRecvTokens in receive order, permuted rows past
	// MaxPermutedTokens) and sets the handle's overflow flag.
	OverflowDrop
)

func (o Overflow) String() string {
	if o == OverflowDrop {
		return "drop"
	}
	return "error"
}

// DefaultTimeout bounds every cross-rank wait unless GOEP_TIMEOUT or
// Config.Timeout says otherwise.
const DefaultTimeout = 60 * time.Second

// Config is the static shape of an engine. It must be equal on all ranks
// (New checks this and returns ErrPeerMismatch naming the field).
type Config struct {
	// NumExperts is E, the number of experts in the EP group. NumRanks must
	// divide it.
	NumExperts int
	// TopK is K, the expert slots per token.
	TopK int
	// Hidden is H, the elements per token row.
	Hidden int
	// MaxTokensPerRank bounds T_r on every rank; it sizes the buffers.
	MaxTokensPerRank int
	// RanksPerDomain is D, the ranks per NVLink domain; 0 means
	// GOEP_RANKS_PER_DOMAIN, else detected by New: the ranks of one host
	// form a domain (they must be consecutive, the same number per host).
	// NumRanks % D must be 0.
	RanksPerDomain int
	// PadMultiple rounds each expert's segment of the permuted layout up to
	// a multiple of this (1 = no padding; grouped GEMMs often want 16 or
	// 128). 0 means 1.
	PadMultiple int
	// Mode is Blocking (default) or Capacity.
	Mode Mode
	// MaxRecvTokens and MaxPermutedTokens are the output capacities of
	// Capacity mode (ignored in Blocking mode).
	MaxRecvTokens     int
	MaxPermutedTokens int
	// Overflow is the capacity-mode overflow policy.
	Overflow Overflow
	// RowDType is the widest dtype of the rows the calls move between
	// ranks (Dispatch's X, Combine's Z, their fused and backward forms):
	// the GPU path's windows, allocated once, hold rows of it. 0 or FP32:
	// any dtype, windows of fp32 rows. BF16: bf16 and fp8 rows only; the
	// windows take half the memory, and a call with fp32 rows between
	// ranks is refused (ErrInvalidInput).
	RowDType device.DType
	// Timeout bounds every cross-rank wait of a call; 0 means GOEP_TIMEOUT
	// or 60 s. New's setup waits at least 30 s whatever it says (a GPU's
	// first module loads JIT-compile goep's kernels).
	Timeout time.Duration

	// SMs and ChunkRows tune how the row copies between ranks spread over
	// the hardware (CUDA: the push of dispatch's rows into the receivers'
	// windows and combine's scatter back; host: the loops that read peers'
	// buffers, with combine's sums); results are the same, bit for bit,
	// for every value. Like every field they must be equal on all ranks
	// (New compares the configs). eprun bench sweeps them (--sms,
	// --chunk-rows).
	//
	// SMs bounds that parallelism: on the CUDA backend, the thread blocks
	// the push and scatter kernels launch in all (each block then copies
	// whole rows, looping over its chunks, so SMs = n keeps the copies on
	// at most n SMs and leaves the rest to concurrent compute); on the
	// host backend, the goroutines a rank uses for its copies and sums.
	// 0: no bound (CUDA: one block per chunk and per 256 16-byte units of
	// a row; host: GOMAXPROCS).
	SMs int
	// ChunkRows is the number of consecutive rows a block (CUDA) or a
	// goroutine's work item (host, taken in turn from a shared counter)
	// copies at a time. 0: the default (CUDA: one row per block; host: one
	// contiguous range per goroutine).
	ChunkRows int
}

// maxDim bounds every size so that row and position arithmetic fits int32,
// which is what indices are on the device.
const maxDim = 1 << 30

// Validate checks the config on its own, without knowing the group size;
// New also checks it against the group (ValidateFor).
func (c Config) Validate() error {
	switch {
	case c.NumExperts <= 0:
		return fmt.Errorf("executor: config: NumExperts is %d; an EP group needs at least one expert", c.NumExperts)
	case c.TopK <= 0:
		return fmt.Errorf("executor: config: TopK is %d; each token needs at least one expert slot", c.TopK)
	case c.TopK > c.NumExperts:
		return fmt.Errorf("executor: config: TopK %d exceeds NumExperts %d; a token may not name an expert twice, so it cannot fill more slots than there are experts", c.TopK, c.NumExperts)
	case c.Hidden <= 0:
		return fmt.Errorf("executor: config: Hidden is %d; rows must have at least one element", c.Hidden)
	case c.MaxTokensPerRank < 0:
		return fmt.Errorf("executor: config: MaxTokensPerRank is %d; it sizes buffers and cannot be negative", c.MaxTokensPerRank)
	case c.RanksPerDomain < 0:
		return fmt.Errorf("executor: config: RanksPerDomain is %d; use 0 for a single domain", c.RanksPerDomain)
	case c.PadMultiple < 0:
		return fmt.Errorf("executor: config: PadMultiple is %d; use 1 (or 0) for no padding", c.PadMultiple)
	case c.Mode != Blocking && c.Mode != Capacity:
		return fmt.Errorf("executor: config: unknown Mode %d", c.Mode)
	case c.Overflow != OverflowError && c.Overflow != OverflowDrop:
		return fmt.Errorf("executor: config: unknown Overflow policy %d", c.Overflow)
	case c.RowDType != 0 && c.RowDType != device.BF16 && c.RowDType != device.FP32:
		return fmt.Errorf("executor: config: RowDType is %v; want bf16 or fp32 (0: fp32): combine's rows are bf16 or fp32, and fp8 rows travel in bf16-wide windows", c.RowDType)
	case c.SMs < 0:
		return fmt.Errorf("executor: config: SMs is %d; use 0 for no bound", c.SMs)
	case c.ChunkRows < 0:
		return fmt.Errorf("executor: config: ChunkRows is %d; use 0 for the default", c.ChunkRows)
	case c.Timeout < 0:
		return fmt.Errorf("executor: config: Timeout is %v; every cross-rank wait needs a positive deadline (0 = default)", c.Timeout)
	case c.NumExperts > maxDim || c.Hidden > maxDim || c.MaxTokensPerRank > maxDim || c.PadMultiple > maxDim ||
		c.SMs > maxDim || c.ChunkRows > maxDim:
		return fmt.Errorf("executor: config: a size exceeds %d; indices are int32 on the device", maxDim)
	}
	if c.Mode == Capacity {
		switch {
		case c.MaxRecvTokens <= 0:
			return fmt.Errorf("executor: config: capacity mode needs MaxRecvTokens > 0 (got %d): outputs are allocated to it before counts are known", c.MaxRecvTokens)
		case c.MaxPermutedTokens <= 0:
			return fmt.Errorf("executor: config: capacity mode needs MaxPermutedTokens > 0 (got %d): permuted outputs are allocated to it before counts are known", c.MaxPermutedTokens)
		case c.MaxRecvTokens > maxDim || c.MaxPermutedTokens > maxDim:
			return fmt.Errorf("executor: config: a capacity exceeds %d; indices are int32 on the device", maxDim)
		}
	}
	return nil
}

// ValidateFor checks c against a group of numRanks ranks.
func (c Config) ValidateFor(numRanks int) error {
	if err := c.Validate(); err != nil {
		return err
	}
	if numRanks <= 0 {
		return fmt.Errorf("executor: config: group has %d ranks", numRanks)
	}
	if c.NumExperts%numRanks != 0 {
		return fmt.Errorf("executor: config: NumExperts %d is not a multiple of the %d ranks; every rank must own the same number of experts (expert e lives on rank e / (E/R))", c.NumExperts, numRanks)
	}
	if d := c.RanksPerDomain; d != 0 && numRanks%d != 0 {
		return fmt.Errorf("executor: config: %d ranks do not split into domains of RanksPerDomain %d", numRanks, d)
	}
	return nil
}

// withDefaults fills the zero values that mean "default".
func (c Config) withDefaults(numRanks int) (Config, error) {
	if c.PadMultiple == 0 {
		c.PadMultiple = 1
	}
	if c.RanksPerDomain == 0 {
		if v, ok := os.LookupEnv("GOEP_RANKS_PER_DOMAIN"); ok {
			d, err := strconv.Atoi(v)
			if err != nil || d <= 0 {
				return c, fmt.Errorf("executor: GOEP_RANKS_PER_DOMAIN=%q: want a positive integer", v)
			}
			c.RanksPerDomain = d
		}
		// Else New detects it (one domain per host).
	}
	if c.Timeout == 0 {
		t, err := TimeoutFromEnv()
		if err != nil {
			return c, err
		}
		c.Timeout = t
	}
	return c, nil
}

// TimeoutFromEnv returns GOEP_TIMEOUT (a Go duration such as "30s", or a
// number of seconds), or DefaultTimeout when it is unset. An invalid value is
// an error, never a silent default.
func TimeoutFromEnv() (time.Duration, error) {
	d, err := comm.DurationFromEnv("GOEP_TIMEOUT", DefaultTimeout)
	if err != nil {
		return 0, fmt.Errorf("executor: %w", err)
	}
	return d, nil
}

// params is what the layout needs of c (defaults filled in, validated).
func (c Config) params() plan.Params {
	return plan.Params{
		NumExperts: c.NumExperts, TopK: c.TopK, MaxTokensPerRank: c.MaxTokensPerRank,
		RanksPerDomain: c.RanksPerDomain, PadMultiple: max(c.PadMultiple, 1),
		Capacity: c.Mode == Capacity, MaxRecvTokens: c.MaxRecvTokens, MaxPermutedTokens: c.MaxPermutedTokens,
		RowElem: c.rowDType().Size(),
	}
}

// rowDType is the widest dtype of rows between ranks (RowDType, 0: fp32).
func (c Config) rowDType() device.DType {
	if c.RowDType == 0 {
		return device.FP32
	}
	return c.RowDType
}
