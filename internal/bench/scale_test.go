package bench

import (
	"bytes"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"
)

// TestScaleDownWorkloadOfRecord: gb300-ep64 on a machine of 8 GiB (as the
// test says) does not fit; ScaleDown halves its ranks to 8, then its
// tokens, until the expected peak fits, keeps every other field, and
// says why; a machine where it fits is left alone; one too small for
// anything is refused.
func TestScaleDownWorkloadOfRecord(t *testing.T) {
	old := availableMemory
	t.Cleanup(func() { availableMemory = old })
	c := workloadOfRecord(t)
	availableMemory = func() (float64, bool) { return 8 << 30, true }
	if _, err := c.CheckMemory(c.Ranks, false); !errors.Is(err, ErrMemory) {
		t.Fatalf("the full shape on 8 GiB: %v, want a refusal", err)
	}
	got, sc, err := c.ScaleDown(c.Ranks, false, false)
	if err != nil {
		t.Fatal(err)
	}
	if sc == nil || got.Ranks != 8 || sc.FromRanks != 64 || sc.ToRanks != 8 || !slices.Equal(sc.FromTokens, Ints{32768}) || !slices.Equal(sc.ToTokens, got.Tokens) {
		t.Fatalf("scaled to %d ranks of %v tokens: %+v", got.Ranks, got.Tokens, sc)
	}
	if w, err := got.CheckMemory(got.Ranks, false); err != nil || w != "" {
		t.Fatalf("the scaled run: %q, %v; want it to fit without a warning", w, err)
	}
	// The largest tokens that fit: twice as many do not.
	bigger := got
	bigger.Tokens = Ints{2 * got.Tokens[0]}
	if w, err := bigger.CheckMemory(bigger.Ranks, false); err == nil && w == "" {
		t.Errorf("%d tokens fit too; ScaleDown went further than it needed", bigger.Tokens[0])
	}
	// Every other field as configured.
	rest, full := got, c
	rest.Ranks, rest.Tokens, full.Ranks, full.Tokens = 0, nil, 0, nil
	if !configEqual(rest, full) {
		t.Errorf("fields other than ranks and tokens changed:\n%+v\n%+v", rest, full)
	}
	for _, want := range []string{"scaled down to fit: ranks 64 -> 8, tokens [32768] -> ", "every other field as configured", "The configured run cannot fit: the case tokens=32768"} {
		if !strings.Contains(sc.String(), want) {
			t.Errorf("%q lacks %q", sc, want)
		}
	}
	// Under a launcher the ranks are the processes: only tokens shrink.
	g1, sc1, err := c.ScaleDown(1, false, true)
	if err != nil || sc1 == nil || g1.Ranks != 64 || g1.Tokens[0] >= 32768 {
		t.Errorf("one rank a process: %d ranks of %v tokens, %v", g1.Ranks, g1.Tokens, err)
	}
	// Fits: unchanged.
	availableMemory = func() (float64, bool) { return 1 << 50, true }
	if g, sc, err := c.ScaleDown(c.Ranks, false, false); err != nil || sc != nil || g.Ranks != 64 {
		t.Errorf("on a machine it fits: %d ranks, %v, %v", g.Ranks, sc, err)
	}
	// Nothing fits.
	availableMemory = func() (float64, bool) { return 1 << 10, true }
	if _, _, err := c.ScaleDown(c.Ranks, false, false); !errors.Is(err, ErrMemory) || !strings.Contains(err.Error(), "still does not fit") {
		t.Errorf("on 1 KiB: %v", err)
	}
}

// configEqual compares two configs field by field (through JSON, which
// has every field).
func configEqual(a, b Config) bool {
	x, errx := json.Marshal(a)
	y, erry := json.Marshal(b)
	return errx == nil && erry == nil && bytes.Equal(x, y)
}

// TestTableSaysScaled: a record of a scaled run says so in its table's
// header.
func TestTableSaysScaled(t *testing.T) {
	rec := Record{Config: Defaults(), Scaled: &Scaling{FromRanks: 64, ToRanks: 8, FromTokens: Ints{32768}, ToTokens: Ints{512}, Reason: "the case ... needs more"}}
	var b bytes.Buffer
	if err := WriteTable(&b, rec); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "# scaled down to fit: ranks 64 -> 8, tokens [32768] -> [512] a rank") {
		t.Errorf("table:\n%s", b.String())
	}
}
