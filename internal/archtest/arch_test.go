// Package archtest checks the import graph of DESIGN.md section 4 and
// docs/ARCHITECTURE.md (lint as a test): every package imports only the
// goep packages its arrow allows, only internal/{cuda,mpi,ucx,gpulayout}
// use cgo, and the CUDA kernels follow the same arrows: a kernel source
// includes headers of its own directory or of the packages its Go package
// may import, named by -I in the package's go:generate directive, which
// runs internal/ptxgen and nothing else.
package archtest

import (
	"fmt"
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
	"cmd/eprun":      {"launcher", "executor", "configs", "comm", "device", "nvlink", "rdma", "internal/bench"},
	"internal/bench": {"executor", "comm", "device", "permute", "internal/reference", "internal/view"},
	"launcher":       {"comm"},
	"executor":       {"comm", "nvlink", "device", "executor/internal/datapath", "executor/internal/plan", "executor/internal/host", "executor/internal/gpu"},
	// The executor's parts: the pure plan, the contract with the data
	// paths, the rail shared by both, and the host and GPU paths (the GPU
	// path's control plane is the host path's).
	"executor/internal/plan":          {"internal/gpulayout"},
	"executor/internal/plan/plantest": {},
	"executor/internal/datapath":      {"comm", "device", "nvlink", "executor/internal/plan"},
	"executor/internal/rail":          {"comm", "device", "nvlink", "rdma", "internal/view", "executor/internal/datapath", "executor/internal/plan"},
	"executor/internal/host":          {"comm", "device", "nvlink", "permute", "internal/view", "executor/internal/datapath", "executor/internal/plan", "executor/internal/rail"},
	"executor/internal/gpu": {"comm", "device", "nvlink", "rdma", "permute", "internal/view", "internal/gpulayout",
		"executor/internal/datapath", "executor/internal/plan", "executor/internal/rail", "executor/internal/host"},
	"nvlink":             {"comm", "device", "internal/cuda"},
	"rdma":               {"comm", "device", "internal/ucx", "internal/poll"},
	"permute":            {"device", "internal/view"},
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
	"internal/view":      {},
	"internal/ptxgen":    {},
	// Test support, imported by tests only.
	"internal/ranktest": {},
	"internal/testenv":  {},
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
				t.Errorf("%s: import \"C\" outside internal/{cuda,mpi,ucx,gpulayout}", path)
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

// ptxgen is the one command a go:generate directive may run.
const ptxgen = "go run " + module + "internal/ptxgen"

// TestKernelGraph checks the CUDA sources against the import graph: every
// quoted #include of a .cu or .cuh file names a file of its own directory
// or of a directory given by -I in its package's ptxgen directives, with
// no ".." anywhere; an -I directory belongs to the package itself or to
// one it may import; and every go:generate directive that builds kernels
// runs ptxgen on files of its own package.
func TestKernelGraph(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	// Per package: the -I directories of its ptxgen directives, and its
	// kernel sources.
	incs := map[string][]string{}
	var kernels []string
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); path != root && strings.HasPrefix(name, ".") {
				return filepath.SkipDir
			}
			return nil
		}
		rel, _ := filepath.Rel(root, path)
		rel = filepath.ToSlash(rel)
		switch {
		case strings.HasSuffix(path, ".cu") || strings.HasSuffix(path, ".cuh"):
			kernels = append(kernels, rel)
		case strings.HasSuffix(path, ".go"):
			raw, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			pkg := filepath.ToSlash(filepath.Dir(rel))
			for _, line := range strings.Split(string(raw), "\n") {
				cmd, ok := strings.CutPrefix(line, "//go:generate ")
				if !ok {
					continue
				}
				dirs, err := generateIncludes(cmd)
				if err != nil {
					t.Errorf("%s: %v: %q", rel, err, line)
					continue
				}
				for _, d := range dirs {
					if owner := ownerOf(root, d); owner != pkg && !slices.Contains(allowed[pkg], owner) {
						t.Errorf("%s: -I %s is package %s's, which %s may not import", rel, d, owner, pkg)
					}
				}
				incs[pkg] = append(incs[pkg], dirs...)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(kernels) < 4 {
		t.Fatalf("only %d kernel sources found under %s", len(kernels), root)
	}
	for _, k := range kernels {
		if strings.HasPrefix(k, "scripts/") {
			continue // experiments, built by hand, not by go generate
		}
		raw, err := os.ReadFile(filepath.Join(root, k))
		if err != nil {
			t.Fatal(err)
		}
		pkg := ownerOf(root, filepath.Dir(k))
		for _, line := range strings.Split(string(raw), "\n") {
			name, ok := quotedInclude(line)
			if !ok {
				continue
			}
			if strings.Contains(name, "..") || strings.Contains(name, "/") {
				t.Errorf("%s: #include %q reaches outside its directory: name the directory with -I in %s's go:generate", k, name, pkg)
				continue
			}
			found := fileExists(filepath.Join(root, filepath.Dir(k), name))
			for _, d := range incs[pkg] {
				found = found || fileExists(filepath.Join(root, d, name))
			}
			if !found {
				t.Errorf("%s: #include %q is neither in its directory nor in the -I directories of %s's go:generate (%v)", k, name, pkg, incs[pkg])
			}
		}
	}
}

// generateIncludes returns the -I directories of a go:generate command
// that runs ptxgen; an error for a command that builds kernels otherwise,
// or names a path outside its package.
func generateIncludes(cmd string) ([]string, error) {
	rest, ok := strings.CutPrefix(cmd, ptxgen+" ")
	if !ok {
		if strings.Contains(cmd, "nvcc") || strings.Contains(cmd, ".cu") || strings.Contains(cmd, ".ptx") {
			return nil, fmt.Errorf("a kernel build that is not %q", ptxgen)
		}
		return nil, nil
	}
	var dirs []string
	f := strings.Fields(rest)
	for i := 0; i < len(f); i++ {
		switch {
		case f[i] == "-I" && i+1 < len(f):
			dirs = append(dirs, f[i+1])
			i++
		case strings.Contains(f[i], ".."):
			return nil, fmt.Errorf("%q names a path outside the package", f[i])
		}
	}
	return dirs, nil
}

// ownerOf is the package (module-relative) that owns directory dir: the
// nearest directory at or above it that holds Go files.
func ownerOf(root, dir string) string {
	for d := dir; d != "." && d != "/" && d != ""; d = filepath.Dir(d) {
		if m, _ := filepath.Glob(filepath.Join(root, d, "*.go")); len(m) > 0 {
			return filepath.ToSlash(d)
		}
	}
	return "."
}

// quotedInclude returns the name of a line's #include "name".
func quotedInclude(line string) (string, bool) {
	l := strings.TrimSpace(line)
	rest, ok := strings.CutPrefix(l, "#include")
	if !ok {
		return "", false
	}
	rest = strings.TrimSpace(rest)
	if len(rest) < 2 || rest[0] != '"' {
		return "", false
	}
	name, _, ok := strings.Cut(rest[1:], `"`)
	return name, ok
}

func fileExists(path string) bool {
	st, err := os.Stat(path)
	return err == nil && !st.IsDir()
}
