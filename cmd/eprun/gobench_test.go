package main

import (
	"slices"
	"strings"
	"testing"

	"golang.org/x/perf/benchfmt"

	"github.com/goep/goep/internal/bench"
)

// TestBenchGoBenchBenchfmt reads --format=gobench with benchstat's own
// parser (golang.org/x/perf/benchfmt): every line must be a result, a
// key: value config line or blank, never a syntax error; every result has
// its units and names its case, the routing included.
func TestBenchGoBenchBenchfmt(t *testing.T) {
	for _, tc := range []struct {
		name    string
		args    []string
		routing string // the name's routing keys
	}{
		{"uniform", nil, "/routing=uniform-"},
		{"zipf", []string{"--routing", "zipf", "--zipf-s", "1.1"}, "/routing=zipf/zipf_s=1.1-"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append(slices.Clone(tiny), "--format=gobench", "--calls", strings.Join(bench.KnownCalls, ","))
			stdout, _ := eprunOK(t, append(args, tc.args...)...)
			r := benchfmt.NewReader(strings.NewReader(stdout), "eprun.txt")
			var bases []string
			for r.Scan() {
				switch rec := r.Result().(type) {
				case *benchfmt.SyntaxError:
					t.Errorf("benchfmt: %v", rec)
				case *benchfmt.Result:
					name := rec.Name.String()
					if !strings.Contains(name, "/tokens=32/hidden=64/topk=2/dtype=bf16"+tc.routing) {
						t.Errorf("%s: the name lacks the case and routing keys", name)
					}
					if rec.Iters != 2 {
						t.Errorf("%s: %d iterations, want 2", name, rec.Iters)
					}
					units := map[string]float64{}
					for _, v := range rec.Values {
						units[v.OrigUnit] = v.OrigValue
					}
					for _, unit := range []string{"ns/op", "MB/s", "p99-ns/op"} {
						if units[unit] <= 0 {
							t.Errorf("%s: %s is %v, want a positive value (values: %v)", name, unit, units[unit], rec.Values)
						}
					}
					if len(units) != 3 {
						t.Errorf("%s: units %v, want ns/op, MB/s and p99-ns/op", name, units)
					}
					// benchstat's own view: time in sec/op, bandwidth in B/s.
					if v, ok := rec.Value("sec/op"); !ok || v <= 0 {
						t.Errorf("%s: benchfmt finds no sec/op", name)
					}
					if rec.GetConfig("backend") != "host" || rec.GetConfig("mode") != "blocking" || rec.GetConfig("goos") == "" {
						t.Errorf("%s: config %q/%q/%q, want the backend, mode and goos lines", name, rec.GetConfig("backend"), rec.GetConfig("mode"), rec.GetConfig("goos"))
					}
					bases = append(bases, string(rec.Name.Base()))
				}
			}
			if err := r.Err(); err != nil {
				t.Fatal(err)
			}
			var want []string
			for _, call := range bench.KnownCalls {
				var n string
				for _, p := range strings.Split(call, "-") {
					n += strings.ToUpper(p[:1]) + p[1:]
				}
				want = append(want, n, "A2A"+n)
			}
			want = append(want, "Baseline")
			if !slices.Equal(bases, want) {
				t.Errorf("benchmarks %v, want %v", bases, want)
			}
		})
	}
}
