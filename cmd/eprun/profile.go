package main

import (
	"fmt"
	"os"
	"runtime/pprof"

	"github.com/spf13/cobra"

	"github.com/goep/goep/launcher"
)

// cpuProfile is the --cpuprofile flag: a Go CPU profile of the whole
// command, for go tool pprof. It shows where the host's time goes:
// enqueueing GPU work, the host backend's copies and sums, the checks.
type cpuProfile struct {
	path string   // the flag's value; "" for none
	f    *os.File // the profile being written
}

// start begins the profile (cobra's PersistentPreRunE). Under a launcher
// of several processes each rank writes PATH.RANK.
func (p *cpuProfile) start(*cobra.Command, []string) error {
	if p.path == "" {
		return nil
	}
	path := p.path
	env, err := launcher.Detect()
	if err != nil {
		return fmt.Errorf("--cpuprofile: which rank writes the profile: %w", err)
	}
	if env.Size > 1 {
		path = fmt.Sprintf("%s.%d", path, env.Rank)
	}
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("--cpuprofile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return fmt.Errorf("--cpuprofile %s: %w", path, err)
	}
	p.f = f
	return nil
}

// stop ends the profile, if one is being written, and closes its file.
func (p *cpuProfile) stop() error {
	if p.f == nil {
		return nil
	}
	pprof.StopCPUProfile()
	err := p.f.Close()
	p.f = nil
	if err != nil {
		return fmt.Errorf("--cpuprofile: %w", err)
	}
	return nil
}
