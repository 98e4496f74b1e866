//go:build ucx && cgo

package ucx

/*
#cgo pkg-config: ucx
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ucp/api/ucp.h>
#include <uct/api/uct.h>

// The UCS_PTR_* helpers are macros.
static int goep_ptr_is_err(ucs_status_ptr_t p) { return UCS_PTR_IS_ERR(p); }
static int goep_ptr_is_ptr(ucs_status_ptr_t p) { return UCS_PTR_IS_PTR(p); }
static ucs_status_t goep_ptr_status(ucs_status_ptr_t p) { return UCS_PTR_STATUS(p); }

static ucs_status_t goep_init(ucp_config_t *cfg, uint64_t features, size_t neps, ucp_context_h *out) {
	ucp_params_t p;
	memset(&p, 0, sizeof p);
	p.field_mask = UCP_PARAM_FIELD_FEATURES;
	p.features = features;
	if (neps > 0) {
		p.field_mask |= UCP_PARAM_FIELD_ESTIMATED_NUM_EPS;
		p.estimated_num_eps = neps;
	}
	return ucp_init(&p, cfg, out);
}

static ucs_status_t goep_memory_types(ucp_context_h c, uint64_t *out) {
	ucp_context_attr_t a;
	memset(&a, 0, sizeof a);
	a.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES;
	ucs_status_t st = ucp_context_query(c, &a);
	*out = a.memory_types;
	return st;
}

// The Go constants' bit numbers are UCX's.
_Static_assert(UCS_MEMORY_TYPE_HOST == 0 && UCS_MEMORY_TYPE_CUDA == 1 && UCS_MEMORY_TYPE_CUDA_MANAGED == 2 &&
	UCS_MEMORY_TYPE_ROCM == 3 && UCS_MEMORY_TYPE_ROCM_MANAGED == 4, "ucs_memory_type_t numbering");

static ucs_status_t goep_worker_create(ucp_context_h c, int mode, ucp_worker_h *out) {
	ucp_worker_params_t p;
	memset(&p, 0, sizeof p);
	p.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
	p.thread_mode = (ucs_thread_mode_t)mode;
	return ucp_worker_create(c, &p, out);
}

// goep_ep_failed is every endpoint's error handler: it records the status
// in the endpoint's C slot, which Go reads under the worker's mutex. It runs
// inside ucp_worker_progress, so no Go code is called back.
static void goep_ep_failed(void *arg, ucp_ep_h ep, ucs_status_t status) {
	*(ucs_status_t *)arg = status;
}

static ucs_status_t goep_ep_create(ucp_worker_h w, const void *addr, int mode, ucs_status_t *slot, ucp_ep_h *out) {
	ucp_ep_params_t p;
	memset(&p, 0, sizeof p);
	p.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
	               UCP_EP_PARAM_FIELD_ERR_HANDLER;
	p.address = (const ucp_address_t *)addr;
	p.err_mode = (ucp_err_handling_mode_t)mode;
	p.err_handler.cb = goep_ep_failed;
	p.err_handler.arg = slot;
	return ucp_ep_create(w, &p, out);
}

static ucs_status_ptr_t goep_ep_close(ucp_ep_h ep, int force) {
	ucp_request_param_t p;
	memset(&p, 0, sizeof p);
	p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
	p.flags = force ? UCP_EP_CLOSE_FLAG_FORCE : 0;
	return ucp_ep_close_nbx(ep, &p);
}

static ucs_status_t goep_mem_map(ucp_context_h c, void *addr, size_t n, ucp_mem_h *out) {
	ucp_mem_map_params_t p;
	memset(&p, 0, sizeof p);
	p.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
	p.address = addr;
	p.length = n;
	return ucp_mem_map(c, &p, out);
}

// goep_mem_alloc has UCX allocate n bytes (UCP_MEM_MAP_ALLOCATE: from its
// allocators, shared memory first, so that peers on the host can map it) and
// returns the address.
static ucs_status_t goep_mem_alloc(ucp_context_h c, size_t n, ucp_mem_h *out, void **addr) {
	ucp_mem_map_params_t p;
	memset(&p, 0, sizeof p);
	p.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH | UCP_MEM_MAP_PARAM_FIELD_FLAGS;
	p.address = NULL;
	p.length = n;
	p.flags = UCP_MEM_MAP_ALLOCATE;
	ucs_status_t st = ucp_mem_map(c, &p, out);
	if (st != UCS_OK) {
		return st;
	}
	ucp_mem_attr_t a;
	memset(&a, 0, sizeof a);
	a.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS;
	st = ucp_mem_query(*out, &a);
	if (st != UCS_OK) {
		ucp_mem_unmap(c, *out);
		return st;
	}
	*addr = a.address;
	return UCS_OK;
}

static ucs_status_ptr_t goep_put(ucp_ep_h ep, uintptr_t buf, size_t n, uint64_t raddr, ucp_rkey_h rkey, ucp_mem_h memh) {
	ucp_request_param_t p;
	memset(&p, 0, sizeof p);
	if (memh != NULL) {
		p.op_attr_mask = UCP_OP_ATTR_FIELD_MEMH;
		p.memh = memh;
	}
	return ucp_put_nbx(ep, (const void *)buf, n, raddr, rkey, &p);
}

// goep_atomic_add posts *operand += to the remote word; operand is C memory
// that lives until the request completes.
static ucs_status_ptr_t goep_atomic_add(ucp_ep_h ep, uint64_t *operand, uint64_t raddr, ucp_rkey_h rkey) {
	ucp_request_param_t p;
	memset(&p, 0, sizeof p);
	p.op_attr_mask = UCP_OP_ATTR_FIELD_DATATYPE;
	p.datatype = ucp_dt_make_contig(8);
	return ucp_atomic_op_nbx(ep, UCP_ATOMIC_OP_ADD, operand, 1, raddr, rkey, &p);
}

static ucs_status_ptr_t goep_ep_flush(ucp_ep_h ep) {
	ucp_request_param_t p;
	memset(&p, 0, sizeof p);
	return ucp_ep_flush_nbx(ep, &p);
}

static ucs_status_ptr_t goep_worker_flush(ucp_worker_h w) {
	ucp_request_param_t p;
	memset(&p, 0, sizeof p);
	return ucp_worker_flush_nbx(w, &p);
}

// goep_tl is one transport resource of goep_devices.
typedef struct {
	char component[UCT_COMPONENT_NAME_MAX];
	char md[UCT_MD_NAME_MAX];
	char tl[UCT_TL_NAME_MAX];
	char dev[UCT_DEVICE_NAME_MAX];
	int type;
} goep_tl;

// goep_devices lists every transport resource of every memory domain of
// every UCT component into out (up to cap; *n gets the number found, which
// may exceed cap). A component that does not answer its query, or a
// memory domain that fails to open or list its resources, is skipped (its
// driver or hardware is absent); *skipped counts them.
static ucs_status_t goep_devices(goep_tl *out, int cap, int *n, int *skipped) {
	uct_component_h *comps;
	unsigned ncomps;
	*n = 0;
	*skipped = 0;
	ucs_status_t st = uct_query_components(&comps, &ncomps);
	if (st != UCS_OK) {
		return st;
	}
	for (unsigned c = 0; c < ncomps; c++) {
		uct_component_attr_t attr;
		memset(&attr, 0, sizeof attr);
		attr.field_mask = UCT_COMPONENT_ATTR_FIELD_NAME | UCT_COMPONENT_ATTR_FIELD_MD_RESOURCE_COUNT;
		if (uct_component_query(comps[c], &attr) != UCS_OK) {
			(*skipped)++;
			continue;
		}
		uct_md_resource_desc_t *mds = calloc(attr.md_resource_count + 1, sizeof *mds);
		if (mds == NULL) {
			uct_release_component_list(comps);
			return UCS_ERR_NO_MEMORY;
		}
		attr.field_mask = UCT_COMPONENT_ATTR_FIELD_MD_RESOURCES;
		attr.md_resources = mds;
		if (uct_component_query(comps[c], &attr) != UCS_OK) {
			free(mds);
			(*skipped)++;
			continue;
		}
		for (unsigned m = 0; m < attr.md_resource_count; m++) {
			uct_md_config_t *cfg;
			uct_md_h md;
			if (uct_md_config_read(comps[c], NULL, NULL, &cfg) != UCS_OK) {
				(*skipped)++;
				continue;
			}
			st = uct_md_open(comps[c], mds[m].md_name, cfg, &md);
			uct_config_release(cfg);
			if (st != UCS_OK) {
				(*skipped)++;
				continue;
			}
			uct_tl_resource_desc_t *tls;
			unsigned ntls;
			if (uct_md_query_tl_resources(md, &tls, &ntls) != UCS_OK) {
				uct_md_close(md);
				(*skipped)++;
				continue;
			}
			for (unsigned t = 0; t < ntls; t++, (*n)++) {
				if (*n >= cap) {
					continue;
				}
				goep_tl *o = &out[*n];
				snprintf(o->component, sizeof o->component, "%s", attr.name);
				snprintf(o->md, sizeof o->md, "%s", mds[m].md_name);
				snprintf(o->tl, sizeof o->tl, "%s", tls[t].tl_name);
				snprintf(o->dev, sizeof o->dev, "%s", tls[t].dev_name);
				o->type = (int)tls[t].dev_type;
			}
			uct_release_tl_resource_list(tls);
			uct_md_close(md);
		}
		free(mds);
	}
	uct_release_component_list(comps);
	return UCS_OK;
}
*/
import "C"

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"time"
	"unsafe"

	"github.com/goep/goep/internal/poll"
)

