//go:build linux && cgo

package nvlink

import (
	"errors"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
)

// fakeNVML is an NVML whose GPUs, by NVML UUID, report the given fabric
// info (a missing GPU is ERROR_NOT_FOUND; a nil info NOT_SUPPORTED).
func fakeNVML(gpus map[string]*nvml.GpuFabricInfo) *mock.Interface {
	return &mock.Interface{
		InitFunc:     func() nvml.Return { return nvml.SUCCESS },
		ShutdownFunc: func() nvml.Return { return nvml.SUCCESS },
		ErrorStringFunc: func(r nvml.Return) string {
			return map[nvml.Return]string{nvml.ERROR_NOT_FOUND: "Not Found", nvml.ERROR_NOT_SUPPORTED: "Not Supported"}[r]
		},
		ExtensionsFunc: func() nvml.ExtendedInterface {
			return &mock.ExtendedInterface{LookupSymbolFunc: func(string) error { return nil }}
		},
		DeviceGetHandleByUUIDFunc: func(id string) (nvml.Device, nvml.Return) {
			info, ok := gpus[id]
			if !ok {
				return nil, nvml.ERROR_NOT_FOUND
			}
			return &mock.Device{GetGpuFabricInfoFunc: func() (nvml.GpuFabricInfo, nvml.Return) {
				if info == nil {
					return nvml.GpuFabricInfo{}, nvml.ERROR_NOT_SUPPORTED
				}
				return *info, nvml.SUCCESS
			}}, nvml.SUCCESS
		},
	}
}

// TestQueryFabricFakes: four GPUs on two "hosts" (two trays of one NVL72
// rack) report one cluster and clique through a fake NVML; the ranks
// then form one domain of four, where an H200 host's NVML (no fabric)
// keeps per-host domains, and the reasons say so.
func TestQueryFabricFakes(t *testing.T) {
	cluster := [16]uint8{0xc1, 0x05, 15: 0x72}
	uuids := [4][16]byte{{1}, {2}, {3}, {4}}
	rack := map[string]*nvml.GpuFabricInfo{}
	for _, u := range uuids {
		rack[NVMLUUID(u)] = &nvml.GpuFabricInfo{ClusterUuid: cluster, CliqueId: 3, State: nvml.GPU_FABRIC_STATE_COMPLETED}
	}
	hosts := []string{"host:tray1", "host:tray1", "host:tray2", "host:tray2"}
	choose := func(lib nvml.Interface) DomainChoice {
		var fabrics, whys []string
		for _, u := range uuids {
			k, why := queryFabric(lib, u).Key()
			fabrics, whys = append(fabrics, k), append(whys, why)
		}
		return ChooseDomains(hosts, fabrics, whys)
	}
	c := choose(fakeNVML(rack))
	if D, err := RanksPerDomain(c.Keys); !c.Fabric || err != nil || D != 4 {
		t.Fatalf("one clique over two trays: fabric %v, D %d, %v (%s); want one domain of 4", c.Fabric, D, err, c.Why)
	}
	if want := "fabric:c1050000000000000000000000000072/3"; c.Keys[0] != want {
		t.Errorf("key %q, want %q", c.Keys[0], want)
	}
	t.Logf("NVL72 fakes: %s", c.Why)

	// An H200 host: NVML answers NOT_SUPPORTED for the fabric query.
	h200 := map[string]*nvml.GpuFabricInfo{}
	for _, u := range uuids {
		h200[NVMLUUID(u)] = nil
	}
	c = choose(fakeNVML(h200))
	if D, err := RanksPerDomain(c.Keys); c.Fabric || err != nil || D != 2 || !strings.Contains(c.Why, "Not Supported") {
		t.Fatalf("H200 fakes: fabric %v, D %d, %v (%s); want per-host domains of 2 naming NOT_SUPPORTED", c.Fabric, D, err, c.Why)
	}
	// A fabric still registering, and a GPU NVML does not know.
	f := queryFabric(fakeNVML(map[string]*nvml.GpuFabricInfo{NVMLUUID(uuids[0]): {ClusterUuid: cluster, State: nvml.GPU_FABRIC_STATE_IN_PROGRESS}}), uuids[0])
	if k, why := f.Key(); k != "" || !strings.Contains(why, "in progress") {
		t.Errorf("fabric in progress: key %q, %q", k, why)
	}
	f = queryFabric(fakeNVML(nil), uuids[1])
	if k, why := f.Key(); k != "" || !strings.Contains(why, "Not Found") || !strings.Contains(why, NVMLUUID(uuids[1])) {
		t.Errorf("unknown GPU: key %q, %q", k, why)
	}
	// An NVML older than the fabric query is not called into.
	old := fakeNVML(rack)
	old.ExtensionsFunc = func() nvml.ExtendedInterface {
		return &mock.ExtendedInterface{LookupSymbolFunc: func(s string) error { return errors.New(s + ": undefined symbol") }}
	}
	if k, why := queryFabric(old, uuids[0]).Key(); k != "" || !strings.Contains(why, "no fabric query") {
		t.Errorf("NVML without the fabric query: key %q, %q", k, why)
	}
}

func TestNVMLUUID(t *testing.T) {
	u := [16]byte{0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef, 0x00, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77}
	if got, want := NVMLUUID(u), "GPU-01234567-89ab-cdef-0011-223344556677"; got != want {
		t.Errorf("NVMLUUID = %q, want %q", got, want)
	}
}
