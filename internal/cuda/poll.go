package cuda

import (
	"context"
	"runtime"
	"time"
)

// Polling for the completion of GPU work (Stream.Synchronize and
// Event.Synchronize). Go's timers sleep at least about a millisecond on
// Linux whatever they are asked for, so sleeping from the first poll made
// every wait for work still in flight (a layout's summary, a small
// dispatch) cost a millisecond or more. poll first spins, yielding the
// processor between queries, for spinFor; work that takes longer is then
// polled with sleeps from sleepFirst doubling to sleepMost.
const (
	spinFor    = 200 * time.Microsecond
	sleepFirst = 20 * time.Microsecond
	sleepMost  = 500 * time.Microsecond
)

// poll calls query until it reports done or fails, or ctx is done (then
// it returns ctx's cause).
func poll(ctx context.Context, query func() (bool, error)) error {
	start := time.Now()
	for {
		done, err := query()
		if err != nil || done {
			return err
		}
		if ctx.Err() != nil {
			return context.Cause(ctx)
		}
		if time.Since(start) >= spinFor {
			break
		}
		runtime.Gosched()
	}
	wait := sleepFirst
	t := time.NewTimer(wait)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-t.C:
		}
		done, err := query()
		if err != nil || done {
			return err
		}
		wait = min(2*wait, sleepMost)
		t.Reset(wait)
	}
}
