// Package testenv holds the test suite's knobs that span packages.
//
// GOEP_TEST_FULL (a boolean, default false) asks the tests that draw many
// random cases, or move large messages, for their full size: the property
// worlds, the frame-limit collectives. Plain go test runs a smaller draw
// of the same checks, fast enough for a developer's loop; the project's
// test command (scripts/test.sh, which CI runs) sets GOEP_TEST_FULL=1.
package testenv

import (
	"os"
	"strconv"
	"testing"
)

// Full reports whether GOEP_TEST_FULL asks for the full-size tests; an
// invalid value fails the test.
func Full(t testing.TB) bool {
	t.Helper()
	v, ok := os.LookupEnv("GOEP_TEST_FULL")
	if !ok || v == "" {
		return false
	}
	full, err := strconv.ParseBool(v)
	if err != nil {
		t.Fatalf("GOEP_TEST_FULL=%q: want a boolean (1, 0, true, false)", v)
	}
	return full
}
