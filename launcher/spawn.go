package launcher

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/goep/goep/comm"
)

// DefaultGrace is how long Spawn waits after SIGTERM before SIGKILL.
const DefaultGrace = 5 * time.Second

// BlameWindow is how long Spawn lets the other ranks run after one failed,
// before it terminates them: long enough for them to notice the failure and
// report it themselves (milliseconds), short enough not to be noticed.
const BlameWindow = time.Second

// blameWindow is BlameWindow, a variable for tests.
var blameWindow = BlameWindow

// SpawnConfig describes a job of local ranks for Spawn.
type SpawnConfig struct {
	// N is the number of ranks, at least 1.
	N int
	// Domains splits the ranks into this many emulated NVLink domains
	// (nodes) of N/Domains ranks each; N must be a multiple. 0 means 1.
	Domains int
	// Command is the program and its arguments, run once per rank.
	Command []string
	// Stdout and Stderr receive each rank's output, every line prefixed
	// with "[rank K] " (nil: os.Stdout, os.Stderr). Lines are written whole.
	Stdout, Stderr io.Writer
	// Env is the ranks' base environment (nil: os.Environ()); Spawn adds the
	// rendezvous variables, replacing any of the same name.
	Env []string
	// Dir is the ranks' working directory ("": this process's).
	Dir string
	// Timeout bounds the whole job (0: none).
	Timeout time.Duration
	// Grace is the time between SIGTERM and SIGKILL when ranks are
	// terminated (0: DefaultGrace).
	Grace time.Duration
}

// RanksPerDomain is N / Domains.
func (c SpawnConfig) RanksPerDomain() int {
	if c.Domains <= 1 {
		return c.N
	}
	return c.N / c.Domains
}

// maxSpawn bounds the ranks Spawn starts on one machine.
const maxSpawn = 1 << 16

// Validate checks the configuration without starting anything.
func (c SpawnConfig) Validate() error {
	switch {
	case c.N < 1:
		return fmt.Errorf("launcher: %d ranks: want at least 1", c.N)
	case c.N > maxSpawn:
		return fmt.Errorf("launcher: %d ranks: at most %d processes on one machine", c.N, maxSpawn)
	case c.Domains < 0:
		return fmt.Errorf("launcher: %d domains: want at least 1", c.Domains)
	case c.Domains > 1 && c.N%c.Domains != 0:
		// Every domain has the same number of ranks (DESIGN: R % D == 0).
		return fmt.Errorf("launcher: %d ranks do not split into %d domains of equal size", c.N, c.Domains)
	case len(c.Command) == 0 || c.Command[0] == "":
		return errors.New("launcher: no command to run")
	case c.Timeout < 0 || c.Grace < 0:
		return errors.New("launcher: negative timeout or grace period")
	}
	return nil
}

// RankError is the failure of one rank: it exited non-zero or was killed
// by a signal that Spawn did not send.
type RankError struct {
	Rank     int
	ExitCode int            // -1 when killed by a signal
	Signal   syscall.Signal // 0 unless killed by a signal
}

func (e *RankError) Error() string {
	if e.ExitCode < 0 {
		return fmt.Sprintf("rank %d killed by signal %d (%v)", e.Rank, int(e.Signal), e.Signal)
	}
	return fmt.Sprintf("rank %d exited with status %d", e.Rank, e.ExitCode)
}

// Spawn runs N local ranks of Command, joined by the TCP rendezvous
// environment that comm.TCPConfigFromEnv reads (RANK, WORLD_SIZE,
// LOCAL_RANK, LOCAL_WORLD_SIZE, GOEP_MASTER_ADDR=127.0.0.1, a free
// GOEP_MASTER_PORT and a fresh random GOEP_WORLD_SECRET, so that only these
// ranks can join the world; with Domains > 1 also GOEP_RANKS_PER_DOMAIN),
// and waits for all of them.
//
// Each rank also gets the read end of a pipe from Spawn as file descriptor
// 3, named by GOEP_LAUNCHER_FD=3: when a rank's process ends, Spawn writes
// a line saying so ("exit RANK HOW") to every other rank's pipe, and
// Bootstrap, reading it, fails a join still waiting for that rank at once
// with a *comm.PeerLostError naming it, so that a rank that exits (even
// with status 0) or dies before it joins never leaves the others waiting.
//
// Each rank runs in its own process group. When ctx is done (eprun launch
// got SIGINT or SIGTERM) or the timeout expires, Spawn sends SIGTERM to the
// process groups of the ranks still running and SIGKILL after the grace
// period, then waits for all. When a rank exits non-zero or is killed by a
// signal, it first gives the others up to BlameWindow to fail on their own
// (they see the lost rank within milliseconds and report it by name), then
// does the same. When a rank exits,
// whatever is left in its process group is killed. If this process dies,
// the kernel kills the ranks (Linux parent-death signal).
//
// Spawn returns nil only if every rank exited 0. Otherwise its error names
// the first rank that failed and how (a *RankError in its chain), or wraps
// ctx's error; if a rank had exited 0 while the others still ran, the
// error says which (the others may have failed because it left).
func Spawn(ctx context.Context, cfg SpawnConfig) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	path, err := exec.LookPath(cfg.Command[0])
	if err != nil {
		return fmt.Errorf("launcher: %w", err)
	}
	port, err := FreePort()
	if err != nil {
		return err
	}
	if cfg.Stdout == nil {
		cfg.Stdout = os.Stdout
	}
	if cfg.Stderr == nil {
		cfg.Stderr = os.Stderr
	}
	if cfg.Env == nil {
		cfg.Env = os.Environ()
	}
	if cfg.Grace == 0 {
		cfg.Grace = DefaultGrace
	}
	if cfg.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeoutCause(ctx, cfg.Timeout, &timeoutError{cfg.Timeout})
		defer cancel()
	}
	j := &job{cfg: cfg, path: path, port: port, secret: comm.NewWorldSecret(), out: &lockedWriter{}}
	return j.run(ctx)
}

