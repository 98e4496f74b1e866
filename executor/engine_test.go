package executor

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/goep/goep/comm"
	"github.com/goep/goep/device"
	"github.com/goep/goep/executor/internal/plan"
	"github.com/goep/goep/internal/ranktest"
	"github.com/goep/goep/nvlink"
)

// runRanks creates an in-process world of R engines on one host backend and
// runs fn on every rank concurrently. It closes the engines and checks that
// every buffer was freed.
func runRanks(t *testing.T, R int, cfg Config, fn func(ctx context.Context, e *Engine) error) []error {
	t.Helper()
	gs := comm.NewLocal(R)
	b := device.NewHost()
	defer b.Close()
	errs := ranktest.Run(R, func(r int) error {
		ctx := t.Context()
		e, err := New(ctx, gs[r], b, cfg)
		if err != nil {
			return err
		}
		err = fn(ctx, e)
		if cerr := e.Close(); cerr != nil && err == nil {
			err = cerr
		}
		return err
	})
	// Tensors the test dropped are freed by their finalizers, which run
	// on their own goroutine after a collection: wait for them, however
	// long a loaded machine takes, up to a bound no healthy run nears.
	deadline := time.Now().Add(time.Minute)
	for b.LiveBuffers() != 0 && time.Now().Before(deadline) {
		runtime.GC()
		time.Sleep(time.Millisecond)
	}
	if n := b.LiveBuffers(); n != 0 {
		t.Errorf("%d buffers still live a minute after every engine closed", n)
	}
	return errs
}

// randomRouting returns T*K expert ids for one rank: each token picks
// between 0 and K distinct experts, the rest of its slots -1.
func randomRouting(rng *rand.Rand, T, K, E int) []int32 {
	idx := make([]int32, T*K)
	for t := range T {
		perm := rng.Perm(E)
		n := rng.IntN(K + 1)
		for k := range K {
			idx[t*K+k] = -1
			if k < n {
				idx[t*K+k] = int32(perm[k])
			}
		}
		rng.Shuffle(K, func(i, j int) { idx[t*K+i], idx[t*K+j] = idx[t*K+j], idx[t*K+i] })
	}
	return idx
}

func upload(ctx context.Context, e *Engine, dt device.DType, data []byte, shape ...int) (*device.Tensor, error) {
	t, err := e.NewTensor(dt, shape...)
	if err != nil {
		return nil, err
	}
	return t, device.Upload(ctx, t, data)
}

// zeros is a new tensor of zeros; the bad-input tests make many and stop
// at the first that cannot be allocated.
func zeros(e *Engine, dt device.DType, shape ...int) *device.Tensor {
	t, err := e.NewTensor(dt, shape...)
	if err != nil {
		panic(err)
	}
	clear(t.Bytes())
	return t
}

// uploadInputs uploads a rank's routing idx, rows x (dtype dt) and
// weights w of T tokens to new tensors.
func uploadInputs(ctx context.Context, e *Engine, idx []int32, x []byte, w []float32, T int, dt device.DType) (ti, xt, wt *device.Tensor, err error) {
	K, H := e.cfg.TopK, e.cfg.Hidden
	if ti, err = upload(ctx, e, device.Int32, device.EncodeInt32(idx), T, K); err != nil {
		return nil, nil, nil, err
	}
	if xt, err = upload(ctx, e, dt, x, T, H); err != nil {
		return nil, nil, nil, err
	}
	if wt, err = upload(ctx, e, device.FP32, device.EncodeFloat32(device.FP32, w), T, K); err != nil {
		return nil, nil, nil, err
	}
	return ti, xt, wt, nil
}

// rankInputs builds rank r's routing, tokens and weights deterministically.
func rankInputs(seed uint64, r, T, K, E, H int, dt device.DType) (idx []int32, x []byte, w []float32) {
	return randomInputs(rand.New(rand.NewPCG(seed, uint64(r))), T, K, E, H, dt)
}

// randomInputs draws T tokens' routing (randomRouting), rows of H normal
// values in dtype dt and K weights in [0, 1) each.
func randomInputs(rng *rand.Rand, T, K, E, H int, dt device.DType) (idx []int32, x []byte, w []float32) {
	idx = randomRouting(rng, T, K, E)
	xs := make([]float32, T*H)
	for i := range xs {
		xs[i] = float32(rng.NormFloat64())
	}
	w = make([]float32, T*K)
	for i := range w {
		w[i] = rng.Float32()
	}
	return idx, device.EncodeFloat32(dt, xs), w
}

