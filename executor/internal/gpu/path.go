//go:build cuda && cgo

package gpu

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/goep/goep/comm"
	"github.com/goep/goep/device"
	"github.com/goep/goep/executor/internal/datapath"
	"github.com/goep/goep/executor/internal/host"
	"github.com/goep/goep/executor/internal/plan"
	"github.com/goep/goep/nvlink"
	"github.com/goep/goep/permute"
)

//go:embed kernels/ep.ptx
var epPTX []byte

// Regions of the GPU windows.
const (
	regionFlags = iota // the domain's flags (nvlink.GPUFlags)
	regionRecv         // dispatch: rows [recvCap, H] at the call's row bytes, then weights [recvCap, K] fp32, then row flags [recvCap] uint64
	regionComb         // combine: rows [combRows, H], then weights [combRows, K] fp32, then row flags [combRows] uint64
	regionRoute        // layout: routing [R*MaxTokensPerRank*K] int32, then token counts [R] int32 (layout.go)
	numRegions
)

// Path is the CUDA data path (datapath.Path): see the package comment.
type Path struct {
	env *datapath.Env
	// ctl is the control plane on the host: the layout's routing exchange
	// where it runs on the host, and the rail with several domains;
	// ctlBackend its private host backend.
	ctl        *host.Control
	ctlBackend *device.Host
	b          *device.CUDA
	s          *device.CUDAStream
	mod        *device.Module
	pk         *permute.CUDAKernels
	win        *nvlink.GPUWindows
	flags      *nvlink.GPUFlags
	cross      crossing
	// one are the one-launch kernels of one domain (nil with several
	// domains, or under Options.MultiKernel).
	one *oneLaunch

	push, scatter, copyOut         *device.Kernel
	sum, permuteScaled, weightGrad [2]*device.Kernel // BF16, FP32

	// peers is uint64 [numRegions][R]: every rank's window base address
	// as mapped here.
	peers *device.Buffer

	// R is the ranks of the NVLink domain (all ranks, or D with several
	// domains; flags and windows are the domain's), me this rank's index
	// in it.
	R, me              int
	K, H, W            int
	recvCap, combRows  int
	recvWOff, combWOff int // byte offsets of the weights areas
	// recvFOff, combFOff are the byte offsets of the row flags: a row's
	// epoch and op, which the one-launch kernels' senders publish after
	// the row (kernels/onelaunch.cu).
	recvFOff, combFOff int
	dnan               uint32
	ownStream          bool // s was created here (not WithStream)
	// pending is an error found on the host for work that was skipped
	// (capacity exceeded under OverflowError); Synchronize returns it.
	pending error
	// marks is the scratch of permute.CUDAKernels.ZeroUnwritten in
	// capacity mode (a byte a permuted row), allocated with the engine so
	// that the capacity-mode calls allocate nothing (graph capture).
	marks *device.Buffer
}

// Options are the environment's choices for the path (package executor
// reads them): every rank of a world makes the same.
type Options struct {
	// SharedMemory: the rail between domains runs on shared memory
	// (GOEP_RDMA_SHARED_MEMORY).
	SharedMemory bool
	// HostStaging: the rail's rows are staged through host copies instead
	// of fed by the GPU (GOEP_RAIL_HOST_STAGING).
	HostStaging bool
	// MultiKernel: in one domain, Dispatch and Combine run as their
	// sequences of kernels (Begin, push or scatter, Arrive, copy-out or
	// sum, Finish) instead of one launch each (GOEP_GPU_MULTI_KERNEL; for
	// comparisons).
	MultiKernel bool
	// Probe: the one-launch kernels record each call's times in device
	// memory (Probe; GOEP_GPU_PROBE), a few atomics a row.
	Probe bool
	// LinkPace, in GB/s (0: none), paces the one-launch kernels' stores
	// into peers' windows to that rate per rank, and probes
	// (GOEP_GPU_LINK_PACE): ranks sharing one GPU then move their rows as
	// over a link of that rate, which HBM does not limit, so that a
	// single GPU measures how well a call keeps such a link busy.
	LinkPace float64
	// Share is how the domain's GPU windows are shared between ranks'
	// processes (GOEP_GPU_SHARE; nvlink.MapGPU): CUDA IPC (the default),
	// VMM allocations exported as file descriptors, or as fabric handles
	// (where any rank's driver refuses those, CUDA IPC, with the reason
	// logged).
	Share device.ShareKind
	// CrossHost, where not empty, says that the one domain spans hosts (an
	// NVLink fabric clique): the ranks share no host memory, so the control
	// plane has no exchange (host.NewStreamOnly), every call and the layout
	// run on the GPU's flags, and the windows are shared by fabric handles.
	CrossHost string
}

