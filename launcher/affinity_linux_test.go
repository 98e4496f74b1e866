//go:build linux && cgo

package launcher

import (
	"os"
	"strconv"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
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

// TestBindDeviceNVML binds this process to GPU 0's CPUs where NVML
// answers, and restores the affinity after.
func TestBindDeviceNVML(t *testing.T) {
	want, err := gpuCPUs(0)
	if err != nil {
		t.Skipf("no NVML here: %v", err)
	}
	var cur unix.CPUSet
	if err := unix.SchedGetaffinity(0, &cur); err != nil {
		t.Fatal(err)
	}
	defer func() {
		tasks, _ := os.ReadDir("/proc/self/task")
		for _, task := range tasks {
			if tid, err := strconv.Atoi(task.Name()); err == nil {
				_ = unix.SchedSetaffinity(tid, &cur)
			}
		}
	}()
	setLauncherEnv(t, nil)
	core, logs := observer.New(zapcore.DebugLevel)
	if err := bindDevice(Env{KindSingle, 0, 1, 0, 1}, zap.New(core)); err != nil {
		t.Fatal(err)
	}
	var after unix.CPUSet
	if err := unix.SchedGetaffinity(0, &after); err != nil {
		t.Fatal(err)
	}
	t.Logf("GPU 0's CPUs: %d of %d allowed; bound to %d; log %v", want.Count(), cur.Count(), after.Count(), logs.All())
	for i := range len(after) * 64 {
		if after.IsSet(i) && (!want.IsSet(i) || !cur.IsSet(i)) {
			t.Errorf("bound to CPU %d, which is not both the GPU's and allowed", i)
		}
	}
}