// pipeline runs layout, dispatch-permute (weighted), unpermute-combine and
// returns the combined output bytes.
func pipeline(ctx context.Context, e *Engine, idx []int32, x []byte, w []float32, T int, dt device.DType, poison bool) ([]byte, error) {
	ti, xt, wt, err := uploadInputs(ctx, e, idx, x, w, T, dt)
	if err != nil {
		return nil, err
	}
	h, err := e.Layout(ctx, LayoutInput{TopkIdx: ti})
	if err != nil {
		return nil, err
	}
	if poison {
		// Hold the stream so that everything below is still queued while
		// its inputs are dropped and their memory is scribbled over.
		e.Stream().(*device.HostStream).Go("slow", func() error { time.Sleep(300 * time.Millisecond); return nil })
	}
	dp, err := e.DispatchPermute(ctx, h, DispatchInput{X: xt, TopkWeights: wt})
	if err != nil {
		return nil, err
	}
	y, err := e.Unpermute(ctx, h, UnpermuteInput{Y: dp.X, RecvWeights: dp.RecvWeights})
	if err != nil {
		return nil, err
	}
	out, err := e.Combine(ctx, h, CombineInput{Z: y})
	if err != nil {
		return nil, err
	}
	if poison {
		// Drop everything but out: explicitly for some, by garbage
		// collection alone for the rest.
		h.Close()
		ti.Close()
		xt.Close()
		dp.Close()
		wt, y = nil, nil
		for range 3 {
			runtime.GC()
		}
		// Fresh allocations of the same sizes now come from the pool; if
		// any of the dropped buffers had gone back early, this scribbling
		// would land under the queued work.
		var junk []*device.Tensor
		for _, rows := range []int{T, T * 4, T * 8} {
			for _, d := range []device.DType{dt, device.FP32, device.Int32} {
				j, err := e.NewTensor(d, rows, e.cfg.Hidden)
				if err != nil {
					return nil, err
				}
				for i := range j.Bytes() {
					j.Bytes()[i] = 0xFF
				}
				junk = append(junk, j)
			}
		}
		defer closeAll(junk...)
	}
	return device.Download(ctx, out)
}

// TestPoisonLifetimes is DESIGN.md invariant 2: dropping handles, inputs
// and intermediate outputs while their work is queued never hands their
// memory to anyone else before that work completes.
func TestPoisonLifetimes(t *testing.T) {
	const R, E, K, H, T = 3, 12, 3, 64, 40
	for _, dt := range []device.DType{device.BF16, device.FP32} {
		t.Run(dt.String(), func(t *testing.T) {
			cfg := Config{NumExperts: E, TopK: K, Hidden: H, MaxTokensPerRank: T, PadMultiple: 4}
			want := make([][]byte, R)
			got := make([][]byte, R)
			errs := runRanks(t, R, cfg, func(ctx context.Context, e *Engine) error {
				idx, x, w := rankInputs(7, e.Rank(), T, K, E, H, dt)
				var err error
				if want[e.Rank()], err = pipeline(ctx, e, idx, x, w, T, dt, false); err != nil {
					return err
				}
				got[e.Rank()], err = pipeline(ctx, e, idx, x, w, T, dt, true)
				return err
			})
			for r := range R {
				if errs[r] != nil {
					t.Fatalf("rank %d: %v", r, errs[r])
				}
				if !bytes.Equal(got[r], want[r]) {
					t.Errorf("rank %d: result after dropping and scribbling differs from the clean run", r)
				}
			}
		})
	}
}

// TestTimeoutNamesMissingRank is DESIGN.md invariant 4.
func TestTimeoutNamesMissingRank(t *testing.T) {
	const R, E, K, H, T = 3, 6, 2, 16, 8
	timeout := 300 * time.Millisecond
	cfg := Config{NumExperts: E, TopK: K, Hidden: H, MaxTokensPerRank: T, Timeout: timeout}
	release := make(chan struct{})
	var once sync.Once
	var finished sync.WaitGroup
	finished.Add(R - 1)
	errs := runRanks(t, R, cfg, func(ctx context.Context, e *Engine) error {
		if e.Rank() == R-1 { // the rank that never joins
			<-release
			return nil
		}
		defer finished.Done()
		defer func() { go func() { finished.Wait(); once.Do(func() { close(release) }) }() }()
		idx, _, _ := rankInputs(1, e.Rank(), T, K, E, H, device.BF16)
		ti, err := upload(ctx, e, device.Int32, device.EncodeInt32(idx), T, K)
		if err != nil {
			return err
		}
		// The call returns at its deadline; the bound below only catches a
		// wait that ignores it, with room for a loaded machine.
		start := time.Now()
		_, err = e.Layout(ctx, LayoutInput{TopkIdx: ti})
		if el := time.Since(start); el > timeout+30*time.Second {
			return fmt.Errorf("layout returned after %v, deadline %v", el, timeout)
		}
		var te *comm.TimeoutError
		if !errors.Is(err, ErrTimeout) || !errors.As(err, &te) || len(te.Missing) != 1 || te.Missing[0] != R-1 {
			return fmt.Errorf("layout error %v: want ErrTimeout naming rank %d", err, R-1)
		}
		// The engine now fails fast: ErrFailed comes from the host-side
		// check, before anything is queued or awaited.
		if _, err := e.Layout(ctx, LayoutInput{TopkIdx: ti}); !errors.Is(err, ErrFailed) || !errors.Is(err, ErrTimeout) {
			return fmt.Errorf("second layout: %v: want ErrFailed wrapping the timeout", err)
		}
		return nil
	})
	for r := range R - 1 {
		if errs[r] != nil {
			t.Errorf("rank %d: %v", r, errs[r])
		}
	}
	// The absent rank's Close finds its peers gone; it may report that,
	// but it must return (runRanks has also checked that all memory was
	// freed).
}

