//go:build ucx && cgo

package ucx

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// transports are the UCX transport sets the loopback tests run over: shared
// memory and TCP on the loopback interface.
var transports = []struct {
	name string
	opts []string
	mode ErrorMode
}{
	// UCX 1.13's shared-memory transports cannot detect a failed peer.
	{"sm", []string{"TLS=sm,self"}, ErrorModeNone},
	{"tcp", []string{"TLS=tcp,self", "NET_DEVICES=lo"}, ErrorModePeer},
}

// mmapRegion maps n bytes of anonymous memory (never the Go heap) and unmaps
// it at the end of the test.
func mmapRegion(t *testing.T, n int) []byte {
	t.Helper()
	b, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Munmap(b) })
	return b
}

// pair is two workers of one context connected to each other: a puts into
// b's region.
type pair struct {
	ctx      *Context
	a, b     *Worker
	ab, ba   *Endpoint
	region   []byte // b's, mapped
	mem      *MemHandle
	rkey     *RemoteKey // b's region, unpacked on ab
	src      []byte     // a's, mapped
	srcMem   *MemHandle
	progress chan struct{}
}

func newPair(t *testing.T, opts []string, mode ErrorMode, n int) *pair {
	t.Helper()
	c, err := NewContext(ContextConfig{Options: opts})
	if err != nil {
		t.Fatalf("NewContext: %v", err)
	}
	p := &pair{ctx: c}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Errorf("Context.Close: %v", err)
		}
	})
	if p.a, err = c.NewWorker(); err != nil {
		t.Fatal(err)
	}
	if p.b, err = c.NewWorker(); err != nil {
		t.Fatal(err)
	}
	addrA, err := p.a.Address()
	if err != nil {
		t.Fatal(err)
	}
	addrB, err := p.b.Address()
	if err != nil {
		t.Fatal(err)
	}
	if p.ab, err = p.a.Connect(addrB, mode); err != nil {
		t.Fatal(err)
	}
	if p.ba, err = p.b.Connect(addrA, mode); err != nil {
		t.Fatal(err)
	}
	p.region = mmapRegion(t, n)
	if p.mem, err = c.MemMap(p.region); err != nil {
		t.Fatal(err)
	}
	packed, err := p.mem.PackRkey()
	if err != nil {
		t.Fatal(err)
	}
	if p.rkey, err = p.ab.UnpackRkey(packed); err != nil {
		t.Fatal(err)
	}
	p.src = mmapRegion(t, n)
	if p.srcMem, err = c.MemMap(p.src); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() }) // before the regions are unmapped
	// b's worker must progress for emulated (software) RMA over TCP.
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
			}
			if p.b.Progress() == 0 {
				time.Sleep(10 * time.Microsecond)
			}
		}
	}()
	t.Cleanup(func() { close(stop); <-done })
	return p
}

func TestPutAndAtomicAdd(t *testing.T) {
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) {
			const n = 1 << 20
			p := newPair(t, tr.opts, tr.mode, n)
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			// Self-checking payload: each 8-byte word holds its offset and a
			// tag, so a misplaced word names itself.
			const tag = 0xA5 << 56
			for off := 0; off < n; off += 8 {
				binary.LittleEndian.PutUint64(p.src[off:], tag|uint64(off))
			}
			signal := n - 8 // the last word of b's region is the signal word
			for _, c := range []struct{ srcOff, dstOff, len int }{
				{0, 0, 8}, {8, 64, 4096}, {0, 4096, 65536}, {4096, 128 << 10, n - (128 << 10) - 8},
			} {
				req, err := p.ab.Put(p.src[c.srcOff:c.srcOff+c.len], p.mem.Address()+uint64(c.dstOff), p.rkey, p.srcMem)
				if err != nil {
					t.Fatalf("Put %+v: %v", c, err)
				}
				if err := p.a.Fence(); err != nil {
					t.Fatal(err)
				}
				add, err := p.ab.AtomicAdd(1, p.mem.Address()+uint64(signal), p.rkey)
				if err != nil {
					t.Fatalf("AtomicAdd: %v", err)
				}
				if err := req.Wait(ctx); err != nil {
					t.Fatalf("Put %+v: %v", c, err)
				}
				if err := add.Wait(ctx); err != nil {
					t.Fatalf("AtomicAdd: %v", err)
				}
				if err := p.ab.Flush(ctx); err != nil {
					t.Fatalf("Flush: %v", err)
				}
				for off := 0; off < c.len; off += 8 {
					got := binary.LittleEndian.Uint64(p.region[c.dstOff+off:])
					if want := tag | uint64(c.srcOff+off); got != want {
						t.Fatalf("put %+v: word at +%d is %#x, want %#x", c, off, got, want)
					}
				}
			}
			word := (*uint64)(unsafe.Pointer(&p.region[signal]))
			if got := atomic.LoadUint64(word); got != 4 {
				t.Fatalf("signal word %d, want 4", got)
			}
			if err := p.a.Flush(ctx); err != nil {
				t.Fatalf("Worker.Flush: %v", err)
			}
			if err := p.ab.Err(); err != nil {
				t.Fatalf("Err: %v", err)
			}
			if err := p.rkey.Close(); err != nil {
				t.Fatal(err)
			}
			if err := p.ab.Close(ctx); err != nil {
				t.Fatalf("Endpoint.Close: %v", err)
			}
			if _, err := p.ab.Put(p.src[:8], p.mem.Address(), p.rkey, nil); !errors.Is(err, ErrClosed) {
				t.Fatalf("Put after Close: %v, want ErrClosed", err)
			}
		})
	}
}

