package launcher

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/goep/goep/comm"
)

// DefaultRendezvousTimeout bounds Bootstrap's wait for every rank to join
// when its ctx has no deadline and GOEP_RENDEZVOUS_TIMEOUT is unset: long
// enough for ranks that start minutes apart (a container pull, a slow
// node), short enough that a job whose rank 0 never came does not sit idle
// for hours.
const DefaultRendezvousTimeout = 10 * time.Minute

// Option configures Bootstrap.
type Option func(*options)

type options struct {
	log   *zap.Logger
	abort context.Context // WithAbort's; nil: none
}

// WithLogger sets the logger (default: none). Bootstrap logs under the name
// "launcher": the group it picked at info level, why it skipped CPU binding
// at debug level; the TCP group it makes logs under "comm.tcp" (a
// connection refused because it did not prove itself a rank of the world,
// at warn level).
func WithLogger(l *zap.Logger) Option {
	return func(o *options) {
		if l != nil {
			o.log = l
		}
	}
}

// Bootstrap detects the launcher (see Detect), binds this process to its
// device, and joins the group of all ranks. It must be called once per
// process, by every rank, early in main.
//
// The group:
//   - torchrun / eprun launch: comm.NewTCP with comm.TCPConfigFromEnv()
//     (which needs GOEP_WORLD_SECRET for more than one rank; eprun launch
//     sets it);
//   - Open MPI or PMI: comm.NewMPI when goep was built with -tags mpi, else
//     TCP rendezvous at GOEP_MASTER_ADDR / GOEP_MASTER_PORT when they are
//     set, else an error that says to do one or the other; the TCP world's
//     secret is GOEP_WORLD_SECRET, else under Open MPI the job key that
//     mpirun hands every rank of the job (OMPI_MCA_orte_precondition_transports),
//     else an error;
//   - Slurm: TCP rendezvous at GOEP_MASTER_ADDR / GOEP_MASTER_PORT with the
//     secret GOEP_WORLD_SECRET (an error when they are not set);
//   - single process: comm.NewLocal(1)[0].
//
// The device: GOEP_DEVICE is set to the local rank (the GPU index) unless it
// is set already, in which case it must be a non-negative integer and is
// kept. Where NVML answers (a GPU and libnvidia-ml are present, and goep was
// built with cgo) the process's threads are bound to the CPUs near that GPU,
// intersected with the CPUs the process may already use, so that a
// launcher's narrower binding (mpirun --bind-to core) is kept. Without NVML
// binding is skipped, which is not an error.
//
// Joining the group waits for every rank. When ctx has no deadline that
// wait is bounded by GOEP_RENDEZVOUS_TIMEOUT (a Go duration or seconds;
// DefaultRendezvousTimeout when unset), so that a rank 0 that never starts,
// or a GOEP_MASTER_ADDR the others cannot reach, ends in an error naming
// rank 0 instead of a silent hang. The group does not keep that bound.
// Under eprun launch (GOEP_LAUNCHER_FD, the pipe Spawn hands each rank),
// the join also ends as soon as the launcher reports that another rank's
// process ended before every rank joined: a *comm.PeerLostError names it.
// WithAbort ties the group to a context that the program cancels when it
// must stop (a signal).
func Bootstrap(ctx context.Context, opts ...Option) (comm.Group, Env, error) {
	o := options{log: zap.NewNop()}
	for _, opt := range opts {
		opt(&o)
	}
	log := o.log.Named("launcher")
	env, err := Detect()
	if err != nil {
		return nil, env, err
	}
	news, err := launcherNews(log)
	if err != nil {
		return nil, env, err
	}
	if err := bindDevice(env, log); err != nil {
		return nil, env, err
	}
	bound, err := comm.DurationFromEnv("GOEP_RENDEZVOUS_TIMEOUT", DefaultRendezvousTimeout)
	if err != nil {
		return nil, env, fmt.Errorf("launcher: %w", err)
	}
	_, hasDeadline := ctx.Deadline()
	if !hasDeadline {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, bound)
		defer cancel()
	}
	ctx, stop := joinUntil(ctx, o.abort)
	defer stop()
	g, how, err := newGroup(ctx, env, tcpExtras{news: news, log: o.log})
	if err != nil {
		var te *comm.TimeoutError
		switch {
		case !hasDeadline && errors.As(err, &te) && len(te.Missing) == 0: // MPI's: it cannot say who
			err = fmt.Errorf("%w (waited GOEP_RENDEZVOUS_TIMEOUT=%v for every rank to join: are all ranks running, and did none exit before it joined?)", err, bound)
		case !hasDeadline && errors.Is(err, comm.ErrTimeout):
			err = fmt.Errorf("%w (waited GOEP_RENDEZVOUS_TIMEOUT=%v for every rank to join: are all ranks running, and can they reach GOEP_MASTER_ADDR:GOEP_MASTER_PORT?)", err, bound)
		}
		if cause := context.Cause(ctx); errors.Is(err, context.Canceled) && cause != nil && !errors.Is(cause, context.Canceled) {
			err = fmt.Errorf("%w (%v)", err, cause)
		}
		return nil, env, err
	}
	abortWhenDone(g, o.abort)
	log.Info("bootstrapped", zap.Stringer("env", env), zap.String("group", how))
	return g, env, nil
}

