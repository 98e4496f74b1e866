//go:build !cuda || !cgo

package cuda

import "fmt"

// HeaderVersion is 0: the package was built without CUDA headers.
const HeaderVersion = 0

// Device is a GPU; without the cuda build tag none can be opened.
type Device struct{}

// Open fails: the package was built without the cuda tag (or without cgo).
// The error wraps ErrNotCompiled.
func Open(ordinal int) (*Device, error) {
	return nil, fmt.Errorf("cuda: open device %d: %w", ordinal, ErrNotCompiled)
}

// NumDevices fails with an error wrapping ErrNotCompiled.
func NumDevices() (int, error) {
	return 0, fmt.Errorf("cuda: count devices: %w", ErrNotCompiled)
}

// DriverVersion fails with an error wrapping ErrNotCompiled.
func DriverVersion() (int, error) {
	return 0, fmt.Errorf("cuda: driver version: %w", ErrNotCompiled)
}

// Close does nothing.
func (d *Device) Close() error { return nil }
