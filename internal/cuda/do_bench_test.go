//go:build cuda && cgo

package cuda

import (
	"testing"

	"golang.org/x/sys/unix"
)

// The host cost of Device.Do, which every driver call of goep goes
// through: from outside (the lock, the context made current and put
// back) and nested inside another Do (goep's launches inside
// CUDAStream.Enqueue), beside the thread-id syscall the nested check
// makes. On a GPU host: .gpu/internal-cuda.test -gpu -test.run '^$'
// -test.bench Do

func benchDevice(b *testing.B) *Device {
	b.Helper()
	if n, err := NumDevices(); err != nil || n == 0 {
		if *requireGPU {
			b.Fatalf("no usable GPU: %v", err)
		}
		b.Skipf("no usable GPU: %v", err)
	}
	d, err := Open(0)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = d.Close() })
	return d
}

func BenchmarkGettid(b *testing.B) {
	for b.Loop() {
		unix.Gettid()
	}
}

func BenchmarkDoOuter(b *testing.B) {
	d := benchDevice(b)
	for b.Loop() {
		_ = d.Do(func() error { return nil })
	}
}

func BenchmarkDoNested(b *testing.B) {
	d := benchDevice(b)
	_ = d.Do(func() error {
		for b.Loop() {
			_ = d.Do(func() error { return nil })
		}
		return nil
	})
}
