package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/goep/goep/internal/bench"
	"github.com/goep/goep/launcher"
	"github.com/goep/goep/rdma"
)

// sysNodeDir is where Linux lists the NUMA nodes (a variable for tests).
var sysNodeDir = "/sys/devices/system/node"

// topoReport is what eprun topo prints: the machine as goep sees it.
type topoReport struct {
	Host   string `json:"host"`
	CPU    string `json:"cpu,omitempty"`
	NumCPU int    `json:"num_cpu"`
	// Allowed is this process's CPU list (Cpus_allowed_list).
	Allowed  string     `json:"cpus_allowed,omitempty"`
	NUMA     []numaNode `json:"numa_nodes"`
	NUMAErr  string     `json:"numa_error,omitempty"`
	GPUs     gpuReport  `json:"gpus"`
	RDMA     rdmaReport `json:"rdma"`
	Launcher struct {
		Kind      string `json:"kind"`
		Rank      int    `json:"rank"`
		Size      int    `json:"size"`
		LocalRank int    `json:"local_rank"`
		LocalSize int    `json:"local_size"`
		Error     string `json:"error,omitempty"`
	} `json:"launcher"`
	// RanksPerDomainEnv is GOEP_RANKS_PER_DOMAIN ("" when unset).
	RanksPerDomainEnv string       `json:"goep_ranks_per_domain,omitempty"`
	Layout            domainLayout `json:"layout"`
}

type numaNode struct {
	ID       int    `json:"id"`
	CPUs     string `json:"cpus"`
	MemBytes int64  `json:"mem_bytes,omitempty"`
}

// gpuReport is what NVML says; Error says why it said nothing.
type gpuReport struct {
	Driver  string   `json:"driver,omitempty"`
	Devices []gpuDev `json:"devices"`
	Error   string   `json:"error,omitempty"`
}

type gpuDev struct {
	Index    int    `json:"index"`
	Name     string `json:"name"`
	UUID     string `json:"uuid,omitempty"`
	BusID    string `json:"pci_bus_id,omitempty"`
	MemBytes uint64 `json:"mem_bytes,omitempty"`
	// NVLinks is the number of active NVLinks; NVLinkPeers the distinct
	// PCI bus ids at their far ends (GPUs or NVSwitches).
	NVLinks     int      `json:"nvlinks"`
	NVLinkPeers []string `json:"nvlink_peers,omitempty"`
	// Fabric is the multi-node NVLink fabric (GB200 NVL72 and the like):
	// GPUs of one cluster and clique share an NVLink domain. Empty where
	// the GPU has no fabric or NVML does not say.
	FabricCluster string `json:"fabric_cluster,omitempty"`
	FabricClique  uint32 `json:"fabric_clique,omitempty"`
	FabricState   string `json:"fabric_state,omitempty"`
}

// rdmaReport is what UCX offers for the rail between domains: its
// transport resources, the RDMA-capable network devices among them, and
// whether it can move GPU memory. Error says why it said nothing (a binary
// built without -tags ucx).
type rdmaReport struct {
	UCXVersion string        `json:"ucx_version,omitempty"`
	Devices    []rdma.Device `json:"devices"`
	// RDMADevices are the devices with an RDMA transport (InfiniBand or
	// RoCE verbs), each once, in UCX's order.
	RDMADevices []string `json:"rdma_devices"`
	// GPUTransports are the transports that move GPU memory (cuda_copy,
	// cuda_ipc, gdr_copy, ...), each once.
	GPUTransports []string `json:"gpu_transports"`
	// MemoryTypes is what a UCX context can access ("host", "host,
	// cuda", ...): CUDA memory means GPUDirect RDMA could feed the rail.
	MemoryTypes string `json:"memory_types,omitempty"`
	// Skipped counts the UCX components and memory domains that did not
	// answer (their driver or hardware is absent).
	Skipped int    `json:"skipped_memory_domains,omitempty"`
	Error   string `json:"error,omitempty"`
}

// ucxDevices fills the report from rdma.Devices.
func ucxDevices() rdmaReport {
	res, err := rdma.Devices()
	if err != nil {
		return rdmaReport{Devices: []rdma.Device{}, RDMADevices: []string{}, GPUTransports: []string{}, Error: err.Error()}
	}
	return rdmaFrom(res)
}

