package nvlink

import (
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Futex operations (linux/futex.h); golang.org/x/sys does not name them.
const (
	futexWaitOp = 0
	futexWakeOp = 1
)

// futexWait sleeps until *w != val, a wake-up, or the timeout. The futex is
// not private: the word lives in memory shared with other processes.
func futexWait(w *atomic.Uint32, val uint32, timeout time.Duration) {
	if timeout <= 0 {
		return
	}
	ts := unix.NsecToTimespec(timeout.Nanoseconds())
	// EAGAIN (the value changed), EINTR and ETIMEDOUT all mean: look again.
	_, _, _ = unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(w)), futexWaitOp, uintptr(val), uintptr(unsafe.Pointer(&ts)), 0, 0)
}

// futexWake wakes every waiter on w, in any process.
func futexWake(w *atomic.Uint32) {
	_, _, _ = unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(w)), futexWakeOp, uintptr(1<<31-1), 0, 0, 0)
}

// processAlive reports whether pid names a live process (not a zombie).
func processAlive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// The state follows the parenthesised command name: "pid (comm) S ...".
	for i := len(b) - 1; i >= 0; i-- {
		if b[i] == ')' {
			if i+2 < len(b) {
				st := b[i+2]
				return st != 'Z' && st != 'X'
			}
			break
		}
	}
	return true
}

// inProcess wakes the waiters of this process whenever a flag is stored: a
// channel closed and replaced on every round of stores.
var inProcess waker

type waker struct {
	mu sync.Mutex
	ch chan struct{}
}

// changed returns a channel closed at the next store.
func (w *waker) changed() <-chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.ch == nil {
		w.ch = make(chan struct{})
	}
	return w.ch
}

// stored wakes everyone waiting for a change.
func (w *waker) stored() {
	w.mu.Lock()
	if w.ch != nil {
		close(w.ch)
		w.ch = nil
	}
	w.mu.Unlock()
}
