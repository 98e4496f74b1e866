package launcher

import (
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// sysProcAttr puts a rank in its own process group, and has the kernel kill
// it if the thread that started it (locked by Spawn until the end) dies.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// writersGone reports whether no process holds the write end of the pipe
// whose read end is f any more (poll says POLLHUP): what is left in it, and
// its end, are there to read.
func writersGone(f *os.File) bool {
	rc, err := f.SyscallConn()
	if err != nil {
		return false
	}
	gone := false
	rc.Control(func(fd uintptr) {
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		if n, err := unix.Poll(fds, 0); err == nil && n == 1 {
			gone = fds[0].Revents&unix.POLLHUP != 0
		}
	})
	return gone
}

// writeNonblock writes b (at most PIPE_BUF bytes, so all or nothing) to the
// pipe f if it has room now, and drops it otherwise.
func writeNonblock(f *os.File, b []byte) {
	rc, err := f.SyscallConn()
	if err != nil {
		return
	}
	rc.Write(func(fd uintptr) bool {
		_, _ = unix.Write(int(fd), b) // the pipe is non-blocking (os.Pipe): EAGAIN when full
		return true
	})
}
