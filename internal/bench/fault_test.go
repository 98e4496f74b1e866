package bench

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/goep/goep/comm"
)

// faultConfig is a small run of two cases whose every step takes well
// under a second.
func faultConfig() Config {
	c := Defaults()
	c.Ranks, c.Experts, c.TopK, c.Hidden, c.Tokens, c.Iters, c.Warmup = 4, 8, Ints{2}, Ints{32}, Ints{8, 16}, 2, 1
	return c
}

// stoppedTimeout is the GOEP_TIMEOUT of the tests of a rank that stops.
const stoppedTimeout = 2 * time.Second

// TestHarnessTimeout: the harness's collectives wait GOEP_TIMEOUT plus a
// tenth of it (at least 1 s), not a fixed time; an invalid GOEP_TIMEOUT is
// an error.
func TestHarnessTimeout(t *testing.T) {
	for _, tc := range []struct {
		env  string
		want time.Duration
		err  string
	}{
		{"", 66 * time.Second, ""},
		{"5s", 6 * time.Second, ""},
		{"100", 110 * time.Second, ""},
		{"0.5", 1500 * time.Millisecond, ""},
		{"2562047h", 1<<63 - 1, ""}, // no overflow
		{"soon", 0, `GOEP_TIMEOUT="soon"`},
		{"-3s", 0, `GOEP_TIMEOUT="-3s"`},
	} {
		t.Setenv("GOEP_TIMEOUT", tc.env)
		got, err := HarnessTimeout()
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("GOEP_TIMEOUT=%q: %v, %v; want an error naming it", tc.env, got, err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("GOEP_TIMEOUT=%q: %v, %v; want %v", tc.env, got, err, tc.want)
		}
	}
	t.Setenv("GOEP_TIMEOUT", "soon")
	if _, err := Run(t.Context(), faultConfig(), Options{}); err == nil || !strings.Contains(err.Error(), "GOEP_TIMEOUT") {
		t.Errorf("Run with GOEP_TIMEOUT=soon: %v", err)
	}
}

// TestStoppedRankNamed: a rank that stops (its goroutine blocks as it
// begins a step, and never comes to the next collective) makes every other
// rank fail within GOEP_TIMEOUT plus the harness's margin, with a
// *comm.TimeoutError naming it, wherever it stops: at the barrier before a
// call (the harness's; it waited 10 minutes), in the copy baseline, in the
// a2a baseline (its exchanges had no bound at all), at the gather of the
// results. Each rank runs RunRank on its own group, as one process of a
// launched world does; the case that completed before the stop is kept.
func TestStoppedRankNamed(t *testing.T) {
	t.Setenv("GOEP_TIMEOUT", stoppedTimeout.String())
	bound, err := HarnessTimeout()
	if err != nil {
		t.Fatal(err)
	}
	const stopped = 3
	// The step begins once a case, the gather twice (the calls', the a2a
	// baseline's): stopAt is its second case's first.
	stopAt := map[string]int{"gather": 3}
	for _, step := range []string{CallCombine, "baseline", "a2a/" + CallDispatchPermute, "gather"} {
		t.Run(strings.ReplaceAll(step, "/", "-"), func(t *testing.T) {
			c := faultConfig()
			groups := comm.NewLocal(c.Ranks)
			release := make(chan struct{})
			stop := make(chan time.Time, 1)
			seen := 0 // the stopped rank's cases that began the step
			opt := Options{testHook: func(ctx context.Context, rank int, s string) error {
				if rank != stopped || s != step {
					return nil
				}
				if seen++; seen < max(2, stopAt[step]) { // stop in the second case
					return nil
				}
				stop <- time.Now()
				<-release
				return errors.New("released")
			}}
			// Only a hang reaches this deadline: the bound is seconds.
			ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
			defer cancel()
			type result struct {
				rank int
				res  *Result
				err  error
				at   time.Time
			}
			done := make(chan result, c.Ranks)
			for r, g := range groups {
				go func() {
					res, err := RunRank(ctx, c, g, opt)
					done <- result{r, res, err, time.Now()}
				}()
			}
			var t0 time.Time
			select {
			case t0 = <-stop:
			case r := <-done:
				t.Fatalf("rank %d returned before rank %d stopped: %v", r.rank, stopped, r.err)
			}
			for range c.Ranks - 1 {
				r := <-done
				if r.rank == stopped {
					t.Fatalf("the stopped rank returned: %v", r.err)
				}
				var te *comm.TimeoutError
				if !errors.As(r.err, &te) || !slices.Equal(te.Missing, []int{stopped}) {
					t.Errorf("rank %d: %v; want a *comm.TimeoutError naming rank %d", r.rank, r.err, stopped)
				}
				if d := r.at.Sub(t0); d > bound+30*time.Second {
					t.Errorf("rank %d failed %v after rank %d stopped; want within %v (GOEP_TIMEOUT plus its margin)", r.rank, d, stopped, bound)
				}
				if r.err != nil && (strings.Contains(r.err.Error(), "\n") || !strings.Contains(r.err.Error(), "GOEP_TIMEOUT 2s plus 1s")) {
					t.Errorf("rank %d: error %q; want one line naming the bound", r.rank, r.err)
				}
				// The first case (tokens 8) completed on every rank.
				if r.res == nil || len(r.res.Rows) < len(c.Calls) || r.res.Rows[0].Tokens != 8 || r.res.Rows[0].A2A == nil {
					t.Errorf("rank %d: the first case's rows are lost: %+v", r.rank, r.res)
				}
			}
			close(release)
			<-done
			for _, g := range groups {
				g.Close()
			}
		})
	}
}