func TestConfigMismatch(t *testing.T) {
	errs := newEach(t, 2, func(r int) Config {
		cfg := Config{NumExperts: 4, TopK: 2, Hidden: 8, MaxTokensPerRank: 4}
		if r == 1 {
			cfg.Hidden = 16
		}
		return cfg
	})
	for r, err := range errs {
		if !errors.Is(err, ErrPeerMismatch) || !strings.Contains(err.Error(), "Hidden=") {
			t.Errorf("rank %d: %v, want ErrPeerMismatch naming Hidden", r, err)
		}
	}
}

// newEach runs New on n in-process ranks of the host backend, rank r with
// cfgOf(r), closes the engines that were created and returns New's errors.
func newEach(t *testing.T, n int, cfgOf func(r int) Config) []error {
	gs := comm.NewLocal(n)
	b := device.NewHost()
	defer b.Close()
	var g errgroup.Group
	errs := make([]error, n)
	for r := range n {
		g.Go(func() error {
			e, err := New(t.Context(), gs[r], b, cfgOf(r))
			if err == nil {
				e.Close()
			}
			errs[r] = err
			return nil
		})
	}
	g.Wait()
	return errs
}

// TestDetectedDomain: with RanksPerDomain 0 and GOEP_RANKS_PER_DOMAIN unset,
// New makes the ranks of one host one domain: here, all of them.
func TestDetectedDomain(t *testing.T) {
	if _, set := os.LookupEnv("GOEP_RANKS_PER_DOMAIN"); set {
		t.Skip("GOEP_RANKS_PER_DOMAIN is set")
	}
	wantRanksPerDomain(t, 4, Config{NumExperts: 4, TopK: 1, Hidden: 4, MaxTokensPerRank: 1}, 4, "one host")
}

// wantRanksPerDomain checks that New, on R in-process ranks with cfg,
// makes domains of want ranks on every rank (what: the case, for the
// message).
func wantRanksPerDomain(t *testing.T, R int, cfg Config, want int, what string) {
	t.Helper()
	errs := runRanks(t, R, cfg, func(ctx context.Context, e *Engine) error {
		if d := e.Config().RanksPerDomain; d != want {
			return fmt.Errorf("RanksPerDomain %d, want %d", d, want)
		}
		return nil
	})
	for r, err := range errs {
		if err != nil {
			t.Errorf("%s, rank %d: %v", what, r, err)
		}
	}
}

// TestBadRailEnv: an invalid GOEP_RDMA_SHARED_MEMORY,
// GOEP_RAIL_HOST_STAGING, GOEP_GPU_MULTI_KERNEL, GOEP_GPU_PROBE,
// GOEP_GPU_LINK_PACE or GOEP_GPU_SHARE is an error of New on every rank,
// before any collective work.
func TestBadRailEnv(t *testing.T) {
	for _, c := range []struct{ name, value string }{
		{"GOEP_RDMA_SHARED_MEMORY", "maybe"}, {"GOEP_RAIL_HOST_STAGING", "maybe"},
		{"GOEP_GPU_MULTI_KERNEL", "maybe"}, {"GOEP_GPU_PROBE", "maybe"},
		{"GOEP_GPU_LINK_PACE", "fast"}, {"GOEP_GPU_LINK_PACE", "0"}, {"GOEP_GPU_LINK_PACE", "-50"}, {"GOEP_GPU_LINK_PACE", "NaN"},
		{"GOEP_GPU_SHARE", "nvlink"}, {"GOEP_GPU_SHARE", "IPC"},
	} {
		name := c.name
		t.Run(name+"="+c.value, func(t *testing.T) {
			t.Setenv(name, c.value)
			errs := runRanks(t, 4, Config{NumExperts: 4, TopK: 1, Hidden: 4, MaxTokensPerRank: 1, RanksPerDomain: 2}, func(ctx context.Context, e *Engine) error { return nil })
			for r, err := range errs {
				if !errors.Is(err, ErrInvalidInput) || !strings.Contains(err.Error(), name) {
					t.Errorf("rank %d: %v, want ErrInvalidInput naming %s", r, err, name)
				}
			}
		})
	}
}

