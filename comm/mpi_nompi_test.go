//go:build !mpi

package comm

import (
	"errors"
	"strings"
	"testing"
)

func TestNewMPIUnsupported(t *testing.T) {
	g, err := NewMPI(t.Context())
	if g != nil || !errors.Is(err, ErrUnsupported) || !strings.Contains(err.Error(), "-tags mpi") {
		t.Fatalf("NewMPI without the mpi tag: got %v, %v; want an error wrapping ErrUnsupported naming -tags mpi", g, err)
	}
}
