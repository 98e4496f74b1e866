//go:build cuda && cgo

package executor_test

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/goep/goep/comm"
	"github.com/goep/goep/device"
	"github.com/goep/goep/executor"
)

var gpuFlag = flag.Bool("gpu", false, "run the CUDA tests (needs a GPU)")

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
func TestCUDAMultiProcess(t *testing.T) {
	needGPU(t)
	for _, n := range []int{1, 2, 4} {
		hows := []string{"spawn"}
		if n == 4 {
			hows = append(hows, "mpirun")
		}
		want := inProcessDigestsN(t, n)
		for _, how := range hows {
			t.Run(fmt.Sprintf("ranks=%d/%s", n, how), func(t *testing.T) {
				got, lerr, log := runWorldN(t, how, "cases", n, 4*time.Minute, "GOEP_MP_BACKEND=cuda", "GOEP_DEBUG_POINTERS=1")
				if lerr != nil {
					t.Fatalf("launcher: %v\n%s", lerr, log)
				}
				for r := range n {
					if got[r].Err != "" {
						t.Fatalf("rank %d: %s\n%s", r, got[r].Err, log)
					}
					if len(got[r].Digests) != len(mpSeeds) {
						t.Fatalf("rank %d reported %d cases, want %d", r, len(got[r].Digests), len(mpSeeds))
					}
					for i, seed := range mpSeeds {
						checked := 0
						for name, w := range want[r][i] {
							if strings.HasPrefix(name, "unpermute-backward") {
								continue // no CUDA kernels yet
							}
							checked++
							if g := got[r].Digests[i][name]; g != w {
								t.Errorf("seed %d rank %d %s: %s on CUDA, %s on the host", seed, r, name, g, w)
							}
						}
						if checked < 12 {
							t.Errorf("seed %d rank %d: only %d outputs compared", seed, r, checked)
						}
					}
				}
			})
		}
	}
}

// TestCUDAIssue756 is HybridEP's issue 756 as a test (DESIGN.md invariant
// 2): a long kernel holds the stream, the caller queues dispatch, permute,
// unpermute and combine behind it, drops the handle, the inputs and the
// intermediates, forces garbage collection, allocates pinned host memory
// and device memory and scribbles over it; the queued results must still
// be exactly those of an undisturbed run.
func TestCUDAIssue756(t *testing.T) {
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
