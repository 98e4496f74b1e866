package rdma

import (
	"slices"
	"testing"
)

// TestRDMADevices: the devices with an RDMA transport, each once, in UCX's
// order; TCP, shared memory and GPU copies are not RDMA.
func TestRDMADevices(t *testing.T) {
	node := []Device{
		{Component: "self", MD: "self", Transport: "self", Device: "memory0", Type: "self"},
		{Component: "tcp", MD: "tcp", Transport: "tcp", Device: "eth0", Type: "net"},
		{Component: "ib", MD: "mlx5_1", Transport: "rc_mlx5", Device: "mlx5_1:1", Type: "net"},
		{Component: "ib", MD: "mlx5_0", Transport: "rc_mlx5", Device: "mlx5_0:1", Type: "net"},
		{Component: "ib", MD: "mlx5_0", Transport: "dc_mlx5", Device: "mlx5_0:1", Type: "net"},
		{Component: "posix", MD: "posix", Transport: "posix", Device: "memory", Type: "shm"},
		{Component: "cuda_ipc", MD: "cuda_ipc", Transport: "cuda_ipc", Device: "cuda", Type: "acc"},
	}
	for _, tc := range []struct {
		name string
		devs []Device
		want []string
	}{
		{"cluster node", node, []string{"mlx5_1:1", "mlx5_0:1"}},
		{"tcp and shared memory only", node[:2], []string{}},
		{"nothing", nil, []string{}},
	} {
		got := Resources{Devices: tc.devs}.RDMADevices()
		if got == nil || !slices.Equal(got, tc.want) {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
}