type job struct {
	cfg    SpawnConfig
	path   string
	port   int
	secret string
	out    *lockedWriter
}

type rank struct {
	id      int
	cmd     *exec.Cmd
	readers sync.WaitGroup // copy the rank's output
	pipes   []*os.File     // read ends, closed once the rank's output is drained
	news    *os.File       // write end of the rank's launcher pipe (GOEP_LAUNCHER_FD)
}

// launcherFD is the descriptor of the launcher pipe in a rank: the first
// of exec.Cmd.ExtraFiles.
const launcherFD = 3

type exit struct {
	rank  int
	state *os.ProcessState
	err   error
}

// env is the environment of rank r.
func (j *job) env(r int) []string {
	per := j.cfg.RanksPerDomain()
	set := map[string]string{
		"RANK":              strconv.Itoa(r),
		"WORLD_SIZE":        strconv.Itoa(j.cfg.N),
		"LOCAL_RANK":        strconv.Itoa(r % per),
		"LOCAL_WORLD_SIZE":  strconv.Itoa(per),
		"GOEP_MASTER_ADDR":  "127.0.0.1",
		"GOEP_MASTER_PORT":  strconv.Itoa(j.port),
		"GOEP_WORLD_SECRET": j.secret,
		"GOEP_LAUNCHER_FD":  strconv.Itoa(launcherFD),
	}
	if j.cfg.Domains > 1 {
		set["GOEP_RANKS_PER_DOMAIN"] = strconv.Itoa(per)
	}
	env := make([]string, 0, len(j.cfg.Env)+len(set))
	for _, kv := range j.cfg.Env {
		k, _, _ := strings.Cut(kv, "=")
		if _, ok := set[k]; !ok {
			env = append(env, kv)
		}
	}
	for _, k := range []string{"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GOEP_MASTER_ADDR", "GOEP_MASTER_PORT",
		"GOEP_WORLD_SECRET", "GOEP_LAUNCHER_FD", "GOEP_RANKS_PER_DOMAIN"} {
		if v, ok := set[k]; ok {
			env = append(env, k+"="+v)
		}
	}
	return env
}