// rdmaFrom is the report of UCX's resources res.
func rdmaFrom(res rdma.Resources) rdmaReport {
	devs := res.Devices
	if devs == nil {
		devs = []rdma.Device{} // "devices": [] in the JSON
	}
	rep := rdmaReport{UCXVersion: res.UCXVersion, Devices: devs, RDMADevices: res.RDMADevices(), GPUTransports: []string{}, Skipped: res.Skipped}
	if res.MemoryTypes != 0 {
		rep.MemoryTypes = res.MemoryTypes.String()
	}
	for _, d := range devs {
		if d.GPU() && !slices.Contains(rep.GPUTransports, d.Transport) {
			rep.GPUTransports = append(rep.GPUTransports, d.Transport)
		}
	}
	return rep
}

// domainLayout is the domain split goep would choose: D =
// GOEP_RANKS_PER_DOMAIN, else the ranks of one host (as executor.New
// detects when RanksPerDomain is 0).
type domainLayout struct {
	Ranks          int      `json:"ranks"`
	RanksFrom      string   `json:"ranks_from"`
	RanksPerDomain int      `json:"ranks_per_domain"`
	Domains        int      `json:"domains"`
	Why            string   `json:"why"`
	DomainRanks    []string `json:"domain_ranks,omitempty"`
	Notes          []string `json:"notes,omitempty"`
	Error          string   `json:"error,omitempty"`
}

