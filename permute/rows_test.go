package permute

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/goep/goep/device"
	"github.com/goep/goep/internal/view"
)

// haveAsm is useAsm as the package set it at start-up (tests switch
// useAsm off and on).
var haveAsm = useAsm

// withAsm runs f with useAsm set to on and restores it after.
func withAsm(t testing.TB, on bool) {
	t.Helper()
	if on && !haveAsm {
		t.Skip("no assembly row loops on this CPU or GOARCH")
	}
	old := useAsm
	useAsm = on
	t.Cleanup(func() { useAsm = old })
}

// Special fp32 bit patterns: zeros, subnormals, normals at the edges,
// infinities, quiet and signalling NaNs with distinct payloads, and bf16
// rounding ties and near-ties.
var specialF32 = []uint32{
	0x00000000, 0x80000000, // ±0
	0x00000001, 0x80000001, 0x007fffff, 0x807fffff, 0x00400000, 0x00008000, 0x00018000, // subnormals
	0x00800000, 0x80800000, 0x7f7fffff, 0xff7fffff, 0x7f7f8000, 0x7f7f7fff, // edges of normal
	0x7f800000, 0xff800000, // ±Inf
	0x7fc00000, 0xffc00000, 0x7fc00001, 0x7fd2a5a5, 0xffe0beef, // quiet NaNs
	0x7f800001, 0xff800001, 0x7fa00000, 0x7f80ffff, 0x7fbfffff, // signalling NaNs
	0x3f800000, 0xbf800000, 0x3f808000, 0x3f818000, 0x3f807fff, 0x3f808001, // ties and near-ties
	0x3fffffff, 0x3f7fffff, 0x4effffff, 0x7effffff, 0x33800000, 0x0080ffff, 0x0000ffff,
}

// specialBF16 are bf16 bit patterns of the same kinds.
var specialBF16 = []uint16{
	0x0000, 0x8000, 0x0001, 0x8001, 0x007f, 0x0040, 0x0080, 0x8080,
	0x7f7f, 0xff7f, 0x7f80, 0xff80, 0x7fc0, 0xffc0, 0x7fc1, 0x7fd3, 0xffe5,
	0x7f81, 0xff81, 0x7fa0, 0x7fbf, 0x3f80, 0xbf80, 0x3f81, 0x4049, 0xc2f7,
}

// scales are the weights c tried, c == 1 included.
var scales = []float32{
	1, 0.5, -1, 0.3, -2.75, 3.1415927, 1e-20, 1e30, 0, float32(math.Copysign(0, -1)),
	math.Float32frombits(0x00000003), // subnormal
	float32(math.Inf(1)), float32(math.Inf(-1)),
	math.Float32frombits(0x7fc0c0de), math.Float32frombits(0xff800abc), // NaNs
}

// randF32 draws an fp32 bit pattern: random bits, a special value, or a
// value of moderate size (where most arithmetic happens).
func randF32(r *rand.Rand) uint32 {
	switch r.IntN(4) {
	case 0:
		return r.Uint32()
	case 1:
		return specialF32[r.IntN(len(specialF32))]
	default:
		return math.Float32bits(float32(r.NormFloat64() * math.Exp2(float64(r.IntN(40)-20))))
	}
}

func randBF16(r *rand.Rand) uint16 {
	switch r.IntN(4) {
	case 0:
		return uint16(r.Uint32())
	case 1:
		return specialBF16[r.IntN(len(specialBF16))]
	default:
		return uint16(randF32(r) >> 16)
	}
}

// randRow fills n elements of dt at element offset off of a fresh buffer
// and returns the row (a slice into the buffer, so it need not be 32-byte
// aligned).
func randRow(r *rand.Rand, dt device.DType, n, off int) []byte {
	sz := dt.Size()
	buf := make([]byte, (n+off+1)*sz)
	row := buf[off*sz : (off+n)*sz]
	switch dt {
	case device.BF16:
		for j := range view.Uint16s(buf) {
			view.Uint16s(buf)[j] = randBF16(r)
		}
	case device.FP32:
		for j := range view.Float32s(buf) {
			view.Float32s(buf)[j] = math.Float32frombits(randF32(r))
		}
	}
	return row
}