// crossing is how a GPU call crosses the ranks: within one domain
// (flat), or through the rail and then the domain (tiered). New picks
// one.
type crossing interface {
	// enqueue runs f, which enqueues a call's work on the stream.
	enqueue(f func() error) error
	// layout runs the layout of idx into h.
	layout(ctx context.Context, h *datapath.Handle, idx *device.Tensor, sig [4]uint64) error
	// tables builds and uploads the device tables of a host layout (a
	// Relayout's into old's memory).
	tables(ctx context.Context, h *datapath.Handle, lay *plan.Layout, routing [][]int32, old *tables) (*tables, error)
	// push enqueues the rows of x (weights w, fp8 scales sx) into the
	// destinations' receive windows, between the call's Begin and Arrive.
	push(h *datapath.Handle, x, w, sx *device.Tensor, round uint64, op datapath.Op) error
	// splitScales reports whether an fp8 call's scales take a round of
	// their own (roundScales) instead of moving with their rows.
	splitScales() bool
	// sum enqueues the rest of a combine once every rank's rows (and
	// weights, when weighted) are in the combine windows, and Finish.
	sum(h *datapath.Handle, dt device.DType, weighted bool, out datapath.CombineOut, op datapath.Op) error
	// abandoned tells the peers outside the domain that call op failed
	// here (the GPU flags have told the domain).
	abandoned(op datapath.Op, err error)
	// reject joins call op, whose input this rank rejected with cause.
	reject(op datapath.Op, cause error)
	close() error
}

// tables are a handle's layout tables in device memory (one Int32
// tensor, views into it). Entries e = t*W + c are the destinations of
// local token t in ascending order (c < its destination count).
type tables struct {
	all *device.Tensor
	// entDest, entRow: destination rank and row there of entry e (row -1:
	// no such entry, or dropped at the destination).
	entTok, entDest, entRow *device.Buffer // [T*W]
	// slotEnt: the entry of slot k of token t (t*K+k), -1 if none.
	slotEnt *device.Buffer // [T*K]
	// recvSrc, recvEnt: for received row i < rowCap, its source rank and
	// its entry on the source (-1 past the valid rows).
	recvSrc, recvEnt *device.Buffer // [rowCap]
	recvIdx, pos     *device.Buffer // [rowCap*K], -1 past the valid rows
	n                int            // valid received rows
	rail             *railTables    // several domains only
}

// Close frees the tables in stream order.
func (t *tables) Close() {
	if t != nil && t.all != nil {
		t.all.Close()
		t.rail.close()
	}
}

// tbl is the handle's tables.
func tbl(h *datapath.Handle) *tables {
	t, _ := h.Tables.(*tables)
	return t
}

// New creates a rank's GPU data path on b (collective over g): its
// control plane on a private host backend (the domain's control blocks,
// and the rail with several domains), then the kernels and the domain's
// GPU windows. caller, if not nil, is the stream the work runs on
// (executor.WithStream); opts are the environment's choices.
func New(ctx context.Context, g comm.Group, b *device.CUDA, env *datapath.Env, caller device.Stream, opts Options) (*Path, error) {
	cb := device.NewHost()
	var ctl *host.Control
	var err error
	if opts.CrossHost != "" {
		ctl, err = host.NewStreamOnly(cb, env, opts.CrossHost)
	} else {
		ctl, err = host.NewControl(ctx, g, cb, env, opts.SharedMemory)
	}
	if err != nil {
		return nil, errors.Join(err, cb.Close())
	}
	p, err := newPath(ctx, env, ctl, g, b, caller, opts)
	if err != nil {
		return nil, errors.Join(err, ctl.Close(), cb.Close())
	}
	p.ctlBackend = cb
	return p, nil
}

