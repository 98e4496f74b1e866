package rdma

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// process identifies a rank's process so that peers on the same host can
// tell whether it is still alive: the host's boot id (kernel-random per
// boot), the pid and the pid's start time (so a reused pid is not mistaken
// for the rank).
type process struct {
	Host  string // boot id, "" where /proc does not say
	PID   int
	Start uint64 // field 22 of /proc/PID/stat, in clock ticks since boot
}

// self describes this process.
func self() process {
	p := process{PID: os.Getpid()}
	if b, err := os.ReadFile("/proc/sys/kernel/random/boot_id"); err == nil {
		p.Host = strings.TrimSpace(string(b))
	}
	p.Start, _ = startTime(p.PID)
	return p
}

// sameHost reports whether q runs on this host (and can be checked).
func (p process) sameHost(q process) bool {
	return p.Host != "" && p.Host == q.Host && q.Start != 0
}

// alive reports whether q's process still runs (not a zombie); only
// meaningful for a process on this host.
func (q process) alive() bool {
	st, err := startTime(q.PID)
	return err == nil && st == q.Start
}

// startTime is pid's start time from /proc/PID/stat, or an error if the
// process is gone or a zombie.
func startTime(pid int) (uint64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// "pid (comm) S ppid ...": the fields after the last ')'; the state is
	// field 3, the start time field 22.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: no command field", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 20 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f)+2)
	}
	if f[0] == "Z" || f[0] == "X" {
		return 0, fmt.Errorf("process %d has exited", pid)
	}
	return strconv.ParseUint(f[19], 10, 64)
}
