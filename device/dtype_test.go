package device

import "testing"

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
