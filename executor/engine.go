package executor

import (
	"context"
	"errors"
	"fmt"
	"os"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/goep/goep/comm"
	"github.com/goep/goep/device"
	"github.com/goep/goep/executor/internal/datapath"
	"github.com/goep/goep/executor/internal/host"
	"github.com/goep/goep/executor/internal/plan"
	"github.com/goep/goep/nvlink"
)

// Engine is one rank's expert-parallel communication engine. All of an
// engine's calls (and its handles') must come from one goroutine at a
// time (a call made while another is in progress is refused with
// ErrConcurrentCall, except Handle.Close, which is then run as that call
// ends; NewTensor and the accessors are safe from any goroutine), and
// every rank of the group must make the same collective calls (Layout,
// Dispatch, Combine and the fused and backward variants) in the same
// order. Permute, Unpermute and their backward calls are local.
//
// Calls enqueue work on the engine's stream and return; outputs are ready
// after Synchronize (or device.Download). Errors found on the host (shapes,
// dtypes) are returned at once; errors found by the queued work (a peer's bad
// input, a timeout, capacity overflow) are returned by the next Synchronize.
type Engine struct {
	cfg   Config
	rank  int
	size  int
	local int // NumLocalExperts
	group comm.Group
	// path moves the bytes: the host backend's (package host) or the
	// GPU's (package gpu), chosen once by New. env is what it knows of
	// the engine; fate records a fatal failure, shared with it.
	path datapath.Path
	env  datapath.Env
	fate datapath.Fate
	log  *zap.Logger

	handles uint64 // layouts made, numbering handles
	closed  bool
	// callMu guards calling and pendingClose. calling is set while one
	// of the engine's calls (or its handles') runs (enter): a second call
	// at once, from another goroutine, is refused instead of racing on the
	// engine's state; a handle's Close then waits in pendingClose, and the
	// call in progress runs it as it ends (leave).
	callMu       sync.Mutex
	calling      bool
	pendingClose []*Handle
}

// enter marks a call of the engine (name, for the error) in progress, or
// refuses it with ErrConcurrentCall when another call is in progress: the
// engine's calls must come from one goroutine at a time. Every exported
// call of Engine and Handle that uses the engine's state enters (their
// internal uses of each other go through the unexported halves);
// NewTensor and the accessors of fixed values (Config, Rank, Stream,
// Handle.RecvRows, ...) do not, and are safe from any goroutine.
func (e *Engine) enter(name string) error {
	e.callMu.Lock()
	defer e.callMu.Unlock()
	if e.calling {
		return fmt.Errorf("executor: %s on rank %d while another call of this engine is in progress (from another goroutine; an engine's calls must come from one goroutine at a time): %w", name, e.rank, ErrConcurrentCall)
	}
	e.calling = true
	return nil
}

// leave ends the call that enter began, first closing the handles whose
// Close came meanwhile.
func (e *Engine) leave() {
	e.callMu.Lock()
	for len(e.pendingClose) > 0 {
		hs := e.pendingClose
		e.pendingClose = nil
		e.callMu.Unlock()
		for _, h := range hs {
			h.closeNow()
		}
		e.callMu.Lock()
	}
	e.calling = false
	e.callMu.Unlock()
}

// Option configures New.
type Option func(*options)

type options struct {
	log    *zap.Logger
	stream device.Stream
}

// WithStream runs the engine's GPU work on s (for instance a stream of the
// caller's framework wrapped with device.CUDA.WrapStream), in order with
// the caller's own work on it; by default the engine creates its stream.
// The engine never destroys s. CUDA backend only.
func WithStream(s device.Stream) Option { return func(o *options) { o.stream = s } }

// WithLogger sets the logger (default: no logging). The engine logs under
// the names "executor" and "executor.layout", never per token or per chunk.
func WithLogger(l *zap.Logger) Option { return func(o *options) { o.log = l } }

// setupTimeout is the least time New's setup (the domain, the rail, the
// GPU's windows and kernels, after the configs are compared) waits for the
// other ranks, whatever Config.Timeout says: a rank's first CUDA context
// and module loads, which JIT-compile goep's PTX when the driver's cache is
// cold, take seconds, so a Timeout sized for calls would fail New on a
// fresh machine. It also bounds the comparison of the configs (a rank that
// never calls New). A variable only so that tests can shorten it.
var setupTimeout = 30 * time.Second

// testHookSetup, when a test sets it, runs on every rank as New's setup
// starts (to make one rank's setup slow).
var testHookSetup func(rank int)

