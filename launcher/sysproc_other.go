//go:build !linux

package launcher

import (
	"os"
	"syscall"
	"time"
)

// sysProcAttr puts a rank in its own process group.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}

// writersGone reports whether no process holds the write end of the pipe
// whose read end is f any more; here it cannot tell, so it says no.
func writersGone(*os.File) bool { return false }

// writeNonblock writes b to the pipe f if it takes it within a moment, and
// drops it otherwise.
func writeNonblock(f *os.File, b []byte) {
	f.SetWriteDeadline(time.Now().Add(10 * time.Millisecond))
	_, _ = f.Write(b)
}
