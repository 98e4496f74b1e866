package executor_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/goep/goep/comm"
	"github.com/goep/goep/device"
	"github.com/goep/goep/executor"
	"github.com/goep/goep/internal/ranktest"
	"github.com/goep/goep/launcher"
)

// The multi-process tests re-execute this test binary as the ranks of a
// world (under launcher.Spawn, as `eprun launch` does, and under mpirun
// when it is installed). Each child runs TestMultiProcessChild with
// GOEP_MP_MODE telling it what to do and writes its results, as JSON, to
// GOEP_MP_OUT/rank-K.json.

const mpRanks = 4

// mpCase is one world of the multi-process property run, derived from its
// seed alone so that every process and the in-process reference build the
// same one.
func mpCase(seed uint64, R int) (executor.Config, device.DType) {
	rng := rand.New(rand.NewPCG(seed, 77))
	L := 1 + rng.IntN(4)
	E := R * L
	cfg := executor.Config{
		NumExperts: E, TopK: 1 + rng.IntN(min(E, 6)), Hidden: 1 + rng.IntN(200),
		MaxTokensPerRank: 40, PadMultiple: []int{1, 4, 16}[rng.IntN(3)],
	}
	if seed%3 == 2 {
		cfg.Mode, cfg.Overflow = executor.Capacity, executor.OverflowDrop
		cfg.MaxRecvTokens, cfg.MaxPermutedTokens = 20+rng.IntN(60), 20+rng.IntN(120)
	}
	if seed%3 == 0 {
		// The tuning knobs: few blocks (goroutines) looping over chunks.
		cfg.SMs, cfg.ChunkRows = 1+rng.IntN(3), 1+rng.IntN(5)
	}
	dt := device.BF16
	if seed%2 == 1 {
		dt = device.FP32
	}
	if seed >= 5 {
		// Rows of a multiple of 128 channels: mpPipeline also dispatches
		// them as fp8 with scales.
		cfg.Hidden = device.FP8ScaleChannels * int(seed-4)
	}
	return cfg, dt
}

// mpInputs builds rank r's routing, tokens and weights for a case.
func mpInputs(seed uint64, r int, cfg executor.Config, dt device.DType) (idx []int32, x []byte, w []float32, T int) {
	rng := rand.New(rand.NewPCG(seed, uint64(r)+1000))
	T = rng.IntN(cfg.MaxTokensPerRank + 1)
	if r == 1 && seed%4 == 0 {
		T = 0
	}
	idx, x, w = executor.RandomInputs(rng, T, cfg.TopK, cfg.NumExperts, cfg.Hidden, dt)
	if seed >= 4 {
		mpSpecials(rng, x, dt, seed)
	}
	return idx, x, w, T
}

// mpSpecials writes special values into about one element of x in
// sixteen: negative zeros, subnormals and the smallest normals (which no
// backend may flush), and one NaN bit pattern a case, signalling with a
// payload (which a sum or product must quiet, keeping the payload, and
// data movement must copy unchanged). One pattern a case, as in the
// property tests: which operand's payload an addition of two NaNs keeps
// is then moot.
func mpSpecials(rng *rand.Rand, x []byte, dt device.DType, seed uint64) {
	// Odd seeds are fp32, even ones bf16 (mpCase), so seed/2 picks the
	// pattern: the bf16 cases 4 and 6 take one each, the fp32 case 5
	// 0x7f800001, whose payload is in the low bits only (a row cut to
	// bf16 on the way would turn it into an infinity).
	nan32 := []uint32{0x7f800001, 0xffa0beef}[seed/2%2]
	nan16 := []uint16{0x7f81, 0xffa5}[seed/2%2]
	for i := 0; i < len(x)/dt.Size(); i++ {
		if rng.IntN(16) != 0 {
			continue
		}
		sign := uint32(rng.IntN(2)) << 31
		var v uint32
		switch rng.IntN(4) {
		case 0:
			v = 1 << 31 // -0
		case 1:
			v = sign | uint32(1+rng.IntN(0x7f))<<16 | uint32(rng.IntN(1<<16)) // subnormal
		case 2:
			v = sign | 1<<23 | uint32(rng.IntN(0x7f))<<16 // smallest normals
		default:
			v = nan32
		}
		if dt == device.BF16 {
			h := uint16(v >> 16)
			if v == nan32 {
				h = nan16
			}
			binary.LittleEndian.PutUint16(x[2*i:], h)
		} else {
			binary.LittleEndian.PutUint32(x[4*i:], v)
		}
	}
}

