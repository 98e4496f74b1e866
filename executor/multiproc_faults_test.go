package executor_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/goep/goep/comm"
	"github.com/goep/goep/device"
	"github.com/goep/goep/executor"
	"github.com/goep/goep/nvlink"
)

// The fault matrix across processes: DESIGN.md invariant 4's rule of blame
// for ranks that are processes, started as `eprun launch` starts them
// (launcher.Spawn) and by mpirun, and, with tag ucx, in several domains
// joined by the rail over UCX (domains_ucx_test.go). TestFaultMatrix holds
// the same rule for in-process ranks and every call; here the faulty call
// is a dispatch, after a good one has set the world up.

// faultTimeout is Config.Timeout in the fault worlds.
const faultTimeout = 2 * time.Second

// faultRank is the rank that misbehaves: the last one.
func faultRank(g comm.Group) int { return g.Size() - 1 }

func init() { extraModes["fault"] = mpFault }

// mpFault runs one fault world's rank (GOEP_MP_FAULT names the fault):
// a good dispatch, then one in which the last rank
//
//   - hang: does not call until long after the others' deadline, then
//     calls (its own call fails; it is not checked);
//   - die: kills itself instead of calling;
//   - slow: calls half a timeout late;
//   - reject: passes a row count its handle does not have.
//
// Rank 1 always calls late by less than the relay margin. Each rank
// reports how its second dispatch ended: its error's class, the ranks the
// error names, the text, and how long the call took.
func mpFault(ctx context.Context, g comm.Group, b device.Backend) ([]map[string]string, error) {
	fault := os.Getenv("GOEP_MP_FAULT")
	r, bad := g.Rank(), g.Rank() == faultRank(g)
	if fault == "die" && !bad {
		// The launcher stops the world once the victim dies: outlive its
		// SIGTERM long enough to report.
		signal.Ignore(syscall.SIGTERM)
	}
	cfg := executor.Config{NumExperts: 2 * g.Size(), TopK: 2, Hidden: 64, MaxTokensPerRank: 16, Timeout: faultTimeout}
	e, err := executor.New(ctx, g, b, cfg)
	if err != nil {
		return nil, err
	}
	defer e.Close()
	xt, h, err := mpLayout(ctx, e, 11)
	if err != nil {
		return nil, err
	}
	defer h.Close()
	bigger, err := e.NewTensor(device.BF16, xt.Rows()+1, cfg.Hidden)
	if err != nil {
		return nil, err
	}
	dispatch := func(x *device.Tensor) error {
		out, err := e.Dispatch(ctx, h, executor.DispatchInput{X: x})
		if err != nil {
			return err
		}
		defer out.Close()
		return e.Synchronize(ctx)
	}
	if err := dispatch(xt); err != nil {
		return nil, fmt.Errorf("the good dispatch: %w", err)
	}
	// Every rank past the good dispatch before the fault: a rank's call
	// can end before its peers' (over UCX a sender's flush waits for the
	// receiver's acknowledgement), and a victim that died then would fail
	// the good call of a slower peer.
	if err := g.Barrier(ctx); err != nil {
		return nil, fmt.Errorf("the barrier after the good dispatch: %w", err)
	}
	in := xt
	switch {
	case bad && fault == "hang":
		time.Sleep(2*faultTimeout + nvlink.RelayMargin(faultTimeout))
	case bad && fault == "die":
		// Report first: the others wait for every report before they go.
		writeReport(mpResult{Rank: r, Err: "killed itself"})
		syscall.Kill(os.Getpid(), syscall.SIGKILL)
	case bad && fault == "slow":
		time.Sleep(faultTimeout / 2)
	case bad && fault == "reject":
		in = bigger
	case r == 1:
		time.Sleep(nvlink.RelayMargin(faultTimeout) * 3 / 5)
	}
	start := time.Now()
	err = dispatch(in)
	res := map[string]string{"elapsed": time.Since(start).String(), "err": errText(err)}
	res["class"], res["ranks"] = faultClass(err)
	return []map[string]string{res}, nil
}

// faultClass is err's class for the fault matrix (nil, timeout, lost,
// invalid, mismatch or other) and the ranks it names, for a timeout or a
// loss.
func faultClass(err error) (class, ranks string) {
	var te *comm.TimeoutError
	var pe *comm.PeerLostError
	switch {
	case err == nil:
		return "nil", ""
	case errors.Is(err, executor.ErrPeerLost) && errors.As(err, &pe):
		return "lost", fmt.Sprint(pe.Ranks)
	case errors.Is(err, executor.ErrTimeout) && errors.As(err, &te):
		return "timeout", fmt.Sprint(te.Missing)
	case errors.Is(err, executor.ErrInvalidInput):
		return "invalid", ""
	case errors.Is(err, executor.ErrPeerMismatch):
		return "mismatch", ""
	}
	return "other", ""
}