// TestBadTuningKnobs: negative SMs or ChunkRows fail New on every rank
// with ErrInvalidInput naming the field; ranks whose knobs differ fail with
// ErrPeerMismatch naming it.
func TestBadTuningKnobs(t *testing.T) {
	base := Config{NumExperts: 4, TopK: 1, Hidden: 4, MaxTokensPerRank: 1}
	for _, c := range []struct {
		name string
		set  func(*Config)
	}{
		{"SMs", func(c *Config) { c.SMs = -1 }},
		{"ChunkRows", func(c *Config) { c.ChunkRows = -2 }},
	} {
		cfg := base
		c.set(&cfg)
		errs := runRanks(t, 2, cfg, func(ctx context.Context, e *Engine) error { return nil })
		for r, err := range errs {
			if !errors.Is(err, ErrInvalidInput) || !strings.Contains(err.Error(), c.name+" is") {
				t.Errorf("%s: rank %d: %v, want ErrInvalidInput naming %s", c.name, r, err, c.name)
			}
		}
	}
	errs := newEach(t, 2, func(r int) Config {
		cfg := base
		cfg.ChunkRows = 4 * r
		return cfg
	})
	for r, err := range errs {
		if !errors.Is(err, ErrPeerMismatch) || !strings.Contains(err.Error(), "ChunkRows=") {
			t.Errorf("rank %d: %v, want ErrPeerMismatch naming ChunkRows", r, err)
		}
	}
}

// TestSlowSetup: a rank whose setup (after the configs are compared) takes
// longer than Config.Timeout, as a GPU's first module loads do on a cold
// JIT cache, is waited for: New succeeds on every rank, and the engines
// work.
func TestSlowSetup(t *testing.T) {
	const R, E, K, H, T = 4, 8, 2, 16, 4
	// The calls' Timeout is a second, long enough for a loaded machine's
	// scheduling; rank 1's setup takes three.
	const timeout = time.Second
	testHookSetup = func(rank int) {
		if rank == 1 {
			time.Sleep(3 * timeout)
		}
	}
	defer func() { testHookSetup = nil }()
	for _, d := range []int{R, 2} { // one domain; two, with the rail
		t.Run(fmt.Sprintf("D=%d", d), func(t *testing.T) {
			cfg := Config{NumExperts: E, TopK: K, Hidden: H, MaxTokensPerRank: T, RanksPerDomain: d, Timeout: timeout}
			errs := runRanks(t, R, cfg, func(ctx context.Context, e *Engine) error {
				idx, _, _ := rankInputs(1, e.Rank(), T, K, E, H, device.BF16)
				ti, err := upload(ctx, e, device.Int32, device.EncodeInt32(idx), T, K)
				if err != nil {
					return err
				}
				_, err = e.Layout(ctx, LayoutInput{TopkIdx: ti})
				return err
			})
			for r, err := range errs {
				if err != nil {
					t.Errorf("rank %d: %v", r, err)
				}
			}
		})
	}
}

// TestAllocFailure: a collective call whose outputs cannot be allocated on
// one rank (out of memory there) fails on every rank at once with that
// rank's cause rather than a timeout, and every engine works again after:
// for Dispatch, Combine, DispatchPermute and UnpermuteCombine, in one
// domain and with two (the cause then crosses the rail too).
func TestAllocFailure(t *testing.T) {
	const K, H, T = 2, 16, 8
	errOOM := errors.New("injected: out of memory")
	var failNext atomic.Bool // set and consumed by rank 1 only
	testHookAlloc = func(rank int) error {
		if rank == 1 && failNext.CompareAndSwap(true, false) {
			return errOOM
		}
		return nil
	}
	defer func() { testHookAlloc = nil }()
	for _, w := range []struct{ R, D int }{{3, 3}, {4, 2}} {
		t.Run(fmt.Sprintf("R=%d,D=%d", w.R, w.D), func(t *testing.T) {
			E := 2 * w.R
			cfg := Config{NumExperts: E, TopK: K, Hidden: H, MaxTokensPerRank: T, RanksPerDomain: w.D, Timeout: 5 * time.Second}
			errs := runRanks(t, w.R, cfg, func(ctx context.Context, e *Engine) error {
				return allocFailureSteps(ctx, e, &failNext, errOOM, E, K, H, T)
			})
			for r, err := range errs {
				if err != nil {
					t.Errorf("rank %d: %v", r, err)
				}
			}
		})
	}
}

// allocFailureSteps is one rank of TestAllocFailure: each call once with
// rank 1's allocation failing with oom (failNext), then again.
func allocFailureSteps(ctx context.Context, e *Engine, failNext *atomic.Bool, oom error, E, K, H, T int) error {
	idx, x, _ := rankInputs(3, e.Rank(), T, K, E, H, device.BF16)
	ti, err := upload(ctx, e, device.Int32, device.EncodeInt32(idx), T, K)
	if err != nil {
		return err
	}
	xt, err := upload(ctx, e, device.BF16, x, T, H)
	if err != nil {
		return err
	}
	h, err := e.Layout(ctx, LayoutInput{TopkIdx: ti})
	if err != nil {
		return err
	}
	d, err := e.Dispatch(ctx, h, DispatchInput{X: xt})
	if err != nil {
		return err
	}
	dp, err := e.DispatchPermute(ctx, h, DispatchInput{X: xt})
	if err = errors.Join(err, e.Synchronize(ctx)); err != nil {
		return err
	}
	calls := []struct {
		name string
		call func() error
	}{
		{"dispatch", func() error { _, err := e.Dispatch(ctx, h, DispatchInput{X: xt}); return err }},
		{"combine", func() error { _, err := e.Combine(ctx, h, CombineInput{Z: d.RecvX}); return err }},
		{"dispatch-permute", func() error { _, err := e.DispatchPermute(ctx, h, DispatchInput{X: xt}); return err }},
		{"unpermute-combine", func() error { _, err := e.UnpermuteCombine(ctx, h, UnpermuteInput{Y: dp.X}); return err }},
	}
	for _, c := range calls {
		if e.Rank() == 1 {
			failNext.Store(true)
		}
		err := errors.Join(c.call(), e.Synchronize(ctx))
		switch {
		case e.Rank() == 1 && !errors.Is(err, oom):
			return fmt.Errorf("%s with its outputs not allocated: %v, want the allocation's error", c.name, err)
		case e.Rank() != 1 && (err == nil || errors.Is(err, ErrTimeout) || !strings.Contains(err.Error(), "reported: injected: out of memory")):
			return fmt.Errorf("%s after rank 1 could not allocate: %v, want rank 1's cause at once", c.name, err)
		}
		if err := errors.Join(c.call(), e.Synchronize(ctx)); err != nil {
			return fmt.Errorf("%s after the failed one: %v", c.name, err)
		}
	}
	return nil
}