func (j *job) run(ctx context.Context) error {
	ranks := make([]*rank, j.cfg.N)
	exits := make(chan exit, j.cfg.N)

	// The ranks are started, and Spawn's parent-death signal armed, from
	// one OS thread that stays locked until all are reaped: the kernel
	// sends that signal when the creating thread exits, not the process.
	started := make(chan error, 1)
	release := make(chan struct{})
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		for r := range ranks {
			rk, err := j.start(r)
			if err != nil {
				started <- err
				<-release
				return
			}
			ranks[r] = rk
			go func() {
				err := rk.cmd.Wait()
				exits <- exit{rank: r, state: rk.cmd.ProcessState, err: err}
			}()
		}
		started <- nil
		<-release
	}()
	startErr := <-started
	defer close(release)

	running := 0
	for _, rk := range ranks {
		if rk != nil {
			running++
		}
	}
	var (
		first     error // the first failure: a rank's, the start's or ctx's
		early     error // the first rank that exited 0 while others ran
		termAt    <-chan time.Time
		blameAt   <-chan time.Time // a rank failed: terminate the others then
		killed    bool
		done      = ctx.Done()
		terminate = func() {
			if termAt != nil {
				return
			}
			j.signalAll(ranks, syscall.SIGTERM)
			termAt = time.After(j.cfg.Grace)
		}
	)
	if startErr != nil {
		first = startErr
		terminate()
	}
	for running > 0 {
		select {
		case e := <-exits:
			running--
			rk := ranks[e.rank]
			// Leftovers in the rank's group (its children) go with it.
			_ = syscall.Kill(-rk.cmd.Process.Pid, syscall.SIGKILL)
			rk.cmd.Process = nil // reaped: never signal this pid again
			// The others hear of it before they hear of a SIGTERM: a rank
			// still joining fails naming this one.
			j.tell(ranks, e.rank, exitHow(e))
			if first == nil {
				err := rankFailure(e)
				switch {
				case err != nil && early != nil:
					first = fmt.Errorf("launcher: %w, after %w while the others ran", err, early)
					blameAt = time.After(blameWindow)
				case err != nil:
					first = fmt.Errorf("launcher: %w", err)
					blameAt = time.After(blameWindow)
				case early == nil && running > 0:
					early = &RankError{Rank: e.rank}
				}
			}
		case <-done:
			done = nil
			if first == nil {
				first = stopError(ctx)
			}
			terminate()
		case <-blameAt:
			blameAt = nil
			terminate()
		case <-termAt:
			if !killed {
				killed = true
				j.signalAll(ranks, syscall.SIGKILL)
			}
		}
	}
	j.drain(ranks)
	for _, rk := range ranks {
		if rk != nil {
			rk.news.Close()
		}
	}
	return first
}

// exitHow says how a rank's process ended, for the other ranks.
func exitHow(e exit) string {
	if err := rankFailure(e); err != nil {
		var re *RankError
		if errors.As(err, &re) {
			return strings.TrimPrefix(re.Error(), fmt.Sprintf("rank %d ", e.rank))
		}
		return err.Error()
	}
	return "exited with status 0"
}

// tell writes to every running rank's launcher pipe that rank gone ended
// (how), as one line "exit RANK HOW". The write never blocks: a rank that
// does not read its pipe (not a goep program) only misses the news once
// the pipe is full.
func (j *job) tell(ranks []*rank, gone int, how string) {
	line := fmt.Appendf(nil, "exit %d %s\n", gone, strings.ReplaceAll(how, "\n", " "))
	for _, rk := range ranks {
		if rk != nil && rk.cmd.Process != nil && rk.news != nil {
			writeNonblock(rk.news, line)
		}
	}
}

// timeoutError is the cause of a job's end at SpawnConfig.Timeout.
type timeoutError struct{ after time.Duration }

func (e *timeoutError) Error() string { return fmt.Sprintf("job timed out after %v", e.after) }

// stopError is the error of a job ended by ctx: it says why (the timeout, a
// signal: ctx's cause) and wraps both the cause and ctx.Err().
func stopError(ctx context.Context) error {
	cause := context.Cause(ctx)
	var te *timeoutError
	switch {
	case errors.As(cause, &te):
		return &stopErr{"launcher: " + te.Error(), []error{cause, ctx.Err()}}
	case cause != nil && cause != ctx.Err():
		return &stopErr{"launcher: interrupted: " + cause.Error(), []error{cause, ctx.Err()}}
	}
	return &stopErr{"launcher: interrupted: " + ctx.Err().Error(), []error{ctx.Err()}}
}

type stopErr struct {
	msg  string
	errs []error
}

func (e *stopErr) Error() string   { return e.msg }
func (e *stopErr) Unwrap() []error { return e.errs }

// rankFailure turns a rank's exit into its error, nil for exit status 0.
func rankFailure(e exit) error {
	if e.state == nil {
		return fmt.Errorf("rank %d: %w", e.rank, e.err)
	}
	ws, ok := e.state.Sys().(syscall.WaitStatus)
	switch {
	case ok && ws.Signaled():
		return &RankError{Rank: e.rank, ExitCode: -1, Signal: ws.Signal()}
	case e.state.ExitCode() != 0:
		return &RankError{Rank: e.rank, ExitCode: e.state.ExitCode()}
	}
	return nil
}

// signalAll sends sig to the process group of every rank not yet reaped.
func (j *job) signalAll(ranks []*rank, sig syscall.Signal) {
	for _, rk := range ranks {
		if rk != nil && rk.cmd.Process != nil {
			_ = syscall.Kill(-rk.cmd.Process.Pid, sig)
		}
	}
}

