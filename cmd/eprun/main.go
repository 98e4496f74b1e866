// Command eprun benchmarks and checks goep.
//
//	eprun bench [CONFIG]   time dispatch, combine and the fused calls, and check them
//	eprun check [CONFIG]   the checks alone, over a sweep of shapes
//	eprun launch -n N -- COMMAND...   run COMMAND as N local ranks
//	eprun plot FILE.json...   bandwidth and latency plots of bench records
//	eprun topo             what the machine offers (CPUs, GPUs, NVLink, RDMA)
//	eprun version          print the goep version and commit
//
// eprun bench with no config runs the embedded configs/default.yaml on the
// host backend with in-process ranks; CONFIG is a YAML file, or the name of
// an embedded config (configs/*.yaml). Flags override its fields. Every
// command takes --cpuprofile FILE (a Go CPU profile of the run).
// The output is a table in the manner of nccl-tests, or Go benchmark lines
// for benchstat with --format=gobench; --json writes the full record.
//
// Exit status: 0 on success, 1 when a run fails, a check finds a wrong
// row or an output cannot be written, 2 on a bad flag, argument or config,
// 128+N when signal N ends it (130 for SIGINT, 143 for SIGTERM).
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/debug"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/goep/goep/device"
)

func main() {
	limitMemory()
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	os.Exit(untilSignal(sigs, os.Stderr, graceOf(os.Args[1:]), func(ctx context.Context) int {
		return run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	}))
}

// graceOf is exitGrace, or for eprun launch -1: the launcher ends its ranks
// itself on a signal (SIGTERM, then SIGKILL after its --grace), and must not
// exit before them.
func graceOf(args []string) time.Duration {
	root, _ := newRoot(io.Discard, io.Discard)
	if cmd, _, err := root.Find(args); err == nil && cmd.Name() == "launch" {
		return -1
	}
	return exitGrace
}

// exitGrace is how long eprun waits, after SIGINT or SIGTERM, for the
// command to return before it exits anyway: the command's context is
// cancelled, so its collectives and engine calls return at once and the
// rows measured so far are printed, unless it is somewhere that does not
// watch the context (reading a config, an engine's Close draining queued
// work). So a signal ends eprun within a second.
const exitGrace = 750 * time.Millisecond

// signalled is the cause of a context that a signal cancelled.
type signalled struct{ sig os.Signal }

func (s signalled) Error() string { return "stopped by " + signalName(s.sig) }

// signalName is SIGINT, SIGTERM, or what the signal says of itself.
func signalName(s os.Signal) string {
	switch s {
	case os.Interrupt:
		return "SIGINT"
	case syscall.SIGTERM:
		return "SIGTERM"
	}
	return s.String()
}

// untilSignal runs f with a context that the first signal from sigs
// cancels, and returns f's status. Once a signal has come, f has grace to
// return (a second signal cuts it short), and the status is 128 + the
// signal's number, as a shell reports a process that a signal ended. With
// a negative grace it waits for f, whatever comes, and returns its status.
func untilSignal(sigs <-chan os.Signal, stderr io.Writer, grace time.Duration, f func(context.Context) int) int {
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	done := make(chan int, 1)
	go func() { done <- f(ctx) }()
	var sig os.Signal
	select {
	case code := <-done:
		return code
	case sig = <-sigs:
	}
	cancel(signalled{sig})
	if grace < 0 {
		return <-done
	}
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		fmt.Fprintf(stderr, "eprun: stopped by %s (without waiting for the command to return)\n", signalName(sig))
	case s := <-sigs:
		fmt.Fprintf(stderr, "eprun: stopped by %s, then %s\n", signalName(sig), signalName(s))
	}
	if n, ok := sig.(syscall.Signal); ok {
		return 128 + int(n)
	}
	return 1
}

