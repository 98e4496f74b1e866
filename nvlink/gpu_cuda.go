//go:build cuda && cgo

package nvlink

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/goep/goep/comm"
	"github.com/goep/goep/device"
)

// GPUWindows are a domain's GPU memory windows: every rank allocates one
// buffer per region (sizes equal on all ranks), exports it (CUDA IPC, or a
// VMM allocation's file descriptor or fabric handle: Share), all-gathers
// the handles through the group and maps every peer's. Kernels then store
// straight into peers' buffers (NVLink between GPUs, or the one GPU's
// memory when processes share it). Ranks of one process use each other's
// addresses directly; they must then share one GPU.
type GPUWindows struct {
	b *device.CUDA
	// Own[i] is this rank's buffer of region i (zeroed at creation).
	Own []*device.Buffer
	// Peers[i][p] is rank p's buffer of region i as mapped here
	// (Peers[i][me] is Own[i]).
	Peers [][]*device.Buffer
	// SameGPU is the number of the domain's ranks on this rank's GPU
	// (this one included): kernels that wait for each other's progress
	// size their grids so that every such rank's grid is resident at once.
	SameGPU int
	// PIDs[p] is rank p's process: a peer a GPU wait timed out on is lost,
	// not late, when its process has exited. 0 for a peer on another host
	// (whose process this one cannot see).
	PIDs []int
	// Share is how the windows are shared; Fallback, where it is not the
	// kind asked for, says why (the first rank whose driver refused it).
	Share    device.ShareKind
	Fallback string
}

// gpuHandleSize is the encoded size of one region's device.GPUShareHandle:
// kind, process id and number, generation, address, size, mapped size,
// descriptor, raw handle.
const gpuHandleSize = 8*8 + 64

func encodeGPUHandle(b []byte, h device.GPUShareHandle) {
	for i, v := range [8]uint64{uint64(h.Kind), uint64(h.PID), h.Proc, h.Gen, h.Addr, uint64(h.Size), uint64(h.Mapped), uint64(int64(h.FD))} {
		binary.LittleEndian.PutUint64(b[8*i:], v)
	}
	copy(b[64:], h.Raw[:])
}

func decodeGPUHandle(b []byte) device.GPUShareHandle {
	u := func(i int) uint64 { return binary.LittleEndian.Uint64(b[8*i:]) }
	h := device.GPUShareHandle{Kind: device.ShareKind(u(0)), PID: int(u(1)), Proc: u(2), Gen: u(3), Addr: u(4),
		Size: int(u(5)), Mapped: int(u(6)), FD: int(int64(u(7)))}
	copy(h.Raw[:], b[64:])
	return h
}

// chooseShare is the kind every rank shares its windows with (collective
// over g): the one every rank asks for (ranks that ask for different kinds
// fail, naming two). ShareFabric is probed on every rank first (an
// allocation exported and freed): where any rank's driver refuses it (no
// fabric handles, no IMEX channel), the domain uses CUDA IPC instead, and
// the returned note names the rank and its driver's reason. A domain that
// spans hosts (crossHost) shares by fabric handles where CUDA IPC is
// asked, and has no fallback.
func chooseShare(ctx context.Context, g comm.Group, b *device.CUDA, want device.ShareKind, crossHost bool) (device.ShareKind, string, error) {
	if crossHost && want == device.ShareIPC {
		want = device.ShareFabric
	}
	status := []byte{byte(want), 0}
	if want == device.ShareFabric {
		if err := b.ProbeShare(device.ShareFabric); err != nil {
			status = append([]byte{byte(want), 1}, err.Error()...)
		}
	}
	all, err := g.AllGather(ctx, status)
	if err != nil {
		return 0, "", fmt.Errorf("nvlink: exchange how GPU windows are shared: %w", err)
	}
	for p, s := range all {
		if len(s) < 2 {
			return 0, "", fmt.Errorf("nvlink: exchange how GPU windows are shared: %d bytes from rank %d", len(s), p)
		}
		if k := device.ShareKind(s[0]); k != want {
			return 0, "", fmt.Errorf("nvlink: GPU windows: rank %d shares them as %v, rank %d as %v (GOEP_GPU_SHARE must be the same on every rank)",
				p, k, g.Rank(), want)
		}
	}
	for p, s := range all {
		if s[1] == 0 {
			continue
		}
		if crossHost {
			return 0, "", fmt.Errorf("nvlink: the domain spans hosts, and fabric handles were refused on rank %d: %s", p, s[2:])
		}
		return device.ShareIPC, fmt.Sprintf("fabric handles refused on rank %d (%s): the windows are shared with CUDA IPC", p, s[2:]), nil
	}
	return want, "", nil
}

// hostHashSize is the size of a rank's host in the handles' exchange: a
// hash of its key, which only needs to tell hosts apart.
const hostHashSize = 16