// newPath is New's GPU half, over the control plane ctl.
func newPath(ctx context.Context, env *datapath.Env, ctl *host.Control, g comm.Group, b *device.CUDA, caller device.Stream, opts Options) (*Path, error) {
	R, me, group := env.NumRanks, env.Rank, g
	if ctl.Rail != nil {
		R, me, group = ctl.Rail.D, ctl.Rail.Local, ctl.Rail.DomainGroup
	}
	p := &Path{env: env, ctl: ctl, b: b, R: R, me: me, K: env.P.TopK, H: env.Hidden, W: min(env.P.TopK, R),
		dnan: permute.DefaultNaN()}
	if R > 1024 {
		return nil, fmt.Errorf("executor: CUDA path: %d ranks in one domain, at most 1024: %w", R, datapath.ErrUnsupported)
	}
	s, _ := caller.(*device.CUDAStream)
	if caller != nil && (s == nil || s.CUDA() != b) {
		return nil, fmt.Errorf("executor: CUDA path: WithStream: a %T, not a stream of this CUDA backend: %w", caller, plan.ErrInvalidInput)
	}
	if s == nil {
		var err error
		if s, err = b.NewCUDAStream(); err != nil {
			return nil, fmt.Errorf("executor: CUDA path: %w", err)
		}
		p.ownStream = true
	}
	p.s = s
	P := env.P
	// The regions' geometry (plan.NewGPUWindows, which the sizing report
	// reads too). The layout runs on the GPU in one domain, when its
	// buffers stay within int32 offsets at the largest sizes (else on the
	// host, as with several domains; the same choice on every rank).
	w := plan.NewGPUWindows(P, env.NumRanks, p.H)
	p.recvCap, p.combRows = w.RecvRows, w.CombRows
	p.recvWOff, p.combWOff, p.recvFOff, p.combFOff = w.RecvWeightsOff, w.CombWeightsOff, w.RecvFlagsOff, w.CombFlagsOff
	gpuLayout := w.GPULayout
	if opts.CrossHost != "" && !gpuLayout {
		// executor.New chose such a domain only where it fits; a domain
		// size set by the caller may not.
		err := fmt.Errorf("executor: CUDA path: %s: a domain across hosts needs every call on the GPU, as the only domain, with the layout's buffers within int32 offsets (MaxTokensPerRank x TopK x ranks): %w",
			opts.CrossHost, datapath.ErrUnsupported)
		if p.ownStream {
			err = errors.Join(err, s.Close())
		}
		return nil, err
	}
	sizes := []int{nvlink.GPUFlagsSize(R), w.Recv, w.Comb, w.Route}
	var err error
	p.win, err = nvlink.MapGPU(ctx, group, s, sizes, opts.Share, opts.CrossHost != "")
	if err != nil {
		if p.ownStream {
			err = errors.Join(err, s.Close())
		}
		return nil, fmt.Errorf("executor: CUDA path: %w", err)
	}
	if p.win.Fallback != "" && me == 0 {
		env.Log.Warn("GPU windows: "+p.win.Fallback, zap.Stringer("asked", opts.Share), zap.Stringer("share", p.win.Share))
	}
	if ce := env.Log.Check(zap.DebugLevel, "GPU windows"); ce != nil {
		// Every region's address on every rank of the domain, as this rank
		// maps it (to read sanitizer reports against).
		addrs := make([][]string, numRegions)
		for i := range numRegions {
			for q := range R {
				addrs[i] = append(addrs[i], fmt.Sprintf("%#x", p.win.Peers[i][q].DevicePtr()))
			}
		}
		ce.Write(zap.Int("rank", env.Rank), zap.Int("local", me), zap.Stringer("share", p.win.Share), zap.Ints("bytes", sizes),
			zap.Any("flags", addrs[regionFlags]), zap.Any("recv", addrs[regionRecv]), zap.Any("comb", addrs[regionComb]),
			zap.Any("route", addrs[regionRoute]))
	}
	lerr := p.load(ctx)
	if lerr == nil {
		p.flags, lerr = nvlink.NewGPUFlags(ctx, s, p.win, regionFlags, env.Rank-me, env.Timeout)
	}
	if lerr == nil {
		// Pinned staging for every transfer (the layout's tables, with
		// several domains the rail's rows, the caller's uploads and
		// downloads), allocated now: a pinned allocation later could stall
		// a peer's wait kernel (device.CUDA.WarmStaging).
		lerr = b.WarmStaging()
	}
	if lerr == nil && P.Capacity {
		p.marks, lerr = p.s.Alloc(P.MaxPermutedTokens)
	}
	if lerr == nil {
		// The constructors free what they made when they fail: p.cross is
		// set on success only (a nil *tiered in the interface would be
		// closed below).
		if ctl.Rail != nil {
			var t *tiered
			if t, lerr = newTiered(ctx, p, opts.HostStaging); lerr == nil {
				p.cross = t
			}
		} else {
			var f *flat
			if f, lerr = newFlat(p, gpuLayout); lerr == nil {
				p.cross = f
			}
			if lerr == nil && !opts.MultiKernel && oneLaunchFits(P.MaxTokensPerRank, p.H, p.W, R, p.recvCap) {
				p.one, lerr = newOneLaunch(p, opts)
			}
		}
	}
	// Every rank learns whether every rank is ready, so none is left
	// waiting in its first call.
	if err := datapath.Agree(ctx, group, lerr); err != nil {
		return nil, errors.Join(fmt.Errorf("executor: CUDA path: %w", err), p.close())
	}
	return p, nil
}

