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
	for _, asm := range []bool{true, false} {
		t.Run(fmt.Sprintf("asm=%v", asm), func(t *testing.T) {
			withAsm(t, asm)
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
	for _, impl := range []string{"asm", "go", "chain"} {
		for _, dt := range []device.DType{device.BF16, device.FP32} {
			b.Run(fmt.Sprintf("impl=%s/dtype=%v/hidden=%d/rows=%d", impl, dt, H, nrows), func(b *testing.B) {
				withAsm(b, impl != "go")
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

// TestSumGroups checks SumGroups (assembly where available) against its
// reference loop and against what it replaces, SumRows per group into
// rows of dt then SumRows over those, on random and special values, every
// tail length, unaligned rows, empty groups and more rows than the
// assembly takes.
func TestSumGroups(t *testing.T) {
	for _, asm := range []bool{true, false} {
		t.Run(fmt.Sprintf("asm=%v", asm), func(t *testing.T) {
			withAsm(t, asm)
			r := rand.New(rand.NewPCG(7, 11))
			for _, dt := range []device.DType{device.BF16, device.FP32} {
				for _, n := range lengths() {
					for _, sizes := range [][]int{{}, {0}, {1}, {2, 1}, {0, 3, 1}, {1, 0}, {2, 2, 1, 3, 1}, {3, 0, 0, 2}, {maxSumRows, 4}} {
						if len(sizes) == 2 && sizes[0] == maxSumRows && n > 200 {
							continue
						}
						checkSumGroups(t, r, dt, n, sizes)
					}
				}
			}
		})
	}
}

func checkSumGroups(t *testing.T, r *rand.Rand, dt device.DType, n int, sizes []int) {
	t.Helper()
	var rows [][]byte
	var c []float32
	var ends []int
	for _, s := range sizes {
		for range s {
			rows = append(rows, randRow(r, dt, n, r.IntN(5)))
			c = append(c, scales[r.IntN(len(scales))])
		}
		ends = append(ends, len(rows))
	}
	sz := dt.Size()
	for _, weights := range [][]float32{nil, c} {
		buf := bytes.Repeat([]byte{0xA5}, (n+8)*sz)
		dst := buf[3*sz : (3+n)*sz]
		SumGroups(dt, dst, rows, weights, ends)
		if !bytes.Equal(buf[:3*sz], bytes.Repeat([]byte{0xA5}, 3*sz)) || !bytes.Equal(buf[(3+n)*sz:], bytes.Repeat([]byte{0xA5}, 5*sz)) {
			t.Fatalf("%v n=%d groups %v: wrote outside dst", dt, n, sizes)
		}
		want := make([]byte, n*sz)
		sumGroupsGo(dt, want, rows, weights, ends, 0, n)
		if d := diffBytes(dt, dst, want); d != "" {
			t.Fatalf("%v n=%d groups %v weighted=%v: SumGroups differs from its reference: %s", dt, n, sizes, weights != nil, d)
		}
		// Each group summed into a row of dt (as Unpermute writes it),
		// then the rows summed (as combine sums them): the same bits.
		inner := make([][]byte, len(ends))
		start := 0
		for g, end := range ends {
			inner[g] = make([]byte, n*sz)
			var wg []float32
			if weights != nil {
				wg = weights[start:end]
			}
			SumRows(dt, inner[g], rows[start:end], wg)
			start = end
		}
		twoPass := make([]byte, n*sz)
		SumRows(dt, twoPass, inner, nil)
		if d := diffBytes(dt, dst, twoPass); d != "" {
			t.Fatalf("%v n=%d groups %v weighted=%v: SumGroups differs from SumRows per group then over the groups: %s", dt, n, sizes, weights != nil, d)
		}
	}
}

// BenchmarkSumGroups: one token of the fused UnpermuteCombine, 5
// destinations holding 2, 1, 2, 1, 2 of its weighted slots, in one pass
// (SumGroups) against each destination's row unpermuted into a row of
// its own and then summed (two-pass). Bytes are the 5 rows combined.
func BenchmarkSumGroups(b *testing.B) {
	sizes := []int{2, 1, 2, 1, 2}
	for _, H := range []int{2048, 7168} {
		for _, impl := range []string{"groups", "two-pass"} {
			b.Run(fmt.Sprintf("impl=%s/dtype=bf16/hidden=%d", impl, H), func(b *testing.B) {
				dt := device.BF16
				var rows [][]byte
				var c []float32
				var ends []int
				for _, s := range sizes {
					for range s {
						rows = append(rows, benchRow(dt, H))
						c = append(c, 0.375)
					}
					ends = append(ends, len(rows))
				}
				dst := make([]byte, H*2)
				inner := make([][]byte, len(ends))
				for g := range inner {
					inner[g] = make([]byte, H*2)
				}
				b.SetBytes(int64(len(ends) * H * 2))
				for b.Loop() {
					if impl == "groups" {
						SumGroups(dt, dst, rows, c, ends)
						continue
					}
					start := 0
					for g, end := range ends {
						SumRows(dt, inner[g], rows[start:end], c[start:end])
						start = end
					}
					SumRows(dt, dst, inner, nil)
				}
			})
		}
	}
}
