//go:build cuda && cgo

package executor

import (
	"context"
	"time"

	"github.com/goep/goep/executor/internal/gpu"
)

// HoldStream enqueues a kernel that keeps the engine's GPU stream busy for
// d (the lifetime tests).
func (e *Engine) HoldStream(d time.Duration) error { return e.path.(*gpu.Path).Hold(d) }

// RailFed reports whether the engine feeds its rail from the GPU (several
// domains, GOEP_RAIL_HOST_STAGING unset).
func (e *Engine) RailFed() bool {
	p, ok := e.path.(*gpu.Path)
	return ok && p.RailFed()
}

// Probes are the times the one-launch kernels recorded of the engine's
// last calls (GOEP_GPU_PROBE or GOEP_GPU_LINK_PACE), oldest first.
func (e *Engine) Probes(ctx context.Context) ([]gpu.Probe, error) {
	return e.path.(*gpu.Path).Probes(ctx)
}
