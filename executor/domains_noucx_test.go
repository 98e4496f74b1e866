//go:build !ucx

package executor_test

import (
	"os"
	"strings"
	"testing"
	"time"
)

// TestMultiProcessDomainsNeedUCX: several domains across processes need
// the UCX rail; built without it, every rank's executor.New fails at once
// with an error that names the build tag (not a hang, not a crash).
func TestMultiProcessDomainsNeedUCX(t *testing.T) {
	if os.Getenv("GOEP_MP_MODE") != "" {
		t.Skip("child")
	}
	start := time.Now()
	got, _, log := runWorldN(t, "spawn", "cases", 4, time.Minute, "GOEP_RANKS_PER_DOMAIN=2")
	for r := range 4 {
		if !strings.Contains(got[r].Err, "-tags ucx") {
			t.Errorf("rank %d: %q, want an error naming -tags ucx\n%s", r, got[r].Err, log)
		}
	}
	t.Logf("rank 0: %s", got[0].Err)
	if d := time.Since(start); d > 30*time.Second {
		t.Errorf("the world took %v to fail", d)
	}
}
