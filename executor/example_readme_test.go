package executor_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"go/parser"
	"go/token"
	"log"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/goep/goep/comm"
	"github.com/goep/goep/device"
	"github.com/goep/goep/executor"
)

// Example_readme is the program of README.md's "Using the library": its
// body between the markers is main's body there, line for line
// (TestReadmeExample holds them equal). Two ranks, four experts, top-2:
// token t of each rank goes to experts t (weight 0.5) and t+2 (0.25), the
// experts are the identity, and each token comes back as 0.75 times its
// row: UnpermuteCombine applies the weights.
func Example_readme() {
	// README.md: begin
	// 2 ranks; 4 experts (0 and 1 on rank 0, 2 and 3 on rank 1); top-2;
	// rows of 4 elements; 2 tokens a rank.
	const R, E, K, H, T = 2, 4, 2, 4, 2
	ctx := context.Background()
	groups := comm.NewLocal(R) // R in-process ranks, one goroutine each
	b := device.NewHost()      // the host backend (CPUs), shared by the ranks
	defer b.Close()

	results := make([][]float32, R)
	rank := func(r int) error {
		// Every rank makes the same collective calls in the same order.
		e, err := executor.New(ctx, groups[r], b, executor.Config{NumExperts: E, TopK: K, Hidden: H, MaxTokensPerRank: T})
		if err != nil {
			return err
		}
		defer e.Close() // runs last: after the tensors and the handle below

		// Inputs: token t goes to experts t (weight 0.5) and t+2 (0.25);
		// element j of its row is 100r + 10t + j.
		var idx []int32
		var w, x []float32
		for t := range T {
			idx = append(idx, int32(t), int32(t+2))
			w = append(w, 0.5, 0.25)
			for j := range H {
				x = append(x, float32(100*r+10*t+j))
			}
		}
		// A tensor lives on the engine's stream; Upload copies bytes in.
		upload := func(dt device.DType, data []byte, rows, cols int) (*device.Tensor, error) {
			t, err := e.NewTensor(dt, rows, cols)
			if err != nil {
				return nil, err
			}
			if err := device.Upload(ctx, t, data); err != nil {
				t.Close()
				return nil, err
			}
			return t, nil
		}
		idxT, err := upload(device.Int32, device.EncodeInt32(idx), T, K) // [T, K] int32
		if err != nil {
			return err
		}
		defer idxT.Close()
		wT, err := upload(device.FP32, device.EncodeFloat32(device.FP32, w), T, K) // [T, K] fp32
		if err != nil {
			return err
		}
		defer wT.Close()
		xT, err := upload(device.FP32, device.EncodeFloat32(device.FP32, x), T, H) // [T, H] fp32 (or bf16)
		if err != nil {
			return err
		}
		defer xT.Close()

		// The layout: who sends what to whom; once per routing.
		h, err := e.Layout(ctx, executor.LayoutInput{TopkIdx: idxT})
		if err != nil {
			return err
		}
		defer h.Close()

		// Dispatch, permuted: d.X holds each local expert's rows in turn
		// (h.Counts tells how many), d.RecvWeights their weights.
		d, err := e.DispatchPermute(ctx, h, executor.DispatchInput{X: xT, TopkWeights: wT})
		if err != nil {
			return err
		}
		defer d.Close()

		// The experts: the identity, so their output is d.X itself.
		y := d.X

		// Back to the tokens' ranks: UnpermuteCombine multiplies each
		// expert's output by its weight and sums them. (Combine alone sums
		// without weights; Unpermute applies them on this rank.)
		out, err := e.UnpermuteCombine(ctx, h, executor.UnpermuteInput{Y: y, RecvWeights: d.RecvWeights})
		if err != nil {
			return err
		}
		defer out.Close()

		// Calls enqueue work and return; Synchronize waits for it and
		// reports its errors. Download copies a tensor's bytes out.
		if err := e.Synchronize(ctx); err != nil {
			return err
		}
		data, err := device.Download(ctx, out) // [T, H] fp32
		if err != nil {
			return err
		}
		results[r] = device.DecodeFloat32(device.FP32, data)
		return nil
	}

	errs := make([]error, R)
	var wg sync.WaitGroup
	for r := range R {
		wg.Go(func() { errs[r] = rank(r) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		log.Fatal(err)
	}
	for r, out := range results {
		for t := range T {
			fmt.Printf("rank %d, token %d: %v\n", r, t, out[t*H:(t+1)*H])
		}
	}
	// README.md: end

	// Output:
	// rank 0, token 0: [0 0.75 1.5 2.25]
	// rank 0, token 1: [7.5 8.25 9 9.75]
	// rank 1, token 0: [75 75.75 76.5 77.25]
	// rank 1, token 1: [82.5 83.25 84 84.75]
}

// The markers around Example_readme's body, and the lines that open and
// close the program in README.md.
const (
	readmeBegin = "\t// README.md: begin\n"
	readmeEnd   = "\t// README.md: end\n"
	readmeMain  = "func main() {\n"
)

// TestReadmeExample holds README.md's "Using the library" program to
// Example_readme: main's body is the example's body between the markers,
// the program parses, and it imports exactly the packages the example
// does (this file's imports, less those of this test).
func TestReadmeExample(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile("example_readme_test.go")
	if err != nil {
		t.Fatal(err)
	}
	// The program: the first Go block after the section's heading.
	_, sec, ok := bytes.Cut(readme, []byte("\n## Using the library\n"))
	if !ok {
		t.Fatal(`README.md has no "## Using the library" section`)
	}
	_, prog, ok := bytes.Cut(sec, []byte("```go\n"))
	if ok {
		prog, _, ok = bytes.Cut(prog, []byte("\n```\n"))
	}
	if !ok {
		t.Fatal(`README.md's "Using the library" has no Go block`)
	}
	program := string(prog) + "\n"
	_, body, ok := strings.Cut(program, "\n"+readmeMain)
	if !ok || !strings.HasSuffix(body, "\n}\n") {
		t.Fatalf("README.md's program has no %q ending in a closing brace:\n%s", readmeMain, program)
	}
	body = strings.TrimSuffix(body, "}\n")

	_, want, ok := strings.Cut(string(src), readmeBegin)
	if ok {
		want, _, ok = strings.Cut(want, readmeEnd)
	}
	if !ok {
		t.Fatalf("example_readme_test.go lacks the markers %q and %q", readmeBegin, readmeEnd)
	}
	if body != want {
		bl, wl := strings.Split(body, "\n"), strings.Split(want, "\n")
		for i := range max(len(bl), len(wl)) {
			b, w := "", ""
			if i < len(bl) {
				b = bl[i]
			}
			if i < len(wl) {
				w = wl[i]
			}
			if b != w {
				t.Errorf("README.md's main differs from Example_readme at line %d of the body:\nREADME:  %q\nexample: %q", i+1, b, w)
				break
			}
		}
	}

	// What README.md says it prints is the example's Output.
	_, printed, ok := bytes.Cut(sec, []byte("\nIt prints\n\n```\n"))
	if ok {
		printed, _, ok = bytes.Cut(printed, []byte("```\n"))
	}
	_, output, _ := strings.Cut(string(src), "\t// Output:\n")
	output, _, _ = strings.Cut(output, "}\n")
	output = strings.ReplaceAll(output, "\t// ", "")
	if !ok || string(printed) != output {
		t.Errorf("README.md's program prints (its \"It prints\" block)\n%s\nExample_readme's Output is\n%s", printed, output)
	}

	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "README.md", program, parser.ImportsOnly)
	if err != nil {
		t.Fatalf("README.md's program does not parse: %v", err)
	}
	if f.Name.Name != "main" {
		t.Errorf("README.md's program is package %s, want main", f.Name.Name)
	}
	var got []string
	for _, im := range f.Imports {
		p, _ := strconv.Unquote(im.Path.Value)
		got = append(got, p)
	}
	ex, err := parser.ParseFile(fset, "example_readme_test.go", src, parser.ImportsOnly)
	if err != nil {
		t.Fatal(err)
	}
	testOnly := []string{"bytes", "go/parser", "go/token", "os", "slices", "strconv", "strings", "testing"}
	var exp []string
	for _, im := range ex.Imports {
		if p, _ := strconv.Unquote(im.Path.Value); !slices.Contains(testOnly, p) {
			exp = append(exp, p)
		}
	}
	slices.Sort(got)
	slices.Sort(exp)
	if !slices.Equal(got, exp) {
		t.Errorf("README.md's program imports %q, the example %q", got, exp)
	}
}

// TestReadmeGoVersion: README.md's quick start names the Go that go.mod's
// go line asks for (older ones cannot build the module at all).
func TestReadmeGoVersion(t *testing.T) {
	mod, err := os.ReadFile("../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	var want string
	for line := range strings.Lines(string(mod)) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "go "); ok {
			want = v
			break
		}
	}
	if want == "" {
		t.Fatal("go.mod has no go line")
	}
	if s := "goep needs Go " + want + " or later"; !bytes.Contains(readme, []byte(s)) {
		t.Errorf("README.md does not say %q (go.mod's go line is %q)", s, want)
	}
}