// tcpExtras are what a TCP group gets besides its place: the launcher's
// news of departed ranks, and the logger.
type tcpExtras struct {
	news <-chan comm.Departure
	log  *zap.Logger
}

// newGroup picks and creates the group for env; how names what it picked.
func newGroup(ctx context.Context, env Env, x tcpExtras) (g comm.Group, how string, err error) {
	switch env.Kind {
	case KindSingle:
		return comm.NewLocal(1)[0], "local", nil
	case KindTorchrun:
		cfg, err := comm.TCPConfigFromEnv()
		if err != nil {
			return nil, "", fmt.Errorf("launcher: %w", err)
		}
		cfg.Departures, cfg.Log = x.news, x.log
		g, err := comm.NewTCP(ctx, cfg)
		if err != nil {
			return nil, "", fmt.Errorf("launcher: %v: %w", env, err)
		}
		return g, "tcp", nil
	case KindOpenMPI, KindPMI:
		g, err := comm.NewMPI(ctx)
		if err == nil {
			return g, "mpi", nil
		}
		if !errors.Is(err, comm.ErrUnsupported) {
			return nil, "", fmt.Errorf("launcher: %v: %w", env, err)
		}
		if _, ok := os.LookupEnv("GOEP_MASTER_ADDR"); !ok {
			return nil, "", fmt.Errorf("launcher: started by %s (%v), but this goep has no MPI: rebuild with -tags mpi, or set GOEP_MASTER_ADDR and GOEP_MASTER_PORT to rendezvous over TCP: %w", launcherName(env.Kind), env, err)
		}
		return tcpGroup(ctx, env, x)
	case KindSlurm:
		if _, ok := os.LookupEnv("GOEP_MASTER_ADDR"); !ok {
			return nil, "", fmt.Errorf("launcher: started by srun (%v): set GOEP_MASTER_ADDR (a host of the job, e.g. the first of $SLURM_JOB_NODELIST) and GOEP_MASTER_PORT to rendezvous over TCP", env)
		}
		return tcpGroup(ctx, env, x)
	}
	return nil, "", fmt.Errorf("launcher: unknown launcher kind %q", env.Kind)
}

func launcherName(kind string) string {
	switch kind {
	case KindOpenMPI:
		return "Open MPI"
	case KindPMI:
		return "an MPI with PMI (MPICH, Intel MPI)"
	}
	return kind
}

// tcpGroup joins the TCP rendezvous at GOEP_MASTER_ADDR / GOEP_MASTER_PORT
// with the place that env gives.
func tcpGroup(ctx context.Context, env Env, x tcpExtras) (comm.Group, string, error) {
	cfg, err := tcpConfig(env, os.LookupEnv)
	if err != nil {
		return nil, "", err
	}
	cfg.Departures, cfg.Log = x.news, x.log
	g, err := comm.NewTCP(ctx, cfg)
	if err != nil {
		return nil, "", fmt.Errorf("launcher: %v: %w", env, err)
	}
	return g, "tcp", nil
}

