//go:build linux && cgo

package main

import (
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
)

// fakeGPUs is an NVML with n GPUs whose fabric query answers info (nil:
// NOT_SUPPORTED, as on H100 and H200 hosts).
func fakeGPUs(n int, info *nvml.GpuFabricInfo) nvml.Interface {
	dev := func(i int) nvml.Device {
		return &mock.Device{
			GetNameFunc:        func() (string, nvml.Return) { return "NVIDIA GB300", nvml.SUCCESS },
			GetUUIDFunc:        func() (string, nvml.Return) { return "GPU-0000000" + string(rune('0'+i)), nvml.SUCCESS },
			GetPciInfoFunc:     func() (nvml.PciInfo, nvml.Return) { return nvml.PciInfo{}, nvml.ERROR_NOT_SUPPORTED },
			GetMemoryInfoFunc:  func() (nvml.Memory, nvml.Return) { return nvml.Memory{Total: 288 << 30}, nvml.SUCCESS },
			GetNvLinkStateFunc: func(int) (nvml.EnableState, nvml.Return) { return nvml.FEATURE_DISABLED, nvml.SUCCESS },
			GetGpuFabricInfoFunc: func() (nvml.GpuFabricInfo, nvml.Return) {
				if info == nil {
					return nvml.GpuFabricInfo{}, nvml.ERROR_NOT_SUPPORTED
				}
				return *info, nvml.SUCCESS
			},
		}
	}
	return &mock.Interface{
		InitFunc:                   func() nvml.Return { return nvml.SUCCESS },
		ShutdownFunc:               func() nvml.Return { return nvml.SUCCESS },
		ErrorStringFunc:            func(nvml.Return) string { return "fake" },
		SystemGetDriverVersionFunc: func() (string, nvml.Return) { return "580.00", nvml.SUCCESS },
		DeviceGetCountFunc:         func() (int, nvml.Return) { return n, nvml.SUCCESS },
		ExtensionsFunc: func() nvml.ExtendedInterface {
			return &mock.ExtendedInterface{LookupSymbolFunc: func(string) error { return nil }}
		},
		DeviceGetHandleByIndexFunc: func(i int) (nvml.Device, nvml.Return) { return dev(i), nvml.SUCCESS },
	}
}

// TestTopoFabricFakes: eprun topo on a GB300 tray (NVML fakes: four GPUs
// in one completed fabric clique) names the clique and the domain rule;
// on an H200 host's NVML (no fabric) it says one domain per host.
func TestTopoFabricFakes(t *testing.T) {
	unsetenv(t, "GOEP_RANKS_PER_DOMAIN")
	defer func(l nvml.Interface) { topoNVML = l }(topoNVML)
	for _, c := range []struct {
		name string
		info *nvml.GpuFabricInfo
		want []string
	}{
		{"gb300", &nvml.GpuFabricInfo{ClusterUuid: [16]uint8{0xab, 15: 0x01}, CliqueId: 7, State: nvml.GPU_FABRIC_STATE_COMPLETED},
			[]string{"cluster ab000000000000000000000000000001 clique 7 (completed)",
				"this host's GPUs are in NVLink fabric clique ab000000000000000000000000000001/7", "a clique that spans hosts one domain"}},
		{"h200", nil, []string{"no multi-node NVLink fabric (NVML fabric state not reported (fake))", "the ranks of each host one domain"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			topoNVML = fakeGPUs(4, c.info)
			rep, err := collectTopo(8)
			if err != nil {
				t.Fatal(err)
			}
			var b strings.Builder
			if err := writeTopo(&b, rep); err != nil {
				t.Fatal(err)
			}
			for _, w := range c.want {
				if !strings.Contains(b.String(), w) {
					t.Errorf("topo report lacks %q:\n%s", w, b.String())
				}
			}
			t.Logf("\n%s", b.String())
		})
	}
}
