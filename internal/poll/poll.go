package poll

import (
	"context"
	"runtime"
	"time"
)

// Policy is how Until waits between queries.
type Policy struct {
	// Spin is how long after the first query Until queries back to back,
	// yielding the processor (runtime.Gosched) between queries. 0 sleeps
	// from the first query on.
	Spin time.Duration
	// First is the first sleep after the spin; each later sleep is twice
	// the one before, up to Most. Both must be positive.
	First, Most time.Duration
}

// Until calls query until it reports done or fails, or ctx ends. It returns
// query's error as is (a query that fails is done, whatever it reports),
// nil once query reports done, and context.Cause(ctx) when ctx ends first.
// It is this loop, except that a sleep ends early when ctx ends (and one
// timer serves all the sleeps):
//
//	spinUntil := time.Now().Add(p.Spin)
//	delay := p.First
//	for {
//		done, err := query()
//		if err != nil || done {
//			return err
//		}
//		if ctx.Err() != nil {
//			return context.Cause(ctx)
//		}
//		if time.Now().Before(spinUntil) {
//			runtime.Gosched()
//			continue
//		}
//		time.Sleep(delay)
//		delay = min(2*delay, p.Most)
//	}
//
// query runs on the caller's goroutine, once before any wait and once more
// after a sleep that ctx cut short, so work that completed as ctx ended is
// reported done.
func Until(ctx context.Context, p Policy, query func() (bool, error)) error {
	spinUntil := time.Now().Add(p.Spin)
	delay := p.First
	var timer *time.Timer
	for {
		done, err := query()
		if err != nil || done {
			return err
		}
		if ctx.Err() != nil {
			return context.Cause(ctx)
		}
		if time.Now().Before(spinUntil) {
			runtime.Gosched()
			continue
		}
		if timer == nil {
			timer = time.NewTimer(delay)
			defer timer.Stop()
		} else {
			timer.Reset(delay)
		}
		select {
		case <-timer.C:
		case <-ctx.Done():
		}
		delay = min(2*delay, p.Most)
	}
}