// TestRunStoppedRank: in process, a rank that stops (until its context is
// cancelled) ends Run with one error, one line, naming the stopped rank as
// the one not heard from; the rows measured before are returned: a stop in
// a case's a2a baseline keeps that case's rows, without the a2a columns.
func TestRunStoppedRank(t *testing.T) {
	t.Setenv("GOEP_TIMEOUT", stoppedTimeout.String())
	c := faultConfig()
	c.Tokens = Ints{8}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute) // only a hang reaches it
	defer cancel()
	res, err := Run(ctx, c, Options{testHook: func(ctx context.Context, rank int, step string) error {
		if rank == 2 && step == "a2a/"+CallCombine {
			<-ctx.Done()
			return ctx.Err()
		}
		return nil
	}})
	var te *comm.TimeoutError
	if !errors.As(err, &te) || !slices.Equal(te.Missing, []int{2}) {
		t.Fatalf("Run: %v; want a *comm.TimeoutError naming rank 2", err)
	}
	if msg := err.Error(); strings.Contains(msg, "\n") || strings.Count(msg, "timed out") != 1 || !strings.Contains(msg, "a2a baseline: ") {
		t.Errorf("error %q: want one line, one timeout, naming the a2a baseline", msg)
	}
	if res == nil || len(res.Rows) != len(c.Calls) {
		t.Fatalf("rows %+v; want the case's %d rows", res, len(c.Calls))
	}
	for _, row := range res.Rows {
		if row.A2A != nil || row.Time.N != c.Iters || row.CheckedRows == 0 || row.Wrong != 0 || row.BaselineGBps <= 0 {
			t.Errorf("%s: a2a %v, time %+v, %d of %d wrong, baseline %v GB/s; want the call's row without the a2a", row.Call, row.A2A, row.Time, row.Wrong, row.CheckedRows, row.BaselineGBps)
		}
	}
}

// TestFailedBaselineKeepsRows: a rank whose a2a baseline fails, in the
// second case, ends Run with its error named once (not once per rank or
// per wrapper), and the rows of the first case, and of the second's calls
// without their a2a columns, are returned, measured and checked.
func TestFailedBaselineKeepsRows(t *testing.T) {
	c := faultConfig()
	boom := errors.New("boom: the exchange broke")
	seen := 0 // rank 1's a2a dispatches begun
	res, err := Run(t.Context(), c, Options{testHook: func(ctx context.Context, rank int, step string) error {
		if rank == 1 && step == "a2a/"+CallDispatch {
			if seen++; seen == 2 {
				return boom
			}
		}
		return nil
	}})
	if !errors.Is(err, boom) {
		t.Fatalf("Run: %v; want the injected error", err)
	}
	msg := err.Error()
	if strings.Contains(msg, "\n") || strings.Count(msg, "boom") != 1 || !strings.HasPrefix(msg, "rank 1: mode=blocking topk=2 tokens=16 hidden=32 dtype=bf16: a2a baseline: ") {
		t.Errorf("error %q: want one line naming rank 1, the case and the a2a baseline, the cause once", msg)
	}
	n := len(c.Calls)
	if res == nil || len(res.Rows) != 2*n {
		t.Fatalf("rows %+v; want both cases' %d", res, 2*n)
	}
	for i, row := range res.Rows {
		first := i < n
		if (row.A2A != nil) != first || row.Tokens != []int{16, 8}[btoi(first)] || row.Time.N != c.Iters || row.CheckedRows == 0 || row.Wrong != 0 {
			t.Errorf("row %d (%s tokens=%d): a2a %v, time %+v, %d of %d wrong", i, row.Call, row.Tokens, row.A2A, row.Time, row.Wrong, row.CheckedRows)
		}
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// TestCancelEndsRun: cancelling the context (eprun does on SIGINT and
// SIGTERM) ends a run in its course, every rank returning, with the rows
// measured so far: cancelled in the first case's a2a baseline, that case's
// calls.
func TestCancelEndsRun(t *testing.T) {
	c := faultConfig()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	res, err := Run(ctx, c, Options{Progress: func(p Progress) {
		if p.Step == "a2a/"+CallCombine {
			cancel()
		}
	}})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Run: %v; want context.Canceled", err)
	}
	if res == nil || len(res.Rows) != len(c.Calls) || res.Rows[0].Tokens != 8 || res.Rows[0].A2A != nil {
		t.Errorf("rows %+v; want the first case's calls", res)
	}
}
