package ucx

import "testing"

func TestDeviceKinds(t *testing.T) {
	for _, c := range []struct {
		d         Device
		rdma, gpu bool
	}{
		{Device{Component: "ib", MD: "mlx5_0", Transport: "rc_mlx5", Device: "mlx5_0:1", Type: "net"}, true, false},
		{Device{Component: "ib", MD: "mlx5_0", Transport: "dc_mlx5", Device: "mlx5_0:1", Type: "net"}, true, false},
		{Device{Component: "ib", MD: "mlx5_0", Transport: "ud_verbs", Device: "mlx5_0:1", Type: "net"}, true, false},
		{Device{Component: "tcp", MD: "tcp", Transport: "tcp", Device: "eth0", Type: "net"}, false, false},
		{Device{Component: "posix", MD: "posix", Transport: "posix", Device: "memory", Type: "shm"}, false, false},
		{Device{Component: "cuda_ipc", MD: "cuda_ipc", Transport: "cuda_ipc", Device: "cuda", Type: "acc"}, false, true},
		{Device{Component: "cuda_cpy", MD: "cuda_cpy", Transport: "cuda_copy", Device: "cuda", Type: "acc"}, false, true},
		{Device{Component: "gdr_copy", MD: "gdr_copy", Transport: "gdr_copy", Device: "cuda", Type: "acc"}, false, true},
		{Device{Component: "self", MD: "self", Transport: "self", Device: "memory0", Type: "self"}, false, false},
	} {
		if c.d.RDMA() != c.rdma || c.d.GPU() != c.gpu {
			t.Errorf("%+v: rdma %v gpu %v, want %v %v", c.d, c.d.RDMA(), c.d.GPU(), c.rdma, c.gpu)
		}
	}
}
