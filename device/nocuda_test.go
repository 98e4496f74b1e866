//go:build !cuda || !cgo

package device

import (
	"errors"
	"strings"
	"testing"
)

func TestNewCUDANamesTheTag(t *testing.T) {
	_, err := NewCUDA(0)
	if !errors.Is(err, ErrUnsupported) || !strings.Contains(err.Error(), "-tags cuda") {
		t.Fatalf("NewCUDA without the cuda tag: %v, want ErrUnsupported naming -tags cuda", err)
	}
}