// guarded returns a float32 slice of n elements at offset off inside a
// buffer whose other elements are a guard pattern, and a function that
// reports whether the guards are intact.
func guarded(r *rand.Rand, n, off int) ([]float32, func() bool) {
	const guard = 0x5a5a5a5a
	buf := make([]float32, off+n+9)
	for j := range buf {
		buf[j] = math.Float32frombits(guard)
	}
	acc := buf[off : off+n : off+n]
	for j := range acc {
		acc[j] = math.Float32frombits(randF32(r))
	}
	return acc, func() bool {
		for j, v := range buf {
			if (j < off || j >= off+n) && math.Float32bits(v) != guard {
				return false
			}
		}
		return true
	}
}

// lengths are the row lengths tested: every length up to 67 (all tails of
// the 8-, 16- and 32-element blocks) and a few large ones.
func lengths() []int {
	var ns []int
	for n := range 68 {
		ns = append(ns, n)
	}
	return append(ns, 127, 128, 129, 1000, 2048, 2048+13, 7168)
}

func diffF32(got, want []float32) string {
	for j := range want {
		if math.Float32bits(got[j]) != math.Float32bits(want[j]) {
			return fmt.Sprintf("[%d] = %#08x, want %#08x", j, math.Float32bits(got[j]), math.Float32bits(want[j]))
		}
	}
	return ""
}

func diffBytes(dt device.DType, got, want []byte) string {
	if dt == device.FP32 {
		return diffF32(view.Float32s(got), view.Float32s(want))
	}
	g, w := view.Uint16s(got), view.Uint16s(want)
	for j := range w {
		if g[j] != w[j] {
			return fmt.Sprintf("[%d] = %#04x, want %#04x", j, g[j], w[j])
		}
	}
	return ""
}

var dtypes = []device.DType{device.BF16, device.FP32}

// checkRows compares the row functions as they dispatch now (useAsm as
// set) with the reference loops on random and special values, for every
// length, weight, first flag and a few element offsets of acc and row.
func checkRows(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, dt := range dtypes {
		for _, n := range lengths() {
			for _, off := range []int{0, 1, 3} {
				rowOff := (off + n) % 4
				for _, c := range scales {
					for _, first := range []bool{true, false} {
						row := randRow(r, dt, n, rowOff)
						acc, ok := guarded(r, n, off)
						want := append([]float32(nil), acc...)
						accumulateGo(dt, want, row, c, first)
						Accumulate(dt, acc, row, c, first)
						if d := diffF32(acc, want); d != "" || !ok() {
							t.Fatalf("Accumulate(%v, n=%d, off=%d, c=%#08x, first=%v): acc%s (guards intact: %v)",
								dt, n, off, math.Float32bits(c), first, d, ok())
						}
					}
					if c == 1 {
						continue
					}
					src := randRow(r, dt, n, rowOff)
					dst := randRow(r, dt, n, off)
					want := append([]byte(nil), dst...)
					scaleGo(dt, want, src, c)
					full := dst[:cap(dst)]
					tail := append([]byte(nil), full[len(dst):]...)
					Scale(dt, dst, src, c)
					if d := diffBytes(dt, dst, want); d != "" {
						t.Fatalf("Scale(%v, n=%d, off=%d, c=%#08x): dst%s", dt, n, off, math.Float32bits(c), d)
					}
					if string(full[len(dst):]) != string(tail) {
						t.Fatalf("Scale(%v, n=%d, off=%d): wrote past the row", dt, n, off)
					}
				}
				acc, _ := guarded(r, n, off)
				row := randRow(r, dt, n, rowOff)
				want := append([]byte(nil), row...)
				storeGo(dt, want, acc)
				full := row[:cap(row)]
				tail := append([]byte(nil), full[len(row):]...)
				Store(dt, row, acc)
				if d := diffBytes(dt, row, want); d != "" {
					t.Fatalf("Store(%v, n=%d, off=%d): row%s", dt, n, off, d)
				}
				if string(full[len(row):]) != string(tail) {
					t.Fatalf("Store(%v, n=%d, off=%d): wrote past the row", dt, n, off)
				}
			}
		}
	}
}

func TestRowsAsm(t *testing.T) {
	withAsm(t, true)
	checkRows(t)
}

// TestRowsFallback runs the same checks with the assembly switched off, the
// path taken off amd64 and arm64 and on amd64 CPUs without AVX2.
func TestRowsFallback(t *testing.T) {
	withAsm(t, false)
	checkRows(t)
}

