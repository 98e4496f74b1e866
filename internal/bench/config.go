package bench

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/goep/goep/device"
)

// The calls a benchmark can time, in the order they run.
const (
	CallDispatch         = "dispatch"
	CallCombine          = "combine"
	CallDispatchPermute  = "dispatch-permute"
	CallUnpermuteCombine = "unpermute-combine"
	// CallDispatchCombine is one iteration of Dispatch then Combine of its
	// RecvX with no host synchronisation between them (one Synchronize at
	// the end): the round trip of an MoE layer whose experts are the
	// identity. Its bytes are twice the dispatch's.
	CallDispatchCombine = "dispatch-combine"
)

// AllCalls lists the calls a run times when its config names none, in run
// order.
var AllCalls = []string{CallDispatch, CallCombine, CallDispatchPermute, CallUnpermuteCombine}

// KnownCalls lists every call a config may name: AllCalls, then those that
// run only when asked for (--calls), because they would add to the default
// run's time what the single calls already measure.
var KnownCalls = append(slices.Clone(AllCalls), CallDispatchCombine)

// Config is one benchmark run: the engine shape and the sweep. Mode, TopK,
// DType, Hidden, SMs, ChunkRows and Tokens may list several values (YAML:
// a scalar or a list); every combination is a case (Cases gives their
// order), each case runs on engines of its own, and every case times every
// call in Calls.
type Config struct {
	// Backend is where the engines run: "host" (default; "" means host) or
	// "cuda" (build tag cuda; each rank on GPU GOEP_DEVICE, default 0).
	Backend string `yaml:"backend,omitempty" json:"backend,omitempty"`
	// Ranks is R, the in-process ranks (one goroutine and one engine each).
	Ranks int `yaml:"ranks" json:"ranks"`
	// RanksPerDomain is D (0: GOEP_RANKS_PER_DOMAIN, else all ranks in one
	// domain).
	RanksPerDomain int `yaml:"ranks_per_domain,omitempty" json:"ranks_per_domain,omitempty"`
	// Experts is E; Ranks must divide it.
	Experts int `yaml:"experts" json:"experts"`
	// TopK is K, the expert slots per token (distinct experts; one or
	// more values).
	TopK Ints `yaml:"topk" json:"topk"`
	// Hidden is H, the elements per row (one or more values).
	Hidden Ints `yaml:"hidden" json:"hidden"`
	// Tokens is T, the tokens on every rank (one or more values).
	Tokens Ints `yaml:"tokens" json:"tokens"`
	// DType is the activation dtype, bf16, fp32 or fp8 (one or more
	// values). fp8 is e4m3 with one fp32 scale per 128 channels of a row
	// (device.FP8ScaleChannels), which needs every Hidden to be a multiple
	// of 128, and is for dispatch only (DESIGN.md section 1): in an fp8
	// case dispatch and dispatch-permute move fp8 rows with their scales,
	// and the calls that combine (combine, unpermute-combine,
	// dispatch-combine) run in bf16, as DeepEP's "FP8 dispatch, BF16
	// combine" does (Case.CallDType).
	DType Strings `yaml:"dtype" json:"dtype"`
	// SMs and ChunkRows are the engine's tuning knobs, executor.Config.SMs
	// and executor.Config.ChunkRows (one or more values each; default 0,
	// the engine's default). SMs bounds the parallelism of the row copies
	// between ranks: on the cuda backend the thread blocks of the push and
	// scatter kernels, on the host the goroutines a rank copies with (0: no
	// bound). ChunkRows is the rows a block (cuda) or a work item (host)
	// copies at a time (0: the engine's default). Outputs are the same, bit
	// for bit, for every value; only the time changes.
	SMs       Ints `yaml:"sms" json:"sms"`
	ChunkRows Ints `yaml:"chunk_rows" json:"chunk_rows"`
	// Iters is the timed iterations per call; Warmup the untimed ones
	// before them.
	Iters  int `yaml:"iters" json:"iters"`
	Warmup int `yaml:"warmup" json:"warmup"`
	// Count is how many times the whole sweep runs (default 1), every case
	// on fresh engines each time, as go test -count does: each repetition
	// gives a row per call and case (Row.Rep), so that --format=gobench
	// has Count results per benchmark, the samples benchstat needs (6 or
	// more for its confidence intervals). 0 only in records written before
	// the field.
	Count int `yaml:"count" json:"count"`
	// Mode is "blocking" or "capacity" (one or more values).
	Mode Strings `yaml:"mode" json:"mode"`
	// Pad is the PadMultiple of the permuted layout (1: no padding).
	Pad int `yaml:"pad" json:"pad"`
	// MaxRecvTokens and MaxPermutedTokens are the capacity-mode output
	// sizes of every capacity case; 0 means the worst case of each case:
	// the sweep's largest tokens, and the case's top-k (R x max tokens
	// rows received; R x max tokens x min(K, E/R) + (E/R) x (Pad-1)
	// permuted). Blocking cases ignore them.
	MaxRecvTokens     int `yaml:"max_recv_tokens,omitempty" json:"max_recv_tokens,omitempty"`
	MaxPermutedTokens int `yaml:"max_permuted_tokens,omitempty" json:"max_permuted_tokens,omitempty"`
	// Seed makes the routing and the payload; equal seeds give equal runs.
	Seed uint64 `yaml:"seed" json:"seed"`
	// Calls is the calls to time, in order (default: AllCalls; any of
	// KnownCalls).
	Calls []string `yaml:"calls,omitempty" json:"calls,omitempty"`
	// Routing is how tokens pick experts: uniform (default), balanced
	// (every expert's load equal within 1) or zipf (skewed popularity with
	// exponent ZipfS, e.g. 1.1). See RoutingSpec.
	Routing string  `yaml:"routing,omitempty" json:"routing,omitempty"`
	ZipfS   float64 `yaml:"zipf_s,omitempty" json:"zipf_s,omitempty"`
	// ScaleToFit lets eprun run the config scaled down (fewer ranks and
	// tokens, every other field kept; ScaleDown) where the memory estimate
	// says it cannot fit, instead of refusing it. Configs of shapes too
	// large for one machine, such as the workload of record, set it.
	ScaleToFit bool `yaml:"scale_to_fit,omitempty" json:"scale_to_fit,omitempty"`
}