// start starts rank r in its own process group, its output going through
// pipes to the prefixing writers.
func (j *job) start(r int) (*rank, error) {
	rk := &rank{id: r}
	cmd := exec.Command(j.path, j.cfg.Command[1:]...)
	cmd.Args[0] = j.cfg.Command[0]
	cmd.Env = j.env(r)
	cmd.Dir = j.cfg.Dir
	cmd.SysProcAttr = sysProcAttr()
	prefix := fmt.Sprintf("[rank %d] ", r)
	var writes []*os.File
	for _, w := range []io.Writer{j.cfg.Stdout, j.cfg.Stderr} {
		pr, pw, err := os.Pipe()
		if err != nil {
			rk.closeAll(writes)
			return nil, fmt.Errorf("launcher: rank %d: pipe: %w", r, err)
		}
		rk.pipes = append(rk.pipes, pr)
		writes = append(writes, pw)
		lw := &lineWriter{prefix: prefix, dst: w, out: j.out}
		rk.readers.Add(1)
		go func() {
			defer rk.readers.Done()
			_, _ = io.Copy(lw, pr)
			lw.flush()
		}()
	}
	cmd.Stdout, cmd.Stderr = writes[0], writes[1]
	newsR, newsW, err := os.Pipe()
	if err != nil {
		rk.closeAll(writes)
		rk.readers.Wait()
		return nil, fmt.Errorf("launcher: rank %d: pipe: %w", r, err)
	}
	cmd.ExtraFiles = []*os.File{newsR} // launcherFD
	err = cmd.Start()
	for _, w := range writes {
		w.Close() // the child has its copies
	}
	newsR.Close()
	if err != nil {
		newsW.Close()
		rk.closeAll(nil)
		rk.readers.Wait()
		return nil, fmt.Errorf("launcher: start rank %d: %w", r, err)
	}
	rk.news = newsW
	rk.cmd = cmd
	return rk, nil
}

func (rk *rank) closeAll(extra []*os.File) {
	for _, f := range extra {
		f.Close()
	}
	for _, f := range rk.pipes {
		f.Close()
	}
}

// drainGrace is how long drain waits for the ranks' output to end before
// it closes the pipes that some process still holds. A variable for tests.
var drainGrace = time.Second

// testHookDrained, when set (tests), runs once drainGrace has passed and
// drain has closed the pipes it closes then.
var testHookDrained func()

// drain waits for the ranks' output to end. Every process group has been
// killed, but a descendant that left its group may still hold a pipe, and
// its reader would wait for ever: after drainGrace, such a pipe is closed
// (what it still holds is lost). A pipe that no process holds any more
// holds a finite rest and its end, so its reader, merely slow (descheduled
// on a loaded machine, or held up by a slow Stdout), is waited for.
func (j *job) drain(ranks []*rank) {
	all := make(chan struct{})
	go func() {
		for _, rk := range ranks {
			if rk != nil {
				rk.readers.Wait()
			}
		}
		close(all)
	}()
	select {
	case <-all:
	case <-time.After(drainGrace):
		for _, rk := range ranks {
			if rk == nil {
				continue
			}
			for _, f := range rk.pipes {
				if !writersGone(f) {
					f.Close()
				}
			}
		}
		if testHookDrained != nil {
			testHookDrained()
		}
		<-all
	}
	for _, rk := range ranks {
		if rk != nil {
			rk.closeAll(nil)
		}
	}
}

// lockedWriter serialises the lines of all ranks.
type lockedWriter struct{ mu sync.Mutex }

// maxLine bounds a rank's buffered partial line; a longer one is written in
// pieces, each with the prefix.
const maxLine = 64 << 10

// lineWriter prefixes every line a rank writes and writes whole lines only.
type lineWriter struct {
	prefix string
	dst    io.Writer
	out    *lockedWriter
	buf    []byte
}

func (w *lineWriter) Write(p []byte) (int, error) {
	w.buf = append(w.buf, p...)
	var lines []byte
	off := 0
	for {
		rest := w.buf[off:]
		i := bytes.IndexByte(rest, '\n')
		switch {
		case i >= 0:
			lines = append(append(lines, w.prefix...), rest[:i+1]...)
			off += i + 1
			continue
		case len(rest) >= maxLine:
			lines = append(append(append(lines, w.prefix...), rest[:maxLine]...), '\n')
			off += maxLine
			continue
		}
		break
	}
	w.buf = append(w.buf[:0], w.buf[off:]...)
	w.emit(lines)
	return len(p), nil
}

// flush writes a last line that had no newline, adding one.
func (w *lineWriter) flush() {
	if len(w.buf) > 0 {
		w.emit(append(append([]byte(w.prefix), w.buf...), '\n'))
		w.buf = nil
	}
}

func (w *lineWriter) emit(b []byte) {
	if len(b) == 0 {
		return
	}
	w.out.mu.Lock()
	defer w.out.mu.Unlock()
	_, _ = w.dst.Write(b) // a failing destination must not stall the rank
}
