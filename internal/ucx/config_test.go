package ucx

import "testing"

func TestMemoryTypesString(t *testing.T) {
	for _, c := range []struct {
		m    MemoryTypes
		want string
		cuda bool
	}{
		{0, "none", false},
		{MemoryHost, "host", false},
		{MemoryHost | MemoryCUDA | MemoryCUDAManaged, "host, cuda, cuda-managed", true},
		{MemoryHost | MemoryROCm | MemoryROCmManaged | 1<<9, "host, rocm, rocm-managed, 0x200", false},
	} {
		if got := c.m.String(); got != c.want {
			t.Errorf("MemoryTypes(%#x).String() = %q, want %q", uint64(c.m), got, c.want)
		}
		if c.m.CUDA() != c.cuda {
			t.Errorf("MemoryTypes(%#x).CUDA() = %v", uint64(c.m), c.m.CUDA())
		}
	}
}
