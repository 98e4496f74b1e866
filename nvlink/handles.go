package nvlink

import (
	"encoding/binary"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/goep/goep/device"
)

// registry is the in-process handle table of the host backend: a handle is
// the key under which a buffer is registered. Ranks in one process "map" a
// peer's buffer by looking it up.
var registry struct {
	mu   sync.Mutex
	next atomic.Uint64
	bufs map[uint64]*device.Buffer
}

// handleSize is the size of an exported handle in a control block.
const handleSize = 8

func export(b *device.Buffer) uint64 {
	id := registry.next.Add(1)
	registry.mu.Lock()
	if registry.bufs == nil {
		registry.bufs = map[uint64]*device.Buffer{}
	}
	registry.bufs[id] = b
	registry.mu.Unlock()
	return id
}

func unexport(id uint64) {
	registry.mu.Lock()
	delete(registry.bufs, id)
	registry.mu.Unlock()
}

func open(id uint64) (*device.Buffer, error) {
	registry.mu.Lock()
	b := registry.bufs[id]
	registry.mu.Unlock()
	if b == nil {
		return nil, fmt.Errorf("nvlink: no buffer is exported under handle %d (ranks of one domain must share a process on the host backend)", id)
	}
	return b, nil
}

func putHandle(dst []byte, id uint64) { binary.LittleEndian.PutUint64(dst, id) }
func getHandle(src []byte) uint64     { return binary.LittleEndian.Uint64(src) }
