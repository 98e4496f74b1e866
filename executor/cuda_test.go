//go:build cuda && cgo

package executor_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/goep/goep/comm"
	"github.com/goep/goep/device"
	"github.com/goep/goep/executor"
	"github.com/goep/goep/internal/cuda"
	"github.com/goep/goep/internal/ranktest"
)

var (
	gpuFlag   = flag.Bool("gpu", false, "run the CUDA tests (needs a GPU)")
	gpuSpread = flag.Int("gpu.spread", 0, "TestCUDAMultiProcess and TestCUDABenchmark: spread the processes over this many GPUs (process r on GPU r mod G) instead of sharing GPU 0")
)

func needGPU(t *testing.T) *device.CUDA {
	t.Helper()
	if os.Getenv("GOEP_MP_MODE") != "" {
		t.Skip("child")
	}
	if !*gpuFlag {
		t.Skip("needs a GPU: run the test binary with -gpu on a GPU host")
	}
	b, err := device.NewCUDA(0)
	if err != nil {
		t.Fatalf("-gpu given but: %v", err)
	}
	t.Cleanup(func() { b.Close() })
	b.SetCheckPointers(true) // DESIGN invariant 1, checked on every launch
	return b
}

// TestCUDAMultiProcess runs the whole API on the CUDA backend with 1, 2 and
// 4 processes sharing the GPU (peers' windows mapped through CUDA IPC),
// launched like `eprun launch` and, for 4, by mpirun, and checks every
// output bit for bit against the host backend on the same inputs (the
// multi-process cases: blocking and capacity with drops, bf16 and fp32,
// padded and not, ragged and empty ranks). Every launch checks that its
// pointers are device memory (GOEP_DEBUG_POINTERS).
//
// With -gpu.spread G (a multi-GPU host) process r runs on GPU r mod G
// (GOEP_DEVICE, which launcher.Bootstrap sets to the local rank, mod G),
// so the windows are mapped across GPUs and the pushes cross NVLink. The
// worlds are those of 1, 2, 4 and 8 processes that fit in G GPUs, one
// each, and 2G processes (when at most 8), two on each GPU: every
// process then maps one peer's windows on its own GPU and the others'
// across NVLink.
func TestCUDAMultiProcess(t *testing.T) {
	needGPU(t)
	worlds, env := []int{1, 2, 4}, []string{"GOEP_MP_BACKEND=cuda", "GOEP_DEBUG_POINTERS=1"}
	if *gpuSpread > 0 {
		worlds = slices.DeleteFunc([]int{1, 2, 4, 8}, func(n int) bool { return n > *gpuSpread })
		if n := 2 * *gpuSpread; n <= 8 {
			worlds = append(worlds, n)
		}
		env = append(env, "GOEP_MP_GPU=local", fmt.Sprintf("GOEP_MP_GPUS=%d", *gpuSpread))
	}
	for _, n := range worlds {
		hows := []string{"spawn"}
		if n >= 4 {
			hows = append(hows, "mpirun")
		}
		want := inProcessDigestsN(t, n)
		for _, how := range hows {
			t.Run(fmt.Sprintf("ranks=%d/%s", n, how), func(t *testing.T) {
				got, lerr, log := runWorldN(t, how, "cases", n, 4*time.Minute, env...)
				compareDigests(t, want, reportedDigests(t, got, lerr, log), "on CUDA", "on the host")
			})
		}
	}
}

// TestCUDAShareKinds runs the multi-process cases with the domain's GPU
// windows shared as VMM allocations: exported as file descriptors (which
// every Linux GPU host has), and asked as fabric handles, which a GPU
// without a multi-node NVLink fabric refuses (the domain then falls back to
// CUDA IPC and says why). Outputs must be the host backend's, bit for bit.
func TestCUDAShareKinds(t *testing.T) {
	needGPU(t)
	needPidfdGetfd(t)
	want := inProcessDigestsN(t, 2)
	for _, kind := range []string{"fd", "fabric"} {
		t.Run(kind, func(t *testing.T) {
			got, lerr, log := runWorldN(t, "spawn", "cases", 2, 4*time.Minute,
				"GOEP_MP_BACKEND=cuda", "GOEP_DEBUG_POINTERS=1", "GOEP_GPU_SHARE="+kind, "GOEP_LOG_LEVEL=debug")
			compareDigests(t, want, reportedDigests(t, got, lerr, log), "on CUDA ("+kind+")", "on the host")
			used := regexp.MustCompile(`"share": "(\w+)"`).FindAllStringSubmatch(log, -1)
			if len(used) == 0 {
				t.Fatalf("no GPU windows logged at debug level:\n%s", log)
			}
			for _, u := range used {
				switch {
				case u[1] == kind:
				case kind == "fabric" && u[1] == "ipc" && strings.Contains(log, "fabric handles refused on rank"):
				default:
					t.Fatalf("GOEP_GPU_SHARE=%s: windows shared as %s", kind, u[1])
				}
			}
			if kind == "fabric" {
				if i := strings.Index(log, "fabric handles refused on rank"); i >= 0 {
					t.Logf("fallback: %s", log[i:i+strings.IndexByte(log[i:], '\n')])
				}
			}
		})
	}
}

// TestCUDAFabricDomain emulates two trays of an NVL72 rack on one GPU
// host: four processes on two fake hosts, every GPU in one fake NVLink
// fabric clique. They form one domain across the hosts: no host exchange
// (every call and the layout on the GPU's flags), windows shared as VMM
// allocations. Fabric handles, which a GPU without a multi-node fabric
// refuses, fail the engine with the driver's reason on every rank; file
// descriptors (valid here, the "hosts" being one) run every data call,
// bit for bit against the host backend.
func TestCUDAFabricDomain(t *testing.T) {
	needGPU(t)
	env := []string{"GOEP_MP_BACKEND=cuda", "GOEP_MP_FAKE_TRAYS=2", "GOEP_LOG_LEVEL=debug"}
	t.Run("fd", func(t *testing.T) {
		needPidfdGetfd(t)
		want := inProcessDigestsN(t, 4)
		got, lerr, log := runWorldN(t, "spawn", "cases", 4, 4*time.Minute, append(env, "GOEP_GPU_SHARE=fd", "GOEP_DEBUG_POINTERS=1")...)
		compareDigests(t, want, reportedDigests(t, got, lerr, log), "on one CUDA domain across fake hosts", "on the host")
		for _, s := range []string{`"across_hosts": "domain 0 (ranks 0-3) holds ranks of fake-tray0 and fake-tray1"`, `"share": "fd"`} {
			if !strings.Contains(log, s) {
				t.Errorf("the log does not say %s:\n%s", s, log)
			}
		}
	})
	t.Run("fabric", func(t *testing.T) {
		got, _, log := runWorldN(t, "spawn", "cases", 4, 4*time.Minute, env...)
		if len(got) != 4 {
			t.Fatalf("%d ranks reported, want 4:\n%s", len(got), log)
		}
		for _, r := range got {
			switch {
			case r.Err == "":
				t.Logf("rank %d: fabric handles worked (a GPU in a real NVLink fabric)", r.Rank)
			case !strings.Contains(r.Err, "the domain spans hosts, and fabric handles were refused on rank"):
				t.Errorf("rank %d: %s; want the fabric refusal", r.Rank, r.Err)
			default:
				t.Logf("rank %d: %s", r.Rank, r.Err)
			}
		}
	})
}

