//go:build ucx && cgo

package rdma_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/goep/goep/comm"
	"github.com/goep/goep/internal/ranktest"
	"github.com/goep/goep/internal/ucx"
	"github.com/goep/goep/launcher"
	"github.com/goep/goep/rdma"
)

// transports are the UCX settings the tests run with on one machine: TCP
// over the loopback interface (with UCX's peer failure detection) and
// shared memory (failure found by process checks).
var transports = map[string]rdma.Config{
	"tcp": {UCXOptions: []string{"TLS=tcp", "NET_DEVICES=lo"}},
	"sm":  {SharedMemory: true, UCXOptions: []string{"TLS=sm"}},
}

func transportConfig(t testing.TB, name string, send, recv int) rdma.Config {
	cfg, ok := transports[name]
	if !ok {
		panic(fmt.Sprintf("unknown transport %q", name))
	}
	cfg.SendBytes, cfg.RecvBytes = send, recv
	return cfg
}

// allToAll runs epochs first..last of a full exchange: every rank puts chunk bytes to
// every rank (itself included) at offset rank*chunk, signals the epoch,
// waits for everyone's signal and checks every byte it received.
func allToAll(ctx context.Context, g comm.Group, tr rdma.Transport, chunk int, first, last uint64) error {
	R, me := tr.Size(), tr.Rank()
	all := make([]int, R)
	for i := range all {
		all[i] = i
	}
	for e := first; e <= last; e++ {
		rdma.FillChunks(tr.SendBuffer(), me, R, chunk, e)
		// Odd epochs put whole chunks with the signal; even ones split the
		// chunk in two puts and signal separately, to check that a
		// signal-only descriptor is ordered after the puts before it.
		for i := range R {
			p := (me + i) % R
			for _, w := range rdma.ChunkWorks(me, p, chunk, e) {
				if err := tr.Put(ctx, w); err != nil {
					return fmt.Errorf("epoch %d: %w", e, err)
				}
			}
		}
		if err := tr.WaitAll(ctx, all, e); err != nil {
			return fmt.Errorf("epoch %d: %w", e, err)
		}
		if err := rdma.CheckChunks(tr.RecvBuffer(), me, R, chunk, e); err != nil {
			return err
		}
		// The send region is reused and peers overwrite the receive region
		// at the next epoch: flush, and wait until everyone has checked.
		if err := tr.Flush(ctx); err != nil {
			return fmt.Errorf("epoch %d: %w", e, err)
		}
		if err := g.Barrier(ctx); err != nil {
			return fmt.Errorf("epoch %d: %w", e, err)
		}
	}
	return nil
}

// inProcess runs f on R ranks in this process (comm.NewLocal), each with
// its own transport.
func inProcess(t *testing.T, R int, cfg rdma.Config, f func(ctx context.Context, g comm.Group, tr rdma.Transport) error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	gs := comm.NewLocal(R)
	errs := ranktest.Run(R, func(r int) error {
		defer gs[r].Close()
		tr, err := rdma.NewUCX(ctx, gs[r], cfg)
		if err != nil {
			return err
		}
		return errors.Join(f(ctx, gs[r], tr), tr.Close())
	})
	for r, err := range errs {
		if err != nil {
			t.Errorf("rank %d: %v", r, err)
		}
	}
}

func TestInProcessAllToAll(t *testing.T) {
	for name := range transports {
		t.Run(name, func(t *testing.T) {
			const R, chunk = 3, 24 << 10
			inProcess(t, R, transportConfig(t, name, R*chunk, R*chunk), func(ctx context.Context, g comm.Group, tr rdma.Transport) error {
				return allToAll(ctx, g, tr, chunk, 1, 4)
			})
		})
	}
}

// TestInProcessFeed: the device-fed descriptor ring (rdma.Feed) over UCX,
// on TCP and shared memory.
func TestInProcessFeed(t *testing.T) {
	for name := range transports {
		t.Run(name, func(t *testing.T) {
			const R, chunk = 3, 4 << 10
			inProcess(t, R, transportConfig(t, name, R*chunk, R*chunk), func(ctx context.Context, g comm.Group, tr rdma.Transport) error {
				return rdma.FeedRounds(ctx, g, tr, 20, chunk)
			})
		})
	}
}

