package main

import (
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/goep/goep/launcher"
)

type launchFlags struct {
	ranks   int
	domains int
	timeout time.Duration
	grace   time.Duration
}

func newLaunch(stdout, stderr io.Writer) *cobra.Command {
	var f launchFlags
	cmd := &cobra.Command{
		Use:   "launch -n N [--domains M] -- CMD [ARGS...]",
		Short: "Run N ranks of a command on this machine, joined by the TCP rendezvous",
		Long: `Run N ranks of CMD on this machine, the local counterpart of mpirun. Each rank gets
RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GOEP_MASTER_ADDR=127.0.0.1, a free
GOEP_MASTER_PORT and a fresh random GOEP_WORLD_SECRET (what launcher.Bootstrap reads: only
processes that hold the secret can join the world); with --domains M the ranks form M
emulated NVLink domains of N/M ranks (LOCAL_* within the domain, and GOEP_RANKS_PER_DOMAIN=N/M).
Each rank also gets a pipe from eprun as descriptor 3 (GOEP_LAUNCHER_FD=3), on which eprun
tells it when another rank's process ends: a rank that exits (even with status 0) or dies
before every rank has joined makes the others' Bootstrap fail at once, naming it.

Every line a rank writes is prefixed with "[rank K] ". When a rank exits non-zero or is
killed, the others get up to a second to fail on their own (naming it), then SIGTERM, then
SIGKILL after the grace period; on Ctrl-C or SIGTERM they get SIGTERM at once. eprun exits
1 naming the first rank that failed (and a rank that exited 0 before it while the others
still ran). Exit status 0 means every rank exited 0.

  eprun launch -n 4 -- eprun bench
  eprun launch -n 8 --domains 2 -- ./myjob --flag`,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) == 0 {
				return errors.New("launch: no command to run (eprun launch -n N -- CMD [ARGS...])")
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			cfg := launcher.SpawnConfig{
				N: f.ranks, Domains: f.domains, Command: args,
				Stdout: stdout, Stderr: stderr,
				Timeout: f.timeout, Grace: f.grace,
			}
			if err := cfg.Validate(); err != nil {
				return fmt.Errorf("launch: %w", err)
			}
			if err := launcher.Spawn(cmd.Context(), cfg); err != nil {
				return runError{err}
			}
			return nil
		},
	}
	fl := cmd.Flags()
	// Flags after CMD are CMD's: eprun launch -n 2 eprun bench -q works
	// without "--" too.
	fl.SetInterspersed(false)
	fl.IntVarP(&f.ranks, "np", "n", 0, "number of ranks N (required)")
	fl.IntVar(&f.domains, "domains", 1, "emulated NVLink domains (nodes) M; N must be a multiple of M")
	fl.DurationVar(&f.timeout, "timeout", 0, "terminate the ranks after this long (0: no limit)")
	fl.DurationVar(&f.grace, "grace", launcher.DefaultGrace, "time between SIGTERM and SIGKILL when the ranks are terminated")
	_ = cmd.MarkFlagRequired("np")
	return cmd
}