// needPidfdGetfd skips a test whose processes take each other's file
// descriptors (GPU windows shared as VMM file descriptors) where the
// kernel does not let them: pidfd_getfd needs ptrace access, which Yama
// (kernel.yama.ptrace_scope above 0) gives sibling processes of a user
// only with CAP_SYS_PTRACE (root here).
func needPidfdGetfd(t *testing.T) {
	t.Helper()
	scope, err := os.ReadFile("/proc/sys/kernel/yama/ptrace_scope")
	if err != nil || strings.TrimSpace(string(scope)) == "0" {
		return
	}
	if s := strings.TrimSpace(string(scope)); s == "3" || os.Geteuid() != 0 {
		t.Skipf("kernel.yama.ptrace_scope %s: processes cannot take each other's descriptors (pidfd_getfd)", s)
	}
}

// TestCUDALifetimePoison is the failure HybridEP's users reported (kernels
// reading a pinned host tensor the allocator had already recycled) as a
// test of DESIGN.md invariant 2: a long kernel holds the stream, the caller queues dispatch, permute,
// unpermute and combine behind it, drops the handle, the inputs and the
// intermediates, forces garbage collection, allocates pinned host memory
// and device memory and scribbles over it; the queued results must still
// be exactly those of an undisturbed run.
func TestCUDALifetimePoison(t *testing.T) {
	b := needGPU(t)
	for _, mode := range []executor.Mode{executor.Blocking, executor.Capacity} {
		t.Run(fmt.Sprint(mode), func(t *testing.T) {
			ctx := t.Context()
			cfg := executor.Config{NumExperts: 16, TopK: 4, Hidden: 7168, MaxTokensPerRank: 1024, PadMultiple: 16,
				Mode: mode, MaxRecvTokens: 1024, MaxPermutedTokens: 4096 + 16*16}
			g := comm.NewLocal(1)[0]
			e, err := executor.New(ctx, g, b, cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer e.Close()
			rng := rand.New(rand.NewPCG(756, 1))
			T, K := 1024, cfg.TopK
			idx := make([]int32, T*K)
			for i := range T {
				for k, x := range rng.Perm(cfg.NumExperts)[:K] {
					idx[i*K+k] = int32(x)
				}
			}
			xs := make([]float32, T*cfg.Hidden)
			for i := range xs {
				xs[i] = float32(rng.NormFloat64())
			}
			ws := make([]float32, T*K)
			for i := range ws {
				ws[i] = rng.Float32()
			}
			run := func(hold bool) (px, u, c []byte) {
				put := func(dt device.DType, data []byte, shape ...int) *device.Tensor {
					tt, err := e.NewTensor(dt, shape...)
					if err == nil {
						err = device.Upload(ctx, tt, data)
					}
					if err != nil {
						t.Fatal(err)
					}
					return tt
				}
				ti := put(device.Int32, device.EncodeInt32(idx), T, K)
				xt := put(device.BF16, device.EncodeFloat32(device.BF16, xs), T, cfg.Hidden)
				wt := put(device.FP32, device.EncodeFloat32(device.FP32, ws), T, K)
				h, err := e.Layout(ctx, executor.LayoutInput{TopkIdx: ti})
				if err != nil {
					t.Fatal(err)
				}
				if hold {
					if err := e.HoldStream(300 * time.Millisecond); err != nil {
						t.Fatal(err)
					}
				}
				d, err := e.Dispatch(ctx, h, executor.DispatchInput{X: xt, TopkWeights: wt})
				if err != nil {
					t.Fatal(err)
				}
				p, err := e.Permute(ctx, h, executor.PermuteInput{RecvX: d.RecvX, RecvWeights: d.RecvWeights})
				if err != nil {
					t.Fatal(err)
				}
				ut, err := e.Unpermute(ctx, h, executor.UnpermuteInput{Y: p.X, RecvWeights: d.RecvWeights})
				if err != nil {
					t.Fatal(err)
				}
				ct, err := e.Combine(ctx, h, executor.CombineInput{Z: ut})
				if err != nil {
					t.Fatal(err)
				}
				if hold {
					// Drop everything but the results while the work is queued.
					h.Close()
					ti.Close()
					xt.Close()
					wt.Close()
					d.Close()
					p.Weights.Close()
					d, h, ti, xt, wt = executor.DispatchOutput{}, nil, nil, nil, nil
					for range 3 {
						runtime.GC()
					}
					scribble(t, b)
				}
				var outs [][]byte
				for _, tt := range []*device.Tensor{p.X, ut, ct} {
					raw, err := device.Download(ctx, tt)
					if err != nil {
						t.Fatal(err)
					}
					outs = append(outs, raw)
				}
				if err := e.Synchronize(ctx); err != nil {
					t.Fatal(err)
				}
				return outs[0], outs[1], outs[2]
			}
			wantP, wantU, wantC := run(false)
			gotP, gotU, gotC := run(true)
			for _, c := range []struct {
				name      string
				got, want []byte
			}{{"permute", gotP, wantP}, {"unpermute", gotU, wantU}, {"combine", gotC, wantC}} {
				if !bytes.Equal(c.got, c.want) {
					t.Errorf("%s: results differ after the caller dropped its tensors behind a busy stream", c.name)
				}
			}
		})
	}
}

// scribble allocates device memory on another stream and pinned host
// memory, and fills both with garbage.
func scribble(t *testing.T, b *device.CUDA) {
	t.Helper()
	s, err := b.NewCUDAStream()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	for range 16 {
		buf, err := s.Alloc(32 << 20)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Memset(buf, 0, buf.Size(), 0xa5); err != nil {
			t.Fatal(err)
		}
		// UploadBuffer stages through freshly pinned host memory.
		if err := s.UploadBuffer(ctx, buf, bytes.Repeat([]byte{0x5a}, 1<<20)); err != nil {
			t.Fatal(err)
		}
	}
}

func init() { extraModes["graph"] = graphPipeline }

// graphSeeds are the routings a graph is replayed with.
var graphSeeds = []uint64{11, 12, 13, 14}

// graphPipeline runs DispatchPermuteInto and UnpermuteCombineInto in
// capacity mode (OverflowDrop), and DispatchPermuteInto of the same rows'
// bytes as fp8 with scales, on one handle and one set of outputs for
// each of graphSeeds' routings, changed with Relayout and new input data
// uploaded in place. On the CUDA backend the two calls are captured into a
// CUDA graph once and the graph is replayed; on the host backend they are
// called directly. It returns digests of every output for each routing.
func graphPipeline(ctx context.Context, g comm.Group, b device.Backend) ([]map[string]string, error) {
	return graphPipelineWith(ctx, g, b, false)
}

func init() { extraModes["graph-relayout"] = graphRelayoutPipeline }

// graphRelayoutPipeline is graphPipeline with the Relayout captured into
// the graph too (on the CUDA backend), so that each replay lays out the
// routing uploaded into the handle's TopkIdx tensor. After the seeds'
// routings, a routing with an expert out of range on the last rank: the
// replay's error (the eager Relayout's on the host backend) is recorded
// as "routing", and a replay of graphSeeds' first routing must give its
// results again (recorded as one more entry).
func graphRelayoutPipeline(ctx context.Context, g comm.Group, b device.Backend) ([]map[string]string, error) {
	return graphPipelineWith(ctx, g, b, true)
}

func graphPipelineWith(ctx context.Context, g comm.Group, b device.Backend, relayoutInGraph bool) ([]map[string]string, error) {
	R := g.Size()
	cfg := executor.Config{NumExperts: 4 * R, TopK: 4, Hidden: 1152, MaxTokensPerRank: 64, PadMultiple: 8,
		Mode: executor.Capacity, Overflow: executor.OverflowDrop, MaxRecvTokens: 100, MaxPermutedTokens: 300}
	e, err := executor.New(ctx, g, b, cfg)
	if err != nil {
		return nil, err
	}
	defer e.Close()
	const T = 64
	K, H := cfg.TopK, cfg.Hidden
	S := H / device.FP8ScaleChannels
	ti, err1 := e.NewTensor(device.Int32, T, K)
	xt, err2 := e.NewTensor(device.BF16, T, H)
	wt, err3 := e.NewTensor(device.FP32, T, K)
	x8, err4 := e.NewTensor(device.FP8E4M3, T, H)
	s8, err5 := e.NewTensor(device.FP32, T, S)
	if err := errors.Join(err1, err2, err3, err4, err5); err != nil {
		return nil, err
	}
	var h *executor.Handle
	var dp, dp8 executor.DispatchPermuteOutput
	var out *device.Tensor
	var graph *device.Graph
	cs, _ := e.Stream().(*device.CUDAStream)
	var digests []map[string]string
	seeds := graphSeeds
	const badSeed = 0 // graphSeeds' routings, then an expert out of range on the last rank
	if relayoutInGraph {
		seeds = append(append(slices.Clone(graphSeeds), badSeed), graphSeeds[0])
	}
	for i, seed := range seeds {
		inputs := seed
		if seed == badSeed { // the first routing, then broken below
			inputs = graphSeeds[0]
		}
		idx, x, w := graphInputs(inputs, g.Rank(), cfg, T)
		if seed == badSeed && g.Rank() == R-1 {
			idx[5] = int32(cfg.NumExperts + 3)
		}
		scales := make([]float32, T*S)
		for j := range scales {
			scales[j] = float32(j%13+1) * float32(seed)
		}
		if err := errors.Join(device.Upload(ctx, ti, device.EncodeInt32(idx)), device.Upload(ctx, xt, x),
			device.Upload(ctx, wt, device.EncodeFloat32(device.FP32, w)), device.Upload(ctx, x8, x[:T*H]),
			device.Upload(ctx, s8, device.EncodeFloat32(device.FP32, scales))); err != nil {
			return nil, err
		}
		if i == 0 {
			if h, err = e.Layout(ctx, executor.LayoutInput{TopkIdx: ti}); err != nil {
				return nil, err
			}
			ts := make([]*device.Tensor, 8)
			for j, s := range []struct {
				dt    device.DType
				shape []int
			}{{device.BF16, []int{h.PermutedRows(), H}}, {device.FP32, []int{h.PermutedRows()}},
				{device.Int32, []int{h.RecvRows(), K}}, {device.FP32, []int{h.RecvRows(), K}}, {device.BF16, []int{T, H}},
				{device.FP8E4M3, []int{h.PermutedRows(), H}}, {device.Int32, []int{h.RecvRows(), K}}, {device.FP32, []int{h.PermutedRows(), S}}} {
				if ts[j], err = e.NewTensor(s.dt, s.shape...); err != nil {
					return nil, err
				}
			}
			dp = executor.DispatchPermuteOutput{X: ts[0], Weights: ts[1], RecvIdx: ts[2], RecvWeights: ts[3]}
			out = ts[4]
			dp8 = executor.DispatchPermuteOutput{X: ts[5], RecvIdx: ts[6], Scales: ts[7]}
		} else if cs == nil || !relayoutInGraph {
			err := e.Relayout(ctx, h, executor.LayoutInput{TopkIdx: ti})
			if seed == badSeed {
				// In capacity mode the error may come with the
				// Relayout or at the Synchronize after it.
				if err == nil {
					err = e.Synchronize(ctx)
				}
				digests = append(digests, map[string]string{"routing": routingFailure(err)})
				continue
			}
			if err != nil {
				return nil, err
			}
		}
		calls := func() error {
			if relayoutInGraph && cs != nil {
				if err := e.Relayout(ctx, h, executor.LayoutInput{TopkIdx: ti}); err != nil {
					return err
				}
			}
			if err := e.DispatchPermuteInto(ctx, h, executor.DispatchInput{X: xt, TopkWeights: wt}, dp); err != nil {
				return err
			}
			if err := e.UnpermuteCombineInto(ctx, h, executor.UnpermuteInput{Y: dp.X, RecvWeights: dp.RecvWeights}, out); err != nil {
				return err
			}
			return e.DispatchPermuteInto(ctx, h, executor.DispatchInput{X: x8, XScales: s8}, dp8)
		}
		switch {
		case cs == nil:
			err = calls()
		case graph == nil:
			if err = cs.BeginCapture(); err != nil {
				return nil, err
			}
			cerr := calls()
			graph, err = cs.EndCapture()
			if err = errors.Join(cerr, err); err != nil {
				return nil, err
			}
			defer graph.Close()
			fallthrough
		default:
			err = graph.Launch(cs)
		}
		if err != nil {
			return nil, err
		}
		if err := e.Synchronize(ctx); seed == badSeed {
			digests = append(digests, map[string]string{"routing": routingFailure(err)})
			continue
		} else if err != nil {
			return nil, fmt.Errorf("seed %d: %w", seed, err)
		}
		d := map[string]string{}
		for name, tt := range map[string]*device.Tensor{"x": dp.X, "w": dp.Weights, "idx": dp.RecvIdx, "recvw": dp.RecvWeights,
			"combine": out, "counts": h.DeviceCounts(), "fp8.x": dp8.X, "fp8.idx": dp8.RecvIdx, "fp8.scales": dp8.Scales} {
			raw, err := device.Download(ctx, tt)
			if err != nil {
				return nil, err
			}
			sum := sha256.Sum256(raw)
			d[name] = hex.EncodeToString(sum[:8])
		}
		digests = append(digests, d)
	}
	return digests, nil
}

// routingFailure describes a layout's failure for comparison across
// backends: whether it is ErrInvalidInput, and the routing error's text
// (without what wraps it).
func routingFailure(err error) string {
	if err == nil {
		return "no error"
	}
	msg := err.Error()
	if i := strings.Index(msg, "executor: routing of"); i >= 0 {
		msg = msg[i:]
	}
	return fmt.Sprintf("invalid input %v: %s", errors.Is(err, executor.ErrInvalidInput), msg)
}

// graphInputs builds rank r's routing (up to K distinct experts a token,
// some slots empty), bf16 tokens and weights for T tokens.
func graphInputs(seed uint64, r int, cfg executor.Config, T int) (idx []int32, x []byte, w []float32) {
	rng := rand.New(rand.NewPCG(seed, uint64(r)+2000))
	return executor.RandomInputs(rng, T, cfg.TopK, cfg.NumExperts, cfg.Hidden, device.BF16)
}

// TestCUDAGraph captures a capacity-mode DispatchPermuteInto and
// UnpermuteCombineInto, and an fp8 DispatchPermuteInto with its scales,
// into a CUDA graph on every rank (1 and 2 processes
// sharing the GPU), replays it after Relayout with new routing and new
// data, and checks every output bit for bit against the host backend's
// direct calls.
func TestCUDAGraph(t *testing.T) { testGraph(t, "graph", graphPipeline) }

// TestCUDAGraphRelayout is TestCUDAGraph with the Relayout in the graph
// (graphRelayoutPipeline): the replays follow the routing in TopkIdx's
// memory, bit for bit the host backend's eager Relayouts and calls; a
// replay of an invalid routing reports the eager Relayout's error at
// Synchronize, and the next replay is right again.
func TestCUDAGraphRelayout(t *testing.T) { testGraph(t, "graph-relayout", graphRelayoutPipeline) }

func testGraph(t *testing.T, mode string, pipeline func(context.Context, comm.Group, device.Backend) ([]map[string]string, error)) {
	needGPU(t)
	for _, n := range []int{1, 2} {
		t.Run(fmt.Sprintf("ranks=%d", n), func(t *testing.T) {
			gs := comm.NewLocal(n)
			want := make([][]map[string]string, n)
			errs := ranktest.Run(n, func(r int) (err error) {
				want[r], err = pipeline(t.Context(), gs[r], device.NewHost())
				return err
			})
			if err := ranktest.Err(errs); err != nil {
				t.Fatal(err)
			}
			got, lerr, log := runWorldN(t, "spawn", mode, n, 3*time.Minute, "GOEP_MP_BACKEND=cuda", "GOEP_DEBUG_POINTERS=1")
			if lerr != nil {
				t.Fatalf("launcher: %v\n%s", lerr, log)
			}
			for r := range n {
				if got[r].Err != "" {
					t.Fatalf("rank %d: %s\n%s", r, got[r].Err, log)
				}
				if len(got[r].Digests) != len(want[r]) {
					t.Fatalf("rank %d: %d replays recorded, want %d", r, len(got[r].Digests), len(want[r]))
				}
				for i := range want[r] {
					for name, w := range want[r][i] {
						if g := got[r].Digests[i][name]; g != w {
							t.Errorf("replay %d rank %d %s: %s from the replayed graph, %s on the host", i, r, name, g, w)
						}
					}
				}
			}
		})
	}
}

func init() { extraModes["gpu-faults"] = gpuFaults }

// gpuFaults runs, on every rank: a layout whose input rank 1 rejects on
// the host, a layout of routing with an expert out of range on rank 1
// (found on the GPU by every rank), a dispatch whose input rank 1 rejects
// on the host; a good dispatch (the engine must be usable again); a
// dispatch of fp32 rows on rank 1 and bf16 elsewhere, then a good one;
// such a
// rejected dispatch again, followed at once by a layout (which must work
// on every rank, the rejection being reported by the next Synchronize) and
// a good dispatch; abandonSteps (calls that fail on rank 1, its input or
// output freed); then a dispatch that rank 1 joins only after the others'
// 2 s deadline. It reports what each step returned.
func gpuFaults(ctx context.Context, g comm.Group, b device.Backend) ([]map[string]string, error) {
	R := g.Size()
	cfg := executor.Config{NumExperts: 4 * R, TopK: 2, Hidden: 64, MaxTokensPerRank: 16, Timeout: 2 * time.Second}
	e, err := executor.New(ctx, g, b, cfg)
	if err != nil {
		return nil, err
	}
	defer e.Close()
	idx, ti, xt, bad, err := faultInputs(ctx, e, 5, g.Rank(), cfg)
	if err != nil {
		return nil, err
	}
	badIdx, err4 := e.NewTensor(device.Int32, 16, 3)
	wrong := slices.Clone(idx)
	wrong[1] = int32(cfg.NumExperts) // token 0, slot 1
	tw, err5 := e.NewTensor(device.Int32, 16, 2)
	if err := errors.Join(err4, err5, device.Upload(ctx, tw, device.EncodeInt32(wrong))); err != nil {
		return nil, err
	}
	res := map[string]string{}
	li, ri := ti, ti
	if g.Rank() == 1 {
		li, ri = badIdx, tw
	}
	_, err = e.Layout(ctx, executor.LayoutInput{TopkIdx: li})
	res["layout.reject"] = errText(err)
	_, err = e.Layout(ctx, executor.LayoutInput{TopkIdx: ri})
	res["layout.routing"] = errText(err)
	h, err := e.Layout(ctx, executor.LayoutInput{TopkIdx: ti})
	if err != nil {
		return nil, err
	}
	in := xt
	if g.Rank() == 1 {
		in = bad
	}
	_, err = e.Dispatch(ctx, h, executor.DispatchInput{X: in})
	res["reject.call"] = errText(err)
	res["reject.sync"] = errText(e.Synchronize(ctx))
	_, err = e.Dispatch(ctx, h, executor.DispatchInput{X: xt})
	res["after"] = errText(errors.Join(err, e.Synchronize(ctx)))
	// Rank 1 dispatches fp32 rows where its peers dispatch bf16: the
	// arrive flags carry the dtype, so every rank fails the call, and the
	// engine works after.
	x32 := xt
	if g.Rank() == 1 {
		if x32, err = e.NewTensor(device.FP32, 16, cfg.Hidden); err != nil {
			return nil, err
		}
		clear(x32.Bytes())
	}
	_, err = e.Dispatch(ctx, h, executor.DispatchInput{X: x32})
	res["dtype"] = errText(errors.Join(err, e.Synchronize(ctx)))
	_, err = e.Dispatch(ctx, h, executor.DispatchInput{X: xt})
	res["dtype.after"] = errText(errors.Join(err, e.Synchronize(ctx)))
	// A layout right after a rejected dispatch, before any Synchronize:
	// it works on every rank (none may go on with a handle its peers
	// lack), and the next Synchronize reports the rejection.
	_, err = e.Dispatch(ctx, h, executor.DispatchInput{X: in})
	if g.Rank() != 1 && err != nil {
		return nil, err
	}
	h2, err := e.Layout(ctx, executor.LayoutInput{TopkIdx: ti})
	if err == nil {
		h2.Close()
	}
	res["stale.layout"] = errText(err)
	_, err = e.Dispatch(ctx, h, executor.DispatchInput{X: xt})
	res["stale.after"] = errText(errors.Join(err, e.Synchronize(ctx)))
	if err := abandonSteps(ctx, e, h, b, g.Rank(), ti, xt, res); err != nil {
		return nil, err
	}
	if g.Rank() == 1 {
		time.Sleep(4 * time.Second)
	}
	start := time.Now()
	_, err = e.Dispatch(ctx, h, executor.DispatchInput{X: xt})
	res["timeout"] = errText(errors.Join(err, e.Synchronize(ctx)))
	res["timeout.after"] = time.Since(start).Round(100 * time.Millisecond).String()
	return []map[string]string{res}, nil
}

// faultInputs are the fault tests' tensors for 16 tokens of cfg (TopK 2,
// Hidden 64): the routing of graphInputs(seed, rank) and its tensor, x,
// and an x of the wrong width.
func faultInputs(ctx context.Context, e *executor.Engine, seed uint64, rank int, cfg executor.Config) (idx []int32, ti, xt, bad *device.Tensor, err error) {
	idx, x, _ := graphInputs(seed, rank, cfg, 16)
	ti, err1 := e.NewTensor(device.Int32, 16, 2)
	xt, err2 := e.NewTensor(device.BF16, 16, 64)
	bad, err3 := e.NewTensor(device.BF16, 16, 32)
	if err := errors.Join(err1, err2, err3); err != nil {
		return nil, nil, nil, nil, err
	}
	err = errors.Join(device.Upload(ctx, ti, device.EncodeInt32(idx)), device.Upload(ctx, xt, x))
	return idx, ti, xt, bad, err
}

// freedTensor returns a tensor of the given shape over device memory that
// its owner has freed (a plain cuMemAlloc, wrapped as a framework's tensor
// would be, then freed): a launch that receives it fails GOEP_DEBUG_POINTERS's
// check after its call has begun, which is how the fault tests make a
// launch fail on one rank.
func freedTensor(b device.Backend, dt device.DType, shape ...int) (*device.Tensor, error) {
	cb, ok := b.(*device.CUDA)
	if !ok {
		return nil, fmt.Errorf("freedTensor: backend %T, want *device.CUDA", b)
	}
	n := dt.Size()
	for _, d := range shape {
		n *= d
	}
	raw, _, err := cb.AllocShared(n)
	if err != nil {
		return nil, err
	}
	ext, err := cb.WrapDeviceMemory(raw.DevicePtr(), n)
	if err != nil {
		return nil, errors.Join(err, cb.FreeShared(raw))
	}
	if err := cb.FreeShared(raw); err != nil {
		return nil, err
	}
	// The address must be dead now, or the launch would not fail.
	if _, err := cb.WrapDeviceMemory(raw.DevicePtr(), n); err == nil {
		return nil, fmt.Errorf("freedTensor: %#x is still device memory after its free", raw.DevicePtr())
	}
	return device.TensorOf(ext, dt, shape...)
}

// abandonSteps runs, with rank 1's input in freed memory (freedTensor), a
// layout, a dispatch and a combine that fail on rank 1: a launch after the
// call has begun (rank 1 abandons the call), or, for the layout with
// several domains (on the host), the download of the routing before it
// (rank 1 rejects the call). Its peers fail the call at once, naming rank
// 1, instead of at their timeout, and the calls after work (the engines
// and their epochs must be in step again). Then an unpermute-combine whose
// sum fails on rank 1 after its arrive (its output freed), and a
// dispatch-permute whose permute does. It records each step's result in
// res: "abandon.layout", "abandon.layout.after" (a good layout),
// "abandon.dispatch", "abandon.combine", "abandon.after" (a good dispatch
// and combine), "sum.unpermute", "sum.after", "permute.into",
// "permute.after".
func abandonSteps(ctx context.Context, e *executor.Engine, h *executor.Handle, b device.Backend, rank int, ti, xt *device.Tensor, res map[string]string) error {
	idx, err := freedOnRank1(b, rank, ti)
	if err != nil {
		return err
	}
	_, err = e.Layout(ctx, executor.LayoutInput{TopkIdx: idx})
	res["abandon.layout"] = errText(errors.Join(err, e.Synchronize(ctx)))
	h2, err := e.Layout(ctx, executor.LayoutInput{TopkIdx: ti})
	if err == nil {
		err = errors.Join(e.Synchronize(ctx), h2.Close())
	}
	res["abandon.layout.after"] = errText(err)
	x, err := freedOnRank1(b, rank, xt)
	if err != nil {
		return err
	}
	_, err = e.Dispatch(ctx, h, executor.DispatchInput{X: x})
	res["abandon.dispatch"] = errText(errors.Join(err, e.Synchronize(ctx)))
	out, err := e.Dispatch(ctx, h, executor.DispatchInput{X: xt})
	if err := errors.Join(err, e.Synchronize(ctx)); err != nil {
		return err
	}
	z, err := freedOnRank1(b, rank, out.RecvX)
	if err != nil {
		return err
	}
	_, err = e.Combine(ctx, h, executor.CombineInput{Z: z})
	res["abandon.combine"] = errText(errors.Join(err, e.Synchronize(ctx)))
	res["abandon.after"] = errText(goodPair(ctx, e, h, xt))
	// A call that fails on rank 1 after its arrive (the sum's launch, its
	// output freed): rank 1 still signals done, so its peers, which need
	// nothing more of it, complete the call and the next one.
	dp, err := e.DispatchPermute(ctx, h, executor.DispatchInput{X: xt})
	if err := errors.Join(err, e.Synchronize(ctx)); err != nil {
		return err
	}
	o, err := e.NewTensor(xt.DType(), xt.Shape()...)
	if err == nil {
		o, err = freedOnRank1(b, rank, o)
	}
	if err != nil {
		return err
	}
	err = e.UnpermuteCombineInto(ctx, h, executor.UnpermuteInput{Y: dp.X}, o)
	res["sum.unpermute"] = errText(errors.Join(err, e.Synchronize(ctx)))
	res["sum.after"] = errText(goodPair(ctx, e, h, xt))
	// The same for a dispatch-permute: its permute fails on rank 1 after
	// the arrive (its output X freed); done is still signalled.
	px, err1 := e.NewTensor(xt.DType(), h.PermutedRows(), xt.Shape()[1])
	pidx, err2 := e.NewTensor(device.Int32, h.RecvRows(), e.Config().TopK)
	if err := errors.Join(err1, err2); err != nil {
		return err
	}
	if px, err = freedOnRank1(b, rank, px); err != nil {
		return err
	}
	err = e.DispatchPermuteInto(ctx, h, executor.DispatchInput{X: xt}, executor.DispatchPermuteOutput{X: px, RecvIdx: pidx})
	res["permute.into"] = errText(errors.Join(err, e.Synchronize(ctx)))
	res["permute.after"] = errText(goodPair(ctx, e, h, xt))
	return nil
}

// freedOnRank1 is t on every rank but 1, which gets a tensor of t's dtype
// and shape in freed memory (freedTensor).
func freedOnRank1(b device.Backend, rank int, t *device.Tensor) (*device.Tensor, error) {
	if rank != 1 {
		return t, nil
	}
	return freedTensor(b, t.DType(), t.Shape()...)
}

// goodPair runs a dispatch of xt and a combine of what it received, and
// synchronizes: the calls that must work after a fault.
func goodPair(ctx context.Context, e *executor.Engine, h *executor.Handle, xt *device.Tensor) error {
	out, err := e.Dispatch(ctx, h, executor.DispatchInput{X: xt})
	if err != nil {
		return errors.Join(err, e.Synchronize(ctx))
	}
	_, err = e.Combine(ctx, h, executor.CombineInput{Z: out.RecvX})
	return errors.Join(err, e.Synchronize(ctx))
}

// checkAbandon checks what abandonSteps recorded on rank r: each failed
// step's error contains want(step) (rank 1's own: its failed check; its
// peers': the rank that told them, at once rather than at their timeout),
// and the calls after work.
func checkAbandon(t *testing.T, r int, d map[string]string, want func(step string) string) {
	t.Helper()
	for _, step := range []string{"abandon.layout", "abandon.dispatch", "abandon.combine"} {
		if w := want(step); !strings.Contains(d[step], w) {
			t.Errorf("rank %d %s with rank 1's input freed: %q, want %q", r, step, d[step], w)
		}
	}
	if d["abandon.layout.after"] != "nil" {
		t.Errorf("rank %d: layout after the failed one: %s", r, d["abandon.layout.after"])
	}
	if d["abandon.after"] != "nil" {
		t.Errorf("rank %d: dispatch and combine after the abandoned calls: %s", r, d["abandon.after"])
	}
	if su := d["sum.unpermute"]; r == 1 && !strings.Contains(su, "is not device memory") || r != 1 && su != "nil" {
		t.Errorf("rank %d unpermute-combine into rank 1's freed output: %q, want rank 1's pointer check and success elsewhere", r, su)
	}
	if d["sum.after"] != "nil" {
		t.Errorf("rank %d: dispatch and combine after that: %s", r, d["sum.after"])
	}
	if pi := d["permute.into"]; r == 1 && !strings.Contains(pi, "is not device memory") || r != 1 && pi != "nil" {
		t.Errorf("rank %d dispatch-permute into rank 1's freed output: %q, want rank 1's pointer check and success elsewhere", r, pi)
	}
	if d["permute.after"] != "nil" {
		t.Errorf("rank %d: dispatch and combine after that: %s", r, d["permute.after"])
	}
}

// TestCUDAFaults: with 3 processes on the GPU, a rank that rejects its
// input makes every peer's call fail with an error naming it (and the
// engine works again after), a rank whose launch fails after its call
// began (GOEP_DEBUG_POINTERS's check of freed memory) makes them fail at
// once, naming it, and a rank that does not come makes its
// peers' GPU waits time out after Config.Timeout with an error naming it.
func TestCUDAFaults(t *testing.T) {
	needGPU(t)
	got, lerr, log := runWorldN(t, "spawn", "gpu-faults", 3, 2*time.Minute, "GOEP_MP_BACKEND=cuda", "GOEP_DEBUG_POINTERS=1")
	for r, d := range reportedSteps(t, got, lerr, log) {
		if r == 1 {
			if !strings.Contains(d["layout.reject"], "TopkIdx") {
				t.Errorf("rank 1 layout with a bad TopkIdx: %q, want a shape error", d["layout.reject"])
			}
		} else if !strings.Contains(d["layout.reject"], "rank(s) [1] rejected") {
			t.Errorf("rank %d layout after rank 1 rejected its input: %q, want an error naming rank 1", r, d["layout.reject"])
		}
		if want := fmt.Sprintf("routing of rank 1, token 0, slot 1: expert %d out of range", 4*len(got)); !strings.Contains(d["layout.routing"], want) {
			t.Errorf("rank %d layout of a bad routing on rank 1: %q, want %q", r, d["layout.routing"], want)
		}
		if r == 1 {
			if !strings.Contains(d["reject.call"], "shape") {
				t.Errorf("rank 1 dispatch with a bad X: %q, want a shape error", d["reject.call"])
			}
		} else {
			if !strings.Contains(d["reject.sync"], "rank(s) [1] rejected") {
				t.Errorf("rank %d after rank 1 rejected its input: %q, want an error naming rank 1", r, d["reject.sync"])
			}
			if !strings.Contains(d["timeout"], "timed out") || !strings.Contains(d["timeout"], "[1]") {
				t.Errorf("rank %d waiting for a late rank 1: %q, want a timeout naming rank 1", r, d["timeout"])
			}
		}
		if d["stale.layout"] != "nil" {
			t.Errorf("rank %d layout after an unreported rejection: %q, want success on every rank", r, d["stale.layout"])
		}
		if r == 1 && d["stale.after"] != "nil" {
			t.Errorf("rank 1: dispatch after that layout: %s", d["stale.after"])
		}
		if r != 1 && !strings.Contains(d["stale.after"], "rank(s) [1] rejected") {
			t.Errorf("rank %d: synchronize after that layout: %q, want rank 1's earlier rejection", r, d["stale.after"])
		}
		if d["after"] != "nil" {
			t.Errorf("rank %d: dispatch after the rejected one: %s", r, d["after"])
		}
		if !strings.Contains(d["dtype"], "rows of another dtype") {
			t.Errorf("rank %d: dispatch of fp32 rows on rank 1 and bf16 elsewhere: %q, want a peer mismatch", r, d["dtype"])
		}
		if d["dtype.after"] != "nil" {
			t.Errorf("rank %d: dispatch after the dtype mismatch: %s", r, d["dtype.after"])
		}
		// Rank 1's launches fail the pointer check; abandon tells its
		// peers at once.
		checkAbandon(t, r, d, func(string) string {
			if r == 1 {
				return "is not device memory"
			}
			return "rank(s) [1] rejected"
		})
	}
}

// TestCUDAInterop runs an engine on a stream it did not create (WithStream
// over device.CUDA.WrapStream, as a framework's stream would be) with its
// input in memory it does not own (WrapDeviceMemory + TensorOf), and
// checks the dispatch and combine against an engine with its own stream
// and tensors. A host address is refused.
func TestCUDAInterop(t *testing.T) {
	b := needGPU(t)
	ctx := t.Context()
	cfg := executor.Config{NumExperts: 8, TopK: 2, Hidden: 256, MaxTokensPerRank: 64}
	idx, x, _ := graphInputs(7, 0, cfg, 64)
	run := func(wrap bool) ([]byte, []byte) {
		var opts []executor.Option
		if wrap {
			own, err := b.NewCUDAStream()
			if err != nil {
				t.Fatal(err)
			}
			defer own.Close()
			ws, err := b.WrapStream(own.Handle())
			if err != nil {
				t.Fatal(err)
			}
			defer ws.Close()
			opts = append(opts, executor.WithStream(ws))
		}
		e, err := executor.New(ctx, comm.NewLocal(1)[0], b, cfg, opts...)
		if err != nil {
			t.Fatal(err)
		}
		defer e.Close()
		ti, _ := e.NewTensor(device.Int32, 64, 2)
		if err := device.Upload(ctx, ti, device.EncodeInt32(idx)); err != nil {
			t.Fatal(err)
		}
		xt, _ := e.NewTensor(device.BF16, 64, 256)
		if wrap {
			// "Foreign" memory: a plain cuMemAlloc goep does not manage.
			raw, _, err := b.AllocShared(len(x))
			if err != nil {
				t.Fatal(err)
			}
			defer b.FreeShared(raw)
			ext, err := b.WrapDeviceMemory(raw.DevicePtr(), len(x))
			if err != nil {
				t.Fatal(err)
			}
			if xt, err = device.TensorOf(ext, device.BF16, 64, 256); err != nil {
				t.Fatal(err)
			}
		}
		if err := e.Stream().(*device.CUDAStream).UploadBuffer(ctx, xt.Buffer(), x); err != nil {
			t.Fatal(err)
		}
		h, err := e.Layout(ctx, executor.LayoutInput{TopkIdx: ti})
		if err != nil {
			t.Fatal(err)
		}
		d, err := e.Dispatch(ctx, h, executor.DispatchInput{X: xt})
		if err != nil {
			t.Fatal(err)
		}
		c, err := e.Combine(ctx, h, executor.CombineInput{Z: d.RecvX})
		if err != nil {
			t.Fatal(err)
		}
		dx, err1 := device.Download(ctx, d.RecvX)
		cx, err2 := device.Download(ctx, c)
		if err := errors.Join(err1, err2, e.Synchronize(ctx)); err != nil {
			t.Fatal(err)
		}
		return dx, cx
	}
	wd, wc := run(false)
	gd, gc := run(true)
	if !bytes.Equal(wd, gd) || !bytes.Equal(wc, gc) {
		t.Error("results on a wrapped stream with wrapped input differ from the engine's own")
	}
	host := make([]byte, 64)
	if _, err := b.WrapDeviceMemory(uint64(uintptr(unsafe.Pointer(&host[0]))), 64); err == nil {
		t.Error("WrapDeviceMemory accepted a host address")
	}
}

// TestCUDAUnaligned: a caller's device memory may start anywhere. fp8 rows
// at an odd address move byte by byte, with the results of aligned ones
// (the copy kernels once took a 1-byte unit for 2 bytes: twice the row,
// misaligned); a bf16 tensor at an odd address is refused on every rank
// (ErrInvalidInput), not faulted on.
func TestCUDAUnaligned(t *testing.T) {
	b := needGPU(t)
	ctx := t.Context()
	const T, H, K = 64, 256, 2
	cfg := executor.Config{NumExperts: 8, TopK: K, Hidden: H, MaxTokensPerRank: T}
	idx, _, _ := graphInputs(9, 0, cfg, T)
	x := make([]byte, T*H) // fp8 rows: distinct bytes, no NaN pattern needed (only moved)
	for i := range x {
		x[i] = byte(i*7 + i/H)
	}
	scales := device.EncodeFloat32(device.FP32, make([]float32, T*H/device.FP8ScaleChannels))
	e, err := executor.New(ctx, comm.NewLocal(1)[0], b, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	ti, _ := e.NewTensor(device.Int32, T, K)
	st, _ := e.NewTensor(device.FP32, T, H/device.FP8ScaleChannels)
	if err := errors.Join(device.Upload(ctx, ti, device.EncodeInt32(idx)), device.Upload(ctx, st, scales)); err != nil {
		t.Fatal(err)
	}
	h, err := e.Layout(ctx, executor.LayoutInput{TopkIdx: ti})
	if err != nil {
		t.Fatal(err)
	}
	raw, _, err := b.AllocShared(2*len(x) + 16)
	if err != nil {
		t.Fatal(err)
	}
	defer b.FreeShared(raw)
	dispatch := func(off int) ([]byte, error) {
		mem, err := b.WrapDeviceMemory(raw.DevicePtr()+uint64(off), len(x))
		if err != nil {
			return nil, err
		}
		xt, err := device.TensorOf(mem, device.FP8E4M3, T, H)
		if err != nil {
			return nil, err
		}
		if err := e.Stream().(*device.CUDAStream).UploadBuffer(ctx, mem, x); err != nil {
			return nil, err
		}
		d, err := e.Dispatch(ctx, h, executor.DispatchInput{X: xt, XScales: st})
		if err != nil {
			return nil, err
		}
		got, err := device.Download(ctx, d.RecvX)
		return got, errors.Join(err, e.Synchronize(ctx))
	}
	want, err := dispatch(0)
	if err != nil {
		t.Fatal(err)
	}
	got, err := dispatch(1)
	if err != nil {
		t.Fatalf("fp8 rows at an odd address: %v", err)
	}
	if !bytes.Equal(got, want) {
		t.Error("fp8 rows at an odd address: received rows differ from those at an aligned one")
	}
	mem, err := b.WrapDeviceMemory(raw.DevicePtr()+1, T*H*2)
	if err != nil {
		t.Fatal(err)
	}
	xb, err := device.TensorOf(mem, device.BF16, T, H)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.Dispatch(ctx, h, executor.DispatchInput{X: xb}); !errors.Is(err, executor.ErrInvalidInput) {
		t.Errorf("bf16 rows at an odd address: %v, want ErrInvalidInput", err)
	}
	if err := e.Synchronize(ctx); err != nil {
		t.Errorf("the engine after the refused call: %v", err)
	}
}

// TestCUDACaptureOverCapacity: capacity mode under OverflowError, a
// DispatchPermuteInto captured while its handle's layout is over capacity
// is recorded all the same (the CapacityError comes with the next
// Synchronize), so that a replay after a Relayout that fits gives the
// eager call's results. (The capture once recorded nothing, and the
// replays left the outputs as they were.)
func TestCUDACaptureOverCapacity(t *testing.T) {
	w := newCapacityWorld(t, 5)
	ctx, e := t.Context(), w.e
	if err := device.Upload(ctx, w.ti, capacityRouting(capT)); err != nil {
		t.Fatal(err)
	}
	h, err := e.Layout(ctx, executor.LayoutInput{TopkIdx: w.ti}) // 32 rows for a capacity of 16
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Synchronize(ctx); !errors.Is(err, executor.ErrCapacityExceeded) {
		t.Fatalf("layout over capacity: %v, want ErrCapacityExceeded", err)
	}
	px, dp := w.outputs(h)
	cs := e.Stream().(*device.CUDAStream)
	if err := cs.BeginCapture(); err != nil {
		t.Fatal(err)
	}
	cerr := e.DispatchPermuteInto(ctx, h, executor.DispatchInput{X: w.xt}, dp)
	graph, err := cs.EndCapture()
	if err = errors.Join(cerr, err); err != nil {
		t.Fatal(err)
	}
	defer graph.Close()
	if err := e.Synchronize(ctx); !errors.Is(err, executor.ErrCapacityExceeded) {
		t.Fatalf("capture over capacity: %v, want ErrCapacityExceeded", err)
	}
	if err := device.Upload(ctx, w.ti, capacityRouting(8)); err != nil { // 8 rows: fits
		t.Fatal(err)
	}
	if err := e.Relayout(ctx, h, executor.LayoutInput{TopkIdx: w.ti}); err != nil {
		t.Fatal(err)
	}
	if err := errors.Join(graph.Launch(cs), e.Synchronize(ctx)); err != nil {
		t.Fatalf("replay after a layout that fits: %v", err)
	}
	w.checkEager(t, px, "the replay of a call captured over capacity")
}

// TestCUDASynchronizeReadsBackFailuresOnly: a Synchronize reads the
// domain's status words and a captured layout's report back only when the
// GPU raised the alarm (a wait failed, a layout reported): after calls
// that succeeded, a captured Relayout's replay included, it makes no
// driver call beyond its stream's synchronize; after a replay over
// capacity it reads the report back and returns the CapacityError, and
// the next one is back to the stream's synchronize alone. (TestCUDAFaults
// covers the waits' failures.)
func TestCUDASynchronizeReadsBackFailuresOnly(t *testing.T) {
	w := newCapacityWorld(t, 3)
	ctx, e := t.Context(), w.e
	runtime.LockOSThread() // the driver calls of one thread, its context current
	defer runtime.UnlockOSThread()
	_, _, graph := w.captureRelayout(t)
	cs := e.Stream().(*device.CUDAStream)
	calls := func(what string, f func() error) uint64 {
		t.Helper()
		before := cuda.ReadCounts()
		if err := f(); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		return cuda.ReadCounts().Sub(before).Calls
	}
	// idle compares an idle engine's Synchronize with its stream's own,
	// each the second of two (the first may make the context current).
	idle := func(when string) {
		t.Helper()
		var sync, stream uint64
		for range 2 {
			stream = calls("stream synchronize", func() error { return cs.Synchronize(ctx) })
			sync = calls("synchronize "+when, func() error { return e.Synchronize(ctx) })
		}
		if sync > stream {
			t.Errorf("synchronize %s: %d driver calls, the stream's synchronize %d: it read the status back with no alarm raised", when, sync, stream)
		}
	}
	if err := errors.Join(graph.Launch(cs), e.Synchronize(ctx)); err != nil {
		t.Fatal(err)
	}
	idle("after a replay that fits")
	if err := device.Upload(ctx, w.ti, capacityRouting(capT)); err != nil { // 32 rows for a capacity of 16
		t.Fatal(err)
	}
	if err := errors.Join(graph.Launch(cs), e.Synchronize(ctx)); !errors.Is(err, executor.ErrCapacityExceeded) {
		t.Fatalf("replay over capacity: %v, want ErrCapacityExceeded", err)
	}
	idle("after the over-capacity replay was reported")
}

// capT, capH, capK are the capacity worlds' tokens, hidden size and top-k.
const capT, capH, capK = 32, 128, 2

// capacityWorld is the one-rank world of the capture-over-capacity tests:
// capacity mode under OverflowError (16 rows, 32 permuted rows), capT
// tokens of capH bf16 channels, top-2 of 4 experts; ti is the routing,
// xt the rows (byte i: i*mul plus its row).
type capacityWorld struct {
	e      *executor.Engine
	ti, xt *device.Tensor
}

func newCapacityWorld(t *testing.T, mul int) *capacityWorld {
	b := needGPU(t)
	ctx := t.Context()
	cfg := executor.Config{NumExperts: 4, TopK: capK, Hidden: capH, MaxTokensPerRank: capT, Mode: executor.Capacity,
		Overflow: executor.OverflowError, MaxRecvTokens: 16, MaxPermutedTokens: 32}
	e, err := executor.New(ctx, comm.NewLocal(1)[0], b, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	x := make([]byte, capT*capH*2)
	for i := range x {
		x[i] = byte(i*mul + i/(capH*2))
	}
	ti, _ := e.NewTensor(device.Int32, capT, capK)
	xt, _ := e.NewTensor(device.BF16, capT, capH)
	if err := device.Upload(ctx, xt, x); err != nil {
		t.Fatal(err)
	}
	return &capacityWorld{e: e, ti: ti, xt: xt}
}

// capacityRouting sends the first tokens to experts 0 and 1, the rest
// nowhere.
func capacityRouting(tokens int) []byte {
	idx := make([]int32, capT*capK)
	for i := range idx {
		idx[i] = -1
		if i/capK < tokens {
			idx[i] = int32(i % capK)
		}
	}
	return device.EncodeInt32(idx)
}

// outputs are a DispatchPermuteInto's outputs for h, and its X.
func (w *capacityWorld) outputs(h *executor.Handle) (*device.Tensor, executor.DispatchPermuteOutput) {
	px, _ := w.e.NewTensor(device.BF16, h.PermutedRows(), capH)
	idx, _ := w.e.NewTensor(device.Int32, h.RecvRows(), capK)
	return px, executor.DispatchPermuteOutput{X: px, RecvIdx: idx}
}

// captureRelayout lays out a routing of 8 rows (which fits) and captures
// a graph of a Relayout of the same routing tensor and a
// DispatchPermuteInto px; the graph is closed with the test.
func (w *capacityWorld) captureRelayout(t *testing.T) (*executor.Handle, *device.Tensor, *device.Graph) {
	t.Helper()
	ctx, e := t.Context(), w.e
	if err := device.Upload(ctx, w.ti, capacityRouting(8)); err != nil {
		t.Fatal(err)
	}
	h, err := e.Layout(ctx, executor.LayoutInput{TopkIdx: w.ti})
	if err != nil {
		t.Fatal(err)
	}
	px, dp := w.outputs(h)
	cs := e.Stream().(*device.CUDAStream)
	if err := cs.BeginCapture(); err != nil {
		t.Fatal(err)
	}
	cerr := errors.Join(e.Relayout(ctx, h, executor.LayoutInput{TopkIdx: w.ti}), e.DispatchPermuteInto(ctx, h, executor.DispatchInput{X: w.xt}, dp))
	graph, err := cs.EndCapture()
	if err = errors.Join(cerr, err); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { graph.Close() })
	return h, px, graph
}

// checkEager checks px against an eager DispatchPermute after a new
// layout of ti's routing.
func (w *capacityWorld) checkEager(t *testing.T, px *device.Tensor, what string) {
	ctx, e := t.Context(), w.e
	got, err := device.Download(ctx, px)
	if err != nil {
		t.Fatal(err)
	}
	h, err := e.Layout(ctx, executor.LayoutInput{TopkIdx: w.ti})
	if err != nil {
		t.Fatal(err)
	}
	ref, err := e.DispatchPermute(ctx, h, executor.DispatchInput{X: w.xt})
	if err != nil {
		t.Fatal(err)
	}
	want, err := device.Download(ctx, ref.X)
	if err = errors.Join(err, e.Synchronize(ctx)); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs from the eager call after the same layout", what)
	}
}

// TestCUDACapturedRelayoutOverCapacity: capacity mode under OverflowError,
// a Relayout captured into a graph with a DispatchPermuteInto: a replay
// whose routing passes the capacity makes the next Synchronize return the
// CapacityError (the device counts say how many rows and set the overflow
// flag); a replay whose routing fits is right again (the eager call's
// output after the same layout), and Synchronize returns nil.
func TestCUDACapturedRelayoutOverCapacity(t *testing.T) {
	w := newCapacityWorld(t, 7)
	ctx, e := t.Context(), w.e
	h, px, graph := w.captureRelayout(t)
	cs := e.Stream().(*device.CUDAStream)
	if err := e.Synchronize(ctx); err != nil {
		t.Fatalf("synchronize after the capture: %v", err)
	}
	if err := device.Upload(ctx, w.ti, capacityRouting(capT)); err != nil { // 32 rows for a capacity of 16
		t.Fatal(err)
	}
	err := errors.Join(graph.Launch(cs), e.Synchronize(ctx))
	var ce *executor.CapacityError
	if !errors.Is(err, executor.ErrCapacityExceeded) || !errors.As(err, &ce) || len(ce.RecvCounts) != 1 || ce.RecvCounts[0] != capT {
		t.Fatalf("replay over capacity: %v, want ErrCapacityExceeded with 32 rows received", err)
	}
	counts, err := h.Counts(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if counts.RecvCount != capT || !counts.Overflow {
		t.Errorf("counts after the replay over capacity: %+v, want 32 received and the overflow flag", counts)
	}
	if err := device.Upload(ctx, w.ti, capacityRouting(6)); err != nil { // 6 rows: fits
		t.Fatal(err)
	}
	if err := errors.Join(graph.Launch(cs), e.Synchronize(ctx)); err != nil {
		t.Fatalf("replay of a routing that fits: %v", err)
	}
	w.checkEager(t, px, "the replay after a Relayout in the graph")
}
