package executor

import (
	"errors"
	"fmt"

	"github.com/goep/goep/comm"
)

// Status codes of the GPU wait kernel (kernels/ep.cu's goep_ep_wait), one
// per rank of the domain (missing[p]); 0: heard from.
const (
	waitTimeout  = 1
	waitMismatch = 2
	waitRejected = 3
)

// waitError is the error of a failed GPU wait from its codes, one per rank
// of the domain whose first global rank is base: the ranks that timed out,
// rejected their input or ran another call. The rail decodes a peer's
// codes with it too (a GPU-fed header that reports a failed wait), so both
// sides name the same cause.
func waitError(codes []byte, base int) error {
	var timedOut, mismatched, rejected []int
	for p, c := range codes {
		switch c {
		case waitTimeout:
			timedOut = append(timedOut, base+p)
		case waitMismatch:
			mismatched = append(mismatched, base+p)
		case waitRejected:
			rejected = append(rejected, base+p)
		}
	}
	switch {
	case len(timedOut) > 0:
		return &comm.TimeoutError{Op: "executor: GPU wait for peers' flags", Missing: timedOut}
	case len(rejected) > 0:
		return fmt.Errorf("executor: rank(s) %v rejected their input to a collective call: %w", rejected, ErrInvalidInput)
	case len(mismatched) > 0:
		return fmt.Errorf("executor: rank(s) %v ran another collective call, or this one on rows of another dtype or with weights where this rank had none (or none where it had them): %w", mismatched, ErrPeerMismatch)
	default:
		return errors.New("executor: a GPU wait failed without naming a rank")
	}
}
