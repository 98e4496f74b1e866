package nvlink

import (
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/goep/goep/device"
)

// Futex operations (linux/futex.h); golang.org/x/sys does not name them.
const (
	futexWaitOp = 0
	futexWakeOp = 1
)

// futexCalls counts the futex system calls made (tests: none while every
// peer is in this process).
var futexCalls atomic.Int64

// futexWait sleeps until *w != val, a wake-up, or the timeout. The futex is
// not private: the word lives in memory shared with other processes.
func futexWait(w *atomic.Uint32, val uint32, timeout time.Duration) {
	if timeout <= 0 {
		return
	}
	futexCalls.Add(1)
	ts := unix.NsecToTimespec(timeout.Nanoseconds())
	// EAGAIN (the value changed), EINTR and ETIMEDOUT all mean: look again.
	_, _, _ = unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(w)), futexWaitOp, uintptr(val), uintptr(unsafe.Pointer(&ts)), 0, 0)
}

// futexWake wakes every waiter on w, in any process.
func futexWake(w *atomic.Uint32) {
	futexCalls.Add(1)
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

// An inbox is where a rank's waiter sleeps when every rank of its domain
// is in this process: the rank whose store completes a phase wakes it
// through a channel, far cheaper than a futex, which parks an OS thread.
// Only the rank's own goroutine (the one that runs its exchanges) sleeps
// on it (Domain.wait).
type inbox struct {
	ch     chan struct{} // one pending wake-up at most
	asleep atomic.Bool
	// exposed are the buffers the owner exposes in its current exchange
	// (Call.Buffers), for its peers in this process: stored before the
	// owner's epoch store that publishes its header, loaded by a peer after
	// its load that sees it, and stored again only in the owner's next
	// exchange, which begins after every peer's done of this one (an
	// exchange that exposes buffers has a done phase). A peer in this
	// process takes them from here instead of through the handle registry
	// (no lock, no map). Atomic, so that the Go memory model (and
	// the race detector, which does not see the control blocks' atomics
	// outside the Go heap) orders the owner's writes of a buffer before a
	// peer's reads of it.
	exposed [MaxBuffers]atomic.Pointer[device.Buffer]
	// peerWakes counts the wake-ups peers sent (tests).
	peerWakes atomic.Int64
}

func newInbox() *inbox { return &inbox{ch: make(chan struct{}, 1)} }

// wake makes the inbox's next (or current) sleep return.
func (b *inbox) wake() {
	select {
	case b.ch <- struct{}{}:
	default: // a wake-up is already pending
	}
}

// watchdog wakes this process's sleeping waiters every livenessInterval,
// so that a waiter whose peers never store (a hung or lost rank) looks at
// its deadline and its peers' processes without a timer of its own: a
// waiter that is woken only when its wait is over costs no timer per call.
// It runs while some domain of the process is open.
var watchdog struct {
	mu      sync.Mutex
	boxes   map[*inbox]struct{}
	running bool
}

// watch registers b with the watchdog, starting it if needed.
func watch(b *inbox) {
	watchdog.mu.Lock()
	defer watchdog.mu.Unlock()
	if watchdog.boxes == nil {
		watchdog.boxes = map[*inbox]struct{}{}
	}
	watchdog.boxes[b] = struct{}{}
	if !watchdog.running {
		watchdog.running = true
		go tick()
	}
}

// unwatch removes b; the watchdog stops at its next tick once none is left.
func unwatch(b *inbox) {
	watchdog.mu.Lock()
	delete(watchdog.boxes, b)
	watchdog.mu.Unlock()
}

func tick() {
	for {
		time.Sleep(livenessInterval)
		watchdog.mu.Lock()
		if len(watchdog.boxes) == 0 {
			watchdog.running = false
			watchdog.mu.Unlock()
			return
		}
		for b := range watchdog.boxes {
			if b.asleep.Load() {
				b.wake()
			}
		}
		watchdog.mu.Unlock()
	}
}
