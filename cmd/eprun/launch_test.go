package main

import (
	"os/exec"
	"strings"
	"testing"
	"time"
)

func TestLaunch(t *testing.T) {
	for _, tool := range []string{"true", "false", "sh", "sleep"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("no %s command: %v", tool, err)
		}
	}
	for _, tc := range []struct {
		name   string
		args   []string
		code   int
		stdout []string // lines that must appear
		stderr string   // "" for none, else a substring of the one line
	}{
		{name: "true", args: []string{"launch", "-n", "2", "--", "true"}},
		{name: "false", args: []string{"launch", "-n", "2", "--", "false"}, code: 1, stderr: "exited with status 1"},
		{name: "output", args: []string{"launch", "-n", "2", "--", "sh", "-c", `echo "hi $RANK of $WORLD_SIZE local $LOCAL_RANK"`},
			stdout: []string{"[rank 0] hi 0 of 2 local 0", "[rank 1] hi 1 of 2 local 1"}},
		{name: "domains", args: []string{"launch", "-n", "4", "--domains", "2", "--", "sh", "-c", `echo "local $LOCAL_RANK of $LOCAL_WORLD_SIZE per domain $GOEP_RANKS_PER_DOMAIN"`},
			stdout: []string{"[rank 1] local 1 of 2 per domain 2", "[rank 2] local 0 of 2 per domain 2"}},
		{name: "without --", args: []string{"launch", "-n", "1", "sh", "-c", "echo $0 -x", "arg0"}, stdout: []string{"[rank 0] arg0 -x"}},
		// Rank 1 fails; the others would sleep 10 minutes and must be
		// terminated.
		{name: "one fails", args: []string{"launch", "-n", "3", "--grace", "1s", "--", "sh", "-c", `if [ "$RANK" = 1 ]; then exit 7; fi; exec sleep 600`},
			code: 1, stderr: "rank 1 exited with status 7"},
		{name: "signal", args: []string{"launch", "-n", "2", "--", "sh", "-c", `if [ "$RANK" = 0 ]; then kill -9 $$; fi; exec sleep 600`},
			code: 1, stderr: "rank 0 killed by signal 9"},
		{name: "timeout", args: []string{"launch", "-n", "2", "--timeout", "200ms", "--", "sleep", "600"}, code: 1, stderr: "timed out after 200ms"},
		{name: "no such command", args: []string{"launch", "-n", "2", "--", "/no/such/cmd"}, code: 1, stderr: "/no/such/cmd"},

		{name: "no -n", args: []string{"launch", "--", "true"}, code: 2, stderr: `required flag(s) "np" not set`},
		{name: "-n 0", args: []string{"launch", "-n", "0", "--", "true"}, code: 2, stderr: "0 ranks: want at least 1"},
		{name: "-n huge", args: []string{"launch", "-n", "9223372036854775807", "--", "true"}, code: 2, stderr: "at most 65536 processes"},
		{name: "bad -n", args: []string{"launch", "-n", "two", "--", "true"}, code: 2, stderr: `invalid argument "two"`},
		{name: "bad domains", args: []string{"launch", "-n", "4", "--domains", "3", "--", "true"}, code: 2, stderr: "4 ranks do not split into 3 domains"},
		{name: "no command", args: []string{"launch", "-n", "2"}, code: 2, stderr: "no command to run"},
		{name: "unknown flag", args: []string{"launch", "--bogus", "-n", "2", "--", "true"}, code: 2, stderr: "unknown flag: --bogus"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			code, stdout, stderr := eprun(t, tc.args...)
			// Far below the ranks' 10 minutes of sleep, far above starting
			// a few processes on a loaded machine.
			if took := time.Since(start); took > time.Minute {
				t.Errorf("took %v: ranks not terminated promptly", took)
			}
			if code != tc.code {
				t.Errorf("exit %d, want %d; stderr %q", code, tc.code, stderr)
			}
			for _, l := range tc.stdout {
				if !strings.Contains(stdout, l+"\n") {
					t.Errorf("stdout lacks %q:\n%s", l, stdout)
				}
			}
			switch {
			case tc.stderr == "" && stderr != "":
				t.Errorf("stderr %q, want none", stderr)
			case tc.stderr != "" && (!strings.HasPrefix(stderr, "eprun: ") || strings.Count(stderr, "\n") != 1 || !strings.Contains(stderr, tc.stderr)):
				t.Errorf("stderr %q, want one line \"eprun: ...%s...\"", stderr, tc.stderr)
			}
			if strings.Contains(stderr, "goroutine ") || strings.Contains(stderr, "Usage:") {
				t.Errorf("stderr has a stack trace or usage: %q", stderr)
			}
		})
	}
}