// New creates this rank's engine. It is collective over g: every rank must
// call it with an equal Config (compared field by field; a difference is
// ErrPeerMismatch on every rank, naming the field and the ranks).
func New(ctx context.Context, g comm.Group, b device.Backend, cfg Config, opts ...Option) (*Engine, error) {
	o := options{log: zap.NewNop()}
	for _, opt := range opts {
		opt(&o)
	}
	if g == nil || b == nil {
		return nil, fmt.Errorf("executor: new: nil group or backend: %w", ErrInvalidInput)
	}
	R := g.Size()
	cfg, cerr := cfg.withDefaults(R)
	// The collectives before the setup have a deadline too (DESIGN.md
	// invariant 4): the in-process and MPI groups wait only on ctx, so a
	// rank that never calls New would leave the others waiting for ever.
	// It cannot be Timeout alone: a rank with a cold JIT cache may reach
	// New seconds after the others.
	gctx, gcancel := context.WithTimeout(ctx, max(cfg.Timeout, setupTimeout))
	defer gcancel()
	// Every rank joins the detection's all-gather, whether it needs the
	// answer or not, so that the collectives below stay paired. A domain
	// is a host, or a multi-node NVLink fabric clique that spans hosts
	// where every rank's GPU is in one and shares memory by fabric handles.
	hostKey, fabric, fwhy := nvlink.HostKey(), "", "the host backend shares memory within one host"
	if cb, ok := b.(*device.CUDA); ok {
		fabric, fwhy = fabricKey(cb)
	}
	if testHookDomainKeys != nil {
		hostKey, fabric, fwhy = testHookDomainKeys(g.Rank(), hostKey, fabric, fwhy)
	}
	detected, choice, derr := nvlink.DetectDomains(gctx, g, hostKey, fabric, fwhy)
	if derr != nil && !errors.Is(derr, nvlink.ErrTopology) {
		return nil, fmt.Errorf("executor: new: %w", derr)
	}
	if choice.Fabric && cerr == nil && cfg.RanksPerDomain == 0 {
		// The same answer on every rank: the choice and cfg are.
		if why := fabricDomainUnfit(cfg, R, detected, derr); why != "" {
			choice = choice.PerHost(why)
			detected, derr = nvlink.RanksPerDomain(choice.Keys)
		}
	}
	if cerr == nil && cfg.RanksPerDomain == 0 {
		cfg.RanksPerDomain, cerr = detected, derr
	}
	crossHost := ""
	if cerr == nil {
		crossHost, cerr = domainAcrossHosts(choice, cfg.RanksPerDomain, b.Kind())
	}
	shm, serr := boolEnv("GOEP_RDMA_SHARED_MEMORY")
	if cerr == nil {
		cerr = serr
	}
	staging, terr := boolEnv("GOEP_RAIL_HOST_STAGING")
	if cerr == nil {
		cerr = terr
	}
	multiKernel, merr := boolEnv("GOEP_GPU_MULTI_KERNEL")
	if cerr == nil {
		cerr = merr
	}
	probe, perr := boolEnv("GOEP_GPU_PROBE")
	if cerr == nil {
		cerr = perr
	}
	pace, aerr := paceEnv("GOEP_GPU_LINK_PACE")
	if cerr == nil {
		cerr = aerr
	}
	share, herr := shareEnv("GOEP_GPU_SHARE")
	if cerr == nil {
		cerr = herr
	}
	if cerr == nil {
		cerr = cfg.ValidateFor(R)
	}
	// Compare configs before acting on local errors, so that a rank with a
	// bad config does not leave the others waiting.
	desc := describe(cfg, cerr)
	all, err := g.AllGather(gctx, []byte(desc))
	if err != nil {
		return nil, fmt.Errorf("executor: new: exchange configs: %w", err)
	}
	if cerr != nil {
		return nil, fmt.Errorf("%w: %w", cerr, ErrInvalidInput)
	}
	for r, d := range all {
		if string(d) != desc {
			// A peer whose own config is invalid: its reason, not every
			// field of this rank's config beside it.
			if why, ok := strings.CutPrefix(string(d), invalidConfig); ok {
				return nil, fmt.Errorf("executor: new: rank %d's config is invalid (%s): %w", r, why, ErrPeerMismatch)
			}
			return nil, fmt.Errorf("executor: new: config of rank %d differs from rank %d's: %s: %w",
				r, g.Rank(), diffDescriptions(desc, string(d)), ErrPeerMismatch)
		}
	}
	e := &Engine{cfg: cfg, rank: g.Rank(), size: R, local: cfg.NumExperts / R, group: g, log: o.log.Named("executor")}
	if e.rank == 0 {
		e.log.Info("NVLink domains", zap.Int("ranks_per_domain", cfg.RanksPerDomain), zap.String("detected", choice.Why),
			zap.String("across_hosts", crossHost))
	}
	e.env = datapath.Env{
		P: cfg.params(), Rank: e.rank, NumRanks: R, Hidden: cfg.Hidden, Drop: cfg.Overflow == OverflowDrop,
		Timeout: cfg.Timeout, SMs: cfg.SMs, ChunkRows: cfg.ChunkRows,
		Alloc: e.NewTensor, Fate: &e.fate, Log: e.log,
	}
	if testHookSetup != nil {
		testHookSetup(g.Rank())
	}
	dctx, cancel := context.WithTimeout(ctx, max(cfg.Timeout, setupTimeout))
	defer cancel()
	switch b.Kind() {
	case device.KindHost:
		hb, ok := b.(*device.Host)
		if !ok {
			return nil, fmt.Errorf("executor: new: host backend of type %T: %w", b, ErrUnsupported)
		}
		e.path, err = host.New(dctx, g, hb, &e.env, shm)
	case device.KindCUDA:
		cb, ok := b.(*device.CUDA)
		if !ok {
			return nil, fmt.Errorf("executor: new: CUDA backend of type %T: %w", b, ErrUnsupported)
		}
		e.path, err = newGPUPath(dctx, g, cb, &e.env, o.stream, gpuOptions{SharedMemory: shm, HostStaging: staging, MultiKernel: multiKernel,
			Probe: probe, LinkPace: pace, Share: share, CrossHost: crossHost})
	default:
		return nil, fmt.Errorf("executor: new: %s backend: %w", b.Kind(), ErrUnsupported)
	}
	if err != nil {
		return nil, fmt.Errorf("executor: new: %w", err)
	}
	e.log.Debug("engine ready", zap.Int("rank", e.rank), zap.Int("ranks", R), zap.Any("config", cfg))
	return e, nil
}

