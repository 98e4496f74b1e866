package rdma

import (
	"slices"
	"testing"
)

// TestRDMADevices: the devices with an RDMA transport (verbs, RDMA CM),
// each once, in UCX's order; TCP, shared memory and GPU copies are not
// RDMA.
func TestRDMADevices(t *testing.T) {
	dev := func(component, transport, device, typ string) Device {
		return Device{Component: component, MD: component, Transport: transport, Device: device, Type: typ}
	}
	roce := []Device{
		dev("tcp", "tcp", "bond0", "net"),
		dev("ib", "rc_verbs", "mlx5_bond_1:1", "net"),
		dev("ib", "ud_verbs", "mlx5_bond_0:1", "net"),
		dev("ib", "rc_verbs", "mlx5_bond_0:1", "net"),
		dev("rdmacm", "rdmacm", "rdmacm", "net"),
		dev("posix", "posix", "memory", "shm"),
		dev("cuda_ipc", "cuda_ipc", "cuda", "acc"),
	}
	for _, tc := range []struct {
		name string
		devs []Device
		want []string
	}{
		{"RoCE node", roce, []string{"mlx5_bond_1:1", "mlx5_bond_0:1", "rdmacm"}},
		{"tcp only", roce[:1], []string{}},
		{"nothing", nil, []string{}},
	} {
		got := Resources{Devices: tc.devs}.RDMADevices()
		if got == nil || !slices.Equal(got, tc.want) {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
}