// MapGPU creates the windows (collective over g): it allocates and zeroes
// this rank's regions on s, shared as share says (chooseShare; crossHost:
// the domain spans hosts), exchanges the handles and opens every peer's.
// A handle of a kind valid within one host (CUDA IPC, file descriptors)
// from a peer on another host is refused. A rank that fails still joins
// both exchanges (handles, then open results), so every rank returns an
// error naming the rank that failed.
func MapGPU(ctx context.Context, g comm.Group, s *device.CUDAStream, sizes []int, share device.ShareKind, crossHost bool) (*GPUWindows, error) {
	w := &GPUWindows{b: s.CUDA()}
	me, R := g.Rank(), g.Size()
	var err error
	if w.Share, w.Fallback, err = chooseShare(ctx, g, w.b, share, crossHost); err != nil {
		return nil, err
	}
	// The payload: a status byte, every region's handle, the GPU's UUID,
	// the host's key.
	tail := 1 + len(sizes)*gpuHandleSize
	payload := make([]byte, tail+16+hostHashSize)
	uuid := w.b.Driver().UUID()
	copy(payload[tail:], uuid[:])
	host := sha256.Sum256([]byte(HostKey()))
	copy(payload[tail+16:], host[:])
	myHost := string(payload[tail+16:])
	lerr := func() error {
		for i, n := range sizes {
			buf, h, err := w.b.AllocSharedAs(n, w.Share)
			if err != nil {
				return fmt.Errorf("region %d (%d bytes): %w", i, n, err)
			}
			w.Own = append(w.Own, buf)
			if err := s.Memset(buf, 0, n, 0); err != nil {
				return fmt.Errorf("zero region %d: %w", i, err)
			}
			encodeGPUHandle(payload[1+i*gpuHandleSize:], h)
		}
		return s.Synchronize(ctx)
	}()
	if lerr != nil {
		payload = append([]byte{1}, lerr.Error()...)
	}
	all, err := g.AllGather(ctx, payload)
	if err != nil {
		return nil, errors.Join(fmt.Errorf("nvlink: exchange GPU handles: %w", err), w.Close())
	}
	if err := firstFailure(all, "allocate GPU windows"); err != nil {
		return nil, errors.Join(err, w.Close())
	}
	for p, b := range all {
		if len(b) != len(payload) {
			return nil, errors.Join(fmt.Errorf("nvlink: exchange GPU handles: rank %d sent %d bytes, want %d (another number of regions)", p, len(b), len(payload)), w.Close())
		}
		if string(b[tail:tail+16]) == string(uuid[:]) {
			w.SameGPU++
		}
		pid := myPID
		if p != me && len(sizes) > 0 {
			pid = decodeGPUHandle(b[1:]).PID
		}
		if string(b[tail+16:]) != myHost {
			pid = 0
		}
		w.PIDs = append(w.PIDs, pid)
	}
	w.Peers = make([][]*device.Buffer, len(sizes))
	oerr := func() error {
		for i := range sizes {
			w.Peers[i] = make([]*device.Buffer, R)
			for p := range R {
				if p == me {
					w.Peers[i][p] = w.Own[i]
					continue
				}
				raw := all[p][1+i*gpuHandleSize : 1+(i+1)*gpuHandleSize]
				h := decodeGPUHandle(raw)
				if w.PIDs[p] == 0 && h.Kind != device.ShareFabric {
					return fmt.Errorf("region %d of rank %d: rank %d is on another host, and %v handles are valid within one host only",
						i, p, p, h.Kind)
				}
				b, err := w.b.OpenShared(h)
				if err != nil {
					return fmt.Errorf("open region %d of rank %d: %w", i, p, err)
				}
				w.Peers[i][p] = b
			}
		}
		return nil
	}()
	status := []byte{0}
	if oerr != nil {
		status = append([]byte{1}, oerr.Error()...)
	}
	all, err = g.AllGather(ctx, status)
	if err != nil {
		return nil, errors.Join(fmt.Errorf("nvlink: exchange GPU open results: %w", err), w.Close())
	}
	if err := firstFailure(all, "open GPU windows"); err != nil {
		return nil, errors.Join(err, w.Close())
	}
	return w, nil
}

// firstFailure returns the error of the first rank whose payload starts
// with 1.
func firstFailure(all [][]byte, op string) error {
	for p, b := range all {
		if len(b) == 0 {
			return fmt.Errorf("nvlink: %s: empty reply from rank %d", op, p)
		}
		if b[0] == 1 {
			return fmt.Errorf("nvlink: %s: rank %d: %s", op, p, b[1:])
		}
	}
	return nil
}

// Close unmaps the peers' regions and frees this rank's. The caller makes
// sure that no queued work here or at a peer still uses them (a barrier
// after synchronizing).
func (w *GPUWindows) Close() error {
	if w == nil {
		return nil
	}
	var errs []error
	for i := range w.Peers {
		for _, b := range w.Peers[i] {
			if b != nil && !isOwn(w.Own, b) {
				errs = append(errs, w.b.FreeShared(b))
			}
		}
	}
	for _, b := range w.Own {
		errs = append(errs, w.b.FreeShared(b))
	}
	w.Own, w.Peers = nil, nil
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("nvlink: close GPU windows: %w", err)
	}
	return nil
}

func isOwn(own []*device.Buffer, b *device.Buffer) bool {
	for _, o := range own {
		if o == b {
			return true
		}
	}
	return false
}