// Compiled reports whether the binding was built (tag ucx and cgo).
const Compiled = true

// status is the one conversion from a ucs_status_t to a Go error.
func status(op string, st C.ucs_status_t) error {
	if st == C.UCS_OK {
		return nil
	}
	return &Error{Op: op, Status: int(st), Name: C.GoString(C.ucs_status_string(st))}
}

// Version is the version of the libucp loaded at run time ("1.13.1").
func Version() (string, error) {
	var major, minor, release C.uint
	C.ucp_get_version(&major, &minor, &release)
	return fmt.Sprintf("%d.%d.%d", major, minor, release), nil
}

// Devices lists the transport resources UCX finds on this machine (every
// memory domain of every UCT component; `ucx_info -d` shows the same), in
// UCX's order. skipped counts the components and memory domains that did
// not answer (their driver or hardware is absent).
func Devices() (devs []Device, skipped int, err error) {
	for capacity := 64; ; capacity *= 4 {
		buf := make([]C.goep_tl, capacity)
		var n, sk C.int
		if err := status("uct_query_components", C.goep_devices(&buf[0], C.int(capacity), &n, &sk)); err != nil {
			return nil, 0, err
		}
		if int(n) > capacity {
			continue
		}
		types := map[C.int]string{C.UCT_DEVICE_TYPE_NET: "net", C.UCT_DEVICE_TYPE_SHM: "shm",
			C.UCT_DEVICE_TYPE_ACC: "acc", C.UCT_DEVICE_TYPE_SELF: "self"}
		for _, r := range buf[:n] {
			typ, ok := types[r._type]
			if !ok {
				typ = fmt.Sprintf("type %d", int(r._type))
			}
			devs = append(devs, Device{Component: C.GoString(&r.component[0]), MD: C.GoString(&r.md[0]),
				Transport: C.GoString(&r.tl[0]), Device: C.GoString(&r.dev[0]), Type: typ})
		}
		return devs, int(sk), nil
	}
}

