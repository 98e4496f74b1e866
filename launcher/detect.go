package launcher

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Kinds of launcher that Detect recognises.
const (
	KindOpenMPI  = "ompi"     // Open MPI's mpirun / prterun
	KindPMI      = "pmi"      // MPICH / Intel MPI Hydra (PMI)
	KindSlurm    = "slurm"    // srun
	KindTorchrun = "torchrun" // torchrun, or eprun launch
	KindSingle   = "single"   // no launcher: one process
)

// Env is where a launcher put this process: the launcher's kind and this
// rank's place among all ranks and among those on its node.
type Env struct {
	// Kind is KindOpenMPI, KindPMI, KindSlurm, KindTorchrun or KindSingle.
	Kind string
	// Rank is this process's index in [0, Size).
	Rank, Size int
	// LocalRank is its index among the LocalSize ranks of its node; it is
	// also the index of the GPU it uses.
	LocalRank, LocalSize int
}

func (e Env) String() string {
	return fmt.Sprintf("%s rank %d of %d (local %d of %d)", e.Kind, e.Rank, e.Size, e.LocalRank, e.LocalSize)
}

// Detect reports which launcher started this process and this rank's place,
// from the environment.
//
// When several launchers' variables are present (eprun launch or torchrun
// run under srun, mpirun inside a Slurm allocation), the innermost one
// describes this process; it wins in the order torchrun (RANK, WORLD_SIZE,
// LOCAL_RANK, LOCAL_WORLD_SIZE, as eprun launch sets them and
// comm.TCPConfigFromEnv reads them: without the LOCAL pair, all ranks are
// on one host), Open MPI
// (OMPI_COMM_WORLD_*), PMI (PMI_RANK, PMI_SIZE, MPI_LOCALRANKID /
// PMI_LOCAL_RANK, MPI_LOCALNRANKS / PMI_LOCAL_SIZE), Slurm (SLURM_PROCID,
// SLURM_NTASKS, SLURM_LOCALID, SLURM_NTASKS_PER_NODE or this node's entry of
// SLURM_STEP_TASKS_PER_NODE / SLURM_TASKS_PER_NODE). Without any of them
// Detect returns a single process (KindSingle, rank 0 of 1).
//
// A variable of the chosen launcher that is missing, not an integer, out of
// range, or in conflict with another that says the same thing is an error
// naming it, never a silent default.
func Detect() (Env, error) { return detect(os.LookupEnv) }

type lookupFunc func(string) (string, bool)

func detect(look lookupFunc) (Env, error) {
	has := func(names ...string) bool {
		for _, n := range names {
			if _, ok := look(n); ok {
				return true
			}
		}
		return false
	}
	var (
		e   Env
		err error
	)
	switch {
	case has("RANK", "WORLD_SIZE"):
		e, err = detectTorchrun(look)
	case has("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"):
		e, err = detectOpenMPI(look)
	case has("PMI_RANK", "PMI_SIZE"):
		e, err = detectPMI(look)
	case has("SLURM_PROCID"):
		e, err = detectSlurm(look)
	default:
		return Env{Kind: KindSingle, Rank: 0, Size: 1, LocalRank: 0, LocalSize: 1}, nil
	}
	if err != nil {
		return Env{}, fmt.Errorf("launcher: %s environment: %w", e.Kind, err)
	}
	return e, e.check()
}

// vars reads integer variables, remembering which name gave each value so
// that errors can name it.
type vars struct{ look lookupFunc }

// get parses the first of names that is set (or reports that none is). When
// several are set they must agree.
func (v vars) get(names ...string) (val int, name string, ok bool, err error) {
	for _, n := range names {
		s, set := v.look(n)
		if !set {
			continue
		}
		x, perr := strconv.Atoi(strings.TrimSpace(s))
		if perr != nil || x < 0 {
			return 0, n, false, fmt.Errorf("%s=%q: want a non-negative integer", n, s)
		}
		if ok && x != val {
			return 0, n, false, fmt.Errorf("%s=%d conflicts with %s=%d", n, x, name, val)
		}
		if !ok {
			val, name, ok = x, n, true
		}
	}
	return val, name, ok, nil
}

// need is get for a value that must be present.
func (v vars) need(names ...string) (int, string, error) {
	val, name, ok, err := v.get(names...)
	if err != nil {
		return 0, name, err
	}
	if !ok {
		return 0, names[0], fmt.Errorf("%s is not set", strings.Join(names, " or "))
	}
	return val, name, nil
}

