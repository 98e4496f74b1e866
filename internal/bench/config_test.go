package bench

import (
	"slices"
	"strings"
	"testing"
)

func TestParseConfig(t *testing.T) {
	c, err := ParseConfig(strings.NewReader("ranks: 4\nexperts: 16\ntokens: [8, 16]\nhidden: 32\ndtype: [bf16, fp32]\n"))
	if err != nil {
		t.Fatal(err)
	}
	if c.Ranks != 4 || c.Experts != 16 || !slices.Equal(c.Tokens, Ints{8, 16}) || !slices.Equal(c.Hidden, Ints{32}) {
		t.Errorf("parsed %+v", c)
	}
	if c.TopK != Defaults().TopK || c.Iters != Defaults().Iters {
		t.Errorf("fields left out did not get defaults: %+v", c)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if n := len(c.Cases()); n != 4 {
		t.Errorf("%d cases, want 2 tokens x 1 hidden x 2 dtypes = 4", n)
	}
	if c, err := ParseConfig(strings.NewReader("")); err != nil || c.Ranks != Defaults().Ranks {
		t.Errorf("empty config: %+v, %v", c, err)
	}
}

func TestConfigErrors(t *testing.T) {
	for _, tc := range []struct{ yaml, want string }{
		{"rankz: 4\n", "field rankz not found"},
		{"ranks: four\n", "cannot unmarshal"},
		{"ranks: 3\nexperts: 8\n", "not a multiple of ranks"},
		{"topk: 100\n", "topk is 100"},
		{"dtype: fp8\n", `dtype "fp8"`},
		{"mode: fast\n", `mode "fast"`},
		{"calls: [dispatch, sort]\n", `call "sort"`},
		{"iters: 0\n", "iters is 0"},
		{"pad: 0\n", "pad is 0"},
		{"ranks: 8\nranks_per_domain: 3\n", "does not divide"},
	} {
		c, err := ParseConfig(strings.NewReader(tc.yaml))
		if err == nil {
			err = c.Validate()
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: error %v, want one containing %q", tc.yaml, err, tc.want)
			continue
		}
		if strings.Contains(err.Error(), "\n") {
			t.Errorf("%q: error has several lines: %q", tc.yaml, err)
		}
	}
}
