package ucx

import "strings"

// Device is one transport resource UCX can use on this machine (UCT's
// uct_tl_resource_desc_t, under its memory domain and component), as
// `ucx_info -d` lists them.
type Device struct {
	Component string `json:"component"` // UCT component, e.g. "ib", "tcp", "posix", "cuda_ipc"
	MD        string `json:"md"`        // memory domain, e.g. "mlx5_0", "tcp", "posix"
	Transport string `json:"transport"` // e.g. "rc_mlx5", "tcp", "posix", "self"
	Device    string `json:"device"`    // e.g. "mlx5_0:1", "eth0", "memory"
	Type      string `json:"type"`      // "net", "shm", "acc" or "self"
}

// RDMA reports whether the transport is an RDMA one: InfiniBand or RoCE
// verbs (UCX's ib component: rc, dc, ud and their mlx5 variants) or RDMA
// CM. TCP is a network transport but not RDMA.
func (d Device) RDMA() bool {
	if d.Type != "net" {
		return false
	}
	for _, p := range []string{"rc", "dc", "ud"} {
		if strings.HasPrefix(d.Transport, p) {
			return true
		}
	}
	return d.Component == "ib" || d.Component == "rdmacm"
}

// GPU reports whether the resource moves GPU memory (CUDA or ROCm copy and
// IPC transports, GDRCopy): with one of them UCX can put from and to
// device buffers.
func (d Device) GPU() bool {
	for _, p := range []string{"cuda", "gdr", "rocm"} {
		if strings.HasPrefix(d.Component, p) || strings.HasPrefix(d.Transport, p) {
			return true
		}
	}
	return false
}
