package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/goep/goep/internal/bench"
)

// The link rates eprun size assumes unless told: a GB300 NVL72 GPU's
// NVLink 5 (1.8 TB/s both ways, 900 GB/s each way) and an 800 Gb/s
// ConnectX-8 NIC a GPU (100 GB/s each way) for the rail. Nominal rates:
// pass measured ones where you have them.
const (
	defaultNVLinkGBps = 900
	defaultRailGBps   = 100
)

func newSize(stdout, stderr io.Writer) *cobra.Command {
	var (
		f         benchFlags
		nvl, rail float64
		jsonOut   string
	)
	cmd := &cobra.Command{
		Use:   "size [CONFIG]",
		Short: "Say what one rank of a config would need and move on the GPU path, at full scale, without running it",
		Long: `Size a run before renting the machines for it: for each case of the config, at its full
scale (nothing runs, nothing is allocated), what one rank would need and move on the GPU path:

  - the engine's memory, from the formulas the GPU path and the rail allocate by: the GPU
    window's regions (flags, dispatch receive, combine, the GPU layout's routing), and with
    several domains (--ranks-per-domain D < ranks) the forwarding buffer and the rail's host
    regions;
  - the outputs of one dispatch, dispatch-permute and combine (blocking mode: sized to the
    rows received and permuted);
  - the bytes a dispatch and a combine move over NVLink (received rows that come from another
    GPU) and over the rail (rows sent to other domains: one per token and destination domain),
    and the time they take at --nvlink-gbps and --rail-gbps (GB/s, one direction, per GPU;
    defaults: GB300's nominal 900 and 100).

Rows are the most of any rank, counted from the routing eprun bench would draw (the config's
routing and seed) where that is at most 2^28 expert slots, else the expectation of uniform
routing; the output says which, and the arithmetic of each figure.

CONFIG and the flags are those of eprun bench (--ranks, --tokens, --hidden, --topk, --experts,
--dtype, --mode, --pad, --routing, --seed, --ranks-per-domain ...); the timing flags are ignored.
--json FILE (or -) writes every figure in bytes.`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := f.configArg(cmd, args); err != nil {
				return err
			}
			cfg, err := loadConfig(f.config)
			if err != nil {
				return fmt.Errorf("size: %w", err)
			}
			f.apply(cmd, &cfg)
			if err := cfg.Validate(); err != nil {
				return fmt.Errorf("size: config: %w", err)
			}
			sz, err := bench.Size(cfg, nvl, rail)
			if err != nil {
				return fmt.Errorf("size: %w", err)
			}
			name := f.config
			if name == "" {
				name = "default"
			}
			out, outName := stdout, "stdout"
			if jsonOut == "-" {
				out, outName = stderr, "stderr"
			}
			if err := bench.WriteSizing(out, name, sz); err != nil {
				return runError{fmt.Errorf("size: %s: %w", outName, err)}
			}
			if jsonOut == "" {
				return nil
			}
			data, err := json.MarshalIndent(struct {
				Config  string         `json:"config"`
				Sizings []bench.Sizing `json:"sizings"`
			}{name, sz}, "", "  ")
			if err != nil {
				return fmt.Errorf("size: --json: %w", err)
			}
			data = append(data, '\n')
			if jsonOut == "-" {
				_, err = stdout.Write(data)
			} else {
				err = os.WriteFile(jsonOut, data, 0o644)
			}
			if err != nil {
				return runError{fmt.Errorf("size: --json %s: %w", jsonOut, err)}
			}
			return nil
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.config, "config", "", "YAML config file or embedded config name (default: the embedded default; embedded: "+strings.Join(embeddedNames(), ", ")+")")
	fl.IntVar(&f.ranks, "ranks", 0, "ranks R")
	fl.IntVar(&f.ranksPerDomain, "ranks-per-domain", 0, "ranks per NVLink domain D (0: one domain of every rank)")
	fl.IntSliceVar(&f.tokens, "tokens", nil, "tokens per rank (comma-separated list: a sizing each)")
	fl.IntSliceVar(&f.hidden, "hidden", nil, "hidden size H (comma-separated list)")
	fl.IntSliceVar(&f.topk, "topk", nil, "expert slots per token K (comma-separated list)")
	fl.IntVar(&f.experts, "experts", 0, "experts E (a multiple of ranks)")
	fl.StringSliceVar(&f.dtype, "dtype", nil, "activation dtype: bf16, fp32 or fp8 (comma-separated list)")
	fl.StringSliceVar(&f.mode, "mode", nil, "blocking or capacity (comma-separated list)")
	fl.IntVar(&f.pad, "pad", 0, "pad multiple of each expert's permuted segment (1 = none)")
	fl.IntVar(&f.maxRecvTokens, "max-recv-tokens", 0, "capacity mode: receive capacity (0: worst case)")
	fl.IntVar(&f.maxPermutedTokens, "max-permuted-tokens", 0, "capacity mode: permuted capacity (0: worst case)")
	fl.Uint64Var(&f.seed, "seed", 0, "seed of the routing counted")
	fl.StringVar(&f.routing, "routing", "", "how tokens pick experts: "+strings.Join(bench.RoutingKinds, ", "))
	fl.Float64Var(&f.zipfS, "zipf-s", 0, "routing zipf: the Zipf exponent s > 0")
	fl.Float64Var(&nvl, "nvlink-gbps", defaultNVLinkGBps, "NVLink rate, GB/s one direction per GPU (default: GB300's nominal)")
	fl.Float64Var(&rail, "rail-gbps", defaultRailGBps, "rail (RDMA NIC) rate, GB/s one direction per GPU (default: an 800 Gb/s NIC a GPU)")
	fl.StringVar(&jsonOut, "json", "", "write every figure as JSON to FILE (- for stdout; the table then goes to stderr)")
	return cmd
}