// place is an Env being built, with the names its values came from.
type place struct {
	Env
	rankVar, sizeVar, localRankVar, localSizeVar string
}

func (p *place) read(v vars, rank, size, localRank, localSize []string) error {
	var err error
	if p.Rank, p.rankVar, err = v.need(rank...); err != nil {
		return err
	}
	if p.Size, p.sizeVar, err = v.need(size...); err != nil {
		return err
	}
	if localRank != nil {
		if p.LocalRank, p.localRankVar, err = v.need(localRank...); err != nil {
			return err
		}
	}
	if localSize != nil {
		if p.LocalSize, p.localSizeVar, err = v.need(localSize...); err != nil {
			return err
		}
	}
	return nil
}

// validate checks the ranges, naming the variable at fault.
func (p *place) validate() error {
	switch {
	case p.Size < 1:
		return fmt.Errorf("%s=%d: want at least 1", p.sizeVar, p.Size)
	case p.Rank >= p.Size:
		return fmt.Errorf("%s=%d is not below %s=%d", p.rankVar, p.Rank, p.sizeVar, p.Size)
	case p.LocalSize < 1:
		return fmt.Errorf("%s=%d: want at least 1", p.localSizeVar, p.LocalSize)
	case p.LocalRank >= p.LocalSize:
		return fmt.Errorf("%s=%d is not below %s=%d", p.localRankVar, p.LocalRank, p.localSizeVar, p.LocalSize)
	case p.LocalSize > p.Size:
		return fmt.Errorf("%s=%d exceeds %s=%d", p.localSizeVar, p.LocalSize, p.sizeVar, p.Size)
	}
	return nil
}

// check is the last sanity check of a detected Env (validate has named the
// variables already; this catches a bug in a detector).
func (e Env) check() error {
	if e.Size < 1 || e.Rank < 0 || e.Rank >= e.Size || e.LocalSize < 1 || e.LocalRank < 0 || e.LocalRank >= e.LocalSize || e.LocalSize > e.Size {
		return fmt.Errorf("launcher: inconsistent %v", e)
	}
	return nil
}

// detectTorchrun reads the variables the way comm.TCPConfigFromEnv does:
// LOCAL_RANK and LOCAL_WORLD_SIZE are set together or not at all, and
// default to RANK and WORLD_SIZE (every rank on one host).
func detectTorchrun(look lookupFunc) (Env, error) {
	p := place{Env: Env{Kind: KindTorchrun}}
	v := vars{look}
	if err := p.read(v, []string{"RANK"}, []string{"WORLD_SIZE"}, nil, nil); err != nil {
		return p.Env, err
	}
	switch lr, ls := has(look, "LOCAL_RANK"), has(look, "LOCAL_WORLD_SIZE"); {
	case lr && ls:
		var err error
		if p.LocalRank, p.localRankVar, err = v.need("LOCAL_RANK"); err != nil {
			return p.Env, err
		}
		if p.LocalSize, p.localSizeVar, err = v.need("LOCAL_WORLD_SIZE"); err != nil {
			return p.Env, err
		}
	case lr:
		return p.Env, errors.New("LOCAL_RANK is set but LOCAL_WORLD_SIZE is not (set both or neither)")
	case ls:
		return p.Env, errors.New("LOCAL_WORLD_SIZE is set but LOCAL_RANK is not (set both or neither)")
	default:
		p.LocalRank, p.localRankVar, p.LocalSize, p.localSizeVar = p.Rank, "RANK", p.Size, "WORLD_SIZE"
	}
	return p.Env, p.validate()
}

func detectOpenMPI(look lookupFunc) (Env, error) {
	p := place{Env: Env{Kind: KindOpenMPI}}
	if err := p.read(vars{look},
		[]string{"OMPI_COMM_WORLD_RANK"}, []string{"OMPI_COMM_WORLD_SIZE"},
		[]string{"OMPI_COMM_WORLD_LOCAL_RANK"}, []string{"OMPI_COMM_WORLD_LOCAL_SIZE"}); err != nil {
		return p.Env, err
	}
	return p.Env, p.validate()
}

