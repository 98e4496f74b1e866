package permute

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/goep/goep/device"
)

// TestSumRows checks SumRows (assembly where available) against its
// reference loop and against the Accumulate/Store chain it replaces, on
// random and special values, every tail length, unaligned rows, 1 to 9
// rows and more rows than the assembly takes.
func TestSumRows(t *testing.T) {
	for _, avx := range []bool{true, false} {
		t.Run(fmt.Sprintf("avx2=%v", avx), func(t *testing.T) {
			withAVX2(t, avx)
			r := rand.New(rand.NewPCG(5, 9))
			for _, dt := range []device.DType{device.BF16, device.FP32} {
				for _, n := range lengths() {
					for _, nrows := range []int{0, 1, 2, 3, 5, 9, maxSumRows + 3} {
						if nrows > 9 && n > 200 {
							continue
						}
						checkSumRows(t, r, dt, n, nrows)
					}
				}
			}
		})
	}
}

func checkSumRows(t *testing.T, r *rand.Rand, dt device.DType, n, nrows int) {
	t.Helper()
	rows := make([][]byte, nrows)
	c := make([]float32, nrows)
	for i := range rows {
		rows[i] = randRow(r, dt, n, r.IntN(5))
		c[i] = scales[r.IntN(len(scales))]
		if c[i] == 1 {
			c[i] = 0.75 // the chain below skips the product for c == 1
		}
	}
	for _, weights := range [][]float32{nil, c} {
		sz := dt.Size()
		buf := bytes.Repeat([]byte{0xA5}, (n+8)*sz)
		dst := buf[3*sz : (3+n)*sz]
		SumRows(dt, dst, rows, weights)
		if !bytes.Equal(buf[:3*sz], bytes.Repeat([]byte{0xA5}, 3*sz)) || !bytes.Equal(buf[(3+n)*sz:], bytes.Repeat([]byte{0xA5}, 5*sz)) {
			t.Fatalf("%v n=%d rows=%d: wrote outside dst", dt, n, nrows)
		}
		want := make([]byte, n*sz)
		sumRowsGo(dt, want, rows, weights, 0, n)
		if d := diffBytes(dt, dst, want); d != "" {
			t.Fatalf("%v n=%d rows=%d weighted=%v: SumRows differs from its reference: %s", dt, n, nrows, weights != nil, d)
		}
		// The chain of Accumulate calls and a Store gives the same bits.
		chain := make([]byte, n*sz)
		acc := make([]float32, n)
		for i := range rows {
			w := float32(1)
			if weights != nil {
				w = weights[i]
			}
			Accumulate(dt, acc, rows[i], w, i == 0)
		}
		if nrows > 0 {
			Store(dt, chain, acc)
		}
		if d := diffBytes(dt, dst, chain); d != "" {
			t.Fatalf("%v n=%d rows=%d weighted=%v: SumRows differs from Accumulate+Store: %s", dt, n, nrows, weights != nil, d)
		}
	}
}

func BenchmarkSumRows(b *testing.B) {
	const H, nrows = 7168, 6
	for _, impl := range []string{"avx2", "go", "chain"} {
		for _, dt := range []device.DType{device.BF16, device.FP32} {
			b.Run(fmt.Sprintf("impl=%s/dtype=%v/hidden=%d/rows=%d", impl, dt, H, nrows), func(b *testing.B) {
				withAVX2(b, impl != "go")
				r := rand.New(rand.NewPCG(1, 2))
				rows := make([][]byte, nrows)
				for i := range rows {
					rows[i] = randRow(r, dt, H, 0)
					for j := range H { // moderate values, as activations are
						device.StoreFloat32(dt, rows[i], j, float32(r.NormFloat64()))
					}
				}
				dst := make([]byte, H*dt.Size())
				acc := make([]float32, H)
				b.SetBytes(int64(nrows * H * dt.Size()))
				for b.Loop() {
					if impl == "chain" {
						for i := range rows {
							Accumulate(dt, acc, rows[i], 1, i == 0)
						}
						Store(dt, dst, acc)
						continue
					}
					SumRows(dt, dst, rows, nil)
				}
			})
		}
	}
}
