package main

import (
	"strings"
	"testing"
)

func TestCheck(t *testing.T) {
	code, stdout, stderr := eprun(t, "check", "tiny", "-q", "--tokens", "0,16")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	for _, want := range []string{"# call", "rows_checked", "#wrong", "launcher in-process", "# check: OK", "iters 2"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("summary lacks %q:\n%s", want, stdout)
		}
	}
	rows := 0
	for _, l := range strings.Split(strings.TrimSpace(stdout), "\n") {
		if strings.HasPrefix(l, "#") {
			continue
		}
		rows++
		if f := strings.Fields(l); len(f) != 4 || f[1] != "2" || f[3] != "0" {
			t.Errorf("row %q: want call, 2 cases, rows, 0 wrong", l)
		}
	}
	if rows != 4 {
		t.Errorf("%d rows, want 4:\n%s", rows, stdout)
	}
	if code, _, stderr := eprun(t, "check", "--ranks", "3"); code != 2 || !strings.Contains(stderr, "not a multiple of ranks 3") {
		t.Errorf("check --ranks 3: exit %d, %q", code, stderr)
	}
}