// TestConcurrentPuts posts many small puts and adds from two goroutines on
// one worker (ThreadSerialized): every word and the counter must arrive.
func TestConcurrentPuts(t *testing.T) {
	const n = 64 << 10
	p := newPair(t, transports[0].opts, transports[0].mode, n)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	for off := 0; off < n; off += 8 {
		binary.LittleEndian.PutUint64(p.src[off:], uint64(off)+1)
	}
	errs := make(chan error, 2)
	for g := range 2 {
		go func() {
			for off := g * 8; off < n-8; off += 16 {
				r, err := p.ab.Put(p.src[off:off+8], p.mem.Address()+uint64(off), p.rkey, nil)
				if err == nil {
					err = r.Wait(ctx)
				}
				if err == nil {
					r, err = p.ab.AtomicAdd(2, p.mem.Address()+n-8, p.rkey)
				}
				if err == nil {
					err = r.Wait(ctx)
				}
				if err != nil {
					errs <- fmt.Errorf("goroutine %d at %d: %w", g, off, err)
					return
				}
			}
			errs <- nil
		}()
	}
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if err := p.a.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	for off := 0; off < n-8; off += 8 {
		if got := binary.LittleEndian.Uint64(p.region[off:]); got != uint64(off)+1 {
			t.Fatalf("word at %d is %d, want %d", off, got, off+1)
		}
	}
	if got, want := atomic.LoadUint64((*uint64)(unsafe.Pointer(&p.region[n-8]))), uint64(2*(n-8)/8); got != want {
		t.Fatalf("counter %d, want %d", got, want)
	}
}

