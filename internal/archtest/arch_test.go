// Package archtest checks the import graph of DESIGN.md section 4 (lint as
// a test): every package imports only the goep packages its arrow allows,
// and only internal/{cuda,mpi,ucx} use cgo.
package archtest

import (
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

const module = "github.com/goep/goep/"

// allowed lists, per package, the goep packages it may import. A package
// missing here fails the test: add it, with its arrow, to
// docs/ARCHITECTURE.md first.
var allowed = map[string][]string{
	"cmd/eprun":          {"launcher", "executor", "configs", "comm", "device", "rdma", "internal/bench"},
	"internal/bench":     {"executor", "comm", "device", "permute", "internal/reference"},
	"launcher":           {"comm"},
	"executor":           {"comm", "nvlink", "rdma", "permute", "device", "internal/gpulayout"},
	"nvlink":             {"comm", "device", "internal/cuda"},
	"rdma":               {"comm", "device", "internal/ucx", "internal/poll"},
	"permute":            {"device"},
	"device":             {"internal/cuda"},
	"comm":               {"internal/mpi"},
	"configs":            {},
	"internal/reference": {"device"},
	"internal/archtest":  {},
	"internal/cuda":      {"internal/poll"},
	"internal/mpi":       {"internal/poll"},
	"internal/ucx":       {"internal/poll"},
	"internal/poll":      {},
	"internal/gpulayout": {},
}

var cgoAllowed = []string{"internal/cuda", "internal/mpi", "internal/ucx", "internal/gpulayout"}

func TestImportGraph(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("module root not found: %v", err)
	}
	fset := token.NewFileSet()
	seen := 0
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); path != root && (strings.HasPrefix(name, ".") || name == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") {
			return nil
		}
		rel, _ := filepath.Rel(root, filepath.Dir(path))
		pkg := filepath.ToSlash(rel)
		f, err := parser.ParseFile(fset, path, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		seen++
		test := strings.HasSuffix(path, "_test.go")
		allow, known := allowed[pkg]
		if !known {
			t.Errorf("%s: package %q is not in the import graph (internal/archtest)", path, pkg)
			return nil
		}
		for _, imp := range f.Imports {
			p, _ := strconv.Unquote(imp.Path.Value)
			if p == "C" && !slices.Contains(cgoAllowed, pkg) {
				t.Errorf("%s: import \"C\" outside internal/{cuda,mpi,ucx}", path)
			}
			dep, ok := strings.CutPrefix(p, module)
			if !ok || dep == pkg || test {
				// Tests may import anything in the module, as external
				// test packages do.
				continue
			}
			if !slices.Contains(allow, dep) {
				t.Errorf("%s: %s imports %s; allowed: %v", path, pkg, dep, allow)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if seen < 10 {
		t.Fatalf("only %d Go files found under %s", seen, root)
	}
}