// mpPipeline runs every call of the API on one case and returns a digest
// of every output, by name.
func mpPipeline(ctx context.Context, g comm.Group, b device.Backend, seed uint64) (map[string]string, error) {
	cfg, dt := mpCase(seed, g.Size())
	e, err := executor.New(ctx, g, b, cfg, executor.WithLogger(testLogger()))
	if err != nil {
		return nil, err
	}
	defer e.Close()
	idx, x, w, T := mpInputs(seed, g.Rank(), cfg, dt)
	K, H := cfg.TopK, cfg.Hidden
	put := func(dt device.DType, data []byte, shape ...int) *device.Tensor {
		t, err2 := e.NewTensor(dt, shape...)
		if err2 == nil {
			err2 = device.Upload(ctx, t, data)
		}
		if err2 != nil && err == nil {
			err = err2
		}
		return t
	}
	ti := put(device.Int32, device.EncodeInt32(idx), T, K)
	xt := put(dt, x, T, H)
	wt := put(device.FP32, device.EncodeFloat32(device.FP32, w), T, K)
	if err != nil {
		return nil, err
	}
	h, err := e.Layout(ctx, executor.LayoutInput{TopkIdx: ti})
	if err != nil {
		return nil, err
	}
	out := map[string]*device.Tensor{}
	step := func(name string, f func() (*device.Tensor, error)) *device.Tensor {
		if err != nil {
			return nil
		}
		var t *device.Tensor
		t, err = f()
		out[name] = t
		return t
	}
	d, err := e.Dispatch(ctx, h, executor.DispatchInput{X: xt, TopkWeights: wt})
	if err != nil {
		return nil, err
	}
	out["dispatch.x"], out["dispatch.idx"], out["dispatch.w"] = d.RecvX, d.RecvIdx, d.RecvWeights
	p, err := e.Permute(ctx, h, executor.PermuteInput{RecvX: d.RecvX, RecvWeights: d.RecvWeights})
	if err != nil {
		return nil, err
	}
	out["permute.x"], out["permute.w"] = p.X, p.Weights
	u := step("unpermute", func() (*device.Tensor, error) {
		return e.Unpermute(ctx, h, executor.UnpermuteInput{Y: p.X, RecvWeights: d.RecvWeights})
	})
	step("combine", func() (*device.Tensor, error) { return e.Combine(ctx, h, executor.CombineInput{Z: u}) })
	var dp executor.DispatchPermuteOutput
	if err == nil {
		dp, err = e.DispatchPermute(ctx, h, executor.DispatchInput{X: xt, TopkWeights: wt})
		out["dispatch-permute.x"], out["dispatch-permute.w"] = dp.X, dp.Weights
	}
	step("unpermute-combine", func() (*device.Tensor, error) {
		return e.UnpermuteCombine(ctx, h, executor.UnpermuteInput{Y: dp.X, RecvWeights: dp.RecvWeights})
	})
	if err == nil {
		var db executor.DispatchBackwardOutput
		db, err = e.DispatchBackward(ctx, h, executor.DispatchBackwardInput{GradRecvX: d.RecvX, GradRecvWeights: d.RecvWeights})
		out["dispatch-backward.x"], out["dispatch-backward.w"] = db.GradX, db.GradTopkWeights
	}
	step("combine-backward", func() (*device.Tensor, error) { return e.CombineBackward(ctx, h, xt) })
	if err == nil && H%device.FP8ScaleChannels == 0 {
		err = mpFP8(ctx, e, h, seed, x[:T*H], wt, out)
	}
	step("permute-backward", func() (*device.Tensor, error) { return e.PermuteBackward(ctx, h, p.X) })
	if err == nil {
		var ub executor.UnpermuteBackwardOutput
		ub, err = e.UnpermuteBackward(ctx, h, executor.UnpermuteBackwardInput{GradOut: u, Y: p.X, RecvWeights: d.RecvWeights})
		out["unpermute-backward.y"], out["unpermute-backward.w"] = ub.GradY, ub.GradWeights
	}
	if err == nil {
		// A GPU wait that failed (a timeout, say) leaves garbage in the
		// outputs; only Synchronize says so.
		err = e.Synchronize(ctx)
	}
	if err != nil {
		return nil, err
	}
	digests := map[string]string{}
	for name, t := range out {
		raw, err := device.Download(ctx, t)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		if err := t.CheckGuards(); err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		sum := sha256.Sum256(raw)
		digests[name] = fmt.Sprintf("%v%v %s", t.DType(), t.Shape(), hex.EncodeToString(sum[:8]))
	}
	return digests, nil
}

