//go:build linux && cgo

package launcher

import (
	"testing"

	"golang.org/x/sys/unix"
)

// TestBindCPUs binds to the CPUs already allowed (a no-op that exercises
// every thread's sched_setaffinity) and to none of them (kept as is).
func TestBindCPUs(t *testing.T) {
	var cur unix.CPUSet
	if err := unix.SchedGetaffinity(0, &cur); err != nil {
		t.Fatal(err)
	}
	n, err := bindCPUs(cur)
	if err != nil || n != cur.Count() {
		t.Errorf("bind to the current %d CPUs: %d, %v", cur.Count(), n, err)
	}
	var none unix.CPUSet
	if n, err := bindCPUs(none); err != nil || n != 0 {
		t.Errorf("bind to no CPU: %d, %v; want 0 and the binding kept", n, err)
	}
	var after unix.CPUSet
	if err := unix.SchedGetaffinity(0, &after); err != nil || after != cur {
		t.Errorf("affinity changed: %v -> %v (%v)", cur, after, err)
	}
}
