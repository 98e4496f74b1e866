package nvlink

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/goep/goep/comm"
)

func TestFabricKey(t *testing.T) {
	for _, c := range []struct {
		f       Fabric
		key, in string
	}{
		{Fabric{Cluster: "ab12", Clique: 7, State: "completed"}, "fabric:ab12/7", ""},
		{Fabric{Cluster: "ab12", Clique: 7, State: "in progress"}, "", `state "in progress"`},
		{Fabric{State: "completed"}, "", "no NVLink fabric cluster"},
		{Fabric{Cluster: "0000", State: "completed"}, "", "no NVLink fabric cluster"},
		{Fabric{State: "not supported", Err: "nvml: fabric info: Not Supported"}, "", "Not Supported"},
	} {
		key, why := c.f.Key()
		if key != c.key || (c.in == "") != (why == "") || !strings.Contains(why, c.in) {
			t.Errorf("%+v.Key() = %q, %q; want %q and a reason containing %q", c.f, key, why, c.key, c.in)
		}
	}
}

func TestChooseDomains(t *testing.T) {
	h := func(hs ...string) []string {
		for i := range hs {
			hs[i] = "host:" + hs[i]
		}
		return hs
	}
	for _, c := range []struct {
		name           string
		hosts, fabrics []string
		whys           []string
		fabric         bool
		D              int
		spans          bool
		why            string
	}{
		{"no fabric", h("a", "a", "b", "b"), []string{"", "", "", ""}, []string{"no NVML", "no NVML", "no NVML", "no NVML"},
			false, 2, false, "rank 0 is in no usable NVLink fabric clique (no NVML)"},
		{"one rank refused", h("a", "a", "b", "b"), []string{"fabric:c/1", "fabric:c/1", "", "fabric:c/1"}, []string{"", "", "fabric handles refused", ""},
			false, 2, false, "rank 2 is in no usable NVLink fabric clique (fabric handles refused)"},
		{"cliques within hosts", h("a", "a", "b", "b"), []string{"fabric:c/1", "fabric:c/1", "fabric:c/2", "fabric:c/2"}, make([]string, 4),
			false, 2, false, "no clique spans hosts"},
		{"one clique over two hosts", h("a", "a", "b", "b"), []string{"fabric:c/1", "fabric:c/1", "fabric:c/1", "fabric:c/1"}, make([]string, 4),
			true, 4, true, "(1 in all, 1 spanning hosts; c/1 spans a, b)"},
		{"two racks of two hosts", h("a", "a", "b", "b", "c", "c", "d", "d"),
			[]string{"fabric:x/1", "fabric:x/1", "fabric:x/1", "fabric:x/1", "fabric:x/2", "fabric:x/2", "fabric:x/2", "fabric:x/2"}, make([]string, 8),
			true, 4, true, "(2 in all, 2 spanning hosts;"},
	} {
		t.Run(c.name, func(t *testing.T) {
			ch := ChooseDomains(c.hosts, c.fabrics, c.whys)
			if ch.Fabric != c.fabric || !strings.Contains(ch.Why, c.why) {
				t.Errorf("ChooseDomains: fabric %v, why %q; want %v and %q", ch.Fabric, ch.Why, c.fabric, c.why)
			}
			D, err := RanksPerDomain(ch.Keys)
			if err != nil || D != c.D {
				t.Fatalf("RanksPerDomain(%q) = %d, %v; want %d", ch.Keys, D, err, c.D)
			}
			if spans, _ := ch.SpansHosts(D); spans != c.spans {
				t.Errorf("SpansHosts(%d) = %v", D, spans)
			}
		})
	}
}

// TestSpansHosts: a domain size forced over a per-host split
// (GOEP_RANKS_PER_DOMAIN) is named with its hosts.
func TestSpansHosts(t *testing.T) {
	c := DomainChoice{Hosts: []string{"host:a", "host:a", "host:b", "host:b"}}
	if spans, why := c.SpansHosts(4); !spans || why != "domain 0 (ranks 0-3) holds ranks of a and b" {
		t.Errorf("SpansHosts(4) = %v, %q", spans, why)
	}
	for _, D := range []int{1, 2} {
		if spans, why := c.SpansHosts(D); spans {
			t.Errorf("SpansHosts(%d) = %v, %q", D, spans, why)
		}
	}
}

// TestDetectDomains: the collective form agrees on every rank, and a rank
// whose fabric key is empty keeps every rank on per-host domains.
func TestDetectDomains(t *testing.T) {
	gs := comm.NewLocal(4)
	hosts := []string{"host:a", "host:a", "host:b", "host:b"}
	for _, refused := range []int{-1, 3} {
		var wg sync.WaitGroup
		Ds := make([]int, 4)
		chs := make([]DomainChoice, 4)
		errs := make([]error, 4)
		for r := range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				key, why := "fabric:c/1", ""
				if r == refused {
					key, why = "", "fabric handles refused"
				}
				Ds[r], chs[r], errs[r] = DetectDomains(context.Background(), gs[r], hosts[r], key, why)
			}()
		}
		wg.Wait()
		wantD := 4
		if refused >= 0 {
			wantD = 2
		}
		for r := range 4 {
			if errs[r] != nil || Ds[r] != wantD || chs[r].Fabric != (refused < 0) || chs[r].Why != chs[0].Why {
				t.Errorf("refused %d, rank %d: D %d, choice %+v, %v; want D %d", refused, r, Ds[r], chs[r], errs[r], wantD)
			}
		}
	}
}