// mpFP8 dispatches x8 (T rows of Hidden bytes) as fp8 rows with scales
// drawn from seed and the rank, then permutes them, and adds the outputs
// to out under names starting "fp8.".
func mpFP8(ctx context.Context, e *executor.Engine, h *executor.Handle, seed uint64, x8 []byte, wt *device.Tensor, out map[string]*device.Tensor) error {
	H := e.Config().Hidden
	T, S := len(x8)/H, H/device.FP8ScaleChannels
	rng := rand.New(rand.NewPCG(seed, uint64(e.Rank())+2000))
	scales := make([]float32, T*S)
	for i := range scales {
		scales[i] = float32(rng.ExpFloat64())
	}
	xt, err1 := e.NewTensor(device.FP8E4M3, T, H)
	st, err2 := e.NewTensor(device.FP32, T, S)
	if err := errors.Join(err1, err2); err != nil {
		return err
	}
	out["fp8.x"], out["fp8.scales"] = xt, st // kept alive to the end, digested too
	if err := errors.Join(device.Upload(ctx, xt, x8), device.Upload(ctx, st, device.EncodeFloat32(device.FP32, scales))); err != nil {
		return err
	}
	in := executor.DispatchInput{X: xt, TopkWeights: wt, XScales: st}
	d, err := e.Dispatch(ctx, h, in)
	if err != nil {
		return err
	}
	out["fp8.dispatch.x"], out["fp8.dispatch.idx"], out["fp8.dispatch.w"], out["fp8.dispatch.scales"] = d.RecvX, d.RecvIdx, d.RecvWeights, d.RecvScales
	p, err := e.Permute(ctx, h, executor.PermuteInput{RecvX: d.RecvX, RecvWeights: d.RecvWeights, RecvScales: d.RecvScales})
	if err != nil {
		return err
	}
	out["fp8.permute.x"], out["fp8.permute.w"], out["fp8.permute.scales"] = p.X, p.Weights, p.Scales
	dp, err := e.DispatchPermute(ctx, h, in)
	if err != nil {
		return err
	}
	out["fp8.dispatch-permute.x"], out["fp8.dispatch-permute.w"], out["fp8.dispatch-permute.scales"] = dp.X, dp.Weights, dp.Scales
	out["fp8.dispatch-permute.idx"], out["fp8.dispatch-permute.rw"] = dp.RecvIdx, dp.RecvWeights
	return nil
}

// mpLayout draws this rank's routing and bf16 tokens for seed under e's
// config (mpInputs), uploads them and runs the layout: the tokens and the
// handle, for the fault worlds' calls.
func mpLayout(ctx context.Context, e *executor.Engine, seed uint64) (*device.Tensor, *executor.Handle, error) {
	cfg := e.Config()
	idx, x, _, T := mpInputs(seed, e.Rank(), cfg, device.BF16)
	ti, err1 := e.NewTensor(device.Int32, T, cfg.TopK)
	xt, err2 := e.NewTensor(device.BF16, T, cfg.Hidden)
	if err := errors.Join(err1, err2); err != nil {
		return nil, nil, err
	}
	if err := errors.Join(device.Upload(ctx, ti, device.EncodeInt32(idx)), device.Upload(ctx, xt, x)); err != nil {
		return nil, nil, err
	}
	h, err := e.Layout(ctx, executor.LayoutInput{TopkIdx: ti})
	if err != nil {
		return nil, nil, err
	}
	return xt, h, nil
}

