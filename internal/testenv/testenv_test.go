package testenv

import "testing"

func TestFull(t *testing.T) {
	for _, c := range []struct {
		v    string
		want bool
	}{{"", false}, {"0", false}, {"1", true}, {"true", true}, {"false", false}} {
		t.Setenv("GOEP_TEST_FULL", c.v)
		if got := Full(t); got != c.want {
			t.Errorf("GOEP_TEST_FULL=%q: Full = %v, want %v", c.v, got, c.want)
		}
	}
}