// invalidConfig starts the description of a config that failed its checks.
const invalidConfig = "invalid config: "

// describe renders a config as "Field=value" pairs (or the local error) for
// the cross-rank comparison.
func describe(c Config, err error) string {
	if err != nil {
		return invalidConfig + err.Error()
	}
	v := reflect.ValueOf(c)
	parts := make([]string, v.NumField())
	for i := range parts {
		parts[i] = fmt.Sprintf("%s=%v", v.Type().Field(i).Name, v.Field(i).Interface())
	}
	return strings.Join(parts, " ")
}

func diffDescriptions(a, b string) string {
	fa, fb := strings.Fields(a), strings.Fields(b)
	if len(fa) != len(fb) {
		return fmt.Sprintf("%q vs %q", a, b)
	}
	var diffs []string
	for i := range fa {
		if fa[i] != fb[i] {
			diffs = append(diffs, fmt.Sprintf("%s vs %s", fb[i], fa[i]))
		}
	}
	return strings.Join(diffs, ", ")
}

// Config returns the engine's config with defaults filled in.
func (e *Engine) Config() Config { return e.cfg }

// Rank is this engine's rank; NumRanks the group size.
func (e *Engine) Rank() int { return e.rank }

// NumRanks is R.
func (e *Engine) NumRanks() int { return e.size }

// NumLocalExperts is L = NumExperts / NumRanks.
func (e *Engine) NumLocalExperts() int { return e.local }

// Stream is the engine's stream; all its work runs there in order.
func (e *Engine) Stream() device.Stream { return e.path.Stream() }

// NewTensor allocates an uninitialised tensor on the engine's stream.
func (e *Engine) NewTensor(dt device.DType, shape ...int) (*device.Tensor, error) {
	if testHookAlloc != nil {
		if err := testHookAlloc(e.rank); err != nil {
			return nil, err
		}
	}
	return device.NewTensor(e.path.Stream(), dt, shape...)
}

// testHookAlloc, when a test sets it, runs before every NewTensor of the
// engines; an error fails the allocation (out of memory on one rank).
var testHookAlloc func(rank int) error

// Synchronize waits for all queued work and returns its first error. A
// timeout fails the engine for good.
func (e *Engine) Synchronize(ctx context.Context) error {
	if err := e.enter("synchronize"); err != nil {
		return err
	}
	defer e.leave()
	return e.synchronize(ctx)
}

// synchronize is Synchronize, inside enter.
func (e *Engine) synchronize(ctx context.Context) error {
	if e.closed {
		return ErrClosed
	}
	return e.fate.Note(e.path.Synchronize(ctx))
}

// usable reports why the engine cannot take a call.
func (e *Engine) usable() error {
	if e.closed {
		return ErrClosed
	}
	if err := e.fate.Err(); err != nil {
		return fmt.Errorf("%w: %w", ErrFailed, err)
	}
	return nil
}

// reject makes this rank join the exchanges of collective call op, whose
// input it rejected with cause, publishing the reason, so that every peer
// fails the call at once instead of waiting for this rank. The error is
// returned to the caller directly, so the joined work reports nothing.
func (e *Engine) reject(op datapath.Op, cause error) error {
	if e.usable() != nil {
		return cause // the engine takes no calls; there is no exchange to join
	}
	e.path.Reject(op, cause)
	return cause
}