// testLogger is a debug logger on stderr when GOEP_LOG_LEVEL=debug (to
// read, say, a sanitizer's report against the engines' GPU windows), else
// none.
func testLogger() *zap.Logger {
	if os.Getenv("GOEP_LOG_LEVEL") != "debug" {
		return zap.NewNop()
	}
	l, err := zap.NewDevelopment()
	if err != nil {
		return zap.NewNop()
	}
	return l
}

var mpSeeds = []uint64{1, 2, 3, 4, 5, 6}

var mpSeed = flag.Uint64("mp.seed", 0, "run only this seed of the multi-process and CUDA-domain cases (0: all; e.g. 4 under a sanitizer)")

// seeds are the cases' seeds this run: mpSeeds, or the one -mp.seed names
// (passed on to the child processes).
func seeds() []uint64 {
	if *mpSeed != 0 {
		return []uint64{*mpSeed}
	}
	return mpSeeds
}

// extraModes are child modes defined by other test files (the CUDA
// tests), each returning digests like the "cases" mode.
var extraModes = map[string]func(context.Context, comm.Group, device.Backend) ([]map[string]string, error){}

// mpResult is what a child reports.
type mpResult struct {
	Rank    int
	Digests []map[string]string `json:",omitempty"`
	Err     string              `json:",omitempty"`
	Elapsed time.Duration
	// Shm are the files under /dev/shm that the rank's process maps when
	// it reports (goep's shared memory is memfds: none is expected).
	Shm []string `json:",omitempty"`
}

// shmMapped lists the files under /dev/shm that this process maps.
func shmMapped() []string {
	raw, _ := os.ReadFile("/proc/self/maps")
	var out []string
	for _, line := range strings.Split(string(raw), "\n") {
		f := strings.Fields(line)
		if len(f) >= 6 && strings.HasPrefix(f[5], "/dev/shm/") && !slices.Contains(out, f[5]) {
			out = append(out, f[5])
		}
	}
	return out
}

// writeReport writes res as this rank's report (GOEP_MP_OUT/rank-K.json).
func writeReport(res mpResult) error {
	raw, _ := json.Marshal(res)
	return os.WriteFile(filepath.Join(os.Getenv("GOEP_MP_OUT"), fmt.Sprintf("rank-%d.json", res.Rank)), raw, 0o644)
}

