package plan

import (
	"bufio"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

var rewrite = flag.Bool("rewrite", false, "rewrite the expected output of testdata/layout/*.txt")

// TestLayoutScripts runs the text-driven layout tests: each file in
// testdata/layout holds a config line and every rank's routing, then a line
// "----", then the expected tables of every rank. Review changes made with
// -rewrite by hand: the tables are the specification.
func TestLayoutScripts(t *testing.T) {
	files, _ := filepath.Glob("testdata/layout/*.txt")
	if len(files) == 0 {
		t.Fatal("no layout scripts")
	}
	for _, file := range files {
		t.Run(filepath.Base(file), func(t *testing.T) {
			raw, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			input, want, _ := strings.Cut(string(raw), "----\n")
			got, err := runLayoutScript(input)
			if err != nil {
				got = "error: " + err.Error() + "\n"
			}
			if *rewrite {
				if err := os.WriteFile(file, []byte(input+"----\n"+got), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			if got != want {
				t.Errorf("%s: layout differs (run with -rewrite and review the diff)\n--- got\n%s--- want\n%s", file, got, want)
			}
		})
	}
}

// runLayoutScript parses
//
//	config ranks=4 experts=8 topk=2 pad=1 maxtokens=8
//	rank 0: 0 1 | 2 -1 | ...      (one token per |-separated group)
//
// and renders every rank's layout.
func runLayoutScript(input string) (string, error) {
	var cfg Params
	var routing [][]int32
	sc := bufio.NewScanner(strings.NewReader(input))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		switch {
		case strings.HasPrefix(line, "config "):
			cfg = Params{MaxTokensPerRank: 1 << 20, PadMultiple: 1}
			for _, kv := range strings.Fields(line)[1:] {
				k, v, _ := strings.Cut(kv, "=")
				n, err := strconv.Atoi(v)
				if err != nil {
					return "", fmt.Errorf("config %s: %v", kv, err)
				}
				switch k {
				case "ranks":
					routing = make([][]int32, n)
				case "experts":
					cfg.NumExperts = n
				case "topk":
					cfg.TopK = n
				case "pad":
					cfg.PadMultiple = n
				case "maxtokens":
					cfg.MaxTokensPerRank = n
				default:
					return "", fmt.Errorf("unknown config key %q", k)
				}
			}
		case strings.HasPrefix(line, "rank "):
			head, body, _ := strings.Cut(line, ":")
			r, err := strconv.Atoi(strings.TrimPrefix(head, "rank "))
			if err != nil || r < 0 || r >= len(routing) {
				return "", fmt.Errorf("bad line %q", line)
			}
			routing[r] = []int32{}
			for _, tok := range strings.Split(body, "|") {
				if strings.TrimSpace(tok) == "" {
					continue
				}
				for _, f := range strings.Fields(tok) {
					v, err := strconv.Atoi(f)
					if err != nil {
						return "", fmt.Errorf("bad expert %q in %q", f, line)
					}
					routing[r] = append(routing[r], int32(v))
				}
			}
		default:
			return "", fmt.Errorf("bad line %q", line)
		}
	}
	var b strings.Builder
	for r := range routing {
		lay, err := ComputeLayout(r, cfg, routing)
		if err != nil {
			return "", err
		}
		renderLayout(&b, lay)
	}
	return b.String(), nil
}

func renderLayout(b *strings.Builder, lay *Layout) {
	K := lay.TopK
	fmt.Fprintf(b, "rank %d: T=%d N=%d P=%d TokensPerExpert=%v ExpertOffsets=%v\n",
		lay.Rank, lay.NumTokens, lay.RecvCount, lay.PermutedCount, lay.TokensPerExpert, lay.ExpertOffsets)
	for t := range lay.NumTokens {
		var dests []string
		for j := lay.SendOffsets[t]; j < lay.SendOffsets[t+1]; j++ {
			dests = append(dests, fmt.Sprintf("r%d#%d", lay.SendDest[j], lay.SendRow[j]))
		}
		fmt.Fprintf(b, "  send t%d -> [%s] slot rows %v slot pos %v\n", t, strings.Join(dests, " "),
			lay.SlotRow[t*K:(t+1)*K], lay.SlotPos[t*K:(t+1)*K])
	}
	for i := range lay.RecvCount {
		fmt.Fprintf(b, "  recv #%d from r%d t%d idx %v pos %v\n", i, lay.RecvSrcRank[i], lay.RecvSrcToken[i],
			lay.RecvIdx[i*K:(i+1)*K], lay.Pos[i*K:(i+1)*K])
	}
}
