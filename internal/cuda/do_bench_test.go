//go:build cuda && cgo

package cuda

import (
	"testing"

	"golang.org/x/sys/unix"
)

// The host cost of Device.Do, which every driver call of goep goes
// through: from outside (the lock, the thread's state, the context made
// current and put back) and nested inside another Do (goep's launches
// inside CUDAStream.Enqueue), beside a thread-id system call, which is
// what the nested check cost when it compared thread ids. On a GPU host:
// .gpu/internal-cuda.test -gpu -test.run '^$' -test.bench 'Do|Gettid'

func BenchmarkGettid(b *testing.B) {
	for b.Loop() {
		unix.Gettid()
	}
}

func BenchmarkDoOuter(b *testing.B) {
	d := openDevice(b)
	for b.Loop() {
		_ = d.Do(func() error { return nil })
	}
}

func BenchmarkDoNested(b *testing.B) {
	d := openDevice(b)
	_ = d.Do(func() error {
		for b.Loop() {
			_ = d.Do(func() error { return nil })
		}
		return nil
	})
}