func TestErrors(t *testing.T) {
	if _, err := NewContext(ContextConfig{Options: []string{"KEEPALIVE_INTERVAL=soon"}}); err == nil {
		t.Fatal("bad option value accepted")
	} else {
		var ue *Error
		if !errors.As(err, &ue) || ue.Op != "ucp_config_modify(KEEPALIVE_INTERVAL)" || ue.Name == "" {
			t.Fatalf("unknown option: %v, want an *Error naming ucp_config_modify", err)
		}
		t.Log(err)
	}
	if _, err := NewContext(ContextConfig{Options: []string{"TLS"}}); err == nil {
		t.Fatal("option without = accepted")
	}
	c, err := NewContext(ContextConfig{Options: transports[0].opts})
	if err != nil {
		t.Fatal(err)
	}
	w, err := c.NewWorker()
	if err != nil {
		t.Fatal(err)
	}
	// (Connect to bytes that are not a worker address is not tested: UCX
	// 1.13 aborts the process on an assertion.)
	if _, err := w.Connect(nil, ErrorModeNone); err == nil {
		t.Error("Connect to an empty address accepted")
	}
	if _, err := c.MemMap(nil); err == nil {
		t.Error("MemMap of nothing accepted")
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Address(); !errors.Is(err, ErrClosed) {
		t.Fatalf("Address after Close: %v, want ErrClosed", err)
	}
	if _, err := c.NewWorker(); !errors.Is(err, ErrClosed) {
		t.Fatalf("NewWorker after Close: %v, want ErrClosed", err)
	}
	if err := c.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	e := &Error{Op: "ucp_put_nbx", Status: StatusConnectionReset, Name: "Connection reset by remote peer"}
	if !IsPeerFailure(fmt.Errorf("wrapped: %w", e)) || !IsStatus(e, StatusConnectionReset) || IsPeerFailure(&Error{Status: StatusInvalidParam}) {
		t.Fatal("IsPeerFailure / IsStatus")
	}
}

// TestPeerClosed closes b's worker: a's flush must fail with a peer failure
// (through the endpoint's error handler) within the deadline, not hang.
func TestPeerClosed(t *testing.T) {
	for _, tr := range transports {
		if tr.mode != ErrorModePeer {
			continue
		}
		t.Run(tr.name, func(t *testing.T) {
			opts := append([]string{"KEEPALIVE_INTERVAL=100ms"}, tr.opts...)
			p := newPair(t, opts, tr.mode, 4096)
			ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
			defer cancel()
			if err := p.ab.Flush(ctx); err != nil {
				t.Fatalf("first flush: %v", err)
			}
			if err := p.b.Close(); err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			var err error
			for ctx.Err() == nil {
				var r *Request
				r, err = p.ab.Put(p.src[:8], p.mem.Address(), p.rkey, nil)
				if err == nil {
					err = r.Wait(ctx)
				}
				if err == nil {
					err = p.ab.Flush(ctx)
				}
				if err != nil {
					break
				}
				time.Sleep(10 * time.Millisecond)
			}
			t.Logf("after %v: %v (Err: %v)", time.Since(start), err, p.ab.Err())
			if err == nil || ctx.Err() != nil {
				t.Fatalf("no error within the deadline: %v", err)
			}
		})
	}
}

func TestVersion(t *testing.T) {
	v, err := Version()
	if err != nil || v == "" {
		t.Fatalf("Version: %q, %v", v, err)
	}
	t.Log("libucp", v)
}

// TestMemAlloc puts into memory UCX allocated (shared memory first), which
// peers on the host write with plain stores.
func TestMemAlloc(t *testing.T) {
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) {
			const n = 256 << 10
			p := newPair(t, tr.opts, tr.mode, n)
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			m, err := p.ctx.MemAlloc(n)
			if err != nil {
				t.Fatal(err)
			}
			dst := m.Bytes()
			if len(dst) != n || m.Len() != n || m.Address() == 0 {
				t.Fatalf("MemAlloc: %d bytes at %#x", len(dst), m.Address())
			}
			packed, err := m.PackRkey()
			if err != nil {
				t.Fatal(err)
			}
			rk, err := p.ab.UnpackRkey(packed)
			if err != nil {
				t.Fatal(err)
			}
			for off := 0; off < n; off += 8 {
				binary.LittleEndian.PutUint64(p.src[off:], uint64(off)*3+1)
			}
			req, err := p.ab.Put(p.src[:n-8], m.Address(), rk, p.srcMem)
			if err != nil {
				t.Fatal(err)
			}
			if err := p.a.Fence(); err != nil {
				t.Fatal(err)
			}
			add, err := p.ab.AtomicAdd(7, m.Address()+n-8, rk)
			if err != nil {
				t.Fatal(err)
			}
			if err := errors.Join(req.Wait(ctx), add.Wait(ctx), p.ab.Flush(ctx)); err != nil {
				t.Fatal(err)
			}
			for off := 0; off < n-8; off += 8 {
				if got := binary.LittleEndian.Uint64(dst[off:]); got != uint64(off)*3+1 {
					t.Fatalf("word at %d is %d", off, got)
				}
			}
			if got := atomic.LoadUint64((*uint64)(unsafe.Pointer(&dst[n-8]))); got != 7 {
				t.Fatalf("counter %d, want 7", got)
			}
			if err := errors.Join(rk.Close(), m.Close(), m.Close()); err != nil {
				t.Fatal(err)
			}
			if _, err := p.ctx.MemAlloc(0); err == nil {
				t.Fatal("MemAlloc(0) accepted")
			}
		})
	}
}

// TestMemoryTypes: every context can access host memory; CUDA memory only
// where UCX was built with CUDA (and then whether a GPU is there), which
// the test logs.
func TestMemoryTypes(t *testing.T) {
	c, err := NewContext(ContextConfig{})
	if err != nil {
		t.Fatal(err)
	}
	m, err := c.MemoryTypes()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("memory types: %v (cuda %v)", m, m.CUDA())
	if m&MemoryHost == 0 {
		t.Errorf("memory types %v: no host memory", m)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.MemoryTypes(); !errors.Is(err, ErrClosed) {
		t.Errorf("MemoryTypes after Close: %v, want ErrClosed", err)
	}
}

// TestDevices lists the machine's UCX resources: every machine has the
// loop-back transport and shared memory; the tests' TCP transport runs on
// lo, which is a network device but not an RDMA one.
func TestDevices(t *testing.T) {
	devs, skipped, err := Devices()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d resources (%d memory domains skipped)", len(devs), skipped)
	var self, shm, tcpLo bool
	for _, d := range devs {
		t.Logf("%-10s %-10s %-12s %-12s %s rdma=%v gpu=%v", d.Component, d.MD, d.Transport, d.Device, d.Type, d.RDMA(), d.GPU())
		if d.Component == "" || d.MD == "" || d.Transport == "" || d.Device == "" {
			t.Errorf("incomplete resource %+v", d)
		}
		self = self || d.Transport == "self" && d.Type == "self"
		shm = shm || d.Type == "shm"
		if d.Transport == "tcp" && d.Device == "lo" {
			tcpLo = true
			if d.Type != "net" || d.RDMA() {
				t.Errorf("tcp on lo: %+v, rdma %v; want a net device, not RDMA", d, d.RDMA())
			}
		}
	}
	if !self || !shm || !tcpLo {
		t.Errorf("self %v, shared memory %v, tcp on lo %v; want all three", self, shm, tcpLo)
	}
}
