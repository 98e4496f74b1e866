package device

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestReadHostMemoryAvailable(t *testing.T) {
	const meminfo = "MemTotal:       32000000 kB\nMemFree:         1000000 kB\nMemAvailable:   20000000 kB\n"
	for _, tc := range []struct {
		name  string
		files map[string]string
		want  int64
		ok    bool
	}{
		{"meminfo", map[string]string{"proc/meminfo": meminfo}, 20000000 * 1024, true},
		{"cgroup v2 below", map[string]string{"proc/meminfo": meminfo,
			"sys/fs/cgroup/memory.max": "8589934592\n", "sys/fs/cgroup/memory.current": "1073741824\n"}, 7 << 30, true},
		{"cgroup v2 above", map[string]string{"proc/meminfo": meminfo,
			"sys/fs/cgroup/memory.max": "109951162777600\n", "sys/fs/cgroup/memory.current": "0\n"}, 20000000 * 1024, true},
		{"cgroup v2 no limit", map[string]string{"proc/meminfo": meminfo,
			"sys/fs/cgroup/memory.max": "max\n", "sys/fs/cgroup/memory.current": "1\n"}, 20000000 * 1024, true},
		{"cgroup v2 over its limit", map[string]string{"proc/meminfo": meminfo,
			"sys/fs/cgroup/memory.max": "100\n", "sys/fs/cgroup/memory.current": "200\n"}, 0, true},
		{"cgroup v1", map[string]string{"proc/meminfo": meminfo,
			"sys/fs/cgroup/memory/memory.limit_in_bytes": "4294967296\n", "sys/fs/cgroup/memory/memory.usage_in_bytes": "0\n"}, 4 << 30, true},
		{"cgroup only", map[string]string{
			"sys/fs/cgroup/memory.max": "1024\n", "sys/fs/cgroup/memory.current": "24\n"}, 1000, true},
		{"nothing", map[string]string{}, 0, false},
		{"no MemAvailable", map[string]string{"proc/meminfo": "MemTotal: 1 kB\n"}, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			for name, body := range tc.files {
				p := filepath.Join(root, name)
				if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			got, ok := readHostMemoryAvailable(root)
			if ok != tc.ok || (ok && got != tc.want) {
				t.Fatalf("got %d, %v; want %d, %v", got, ok, tc.want, tc.ok)
			}
		})
	}
}

// allocFree allocates n bytes on s and frees them, and waits until the
// free has run (the region is then pooled or unmapped).
func allocFree(t *testing.T, s *HostStream, n int) {
	t.Helper()
	b, err := s.Alloc(n)
	if err != nil {
		t.Fatalf("alloc of %d bytes: %v", n, err)
	}
	s.Free(b)
	if err := s.Synchronize(t.Context()); err != nil {
		t.Fatal(err)
	}
}

// TestHostAllocBeyondMemory: an allocation larger than the host memory
// available is an error naming both sizes, after the pool has been given
// back; one that fits once the pool is given back succeeds.
func TestHostAllocBeyondMemory(t *testing.T) {
	h, s := newStream(t)
	const mib = 1 << 20
	old := hostMemoryAvailable
	t.Cleanup(func() { hostMemoryAvailable = old })
	// 48 MiB in all, less what the pool holds (pooled pages stay resident).
	hostMemoryAvailable = func() (int64, bool) {
		h.mu.Lock()
		defer h.mu.Unlock()
		return 48*mib - int64(h.pooled), true
	}
	allocFree(t, s, 30*mib)
	if h.pooled != 32*mib {
		t.Fatalf("pool holds %d bytes, want the freed 32 MiB region", h.pooled)
	}
	// 40 MiB (a new 64 MiB region): more than the 16 MiB left, less than
	// the 48 once the pool is given back.
	b, err := s.Alloc(40 * mib)
	if err != nil {
		t.Fatalf("alloc of 40 MiB with 48 MiB free once the pool is given back: %v", err)
	}
	if h.pooled != 0 {
		t.Fatalf("pool still holds %d bytes", h.pooled)
	}
	s.Free(b)
	_, err = s.Alloc(100 * mib)
	if serr := s.Synchronize(t.Context()); serr != nil {
		t.Fatal(serr)
	}
	if err == nil || !strings.Contains(err.Error(), "host alloc of 100.0 MiB: only 48.0 MiB of host memory is available") {
		t.Fatalf("alloc of 100 MiB with 48 MiB available: got %v", err)
	}
	if n := h.LiveBuffers(); n != 0 {
		t.Fatalf("%d buffers live after the refused alloc", n)
	}
}

// TestHostPoolLimit: the pool keeps at most an eighth of the host memory
// available when the backend was made; a larger freed region is unmapped.
func TestHostPoolLimit(t *testing.T) {
	const mib = 1 << 20
	old := hostMemoryAvailable
	t.Cleanup(func() { hostMemoryAvailable = old })
	hostMemoryAvailable = func() (int64, bool) { return 64 * mib, true }
	h, s := newStream(t)
	if h.poolLimit != 8*mib {
		t.Fatalf("pool limit %d, want 8 MiB (64 MiB / 8)", h.poolLimit)
	}
	allocFree(t, s, 6*mib)
	allocFree(t, s, 12*mib)
	if want := sizeClass(6*mib + 2*guardSize); h.pooled != want {
		t.Fatalf("pool holds %d bytes, want the %d-byte region of the 6 MiB buffer alone", h.pooled, want)
	}
	hostMemoryAvailable = func() (int64, bool) { return 0, false }
	if h := NewHost(); h.poolLimit != maxPoolLimit {
		t.Fatalf("pool limit %d with the memory unknown, want %d", h.poolLimit, maxPoolLimit)
	}
}
