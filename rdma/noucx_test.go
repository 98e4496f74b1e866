//go:build !ucx || !cgo

package rdma

import (
	"errors"
	"strings"
	"testing"

	"github.com/goep/goep/comm"
)

func TestNewUCXUnsupported(t *testing.T) {
	g := comm.NewLocal(1)[0]
	defer g.Close()
	tr, err := NewUCX(t.Context(), g, Config{SendBytes: 1, RecvBytes: 1})
	if tr != nil || !errors.Is(err, ErrUnsupported) || !strings.Contains(err.Error(), "-tags ucx") {
		t.Fatalf("NewUCX without the ucx tag: %v, %v; want an error wrapping ErrUnsupported naming -tags ucx", tr, err)
	}
}

func TestDevicesUnsupported(t *testing.T) {
	res, err := Devices()
	if len(res.Devices) != 0 || !errors.Is(err, ErrUnsupported) || !strings.Contains(err.Error(), "-tags ucx") {
		t.Fatalf("Devices without the ucx tag: %+v, %v; want an error wrapping ErrUnsupported naming -tags ucx", res, err)
	}
}
