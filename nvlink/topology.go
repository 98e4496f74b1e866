package nvlink

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/goep/goep/comm"
)

// ErrTopology is wrapped by the errors of RanksPerDomain: the ranks are not
// placed so that domains can be detected.
var ErrTopology = errors.New("nvlink: ranks not placed in equal consecutive domains")

// HostKey names the NVLink domain this process can map today: its host.
// Ranks on one host share memory (the host backend's shm, CUDA IPC) and
// form one domain. Multi-node NVLink (GB200/GB300 NVL72, one NVML fabric
// clique across hosts) needs fabric handles in the GPU mapping, which
// MapGPU does not use yet, so a clique is not a domain here; `eprun topo`
// reports it.
func HostKey() string {
	h, err := os.Hostname()
	if err != nil || h == "" {
		h = "unknown-host"
	}
	return "host:" + h
}

// DetectRanksPerDomain all-gathers every rank's key (HostKey) over g and
// returns D, the ranks per domain (collective; every rank gets the same
// answer or the same error).
func DetectRanksPerDomain(ctx context.Context, g comm.Group, key string) (int, error) {
	all, err := g.AllGather(ctx, []byte(key))
	if err != nil {
		return 0, fmt.Errorf("nvlink: detect domains: %w", err)
	}
	keys := make([]string, len(all))
	for r, k := range all {
		keys[r] = string(k)
	}
	return RanksPerDomain(keys)
}

// RanksPerDomain returns D from every rank's domain key (keys[r] of rank
// r): the ranks with one key must be contiguous (domain n holds ranks
// [n*D, (n+1)*D), DESIGN.md section 1) and every domain must hold the same
// number of ranks. Otherwise the error says which ranks break the rule and
// to set GOEP_RANKS_PER_DOMAIN.
func RanksPerDomain(keys []string) (int, error) {
	if len(keys) == 0 {
		return 0, fmt.Errorf("nvlink: detect domains: no ranks: %w", ErrTopology)
	}
	// Blocks of equal keys, in rank order.
	var starts []int
	seen := map[string]int{} // key -> first rank
	for r, k := range keys {
		if r > 0 && k == keys[r-1] {
			continue
		}
		if first, ok := seen[k]; ok {
			return 0, fmt.Errorf("nvlink: detect domains: rank %d is on %s with rank %d, but the ranks between are not: "+
				"the ranks of one domain must be consecutive; place them so (mpirun --map-by node is the usual culprit) or set GOEP_RANKS_PER_DOMAIN: %w",
				r, strings.TrimPrefix(k, "host:"), first, ErrTopology)
		}
		seen[k] = r
		starts = append(starts, r)
	}
	D := len(keys) / len(starts)
	for i, s := range starts {
		end := len(keys)
		if i+1 < len(starts) {
			end = starts[i+1]
		}
		if end-s != D || len(keys)%len(starts) != 0 {
			return 0, fmt.Errorf("nvlink: detect domains: %d ranks on %d hosts, %s holding ranks [%d, %d): "+
				"every domain must hold the same number of ranks; set GOEP_RANKS_PER_DOMAIN: %w",
				len(keys), len(starts), strings.TrimPrefix(keys[s], "host:"), s, end, ErrTopology)
		}
	}
	return D, nil
}