// Context is a UCX application context (ucp_context_h): the transports and
// the memory registrations of a process. Its methods are safe for
// concurrent use.
type Context struct {
	mu      sync.Mutex
	h       C.ucp_context_h
	workers map[*Worker]struct{}
	mems    map[*MemHandle]struct{}
}

// NewContext reads the UCX_* environment, applies cfg.Options on top and
// initialises a context (ucp_init) with cfg.Features.
func NewContext(cfg ContextConfig) (*Context, error) {
	features := cfg.Features
	if features == 0 {
		features = FeatureRMA | FeatureAMO64
	}
	var conf *C.ucp_config_t
	if err := status("ucp_config_read", C.ucp_config_read(nil, nil, &conf)); err != nil {
		return nil, err
	}
	defer C.ucp_config_release(conf)
	for _, kv := range cfg.Options {
		name, value, ok := strings.Cut(kv, "=")
		if !ok || name == "" {
			return nil, fmt.Errorf("ucx: option %q: want NAME=VALUE", kv)
		}
		cn, cv := C.CString(name), C.CString(value)
		err := status("ucp_config_modify("+name+")", C.ucp_config_modify(conf, cn, cv))
		C.free(unsafe.Pointer(cn))
		C.free(unsafe.Pointer(cv))
		if err != nil {
			return nil, err
		}
	}
	c := &Context{workers: map[*Worker]struct{}{}, mems: map[*MemHandle]struct{}{}}
	if err := status("ucp_init", C.goep_init(conf, C.uint64_t(features), C.size_t(max(cfg.EstimatedEndpoints, 0)), &c.h)); err != nil {
		return nil, err
	}
	return c, nil
}

