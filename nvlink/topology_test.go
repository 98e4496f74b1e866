package nvlink

import (
	"strings"
	"testing"
)

func TestRanksPerDomain(t *testing.T) {
	for _, tc := range []struct {
		keys []string
		want int
		err  string
	}{
		{[]string{"a"}, 1, ""},
		{[]string{"a", "a", "a", "a"}, 4, ""},
		{[]string{"a", "a", "b", "b"}, 2, ""},
		{[]string{"a", "b", "c"}, 1, ""},
		{[]string{"a", "a", "a", "b", "b", "b"}, 3, ""},
		{[]string{"a", "b", "a", "b"}, 0, "rank 2 is on a with rank 0"},
		{[]string{"a", "a", "a", "b"}, 0, "every domain must hold the same number"},
		{[]string{"a", "b", "b"}, 0, "every domain must hold the same number"},
		{nil, 0, "no ranks"},
	} {
		got, err := RanksPerDomain(tc.keys)
		switch {
		case tc.err == "" && (err != nil || got != tc.want):
			t.Errorf("%v: %d, %v; want %d", tc.keys, got, err, tc.want)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%v: %d, %v; want an error containing %q", tc.keys, got, err, tc.err)
		case tc.err != "" && !strings.Contains(err.Error(), "GOEP_RANKS_PER_DOMAIN") && tc.keys != nil:
			t.Errorf("%v: %v does not say to set GOEP_RANKS_PER_DOMAIN", tc.keys, err)
		}
	}
}

func TestHostKey(t *testing.T) {
	if k := HostKey(); !strings.HasPrefix(k, "host:") || len(k) <= len("host:") {
		t.Errorf("HostKey() = %q", k)
	}
}