func newTopo(stdout io.Writer) *cobra.Command {
	var (
		ranks   int
		jsonOut bool
	)
	cmd := &cobra.Command{
		Use:   "topo",
		Short: "Show what goep sees: CPUs and NUMA nodes, GPUs and NVLink, UCX's RDMA devices, the launcher, the domain layout",
		Long: `Show what goep sees on this machine and in this process's environment: the CPUs and NUMA nodes
(from /sys/devices/system/node), the GPUs with their NVLinks and NVLink fabric clique where
NVML answers, UCX's transports and devices (the rail between domains: which are RDMA-capable,
whether UCX can move GPU memory; a binary built with -tags ucx), the launcher's environment
(launcher.Detect), GOEP_RANKS_PER_DOMAIN, and the
NVLink-domain layout goep would choose for the world (D = GOEP_RANKS_PER_DOMAIN, else the
ranks of one host, which must be consecutive) and why.

The world is the launcher's (run it as eprun launch -n 8 -- eprun topo, or under mpirun / srun),
else --ranks R, else a single process. Under a launcher rank 0 prints the report and every
other rank one line: its host, place, CPUs and GPUs, and what is invalid in its environment.
--json prints the same as JSON (a rank other than 0: one object on one line). Exits 1 if the
launcher's environment or GOEP_RANKS_PER_DOMAIN is invalid, after printing.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if cmd.Flags().Changed("ranks") && ranks < 1 {
				return fmt.Errorf("topo: --ranks %d: want at least 1", ranks)
			}
			rep, problems := collectTopo(ranks)
			var err error
			switch l := rep.Launcher; {
			case l.Kind != launcher.KindSingle && l.Error == "" && l.Rank != 0:
				// The report of every rank of a host is the same but
				// for a line or two: N of them bury the one that differs.
				err = writeTopoSummary(stdout, rep, jsonOut)
			case jsonOut:
				data, merr := json.MarshalIndent(rep, "", "  ")
				if merr != nil {
					return runError{merr}
				}
				_, err = stdout.Write(append(data, '\n'))
			default:
				err = writeTopo(stdout, rep)
			}
			if err = errors.Join(err, problems); err != nil {
				return runError{fmt.Errorf("topo: %w", err)}
			}
			return nil
		},
	}
	cmd.Flags().IntVar(&ranks, "ranks", 0, "ranks R to lay out (default: the launcher's world, else 1)")
	cmd.Flags().BoolVar(&jsonOut, "json", false, "print JSON instead of the text report")
	return cmd
}

// topoJSON is the topo report of this process for a world of ranks (the
// launcher's when there is one), as JSON for a bench record. Invalid
// settings are in the report's error fields; bench has already refused
// them if they mattered.
func topoJSON(ranks int) json.RawMessage {
	rep, _ := collectTopo(ranks)
	data, err := json.Marshal(rep)
	if err != nil {
		return nil
	}
	return data
}

// collectTopo gathers the report; problems are invalid settings it found.
func collectTopo(ranks int) (topoReport, error) {
	var rep topoReport
	var problems []error
	rep.Host, _ = os.Hostname()
	rep.NumCPU = runtime.NumCPU()
	rep.CPU = bench.ProcField("/proc/cpuinfo", "model name")
	rep.Allowed = bench.ProcField("/proc/self/status", "Cpus_allowed_list")
	var err error
	if rep.NUMA, err = numaNodes(sysNodeDir); err != nil {
		rep.NUMAErr = err.Error()
	}
	rep.GPUs = nvmlGPUs()
	rep.RDMA = ucxDevices()

	env, err := launcher.Detect()
	rep.Launcher.Kind, rep.Launcher.Rank, rep.Launcher.Size = env.Kind, env.Rank, env.Size
	rep.Launcher.LocalRank, rep.Launcher.LocalSize = env.LocalRank, env.LocalSize
	if err != nil {
		rep.Launcher.Error = err.Error()
		problems = append(problems, err)
	}
	v, set := os.LookupEnv("GOEP_RANKS_PER_DOMAIN")
	if set {
		rep.RanksPerDomainEnv = v
	}

	l := &rep.Layout
	switch {
	case ranks > 0:
		l.Ranks, l.RanksFrom = ranks, "--ranks"
		if err == nil && env.Kind != launcher.KindSingle && env.Size != ranks {
			l.Notes = append(l.Notes, fmt.Sprintf("%s started %d processes; under a launcher the ranks are the processes, so eprun bench would use %d", env.Kind, env.Size, env.Size))
		}
	case err == nil && env.Kind != launcher.KindSingle:
		l.Ranks, l.RanksFrom = env.Size, "launcher "+env.Kind
	default:
		l.Ranks, l.RanksFrom = 1, "a single process; --ranks R lays out R ranks"
	}
	r := l.Ranks
	switch d, perr := strconv.Atoi(strings.TrimSpace(v)); {
	case !set && err == nil && env.Kind != launcher.KindSingle && ranks == 0 && env.LocalSize > 0 && env.LocalSize < r:
		if r%env.LocalSize != 0 {
			l.Error = fmt.Sprintf("GOEP_RANKS_PER_DOMAIN is unset and the %d ranks do not split into hosts of %d (the launcher's local size): the engine would refuse to start; set GOEP_RANKS_PER_DOMAIN", r, env.LocalSize)
			break
		}
		l.RanksPerDomain = env.LocalSize
		l.Why = fmt.Sprintf("GOEP_RANKS_PER_DOMAIN is unset: the engine makes the ranks of each host one NVLink domain (detected by executor.New from host names and NVLink fabric cliques; they must be consecutive); the launcher puts %d ranks on this host", env.LocalSize)
	case !set:
		l.RanksPerDomain = r
		l.Why = "GOEP_RANKS_PER_DOMAIN is unset: the engine makes the ranks of each host one NVLink domain (detected by executor.New from host names and NVLink fabric cliques), and all of them are on this host"
	case perr != nil || d <= 0:
		l.Error = fmt.Sprintf("GOEP_RANKS_PER_DOMAIN=%q: want a positive integer; the engine would refuse to start", v)
	case r%d != 0:
		l.Error = fmt.Sprintf("GOEP_RANKS_PER_DOMAIN=%d does not divide the %d ranks; the engine would refuse to start", d, r)
	default:
		l.RanksPerDomain = d
		l.Why = fmt.Sprintf("GOEP_RANKS_PER_DOMAIN=%d", d)
	}
	if l.Error != "" {
		problems = append(problems, errors.New(l.Error))
		return rep, errors.Join(problems...)
	}
	d := l.RanksPerDomain
	l.Domains = r / d
	for i := range l.Domains {
		if i == 8 && l.Domains > 9 {
			l.DomainRanks = append(l.DomainRanks, fmt.Sprintf("... %d more domains of %d", l.Domains-8, d))
			break
		}
		l.DomainRanks = append(l.DomainRanks, rankRange(i*d, (i+1)*d-1))
	}
	if l.Domains > 1 {
		l.Notes = append(l.Notes, "several domains: tokens cross domains over the rail transport between ranks of the same local index (rdma.New: in-process for goroutine ranks, UCX across processes, which needs a binary built with -tags ucx); on the CUDA backend the rail's rows are staged through pinned host memory")
	}
	if err == nil && env.Kind != launcher.KindSingle && d > env.LocalSize {
		l.Notes = append(l.Notes, fmt.Sprintf("a domain of %d ranks spans nodes (%d ranks per node): it needs a multi-node NVLink fabric, every GPU in one fabric clique, and the CUDA backend", d, env.LocalSize))
	}
	if note := fabricNote(rep.GPUs); note != "" {
		l.Notes = append(l.Notes, note)
	}
	if n := len(rep.GPUs.Devices); n > 0 && err == nil && env.LocalSize > n {
		l.Notes = append(l.Notes, fmt.Sprintf("%d ranks on this node but NVML sees %d GPUs", env.LocalSize, n))
	}
	return rep, errors.Join(problems...)
}

// fabricNote says what this host's GPUs' NVLink fabric means for the
// domains executor.New detects: the ranks of a fabric clique that spans
// hosts form one domain where every rank's GPU shares memory by fabric
// handles (nvlink.ChooseDomains); otherwise one domain a host.
func fabricNote(g gpuReport) string {
	if len(g.Devices) == 0 {
		return ""
	}
	var cliques, states []string
	for _, d := range g.Devices {
		if d.FabricCluster != "" && strings.Trim(d.FabricCluster, "0") != "" && d.FabricState == "completed" {
			if c := fmt.Sprintf("%s/%d", d.FabricCluster, d.FabricClique); !slices.Contains(cliques, c) {
				cliques = append(cliques, c)
			}
			continue
		}
		s := dash(d.FabricState)
		if d.FabricState == "completed" {
			s = "completed without a cluster"
		}
		if !slices.Contains(states, s) {
			states = append(states, s)
		}
	}
	if len(cliques) == 0 {
		return fmt.Sprintf("no multi-node NVLink fabric (NVML fabric state %s): executor.New makes the ranks of each host one domain",
			strings.Join(states, ", "))
	}
	note := fmt.Sprintf("this host's GPUs are in NVLink fabric clique %s (cluster/clique): on the CUDA backend executor.New makes the ranks of a clique that spans hosts one domain, "+
		"where every rank's driver shares memory by fabric handles (an IMEX channel) and that domain is the only one; else one domain per host, and the log says why", strings.Join(cliques, ", "))
	if len(states) > 0 {
		note += fmt.Sprintf("; some GPUs are in no clique (fabric state %s), and a rank on one keeps every rank on per-host domains", strings.Join(states, ", "))
	}
	return note
}

func rankRange(lo, hi int) string {
	if lo == hi {
		return fmt.Sprintf("rank %d", lo)
	}
	return fmt.Sprintf("ranks %d-%d", lo, hi)
}

// numaNodes reads dir/node*/cpulist and meminfo.
func numaNodes(dir string) ([]numaNode, error) {
	ents, err := filepath.Glob(filepath.Join(dir, "node[0-9]*"))
	if err != nil {
		return nil, err
	}
	if len(ents) == 0 {
		return nil, fmt.Errorf("no NUMA nodes in %s", dir)
	}
	var out []numaNode
	for _, e := range ents {
		id, err := strconv.Atoi(strings.TrimPrefix(filepath.Base(e), "node"))
		if err != nil {
			continue
		}
		cpus, err := os.ReadFile(filepath.Join(e, "cpulist"))
		if err != nil {
			return nil, err
		}
		n := numaNode{ID: id, CPUs: strings.TrimSpace(string(cpus))}
		// "Node 0 MemTotal:       24590512 kB"
		if kb := bench.ProcField(filepath.Join(e, "meminfo"), fmt.Sprintf("Node %d MemTotal", id)); kb != "" {
			if v, err := strconv.ParseInt(strings.TrimSuffix(kb, " kB"), 10, 64); err == nil {
				n.MemBytes = v << 10
			}
		}
		out = append(out, n)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

// writeRDMA prints the rdma section: UCX's transports per device, then
// what they mean for the rail between domains.
func writeRDMA(b *strings.Builder, r rdmaReport) {
	b.WriteString("#\n# rdma (UCX, the rail between domains)\n")
	if r.Error != "" {
		fmt.Fprintf(b, "  no UCX: %s\n", r.Error)
		return
	}
	fmt.Fprintf(b, "  %-24s %s, %d transport resources\n", "ucx", dash(r.UCXVersion), len(r.Devices))
	// One line per device, its transports in UCX's order.
	var order []string
	tls := map[string][]string{}
	types := map[string]string{}
	for _, d := range r.Devices {
		if _, ok := tls[d.Device]; !ok {
			order = append(order, d.Device)
			types[d.Device] = d.Type
		}
		tls[d.Device] = append(tls[d.Device], d.Transport)
	}
	for _, dev := range order {
		fmt.Fprintf(b, "  %-24s %s (%s)\n", "device "+dev, strings.Join(tls[dev], ", "), types[dev])
	}
	if len(r.RDMADevices) > 0 {
		fmt.Fprintf(b, "  %-24s %s\n", "rdma devices", strings.Join(r.RDMADevices, ", "))
	} else {
		fmt.Fprintf(b, "  %-24s none (no InfiniBand/RoCE verbs transport): the rail between hosts would run over TCP\n", "rdma devices")
	}
	if r.MemoryTypes != "" {
		fmt.Fprintf(b, "  %-24s %s\n", "memory types", r.MemoryTypes)
	}
	if len(r.GPUTransports) > 0 {
		fmt.Fprintf(b, "  %-24s %s (UCX can move GPU memory; goep still stages the rail's rows through pinned host memory)\n", "gpu memory", strings.Join(r.GPUTransports, ", "))
	} else {
		fmt.Fprintf(b, "  %-24s no (no CUDA transport in this UCX): on the CUDA backend the rail's rows are staged through pinned host memory\n", "gpu memory")
	}
	if r.Skipped > 0 {
		fmt.Fprintf(b, "  note: %d UCX component(s) or memory domain(s) did not answer (a driver or device is missing)\n", r.Skipped)
	}
}

// topoSummary is what a rank other than 0 of a launched world prints: one
// line, where rank 0 prints the report.
type topoSummary struct {
	Host      string `json:"host"`
	Rank      int    `json:"rank"`
	Size      int    `json:"size"`
	LocalRank int    `json:"local_rank"`
	LocalSize int    `json:"local_size"`
	NumCPU    int    `json:"num_cpu"`
	Allowed   string `json:"cpus_allowed,omitempty"`
	GPUs      int    `json:"gpus"`
	GPUError  string `json:"gpu_error,omitempty"`
	// Error is what is invalid in the rank's environment (its domain
	// layout); the command then exits 1.
	Error string `json:"error,omitempty"`
	Note  string `json:"note"`
}

// writeTopoSummary prints rep as one line: text, or a JSON object.
func writeTopoSummary(w io.Writer, rep topoReport, jsonOut bool) error {
	l := rep.Launcher
	s := topoSummary{Host: rep.Host, Rank: l.Rank, Size: l.Size, LocalRank: l.LocalRank, LocalSize: l.LocalSize,
		NumCPU: rep.NumCPU, Allowed: rep.Allowed, GPUs: len(rep.GPUs.Devices), GPUError: rep.GPUs.Error,
		Error: rep.Layout.Error, Note: "full report on rank 0"}
	if jsonOut {
		data, err := json.Marshal(s)
		if err != nil {
			return err
		}
		_, err = w.Write(append(data, '\n'))
		return err
	}
	gpus := fmt.Sprintf("%d GPUs", s.GPUs)
	if s.GPUError != "" {
		gpus = "no NVML"
	}
	invalid := ""
	if s.Error != "" {
		invalid = "; INVALID: " + s.Error
	}
	_, err := fmt.Fprintf(w, "# eprun topo: rank %d of %d (local %d of %d) on %s: %d logical cpus (may run on %s), %s%s; full report on rank 0\n",
		s.Rank, s.Size, s.LocalRank, s.LocalSize, dash(s.Host), s.NumCPU, dash(s.Allowed), gpus, invalid)
	return err
}

func gib(b uint64) string { return fmt.Sprintf("%.1f GiB", float64(b)/(1<<30)) }

// writeTopo prints the text report.
func writeTopo(w io.Writer, rep topoReport) error {
	var b strings.Builder
	fmt.Fprintf(&b, "# eprun topo: what goep sees on %s\n#\n# cpus\n", dash(rep.Host))
	fmt.Fprintf(&b, "  %-24s %s\n", "model", dash(rep.CPU))
	fmt.Fprintf(&b, "  %-24s %d (this process may run on %s)\n", "logical cpus", rep.NumCPU, dash(rep.Allowed))
	if rep.NUMAErr != "" {
		fmt.Fprintf(&b, "  %-24s unknown: %s\n", "numa nodes", rep.NUMAErr)
	} else {
		fmt.Fprintf(&b, "  %-24s %d\n", "numa nodes", len(rep.NUMA))
	}
	for _, n := range rep.NUMA {
		mem := ""
		if n.MemBytes > 0 {
			mem = "  memory " + gib(uint64(n.MemBytes))
		}
		fmt.Fprintf(&b, "  %-24s cpus %s%s\n", fmt.Sprintf("node %d", n.ID), n.CPUs, mem)
	}
	b.WriteString("#\n# gpus\n")
	g := rep.GPUs
	switch {
	case g.Error != "":
		fmt.Fprintf(&b, "  no NVML: no GPU visible (%s)\n", g.Error)
	case len(g.Devices) == 0:
		fmt.Fprintf(&b, "  NVML (driver %s) sees no GPU\n", dash(g.Driver))
	default:
		fmt.Fprintf(&b, "  %-24s %s, %d GPUs\n", "driver", dash(g.Driver), len(g.Devices))
	}
	for _, d := range g.Devices {
		fmt.Fprintf(&b, "  %-24s %s  %s  %s  %s\n", fmt.Sprintf("gpu %d", d.Index), d.Name, dash(d.UUID), dash(d.BusID), gib(d.MemBytes))
		link := "none active"
		if d.NVLinks > 0 {
			link = fmt.Sprintf("%d active, to %s", d.NVLinks, strings.Join(d.NVLinkPeers, " "))
		}
		fmt.Fprintf(&b, "  %-24s %s\n", "  nvlink", link)
		switch {
		case d.FabricCluster != "":
			fmt.Fprintf(&b, "  %-24s cluster %s clique %d (%s)\n", "  fabric", d.FabricCluster, d.FabricClique, dash(d.FabricState))
		case d.FabricState != "":
			fmt.Fprintf(&b, "  %-24s %s\n", "  fabric", d.FabricState)
		}
	}
	writeRDMA(&b, rep.RDMA)
	b.WriteString("#\n# launcher\n")
	if e := rep.Launcher; e.Error != "" {
		fmt.Fprintf(&b, "  %-24s INVALID: %s\n", "environment", e.Error)
	} else if e.Kind == launcher.KindSingle {
		fmt.Fprintf(&b, "  %-24s none: a single process (rank 0 of 1)\n", "launcher")
	} else {
		fmt.Fprintf(&b, "  %-24s %s: rank %d of %d, local rank %d of %d on this node\n", "launcher", e.Kind, e.Rank, e.Size, e.LocalRank, e.LocalSize)
	}
	env := "unset"
	if v, ok := os.LookupEnv("GOEP_RANKS_PER_DOMAIN"); ok {
		env = strconv.Quote(v)
	}
	fmt.Fprintf(&b, "  %-24s %s\n", "GOEP_RANKS_PER_DOMAIN", env)
	b.WriteString("#\n# domain layout\n")
	l := rep.Layout
	fmt.Fprintf(&b, "  %-24s %d (%s)\n", "ranks R", l.Ranks, l.RanksFrom)
	if l.Error != "" {
		fmt.Fprintf(&b, "  %-24s INVALID: %s\n", "ranks per domain D", l.Error)
	} else {
		fmt.Fprintf(&b, "  %-24s %d (%s)\n", "ranks per domain D", l.RanksPerDomain, l.Why)
		fmt.Fprintf(&b, "  %-24s %d\n", "domains R/D", l.Domains)
		for i, s := range l.DomainRanks {
			fmt.Fprintf(&b, "  %-24s %s\n", fmt.Sprintf("domain %d", i), s)
		}
	}
	for _, n := range l.Notes {
		fmt.Fprintf(&b, "  note: %s\n", n)
	}
	_, err := io.WriteString(w, b.String())
	return err
}
