//go:build !cuda || !cgo

package cuda

import (
	"errors"
	"strings"
	"testing"
)

func TestNotCompiled(t *testing.T) {
	d, err := Open(0)
	if d != nil || !errors.Is(err, ErrNotCompiled) {
		t.Fatalf("Open(0) = %v, %v; want ErrNotCompiled", d, err)
	}
	if !strings.Contains(err.Error(), "-tags cuda") {
		t.Errorf("error %q does not name the build tag", err)
	}
	if _, err := NumDevices(); !errors.Is(err, ErrNotCompiled) {
		t.Errorf("NumDevices: %v", err)
	}
	if _, err := DriverVersion(); !errors.Is(err, ErrNotCompiled) {
		t.Errorf("DriverVersion: %v", err)
	}
}