// Close waits for queued work, leaves the domain and frees the engine's
// memory. After a failure it still frees everything. Handles and outputs
// the caller still holds stay valid to Close.
func (e *Engine) Close() error {
	if err := e.enter("close"); err != nil {
		return err
	}
	defer e.leave()
	if e.closed {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), e.cfg.Timeout)
	defer cancel()
	var errs []error
	if err := e.path.Drain(ctx); err != nil && e.fate.Err() == nil && !datapath.Fatal(err) {
		errs = append(errs, err)
	}
	// Peers may still be in their last exchange with this rank's control
	// block, or store into its windows; wait for them unless the group is
	// already broken.
	if e.fate.Err() == nil {
		bctx, bcancel := context.WithTimeout(context.Background(), min(e.cfg.Timeout, 10*time.Second))
		if err := e.group.Barrier(bctx); err != nil {
			errs = append(errs, fmt.Errorf("executor: close: %w", err))
		}
		bcancel()
	}
	// Peers have passed the barrier (or the group is broken): no one uses
	// this rank's memory any more. After a failure everything is freed
	// all the same.
	if err := e.path.Close(); err != nil && e.fate.Err() == nil {
		errs = append(errs, err)
	}
	e.closed = true
	return errors.Join(errs...)
}

// boolEnv reads a boolean GOEP_* variable (unset: false).
// paceEnv is the link rate in GB/s that GOEP_GPU_LINK_PACE names (0 when
// unset): a positive number.
func paceEnv(name string) (float64, error) {
	v, ok := os.LookupEnv(name)
	if !ok || v == "" {
		return 0, nil
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || !(f > 0) || f > 1e6 {
		return 0, fmt.Errorf("executor: %s=%q: want a link rate in GB/s, a number above 0", name, v)
	}
	return f, nil
}

// testHookDomainKeys, when a test sets it, replaces a rank's host key,
// fabric key and reason before the domains are detected (to emulate the
// hosts of an NVLink fabric on one machine).
var testHookDomainKeys func(rank int, host, fabric, why string) (string, string, string)

// fabricDomainUnfit says why the fabric cliques' split into domains
// (detected, derr) cannot run here, or "": a domain across hosts has no
// host exchange, so it must be the only domain and run its layout on the
// GPU (int32 offsets at the configured sizes).
func fabricDomainUnfit(cfg Config, R, detected int, derr error) string {
	switch {
	case derr != nil:
		return fmt.Sprintf("the cliques do not split the ranks into equal consecutive domains (%v)", derr)
	case detected != R:
		return fmt.Sprintf("the cliques make %d domains, and a domain across hosts must be the only one", R/detected)
	case !plan.HaveLayoutDims:
		return "a domain across hosts runs its layout on the GPU, which a build without cgo has not"
	}
	cfg.RanksPerDomain = R
	if !plan.NewGPUWindows(cfg.params(), R, cfg.Hidden).GPULayout {
		return "a domain across hosts runs its layout on the GPU, whose buffers would pass int32 offsets at this MaxTokensPerRank x TopK x ranks"
	}
	return ""
}

// domainAcrossHosts checks a split into domains of D ranks against the
// ranks' hosts (choice.Hosts): a domain that holds ranks of several hosts
// needs the CUDA backend and every rank in a fabric clique whose memory it
// can share (choice.Fabric). It returns the description of the first such
// domain ("" where every domain is within a host).
func domainAcrossHosts(choice nvlink.DomainChoice, D int, kind device.Kind) (string, error) {
	spans, why := choice.SpansHosts(D)
	switch {
	case !spans:
		return "", nil
	case kind != device.KindCUDA:
		return "", fmt.Errorf("executor: new: %s, but the %s backend's domains lie within one host (set GOEP_RANKS_PER_DOMAIN to the ranks of a host)", why, kind)
	case !choice.Fabric:
		return "", fmt.Errorf("executor: new: %s, and those ranks cannot share GPU memory across hosts: %s (set GOEP_RANKS_PER_DOMAIN to the ranks of a host)", why, choice.Why)
	}
	return why, nil
}

// shareEnv reads how GPU windows are shared (device.ParseShareKind; unset
// or empty: CUDA IPC).
func shareEnv(name string) (device.ShareKind, error) {
	v, ok := os.LookupEnv(name)
	if !ok || v == "" {
		return device.ShareIPC, nil
	}
	k, err := device.ParseShareKind(v)
	if err != nil {
		return 0, fmt.Errorf("executor: %s=%q: want ipc, fd or fabric", name, v)
	}
	return k, nil
}

func boolEnv(name string) (bool, error) {
	v, ok := os.LookupEnv(name)
	if !ok || v == "" {
		return false, nil
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		return false, fmt.Errorf("executor: %s=%q: want a boolean (1, 0, true, false)", name, v)
	}
	return b, nil
}