// RoutingSpec is the config's routing generator.
func (c Config) RoutingSpec() RoutingSpec { return RoutingSpec{Kind: c.Routing, ZipfS: c.ZipfS} }

// Defaults is what a field left out of a YAML config gets.
func Defaults() Config {
	return Config{
		Backend:   BackendHost,
		Ranks:     8,
		Experts:   64,
		TopK:      Ints{8},
		Hidden:    Ints{2048},
		Tokens:    Ints{512},
		DType:     Strings{"bf16"},
		SMs:       Ints{0},
		ChunkRows: Ints{0},
		Iters:     20,
		Warmup:    3,
		Count:     1,
		Mode:      Strings{ModeBlocking},
		Pad:       1,
		Seed:      1,
		Calls:     slices.Clone(AllCalls),
		Routing:   RoutingUniform,
	}
}

// A config is a few dozen lines: ParseConfig refuses more than
// MaxConfigBytes, and a YAML document of more than maxConfigNodes nodes or
// a mapping of more than maxConfigKeys keys, before decoding it (the YAML
// decoder compares every key of a mapping with every other: a 20 MB file
// of repeated keys took it 30 s and 913 MB, one of 1.2 MB minutes and tens
// of GB). Sweeps of up to maxCases cases fit well within them.
const (
	MaxConfigBytes = 1 << 20
	maxConfigNodes = 1 << 16
	maxConfigKeys  = 256
)