// TestTimeout: rank 1 never signals; rank 0's wait must end at its deadline
// with a *comm.TimeoutError naming rank 1 (and not rank 0, which did).
func TestTimeout(t *testing.T) {
	inProcess(t, 2, transportConfig(t, "tcp", 64, 64), func(ctx context.Context, g comm.Group, tr rdma.Transport) error {
		if tr.Rank() == 0 {
			if err := tr.Put(ctx, rdma.Work{Peer: 0, Epoch: 1}); err != nil {
				return err
			}
			wctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
			defer cancel()
			start := time.Now()
			err := tr.WaitAll(wctx, []int{0, 1}, 1)
			var te *comm.TimeoutError
			if !errors.As(err, &te) || len(te.Missing) != 1 || te.Missing[0] != 1 || !errors.Is(err, comm.ErrTimeout) {
				return fmt.Errorf("wait: %v, want a timeout naming rank 1 alone", err)
			}
			if d := time.Since(start); d > 10*time.Second {
				return fmt.Errorf("timeout after %v", d)
			}
			// A canceled context is not a timeout.
			cctx, ccancel := context.WithCancel(ctx)
			ccancel()
			if err := tr.Wait(cctx, 1, 1); err == nil || errors.Is(err, comm.ErrTimeout) || !errors.Is(err, context.Canceled) {
				return fmt.Errorf("wait with a canceled context: %v", err)
			}
		}
		return g.Barrier(ctx)
	})
}

// TestBadWork: descriptors out of bounds are refused at Put; an epoch that
// does not grow fails the transport.
func TestBadWork(t *testing.T) {
	inProcess(t, 2, transportConfig(t, "sm", 64, 128), func(ctx context.Context, g comm.Group, tr rdma.Transport) error {
		for _, w := range []rdma.Work{
			{Peer: 2, Bytes: 8}, {Peer: 1, Bytes: 65}, {Peer: 1, RemoteOff: 121, Bytes: 8}, {Peer: 1}, {Peer: -1, Epoch: 1},
		} {
			if err := tr.Put(ctx, w); !errors.Is(err, rdma.ErrInvalidWork) {
				return fmt.Errorf("Put(%+v): %v, want ErrInvalidWork", w, err)
			}
		}
		if err := tr.Wait(ctx, 5, 1); !errors.Is(err, rdma.ErrInvalidWork) {
			return fmt.Errorf("Wait on rank 5: %v", err)
		}
		if err := g.Barrier(ctx); err != nil {
			return err
		}
		if tr.Rank() == 0 {
			for _, e := range []uint64{2, 2} {
				if err := tr.Put(ctx, rdma.Work{Peer: 1, Epoch: e}); err != nil {
					return err
				}
			}
			if err := tr.Flush(ctx); !errors.Is(err, rdma.ErrInvalidWork) {
				return fmt.Errorf("flush after a repeated epoch: %v, want ErrInvalidWork", err)
			}
		}
		return nil
	})
}

func TestClosed(t *testing.T) {
	g := comm.NewLocal(1)[0]
	defer g.Close()
	tr, err := rdma.NewUCX(t.Context(), g, transportConfig(t, "sm", 64, 64))
	if err != nil {
		t.Fatal(err)
	}
	// Whether the rail could use GPU memory is what this UCX says: the
	// memory types of its context (CUDA where UCX was built with it).
	gpu, why := rdma.GPUMemory(tr)
	t.Logf("GPUMemory: %v, %s", gpu, why)
	if !strings.Contains(why, "memory types: host") || gpu != strings.Contains(why, "cuda") {
		t.Errorf("GPUMemory = %v, %q: want the transport's memory types, host among them, and CUDA where it says so", gpu, why)
	}
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	if err := tr.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if err := tr.Put(t.Context(), rdma.Work{Peer: 0, Epoch: 1}); !errors.Is(err, rdma.ErrClosed) {
		t.Fatalf("Put after Close: %v", err)
	}
	if err := tr.Wait(t.Context(), 0, 1); !errors.Is(err, rdma.ErrClosed) {
		t.Fatalf("Wait after Close: %v", err)
	}
	if err := tr.Flush(t.Context()); !errors.Is(err, rdma.ErrClosed) {
		t.Fatalf("Flush after Close: %v", err)
	}
}