// TestConcurrentCallRefused: while one call of an engine is in progress
// (held inside Dispatch's output allocation), every call of the engine and
// of its handles from another goroutine is refused at once with
// ErrConcurrentCall and changes nothing, except a handle's Close, which
// returns at once and closes the handle as the call in progress ends; the
// held call then completes with the same rows as before, and the engine
// works as before. Without the guard the calls are not refused (and
// -race reports the races).
func TestConcurrentCallRefused(t *testing.T) {
	const E, K, H, T = 4, 2, 8, 4
	cfg := Config{NumExperts: E, TopK: K, Hidden: H, MaxTokensPerRank: T, Timeout: 5 * time.Second}
	errs := runRanks(t, 1, cfg, func(ctx context.Context, e *Engine) error {
		idx, x, w := rankInputs(1, 0, T, K, E, H, device.BF16)
		it, err := upload(ctx, e, device.Int32, device.EncodeInt32(idx), T, K)
		if err != nil {
			return err
		}
		defer it.Close()
		xt, err := upload(ctx, e, device.BF16, x, T, H)
		if err != nil {
			return err
		}
		defer xt.Close()
		wt, err := upload(ctx, e, device.FP32, device.EncodeFloat32(device.FP32, w), T, K)
		if err != nil {
			return err
		}
		defer wt.Close()
		h, err := e.Layout(ctx, LayoutInput{TopkIdx: it})
		if err != nil {
			return err
		}
		defer h.Close()
		h2, err := e.Layout(ctx, LayoutInput{TopkIdx: it}) // closed during the held call
		if err != nil {
			return err
		}
		want, err := e.Dispatch(ctx, h, DispatchInput{X: xt})
		if err != nil {
			return err
		}
		defer want.Close()
		perm, err := e.DispatchPermute(ctx, h, DispatchInput{X: xt, TopkWeights: wt})
		if err != nil {
			return err
		}
		defer perm.Close()

		// The first allocation after this holds its call until release.
		held, release := make(chan struct{}), make(chan struct{})
		var first atomic.Bool
		testHookAlloc = func(int) error {
			if first.CompareAndSwap(false, true) {
				close(held)
				<-release
			}
			return nil
		}
		type result struct {
			out DispatchOutput
			err error
		}
		done := make(chan result, 1)
		go func() {
			out, err := e.Dispatch(ctx, h, DispatchInput{X: xt})
			done <- result{out, err}
		}()
		<-held
		released := false
		end := func() result {
			if !released {
				close(release)
				released = true
			}
			r := <-done
			testHookAlloc = nil
			return r
		}
		refused := []struct {
			name string
			call func() error
		}{
			{"Layout", func() error { _, err := e.Layout(ctx, LayoutInput{TopkIdx: it}); return err }},
			{"Relayout", func() error { return e.Relayout(ctx, h, LayoutInput{TopkIdx: it}) }},
			{"Dispatch", func() error { _, err := e.Dispatch(ctx, h, DispatchInput{X: xt}); return err }},
			{"Combine", func() error { _, err := e.Combine(ctx, h, CombineInput{Z: want.RecvX}); return err }},
			{"DispatchPermute", func() error { _, err := e.DispatchPermute(ctx, h, DispatchInput{X: xt}); return err }},
			{"DispatchPermuteInto", func() error {
				return e.DispatchPermuteInto(ctx, h, DispatchInput{X: xt, TopkWeights: wt}, perm)
			}},
			{"UnpermuteCombine", func() error {
				_, err := e.UnpermuteCombine(ctx, h, UnpermuteInput{Y: perm.X, RecvWeights: perm.RecvWeights})
				return err
			}},
			{"UnpermuteCombineInto", func() error {
				return e.UnpermuteCombineInto(ctx, h, UnpermuteInput{Y: perm.X, RecvWeights: perm.RecvWeights}, xt)
			}},
			{"DispatchBackward", func() error {
				_, err := e.DispatchBackward(ctx, h, DispatchBackwardInput{GradRecvX: want.RecvX})
				return err
			}},
			{"CombineBackward", func() error { _, err := e.CombineBackward(ctx, h, xt); return err }},
			{"Permute", func() error { _, err := e.Permute(ctx, h, PermuteInput{RecvX: want.RecvX}); return err }},
			{"Unpermute", func() error { _, err := e.Unpermute(ctx, h, UnpermuteInput{Y: perm.X}); return err }},
			{"PermuteBackward", func() error { _, err := e.PermuteBackward(ctx, h, perm.X); return err }},
			{"UnpermuteBackward", func() error {
				_, err := e.UnpermuteBackward(ctx, h, UnpermuteBackwardInput{GradOut: want.RecvX, Y: perm.X})
				return err
			}},
			{"Synchronize", func() error { return e.Synchronize(ctx) }},
			{"Handle.Counts", func() error { _, err := h.Counts(ctx); return err }},
			{"Close", e.Close},
		}
		for _, c := range refused {
			if err := c.call(); !errors.Is(err, ErrConcurrentCall) {
				if r := end(); r.err == nil {
					r.out.Close()
				}
				return fmt.Errorf("%s during another call: %v, want ErrConcurrentCall", c.name, err)
			}
		}
		if err := h2.Close(); err != nil {
			end()
			return fmt.Errorf("Handle.Close during another call: %v, want nil (closed as the call ends)", err)
		}
		r := end()
		if r.err != nil {
			return fmt.Errorf("the held Dispatch: %v", r.err)
		}
		defer r.out.Close()
		if _, err := h2.Counts(ctx); !errors.Is(err, ErrClosed) {
			return fmt.Errorf("Counts of the handle closed during the held call, after it: %v, want ErrClosed", err)
		}
		if err := e.Synchronize(ctx); err != nil {
			return err
		}
		a, err := device.Download(ctx, want.RecvX)
		if err != nil {
			return err
		}
		b, err := device.Download(ctx, r.out.RecvX)
		if err != nil {
			return err
		}
		if !bytes.Equal(a, b) {
			return errors.New("the held Dispatch's rows differ from the same call's before")
		}
		return nil
	})
	if errs[0] != nil {
		t.Fatal(errs[0])
	}
}

