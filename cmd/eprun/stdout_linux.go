package main

import (
	"errors"
	"io"
	"os"
	"syscall"
)

// checkStdout refuses a stdout that was closed when eprun started
// (eprun bench >&-), where the results would be lost without an error: the
// Go runtime opens the null device on a standard descriptor that is closed
// at start, for reading and writing, before eprun's code runs. A shell's
// >/dev/null (and os/exec's discarded output) opens it for writing only,
// and is accepted. A stdout that is not an *os.File (tests) is accepted.
func checkStdout(w io.Writer) error {
	f, ok := w.(*os.File)
	if !ok || !reopenedNull(f) {
		return nil
	}
	return errors.New("stdout is closed (the Go runtime put the null device, open for reading and writing, in its place), so the results would be lost: give eprun a stdout (>/dev/null to discard them)")
}

// reopenedNull reports whether f is the null device open for reading and
// writing.
func reopenedNull(f *os.File) bool {
	fi, err := f.Stat()
	if err != nil {
		return false
	}
	null, err := os.Stat(os.DevNull)
	if err != nil || !os.SameFile(fi, null) {
		return false
	}
	sc, err := f.SyscallConn()
	if err != nil {
		return false
	}
	var flags uintptr
	var errno syscall.Errno
	if err := sc.Control(func(fd uintptr) {
		flags, _, errno = syscall.Syscall(syscall.SYS_FCNTL, fd, syscall.F_GETFL, 0)
	}); err != nil || errno != 0 {
		return false
	}
	return flags&syscall.O_ACCMODE == syscall.O_RDWR
}
