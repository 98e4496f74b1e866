package nvlink

import (
	"errors"
	"fmt"
	"os"
	"strings"
)

// ErrTopology is wrapped by the errors of RanksPerDomain: the ranks are not
// placed so that domains can be detected.
var ErrTopology = errors.New("nvlink: ranks not placed in equal consecutive domains")

// HostKey names this process's host, the NVLink domain its ranks form
// unless they are in a multi-node NVLink fabric clique (Fabric,
// ChooseDomains): ranks on one host share memory (the host backend's shm,
// CUDA IPC).
func HostKey() string {
	h, err := os.Hostname()
	if err != nil || h == "" {
		h = "unknown-host"
	}
	return "host:" + h
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
			return 0, fmt.Errorf("nvlink: detect domains: %d ranks in %d domains, %s holding ranks [%d, %d): "+
				"every domain must hold the same number of ranks; set GOEP_RANKS_PER_DOMAIN: %w",
				len(keys), len(starts), strings.TrimPrefix(keys[s], "host:"), s, end, ErrTopology)
		}
	}
	return D, nil
}