// load loads the kernels and uploads the peers' window addresses.
func (p *Path) load(ctx context.Context) error {
	var err error
	if p.mod, err = p.b.LoadModule(epPTX); err != nil {
		return err
	}
	for _, k := range []struct {
		dst  **device.Kernel
		name string
	}{
		{&p.push, "goep_ep_push"}, {&p.scatter, "goep_ep_scatter"}, {&p.copyOut, "goep_ep_copy_out"},
		{&p.sum[0], "goep_ep_sum_bf16"}, {&p.sum[1], "goep_ep_sum_fp32"},
		{&p.permuteScaled[0], "goep_ep_permute_scaled_bf16"}, {&p.permuteScaled[1], "goep_ep_permute_scaled_fp32"},
		{&p.weightGrad[0], "goep_ep_weight_grad_bf16"}, {&p.weightGrad[1], "goep_ep_weight_grad_fp32"},
	} {
		if *k.dst, err = p.mod.Kernel(k.name); err != nil {
			return err
		}
	}
	if p.pk, err = permute.LoadCUDAKernels(p.b); err != nil {
		return err
	}
	addrs := make([]byte, 0, numRegions*p.R*8)
	for i := range numRegions {
		for q := range p.R {
			addrs = appendU64(addrs, p.win.Peers[i][q].DevicePtr())
		}
	}
	if p.peers, err = p.s.Alloc(len(addrs)); err != nil {
		return err
	}
	return p.s.UploadBuffer(ctx, p.peers, addrs)
}

func appendU64(b []byte, v uint64) []byte {
	for i := range 8 {
		b = append(b, byte(v>>(8*i)))
	}
	return b
}

// peerTable is the device array of region r's base addresses.
func (p *Path) peerTable(r int) *device.Buffer {
	v, _ := p.peers.View(r*p.R*8, p.R*8)
	return v
}

func (p *Path) ownView(r, off, n int) *device.Buffer {
	v, err := p.win.Own[r].View(off, n)
	if err != nil {
		panic(fmt.Sprintf("executor: window view [%d, +%d) of region %d: %v", off, n, r, err)) // sizes are checked by the callers
	}
	return v
}

// Stream is the GPU stream every call's work runs on.
func (p *Path) Stream() device.Stream { return p.s }

// Enqueue runs f, which allocates a call's outputs and enqueues its work
// (the crossing's enqueue).
func (p *Path) Enqueue(f func() error) error { return p.cross.enqueue(f) }

// Layout runs the layout of idx into h (the crossing's: on the GPU in one
// domain, else on the host). While the stream captures a CUDA graph, only
// a capacity-mode Relayout on the GPU layout is recorded (captureLayout).
func (p *Path) Layout(ctx context.Context, h *datapath.Handle, idx *device.Tensor, sig [4]uint64) error {
	if p.s.Capturing() {
		return p.captureLayout(h, idx)
	}
	return p.cross.layout(ctx, h, idx, sig)
}

