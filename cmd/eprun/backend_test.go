package main

import (
	"strings"
	"testing"

	"github.com/goep/goep/internal/bench"
)

// TestBackendCUDAWithoutTag: --backend cuda (or backend: cuda in a config)
// in a binary built without -tags cuda fails at once, before any rank
// runs, with one line that says how to build it; bench and check alike.
func TestBackendCUDAWithoutTag(t *testing.T) {
	if bench.CUDACompiled {
		t.Skip("built with -tags cuda: --backend cuda is available")
	}
	cfg := writeFile(t, t.TempDir(), "cuda.yaml", "backend: cuda\nranks: 2\nexperts: 4\ntopk: 2\nhidden: 8\ntokens: 4\n")
	for _, args := range [][]string{
		{"bench", "--backend", "cuda"},
		{"bench", "tiny", "--backend=cuda", "--json", "-"},
		{"check", "--backend", "cuda"},
		{"bench", cfg},
		{"check", cfg},
	} {
		code, stdout, stderr := eprun(t, args...)
		if code == 0 {
			t.Errorf("%v: exit 0", args)
		}
		if stdout != "" {
			t.Errorf("%v: wrote to stdout: %q", args, stdout)
		}
		if !strings.HasPrefix(stderr, "eprun: ") || strings.Count(stderr, "\n") != 1 || !strings.Contains(stderr, "build it with -tags cuda") {
			t.Errorf("%v: stderr %q, want one line saying to build with -tags cuda", args, stderr)
		}
		if strings.Contains(stderr, "goroutine ") || strings.Contains(stderr, "Usage:") || strings.Contains(stderr, "eprun: case") {
			t.Errorf("%v: stderr has a stack trace, usage or progress: %q", args, stderr)
		}
	}
	// The flag overrides the config: a cuda config runs on the host.
	if code, _, stderr := eprun(t, "check", cfg, "-q", "--backend", "host"); code != 0 {
		t.Errorf("check %s --backend host: exit %d: %s", cfg, code, stderr)
	}
}

func TestBackendFlag(t *testing.T) {
	stdout, _ := eprunOK(t, append(tiny, "--backend", "host")...)
	if !strings.Contains(stdout, "backend host") || !strings.Contains(stdout, "a2a over local") {
		t.Errorf("--backend host table:\n%s", stdout)
	}
	code, stdout, stderr := eprun(t, "bench", "--backend", "tpu")
	if code != 2 || stdout != "" || !strings.Contains(stderr, `backend "tpu": want host or cuda`) || strings.Count(stderr, "\n") != 1 {
		t.Errorf("--backend tpu: exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
}