// TestMultiProcessChild is the body of one rank of the multi-process tests;
// it only runs as a child of TestMultiProcess.
func TestMultiProcessChild(t *testing.T) {
	mode := os.Getenv("GOEP_MP_MODE")
	if mode == "" {
		t.Skip("runs only as a child process of TestMultiProcess*")
	}
	ctx := context.Background()
	// The rendezvous waits for rank 0 until its ctx ends: bound it, so
	// that a rank 0 that failed to start makes the others fail with a
	// timeout naming it instead of waiting for the test binary's timeout.
	timeout, err := executor.TimeoutFromEnv()
	if err != nil {
		t.Fatal(err)
	}
	bctx, cancel := context.WithTimeout(ctx, 3*timeout)
	g, env, err := launcher.Bootstrap(bctx)
	cancel()
	if err != nil {
		t.Fatalf("bootstrap: %v", err)
	}
	// Close the group before the process exits: it finalizes MPI, and
	// rank 0's TCP server delivers what it has queued before it stops.
	defer g.Close()
	res := mpResult{Rank: env.Rank}
	start := time.Now()
	var b device.Backend = device.NewHost()
	if os.Getenv("GOEP_MP_BACKEND") == "cuda" {
		dev := 0
		if os.Getenv("GOEP_MP_GPU") == "local" {
			// Spread over GOEP_MP_GPUS GPUs: Bootstrap set GOEP_DEVICE
			// to the local rank; process r runs on GPU r mod G.
			if dev, err = strconv.Atoi(os.Getenv("GOEP_DEVICE")); err != nil {
				t.Fatalf("rank %d: GOEP_DEVICE: %v", env.Rank, err)
			}
			if gpus, err := strconv.Atoi(os.Getenv("GOEP_MP_GPUS")); err == nil && gpus > 0 {
				dev %= gpus
			}
		}
		cb, err := device.NewCUDA(dev)
		if err != nil {
			t.Fatalf("rank %d: GPU %d: %v", env.Rank, dev, err)
		}
		defer cb.Close()
		b = cb
	}
	// GOEP_MP_FAKE_TRAYS=n: the ranks look as if on hosts of n ranks
	// each, in one NVLink fabric clique.
	if n, err := strconv.Atoi(os.Getenv("GOEP_MP_FAKE_TRAYS")); err == nil && n > 0 {
		executor.SetFakeFabric(n)
	}
	switch mode {
	case "cases":
		for _, seed := range seeds() {
			d, err := mpPipeline(ctx, g, b, seed)
			if err != nil {
				res.Err = fmt.Sprintf("seed %d: %v", seed, err)
				break
			}
			res.Digests = append(res.Digests, d)
		}
	case "kill":
		res.Err = mpKill(ctx, g, b)
	case "mismatch":
		cfg := executor.Config{NumExperts: 8, TopK: 2, Hidden: 16, MaxTokensPerRank: 4}
		if g.Rank() == 2 {
			cfg.Hidden = 32
		}
		e, err := executor.New(ctx, g, b, cfg)
		if err == nil {
			e.Close()
			err = errors.New("no error")
		}
		res.Err = err.Error()
		if errors.Is(err, executor.ErrPeerMismatch) {
			res.Err = "ErrPeerMismatch: " + res.Err
		}
	default:
		f, ok := extraModes[mode]
		if !ok {
			t.Fatalf("unknown GOEP_MP_MODE %q", mode)
		}
		d, err := f(ctx, g, b)
		res.Digests = d
		if err != nil {
			res.Err = err.Error()
		}
	}
	res.Elapsed = time.Since(start)
	res.Shm = shmMapped()
	if err := writeReport(res); err != nil {
		t.Fatal(err)
	}
	if stayAfterReport(mode) {
		// A rank died: the launcher has asked the others to stop, and this
		// one ignored it to report. Stay until every rank has reported (the
		// victim did before it died), so that no rank that is still
		// waiting sees this one go, then leave without closing the group
		// (it cannot close cleanly with a rank gone).
		waitReports(env.Size, 2*time.Minute)
		os.Exit(0)
	}
}

