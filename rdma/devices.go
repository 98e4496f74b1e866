package rdma

import (
	"slices"

	"github.com/goep/goep/internal/ucx"
)

// Device is one transport resource UCX can use on this machine: its UCT
// component, memory domain, transport, device and type, as `ucx_info -d`
// lists them. RDMA reports whether it is an RDMA transport (InfiniBand or
// RoCE verbs, RDMA CM); GPU whether it moves GPU memory.
type Device = ucx.Device

// Resources is what UCX offers this machine for the rail between domains
// (Devices returns it).
type Resources struct {
	// UCXVersion is the UCX library's version; empty if UCX did not say.
	UCXVersion string
	// Devices are UCX's transport resources, in UCX's order.
	Devices []Device
	// Skipped counts the UCX components and memory domains that did not
	// answer (their driver or hardware is absent).
	Skipped int
	// MemoryTypes is the memory a UCX context can access (ucx.MemoryHost,
	// and ucx.MemoryCUDA where UCX was built with CUDA and found a GPU);
	// 0 if no context could be made.
	MemoryTypes ucx.MemoryTypes
}

// RDMADevices names the devices that have an RDMA transport, each once, in
// UCX's order. None means the rail between hosts would run over TCP.
func (r Resources) RDMADevices() []string {
	names := []string{}
	for _, d := range r.Devices {
		if d.RDMA() && !slices.Contains(names, d.Device) {
			names = append(names, d.Device)
		}
	}
	return names
}
