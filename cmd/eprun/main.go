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
// Exit status: 0 on success, 1 when a run fails or a check finds a wrong
// row, 2 on a bad flag, argument or config.
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

	"github.com/spf13/cobra"

	"github.com/goep/goep/device"
)

func main() {
	limitMemory()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
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
	return root, prof
}
