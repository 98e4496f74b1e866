// Package ucx is goep's thin cgo binding to UCX's ucp layer (libucp), for
// the inter-domain transport of package rdma. It is compiled with the build
// tag ucx (and cgo; Debian: apt-get install libucx-dev); without the tag
// only the constructors and error types exist, and NewContext returns an
// error wrapping ErrNotCompiled that says to build with -tags ucx.
//
// # What it wraps
//
// A Context (ucp_init, features RMA and AMO64), its Workers (thread mode
// serialized: every call on a worker, its endpoints and its requests takes
// the worker's mutex, so any goroutine may use them), worker addresses,
// Endpoints created from a peer's address (ErrorModePeer: a peer whose
// process died or whose connection broke makes the endpoint report an
// error instead of hanging; UCX 1.13 then avoids shared-memory transports,
// which cannot detect it, so ErrorModeNone exists for them), memory mapping
// of a caller's region (ucp_mem_map of an address and length) or of memory
// UCX allocates (UCP_MEM_MAP_ALLOCATE: shared memory first, which peers on
// the host write with plain stores; RMA into other memory over shared
// memory is emulated with active messages), remote keys (pack, unpack,
// destroy), non-blocking put (ucp_put_nbx) and 64-bit atomic add
// (ucp_atomic_op_nbx, UCP_ATOMIC_OP_ADD), fence, flush (endpoint and
// worker, ucp_*_flush_nbx), progress (ucp_worker_progress) and request
// completion (ucp_request_check_status).
//
// # Errors
//
// Every ucs_status_t is checked and turned, by one function, into an
// *Error naming the UCX call, the status and its text (ucs_status_string).
// Waits (Request.Wait, Worker.Flush, Endpoint.Close) progress the worker
// until the request completes or the context ends.
//
// # Memory (DESIGN invariant 6)
//
// UCX reads and writes mapped regions asynchronously, long after the call
// that names them returns. Regions given to MemMap and the source buffers
// of Put must therefore be memory the Go garbage collector does not own
// (mmap, C.malloc): never a Go slice from make. The binding copies
// addresses and keys through C memory; no Go pointer is kept by UCX.
//
// # Usage
//
//	ctx, err := ucx.NewContext(ucx.ContextConfig{})   // wraps ErrNotCompiled without the tag
//	defer ctx.Close()
//	w, err := ctx.NewWorker()
//	defer w.Close()
//	addr, err := w.Address()                           // send to the peer
//	ep, err := w.Connect(peerAddr, ucx.ErrorModePeer)
//	mem, err := ctx.MemMap(region)                     // region from mmap
//	rkey, err := mem.PackRkey()                        // send to the peer
//	rk, err := ep.UnpackRkey(peerRkey)
//	req, err := ep.Put(src, peerBase+off, rk, mem)       // mem: src's region (or nil)
//	err = req.Wait(ctx)                                // or ep.Flush(ctx)
package ucx
