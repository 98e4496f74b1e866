//go:build !ucx || !cgo

package ucx

import (
	"errors"
	"strings"
	"testing"
)

func TestNotCompiled(t *testing.T) {
	c, err := NewContext(ContextConfig{})
	if c != nil || !errors.Is(err, ErrNotCompiled) || !strings.Contains(err.Error(), "-tags ucx") {
		t.Fatalf("NewContext without the ucx tag: %v, %v; want an error wrapping ErrNotCompiled naming -tags ucx", c, err)
	}
	if _, err := Version(); !errors.Is(err, ErrNotCompiled) {
		t.Fatalf("Version: %v", err)
	}
	if _, _, err := Devices(); !errors.Is(err, ErrNotCompiled) {
		t.Fatalf("Devices: %v", err)
	}
}