// TestNaNPayloads pins the NaN a two-NaN operation returns: acc, the
// element and c carry distinct NaN payloads (quiet and signalling); the
// result must be the one the reference loops define (acc in a sum, c in a
// product, quieted), in each of the four Accumulate cases and in Scale, in
// the assembly and in the fallback.
func TestNaNPayloads(t *testing.T) {
	for _, asm := range []bool{true, false} {
		t.Run(fmt.Sprintf("asm=%v", asm), func(t *testing.T) {
			withAsm(t, asm)
			checkNaNPayloads(t)
		})
	}
}

func checkNaNPayloads(t *testing.T) {
	accNaN := []uint32{0x7fc00003, 0xffc0a003, 0x7f800005, 0xff9a0000}
	xNaN := []uint32{0x7fc20000, 0xffd40000, 0x7f810000, 0xff830000}
	cNaN := []uint32{0x7fc00001, 0xffe00011, 0x7f800009, 0xffa00001}
	const quietBit = 0x00400000
	const n = 32 + 8 + 5 // both assembly loops and a Go tail
	for _, dt := range dtypes {
		for _, a := range accNaN {
			for _, x := range xNaN {
				for _, cb := range append([]uint32{0x3f800000, 0x40400000}, cNaN...) {
					c := math.Float32frombits(cb)
					row := make([]byte, n*dt.Size())
					for j := range n {
						if dt == device.BF16 {
							view.Uint16s(row)[j] = uint16(x >> 16)
						} else {
							view.Float32s(row)[j] = math.Float32frombits(x)
						}
					}
					// The term: x itself when c == 1, else c*x: c if c is NaN.
					term := x | quietBit
					switch {
					case c == 1:
						term = x
					case c != c:
						term = cb | quietBit
					}
					for _, first := range []bool{true, false} {
						acc := make([]float32, n)
						for j := range acc {
							acc[j] = math.Float32frombits(a)
						}
						want := append([]float32(nil), acc...)
						accumulateGo(dt, want, row, c, first)
						Accumulate(dt, acc, row, c, first)
						rule := a | quietBit // acc + term: acc
						if first {
							rule = term
						}
						if d := diffF32(acc, want); d != "" || math.Float32bits(want[0]) != rule {
							t.Errorf("Accumulate(%v, acc=%#08x, x=%#08x, c=%#08x, first=%v): acc%s; reference %#08x, rule %#08x",
								dt, a, x, cb, first, d, math.Float32bits(want[0]), rule)
						}
					}
					if c == 1 {
						continue
					}
					dst, want := make([]byte, len(row)), make([]byte, len(row))
					scaleGo(dt, want, row, c)
					Scale(dt, dst, row, c)
					if d := diffBytes(dt, dst, want); d != "" {
						t.Errorf("Scale(%v, x=%#08x, c=%#08x): dst%s", dt, x, cb, d)
					}
					rule := []byte(nil)
					if dt == device.BF16 {
						rule = []byte{0, 0}
						view.Uint16s(rule)[0] = device.Float32ToBF16(math.Float32frombits(term))
					} else {
						rule = []byte{0, 0, 0, 0}
						view.Float32s(rule)[0] = math.Float32frombits(term)
					}
					if string(want[:len(rule)]) != string(rule) {
						t.Errorf("scaleGo(%v, x=%#08x, c=%#08x) = % x, rule % x", dt, x, cb, want[:len(rule)], rule)
					}
				}
			}
		}
	}
}

// TestStoreBF16Sweep rounds every fp32 sign, exponent and top mantissa
// bits (all 65536 upper halves) with the lower halves that decide rounding:
// 0, 1, just under, at and just over the tie, and all ones.
func TestStoreBF16Sweep(t *testing.T) {
	withAsm(t, true)
	lows := []uint32{0, 1, 0x7fff, 0x8000, 0x8001, 0xffff, 0x4000, 0xc000}
	acc := make([]float32, 1<<16*len(lows))
	for hi := range uint32(1 << 16) {
		for k, lo := range lows {
			acc[int(hi)*len(lows)+k] = math.Float32frombits(hi<<16 | lo)
		}
	}
	got, want := make([]byte, 2*len(acc)), make([]byte, 2*len(acc))
	storeGo(device.BF16, want, acc)
	Store(device.BF16, got, acc)
	if d := diffBytes(device.BF16, got, want); d != "" {
		t.Fatalf("Store(bf16): row%s", d)
	}
	for j, f := range acc {
		if w := device.Float32ToBF16(f); view.Uint16s(got)[j] != w {
			t.Fatalf("Store(bf16, %#08x) = %#04x, want %#04x", math.Float32bits(f), view.Uint16s(got)[j], w)
		}
	}
}
