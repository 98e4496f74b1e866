//go:build cuda && cgo

package executor

import "time"

// HoldStream enqueues a kernel that keeps the engine's GPU stream busy for
// d (the lifetime tests).
func (e *Engine) HoldStream(d time.Duration) error { return e.gpu.hold(d) }
