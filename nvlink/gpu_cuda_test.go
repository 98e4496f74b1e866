//go:build cuda && cgo

package nvlink

import (
	"testing"

	"github.com/goep/goep/device"
)

// TestGPUHandleEncoding: every field of a window's handle survives the
// exchange's encoding, for every kind (a descriptor of -1 included).
func TestGPUHandleEncoding(t *testing.T) {
	for _, h := range []device.GPUShareHandle{
		{Kind: device.ShareIPC, PID: 4242, Proc: 1<<63 | 5, Gen: 12, Addr: 0x7f0000200000, Size: 12345, FD: -1, Raw: [64]byte{1, 2, 63: 9}},
		{Kind: device.ShareFD, PID: 1 << 22, Addr: 0x7f0000400000, Size: 5000, Mapped: 2 << 20, FD: 37},
		{Kind: device.ShareFabric, PID: 7, Addr: 0x7f0000600000, Size: 1 << 30, Mapped: 1 << 30, FD: -1, Raw: [64]byte{0: 0xff, 32: 0x80}},
	} {
		b := make([]byte, gpuHandleSize)
		encodeGPUHandle(b, h)
		if got := decodeGPUHandle(b); got != h {
			t.Errorf("decode(encode(%+v)) = %+v", h, got)
		}
	}
}