func tcpConfig(env Env, look lookupFunc) (comm.TCPConfig, error) {
	addr, _ := look("GOEP_MASTER_ADDR")
	if strings.TrimSpace(addr) == "" {
		return comm.TCPConfig{}, errors.New("launcher: GOEP_MASTER_ADDR is empty")
	}
	ps, ok := look("GOEP_MASTER_PORT")
	if !ok {
		return comm.TCPConfig{}, errors.New("launcher: GOEP_MASTER_PORT is not set (GOEP_MASTER_ADDR is)")
	}
	port, err := strconv.Atoi(strings.TrimSpace(ps))
	if err != nil || port < 1 || port > 65535 {
		return comm.TCPConfig{}, fmt.Errorf("launcher: GOEP_MASTER_PORT=%q: want a port number in [1, 65535]", ps)
	}
	secret, err := worldSecret(env, look)
	if err != nil {
		return comm.TCPConfig{}, err
	}
	return comm.TCPConfig{
		Addr: strings.TrimSpace(addr), Port: port,
		Rank: env.Rank, Size: env.Size,
		LocalRank: env.LocalRank, LocalSize: env.LocalSize,
		Secret: secret,
	}, nil
}

// ompiJobKey is the variable in which mpirun (Open MPI 4) hands every rank
// of a job the same random key, made for its PSM and OFI transports: a
// secret of the job, readable only by its own processes' user.
const ompiJobKey = "OMPI_MCA_orte_precondition_transports"

// worldSecret is the secret of a TCP world started by env's launcher:
// GOEP_WORLD_SECRET, else under Open MPI mpirun's job key, else (for more
// than one rank) an error saying to set one.
func worldSecret(env Env, look lookupFunc) (string, error) {
	if s, ok := look("GOEP_WORLD_SECRET"); ok {
		if len(s) < 16 {
			return "", fmt.Errorf("launcher: GOEP_WORLD_SECRET of %d bytes: want at least 16 (e.g. `openssl rand -hex 32`, the same on every rank)", len(s))
		}
		return s, nil
	}
	if k, ok := look(ompiJobKey); ok && env.Kind == KindOpenMPI && len(k) >= 16 {
		return "goep/ompi/" + k, nil
	}
	if env.Size == 1 {
		return "", nil
	}
	return "", fmt.Errorf("launcher: %v: GOEP_WORLD_SECRET is not set: a TCP world of %d ranks needs the same secret of at least 16 bytes on every rank, so that no other process can join it (e.g. `export GOEP_WORLD_SECRET=$(openssl rand -hex 32)` before the launcher starts the ranks; with mpirun, add -x GOEP_WORLD_SECRET)", env, env.Size)
}

// bindDevice exports GOEP_DEVICE and binds the CPUs where NVML answers.
func bindDevice(env Env, log *zap.Logger) error {
	dev := env.LocalRank
	if s, ok := os.LookupEnv("GOEP_DEVICE"); ok {
		d, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || d < 0 {
			return fmt.Errorf("launcher: GOEP_DEVICE=%q: want a non-negative GPU index", s)
		}
		dev = d
	} else if err := os.Setenv("GOEP_DEVICE", strconv.Itoa(dev)); err != nil {
		return fmt.Errorf("launcher: set GOEP_DEVICE: %w", err)
	}
	cpus, err := gpuCPUs(dev)
	if err != nil {
		log.Debug("no CPU binding", zap.Int("device", dev), zap.Error(err))
		return nil
	}
	n, err := bindCPUs(cpus)
	switch {
	case err != nil:
		// NVML answered, so binding was expected: say why it did not happen.
		log.Warn("CPU binding failed", zap.Int("device", dev), zap.Error(err))
	case n == 0:
		log.Debug("kept the CPU binding: none of the GPU's CPUs is allowed", zap.Int("device", dev))
	default:
		log.Debug("bound to the CPUs of the GPU", zap.Int("device", dev), zap.Int("cpus", n))
	}
	return nil
}