func TestMismatch(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	gs := comm.NewLocal(2)
	errs := ranktest.Run(2, func(r int) error {
		defer gs[r].Close()
		cfg := transportConfig(t, "tcp", 64, 64)
		cfg.SharedMemory = r == 1
		tr, err := rdma.NewUCX(ctx, gs[r], cfg)
		if err == nil {
			tr.Close()
		}
		return err
	})
	for r, err := range errs {
		if !errors.Is(err, rdma.ErrPeerMismatch) || !strings.Contains(err.Error(), "SharedMemory") {
			t.Errorf("rank %d: %v, want ErrPeerMismatch naming SharedMemory", r, err)
		}
	}
}

// Multi-process tests re-execute this test binary as the ranks of a world
// (launcher.Spawn, TCP rendezvous, as `eprun launch` does). Each child runs
// TestRDMAChild with GOEP_RDMA_MODE saying what to do and writes its report
// to GOEP_RDMA_OUT/rank-K.json.

const mpRanks = 4

// report is what a child writes.
type report struct {
	Rank    int
	Err     string `json:",omitempty"`
	Elapsed time.Duration
	Seconds float64 `json:",omitempty"` // bench: time of the timed loop; kill: time to the error
}

func TestRDMAChild(t *testing.T) {
	mode := os.Getenv("GOEP_RDMA_MODE")
	if mode == "" {
		t.Skip("runs only as a child process of the multi-process tests")
	}
	if mode == "kill" {
		// Outlive the launcher's SIGTERM (sent when rank 2 dies) long
		// enough to report what we saw.
		signal.Ignore(syscall.SIGTERM)
	}
	ctx := context.Background()
	g, env, err := launcher.Bootstrap(ctx)
	if err != nil {
		t.Fatalf("bootstrap: %v", err)
	}
	res := report{Rank: env.Rank}
	start := time.Now()
	err = child(ctx, g, mode, os.Getenv("GOEP_RDMA_TLS"), &res)
	if err != nil {
		res.Err = err.Error()
	}
	res.Elapsed = time.Since(start)
	raw, _ := json.Marshal(res)
	if err := os.WriteFile(filepath.Join(os.Getenv("GOEP_RDMA_OUT"), fmt.Sprintf("rank-%d.json", env.Rank)), raw, 0o644); err != nil {
		t.Fatal(err)
	}
	if mode == "kill" {
		time.Sleep(30 * time.Second) // the launcher kills us
	}
	g.Close()
}

func child(ctx context.Context, g comm.Group, mode, tls string, res *report) error {
	const chunk = 256 << 10
	cfg := transportConfig(nil, tls, g.Size()*chunk, g.Size()*chunk)
	if mode == "bench" {
		n, _ := strconv.Atoi(os.Getenv("GOEP_RDMA_BYTES"))
		cfg = transportConfig(nil, tls, 2*n, 2*n)
	}
	tctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	tr, err := rdma.NewUCX(tctx, g, cfg)
	if err != nil {
		return err
	}
	switch mode {
	case "alltoall":
		return errors.Join(allToAll(tctx, g, tr, chunk, 1, 5), tr.Close())
	case "kill":
		if err := allToAll(tctx, g, tr, chunk, 1, 1); err != nil {
			return err
		}
		if g.Rank() == 2 {
			syscall.Kill(os.Getpid(), syscall.SIGKILL)
		}
		died := time.Now()
		// Keep exchanging: the next epoch can never complete.
		wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		err := allToAll(wctx, g, tr, chunk, 2, 4)
		if err == nil {
			err = errors.New("no error after rank 2 died")
		}
		res.Seconds = time.Since(died).Seconds()
		return errors.Join(err, tr.Close())
	case "bench":
		iters, _ := strconv.Atoi(os.Getenv("GOEP_RDMA_ITERS"))
		secs, err := bench(tctx, g, tr, iters)
		res.Seconds = secs
		return errors.Join(err, tr.Close())
	}
	return fmt.Errorf("unknown mode %q", mode)
}

