package cuda

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestPoll: poll returns when the query reports done, whether that comes
// while it spins or after it sleeps, returns the query's error, and
// returns the context's cause when the work never completes.
func TestPoll(t *testing.T) {
	for _, after := range []time.Duration{0, 50 * time.Microsecond, 3 * time.Millisecond} {
		start := time.Now()
		calls := 0
		err := poll(context.Background(), func() (bool, error) {
			calls++
			return time.Since(start) >= after, nil
		})
		if err != nil || calls == 0 {
			t.Errorf("done after %v: err %v, %d queries", after, err, calls)
		}
	}
	boom := errors.New("boom")
	if err := poll(context.Background(), func() (bool, error) { return false, boom }); !errors.Is(err, boom) {
		t.Errorf("failing query: %v, want boom", err)
	}
	cause := errors.New("deadline of the test")
	ctx, cancel := context.WithCancelCause(context.Background())
	time.AfterFunc(5*time.Millisecond, func() { cancel(cause) })
	if err := poll(ctx, func() (bool, error) { return false, nil }); !errors.Is(err, cause) {
		t.Errorf("never done: %v, want the context's cause", err)
	}
}
