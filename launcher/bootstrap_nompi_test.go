//go:build !mpi

package launcher

import (
	"errors"
	"strings"
	"testing"

	"github.com/goep/goep/comm"
)

// Without the mpi tag, a rank started by mpirun falls back to TCP when
// GOEP_MASTER_ADDR is set, and otherwise says how to fix it.
func TestBootstrapMPIWithoutTag(t *testing.T) {
	ompi := map[string]string{"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "1", "OMPI_COMM_WORLD_LOCAL_RANK": "0", "OMPI_COMM_WORLD_LOCAL_SIZE": "1"}
	hydra := map[string]string{"PMI_RANK": "0", "PMI_SIZE": "1", "MPI_LOCALRANKID": "0", "MPI_LOCALNRANKS": "1"}
	for name, env := range map[string]map[string]string{"ompi": ompi, "pmi": hydra} {
		t.Run(name+"/no master", func(t *testing.T) {
			setLauncherEnv(t, env)
			g, _, err := Bootstrap(t.Context())
			if err == nil {
				g.Close()
				t.Fatal("no error")
			}
			if !errors.Is(err, comm.ErrUnsupported) || !strings.Contains(err.Error(), "-tags mpi") || !strings.Contains(err.Error(), "GOEP_MASTER_ADDR") {
				t.Errorf("error %q: want ErrUnsupported, saying to build with -tags mpi or set GOEP_MASTER_ADDR", err)
			}
		})
		t.Run(name+"/tcp fallback", func(t *testing.T) {
			setLauncherEnv(t, with(env, "GOEP_MASTER_ADDR", "127.0.0.1", "GOEP_MASTER_PORT", freePortString(t)))
			g, e, err := Bootstrap(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			defer g.Close()
			if e.Kind != name || g.Size() != 1 {
				t.Errorf("env %v, group of %d", e, g.Size())
			}
			if err := g.Barrier(t.Context()); err != nil {
				t.Error(err)
			}
		})
	}
}