// TestNewPeerNeverCalls: a rank that never calls New fails the others'
// New within the setup deadline, naming it (the config exchange once
// waited on the caller's context alone: for ever under
// context.Background()).
func TestNewPeerNeverCalls(t *testing.T) {
	old := setupTimeout
	setupTimeout = 300 * time.Millisecond
	defer func() { setupTimeout = old }()
	gs := comm.NewLocal(2)
	start := time.Now()
	cfg := Config{NumExperts: 4, TopK: 2, Hidden: 8, MaxTokensPerRank: 4, Timeout: 100 * time.Millisecond}
	e, err := New(context.Background(), gs[0], device.NewHost(), cfg)
	if err == nil {
		e.Close()
		t.Fatal("New succeeded without its peer")
	}
	var te *comm.TimeoutError
	if !errors.Is(err, ErrTimeout) || !errors.As(err, &te) || !slices.Equal(te.Missing, []int{1}) {
		t.Errorf("New without its peer: %v, want a timeout naming rank 1", err)
	}
	if d := time.Since(start); d > 30*time.Second { // a wait that ignores the setup deadline
		t.Errorf("New gave up after %v", d)
	}
}

// TestStreamErrorJoinsCollective: after the caller's own work fails on
// one rank's stream (Engine.Stream), that rank's next collective call
// still joins its exchange and tells the peers, so every rank fails that
// call and the next call pairs correctly on every rank. (The task was
// once skipped there, and the peer's call took that rank's next call's
// rows as this one's, without an error.)
func TestStreamErrorJoinsCollective(t *testing.T) {
	const R, E, K, H, T = 2, 2, 1, 8, 4
	for _, d := range []int{R, 1} { // one domain; two, with the rail
		t.Run(fmt.Sprintf("D=%d", d), func(t *testing.T) {
			cfg := Config{NumExperts: E, TopK: K, Hidden: H, MaxTokensPerRank: T, RanksPerDomain: d, Timeout: 5 * time.Second}
			errs := runRanks(t, R, cfg, func(ctx context.Context, e *Engine) error {
				r := e.Rank()
				ti, err := upload(ctx, e, device.Int32, device.EncodeInt32(make([]int32, T*K)), T, K) // every token to rank 0
				if err != nil {
					return err
				}
				h, err := e.Layout(ctx, LayoutInput{TopkIdx: ti})
				if err != nil {
					return err
				}
				rows := func(call int) []float32 {
					v := make([]float32, T*H)
					for i := range v {
						v[i] = float32(10*r + call)
					}
					return v
				}
				x1, err := upload(ctx, e, device.FP32, device.EncodeFloat32(device.FP32, rows(1)), T, H)
				if err != nil {
					return err
				}
				x2, err := upload(ctx, e, device.FP32, device.EncodeFloat32(device.FP32, rows(2)), T, H)
				if err != nil {
					return err
				}
				cause := errors.New("the caller's own work failed")
				if r == 1 {
					e.Stream().(*device.HostStream).Go("caller's work", func() error { return cause })
				}
				start := time.Now()
				_, err = e.Dispatch(ctx, h, DispatchInput{X: x1})
				if err == nil {
					err = e.Synchronize(ctx)
				}
				switch {
				case r == 1 && !errors.Is(err, cause):
					return fmt.Errorf("rank 1's first dispatch: %v, want its stream's error", err)
				case r == 0 && (err == nil || !strings.Contains(err.Error(), cause.Error())):
					return fmt.Errorf("rank 0's first dispatch: %v, want rank 1's failure", err)
				case time.Since(start) > cfg.Timeout/2:
					return fmt.Errorf("rank %d's first dispatch failed after %v: a wait ran into its deadline", r, time.Since(start))
				}
				out, err := e.Dispatch(ctx, h, DispatchInput{X: x2})
				if err == nil {
					err = e.Synchronize(ctx)
				}
				if err != nil {
					return fmt.Errorf("rank %d's second dispatch: %v", r, err)
				}
				if r == 0 {
					got := device.DecodeFloat32(device.FP32, out.RecvX.Bytes())
					for i, v := range got {
						if want := float32(10*(i/(T*H)) + 2); v != want {
							return fmt.Errorf("rank 0's second dispatch: row %d holds %v, want %v (rank %d's second call)", i/H, v, want, i/(T*H))
						}
					}
				}
				return nil
			})
			for r, err := range errs {
				if err != nil {
					t.Errorf("rank %d: %v", r, err)
				}
			}
		})
	}
}

