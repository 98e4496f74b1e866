package nvlink

import (
	"context"
	"fmt"
	"strings"

	"github.com/goep/goep/comm"
)

// Fabric is what NVML reports of a GPU's multi-node NVLink fabric
// (nvmlDeviceGetGpuFabricInfo): on GB200/GB300 NVL72 racks the GPUs of
// every tray of a rack share one NVLink fabric, and NVML names it by the
// cluster's UUID and a clique id.
type Fabric struct {
	// Cluster is the cluster's UUID in hex; empty where the GPU has none.
	Cluster string
	Clique  uint32
	// State is the fabric manager's registration of the GPU: "completed"
	// once the GPU is in its clique; "not supported" on GPUs without a
	// multi-node fabric (H100, H200 in one host).
	State string
	// Err says why NVML could not answer (no NVML library, no such GPU);
	// empty otherwise.
	Err string
}

// Key is the domain key of a GPU in a completed fabric clique
// ("fabric:CLUSTER/CLIQUE"), or "" and why the GPU is in none.
func (f Fabric) Key() (key, why string) {
	switch {
	case f.Err != "":
		return "", f.Err
	case f.State != "completed":
		return "", fmt.Sprintf("NVLink fabric state %q", f.State)
	case f.Cluster == "" || strings.Trim(f.Cluster, "0") == "":
		return "", "no NVLink fabric cluster"
	}
	return fmt.Sprintf("fabric:%s/%d", f.Cluster, f.Clique), ""
}

// DomainChoice is how the ranks split into NVLink domains
// (ChooseDomains).
type DomainChoice struct {
	// Keys are every rank's domain key, for RanksPerDomain: its fabric
	// clique's (Fabric) or its host's.
	Keys []string
	// Hosts are every rank's host key.
	Hosts []string
	// Fabric: the keys are fabric cliques, some of which span hosts.
	Fabric bool
	// Why says how the choice was made, for `eprun topo` and the log.
	Why string
}

// ChooseDomains picks every rank's domain key from its host key
// (hosts[r], HostKey) and its fabric key (fabrics[r], Fabric.Key, after a
// check that the GPU can share memory by fabric handles; "" where it
// cannot, whys[r] saying why). The ranks of one fabric clique form a
// domain when every rank is in a clique and some clique spans several
// hosts; otherwise the ranks of one host do (CUDA IPC then suffices).
func ChooseDomains(hosts, fabrics, whys []string) DomainChoice {
	c := DomainChoice{Keys: hosts, Hosts: hosts}
	for r, f := range fabrics {
		if f == "" {
			c.Why = fmt.Sprintf("per-host domains: rank %d is in no usable NVLink fabric clique (%s)", r, whys[r])
			return c
		}
	}
	// The hosts of every clique, in rank order.
	cliqueHosts := map[string][]string{}
	var cliques []string
	for r, f := range fabrics {
		hs, seen := cliqueHosts[f]
		if !seen {
			cliques = append(cliques, f)
		}
		if len(hs) == 0 || hs[len(hs)-1] != hosts[r] {
			cliqueHosts[f] = append(hs, hosts[r])
		}
	}
	spans := 0
	for _, f := range cliques {
		if len(cliqueHosts[f]) > 1 {
			spans++
		}
	}
	if spans == 0 {
		c.Why = "per-host domains: every rank is in an NVLink fabric clique, but no clique spans hosts"
		return c
	}
	c.Keys, c.Fabric = fabrics, true
	c.Why = fmt.Sprintf("one domain per NVLink fabric clique (%d in all, %d spanning hosts; %s spans %s)",
		len(cliques), spans, strings.TrimPrefix(cliques[0], "fabric:"), strings.Join(trimHosts(cliqueHosts[cliques[0]]), ", "))
	return c
}

func trimHosts(hs []string) []string {
	out := make([]string, len(hs))
	for i, h := range hs {
		out[i] = strings.TrimPrefix(h, "host:")
	}
	return out
}

// SpansHosts reports whether a domain of the split into domains of D
// consecutive ranks holds ranks of several hosts, and names the first.
func (c DomainChoice) SpansHosts(D int) (bool, string) {
	for r := range c.Hosts {
		if r%D != 0 && c.Hosts[r] != c.Hosts[r-1] {
			n := r / D
			return true, fmt.Sprintf("domain %d (ranks %d-%d) holds ranks of %s and %s", n, n*D, n*D+D-1,
				strings.TrimPrefix(c.Hosts[r-1], "host:"), strings.TrimPrefix(c.Hosts[r], "host:"))
		}
	}
	return false, ""
}

// DetectDomains all-gathers every rank's host key, fabric key and the
// reason for an empty one over g, chooses the keys (ChooseDomains) and
// returns D from them (RanksPerDomain) with the choice. It is collective:
// every rank gets the same answer, or the same error (which wraps
// ErrTopology where the ranks are not placed in equal consecutive
// domains; the choice is valid then too).
func DetectDomains(ctx context.Context, g comm.Group, host, fabric, why string) (int, DomainChoice, error) {
	all, err := g.AllGather(ctx, []byte(host+"\x00"+fabric+"\x00"+why))
	if err != nil {
		return 0, DomainChoice{}, fmt.Errorf("nvlink: detect domains: %w", err)
	}
	hosts, fabrics, whys := make([]string, len(all)), make([]string, len(all)), make([]string, len(all))
	for r, b := range all {
		parts := strings.SplitN(string(b), "\x00", 3)
		if len(parts) != 3 {
			return 0, DomainChoice{}, fmt.Errorf("nvlink: detect domains: rank %d sent %q, not host, fabric and reason", r, b)
		}
		hosts[r], fabrics[r], whys[r] = parts[0], parts[1], parts[2]
	}
	c := ChooseDomains(hosts, fabrics, whys)
	D, err := RanksPerDomain(c.Keys)
	return D, c, err
}

// PerHost is c with the ranks of each host as the domains instead of the
// fabric cliques, for why.
func (c DomainChoice) PerHost(why string) DomainChoice {
	c.Keys, c.Fabric = c.Hosts, false
	c.Why = "per-host domains: " + why + " (" + c.Why + ")"
	return c
}