// limitMemory sets Go's soft memory limit to the host memory available
// at start (device.HostMemoryAvailable), unless GOMEMLIMIT sets one: the
// garbage collector then runs harder as the heap nears what the machine
// has, instead of letting it grow to twice its live size (its default).
// (A host-backend run of 8 ranks x 1000 tokens of hidden 7168 peaked at
// 11.5 GB resident without a limit, 8.8 GB with GOMEMLIMIT=5GiB, in the
// same time.) The limit is soft: a run whose live data exceeds it still
// runs, slower.
func limitMemory() {
	if _, set := os.LookupEnv("GOMEMLIMIT"); set {
		return
	}
	if n, ok := device.HostMemoryAvailable(); ok && n > 0 {
		debug.SetMemoryLimit(n)
	}
}

// runError is a failure of a command that started correctly (exit 1);
// every other error is a usage error (exit 2).
type runError struct{ err error }

func (e runError) Error() string { return e.err.Error() }
func (e runError) Unwrap() error { return e.err }

// run executes eprun with args and returns the exit status. Errors are
// printed as one line on stderr.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	root, prof := newRoot(stdout, stderr)
	defer prof.stop() // a panic in a command still leaves a complete profile
	root.SetArgs(args)
	err := root.ExecuteContext(ctx)
	if perr := prof.stop(); perr != nil && err == nil {
		err = runError{perr}
	}
	if err == nil {
		return 0
	}
	if cause := context.Cause(ctx); cause != nil && errors.As(cause, new(signalled)) {
		// The command ended because a signal cancelled it: its error is
		// what the cancellation interrupted.
		fmt.Fprintf(stderr, "eprun: %v\n", cause)
		return 1
	}
	fmt.Fprintf(stderr, "eprun: %s\n", oneLine(err.Error()))
	if errors.As(err, new(runError)) {
		return 1
	}
	return 2
}

func oneLine(s string) string {
	return strings.Join(strings.Fields(strings.ReplaceAll(s, "\n", "; ")), " ")
}

// newRoot is eprun's command tree, and its --cpuprofile, which run stops
// once the command has returned (also on an error).
func newRoot(stdout, stderr io.Writer) (*cobra.Command, *cpuProfile) {
	prof := &cpuProfile{}
	root := &cobra.Command{
		Use:   "eprun",
		Short: "eprun benchmarks and checks goep, the expert-parallel communication library",
		Long: `eprun benchmarks and checks goep, the expert-parallel (MoE) communication library.

  eprun bench             run the default benchmark (configs/default.yaml) and check its results
  eprun bench CONFIG      run a YAML config (a file, or an embedded name: see eprun bench --help)
  eprun check [CONFIG]    the checks alone; exit 1 on any mismatch
  eprun launch -n N -- CMD [ARGS...]   N local ranks of CMD (TCP rendezvous)
  eprun plot FILE.json... -o OUT.png    bandwidth and latency against tokens per rank
  eprun topo              what goep sees: CPUs, NUMA, GPUs and NVLink, RDMA devices, launcher, domains
  eprun version           print the version`,
		SilenceErrors:     true,
		SilenceUsage:      true,
		CompletionOptions: cobra.CompletionOptions{DisableDefaultCmd: true},
		PersistentPreRunE: prof.start,
	}
	root.PersistentFlags().StringVar(&prof.path, "cpuprofile", "",
		"write a Go CPU profile of the command to `FILE` (go tool pprof FILE); under a launcher each rank writes FILE.RANK (for eprun launch, give it to the ranks' command: -- eprun bench --cpuprofile FILE)")
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SetFlagErrorFunc(func(c *cobra.Command, err error) error {
		return fmt.Errorf("%s: %w (see eprun %s --help)", c.Name(), err, c.Name())
	})
	root.AddCommand(newBench(stdout, stderr), newVersion(stdout), newLaunch(stdout, stderr))
	root.AddCommand(newCheck(stdout, stderr))
	root.AddCommand(newPlot(stdout))
	root.AddCommand(newTopo(stdout))
	root.AddCommand(newSize(stdout, stderr))
	return root, prof
}
