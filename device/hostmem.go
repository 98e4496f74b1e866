package device

import (
	"bufio"
	"bytes"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// HostMemoryAvailable is the host memory this process may still take, in
// bytes: /proc/meminfo's MemAvailable, or less where this process's cgroup
// sets a limit (cgroup v2's memory.max less memory.current, or v1's
// memory.limit_in_bytes less memory.usage_in_bytes: a container's 24 GiB
// on a larger machine). ok is false when neither can be read (not Linux).
func HostMemoryAvailable() (n int64, ok bool) { return hostMemoryAvailable() }

// hostMemoryAvailable is HostMemoryAvailable; tests replace it.
var hostMemoryAvailable = func() (int64, bool) { return readHostMemoryAvailable("/") }

// readHostMemoryAvailable is HostMemoryAvailable with the files read under
// root.
func readHostMemoryAvailable(root string) (avail int64, ok bool) {
	avail = math.MaxInt64
	if kb, err := meminfoKB(filepath.Join(root, "proc/meminfo"), "MemAvailable"); err == nil {
		avail, ok = int64(min(kb, math.MaxInt64/1024))*1024, true
	}
	for _, f := range [][2]string{
		{"sys/fs/cgroup/memory.max", "sys/fs/cgroup/memory.current"},
		{"sys/fs/cgroup/memory/memory.limit_in_bytes", "sys/fs/cgroup/memory/memory.usage_in_bytes"},
	} {
		limit, err1 := readUint(filepath.Join(root, f[0]))
		used, err2 := readUint(filepath.Join(root, f[1]))
		if err1 != nil || err2 != nil {
			continue // no such cgroup file, or "max": no limit
		}
		left := int64(0)
		if limit > used {
			left = int64(min(limit-used, math.MaxInt64))
		}
		avail, ok = min(avail, left), true
		break
	}
	return avail, ok
}

// meminfoKB returns the value in kB of field in a /proc/meminfo file.
func meminfoKB(path, field string) (uint64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		name, rest, found := strings.Cut(sc.Text(), ":")
		if !found || name != field {
			continue
		}
		return strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
	}
	return 0, fmt.Errorf("%s: no %s", path, field)
}

// readUint reads a file holding one unsigned integer ("max" is an error).
func readUint(path string) (uint64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	return strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
}

// formatBytes writes n bytes in GiB, MiB or bytes, for errors.
func formatBytes(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	}
	return fmt.Sprintf("%d bytes", n)
}
