package comm

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"
)

// slack is how late something due now may come on a loaded machine (a
// goroutine or process not scheduled for a while): a bound on promptness
// that a loaded machine meets, and far below the deadline of any wait that
// a hang would run into.
const slack = 2 * time.Second

// hang bounds the waits of tests for something that must happen at once
// (a release, an error): only a hang reaches it.
const hang = 30 * time.Second

// expiringCtx is a context whose deadline comes at an event rather than a
// time: once expired, Done is closed and Err is context.DeadlineExceeded,
// which the groups treat as a deadline that passed. It has no Deadline,
// so that writes under it are bounded as for a context without one.
type expiringCtx struct {
	context.Context
	done chan struct{}
	once sync.Once
	at   time.Time // when it expired; read after done is closed
}

func (c *expiringCtx) Done() <-chan struct{}       { return c.done }
func (c *expiringCtx) Deadline() (time.Time, bool) { return time.Time{}, false }

func (c *expiringCtx) Err() error {
	select {
	case <-c.done:
		return context.DeadlineExceeded
	default:
		return nil
	}
}

// expire makes the deadline come now.
func (c *expiringCtx) expire() {
	c.once.Do(func() {
		c.at = time.Now()
		close(c.done)
	})
}

// expiredAt is when c expired; call it only after Done is closed.
func (c *expiringCtx) expiredAt() time.Time {
	<-c.done
	return c.at
}

// expireWhen returns a context that expires once cond holds: a timeout
// test's deadline that comes once the ranks that do arrive have arrived,
// never before, however slow the machine. cond is polled every
// millisecond until then (or the test ends).
func expireWhen(t *testing.T, cond func() bool) *expiringCtx {
	c := &expiringCtx{Context: context.Background(), done: make(chan struct{})}
	go func() {
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		for !cond() {
			select {
			case <-tick.C:
			case <-t.Context().Done():
				return
			}
		}
		c.expire()
	}()
	return c
}

// waitFor waits until cond holds, polling every millisecond, and fails the
// test if it does not within hang.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(hang)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited %v for %s", hang, what)
		}
		time.Sleep(time.Millisecond)
	}
}

// wantClosed waits for the error of a call (what) that a closing peer
// must release, and checks it is ErrClosed.
func wantClosed(t *testing.T, what string, done <-chan error) {
	t.Helper()
	select {
	case err := <-done:
		if !errors.Is(err, ErrClosed) {
			t.Errorf("%s: %v, want ErrClosed", what, err)
		}
	case <-time.After(hang):
		t.Fatalf("a closed peer left the %s hanging", what)
	}
}

// serverOf is the rendezvous server of a world whose rank 0 is g.
func serverOf(g Group) *tcpServer { return g.(*tcpGroup).c.srv }

// arrived reports whether the server holds a round of group gid that the
// given group ranks have all contributed to.
func arrived(s *tcpServer, gid uint64, ranks ...int) func() bool {
	return func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		g := s.groups[gid]
		if g == nil {
			return false
		}
	rounds:
		for _, rd := range g.rounds {
			for _, r := range ranks {
				if !rd.arrived[r] {
					continue rounds
				}
			}
			return true
		}
		return false
	}
}

// seen reports whether the server has had a hello from each of ranks.
func seen(server func() *tcpServer, ranks ...int) func() bool {
	return func() bool {
		s := server()
		if s == nil {
			return false
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		for _, r := range ranks {
			if !s.seen[r] {
				return false
			}
		}
		return true
	}
}

// hookServer returns the rendezvous server that this process starts next
// (nil until it has), for tests whose rank 0 has not returned from NewTCP.
func hookServer(t *testing.T) (server func() *tcpServer) {
	var mu sync.Mutex
	var srv *tcpServer
	testHookServer = func(s *tcpServer) {
		mu.Lock()
		defer mu.Unlock()
		if srv == nil {
			srv = s
		}
	}
	t.Cleanup(func() { testHookServer = nil })
	return func() *tcpServer {
		mu.Lock()
		defer mu.Unlock()
		return srv
	}
}

// hasParts reports whether this rank of g holds, in an AllToAll of g, the
// parts of every group rank in from.
func hasParts(g Group, from ...int) func() bool {
	tg := g.(*tcpGroup)
	return func() bool {
		c := tg.c
		c.mu.Lock()
		defer c.mu.Unlock()
	rounds:
		for key, rd := range c.mesh.rounds {
			if key.gid != tg.gid {
				continue
			}
			for _, i := range from {
				if _, ok := rd.parts[tg.members[i]]; !ok {
					continue rounds
				}
			}
			return true
		}
		return false
	}
}

// inCall reports whether this rank of g has started an AllToAll of g.
func inCall(g Group) func() bool {
	tg := g.(*tcpGroup)
	return func() bool {
		c := tg.c
		c.mu.Lock()
		defer c.mu.Unlock()
		for key := range c.mesh.rounds {
			if key.gid == tg.gid && key.seq >= c.mesh.next[tg.gid] {
				return true
			}
		}
		return false
	}
}
