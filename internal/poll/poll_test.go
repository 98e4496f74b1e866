package poll

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestUntilDone: Until returns nil once the query reports done, whether
// that comes at the first query, while it spins or after it has slept.
func TestUntilDone(t *testing.T) {
	p := Policy{Spin: 200 * time.Microsecond, First: 20 * time.Microsecond, Most: 500 * time.Microsecond}
	for _, after := range []time.Duration{0, 50 * time.Microsecond, 3 * time.Millisecond} {
		start := time.Now()
		calls := 0
		err := Until(t.Context(), p, func() (bool, error) {
			calls++
			return time.Since(start) >= after, nil
		})
		if err != nil || calls == 0 {
			t.Errorf("done after %v: err %v, %d queries", after, err, calls)
		}
	}
}

// TestUntilQueryError: a query's error ends the wait and comes back as it
// is, whether it comes while Until spins or after it has slept, and
// whatever the query says of done.
func TestUntilQueryError(t *testing.T) {
	boom := errors.New("boom")
	p := Policy{Spin: time.Millisecond, First: 100 * time.Microsecond, Most: time.Millisecond}
	for _, tc := range []struct {
		name  string
		after time.Duration
		done  bool
	}{
		{"first query", 0, false},
		{"while spinning", 100 * time.Microsecond, false},
		{"after sleeping", 5 * time.Millisecond, false},
		{"done and failed", 0, true},
	} {
		start := time.Now()
		err := Until(t.Context(), p, func() (bool, error) {
			if time.Since(start) >= tc.after {
				return tc.done, boom
			}
			return false, nil
		})
		if err != boom {
			t.Errorf("%s: %v, want the query's error itself", tc.name, err)
		}
	}
}

// TestUntilContext: when ctx ends first, Until returns its cause, whether
// ctx ends while Until spins or while it sleeps (a sleep ends then, not at
// its timer); with ctx already done it still asks once, and work that is
// done wins.
func TestUntilContext(t *testing.T) {
	cause := errors.New("deadline of the test")
	for _, tc := range []struct {
		name string
		p    Policy
	}{
		{"spinning", Policy{Spin: time.Hour, First: time.Hour, Most: time.Hour}},
		{"sleeping", Policy{Spin: 0, First: time.Hour, Most: time.Hour}},
	} {
		ctx, cancel := context.WithCancelCause(t.Context())
		time.AfterFunc(5*time.Millisecond, func() { cancel(cause) })
		start := time.Now()
		err := Until(ctx, tc.p, func() (bool, error) { return false, nil })
		if err != cause {
			t.Errorf("%s: %v, want the context's cause", tc.name, err)
		}
		if d := time.Since(start); d > time.Minute {
			t.Errorf("%s: returned after %v: the sleep did not end with ctx", tc.name, d)
		}
	}

	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	calls := 0
	if err := Until(ctx, Policy{First: time.Hour, Most: time.Hour}, func() (bool, error) { calls++; return true, nil }); err != nil || calls != 1 {
		t.Errorf("done work, ctx already cancelled: %v after %d queries, want nil after 1", err, calls)
	}
	calls = 0
	if err := Until(ctx, Policy{First: time.Hour, Most: time.Hour}, func() (bool, error) { calls++; return false, nil }); !errors.Is(err, context.Canceled) || calls != 1 {
		t.Errorf("pending work, ctx already cancelled: %v after %d queries, want context.Canceled after 1", err, calls)
	}
}

// TestUntilPhases checks the two phases: back-to-back queries for Spin,
// then sleeps that start at First and double up to Most. Timers never fire
// early, so each gap after the spin is at least its sleep; they may fire
// late, so the cap is checked by counting queries, with a wide margin.
func TestUntilPhases(t *testing.T) {
	const (
		spin  = 20 * time.Millisecond
		first = time.Millisecond
		most  = 4 * time.Millisecond
		total = 80 * time.Millisecond
	)
	// The clock starts at the first query, after Until has set the end of
	// its spin: a query at spin or later is past it, so the gaps that follow
	// are sleeps, each at least as long as the sleeps' sequence says (if the
	// sleeps began a query earlier, they are even longer).
	var start time.Time
	var at []time.Duration
	err := Until(t.Context(), Policy{Spin: spin, First: first, Most: most}, func() (bool, error) {
		if start.IsZero() {
			start = time.Now()
		}
		at = append(at, time.Since(start))
		return at[len(at)-1] >= total, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	spun := 0
	for spun < len(at) && at[spun] < spin {
		spun++
	}
	if spun < 10 {
		t.Errorf("%d queries in the %v spin, want many", spun, spin)
	}
	want := first
	for i := spun + 1; i < len(at); i++ {
		if gap := at[i] - at[i-1]; gap < want {
			t.Errorf("query %d came %v after the one before, want at least %v (sleeps %v doubling to %v)", i, gap, want, first, most)
		}
		want = min(2*want, most)
	}

	// Sleeping from the start, capped at 200µs: 100ms take many queries,
	// where sleeps doubling without a cap would take about ten.
	start = time.Now()
	n := 0
	if err := Until(t.Context(), Policy{First: 100 * time.Microsecond, Most: 200 * time.Microsecond}, func() (bool, error) {
		n++
		return time.Since(start) >= 100*time.Millisecond, nil
	}); err != nil {
		t.Fatal(err)
	}
	if n < 30 {
		t.Errorf("%d queries in 100ms with sleeps of at most 200µs, want at least 30", n)
	}
}
