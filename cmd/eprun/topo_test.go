package main

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/goep/goep/rdma"
)

func TestTopo(t *testing.T) {
	stdout, _ := eprunOK(t, "topo")
	for _, want := range []string{"# cpus", "logical cpus", "numa nodes", "# gpus", "# launcher", "GOEP_RANKS_PER_DOMAIN", "# domain layout", "ranks per domain D", "domain 0"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("report lacks %q:\n%s", want, stdout)
		}
	}
	// Either UCX answered (a binary built with -tags ucx), or the report
	// says why not.
	_, err := rdma.Devices()
	compiled := !errors.Is(err, rdma.ErrUnsupported)
	if compiled != strings.Contains(stdout, "rdma devices") || compiled == strings.Contains(stdout, "no UCX: ") {
		t.Errorf("ucx compiled %v, but the rdma section says otherwise:\n%s", compiled, stdout)
	}
	// Either NVML answered, or the report says why not.
	if !strings.Contains(stdout, "no NVML: no GPU visible") && !strings.Contains(stdout, "driver") {
		t.Errorf("gpus section says neither:\n%s", stdout)
	}

	t.Setenv("GOEP_RANKS_PER_DOMAIN", "4")
	stdout, _ = eprunOK(t, "topo", "--ranks", "8", "--json")
	var rep topoReport
	if err := json.Unmarshal([]byte(stdout), &rep); err != nil {
		t.Fatalf("--json: %v: %q", err, stdout)
	}
	l := rep.Layout
	if l.Ranks != 8 || l.RanksPerDomain != 4 || l.Domains != 2 || len(l.DomainRanks) != 2 || l.DomainRanks[1] != "ranks 4-7" || !strings.Contains(l.Why, "GOEP_RANKS_PER_DOMAIN=4") {
		t.Errorf("layout %+v", l)
	}
	if len(l.Notes) == 0 || !strings.Contains(l.Notes[0], "rdma.New") || !strings.Contains(l.Notes[0], "-tags ucx") ||
		!strings.Contains(l.Notes[0], "staged through pinned host memory") || strings.Contains(l.Notes[0], "not built yet") {
		t.Errorf("two domains: notes %q, want the rail transport's (rdma.New, -tags ucx across processes, not on CUDA yet)", l.Notes)
	}
	if rep.NumCPU < 1 || rep.Launcher.Kind != "single" || rep.RanksPerDomainEnv != "4" {
		t.Errorf("report %+v", rep)
	}
	if len(rep.GPUs.Devices) == 0 && rep.GPUs.Error == "" {
		t.Errorf("no GPUs and no reason: %+v", rep.GPUs)
	}

	// An invalid GOEP_RANKS_PER_DOMAIN is shown, then exit 1.
	t.Setenv("GOEP_RANKS_PER_DOMAIN", "3")
	code, stdout, stderr := eprun(t, "topo", "--ranks", "8")
	if code != 1 || !strings.Contains(stdout, "INVALID: GOEP_RANKS_PER_DOMAIN=3 does not divide the 8 ranks") || strings.Count(stderr, "\n") != 1 {
		t.Errorf("D=3 of 8: exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}

	code, stdout, stderr = eprun(t, "topo", "--ranks", "0")
	if code != 2 || stdout != "" || !strings.Contains(stderr, "--ranks 0") {
		t.Errorf("--ranks 0: exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
}

func TestNUMANodes(t *testing.T) {
	dir := t.TempDir()
	for id, cpus := range []string{"0-3,8-11", "4-7,12-15"} {
		n := filepath.Join(dir, "node"+string(rune('0'+id)))
		if err := os.MkdirAll(n, 0o755); err != nil {
			t.Fatal(err)
		}
		mem := "Node " + string(rune('0'+id)) + " MemTotal:       1048576 kB\nNode 0 MemFree: 1 kB\n"
		writeFile(t, n, "cpulist", cpus+"\n")
		writeFile(t, n, "meminfo", mem)
	}
	nodes, err := numaNodes(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(nodes) != 2 || nodes[1].ID != 1 || nodes[1].CPUs != "4-7,12-15" || nodes[0].MemBytes != 1<<30 {
		t.Errorf("nodes %+v", nodes)
	}
	if _, err := numaNodes(t.TempDir()); err == nil {
		t.Error("an empty directory gave no error")
	}
}

// TestTopoRDMA: the rdma section of a cluster node (what UCX lists on a
// node with a ConnectX HCA and CUDA support) and of a machine with only TCP.
func TestTopoRDMA(t *testing.T) {
	node := []rdma.Device{
		{Component: "self", MD: "self", Transport: "self", Device: "memory0", Type: "self"},
		{Component: "tcp", MD: "tcp", Transport: "tcp", Device: "eth0", Type: "net"},
		{Component: "ib", MD: "mlx5_0", Transport: "rc_mlx5", Device: "mlx5_0:1", Type: "net"},
		{Component: "ib", MD: "mlx5_0", Transport: "dc_mlx5", Device: "mlx5_0:1", Type: "net"},
		{Component: "ib", MD: "mlx5_1", Transport: "rc_mlx5", Device: "mlx5_1:1", Type: "net"},
		{Component: "cuda_cpy", MD: "cuda_cpy", Transport: "cuda_copy", Device: "cuda", Type: "acc"},
		{Component: "cuda_ipc", MD: "cuda_ipc", Transport: "cuda_ipc", Device: "cuda", Type: "acc"},
	}
	for _, c := range []struct {
		name string
		devs []rdma.Device
		want []string
		rdma []string
	}{
		{"cluster node", node, []string{"device mlx5_0:1           rc_mlx5, dc_mlx5 (net)", "rdma devices             mlx5_0:1, mlx5_1:1", "gpu memory               cuda_copy, cuda_ipc"}, []string{"mlx5_0:1", "mlx5_1:1"}},
		{"tcp only", node[:2], []string{"device eth0               tcp (net)", "rdma devices             none", "would run over TCP", "gpu memory               no"}, []string{}},
	} {
		rep := rdmaFrom(rdma.Resources{Devices: c.devs})
		if !slices.Equal(rep.RDMADevices, c.rdma) {
			t.Errorf("%s: rdma devices %q, want %q", c.name, rep.RDMADevices, c.rdma)
		}
		var b strings.Builder
		writeRDMA(&b, rep)
		flat := strings.Join(strings.Fields(b.String()), " ")
		for _, w := range c.want {
			if !strings.Contains(flat, strings.Join(strings.Fields(w), " ")) {
				t.Errorf("%s: report lacks %q:\n%s", c.name, w, b.String())
			}
		}
	}
}

// TestTopoUnderLauncher: under a launcher (eprun launch -n 4 -- eprun
// topo sets RANK and WORLD_SIZE; mpirun OMPI_COMM_WORLD_*), rank 0 prints
// the report and every other rank one line, as text or as one JSON
// object; a rank whose environment is invalid says so on its line and
// exits 1.
func TestTopoUnderLauncher(t *testing.T) {
	for _, k := range []string{"GOEP_RANKS_PER_DOMAIN", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"} {
		t.Setenv(k, "")
		unsetenv(t, k)
	}
	for _, tc := range []struct {
		name string
		env  map[string]string
	}{
		{"torchrun", map[string]string{"RANK": "2", "WORLD_SIZE": "4"}},
		{"ompi", map[string]string{"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "3", "OMPI_COMM_WORLD_LOCAL_SIZE": "4"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			rank := tc.env["RANK"] + tc.env["OMPI_COMM_WORLD_RANK"]
			stdout, _ := eprunOK(t, "topo")
			if strings.Count(stdout, "\n") != 1 || !strings.HasPrefix(stdout, "# eprun topo: rank "+rank+" of 4 (local "+rank+" of 4) on ") ||
				!strings.Contains(stdout, "logical cpus") || !strings.HasSuffix(stdout, "; full report on rank 0\n") {
				t.Errorf("rank %s: %q, want one summary line", rank, stdout)
			}
			stdout, _ = eprunOK(t, "topo", "--json")
			var s topoSummary
			if err := json.Unmarshal([]byte(stdout), &s); err != nil || strings.Count(stdout, "\n") != 1 || strconv.Itoa(s.Rank) != rank || s.Size != 4 || s.NumCPU < 1 {
				t.Errorf("rank %s --json: %q (%v), want one line of JSON with its place", rank, stdout, err)
			}

			t.Setenv("GOEP_RANKS_PER_DOMAIN", "3")
			code, stdout, stderr := eprun(t, "topo")
			if code != 1 || strings.Count(stdout, "\n") != 1 || !strings.Contains(stdout, "INVALID: GOEP_RANKS_PER_DOMAIN=3 does not divide the 4 ranks") || strings.Count(stderr, "\n") != 1 {
				t.Errorf("rank %s, D=3: exit %d, stdout %q, stderr %q; want 1 and the summary saying what is invalid", rank, code, stdout, stderr)
			}
		})
	}
	// Rank 0: the report, its launcher section naming the place.
	t.Setenv("RANK", "0")
	t.Setenv("WORLD_SIZE", "4")
	stdout, _ := eprunOK(t, "topo")
	for _, want := range []string{"# eprun topo: what goep sees on ", "# cpus", "# launcher", "torchrun: rank 0 of 4", "# domain layout", "ranks R                  4 (launcher torchrun)"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("rank 0's report lacks %q:\n%s", want, stdout)
		}
	}
}

// unsetenv removes key for the rest of the test (t.Setenv first, so that
// it is restored afterwards).
func unsetenv(t *testing.T, key string) {
	t.Helper()
	if err := os.Unsetenv(key); err != nil {
		t.Fatal(err)
	}
}