// Reject joins call op, whose input this rank rejected: the peers fail it
// at once.
func (p *Path) Reject(op datapath.Op, cause error) { p.cross.reject(op, cause) }

// rejectCall is Reject from inside a call that failed before joining its
// collective: unless the engine takes no more calls (then there is no
// exchange to join). It returns cause.
func (p *Path) rejectCall(op datapath.Op, cause error) error {
	if p.env.Fate.Err() == nil {
		p.cross.reject(op, cause)
	}
	return cause
}

// rejectFlags joins a call on the domain's flags as rejected for cause
// (its peers relay the class and names of a timeout or a lost peer:
// GPUFlags.Reject), recording a failure to enqueue the signals for
// Synchronize.
func (p *Path) rejectFlags(cause error) {
	if err := p.flags.Reject(cause); err != nil && p.pending == nil {
		p.pending = err
	}
}

// abandon ends call op, which failed on this rank between its Begin and
// its Arrive (a launch refused, say): the domain's peers see the call
// rejected and fail it at once instead of at their timeout (they report
// this rank as having rejected its input; the cause is in this rank's
// error), the peers outside the domain hear of it through the crossing,
// and the epochs stay in step. It returns err with any error of the
// signals.
func (p *Path) abandon(op datapath.Op, err error) error {
	err = errors.Join(err, p.flags.Abandon(err))
	p.cross.abandoned(op, err)
	return err
}

// Hold keeps the stream busy for d (the lifetime tests).
func (p *Path) Hold(d time.Duration) error { return p.s.Delay(d) }

// Synchronize waits for the host tasks and the GPU work and reports what
// the waits found.
func (p *Path) Synchronize(ctx context.Context) error {
	if err := p.ctl.Stream.Synchronize(ctx); err != nil {
		return err
	}
	return p.synchronizeGPU(ctx)
}

// synchronizeGPU waits for the GPU work and reports what the waits found,
// then what the host found for work it skipped.
func (p *Path) synchronizeGPU(ctx context.Context) error {
	if err := p.s.Synchronize(ctx); err != nil {
		return err
	}
	// The GPU raised the alarm if a wait failed or a captured layout
	// wrote a report; else there is nothing to read back.
	var err error
	if p.flags.TakeAlarm() {
		if err := p.flags.Check(ctx); err != nil {
			p.flags.RaiseAlarm() // a captured layout's report waits for the next look
			return datapath.PeerInput(err)
		}
		if f, ok := p.cross.(*flat); ok {
			err = p.capturedReport(ctx, f.lk)
		}
	}
	err = errors.Join(err, p.pending)
	p.pending = nil
	return err
}

// Drain waits for the host tasks and the GPU work before Close.
func (p *Path) Drain(ctx context.Context) error {
	return errors.Join(p.ctl.Stream.Synchronize(ctx), p.s.Synchronize(ctx))
}

// Close frees the windows and kernels and the control plane; the engine
// has drained and passed a barrier (no peer uses the windows any more).
func (p *Path) Close() error {
	return errors.Join(p.close(), p.ctl.Close(), p.ctlBackend.Close())
}

// close frees what New made but the control plane.
func (p *Path) close() error {
	var errs []error
	if p.s != nil {
		errs = append(errs, p.s.Synchronize(context.Background()))
	}
	if p.peers != nil {
		p.s.Free(p.peers)
	}
	if p.marks != nil {
		p.s.Free(p.marks)
	}
	if p.cross != nil {
		errs = append(errs, p.cross.close())
	}
	errs = append(errs, p.one.close(p.s))
	errs = append(errs, p.flags.Close())
	if p.pk != nil {
		errs = append(errs, p.pk.Close())
	}
	if p.mod != nil {
		errs = append(errs, p.mod.Close())
	}
	if p.s != nil && p.ownStream {
		errs = append(errs, p.s.Close())
	}
	errs = append(errs, p.win.Close())
	return errors.Join(errs...)
}

// RailFed reports whether the GPU feeds the rail (several domains,
// GOEP_RAIL_HOST_STAGING unset; the tests).
func (p *Path) RailFed() bool {
	tr, ok := p.cross.(*tiered)
	return ok && tr.feed != nil
}