// bench streams iters puts of half the send region, each with its signal,
// from rank 0 to rank 1, alternating between two halves of rank 1's
// receive region; rank 1 waits for the last epoch and signals back. It
// returns rank 0's time from the first put to that answer, and checks the
// last payload.
func bench(ctx context.Context, g comm.Group, tr rdma.Transport, iters int) (float64, error) {
	n := len(tr.SendBuffer()) / 2
	send := tr.SendBuffer()
	for half := range 2 {
		for off := 0; off < n; off += 8 {
			binary.LittleEndian.PutUint64(send[half*n+off:], rdma.ChunkWord(0, 1, uint64(half), off))
		}
	}
	if err := g.Barrier(ctx); err != nil {
		return 0, err
	}
	start := time.Now()
	switch tr.Rank() {
	case 0:
		for i := 1; i <= iters; i++ {
			h := i % 2
			if i == iters {
				// Stamp the last put's first word with its epoch: the check
				// on rank 1 then knows that this put, not an earlier one of
				// the same half, landed.
				if err := tr.Flush(ctx); err != nil {
					return 0, err
				}
				binary.LittleEndian.PutUint64(send[h*n:], rdma.ChunkWord(0, 1, uint64(iters), 0))
			}
			if err := tr.Put(ctx, rdma.Work{Peer: 1, LocalOff: h * n, RemoteOff: h * n, Bytes: n, Epoch: uint64(i)}); err != nil {
				return 0, err
			}
		}
		if err := tr.Wait(ctx, 1, uint64(iters)); err != nil {
			return 0, err
		}
	case 1:
		if err := tr.Wait(ctx, 0, uint64(iters)); err != nil {
			return 0, err
		}
		if err := tr.Put(ctx, rdma.Work{Peer: 0, Epoch: uint64(iters)}); err != nil {
			return 0, err
		}
		h := iters % 2
		recv := tr.RecvBuffer()
		for off := 0; off < n; off += 8 {
			want := rdma.ChunkWord(0, 1, uint64(h), off)
			if off == 0 {
				want = rdma.ChunkWord(0, 1, uint64(iters), 0)
			}
			if got := binary.LittleEndian.Uint64(recv[h*n+off:]); got != want {
				return 0, fmt.Errorf("word %d of the last put is %#x, want %#x", off, got, want)
			}
		}
	}
	secs := time.Since(start).Seconds()
	return secs, tr.Flush(ctx)
}

// runWorld runs a child mode on n processes and returns their reports and
// the launcher's error.
func runWorld(t testing.TB, n int, mode, tls string, timeout time.Duration, extra ...string) ([]report, error, string) {
	t.Helper()
	dir := t.TempDir()
	env := append(os.Environ(), "GOEP_RDMA_MODE="+mode, "GOEP_RDMA_TLS="+tls, "GOEP_RDMA_OUT="+dir)
	env = append(env, extra...)
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var out bytes.Buffer
	args := []string{os.Args[0], "-test.run", "^TestRDMAChild$", "-test.timeout", "2m"}
	lerr := launcher.Spawn(ctx, launcher.SpawnConfig{N: n, Command: args, Env: env, Stdout: &out, Stderr: &out, Grace: 2 * time.Second})
	reports := make([]report, n)
	for r := range reports {
		raw, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf("rank-%d.json", r)))
		if err != nil {
			reports[r] = report{Rank: r, Err: "no report: " + err.Error()}
			continue
		}
		if err := json.Unmarshal(raw, &reports[r]); err != nil {
			t.Fatalf("rank %d report: %v", r, err)
		}
	}
	return reports, lerr, out.String()
}

// TestMultiProcessAllToAll: 4 processes, every rank puts a self-checking
// payload to every rank, signals, waits and checks, over TCP and over
// shared memory.
func TestMultiProcessAllToAll(t *testing.T) {
	if os.Getenv("GOEP_RDMA_MODE") != "" {
		t.Skip("child")
	}
	for _, tls := range []string{"tcp", "sm"} {
		t.Run(tls, func(t *testing.T) {
			got, lerr, log := runWorld(t, mpRanks, "alltoall", tls, 2*time.Minute)
			if lerr != nil {
				t.Fatalf("launcher: %v\n%s", lerr, log)
			}
			for _, r := range got {
				if r.Err != "" {
					t.Errorf("rank %d: %s\n%s", r.Rank, r.Err, log)
				}
			}
		})
	}
}

// namesRank2Lost matches a lost-peer error whose rank list holds rank 2.
// Other ranks may be in the list too: a survivor that failed first and
// exited is lost to a slower one (seen in CI: "lost rank(s) [0 2]").
var namesRank2Lost = regexp.MustCompile(`lost rank\(s\) \[(\d+ )*2( \d+)*\]`)

