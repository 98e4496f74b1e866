package nvlink

import (
	"encoding/binary"
	"fmt"
	"os"
	"sync"
	"sync/atomic"

	"github.com/goep/goep/device"
)

// A handle names a buffer a rank exposes: its key in the in-process
// registry (ranks in the same process look it up there) and its
// device.ShareHandle (ranks in other processes map its memfd).
const handleSize = 8 + device.ShareHandleSize

type handle struct {
	id    uint64
	share device.ShareHandle
}

func (h handle) encode(b []byte) {
	binary.LittleEndian.PutUint64(b, h.id)
	h.share.Encode(b[8:])
}

func decodeHandle(b []byte) handle {
	return handle{id: binary.LittleEndian.Uint64(b), share: device.DecodeShareHandle(b[8:])}
}

// registry is the in-process handle table: ranks in one process find a
// peer's control block by looking it up at New (an exchange's buffers
// reach them through their owner's inbox, inbox.exposed). It is split into
// shards by id, each with its own lock, so that ranks starting at once
// seldom wait for each other.
var registry struct {
	next   atomic.Uint64
	shards [registryShards]registryShard
}

const registryShards = 64

type registryShard struct {
	mu   sync.Mutex
	bufs map[uint64]*device.Buffer
	_    [48]byte // a shard a cache line
}

func shardOf(id uint64) *registryShard { return &registry.shards[id%registryShards] }

var myPID = os.Getpid()

// export registers b (a control block, while New runs) and returns its
// handle, which ranks of this process look up and others map.
func export(b *device.Buffer) handle {
	id := registry.next.Add(1)
	sh := shardOf(id)
	sh.mu.Lock()
	if sh.bufs == nil {
		sh.bufs = map[uint64]*device.Buffer{}
	}
	sh.bufs[id] = b
	sh.mu.Unlock()
	h := shareOf(b)
	h.id = id
	return h
}

// shareOf is the handle by which ranks of other processes map b (an
// exchange's buffer; not registered). A buffer that cannot be shared
// across processes (private memory) gets a handle that names this process
// and no file, which open refuses.
func shareOf(b *device.Buffer) handle {
	if sh, err := b.Share(); err == nil {
		return handle{share: sh}
	}
	return handle{share: device.ShareHandle{PID: myPID, FD: -1}}
}

func unexport(h handle) {
	sh := shardOf(h.id)
	sh.mu.Lock()
	delete(sh.bufs, h.id)
	sh.mu.Unlock()
}

func lookup(id uint64) (*device.Buffer, error) {
	sh := shardOf(id)
	sh.mu.Lock()
	b := sh.bufs[id]
	sh.mu.Unlock()
	if b == nil {
		return nil, fmt.Errorf("nvlink: no buffer is exported under handle %d", id)
	}
	return b, nil
}

// mapKey identifies a peer's region across its reuse by the peer's pool.
type mapKey struct {
	pid, fd int
	ino     uint64
}

// maxMappings bounds the peer regions a domain keeps mapped; past it, the
// cache is emptied between two exchanges (when no view is in use).
const maxMappings = 512

// open returns the buffer a peer in another process exposed in an
// exchange: a view of its region mapped into this one (cached by region).
func (d *Domain) open(h handle) (*device.Buffer, error) {
	if h.share.FD < 0 {
		return nil, fmt.Errorf("nvlink: buffer of process %d is private memory and cannot be mapped by process %d", h.share.PID, myPID)
	}
	k := mapKey{h.share.PID, h.share.FD, h.share.Ino}
	m := d.maps[k]
	if m == nil {
		var err error
		if m, err = device.MapShared(h.share); err != nil {
			return nil, err
		}
		d.maps[k] = m
	}
	return m.Buffer(h.share.Size), nil
}

// trimMappings unmaps the cached peer regions if there are too many; it
// runs between exchanges, when no view of them is in use.
func (d *Domain) trimMappings() {
	if len(d.maps) <= maxMappings {
		return
	}
	for k, m := range d.maps {
		_ = m.Unmap()
		delete(d.maps, k)
	}
}
