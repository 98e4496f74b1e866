//go:build cuda && cgo

package device

import (
	"fmt"

	"github.com/goep/goep/internal/cuda"
)

// HostMapping is host memory that goep owns (mmap'd by another package, or
// allocated by its transport: the rail's send and receive regions and the
// descriptor ring its proxy reads) mapped for this backend's kernels and
// copies. It is the one kind of host memory a kernel may
// receive (DESIGN invariant 1 forbids host memory goep does not own): the
// owner keeps it mapped for the backend's lifetime, and the launch pointer
// check (SetCheckPointers) accepts addresses inside a live mapping.
type HostMapping struct {
	c   *CUDA
	reg *cuda.HostRegistration
	buf *Buffer
}

// MapHost page-locks mem and maps it for kernels (cuMemHostRegister). mem
// must stay mapped until the mapping's Close, which the caller calls only
// once no queued work uses it.
func (c *CUDA) MapHost(mem []byte) (*HostMapping, error) {
	reg, err := c.dev.HostRegister(mem)
	if err != nil {
		return nil, fmt.Errorf("device: CUDA map host memory: %w", closedAs(err))
	}
	m := &HostMapping{c: c, reg: reg, buf: &Buffer{bufMem: &bufMem{size: len(mem), dev: uint64(reg.DevicePtr())}}}
	c.hostMu.Lock()
	c.hostMaps = append(c.hostMaps, m)
	c.hostMu.Unlock()
	return m, nil
}

// Buffer is the mapped memory as a buffer for Launch (and views); it
// cannot be freed.
func (m *HostMapping) Buffer() *Buffer { return m.buf }

// Close unmaps the memory; the streams that used it have been
// synchronized. A second Close returns nil.
func (m *HostMapping) Close() error {
	m.c.hostMu.Lock()
	for i, o := range m.c.hostMaps {
		if o == m {
			m.c.hostMaps = append(m.c.hostMaps[:i], m.c.hostMaps[i+1:]...)
			break
		}
	}
	m.c.hostMu.Unlock()
	if err := m.reg.Unregister(); err != nil {
		return fmt.Errorf("device: CUDA unmap host memory: %w", closedAs(err))
	}
	return nil
}

// hostMapped reports whether p lies inside a live HostMapping.
func (c *CUDA) hostMapped(p uint64) bool {
	c.hostMu.Lock()
	defer c.hostMu.Unlock()
	for _, m := range c.hostMaps {
		if p >= m.buf.dev && p-m.buf.dev < uint64(m.buf.size) {
			return true
		}
	}
	return false
}
