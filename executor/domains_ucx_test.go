//go:build ucx

package executor_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/goep/goep/comm"
	"github.com/goep/goep/device"
	"github.com/goep/goep/executor"
)

// Several NVLink domains across processes (tag ucx): the ranks of a world
// are split into emulated domains with GOEP_RANKS_PER_DOMAIN, and the
// inter-domain rail runs over UCX, on TCP (GOEP_RDMA_SHARED_MEMORY unset)
// and on shared memory. The in-process runs of the same worlds use the
// in-process transport, and the property tests check those against the
// reference model, so equal digests mean every output is bit-exact.

// domainShapes are the (ranks, ranks per domain) worlds: 2 domains x 2 and
// 2 domains x 4.
var domainShapes = []struct{ n, d int }{{4, 2}, {8, 4}}

func TestMultiProcessDomains(t *testing.T) {
	if os.Getenv("GOEP_MP_MODE") != "" {
		t.Skip("child")
	}
	for _, sh := range domainShapes {
		t.Run(fmt.Sprintf("%dx%d", sh.n/sh.d, sh.d), func(t *testing.T) {
			t.Setenv("GOEP_RANKS_PER_DOMAIN", strconv.Itoa(sh.d))
			want := inProcessDigestsN(t, sh.n)
			for _, tr := range []string{"tcp", "shm"} {
				for _, how := range []string{"spawn", "mpirun"} {
					t.Run(tr+"/"+how, func(t *testing.T) {
						got, lerr, log := runWorldN(t, how, "cases", sh.n, 3*time.Minute,
							"GOEP_RANKS_PER_DOMAIN="+strconv.Itoa(sh.d), "GOEP_RDMA_SHARED_MEMORY="+strconv.FormatBool(tr == "shm"))
						compareDigests(t, want, reportedDigests(t, got, lerr, log), "across processes", "in-process")
					})
				}
			}
		})
	}
}

// TestMultiProcessDomainsKill kills rank 2 (domain 1) in the middle of a
// dispatch of a 2 x 2 world: every other rank, in both domains, must return
// an error naming it well within GOEP_TIMEOUT. Rank 0 hears it from its rail
// (rank 2 is its peer there), rank 3 from its domain, and rank 1 from rank
// 0, which publishes the failure in their domain's exchange.
func TestMultiProcessDomainsKill(t *testing.T) {
	if os.Getenv("GOEP_MP_MODE") != "" {
		t.Skip("child")
	}
	for _, tr := range []string{"tcp", "shm"} {
		t.Run(tr, func(t *testing.T) {
			got, lerr, log := runWorldN(t, "spawn", "kill", 4, time.Minute,
				"GOEP_RANKS_PER_DOMAIN=2", "GOEP_RDMA_SHARED_MEMORY="+strconv.FormatBool(tr == "shm"))
			checkKilled(t, got, lerr, log)
		})
	}
}

func init() { extraModes["hier-late"] = hierLate }

// hierLate runs, on the host backend with 2 domains of 2 ranks: a good
// dispatch and combine, then a combine that rank 1 joins only after the
// 2 s deadline. Each rank returns (and its process exits) as soon as its
// combine does, so rank 2, failed by rank 0's report, is gone while rank 3
// still waits in its rail round for rank 1. It reports what the two
// combines returned.
func hierLate(ctx context.Context, g comm.Group, b device.Backend) ([]map[string]string, error) {
	cfg := executor.Config{NumExperts: 4 * g.Size(), TopK: 2, Hidden: 64, MaxTokensPerRank: 16, RanksPerDomain: 2, Timeout: 2 * time.Second}
	e, err := executor.New(ctx, g, b, cfg)
	if err != nil {
		return nil, err
	}
	defer e.Close()
	xt, h, err := mpLayout(ctx, e, 9)
	if err != nil {
		return nil, err
	}
	defer h.Close()
	combine := func(late bool) string {
		out, err := e.Dispatch(ctx, h, executor.DispatchInput{X: xt})
		if err != nil {
			return "dispatch: " + err.Error()
		}
		if late {
			time.Sleep(3 * time.Second)
		}
		_, err = e.Combine(ctx, h, executor.CombineInput{Z: out.RecvX})
		if err = errors.Join(err, e.Synchronize(ctx)); err != nil {
			return err.Error()
		}
		return "nil"
	}
	res := map[string]string{"good": combine(false)}
	res["late"] = combine(g.Rank() == 1)
	return []map[string]string{res}, nil
}

// TestMultiProcessDomainsLate: a rank late to a combine is named by the
// ranks that time out waiting for it (rank 0, its domain peer, and rank 2
// through rank 0's report), and rank 3, whose domain peer rank 2 has
// finished the call and exited meanwhile, either completes the combine or
// names rank 1: the loss of a domain peer after the domain half of a
// combine-like call is no failure of its rail round.
func TestMultiProcessDomainsLate(t *testing.T) {
	if os.Getenv("GOEP_MP_MODE") != "" {
		t.Skip("child")
	}
	got, lerr, log := runWorldN(t, "spawn", "hier-late", 4, time.Minute, "GOEP_RANKS_PER_DOMAIN=2", "GOEP_RDMA_SHARED_MEMORY=true")
	for r, d := range reportedSteps(t, got, lerr, log) {
		if d["good"] != "nil" {
			t.Errorf("rank %d: the combine before the late one: %q", r, d["good"])
		}
		late := d["late"]
		switch r {
		case 0, 2:
			if !strings.Contains(late, "timed out") || !strings.Contains(late, "[1]") {
				t.Errorf("rank %d combine with rank 1 late: %q, want a timeout naming rank 1", r, late)
			}
		case 3:
			if late != "nil" && !strings.Contains(late, "[1]") && !strings.Contains(late, "rank 1 ") {
				t.Errorf("rank 3 combine with rank 1 late: %q, want success or rank 1 named", late)
			}
		}
	}
}

// TestMultiProcessDomainsFaults is the fault matrix of
// TestMultiProcessFaults in several domains joined by the rail over UCX
// (shared memory): 4 domains of 1 rank and 2 domains of 2, so that the
// faulty rank's domain peers relay its fault to the other domain.
func TestMultiProcessDomainsFaults(t *testing.T) {
	if os.Getenv("GOEP_MP_MODE") != "" {
		t.Skip("child")
	}
	for _, d := range []int{1, 2} {
		for _, fault := range faultNames {
			for _, how := range faultLaunchers(fault) {
				t.Run(fmt.Sprintf("D=%d/%s/%s", d, how, fault), func(t *testing.T) {
					runFaultWorld(t, how, fault, mpRanks, "GOEP_RANKS_PER_DOMAIN="+strconv.Itoa(d), "GOEP_RDMA_SHARED_MEMORY=true")
				})
			}
		}
	}
}
