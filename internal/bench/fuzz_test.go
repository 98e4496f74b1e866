package bench

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/goep/goep/device"
)

// FuzzParseConfig: any bytes as a YAML config parse or fail with a one-line
// error, never a panic; a config that validates expands into a bounded
// number of cases, each with valid sizes.
func FuzzParseConfig(f *testing.F) {
	paths, _ := filepath.Glob("../../configs/*.yaml")
	for _, p := range paths {
		if data, err := os.ReadFile(p); err == nil {
			f.Add(data)
		}
	}
	for _, s := range []string{
		"tokens: [1, 2, 3]\nhidden: 8\n",
		"ranks: 0\n",
		"tokens: 99999999999999999999\n",
		"sms: [-1]\n",
		"topk: [1,2,3,4,5,6,7,8,9,10]\ntokens: [1,2,3,4,5,6,7,8,9,10]\nhidden: [1,2,3,4,5,6,7,8,9,10]\nsms: [0,1,2,3,4,5,6,7,8,9]\nchunk_rows: [0,1,2,3,4,5,6,7,8,9]\n",
		"routing: zipf\nzipf_s: -1\n",
		"mode: [capacity]\nmax_recv_tokens: -5\n",
		"experts: 1073741824\nranks: 1\n",
		"dtype: [bf16, fp8]\nhidden: [128, 100]\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := ParseConfig(bytes.NewReader(data))
		if err != nil {
			if strings.Contains(err.Error(), "\n") {
				t.Fatalf("multi-line error %q", err)
			}
			return
		}
		if err := c.Validate(); err != nil {
			if strings.Contains(err.Error(), "\n") {
				t.Fatalf("multi-line error %q", err)
			}
			return
		}
		cases := c.Cases()
		if len(cases) == 0 || len(cases) > maxCases {
			t.Fatalf("%d cases", len(cases))
		}
		for _, k := range cases {
			if k.TopK < 1 || k.TopK > c.Experts || k.Hidden < 1 || k.Tokens < 0 || k.SMs < 0 || k.ChunkRows < 0 ||
				k.Hidden > maxSize || k.Tokens > maxSize || (k.DType == device.FP8E4M3 && k.Hidden%device.FP8ScaleChannels != 0) {
				t.Fatalf("case %+v of a valid config", k)
			}
		}
	})
}
