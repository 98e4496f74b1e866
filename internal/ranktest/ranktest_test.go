package ranktest

import (
	"errors"
	"strings"
	"sync"
	"testing"
)

// TestRun: every rank runs once, concurrently (each waits for all the
// others to start), and its error lands at its index.
func TestRun(t *testing.T) {
	const n = 5
	var started sync.WaitGroup
	started.Add(n)
	bad := errors.New("bad")
	errs := Run(n, func(r int) error {
		started.Done()
		started.Wait() // deadlocks unless all ranks run at once
		if r == 3 {
			return bad
		}
		return nil
	})
	for r, err := range errs {
		if (r == 3) != errors.Is(err, bad) {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	if err := Err(errs); !errors.Is(err, bad) || !strings.Contains(err.Error(), "rank 3: bad") {
		t.Fatalf("Err = %v, want rank 3's error", err)
	}
	if err := Err(make([]error, n)); err != nil {
		t.Fatalf("Err of no errors = %v", err)
	}
}
