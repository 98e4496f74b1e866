package device

import (
	"math"
	"testing"
)

func TestDTypes(t *testing.T) {
	for _, c := range []struct {
		names []string
		dt    DType
		size  int
		str   string
	}{
		{[]string{"bf16", "bfloat16"}, BF16, 2, "bf16"},
		{[]string{"fp32", "float32"}, FP32, 4, "fp32"},
		{[]string{"int32"}, Int32, 4, "int32"},
		{[]string{"fp8", "fp8_e4m3", "float8_e4m3fn"}, FP8E4M3, 1, "fp8"},
	} {
		for _, n := range c.names {
			dt, err := ParseDType(n)
			if err != nil || dt != c.dt {
				t.Errorf("ParseDType(%q) = %v, %v; want %v", n, dt, err, c.dt)
			}
		}
		if c.dt.Size() != c.size || c.dt.String() != c.str || !c.dt.Valid() {
			t.Errorf("%v: size %d string %q valid %v; want %d %q true", c.dt, c.dt.Size(), c.dt.String(), c.dt.Valid(), c.size, c.str)
		}
	}
	if _, err := ParseDType("fp16"); err == nil {
		t.Error("ParseDType(fp16) succeeded")
	}
	if DType(99).Valid() {
		t.Error("DType(99) is valid")
	}
}

func TestFP8E4M3(t *testing.T) {
	// Every pattern against the format's definition.
	for c := range 256 {
		b := byte(c)
		got := FP8E4M3ToFloat32(b)
		e, m := int(b>>3&0xf), float64(b&7)
		var want float64
		switch {
		case e == 15 && m == 7:
			if !math.IsNaN(float64(got)) {
				t.Errorf("0x%02x: %v, want NaN", b, got)
			}
			continue
		case e == 0:
			want = m / 8 * math.Pow(2, -6)
		default:
			want = (1 + m/8) * math.Pow(2, float64(e-7))
		}
		if b&0x80 != 0 {
			want = -want
		}
		if float64(got) != want || math.Signbit(float64(got)) != (b&0x80 != 0) {
			t.Errorf("0x%02x: %v, want %v", b, got, want)
		}
		// Every finite pattern survives a round trip.
		if back := Float32ToFP8E4M3(got); back != b {
			t.Errorf("0x%02x: round trip gives 0x%02x", b, back)
		}
	}
	for _, c := range []struct {
		f    float32
		want byte
	}{
		{1, 0x38}, {-1, 0xb8}, {448, 0x7e}, {-448, 0xfe},
		{1.0625, 0x38},           // halfway between 1 (0x38) and 1.125 (0x39): the even code
		{1.1875, 0x3a},           // halfway between 1.125 (0x39) and 1.25 (0x3a): the even code
		{1.07, 0x39},             // nearer 1.125
		{460, 0x7e}, {464, 0x7e}, // below and at the tie with 480: 448
		{465, 0x7f}, {-500, 0xff}, // beyond: NaN, with the sign
		{float32(math.Inf(1)), 0x7f}, // no infinities in e4m3fn
		{float32(math.NaN()), 0x7f},
		{0x1p-10, 0x00}, {0x1.8p-9, 0x02}, // subnormal ties to even: 0 and 2^-8
		{0x1p-12, 0x00}, {float32(math.Copysign(0, -1)), 0x80},
	} {
		if got := Float32ToFP8E4M3(c.f); got != c.want {
			t.Errorf("Float32ToFP8E4M3(%v) = 0x%02x, want 0x%02x", c.f, got, c.want)
		}
	}
	// The array helpers use them.
	b := EncodeFloat32(FP8E4M3, []float32{1, -2, 0.5})
	if len(b) != 3 || LoadFloat32(FP8E4M3, b, 1) != -2 || DecodeFloat32(FP8E4M3, b)[2] != 0.5 {
		t.Errorf("EncodeFloat32/LoadFloat32/DecodeFloat32 fp8: % x", b)
	}
	StoreFloat32(FP8E4M3, b, 0, 448)
	if b[0] != 0x7e {
		t.Errorf("StoreFloat32(fp8, 448) wrote 0x%02x", b[0])
	}
}
