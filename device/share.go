package device

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// ErrNotShareable is returned when a buffer cannot be mapped by another
// process (its memory is private).
var ErrNotShareable = errors.New("device: buffer is not shareable across processes")

// ShareHandle names a host buffer so that another process of the same user
// on the same machine can map it: the owner's pid, the memfd behind the
// buffer's region and its inode (which tells a reused descriptor number
// apart), and the sizes. It is plain data, safe to send anywhere.
type ShareHandle struct {
	PID    int
	FD     int
	Ino    uint64
	Region int // bytes of the whole mapping
	Size   int // usable bytes (after the guard bytes)
}

// ShareHandleSize is the size of an encoded ShareHandle.
const ShareHandleSize = 32

// Encode writes h into b[:ShareHandleSize].
func (h ShareHandle) Encode(b []byte) {
	binary.LittleEndian.PutUint32(b[0:], uint32(h.PID))
	binary.LittleEndian.PutUint32(b[4:], uint32(h.FD))
	binary.LittleEndian.PutUint64(b[8:], h.Ino)
	binary.LittleEndian.PutUint64(b[16:], uint64(h.Region))
	binary.LittleEndian.PutUint64(b[24:], uint64(h.Size))
}

// DecodeShareHandle reads a handle written by Encode.
func DecodeShareHandle(b []byte) ShareHandle {
	return ShareHandle{
		PID:    int(binary.LittleEndian.Uint32(b[0:])),
		FD:     int(int32(binary.LittleEndian.Uint32(b[4:]))),
		Ino:    binary.LittleEndian.Uint64(b[8:]),
		Region: int(binary.LittleEndian.Uint64(b[16:])),
		Size:   int(binary.LittleEndian.Uint64(b[24:])),
	}
}

// pid is this process's id, read once: a buffer is shared on every
// exchange, and a Go process never becomes another one without exec.
var pid = os.Getpid()

// Share returns the handle under which other processes can map b.
func (b *Buffer) Share() (ShareHandle, error) {
	if b.reg == nil || b.reg.fd < 0 {
		return ShareHandle{}, ErrNotShareable
	}
	return ShareHandle{PID: pid, FD: b.reg.fd, Ino: b.reg.ino, Region: len(b.reg.mem), Size: b.size}, nil
}

// Mapping is a peer's region mapped into this process.
type Mapping struct {
	mem []byte
}

// MapShared maps the region a ShareHandle names, read-write, through
// /proc/PID/fd (same user, same machine). The caller unmaps it with Unmap
// once nothing uses buffers made from it.
func MapShared(h ShareHandle) (*Mapping, error) {
	if h.Region < 2*guardSize || h.Size < 0 || h.Size > h.Region-2*guardSize {
		return nil, fmt.Errorf("device: map shared buffer: bad handle %+v", h)
	}
	path := fmt.Sprintf("/proc/%d/fd/%d", h.PID, h.FD)
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("device: map shared buffer of pid %d: open %s: %w", h.PID, path, err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("device: map shared buffer of pid %d: fstat: %w", h.PID, err)
	}
	if st.Ino != h.Ino || st.Size < int64(h.Region) {
		return nil, fmt.Errorf("device: map shared buffer of pid %d: descriptor %d now names another file (inode %d, want %d)", h.PID, h.FD, st.Ino, h.Ino)
	}
	m, err := unix.Mmap(fd, 0, h.Region, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("device: map shared buffer of pid %d: mmap %d bytes: %w", h.PID, h.Region, err)
	}
	return &Mapping{mem: m}, nil
}

// Buffer returns a view of size bytes of the mapping, laid out as the
// owner's buffer (after its guard bytes). It cannot be freed: it belongs to
// its owner.
func (m *Mapping) Buffer(size int) *Buffer {
	return &Buffer{bufMem: &bufMem{size: size, region: m.mem}}
}

// Unmap releases the mapping. Buffers made from it must not be used after.
func (m *Mapping) Unmap() error {
	if m.mem == nil {
		return nil
	}
	err := unix.Munmap(m.mem)
	m.mem = nil
	return err
}

// ShareKind is how the CUDA backend shares device memory with peer
// processes (CUDA.AllocSharedAs).
type ShareKind uint8

const (
	// ShareIPC is cuMemAlloc memory with a legacy CUDA IPC handle: peers
	// on the same host only.
	ShareIPC ShareKind = iota
	// ShareFD is a VMM allocation (cuMemCreate) exported as a POSIX file
	// descriptor, which a peer process on the same host takes with
	// pidfd_getfd(2).
	ShareFD
	// ShareFabric is a VMM allocation exported as a fabric handle, which
	// a process on any host of the GPU's multi-node NVLink fabric (an
	// NVML fabric clique, IMEX channels) imports.
	ShareFabric
)

var shareKindNames = [...]string{ShareIPC: "ipc", ShareFD: "fd", ShareFabric: "fabric"}

func (k ShareKind) String() string {
	if int(k) < len(shareKindNames) {
		return shareKindNames[k]
	}
	return fmt.Sprintf("ShareKind(%d)", uint8(k))
}

// ParseShareKind reads a ShareKind by its name (ipc, fd, fabric).
func ParseShareKind(s string) (ShareKind, error) {
	for k, n := range shareKindNames {
		if s == n {
			return ShareKind(k), nil
		}
	}
	return 0, fmt.Errorf("device: share kind %q: want ipc, fd or fabric", s)
}