// ParseConfig reads a YAML config over Defaults. Unknown fields are
// errors, as are a key given twice and a config larger than the bounds
// above.
func ParseConfig(r io.Reader) (Config, error) {
	c := Defaults()
	data, err := io.ReadAll(io.LimitReader(r, MaxConfigBytes+1))
	if err != nil {
		return c, fmt.Errorf("config: %w", err)
	}
	if len(data) > MaxConfigBytes {
		return c, fmt.Errorf("config: more than %d bytes; a config is a few dozen lines (a sweep lists its values)", MaxConfigBytes)
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return c, fmt.Errorf("config: %s", oneLine(err.Error()))
	}
	if err := checkYAML(&doc); err != nil {
		return c, fmt.Errorf("config: %w", err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&c); err != nil && !errors.Is(err, io.EOF) {
		return c, fmt.Errorf("config: %s", oneLine(err.Error()))
	}
	return c, nil
}

// checkYAML walks a parsed document: at most maxConfigNodes nodes, no
// mapping of more than maxConfigKeys keys, no key twice in one mapping.
func checkYAML(doc *yaml.Node) error {
	nodes := 0
	var walk func(n *yaml.Node) error
	walk = func(n *yaml.Node) error {
		if nodes++; nodes > maxConfigNodes {
			return fmt.Errorf("more than %d YAML nodes; a config is a few dozen lines (a sweep lists its values)", maxConfigNodes)
		}
		if n.Kind == yaml.MappingNode {
			seen := map[string]int{}
			for i := 0; i+1 < len(n.Content); i += 2 {
				k := n.Content[i]
				if k.Kind == yaml.ScalarNode {
					if line, ok := seen[k.Value]; ok {
						return fmt.Errorf("line %d: key %q is already given at line %d", k.Line, k.Value, line)
					}
					seen[k.Value] = k.Line
				}
			}
			if len(n.Content)/2 > maxConfigKeys {
				return fmt.Errorf("line %d: a mapping of %d keys, more than %d; a config has a few dozen fields", n.Line, len(n.Content)/2, maxConfigKeys)
			}
		}
		for _, ch := range n.Content {
			if err := walk(ch); err != nil {
				return err
			}
		}
		return nil
	}
	return walk(doc)
}

// LoadConfig reads a YAML config file (at most MaxConfigBytes).
func LoadConfig(path string) (Config, error) {
	f, err := os.Open(path)
	if err != nil {
		return Config{}, err
	}
	defer f.Close()
	if st, err := f.Stat(); err == nil && st.Mode().IsRegular() && st.Size() > MaxConfigBytes {
		return Config{}, fmt.Errorf("%s: config of %d bytes, more than %d; a config is a few dozen lines (a sweep lists its values)", path, st.Size(), MaxConfigBytes)
	}
	c, err := ParseConfig(f)
	if err != nil {
		return c, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}

// oneLine folds a multi-line message (yaml's) into one line.
func oneLine(s string) string {
	f := strings.Fields(strings.ReplaceAll(s, "\n", "; "))
	return strings.ReplaceAll(strings.Join(f, " "), ":;", ":")
}

// Validate checks the config and says what is wrong.
func (c Config) Validate() error {
	switch {
	case c.Backend != "" && !slices.Contains(Backends, c.Backend):
		return fmt.Errorf("backend %q: want %s", c.Backend, strings.Join(Backends, " or "))
	case c.Ranks <= 0:
		return fmt.Errorf("ranks is %d; need at least 1", c.Ranks)
	case c.Experts <= 0:
		return fmt.Errorf("experts is %d; need at least 1", c.Experts)
	case c.Experts%c.Ranks != 0:
		return fmt.Errorf("experts %d is not a multiple of ranks %d; every rank owns E/R experts", c.Experts, c.Ranks)
	case len(c.TopK) == 0:
		return errors.New("topk is empty")
	case c.RanksPerDomain < 0 || (c.RanksPerDomain > 0 && c.Ranks%c.RanksPerDomain != 0):
		return fmt.Errorf("ranks_per_domain %d does not divide ranks %d", c.RanksPerDomain, c.Ranks)
	case len(c.Hidden) == 0:
		return errors.New("hidden is empty")
	case len(c.Tokens) == 0:
		return errors.New("tokens is empty")
	case len(c.DType) == 0:
		return errors.New("dtype is empty")
	case len(c.SMs) == 0:
		return errors.New("sms is empty (0: the engine's default, no bound)")
	case len(c.ChunkRows) == 0:
		return errors.New("chunk_rows is empty (0: the engine's default)")
	case c.Iters <= 0:
		return fmt.Errorf("iters is %d; need at least 1", c.Iters)
	case c.Iters > maxIters:
		return fmt.Errorf("iters is %d; at most %d (each iteration's time is kept)", c.Iters, maxIters)
	case c.Warmup < 0:
		return fmt.Errorf("warmup is %d; cannot be negative", c.Warmup)
	case c.Warmup > maxIters:
		return fmt.Errorf("warmup is %d; at most %d", c.Warmup, maxIters)
	case c.Count <= 0:
		return fmt.Errorf("count is %d; need at least 1 (the number of times the whole sweep runs)", c.Count)
	case c.Count > maxCases:
		return fmt.Errorf("count is %d; at most %d (every repetition's rows are kept)", c.Count, maxCases)
	case len(c.Mode) == 0:
		return errors.New("mode is empty")
	case c.Pad <= 0:
		return fmt.Errorf("pad is %d; need at least 1 (1 = no padding)", c.Pad)
	case c.MaxRecvTokens < 0 || c.MaxPermutedTokens < 0:
		return errors.New("max_recv_tokens and max_permuted_tokens cannot be negative")
	case len(c.Calls) == 0:
		return errors.New("calls is empty")
	}
	for _, k := range c.TopK {
		if k <= 0 || k > c.Experts {
			return fmt.Errorf("topk is %d; need 1 <= topk <= experts (%d)", k, c.Experts)
		}
	}
	for _, m := range c.Mode {
		if !slices.Contains(Modes, m) {
			return fmt.Errorf("mode %q: want %s", m, strings.Join(Modes, " or "))
		}
	}
	for _, h := range c.Hidden {
		if h <= 0 {
			return fmt.Errorf("hidden %d: need at least 1", h)
		}
	}
	for _, t := range c.Tokens {
		if t < 0 {
			return fmt.Errorf("tokens %d: cannot be negative", t)
		}
	}
	for _, n := range c.SMs {
		if n < 0 {
			return fmt.Errorf("sms %d: cannot be negative (0: no bound)", n)
		}
	}
	for _, n := range c.ChunkRows {
		if n < 0 {
			return fmt.Errorf("chunk_rows %d: cannot be negative (0: the engine's default)", n)
		}
	}
	for _, d := range c.DType {
		dt, err := parseDType(d)
		if err != nil {
			return err
		}
		if dt != device.FP8E4M3 {
			continue
		}
		for _, h := range c.Hidden {
			if h%device.FP8ScaleChannels == 0 {
				continue
			}
			fix := fmt.Sprintf("use a multiple of %d, such as %d", device.FP8ScaleChannels, (h/device.FP8ScaleChannels+1)*device.FP8ScaleChannels)
			if len(c.Hidden) > 1 || len(c.DType) > 1 {
				fix = fmt.Sprintf("every dtype of the sweep runs with every hidden, so drop hidden %d or run fp8 on its own", h)
			}
			return fmt.Errorf("the case dtype=%s hidden=%d: fp8 needs hidden to be a multiple of %d (one fp32 scale per %d channels); %s",
				d, h, device.FP8ScaleChannels, device.FP8ScaleChannels, fix)
		}
	}
	for i, call := range c.Calls {
		if !slices.Contains(KnownCalls, call) {
			return fmt.Errorf("call %q: want one of %s", call, strings.Join(KnownCalls, ", "))
		}
		if slices.Contains(c.Calls[:i], call) {
			return fmt.Errorf("call %q is listed twice", call)
		}
	}
	if err := c.RoutingSpec().Validate(); err != nil {
		return err
	}
	// The capacities size capacity mode's outputs; in a run with no
	// capacity case they would be silently ignored.
	if (c.MaxRecvTokens != 0 || c.MaxPermutedTokens != 0) && !slices.Contains(c.Mode, ModeCapacity) {
		var set []string
		if c.MaxRecvTokens != 0 {
			set = append(set, fmt.Sprintf("max_recv_tokens %d", c.MaxRecvTokens))
		}
		if c.MaxPermutedTokens != 0 {
			set = append(set, fmt.Sprintf("max_permuted_tokens %d", c.MaxPermutedTokens))
		}
		return fmt.Errorf("%s: the capacities size the outputs of capacity mode, and no case runs in it (mode %v): drop them or add mode capacity",
			strings.Join(set, " and "), c.Mode)
	}
	if _, err := c.domainSize(); err != nil {
		return err
	}
	// Sizes the engine would refuse (its indices are int32 on the device)
	// and sweeps too long to run, caught before anything is allocated.
	if big := slices.Max([]int{c.Ranks, c.Experts, slices.Max(c.Hidden), slices.Max(c.Tokens),
		c.Pad, c.MaxRecvTokens, c.MaxPermutedTokens, slices.Max(c.SMs), slices.Max(c.ChunkRows)}); big > maxSize {
		return fmt.Errorf("a size is %d, more than %d (ranks, experts, hidden, tokens, pad, the capacities, sms and chunk_rows must fit int32 indices)", big, maxSize)
	}
	// The rows a rank may receive and permute, padding included, are
	// indexed by int32 on the device too: every rank may receive every
	// token, each in up to min(K, E/R) of its experts' segments, and each
	// of its E/R segments is padded by up to pad-1 rows.
	maxT, l := slices.Max(c.Tokens), c.Experts/c.Ranks
	if n := float64(c.Ranks) * float64(maxT); n > maxSize {
		return fmt.Errorf("ranks %d x tokens %d = %.0f rows a rank may receive, more than %d (row indices are int32 on the device): lower tokens or ranks", c.Ranks, maxT, n, maxSize)
	}
	for _, k := range c.TopK {
		rows := float64(c.Ranks)*float64(maxT)*float64(min(k, l)) + float64(l)*float64(c.Pad-1)
		if rows > maxSize {
			return fmt.Errorf("the case topk=%d tokens=%d pad=%d may permute %.0f rows a rank (ranks x tokens x min(topk, experts/ranks) + experts/ranks x (pad-1)), more than %d (row positions are int32 on the device): lower pad, tokens or topk", k, maxT, c.Pad, rows, maxSize)
		}
	}
	cases := 1
	for _, n := range []int{len(c.Mode), len(c.TopK), len(c.DType), len(c.Hidden), len(c.SMs), len(c.ChunkRows), len(c.Tokens)} {
		if cases *= n; cases > maxCases {
			return fmt.Errorf("the sweep has more than %d cases (mode x topk x dtype x hidden x sms x chunk_rows x tokens); split it into several runs", maxCases)
		}
	}
	if cases*c.Count > maxCases {
		return fmt.Errorf("the sweep's %d cases run count %d times, more than %d case runs (every repetition's rows are kept); lower count or split the sweep", cases, c.Count, maxCases)
	}
	return nil
}

// maxSize bounds every size of a config (executor.Config's bound);
// maxCases the cases of one sweep, and its cases times its count;
// maxIters the iterations (and the warm-up) of one case.
const (
	maxSize  = 1 << 30
	maxCases = 10000
	maxIters = 10_000_000
)

func parseDType(s string) (device.DType, error) {
	dt, err := device.ParseDType(s)
	if err != nil || (dt != device.BF16 && dt != device.FP32 && dt != device.FP8E4M3) {
		return 0, fmt.Errorf("dtype %q: want bf16, fp32 or fp8", s)
	}
	return dt, nil
}

// domainSize is D as the engine will see it: RanksPerDomain, else
// GOEP_RANKS_PER_DOMAIN, else all ranks.
func (c Config) domainSize() (int, error) {
	if c.RanksPerDomain > 0 {
		return c.RanksPerDomain, nil
	}
	if v, ok := os.LookupEnv("GOEP_RANKS_PER_DOMAIN"); ok {
		d, err := strconv.Atoi(v)
		if err != nil || d <= 0 {
			return 0, fmt.Errorf("GOEP_RANKS_PER_DOMAIN=%q: want a positive integer", v)
		}
		if c.Ranks%d != 0 {
			return 0, fmt.Errorf("GOEP_RANKS_PER_DOMAIN=%d does not divide ranks %d", d, c.Ranks)
		}
		return d, nil
	}
	return c.Ranks, nil
}

// capacities is the output capacities of capacity-mode case cs: the
// config's MaxRecvTokens and MaxPermutedTokens, each 0 replaced by the
// case's worst case: every rank receives at most every token of every rank
// (R x the sweep's largest tokens), each in at most min(K, E/R) of its
// experts' segments, plus the padding of each segment (E/R x (Pad-1)).
// Validate bounds them by maxSize.
func (c Config) capacities(cs Case) (recv, permuted int) {
	maxT := slices.Max(c.Tokens)
	l := c.Experts / c.Ranks
	recv, permuted = c.MaxRecvTokens, c.MaxPermutedTokens
	if recv == 0 {
		recv = max(1, c.Ranks*maxT)
	}
	if permuted == 0 {
		permuted = max(1, c.Ranks*maxT*min(cs.TopK, l)+l*(c.Pad-1))
	}
	return recv, permuted
}

// rows is the number of rows a complete run of c has: a row per call and
// case, Count times.
func (c Config) rows() int { return len(c.Calls) * len(c.Cases()) * max(c.Count, 1) }

// Case is one point of the sweep.
type Case struct {
	Mode           string // ModeBlocking or ModeCapacity
	TopK           int
	Tokens, Hidden int
	DType          device.DType
	// SMs and ChunkRows are the engine's tuning knobs (0: its default).
	SMs, ChunkRows int
}

// CallDType is the dtype of the rows call moves in case c: the case's,
// except that the calls that combine (combine, unpermute-combine,
// dispatch-combine) of an fp8 case run in bf16. fp8 is for dispatch only
// (DESIGN.md section 1): a combine sums rows, and the engine refuses fp8
// there. So an fp8 case measures what DeepEP's headline numbers do, fp8
// dispatch and bf16 combine; its combine calls get bf16 inputs of their
// own, and dispatch-combine is a bf16 round trip.
func (c Case) CallDType(call string) device.DType {
	if c.DType == device.FP8E4M3 && combines(call) {
		return device.BF16
	}
	return c.DType
}

// callDTypes lists the distinct dtypes the calls of case c move, in the
// order of the calls: one, or for an fp8 case with calls of both kinds, fp8
// and bf16. The case has a copy baseline of each.
func (c Case) callDTypes(calls []string) []device.DType {
	var out []device.DType
	for _, call := range calls {
		if dt := c.CallDType(call); !slices.Contains(out, dt) {
			out = append(out, dt)
		}
	}
	return out
}

// RowBytes is the bytes of one row of h elements of dtype dt as a call
// moves it (DESIGN.md section 6): h x the element size, plus, for fp8, its
// h/128 fp32 scales (4 bytes each).
func RowBytes(dt device.DType, h int) int {
	if dt == device.FP8E4M3 {
		return h + h/device.FP8ScaleChannels*4
	}
	return h * dt.Size()
}

// knobs is " sms=N chunk_rows=N" for the knobs not at their default (0),
// to append to a case's name in an error.
func (c Case) knobs() string {
	s := ""
	if c.SMs != 0 {
		s += fmt.Sprintf(" sms=%d", c.SMs)
	}
	if c.ChunkRows != 0 {
		s += fmt.Sprintf(" chunk_rows=%d", c.ChunkRows)
	}
	return s
}

// Cases expands the sweep, each list in the order given, nested from the
// outermost: mode, then topk, then dtype, then hidden, then sms, then
// chunk_rows, then tokens (the innermost, so that the cases of one curve
// of bandwidth against tokens are adjacent). For mode [blocking, capacity]
// and topk [2, 4]: blocking topk 2, blocking topk 4, capacity topk 2,
// capacity topk 4, each with every dtype, hidden, sms, chunk_rows and
// tokens.
func (c Config) Cases() []Case {
	var out []Case
	for _, m := range c.Mode {
		for _, k := range c.TopK {
			for _, d := range c.DType {
				dt, _ := parseDType(d)
				for _, h := range c.Hidden {
					for _, sms := range c.SMs {
						for _, chunk := range c.ChunkRows {
							for _, t := range c.Tokens {
								out = append(out, Case{Mode: m, TopK: k, Tokens: t, Hidden: h, DType: dt, SMs: sms, ChunkRows: chunk})
							}
						}
					}
				}
			}
		}
	}
	return out
}

// The modes of executor.Config.Mode, as a config names them.
const (
	ModeBlocking = "blocking"
	ModeCapacity = "capacity"
)

// Modes lists the modes a config may name.
var Modes = []string{ModeBlocking, ModeCapacity}

// Ints is a list of ints that YAML (and JSON) may also give as one
// scalar. It formats as its values separated by commas, as the flags take
// them ("8", "4,8"), with %v, %s and %d.
type Ints []int

// Format implements fmt.Formatter: %v, %s and %d print the values
// separated by commas; other verbs (and %#v) print the []int.
func (v Ints) Format(f fmt.State, verb rune) {
	switch {
	case f.Flag('#') || (verb != 'v' && verb != 's' && verb != 'd'):
		fmt.Fprintf(f, fmt.FormatString(f, verb), []int(v))
	default:
		s := make([]string, len(v))
		for i, x := range v {
			s[i] = strconv.Itoa(x)
		}
		fmt.Fprintf(f, fmt.FormatString(f, 's'), strings.Join(s, ","))
	}
}

// UnmarshalJSON accepts a number as a list of one (records written before
// the field was a list).
func (v *Ints) UnmarshalJSON(b []byte) error { return unmarshalOneOrMany(b, (*[]int)(v)) }

// UnmarshalYAML implements yaml.Unmarshaler.
func (v *Ints) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.ScalarNode {
		var x int
		if err := n.Decode(&x); err != nil {
			return err
		}
		*v = Ints{x}
		return nil
	}
	var xs []int
	if err := n.Decode(&xs); err != nil {
		return err
	}
	*v = xs
	return nil
}

// Strings is a list of strings that YAML (and JSON) may also give as one
// scalar. Its String is the values separated by commas, as the flags take
// them ("blocking", "blocking,capacity").
type Strings []string

// String implements fmt.Stringer: the values separated by commas.
func (v Strings) String() string { return strings.Join(v, ",") }

// UnmarshalJSON accepts a string as a list of one (records written before
// the field was a list).
func (v *Strings) UnmarshalJSON(b []byte) error { return unmarshalOneOrMany(b, (*[]string)(v)) }

// unmarshalOneOrMany decodes JSON b, a value or a list of values, into *v
// as a list; null leaves *v as it is.
func unmarshalOneOrMany[T any](b []byte, v *[]T) error {
	if string(b) == "null" {
		return nil
	}
	var x T
	if err := json.Unmarshal(b, &x); err == nil {
		*v = []T{x}
		return nil
	}
	var xs []T
	if err := json.Unmarshal(b, &xs); err != nil {
		return err
	}
	*v = xs
	return nil
}

// UnmarshalYAML implements yaml.Unmarshaler.
func (v *Strings) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.ScalarNode {
		*v = Strings{n.Value}
		return nil
	}
	var xs []string
	if err := n.Decode(&xs); err != nil {
		return err
	}
	*v = xs
	return nil
}
