package permute

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/goep/goep/device"
	"github.com/goep/goep/internal/view"
)

// The row benchmarks run each function with the assembly (impl=asm) and
// with the reference loops (impl=go) side by side. Bytes are those of the
// input row (Hidden elements of dtype); GB/s is that rate.

var benchHidden = []int{2048, 7168}

var impls = []struct {
	name string
	asm  bool
}{{"asm", true}, {"go", false}}

func benchRows(b *testing.B, name string, f func(b *testing.B, dt device.DType, hidden int)) {
	for _, im := range impls {
		for _, dt := range dtypes {
			for _, h := range benchHidden {
				b.Run(fmt.Sprintf("impl=%s/dtype=%v/hidden=%d%s", im.name, dt, h, name), func(b *testing.B) {
					withAsm(b, im.asm)
					b.SetBytes(int64(h * dt.Size()))
					f(b, dt, h)
					b.ReportMetric(float64(h*dt.Size())*float64(b.N)/b.Elapsed().Seconds()/1e9, "GB/s")
				})
			}
		}
	}
}

// benchRow is a row of activation-like values (normal, mean 0, sd 1).
// Rows full of subnormals, infinities and NaNs run slower in both
// implementations (microcode assists), and are no workload.
func benchRow(dt device.DType, hidden int) []byte {
	r := rand.New(rand.NewPCG(3, 4))
	row := make([]byte, hidden*dt.Size())
	for j := range hidden {
		f := float32(r.NormFloat64())
		if dt == device.BF16 {
			view.Uint16s(row)[j] = device.Float32ToBF16(f)
		} else {
			view.Float32s(row)[j] = f
		}
	}
	return row
}

func BenchmarkAccumulate(b *testing.B) {
	for _, tc := range []struct {
		name  string
		c     float32
		first bool
	}{
		{"add", 1, false},
		{"set", 1, true},
		{"weighted-add", 0.3, false},
		{"weighted-set", 0.3, true},
	} {
		benchRows(b, "/op="+tc.name, func(b *testing.B, dt device.DType, h int) {
			row := benchRow(dt, h)
			acc := make([]float32, h)
			for b.Loop() {
				Accumulate(dt, acc, row, tc.c, tc.first)
			}
		})
	}
}

func BenchmarkStore(b *testing.B) {
	benchRows(b, "", func(b *testing.B, dt device.DType, h int) {
		acc := view.Float32s(benchRow(device.FP32, h))
		row := make([]byte, h*dt.Size())
		for b.Loop() {
			Store(dt, row, acc)
		}
	})
}

func BenchmarkScale(b *testing.B) {
	benchRows(b, "", func(b *testing.B, dt device.DType, h int) {
		src := benchRow(dt, h)
		dst := make([]byte, len(src))
		for b.Loop() {
			Scale(dt, dst, src, 0.3)
		}
	})
}

// BenchmarkCopy is the memmove of one row, a bound for the others.
func BenchmarkCopy(b *testing.B) {
	for _, dt := range dtypes {
		for _, h := range benchHidden {
			b.Run(fmt.Sprintf("dtype=%v/hidden=%d", dt, h), func(b *testing.B) {
				src := benchRow(dt, h)
				dst := make([]byte, len(src))
				b.SetBytes(int64(len(src)))
				for b.Loop() {
					copy(dst, src)
				}
				b.ReportMetric(float64(len(src))*float64(b.N)/b.Elapsed().Seconds()/1e9, "GB/s")
			})
		}
	}
}