// TestCloseAfterTimeoutLatePeer: a rank whose call timed out closes its
// engine while a peer of its process is late; the late peer's exchange
// still rings the closed rank's bell and may store into its done words.
// That control block must not have gone to anyone else: tensors allocated
// after the Close from the same backend keep their bytes. (It went back
// to the pool at the Close, and the peer's writes landed in them.)
func TestCloseAfterTimeoutLatePeer(t *testing.T) {
	const R, E, K, H, T = 2, 4, 2, 16, 4
	cfg := Config{NumExperts: E, TopK: K, Hidden: H, MaxTokensPerRank: T, Timeout: 200 * time.Millisecond}
	gs := comm.NewLocal(R)
	b := device.NewHost()
	engines := make([]*Engine, R)
	var eg errgroup.Group
	for r := range R {
		eg.Go(func() (err error) {
			engines[r], err = New(t.Context(), gs[r], b, cfg)
			return err
		})
	}
	if err := eg.Wait(); err != nil {
		t.Fatal(err)
	}
	other, err := b.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	var junk []*device.Tensor
	defer func() { closeAll(junk...) }()
	reused := make(chan struct{})
	layout := func(e *Engine) error {
		ti, err := upload(t.Context(), e, device.Int32, device.EncodeInt32(make([]int32, T*K)), T, K)
		if err != nil {
			return err
		}
		defer ti.Close()
		_, err = e.Layout(t.Context(), LayoutInput{TopkIdx: ti})
		return err
	}
	eg.Go(func() error {
		defer close(reused)
		if err := layout(engines[0]); !errors.Is(err, ErrTimeout) {
			return fmt.Errorf("rank 0's layout without rank 1: %v, want a timeout", err)
		}
		engines[0].Close()
		// Others allocate from the same backend: the pool's memory.
		for range 16 {
			j, err := device.NewTensor(other, device.Int32, 256)
			if err != nil {
				return err
			}
			for i := range j.Bytes() {
				j.Bytes()[i] = 0xFF
			}
			junk = append(junk, j)
		}
		return nil
	})
	eg.Go(func() error {
		<-reused
		_ = layout(engines[1]) // late: fails, after ringing rank 0's bell
		engines[1].Close()
		return nil
	})
	if err := eg.Wait(); err != nil {
		t.Fatal(err)
	}
	for n, j := range junk {
		for i, v := range j.Bytes() {
			if v != 0xFF {
				t.Fatalf("tensor %d, byte %d is %#x: written by the late peer into the closed rank's control block", n, i, v)
			}
		}
	}
}

// setDomainKeys makes rank r's host key hosts[r] and fabric key
// fabrics[r] (why, where it is empty) for the test.
func setDomainKeys(t *testing.T, hosts, fabrics []string, why string) {
	testHookDomainKeys = func(rank int, host, fabric, w string) (string, string, string) {
		if fabrics[rank] == "" {
			return "host:" + hosts[rank], "", why
		}
		return "host:" + hosts[rank], fabrics[rank], ""
	}
	t.Cleanup(func() { testHookDomainKeys = nil })
}