// Close closes the context's remaining workers (force-closing their
// endpoints), unmaps its remaining memory and cleans the context up
// (ucp_cleanup). It returns the first error; a second Close does nothing.
func (c *Context) Close() error {
	c.mu.Lock()
	if c.h == nil {
		c.mu.Unlock()
		return nil
	}
	workers := mapKeys(c.workers)
	mems := mapKeys(c.mems)
	c.mu.Unlock()
	var first error
	keep := func(err error) {
		if first == nil {
			first = err
		}
	}
	for _, w := range workers {
		keep(w.Close())
	}
	for _, m := range mems {
		keep(m.Close())
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	C.ucp_cleanup(c.h)
	c.h = nil
	return first
}

func mapKeys[K comparable, V any](m map[K]V) []K {
	out := make([]K, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

func (c *Context) handle(op string) (C.ucp_context_h, error) {
	if c.h == nil {
		return nil, fmt.Errorf("ucx: %s: context %w", op, ErrClosed)
	}
	return c.h, nil
}

// MemoryTypes is the memory the context's transports can access
// (ucp_context_query): MemoryHost always; MemoryCUDA where UCX was built
// with CUDA and found a GPU.
func (c *Context) MemoryTypes() (MemoryTypes, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	h, err := c.handle("memory types")
	if err != nil {
		return 0, err
	}
	var m C.uint64_t
	if err := status("ucp_context_query", C.goep_memory_types(h, &m)); err != nil {
		return 0, err
	}
	return MemoryTypes(m), nil
}

// NewWorker creates a worker (ucp_worker_create) in ThreadSerialized mode:
// its calls are serialised by the binding, from any goroutine.
func (c *Context) NewWorker() (*Worker, error) {
	return c.NewWorkerMode(ThreadSerialized)
}

// NewWorkerMode creates a worker with the given thread mode. With
// ThreadSingle every call on the worker must come from the OS thread that
// creates it (a goroutine locked with runtime.LockOSThread).
func (c *Context) NewWorkerMode(mode ThreadMode) (*Worker, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	h, err := c.handle("ucp_worker_create")
	if err != nil {
		return nil, err
	}
	w := &Worker{c: c, eps: map[*Endpoint]struct{}{}}
	if err := status("ucp_worker_create", C.goep_worker_create(h, C.int(mode), &w.h)); err != nil {
		return nil, err
	}
	c.workers[w] = struct{}{}
	return w, nil
}

// MemHandle is a region mapped for remote access (ucp_mem_h).
type MemHandle struct {
	c    *Context
	h    C.ucp_mem_h
	base unsafe.Pointer
	n    int
}

// MemMap registers region (ucp_mem_map with its address and length) so
// that peers can put into it and run atomics on it with the key from
// PackRkey, and so that puts from it need no registration on the fly.
// region must not be Go-heap memory (use mmap): UCX and the NIC use it
// after this call returns. It must stay mapped until Close.
func (c *Context) MemMap(region []byte) (*MemHandle, error) {
	if len(region) == 0 {
		return nil, fmt.Errorf("ucx: ucp_mem_map: empty region")
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	h, err := c.handle("ucp_mem_map")
	if err != nil {
		return nil, err
	}
	m := &MemHandle{c: c, base: unsafe.Pointer(&region[0]), n: len(region)}
	if err := status("ucp_mem_map", C.goep_mem_map(h, unsafe.Pointer(&region[0]), C.size_t(len(region)), &m.h)); err != nil {
		return nil, err
	}
	c.mems[m] = struct{}{}
	return m, nil
}

// MemAlloc has UCX allocate and map n bytes (ucp_mem_map with
// UCP_MEM_MAP_ALLOCATE, then ucp_mem_query for the address). UCX allocates
// from shared memory first (UCX_ALLOC_PRIO), so peers on this host put
// into it with plain stores through the mapped segment, not through
// emulated RMA; Bytes is the region. Close frees it: the slice must not be
// used afterwards.
func (c *Context) MemAlloc(n int) (*MemHandle, error) {
	if n <= 0 {
		return nil, fmt.Errorf("ucx: ucp_mem_map(allocate): %d bytes", n)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	h, err := c.handle("ucp_mem_map(allocate)")
	if err != nil {
		return nil, err
	}
	m := &MemHandle{c: c, n: n}
	var addr unsafe.Pointer
	if err := status("ucp_mem_map(allocate)", C.goep_mem_alloc(h, C.size_t(n), &m.h, &addr)); err != nil {
		return nil, err
	}
	m.base = addr
	c.mems[m] = struct{}{}
	return m, nil
}

// Bytes is the mapped region (for MemAlloc's memory; for MemMap's, the
// caller's region).
func (m *MemHandle) Bytes() []byte {
	return unsafe.Slice((*byte)(m.base), m.n)
}

// Address is the region's base address, which peers add offsets to.
func (m *MemHandle) Address() uint64 { return uint64(uintptr(m.base)) }

// Len is the region's length in bytes.
func (m *MemHandle) Len() int { return m.n }

// PackRkey returns the region's remote key, packed for a peer
// (ucp_rkey_pack; the packed buffer is copied and released).
func (m *MemHandle) PackRkey() ([]byte, error) {
	m.c.mu.Lock()
	defer m.c.mu.Unlock()
	h, err := m.c.handle("ucp_rkey_pack")
	if err != nil {
		return nil, err
	}
	if m.h == nil {
		return nil, fmt.Errorf("ucx: ucp_rkey_pack: memory handle %w", ErrClosed)
	}
	var buf unsafe.Pointer
	var n C.size_t
	if err := status("ucp_rkey_pack", C.ucp_rkey_pack(h, m.h, &buf, &n)); err != nil {
		return nil, err
	}
	out := C.GoBytes(buf, C.int(n))
	C.ucp_rkey_buffer_release(buf)
	return out, nil
}

// Close unmaps the region (ucp_mem_unmap); the memory itself stays the
// caller's. A second Close does nothing.
func (m *MemHandle) Close() error {
	m.c.mu.Lock()
	defer m.c.mu.Unlock()
	if m.h == nil || m.c.h == nil {
		return nil
	}
	err := status("ucp_mem_unmap", C.ucp_mem_unmap(m.c.h, m.h))
	m.h = nil
	delete(m.c.mems, m)
	return err
}

// Worker is a progress engine with its endpoints (ucp_worker_h). Every
// method takes the worker's mutex for the UCX calls it makes.
type Worker struct {
	c   *Context
	mu  sync.Mutex
	h   C.ucp_worker_h
	eps map[*Endpoint]struct{}
}

func (w *Worker) handle(op string) (C.ucp_worker_h, error) {
	if w.h == nil {
		return nil, fmt.Errorf("ucx: %s: worker %w", op, ErrClosed)
	}
	return w.h, nil
}

// Address returns the worker's address, for a peer's Connect
// (ucp_worker_get_address; copied, then released).
func (w *Worker) Address() ([]byte, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	h, err := w.handle("ucp_worker_get_address")
	if err != nil {
		return nil, err
	}
	var a *C.ucp_address_t
	var n C.size_t
	if err := status("ucp_worker_get_address", C.ucp_worker_get_address(h, &a, &n)); err != nil {
		return nil, err
	}
	out := C.GoBytes(unsafe.Pointer(a), C.int(n))
	C.ucp_worker_release_address(h, a)
	return out, nil
}

// Progress runs ucp_worker_progress once and returns the number of events
// it handled (0: nothing happened).
func (w *Worker) Progress() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.h == nil {
		return 0
	}
	return int(C.ucp_worker_progress(w.h))
}

// Fence orders the worker's operations (ucp_worker_fence): every put or
// atomic issued after it, to any endpoint, is performed at its target after
// every one issued before it.
func (w *Worker) Fence() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	h, err := w.handle("ucp_worker_fence")
	if err != nil {
		return err
	}
	return status("ucp_worker_fence", C.ucp_worker_fence(h))
}

// FlushNB starts a flush of every endpoint of the worker
// (ucp_worker_flush_nbx): the request completes when every operation issued
// before it has completed at its target.
func (w *Worker) FlushNB() (*Request, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	h, err := w.handle("ucp_worker_flush_nbx")
	if err != nil {
		return nil, err
	}
	return w.request("ucp_worker_flush_nbx", C.goep_worker_flush(h), nil)
}

// Flush flushes the worker and waits, progressing it, until the flush
// completes or ctx ends.
func (w *Worker) Flush(ctx context.Context) error {
	r, err := w.FlushNB()
	if err != nil {
		return err
	}
	return r.Wait(ctx)
}

// Close force-closes the worker's remaining endpoints (destroying their
// remote keys) and destroys the worker (ucp_worker_destroy). An
// ErrorModeNone endpoint to a dead peer can be neither forced nor flushed
// closed, and UCX 1.13 aborts the process if the worker is destroyed with
// it: leave such a worker (and its context) alone. A second Close
// does nothing.
func (w *Worker) Close() error {
	w.mu.Lock()
	if w.h == nil {
		w.mu.Unlock()
		return nil
	}
	eps := mapKeys(w.eps)
	w.mu.Unlock()
	var first error
	for _, ep := range eps {
		if err := ep.CloseForce(); err != nil && first == nil {
			first = err
		}
	}
	w.mu.Lock()
	C.ucp_worker_destroy(w.h)
	w.h = nil
	w.mu.Unlock()
	w.c.mu.Lock()
	delete(w.c.workers, w)
	w.c.mu.Unlock()
	return first
}

// Request is a non-blocking operation in flight. A nil *Request is an
// operation that completed at once: its methods report success.
type Request struct {
	w       *Worker
	op      string
	h       unsafe.Pointer // the UCX request; nil once freed
	operand unsafe.Pointer // C memory the operation reads (atomics), freed with the request
	err     error
	done    bool
}

// request turns a ucs_status_ptr_t into a *Request (nil when the operation
// completed in the call). Called with w.mu held. operand is freed when the
// request is done.
func (w *Worker) request(op string, p C.ucs_status_ptr_t, operand unsafe.Pointer) (*Request, error) {
	if C.goep_ptr_is_ptr(p) == 0 {
		if operand != nil {
			C.free(operand)
		}
		if C.goep_ptr_is_err(p) != 0 {
			return nil, status(op, C.goep_ptr_status(p))
		}
		return nil, nil
	}
	return &Request{w: w, op: op, h: unsafe.Pointer(p), operand: operand}, nil
}

// Test reports whether the request has completed (ucp_request_check_status,
// without progressing the worker) and its error; a completed request is
// freed.
func (r *Request) Test() (bool, error) {
	if r == nil {
		return true, nil
	}
	r.w.mu.Lock()
	defer r.w.mu.Unlock()
	return r.testLocked()
}

func (r *Request) testLocked() (bool, error) {
	if r.done {
		return true, r.err
	}
	st := C.ucp_request_check_status(r.h)
	if st == C.UCS_INPROGRESS {
		return false, nil
	}
	r.err = status(r.op, st)
	r.finish()
	return true, r.err
}

// finish frees the request and its operand. Called with w.mu held.
func (r *Request) finish() {
	if r.h != nil && r.w.h != nil {
		C.ucp_request_free(r.h)
	}
	r.h = nil
	if r.operand != nil {
		C.free(r.operand)
		r.operand = nil
	}
	r.done = true
}

// Abandon gives up on the request: UCX frees it when it completes (the
// operand, if any, is leaked, as UCX may still read it). Later Tests report
// an error.
func (r *Request) Abandon() {
	if r == nil {
		return
	}
	r.w.mu.Lock()
	defer r.w.mu.Unlock()
	if r.done {
		return
	}
	if r.h != nil && r.w.h != nil {
		C.ucp_request_free(r.h)
	}
	r.h, r.operand = nil, nil
	r.done = true
	r.err = fmt.Errorf("ucx: %s: request abandoned", r.op)
}

// Wait progresses the worker until the request completes or ctx ends (then
// it returns ctx's cause and the request stays pending: Wait again, or
// Abandon it).
func (r *Request) Wait(ctx context.Context) error {
	if r == nil {
		return nil
	}
	return r.w.poll(ctx, r.op, func() (bool, error) { return r.testLocked() })
}

// poll progresses the worker and calls done (with w.mu held) until it
// reports true or ctx ends. UCX advances requests only inside
// ucp_worker_progress, so while progress reports work done poll calls it
// again at once, as a blocking UCX wait would; when it reports none, poll
// waits by progressPolicy.
func (w *Worker) poll(ctx context.Context, op string, done func() (bool, error)) error {
	var result error // done's, or the closed worker's
	err := poll.Until(ctx, progressPolicy, func() (bool, error) {
		for {
			w.mu.Lock()
			if w.h == nil {
				w.mu.Unlock()
				result = fmt.Errorf("ucx: %s: worker %w", op, ErrClosed)
				return true, nil
			}
			n := C.ucp_worker_progress(w.h)
			ok, err := done()
			w.mu.Unlock()
			if ok {
				result = err
				return true, nil
			}
			if n == 0 || ctx.Err() != nil {
				return false, nil
			}
			runtime.Gosched()
		}
	})
	if err != nil {
		return fmt.Errorf("ucx: %s: %w", op, err)
	}
	return result
}

// progressPolicy is how poll waits while progress reports no work done.
// It reports none while a transfer's next bytes are still on their way, and
// a blocking UCX wait spins through that, so poll spins for 100ms before it
// backs off to sleeps from 10µs doubling to a millisecond: a wait that long
// is for a peer that is late, not for bytes on the wire.
var progressPolicy = poll.Policy{Spin: 100 * time.Millisecond, First: 10 * time.Microsecond, Most: time.Millisecond}

// Endpoint is a connection to a peer's worker (ucp_ep_h). With
// ErrorModePeer, when the peer dies or the link fails UCX calls the
// endpoint's error handler (during Progress), Err reports it and every later
// operation fails with it.
type Endpoint struct {
	w     *Worker
	mode  ErrorMode
	h     C.ucp_ep_h
	slot  *C.ucs_status_t // written by goep_ep_failed; C memory
	rkeys map[*RemoteKey]struct{}
}

// Connect creates an endpoint to the worker whose address (from Address)
// is addr (ucp_ep_create with UCP_EP_PARAM_FIELD_REMOTE_ADDRESS) with the
// given error handling mode. addr must be bytes that Address returned: UCX
// aborts the process on a malformed address (an assertion in
// ucp_address_unpack), so callers check what they received from peers
// before passing it here. The connection is set up lazily; an error may
// surface at the first operation or flush.
func (w *Worker) Connect(addr []byte, mode ErrorMode) (*Endpoint, error) {
	if len(addr) == 0 {
		return nil, fmt.Errorf("ucx: ucp_ep_create: empty worker address")
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	h, err := w.handle("ucp_ep_create")
	if err != nil {
		return nil, err
	}
	ca := C.CBytes(addr)
	defer C.free(ca)
	ep := &Endpoint{w: w, mode: mode, slot: (*C.ucs_status_t)(C.malloc(C.sizeof_ucs_status_t)), rkeys: map[*RemoteKey]struct{}{}}
	*ep.slot = C.UCS_OK
	if err := status("ucp_ep_create", C.goep_ep_create(h, ca, C.int(mode), ep.slot, &ep.h)); err != nil {
		C.free(unsafe.Pointer(ep.slot))
		return nil, err
	}
	w.eps[ep] = struct{}{}
	return ep, nil
}

// usable returns the endpoint's handle, or why it cannot be used: closed,
// or failed (the status its error handler received). Called with w.mu held.
func (ep *Endpoint) usable(op string) (C.ucp_ep_h, error) {
	if ep.h == nil || ep.w.h == nil {
		return nil, fmt.Errorf("ucx: %s: endpoint %w", op, ErrClosed)
	}
	if *ep.slot != C.UCS_OK {
		return nil, fmt.Errorf("ucx: %s: %w", op, status("endpoint error handler", *ep.slot))
	}
	return ep.h, nil
}

// Err is the error the endpoint's error handler received (the peer failed),
// or nil.
func (ep *Endpoint) Err() error {
	ep.w.mu.Lock()
	defer ep.w.mu.Unlock()
	if ep.slot == nil || *ep.slot == C.UCS_OK {
		return nil
	}
	return status("endpoint error handler", *ep.slot)
}

// RemoteKey is a peer's unpacked remote key (ucp_rkey_h), valid with the
// endpoint it was unpacked on.
type RemoteKey struct {
	ep *Endpoint
	h  C.ucp_rkey_h
}

// UnpackRkey unpacks a key a peer packed with PackRkey (ucp_ep_rkey_unpack).
func (ep *Endpoint) UnpackRkey(packed []byte) (*RemoteKey, error) {
	if len(packed) == 0 {
		return nil, fmt.Errorf("ucx: ucp_ep_rkey_unpack: empty key")
	}
	ep.w.mu.Lock()
	defer ep.w.mu.Unlock()
	h, err := ep.usable("ucp_ep_rkey_unpack")
	if err != nil {
		return nil, err
	}
	cb := C.CBytes(packed)
	defer C.free(cb)
	k := &RemoteKey{ep: ep}
	if err := status("ucp_ep_rkey_unpack", C.ucp_ep_rkey_unpack(h, cb, &k.h)); err != nil {
		return nil, err
	}
	ep.rkeys[k] = struct{}{}
	return k, nil
}

// Close destroys the key (ucp_rkey_destroy). A second Close does nothing.
func (k *RemoteKey) Close() error {
	k.ep.w.mu.Lock()
	defer k.ep.w.mu.Unlock()
	k.destroy()
	return nil
}

func (k *RemoteKey) destroy() {
	if k.h != nil {
		C.ucp_rkey_destroy(k.h)
		k.h = nil
		delete(k.ep.rkeys, k)
	}
}

func (k *RemoteKey) handle(op string) (C.ucp_rkey_h, error) {
	if k == nil || k.h == nil {
		return nil, fmt.Errorf("ucx: %s: remote key %w", op, ErrClosed)
	}
	return k.h, nil
}

// remote returns the handles of a one-sided operation op on ep through
// rkey, both usable; the worker's lock is held.
func (ep *Endpoint) remote(op string, rkey *RemoteKey) (C.ucp_ep_h, C.ucp_rkey_h, error) {
	h, err := ep.usable(op)
	if err != nil {
		return nil, nil, err
	}
	rk, err := rkey.handle(op)
	if err != nil {
		return nil, nil, err
	}
	return h, rk, nil
}

// Put starts writing src to the peer's address raddr, inside a region whose
// key is rkey (ucp_put_nbx). src must not be Go-heap memory and must not
// change until the request completes (or a flush covering it does). local,
// if not nil, is the MemHandle of a region containing src. The request is
// nil when the put completed in the call (locally: src may be reused).
func (ep *Endpoint) Put(src []byte, raddr uint64, rkey *RemoteKey, local *MemHandle) (*Request, error) {
	ep.w.mu.Lock()
	defer ep.w.mu.Unlock()
	h, rk, err := ep.remote("ucp_put_nbx", rkey)
	if err != nil {
		return nil, err
	}
	var memh C.ucp_mem_h
	if local != nil {
		memh = local.h
	}
	var p uintptr
	if len(src) > 0 {
		p = uintptr(unsafe.Pointer(&src[0]))
	}
	return ep.w.request("ucp_put_nbx", C.goep_put(h, C.uintptr_t(p), C.size_t(len(src)), C.uint64_t(raddr), rk, memh), nil)
}

// AtomicAdd starts adding v to the 64-bit word at the peer's address raddr
// (8-byte aligned, in a region whose key is rkey) without fetching it
// (ucp_atomic_op_nbx, UCP_ATOMIC_OP_ADD).
func (ep *Endpoint) AtomicAdd(v uint64, raddr uint64, rkey *RemoteKey) (*Request, error) {
	ep.w.mu.Lock()
	defer ep.w.mu.Unlock()
	h, rk, err := ep.remote("ucp_atomic_op_nbx", rkey)
	if err != nil {
		return nil, err
	}
	operand := (*C.uint64_t)(C.malloc(8))
	*operand = C.uint64_t(v)
	return ep.w.request("ucp_atomic_op_nbx", C.goep_atomic_add(h, operand, C.uint64_t(raddr), rk), unsafe.Pointer(operand))
}

// FlushNB starts a flush of the endpoint (ucp_ep_flush_nbx): the request
// completes when every operation issued on it before has completed at the
// peer.
func (ep *Endpoint) FlushNB() (*Request, error) {
	ep.w.mu.Lock()
	defer ep.w.mu.Unlock()
	h, err := ep.usable("ucp_ep_flush_nbx")
	if err != nil {
		return nil, err
	}
	return ep.w.request("ucp_ep_flush_nbx", C.goep_ep_flush(h), nil)
}

// Flush flushes the endpoint and waits, progressing the worker, until the
// flush completes, the endpoint fails or ctx ends.
func (ep *Endpoint) Flush(ctx context.Context) error {
	r, err := ep.FlushNB()
	if err != nil {
		return err
	}
	return r.Wait(ctx)
}

// Close destroys the endpoint's remote keys and closes it
// (ucp_ep_close_nbx): in flush mode, after every operation issued on it
// has completed, or with force when the endpoint has failed. It waits,
// progressing the worker, until ctx ends; then it force-closes. A second
// Close does nothing.
func (ep *Endpoint) Close(ctx context.Context) error {
	ep.w.mu.Lock()
	if ep.h == nil || ep.w.h == nil {
		ep.w.mu.Unlock()
		return nil
	}
	failed := *ep.slot != C.UCS_OK
	ep.w.mu.Unlock()
	if failed {
		return ep.CloseForce()
	}
	ep.w.mu.Lock()
	for k := range ep.rkeys {
		k.destroy()
	}
	r, err := ep.w.request("ucp_ep_close_nbx", C.goep_ep_close(ep.h, 0), nil)
	if err == nil {
		ep.w.mu.Unlock()
		err = r.Wait(ctx)
		if err != nil {
			r.Abandon()
		}
		ep.w.mu.Lock()
	}
	ep.release()
	ep.w.mu.Unlock()
	return err
}

// CloseForce destroys the endpoint's remote keys and closes it at once
// (UCP_EP_CLOSE_FLAG_FORCE: nothing is flushed and the peer is not
// contacted), progressing the worker until UCX has released it (bounded).
// For a failed endpoint, or after the caller has flushed and knows the
// peer is done with it. UCX refuses a forced close without peer error
// handling: an ErrorModeNone endpoint is closed in flush mode instead
// (bounded by the same wait). A second close does nothing.
func (ep *Endpoint) CloseForce() error {
	ep.w.mu.Lock()
	if ep.h == nil || ep.w.h == nil {
		ep.w.mu.Unlock()
		return nil
	}
	for k := range ep.rkeys {
		k.destroy()
	}
	op, force := "ucp_ep_close_nbx(force)", C.int(1)
	if ep.mode == ErrorModeNone {
		op, force = "ucp_ep_close_nbx", 0
	}
	r, err := ep.w.request(op, C.goep_ep_close(ep.h, force), nil)
	ep.w.mu.Unlock()
	if err == nil && r != nil {
		ctx, cancel := context.WithTimeout(context.Background(), forceCloseWait)
		err = r.Wait(ctx)
		cancel()
		if err != nil {
			r.Abandon()
		}
	}
	// A force close of a failed endpoint reports the failure again; it is
	// closed all the same.
	if IsPeerFailure(err) {
		err = nil
	}
	ep.w.mu.Lock()
	ep.release()
	ep.w.mu.Unlock()
	return err
}

// forceCloseWait bounds the wait for a force close, which needs no peer.
const forceCloseWait = 5 * time.Second

// release forgets the endpoint. Called with w.mu held.
func (ep *Endpoint) release() {
	ep.h = nil
	delete(ep.w.eps, ep)
	// The slot stays allocated: UCX may still call the error handler of an
	// endpoint whose close is pending. It is 4 bytes per endpoint.
}