// TestMultiProcessKill: rank 2 dies (SIGKILL) between two epochs; every
// other rank must fail within a short deadline with an error naming rank
// 2, not hang.
func TestMultiProcessKill(t *testing.T) {
	if os.Getenv("GOEP_RDMA_MODE") != "" {
		t.Skip("child")
	}
	for _, tls := range []string{"tcp", "sm"} {
		t.Run(tls, func(t *testing.T) {
			got, lerr, log := runWorld(t, mpRanks, "kill", tls, time.Minute)
			if lerr == nil || !strings.Contains(lerr.Error(), "rank 2") {
				t.Errorf("launcher error %v, want one naming rank 2\n%s", lerr, log)
			}
			for _, r := range got {
				if r.Rank == 2 {
					continue
				}
				t.Logf("rank %d, %.3f s after rank 2 died: %s", r.Rank, r.Seconds, r.Err)
				if r.Seconds > 10 {
					t.Errorf("rank %d took %.1f s to notice", r.Rank, r.Seconds)
				}
				if !namesRank2Lost.MatchString(r.Err) {
					t.Errorf("rank %d: %q, want an error naming rank 2 lost\n%s", r.Rank, r.Err, log)
				}
			}
		})
	}
}

// BenchmarkCopy is the reference for BenchmarkPutSignal: a plain copy
// between two mmap'd buffers of the same size in one process.
func BenchmarkCopy(b *testing.B) {
	for _, n := range []int{64 << 10, 1 << 20, 8 << 20} {
		b.Run(fmt.Sprintf("bytes=%d", n), func(b *testing.B) {
			src, err := syscall.Mmap(-1, 0, n, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
			if err != nil {
				b.Fatal(err)
			}
			defer syscall.Munmap(src)
			dst, err := syscall.Mmap(-1, 0, 2*n, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
			if err != nil {
				b.Fatal(err)
			}
			defer syscall.Munmap(dst)
			b.SetBytes(int64(n))
			i := 0
			start := time.Now()
			for b.Loop() {
				copy(dst[i%2*n:], src) // alternate halves, as the put benchmark does
				i++
			}
			b.ReportMetric(float64(n)*float64(i)/time.Since(start).Seconds()/1e9, "GB/s")
		})
	}
}

// BenchmarkPutSignal measures put+signal bandwidth from one process to
// another on this machine (rank 0 streams b.N puts of the given size, each
// with its signal, alternating between two halves of rank 1's receive
// region; rank 1 waits for the last and answers): GB/s is bytes moved over
// rank 0's time from the first put to the answer. Compare with
// BenchmarkCopy in the same run. (ns/op includes starting the processes.)
func BenchmarkPutSignal(b *testing.B) {
	if os.Getenv("GOEP_RDMA_MODE") != "" {
		b.Skip("child")
	}
	for _, tls := range []string{"sm", "tcp"} {
		for _, n := range []int{64 << 10, 1 << 20, 8 << 20} {
			b.Run(fmt.Sprintf("tls=%s/bytes=%d", tls, n), func(b *testing.B) {
				got, lerr, log := runWorld(b, 2, "bench", tls, 2*time.Minute,
					"GOEP_RDMA_BYTES="+strconv.Itoa(n), "GOEP_RDMA_ITERS="+strconv.Itoa(b.N))
				if lerr != nil {
					b.Fatalf("launcher: %v\n%s", lerr, log)
				}
				for _, r := range got {
					if r.Err != "" {
						b.Fatalf("rank %d: %s\n%s", r.Rank, r.Err, log)
					}
				}
				secs := got[0].Seconds
				b.SetBytes(int64(n))
				b.ReportMetric(float64(n)*float64(b.N)/secs/1e9, "GB/s")
				b.ReportMetric(secs/float64(b.N)*1e6, "us/put")
			})
		}
	}
}

// TestDevices: UCX lists this machine's resources through rdma; every
// machine has the tests' TCP transport on lo, which is not RDMA.
func TestDevices(t *testing.T) {
	res, err := rdma.Devices()
	if err != nil {
		t.Fatal(err)
	}
	if res.UCXVersion == "" {
		t.Error("no UCX version")
	}
	if res.MemoryTypes&ucx.MemoryHost == 0 {
		t.Errorf("memory types %v: want host memory at least", res.MemoryTypes)
	}
	tcpLo := false
	for _, d := range res.Devices {
		tcpLo = tcpLo || d.Transport == "tcp" && d.Device == "lo"
	}
	if !tcpLo || slices.Contains(res.RDMADevices(), "lo") {
		t.Errorf("resources %+v, RDMA devices %q: want tcp on lo, not an RDMA device", res.Devices, res.RDMADevices())
	}
}
