package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/goep/goep/internal/bench"
)

var update = flag.Bool("update", false, "rewrite testdata/bench-schema.golden.json from this run")

// schemaGolden is the --json record's schema: every key, with its value's
// JSON type.
const schemaGolden = "testdata/bench-schema.golden.json"

// keptValues are the keys whose values are enumerations, not measurements:
// the schema keeps them as they are, so the golden says what they were.
var keptValues = map[string]bool{
	"call": true, "dtype": true, "case_dtype": true, "mode": true, "timing": true, "launcher": true,
	"group": true, "baseline_a2a_transport": true, "routing": true, "backend": true,
}

// machineKeys are the env keys that are present or not depending on the
// machine and the checkout (omitempty): the schema always has them, so
// the golden does not depend on where the test runs.
var machineKeys = map[string]any{
	"commit": "string", "commit_time": "string", "modified": "bool", "cpu": "string",
	"hostname": "string", "loadavg": "string", "args": []any{"string"},
}

// schemaOf replaces every value of v by its JSON type ("number", "string",
// "bool", "null"), except keptValues. An array of scalars becomes one
// element, its type ("[]" when empty); an array of objects keeps every
// element (the rows: one per case and call).
func schemaOf(key string, v any) any {
	switch x := v.(type) {
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, e := range x {
			out[k] = schemaOf(k, e)
		}
		return out
	case []any:
		if len(x) == 0 {
			return []any{}
		}
		if _, ok := x[0].(map[string]any); ok {
			out := make([]any, len(x))
			for i, e := range x {
				out[i] = schemaOf(key, e)
			}
			return out
		}
		seen := []any{}
		for _, e := range x {
			s := schemaOf(key, e)
			if !slices.ContainsFunc(seen, func(o any) bool { return fmt.Sprint(o) == fmt.Sprint(s) }) {
				seen = append(seen, s)
			}
		}
		return seen
	case string:
		if keptValues[key] {
			return x
		}
		return "string"
	case float64:
		return "number"
	case bool:
		return "bool"
	case nil:
		return "null"
	}
	return fmt.Sprintf("unexpected %T", v)
}

// TestBenchJSONSchema runs bench tiny with a fixed seed, every call and
// two domains of 2 ranks (so that the keys present only with several
// domains, the rdma_* byte counts, are in the golden too), and compares
// the --json record's keys and value types with the golden file: a change
// of the schema is a visible diff (go test -run TestBenchJSONSchema
// -update rewrites it, to review and commit).
func TestBenchJSONSchema(t *testing.T) {
	args := append(slices.Clone(tiny), "--seed", "7", "--json", "-", "--calls", strings.Join(bench.KnownCalls, ","), "--ranks-per-domain", "2")
	stdout, _ := eprunOK(t, args...)
	var rec map[string]any
	if err := json.Unmarshal([]byte(stdout), &rec); err != nil {
		t.Fatalf("--json - is not one JSON object: %v\n%s", err, stdout)
	}
	// The topology's contents depend on the machine (GPUs, NUMA nodes,
	// UCX devices; eprun topo's own test checks them): the golden lists
	// the sections every machine has.
	topo, ok := rec["topology"].(map[string]any)
	if !ok {
		t.Fatalf("no topology object in the record")
	}
	var sections []string
	for _, k := range []string{"host", "num_cpu", "numa_nodes", "gpus", "rdma", "launcher", "layout"} {
		if _, ok := topo[k]; !ok {
			t.Errorf("topology lacks %q: %v", k, topo)
		}
		sections = append(sections, k)
	}
	// The layout is the run's world.
	if l, ok := topo["layout"].(map[string]any); !ok || l["ranks"] != rec["config"].(map[string]any)["ranks"] {
		t.Errorf("topology layout %v, want the run's %v ranks", topo["layout"], rec["config"].(map[string]any)["ranks"])
	}
	delete(rec, "topology")
	schema := schemaOf("", rec).(map[string]any)
	schema["topology"] = sections
	env, ok := schema["env"].(map[string]any)
	if !ok {
		t.Fatalf("no env object in %v", schema)
	}
	for k, typ := range machineKeys {
		env[k] = typ
	}
	got, err := json.MarshalIndent(schema, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	got = append(got, '\n')
	if *update {
		if err := os.MkdirAll(filepath.Dir(schemaGolden), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(schemaGolden, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(schemaGolden)
	if err != nil {
		t.Fatalf("%v (go test -run TestBenchJSONSchema -update writes it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("the --json schema changed; if that is meant, rerun with -update and commit %s\n%s", schemaGolden, lineDiff(string(want), string(got)))
	}
}

// lineDiff lists the lines only in want (-) and only in got (+), in order.
func lineDiff(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	var b strings.Builder
	i, j := 0, 0
	for i < len(w) || j < len(g) {
		switch {
		case i < len(w) && j < len(g) && w[i] == g[j]:
			i++
			j++
		case j < len(g) && !slices.Contains(w[i:], g[j]):
			fmt.Fprintf(&b, "+ %s\n", g[j])
			j++
		case i < len(w):
			fmt.Fprintf(&b, "- %s\n", w[i])
			i++
		default:
			fmt.Fprintf(&b, "+ %s\n", g[j])
			j++
		}
	}
	return b.String()
}