// faultLaunchers are the ways the fault worlds start: launcher.Spawn
// always; mpirun for the faults it lets the ranks report (when a rank
// dies, mpirun kills the others itself).
func faultLaunchers(fault string) []string {
	if fault == "die" {
		return []string{"spawn"}
	}
	return []string{"spawn", "mpirun"}
}

// runFaultWorld runs one fault world of n ranks and checks what every
// rank but the faulty one reported:
//
//   - hang: ErrTimeout naming exactly the faulty rank (a relayed timeout
//     keeps its class and names), within the timeout and the relay margin
//     (plus half a timeout for a loaded machine);
//   - die: ErrPeerLost naming exactly the faulty rank;
//   - slow: success, on every rank;
//   - reject: ErrInvalidInput naming the faulty rank, which gets
//     ErrInvalidInput too; the text says the class once.
func runFaultWorld(t *testing.T, how, fault string, n int, extraEnv ...string) {
	t.Helper()
	got, lerr, log := runWorldN(t, how, "fault", n, 2*time.Minute, append(extraEnv, "GOEP_MP_FAULT="+fault)...)
	bad := n - 1
	if fault == "die" {
		if lerr == nil || !strings.Contains(lerr.Error(), fmt.Sprintf("rank %d", bad)) {
			t.Errorf("launcher error %v, want one naming rank %d\n%s", lerr, bad, log)
		}
		lerr = nil // the victim reported only that it died; the others must report
		got = got[:bad]
	}
	steps := reportedSteps(t, got, lerr, log)
	want := fmt.Sprint([]int{bad})
	limit := faultTimeout + nvlink.RelayMargin(faultTimeout) + faultTimeout/2
	for r, s := range steps {
		class, ranks, text := s["class"], s["ranks"], s["err"]
		elapsed, _ := time.ParseDuration(s["elapsed"])
		switch {
		case fault == "slow":
			if class != "nil" {
				t.Errorf("rank %d: %s with a rank slow within the timeout", r, text)
			}
		case fault == "reject":
			named := strings.Contains(text, "rank "+strconv.Itoa(bad)) || strings.Contains(text, fmt.Sprintf("rank(s) [%d]", bad))
			if class != "invalid" || (r != bad && !named) {
				t.Errorf("rank %d: %s (%s), want ErrInvalidInput naming rank %d", r, text, class, bad)
			}
			if n := strings.Count(text, executor.ErrInvalidInput.Error()); n != 1 {
				t.Errorf("rank %d: %s says %q %d times, want once", r, text, executor.ErrInvalidInput, n)
			}
		case r == bad: // the hung rank's late call: anything
		case fault == "hang":
			if class != "timeout" || ranks != want {
				t.Errorf("rank %d: %s (%s %s), want ErrTimeout naming %s", r, text, class, ranks, want)
			}
			if elapsed > limit {
				t.Errorf("rank %d: failed after %v, more than the timeout and relay margin (%v)", r, elapsed, limit)
			}
		case fault == "die":
			if class != "lost" || ranks != want {
				t.Errorf("rank %d: %s (%s %s), want ErrPeerLost naming %s", r, text, class, ranks, want)
			}
		}
	}
}

// faultNames are the faults of the matrix.
var faultNames = []string{"hang", "die", "slow", "reject"}

// TestMultiProcessFaults is the fault matrix in one domain of 4 processes
// (on the host backend, whose exchange is shared memory between the
// processes), under launcher.Spawn and mpirun; the faults' rules are
// runFaultWorld's.
func TestMultiProcessFaults(t *testing.T) {
	if os.Getenv("GOEP_MP_MODE") != "" {
		t.Skip("child")
	}
	for _, fault := range faultNames {
		for _, how := range faultLaunchers(fault) {
			t.Run(how+"/"+fault, func(t *testing.T) { runFaultWorld(t, how, fault, mpRanks) })
		}
	}
}

// stayAfterReport says whether a child of mode is in a world with a dead
// rank, where it must wait for every rank's report before it goes
// (TestMultiProcessChild).
func stayAfterReport(mode string) bool {
	return mode == "kill" || (mode == "fault" && os.Getenv("GOEP_MP_FAULT") == "die")
}
