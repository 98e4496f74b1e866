//go:build !ucx || !cgo

package ucx

import "fmt"

// Compiled reports whether the binding was built (tag ucx and cgo).
const Compiled = false

// Context is a UCX application context; without the ucx tag none can be
// created.
type Context struct{}

// NewContext fails: the package was built without the ucx tag (or without
// cgo). The error wraps ErrNotCompiled.
func NewContext(cfg ContextConfig) (*Context, error) {
	return nil, fmt.Errorf("ucx: new context: %w", ErrNotCompiled)
}

// Close does nothing.
func (c *Context) Close() error { return nil }

// MemoryTypes fails with an error wrapping ErrNotCompiled.
func (c *Context) MemoryTypes() (MemoryTypes, error) {
	return 0, fmt.Errorf("ucx: memory types: %w", ErrNotCompiled)
}

// Version fails with an error wrapping ErrNotCompiled.
func Version() (string, error) {
	return "", fmt.Errorf("ucx: version: %w", ErrNotCompiled)
}

// Devices fails with an error wrapping ErrNotCompiled.
func Devices() ([]Device, int, error) {
	return nil, 0, fmt.Errorf("ucx: devices: %w", ErrNotCompiled)
}