// TestDomainsAcrossHosts: the ranks of two emulated hosts form one domain
// each, unless every rank is in one NVLink fabric clique; a domain that
// then spans the hosts needs the CUDA backend, so the host backend refuses
// it on every rank, naming the hosts; so does a domain size forced across
// hosts without a fabric.
func TestDomainsAcrossHosts(t *testing.T) {
	hosts := []string{"tray1", "tray1", "tray2", "tray2"}
	cfg := Config{NumExperts: 8, TopK: 2, Hidden: 8, MaxTokensPerRank: 4}

	setDomainKeys(t, hosts, []string{"", "", "", ""}, "no NVML")
	wantRanksPerDomain(t, 4, cfg, 2, "per-host domains")

	// Two racks of two trays: the cliques would make two domains, and a
	// domain across hosts must be the only one: one domain a host.
	hosts8 := []string{"t1", "t1", "t2", "t2", "t3", "t3", "t4", "t4"}
	setDomainKeys(t, hosts8, []string{"fabric:x/1", "fabric:x/1", "fabric:x/1", "fabric:x/1", "fabric:x/2", "fabric:x/2", "fabric:x/2", "fabric:x/2"}, "")
	wantRanksPerDomain(t, 8, cfg, 2, "two racks (one domain a host)")

	for _, c := range []struct {
		name    string
		fabrics []string
		D       int
		want    string
	}{
		{"one clique", []string{"fabric:x/1", "fabric:x/1", "fabric:x/1", "fabric:x/1"}, 0,
			"domain 0 (ranks 0-3) holds ranks of tray1 and tray2, but the host backend's domains lie within one host"},
		{"forced without fabric", []string{"", "", "", ""}, 4,
			"domain 0 (ranks 0-3) holds ranks of tray1 and tray2, but the host backend's domains lie within one host"},
	} {
		t.Run(c.name, func(t *testing.T) {
			setDomainKeys(t, hosts, c.fabrics, "no NVML")
			if c.D == 0 && !plan.HaveLayoutDims {
				// Without cgo a clique is never a domain
				// (fabricDomainUnfit): one domain a host.
				wantRanksPerDomain(t, 4, cfg, 2, "no cgo (one domain a host)")
				return
			}
			cfg := cfg
			cfg.RanksPerDomain = c.D
			errs := runRanks(t, 4, cfg, func(ctx context.Context, e *Engine) error { return nil })
			for r, err := range errs {
				if !errors.Is(err, ErrInvalidInput) || !strings.Contains(err.Error(), c.want) {
					t.Errorf("rank %d: %v, want ErrInvalidInput containing %q", r, err, c.want)
				}
			}
		})
	}
}

// TestFabricDomainUnfit: a fabric clique's domain is kept only as the
// one domain, and where the layout fits the GPU.
func TestFabricDomainUnfit(t *testing.T) {
	cfg := Config{NumExperts: 8, TopK: 2, Hidden: 8, MaxTokensPerRank: 4}
	if !plan.HaveLayoutDims {
		if why := fabricDomainUnfit(cfg, 4, 4, nil); !strings.Contains(why, "without cgo") {
			t.Errorf("one small domain, no cgo: %q", why)
		}
		return
	}
	if why := fabricDomainUnfit(cfg, 4, 4, nil); why != "" {
		t.Errorf("one small domain: %q", why)
	}
	if why := fabricDomainUnfit(cfg, 8, 4, nil); !strings.Contains(why, "the cliques make 2 domains") {
		t.Errorf("two cliques: %q", why)
	}
	if why := fabricDomainUnfit(cfg, 8, 0, nvlink.ErrTopology); !strings.Contains(why, "equal consecutive domains") {
		t.Errorf("uneven cliques: %q", why)
	}
	big := cfg
	big.NumExperts, big.TopK, big.MaxTokensPerRank = 1024, 16, 1<<22
	if why := fabricDomainUnfit(big, 64, 64, nil); !strings.Contains(why, "int32 offsets") {
		t.Errorf("64 ranks x 4M tokens x top-16: %q", why)
	}
}

// TestDomainAcrossHostsCUDA: on the CUDA backend a domain across hosts is
// taken where every rank shares GPU memory over a fabric clique, and
// refused, with the detection's reason, where not.
func TestDomainAcrossHostsCUDA(t *testing.T) {
	hosts := []string{"host:tray1", "host:tray1", "host:tray2", "host:tray2"}
	fab := nvlink.ChooseDomains(hosts, []string{"fabric:x/1", "fabric:x/1", "fabric:x/1", "fabric:x/1"}, make([]string, 4))
	if why, err := domainAcrossHosts(fab, 4, device.KindCUDA); err != nil || why != "domain 0 (ranks 0-3) holds ranks of tray1 and tray2" {
		t.Errorf("fabric clique, D 4: %q, %v", why, err)
	}
	if why, err := domainAcrossHosts(fab, 2, device.KindCUDA); err != nil || why != "" {
		t.Errorf("fabric clique, D 2 (per host): %q, %v", why, err)
	}
	none := nvlink.ChooseDomains(hosts, make([]string, 4), []string{"nvml: init: not found", "", "", ""})
	if _, err := domainAcrossHosts(none, 4, device.KindCUDA); err == nil || !strings.Contains(err.Error(), "rank 0 is in no usable NVLink fabric clique (nvml: init: not found)") {
		t.Errorf("no fabric, D 4: %v", err)
	}
}
