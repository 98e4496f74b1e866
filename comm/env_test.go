package comm

import (
	"os"
	"strings"
	"testing"
	"time"
)

func TestDurationFromEnv(t *testing.T) {
	const name = "GOEP_TEST_DURATION"
	for _, tc := range []struct {
		value string
		set   bool
		want  time.Duration
		bad   bool
	}{
		{set: false, want: 7 * time.Second},
		{value: "", set: true, want: 7 * time.Second},
		{value: "30s", set: true, want: 30 * time.Second},
		{value: "2m", set: true, want: 2 * time.Minute},
		{value: "45", set: true, want: 45 * time.Second},
		{value: "0.5", set: true, want: 500 * time.Millisecond},
		{value: "soon", set: true, bad: true},
		{value: "0", set: true, bad: true},
		{value: "-1s", set: true, bad: true},
		{value: "1e30", set: true, bad: true}, // past time.Duration's range
		{value: "NaN", set: true, bad: true},
		{value: "1e-10", set: true, bad: true}, // positive, but below a nanosecond: 0
	} {
		t.Setenv(name, tc.value) // restored after the test
		if !tc.set {
			os.Unsetenv(name)
		}
		got, err := DurationFromEnv(name, 7*time.Second)
		if tc.bad {
			if err == nil || !strings.Contains(err.Error(), name+"=") {
				t.Errorf("%q: %v, %v; want an error naming %s", tc.value, got, err, name)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("%q: %v, %v; want %v", tc.value, got, err, tc.want)
		}
	}
}
