package bench

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
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
	if !slices.Equal(c.TopK, Defaults().TopK) || !slices.Equal(c.Mode, Defaults().Mode) || c.Iters != Defaults().Iters {
		t.Errorf("fields left out did not get defaults: %+v", c)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if n := len(c.Cases()); n != 4 {
		t.Errorf("%d cases, want 2 tokens x 1 hidden x 2 dtypes = 4", n)
	}
	if c, err := ParseConfig(strings.NewReader("")); err != nil || c.Ranks != Defaults().Ranks || c.Count != 1 {
		t.Errorf("empty config: %+v, %v; want the defaults, count 1", c, err)
	}
	if c, err := ParseConfig(strings.NewReader("count: 6\n")); err != nil || c.Count != 6 || c.Validate() != nil {
		t.Errorf("count: 6: %+v, %v", c, err)
	}
}

func TestConfigErrors(t *testing.T) {
	for _, tc := range []struct{ yaml, want string }{
		{"rankz: 4\n", "field rankz not found"},
		{"ranks: four\n", "cannot unmarshal"},
		{"ranks: 3\nexperts: 8\n", "not a multiple of ranks"},
		{"topk: 100\n", "topk is 100"},
		{"dtype: fp16\n", `dtype "fp16": want bf16, fp32 or fp8`},
		{"dtype: fp8\nhidden: 100\n", "the case dtype=fp8 hidden=100: fp8 needs hidden to be a multiple of 128 (one fp32 scale per 128 channels); use a multiple of 128, such as 128"},
		{"dtype: [bf16, fp8]\nhidden: [256, 100]\n", "the case dtype=fp8 hidden=100: fp8 needs hidden to be a multiple of 128 (one fp32 scale per 128 channels); every dtype of the sweep runs with every hidden, so drop hidden 100 or run fp8 on its own"},
		{"dtype: float8_e4m3fn\nhidden: 64\n", "the case dtype=float8_e4m3fn hidden=64: "},
		{"mode: fast\n", `mode "fast"`},
		{"topk: [2, 100]\n", "topk is 100"},
		{"topk: []\n", "topk is empty"},
		{"topk: [two]\n", "cannot unmarshal"},
		{"mode: [blocking, fast]\n", `mode "fast"`},
		{"mode: []\n", "mode is empty"},
		{"calls: [dispatch, sort]\n", `call "sort"`},
		{"iters: 0\n", "iters is 0"},
		{"iters: 4611686018427387904\n", "iters is 4611686018427387904; at most"},
		{"warmup: 9223372036854775807\n", "warmup is 9223372036854775807; at most"},
		{"calls: [dispatch, dispatch]\n", `call "dispatch" is listed twice`},
		{"pad: 0\n", "pad is 0"},
		{"ranks: 8\nranks_per_domain: 3\n", "does not divide"},
		{"sms: -1\n", "sms -1: cannot be negative"},
		{"sms: [4, -2]\n", "sms -2: cannot be negative"},
		{"sms: []\n", "sms is empty"},
		{"sms: [two]\n", "cannot unmarshal"},
		{"chunk_rows: -8\n", "chunk_rows -8: cannot be negative"},
		{"chunk_rows: [0, 16, -1]\n", "chunk_rows -1: cannot be negative"},
		{"chunk_rows: []\n", "chunk_rows is empty"},
		{"tokens: 2000000000\n", "a size is 2000000000"},
		{"hidden: [8, 1073741825]\n", "a size is 1073741825"},
		{"chunk_rows: [8, 1073741825]\n", "a size is 1073741825"},
		{"tokens: [1,2,3,4,5,6,7,8,9,10]\nhidden: [1,2,3,4,5,6,7,8,9,10]\nsms: [0,1,2,3,4,5,6,7,8,9]\nchunk_rows: [0,1,2,3,4,5,6,7,8,9]\ndtype: [bf16, fp32]\n", "more than 10000 cases"},
		// Values that cannot work, refused before anything runs.
		{"max_recv_tokens: 5\n", "max_recv_tokens 5: the capacities size the outputs of capacity mode, and no case runs in it (mode blocking)"},
		{"max_permuted_tokens: 5\nmode: [blocking]\n", "max_permuted_tokens 5: the capacities size"},
		{"max_recv_tokens: -1\nmode: capacity\n", "cannot be negative"},
		{"pad: 1000000000\n", "the case topk=8 tokens=512 pad=1000000000 may permute"},
		{"pad: 200000000\nmode: capacity\n", "may permute 1600032760 rows a rank"},
		{"ranks: 64\nexperts: 64\ntokens: 33554432\n", "ranks 64 x tokens 33554432 = 2147483648 rows a rank may receive"},
		{"tokens: 0\npad: 0\n", "pad is 0"},
		// The repetitions of the whole sweep: at least one, and every
		// repetition's rows are kept.
		{"count: 0\n", "count is 0; need at least 1"},
		{"count: -3\n", "count is -3; need at least 1"},
		{"count: 10001\n", "count is 10001; at most 10000 (every repetition's rows are kept)"},
		{"tokens: [1,2,3,4,5,6,7,8,9,10]\nhidden: [1,2,3,4,5,6,7,8,9,10]\ncount: 101\n", "the sweep's 100 cases run count 101 times, more than 10000 case runs"},
		// A key twice (the YAML decoder's check of it is quadratic).
		{"seed: 1\nranks: 4\nseed: 2\n", `line 3: key "seed" is already given at line 1`},
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

// TestParseConfigTopKMode: topk and mode are a scalar (every config
// before they were sweepable) or a list, as tokens, hidden and dtype.
func TestParseConfigTopKMode(t *testing.T) {
	for _, tc := range []struct {
		yaml string
		topk Ints
		mode Strings
	}{
		{"topk: 4\nmode: capacity\n", Ints{4}, Strings{ModeCapacity}},
		{"topk: [4, 8]\nmode: [blocking, capacity]\n", Ints{4, 8}, Strings{ModeBlocking, ModeCapacity}},
		{"topk: [2]\nmode: [capacity]\n", Ints{2}, Strings{ModeCapacity}},
		{"ranks: 8\n", Ints{8}, Strings{ModeBlocking}}, // the defaults
	} {
		c, err := ParseConfig(strings.NewReader(tc.yaml))
		if err != nil {
			t.Fatalf("%q: %v", tc.yaml, err)
		}
		if !slices.Equal(c.TopK, tc.topk) || !slices.Equal(c.Mode, tc.mode) {
			t.Errorf("%q: topk %v mode %v, want %v %v", tc.yaml, []int(c.TopK), []string(c.Mode), []int(tc.topk), []string(tc.mode))
		}
		if err := c.Validate(); err != nil {
			t.Errorf("%q: %v", tc.yaml, err)
		}
	}
}

// TestCasesOrder: mode outermost, then topk, dtype, hidden, and tokens
// innermost, each in the order given.
func TestCasesOrder(t *testing.T) {
	c := Defaults()
	c.Mode, c.TopK, c.DType, c.Hidden, c.Tokens = Strings{ModeCapacity, ModeBlocking}, Ints{4, 2}, Strings{"fp32", "bf16"}, Ints{16}, Ints{8, 0}
	var got []string
	for _, k := range c.Cases() {
		got = append(got, fmt.Sprintf("%s/%d/%v/%d/%d", k.Mode, k.TopK, k.DType, k.Hidden, k.Tokens))
	}
	want := []string{
		"capacity/4/fp32/16/8", "capacity/4/fp32/16/0", "capacity/4/bf16/16/8", "capacity/4/bf16/16/0",
		"capacity/2/fp32/16/8", "capacity/2/fp32/16/0", "capacity/2/bf16/16/8", "capacity/2/bf16/16/0",
		"blocking/4/fp32/16/8", "blocking/4/fp32/16/0", "blocking/4/bf16/16/8", "blocking/4/bf16/16/0",
		"blocking/2/fp32/16/8", "blocking/2/fp32/16/0", "blocking/2/bf16/16/8", "blocking/2/bf16/16/0",
	}
	if !slices.Equal(got, want) {
		t.Errorf("cases\n%v\nwant\n%v", got, want)
	}
}

// TestCasesOrderKnobs: sms and chunk_rows nest after hidden and before
// tokens (which stays innermost), each in the order given; left out they
// are the engine's default, 0, and add no cases.
func TestCasesOrderKnobs(t *testing.T) {
	c := Defaults()
	if n := len(c.Cases()); n != 1 || c.Cases()[0].SMs != 0 || c.Cases()[0].ChunkRows != 0 {
		t.Errorf("defaults: %+v, want one case with both knobs 0", c.Cases())
	}
	c.Mode, c.TopK, c.DType = Strings{ModeCapacity, ModeBlocking}, Ints{4}, Strings{"bf16"}
	c.Hidden, c.SMs, c.ChunkRows, c.Tokens = Ints{16, 32}, Ints{2, 0}, Ints{0, 8}, Ints{8, 0}
	var got []string
	for _, k := range c.Cases() {
		got = append(got, fmt.Sprintf("%s/%d/%v/%d/sms%d/chunk%d/%d", k.Mode, k.TopK, k.DType, k.Hidden, k.SMs, k.ChunkRows, k.Tokens))
	}
	var want []string
	for _, m := range []string{"capacity", "blocking"} {
		for _, h := range []int{16, 32} {
			want = append(want,
				fmt.Sprintf("%s/4/bf16/%d/sms2/chunk0/8", m, h), fmt.Sprintf("%s/4/bf16/%d/sms2/chunk0/0", m, h),
				fmt.Sprintf("%s/4/bf16/%d/sms2/chunk8/8", m, h), fmt.Sprintf("%s/4/bf16/%d/sms2/chunk8/0", m, h),
				fmt.Sprintf("%s/4/bf16/%d/sms0/chunk0/8", m, h), fmt.Sprintf("%s/4/bf16/%d/sms0/chunk0/0", m, h),
				fmt.Sprintf("%s/4/bf16/%d/sms0/chunk8/8", m, h), fmt.Sprintf("%s/4/bf16/%d/sms0/chunk8/0", m, h),
			)
		}
	}
	if !slices.Equal(got, want) {
		t.Errorf("cases\n%v\nwant\n%v", got, want)
	}
}

// TestParseConfigKnobs: sms and chunk_rows are a scalar or a list, and
// default to [0] when left out.
func TestParseConfigKnobs(t *testing.T) {
	for _, tc := range []struct {
		yaml       string
		sms, chunk Ints
	}{
		{"ranks: 8\n", Ints{0}, Ints{0}},
		{"sms: 8\nchunk_rows: 4\n", Ints{8}, Ints{4}},
		{"sms: [1, 2]\nchunk_rows: [0, 16]\n", Ints{1, 2}, Ints{0, 16}},
	} {
		c, err := ParseConfig(strings.NewReader(tc.yaml))
		if err != nil {
			t.Fatalf("%q: %v", tc.yaml, err)
		}
		if !slices.Equal(c.SMs, tc.sms) || !slices.Equal(c.ChunkRows, tc.chunk) {
			t.Errorf("%q: sms %v chunk_rows %v, want %v %v", tc.yaml, []int(c.SMs), []int(c.ChunkRows), []int(tc.sms), []int(tc.chunk))
		}
		if err := c.Validate(); err != nil {
			t.Errorf("%q: %v", tc.yaml, err)
		}
	}
}

// TestListsJSON: the record's config has topk and mode as lists; a
// record written when they were scalars still reads (eprun plot reads old
// records).
func TestListsJSON(t *testing.T) {
	c := Defaults()
	c.TopK, c.Mode = Ints{4, 8}, Strings{ModeBlocking, ModeCapacity}
	b, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	if s := string(b); !strings.Contains(s, `"topk":[4,8]`) || !strings.Contains(s, `"mode":["blocking","capacity"]`) {
		t.Errorf("JSON %s", s)
	}
	var back Config
	if err := json.Unmarshal(b, &back); err != nil || !slices.Equal(back.TopK, c.TopK) || !slices.Equal(back.Mode, c.Mode) {
		t.Errorf("round trip: %+v, %v", back, err)
	}
	var old Config
	if err := json.Unmarshal([]byte(`{"topk": 8, "mode": "capacity", "hidden": null}`), &old); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(old.TopK, Ints{8}) || !slices.Equal(old.Mode, Strings{ModeCapacity}) || old.Hidden != nil {
		t.Errorf("old record: topk %v mode %v hidden %v", []int(old.TopK), []string(old.Mode), []int(old.Hidden))
	}
	if err := json.Unmarshal([]byte(`{"topk": "eight"}`), &old); err == nil {
		t.Error("topk \"eight\": no error")
	}
}

// TestListsFormat: Ints and Strings print as the flags take them.
func TestListsFormat(t *testing.T) {
	for _, tc := range []struct{ got, want string }{
		{fmt.Sprintf("top-%d", Ints{8}), "top-8"},
		{fmt.Sprintf("topk %d", Ints{4, 8}), "topk 4,8"},
		{fmt.Sprintf("%v|%s|%5d|%-5v|", Ints{4, 8}, Ints{2}, Ints{2}, Ints{2}), "4,8|2|    2|2    |"},
		{fmt.Sprintf("%#v %x", Ints{4, 8}, Ints{255}), "[]int{4, 8} [ff]"},
		{fmt.Sprintf("%s mode", Strings{ModeBlocking}), "blocking mode"},
		{fmt.Sprintf("mode %v", Strings{ModeBlocking, ModeCapacity}), "mode blocking,capacity"},
	} {
		if tc.got != tc.want {
			t.Errorf("got %q, want %q", tc.got, tc.want)
		}
	}
}

// TestConfigBounds: a config larger than MaxConfigBytes, of more YAML
// nodes than a sweep needs, or with a mapping of hundreds of keys, is
// refused before it is decoded, quickly and in little memory (a 1.2 MB
// file of repeated keys once took the decoder minutes and tens of GB); the
// largest sweep Validate allows still parses.
func TestConfigBounds(t *testing.T) {
	repeat := func(line string, n int) string { return strings.Repeat(line, n) }
	list := func(n int) string {
		return "tokens: [" + strings.TrimSuffix(repeat("1,", n), ",") + "]\n"
	}
	for _, tc := range []struct {
		name, yaml, want string
	}{
		{"too large", repeat("seed: 1\n", MaxConfigBytes/8+1), "more than 1048576 bytes"},
		{"repeated keys", repeat("seed: 1\n", 100000), `key "seed" is already given at line 1`},
		{"many keys", func() string {
			var b strings.Builder
			for i := range 300 {
				fmt.Fprintf(&b, "k%d: 1\n", i)
			}
			return b.String()
		}(), "a mapping of 300 keys, more than 256"},
		{"many nodes", list(200000), "more than 65536 YAML nodes"},
		{"the largest sweep", list(maxCases), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseConfig(strings.NewReader(tc.yaml))
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
				t.Errorf("error %v, want one line containing %q", err, tc.want)
			}
		})
	}
	// A file is refused by its size, unread.
	path := filepath.Join(t.TempDir(), "big.yaml")
	if err := os.WriteFile(path, []byte(repeat("seed: 1\n", MaxConfigBytes/8+1)), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadConfig(path); err == nil || !strings.Contains(err.Error(), "more than 1048576") {
		t.Errorf("LoadConfig of a large file: %v", err)
	}
}