// waitReports waits until the reports of ranks [0, n) are written, at
// most limit.
func waitReports(n int, limit time.Duration) {
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		missing := 0
		for r := range n {
			if _, err := os.Stat(filepath.Join(os.Getenv("GOEP_MP_OUT"), fmt.Sprintf("rank-%d.json", r))); err != nil {
				missing++
			}
		}
		if missing == 0 {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// mpKill runs dispatches until rank 2 kills itself in the middle of one;
// it returns the error the surviving ranks saw.
func mpKill(ctx context.Context, g comm.Group, b device.Backend) string {
	// Outlive the launcher's SIGTERM long enough to report what we saw.
	signal.Ignore(syscall.SIGTERM)
	cfg := executor.Config{NumExperts: 8, TopK: 4, Hidden: 4096, MaxTokensPerRank: 512}
	e, err := executor.New(ctx, g, b, cfg)
	if err != nil {
		return "new: " + err.Error()
	}
	idx, x, _, T := mpInputs(9, g.Rank(), executor.Config{NumExperts: 8, TopK: 4, Hidden: 4096, MaxTokensPerRank: 512}, device.BF16)
	ti, _ := e.NewTensor(device.Int32, T, 4)
	device.Upload(ctx, ti, device.EncodeInt32(idx))
	xt, _ := e.NewTensor(device.BF16, T, 4096)
	device.Upload(ctx, xt, x)
	h, err := e.Layout(ctx, executor.LayoutInput{TopkIdx: ti})
	if err != nil {
		return "layout: " + err.Error()
	}
	for i := 0; ; i++ {
		out, err := e.Dispatch(ctx, h, executor.DispatchInput{X: xt})
		if err != nil {
			return err.Error()
		}
		if g.Rank() == 2 && i == 3 {
			// The dispatch is queued and running: die in the middle of it,
			// having said what it maps in /dev/shm.
			writeReport(mpResult{Rank: 2, Err: "killed itself", Shm: shmMapped()})
			syscall.Kill(os.Getpid(), syscall.SIGKILL)
		}
		if err := e.Synchronize(ctx); err != nil {
			return err.Error()
		}
		out.Close()
	}
}

// runWorld runs the child mode on mpRanks processes with the given launcher
// ("spawn" or "mpirun") and returns the children's reports and the
// launcher's error.
func runWorld(t *testing.T, how, mode string, timeout time.Duration) ([]mpResult, error, string) {
	t.Helper()
	return runWorldN(t, how, mode, mpRanks, timeout)
}

// runWorldN is runWorld with n ranks and extra environment variables.
func runWorldN(t *testing.T, how, mode string, n int, timeout time.Duration, extraEnv ...string) ([]mpResult, error, string) {
	t.Helper()
	dir := t.TempDir()
	// The children inherit this process's environment (a sanitizer's
	// variables that follow child processes, GOEP_LOG_LEVEL, a longer
	// GOEP_TIMEOUT); GOEP_TIMEOUT is 20 s unless set.
	env := append([]string{"GOEP_TIMEOUT=20s"}, os.Environ()...)
	env = append(env, "GOEP_MP_MODE="+mode, "GOEP_MP_OUT="+dir)
	env = append(env, extraEnv...)
	ctx, cancel := context.WithTimeout(t.Context(), timeout)
	defer cancel()
	args := []string{os.Args[0], "-test.run", "^TestMultiProcessChild$", "-test.timeout", "2m"}
	if *mpSeed != 0 {
		args = append(args, fmt.Sprintf("-mp.seed=%d", *mpSeed))
	}
	// GOEP_MP_WRAP is a command line each child runs under (space
	// separated), such as compute-sanitizer and its flags: a sanitizer
	// started on this process does not follow the children, whose exec
	// bypasses the C library it hooks.
	if w := strings.Fields(os.Getenv("GOEP_MP_WRAP")); len(w) > 0 {
		args = append(w, args...)
	}
	var out bytes.Buffer
	var lerr error
	switch how {
	case "spawn":
		// GOEP_RANKS_PER_DOMAIN=D among the variables: spawn n/D emulated
		// domains, as `eprun launch --domains` does.
		domains := 0
		for _, kv := range extraEnv {
			if v, ok := strings.CutPrefix(kv, "GOEP_RANKS_PER_DOMAIN="); ok {
				if d, err := strconv.Atoi(v); err == nil && d > 0 {
					domains = n / d
				}
			}
		}
		// The grace before SIGKILL outlasts the test: the ranks of a world
		// with a dead rank ignore the launcher's SIGTERM until every rank
		// has reported, however loaded the machine (stayAfterReport).
		lerr = launcher.Spawn(ctx, launcher.SpawnConfig{N: n, Domains: domains, Command: args, Env: env, Stdout: &out, Stderr: &out, Grace: timeout})
	case "mpirun":
		mpirun, err := exec.LookPath("mpirun")
		if err != nil {
			t.Skip("mpirun is not installed (apt-get install openmpi-bin)")
		}
		// Built without the mpi tag, the children bootstrap over TCP with
		// the rank Open MPI gives them.
		port, err := launcher.FreePort()
		if err != nil {
			t.Fatal(err)
		}
		env = append(env, "GOEP_MASTER_ADDR=127.0.0.1", "GOEP_MASTER_PORT="+strconv.Itoa(port),
			"OMPI_ALLOW_RUN_AS_ROOT=1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1")
		margs := []string{"--allow-run-as-root", "--oversubscribe", "-np", strconv.Itoa(n)}
		// Open MPI forwards the variables named by -x: those of this
		// test (mpirun itself sees the whole environment).
		for _, kv := range append([]string{"GOEP_TIMEOUT=", "GOEP_MP_MODE=", "GOEP_MP_OUT="}, extraEnv...) {
			margs = append(margs, "-x", strings.SplitN(kv, "=", 2)[0])
		}
		margs = append(margs, "-x", "GOEP_MASTER_ADDR", "-x", "GOEP_MASTER_PORT", "-x", "OMPI_ALLOW_RUN_AS_ROOT", "-x", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM")
		cmd := exec.CommandContext(ctx, mpirun, append(margs, args...)...)
		cmd.Env = env
		cmd.Stdout, cmd.Stderr = &out, &out
		lerr = cmd.Run()
	}
	results := make([]mpResult, n)
	for r := range results {
		raw, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf("rank-%d.json", r)))
		if err != nil {
			results[r] = mpResult{Rank: r, Err: "no report: " + err.Error()}
			continue
		}
		if err := json.Unmarshal(raw, &results[r]); err != nil {
			t.Fatalf("rank %d report: %v", r, err)
		}
	}
	return results, lerr, out.String()
}

// inProcessDigests runs the cases with in-process ranks.
func inProcessDigests(t *testing.T) [][]map[string]string {
	return inProcessDigestsN(t, mpRanks)
}

// inProcessDigestsN runs the cases with n in-process ranks on the host
// backend.
func inProcessDigestsN(t *testing.T, n int) [][]map[string]string {
	gs := comm.NewLocal(n)
	b := device.NewHost()
	want := make([][]map[string]string, n)
	errs := ranktest.Run(n, func(r int) error {
		for _, seed := range seeds() {
			d, err := mpPipeline(t.Context(), gs[r], b, seed)
			if err != nil {
				return err
			}
			want[r] = append(want[r], d)
		}
		return nil
	})
	for r, err := range errs {
		if err != nil {
			t.Fatalf("in-process rank %d: %v", r, err)
		}
	}
	return want
}

// TestMultiProcess runs the whole API across 4 processes, launched like
// `eprun launch` and by mpirun, and checks every output bit for bit
// against the same worlds run with in-process ranks.
func TestMultiProcess(t *testing.T) {
	if os.Getenv("GOEP_MP_MODE") != "" {
		t.Skip("child")
	}
	want := inProcessDigests(t)
	for _, how := range []string{"spawn", "mpirun"} {
		t.Run(how, func(t *testing.T) {
			got, lerr, log := runWorld(t, how, "cases", 2*time.Minute)
			compareDigests(t, want, reportedDigests(t, got, lerr, log), "across processes", "in-process")
		})
	}
}

// namesRank2 matches an error whose rank list ("lost rank(s) [...]",
// "timed out waiting for rank(s) [...]") holds rank 2. Other ranks may be
// in the list too: a survivor that failed first and exited is lost to a
// slower one (seen in CI: "lost rank(s) [0 2]").
var namesRank2 = regexp.MustCompile(`rank\(s\) \[(\d+ )*2( \d+)*\]`)

// checkKilled checks a world in which rank 2 was killed: the launcher's
// error names rank 2, and every other rank failed with an error naming it
// well within GOEP_TIMEOUT (20 s).
func checkKilled(t *testing.T, got []mpResult, lerr error, log string) {
	t.Helper()
	if lerr == nil || !strings.Contains(lerr.Error(), "rank 2") {
		t.Errorf("launcher error %v, want one naming rank 2\n%s", lerr, log)
	}
	for r := range got {
		if r == 2 {
			continue
		}
		if !namesRank2.MatchString(got[r].Err) {
			t.Errorf("rank %d: %q, want an error naming rank 2\n%s", r, got[r].Err, log)
		}
		t.Logf("rank %d after %v: %s", r, got[r].Elapsed, got[r].Err)
		if got[r].Elapsed > 20*time.Second {
			t.Errorf("rank %d took %v, past GOEP_TIMEOUT", r, got[r].Elapsed)
		}
	}
}

// TestMultiProcessKill kills rank 2 in the middle of a dispatch: every other
// rank must return an error naming it well within GOEP_TIMEOUT, the
// launcher must fail naming it, and nothing the ranks mapped from /dev/shm
// may be left there. (The ranks' own mappings, not a count of /dev/shm's
// entries: other programs on the machine, such as mpirun's jobs, come and
// go there meanwhile.)
func TestMultiProcessKill(t *testing.T) {
	if os.Getenv("GOEP_MP_MODE") != "" {
		t.Skip("child")
	}
	start := time.Now()
	got, lerr, log := runWorld(t, "spawn", "kill", time.Minute)
	checkKilled(t, got, lerr, log)
	t.Logf("world torn down in %v", time.Since(start))
	for _, r := range got {
		for _, f := range r.Shm {
			if _, err := os.Stat(f); err == nil {
				t.Errorf("rank %d mapped %s, still there after the world ended", r.Rank, f)
			}
		}
	}
	if got[2].Err != "killed itself" {
		t.Errorf("rank 2 reported %q before it died, want its mappings", got[2].Err)
	}
}

// TestMultiProcessConfigMismatch starts rank 2 with a different config:
// every rank must get ErrPeerMismatch.
func TestMultiProcessConfigMismatch(t *testing.T) {
	if os.Getenv("GOEP_MP_MODE") != "" {
		t.Skip("child")
	}
	got, _, log := runWorld(t, "spawn", "mismatch", time.Minute)
	for r := range mpRanks {
		if !strings.HasPrefix(got[r].Err, "ErrPeerMismatch") || !strings.Contains(got[r].Err, "Hidden=") {
			t.Errorf("rank %d: %q, want ErrPeerMismatch naming Hidden\n%s", r, got[r].Err, log)
		}
	}
}

// reportedDigests fails the test if the launcher or a rank failed, and
// returns every rank's digests.
func reportedDigests(t *testing.T, got []mpResult, lerr error, log string) [][]map[string]string {
	t.Helper()
	if lerr != nil {
		t.Fatalf("launcher: %v\n%s", lerr, log)
	}
	out := make([][]map[string]string, len(got))
	for r := range got {
		if got[r].Err != "" {
			t.Fatalf("rank %d: %s\n%s", r, got[r].Err, log)
		}
		out[r] = got[r].Digests
	}
	return out
}

// errText is err's text for the fault modes' step results, "nil" for
// none.
func errText(err error) string {
	if err == nil {
		return "nil"
	}
	return err.Error()
}

// reportedSteps is reportedDigests for the modes that report one map of
// step results per rank (the fault modes): it fails the test unless every
// rank reported exactly one, logs them, and returns them by rank.
func reportedSteps(t *testing.T, got []mpResult, lerr error, log string) []map[string]string {
	t.Helper()
	all := reportedDigests(t, got, lerr, log)
	out := make([]map[string]string, len(all))
	for r, d := range all {
		if len(d) != 1 {
			t.Fatalf("rank %d reported %d maps of step results, want 1\n%s", r, len(d), log)
		}
		out[r] = d[0]
		t.Logf("rank %d: %v", r, out[r])
	}
	return out
}

// compareDigests checks every output digest of every rank and case.
func compareDigests(t *testing.T, want, got [][]map[string]string, gotIs, wantIs string) {
	t.Helper()
	for r := range want {
		if len(got[r]) != len(seeds()) {
			t.Fatalf("rank %d reported %d cases, want %d", r, len(got[r]), len(seeds()))
		}
		for i, seed := range seeds() {
			checked := 0
			for name, w := range want[r][i] {
				checked++
				if g := got[r][i][name]; g != w {
					t.Errorf("seed %d rank %d %s: %s %s, %s %s", seed, r, name, g, gotIs, w, wantIs)
				}
			}
			if checked < 14 {
				t.Errorf("seed %d rank %d: only %d outputs compared", seed, r, checked)
			}
		}
	}
}
