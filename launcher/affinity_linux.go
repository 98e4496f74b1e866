//go:build linux && cgo

package launcher

import (
	"errors"
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// bindCPUs restricts every thread of the process to the CPUs of want that
// it may already use, and returns how many that is; 0 (and no change) when
// none is. Threads created later inherit the mask.
func bindCPUs(want unix.CPUSet) (int, error) {
	var cur unix.CPUSet
	if err := unix.SchedGetaffinity(0, &cur); err != nil {
		return 0, fmt.Errorf("sched_getaffinity: %w", err)
	}
	var set unix.CPUSet
	for i := range len(set) * 64 {
		if want.IsSet(i) && cur.IsSet(i) {
			set.Set(i)
		}
	}
	n := set.Count()
	if n == 0 {
		return 0, nil
	}
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return 0, fmt.Errorf("list threads: %w", err)
	}
	var errs []error
	for _, t := range tasks {
		tid, err := strconv.Atoi(t.Name())
		if err != nil {
			continue
		}
		if err := unix.SchedSetaffinity(tid, &set); err != nil && !errors.Is(err, unix.ESRCH) {
			errs = append(errs, fmt.Errorf("sched_setaffinity of thread %d: %w", tid, err))
		}
	}
	return n, errors.Join(errs...)
}
