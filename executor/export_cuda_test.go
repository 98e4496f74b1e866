//go:build cuda && cgo

package executor

import "time"

// HoldStream enqueues a kernel that keeps the engine's GPU stream busy for
// d (the lifetime tests).
func (e *Engine) HoldStream(d time.Duration) error { return e.gpu.hold(d) }

// RailFed reports whether the engine feeds its rail from the GPU (several
// domains, GOEP_RAIL_HOST_STAGING unset).
func (e *Engine) RailFed() bool { return e.gpu != nil && e.gpu.hier != nil && e.gpu.hier.feed != nil }