// detectPMI reads Hydra's variables (MPICH, Intel MPI), or Cray PMI's local
// ones; under srun --mpi=pmi2, which sets no local variables, Slurm's.
func detectPMI(look lookupFunc) (Env, error) {
	p := place{Env: Env{Kind: KindPMI}}
	v := vars{look}
	if err := p.read(v, []string{"PMI_RANK"}, []string{"PMI_SIZE"}, nil, nil); err != nil {
		return p.Env, err
	}
	lr, lrName, lrOK, err := v.get("MPI_LOCALRANKID", "PMI_LOCAL_RANK")
	if err != nil {
		return p.Env, err
	}
	ls, lsName, lsOK, err := v.get("MPI_LOCALNRANKS", "PMI_LOCAL_SIZE")
	if err != nil {
		return p.Env, err
	}
	switch {
	case lrOK && lsOK:
		p.LocalRank, p.localRankVar, p.LocalSize, p.localSizeVar = lr, lrName, ls, lsName
	case !lrOK && !lsOK && has(look, "SLURM_LOCALID"):
		s, err := detectSlurm(look)
		if err != nil {
			return p.Env, fmt.Errorf("local rank from Slurm (no MPI_LOCALRANKID): %w", err)
		}
		p.LocalRank, p.localRankVar, p.LocalSize, p.localSizeVar = s.LocalRank, "SLURM_LOCALID", s.LocalSize, "Slurm's tasks per node"
	case !lrOK:
		return p.Env, fmt.Errorf("MPI_LOCALRANKID or PMI_LOCAL_RANK is not set")
	default:
		return p.Env, fmt.Errorf("MPI_LOCALNRANKS or PMI_LOCAL_SIZE is not set")
	}
	return p.Env, p.validate()
}

func has(look lookupFunc, name string) bool { _, ok := look(name); return ok }

func detectSlurm(look lookupFunc) (Env, error) {
	p := place{Env: Env{Kind: KindSlurm}}
	v := vars{look}
	if err := p.read(v, []string{"SLURM_PROCID"}, []string{"SLURM_NTASKS", "SLURM_NPROCS"}, []string{"SLURM_LOCALID"}, nil); err != nil {
		return p.Env, err
	}
	n, name, ok, err := v.get("SLURM_NTASKS_PER_NODE")
	if err != nil {
		return p.Env, err
	}
	if ok {
		p.LocalSize, p.localSizeVar = n, name
		return p.Env, p.validate()
	}
	for _, list := range []string{"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"} {
		s, ok := look(list)
		if !ok {
			continue
		}
		counts, err := parseTasksPerNode(s)
		if err != nil {
			return p.Env, fmt.Errorf("%s=%q: %w", list, s, err)
		}
		node, nodeVar, nodeOK, err := v.get("SLURM_STEP_NODEID", "SLURM_NODEID")
		if err != nil {
			return p.Env, err
		}
		switch {
		case nodeOK && node >= len(counts):
			return p.Env, fmt.Errorf("%s=%d but %s=%q lists %d nodes", nodeVar, node, list, s, len(counts))
		case nodeOK:
			p.LocalSize = counts[node]
		case uniform(counts):
			p.LocalSize = counts[0]
		default:
			return p.Env, fmt.Errorf("%s=%q differs between nodes and SLURM_NODEID is not set", list, s)
		}
		p.localSizeVar = list
		return p.Env, p.validate()
	}
	return p.Env, fmt.Errorf("SLURM_NTASKS_PER_NODE or SLURM_TASKS_PER_NODE is not set")
}

// parseTasksPerNode expands Slurm's compressed list of tasks per node:
// "2(x3),1" is [2 2 2 1]. The list has at most maxNodes entries in all.
func parseTasksPerNode(s string) ([]int, error) {
	var out []int
	for _, item := range strings.Split(s, ",") {
		count, rep := item, "1"
		if c, r, ok := strings.Cut(item, "(x"); ok {
			r, ok = strings.CutSuffix(r, ")")
			if !ok {
				return nil, fmt.Errorf("bad item %q", item)
			}
			count, rep = c, r
		}
		n, err := strconv.Atoi(count)
		if err != nil || n < 1 {
			return nil, fmt.Errorf("bad count in %q", item)
		}
		k, err := strconv.Atoi(rep)
		if err != nil || k < 1 || k > maxNodes-len(out) {
			return nil, fmt.Errorf("bad repeat in %q (at most %d nodes in all)", item, maxNodes)
		}
		for range k {
			out = append(out, n)
		}
	}
	return out, nil
}

// maxNodes bounds the nodes of a Slurm tasks-per-node list (its expanded
// length): far more than any job, small enough to expand.
const maxNodes = 1 << 20

func uniform(xs []int) bool {
	for _, x := range xs {
		if x != xs[0] {
			return false
		}
	}
	return true
}
