package launcher

import (
	"reflect"
	"strings"
	"testing"
)

func TestDetect(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  map[string]string
		want Env
		err  string // substring of the error; "" for none
	}{
		{name: "none", want: Env{KindSingle, 0, 1, 0, 1}},
		{name: "unrelated", env: map[string]string{"SLURM_JOB_ID": "7", "LOCAL_RANK": "3"}, want: Env{KindSingle, 0, 1, 0, 1}},

		{name: "torchrun", env: map[string]string{"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4", "GOEP_MASTER_ADDR": "h0", "GOEP_MASTER_PORT": "29500"},
			want: Env{KindTorchrun, 5, 8, 1, 4}},
		{name: "torchrun without LOCAL_RANK", env: map[string]string{"RANK": "0", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"}, err: "LOCAL_WORLD_SIZE is set but LOCAL_RANK is not"},
		{name: "torchrun without LOCAL_WORLD_SIZE", env: map[string]string{"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0"}, err: "LOCAL_RANK is set but LOCAL_WORLD_SIZE is not"},
		{name: "torchrun one host", env: map[string]string{"RANK": "2", "WORLD_SIZE": "3"}, want: Env{KindTorchrun, 2, 3, 2, 3}},
		{name: "torchrun bad local rank", env: map[string]string{"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "x", "LOCAL_WORLD_SIZE": "2"}, err: `LOCAL_RANK="x"`},
		{name: "torchrun without WORLD_SIZE", env: map[string]string{"RANK": "0", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"}, err: "WORLD_SIZE is not set"},
		{name: "torchrun rank too large", env: map[string]string{"RANK": "2", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"}, err: "RANK=2 is not below WORLD_SIZE=2"},
		{name: "torchrun bad number", env: map[string]string{"RANK": "one", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"}, err: `RANK="one"`},
		{name: "torchrun empty", env: map[string]string{"RANK": "", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"}, err: `RANK=""`},
		{name: "torchrun negative", env: map[string]string{"RANK": "-1", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"}, err: `RANK="-1"`},
		{name: "torchrun zero size", env: map[string]string{"RANK": "0", "WORLD_SIZE": "0", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"}, err: "WORLD_SIZE=0"},
		{name: "torchrun local rank too large", env: map[string]string{"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "2"}, err: "LOCAL_RANK=2 is not below LOCAL_WORLD_SIZE=2"},
		{name: "torchrun local size too large", env: map[string]string{"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4"}, err: "LOCAL_WORLD_SIZE=4 exceeds WORLD_SIZE=2"},
		// eprun launch or torchrun under srun or mpirun: the innermost wins.
		{name: "torchrun under slurm", env: map[string]string{"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "4", "SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_LOCALID": "0", "SLURM_TASKS_PER_NODE": "1"},
			want: Env{KindTorchrun, 3, 4, 3, 4}},
		{name: "torchrun under ompi", env: map[string]string{"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "1"},
			want: Env{KindTorchrun, 1, 2, 1, 2}},

		{name: "ompi", env: map[string]string{"OMPI_COMM_WORLD_RANK": "9", "OMPI_COMM_WORLD_SIZE": "16", "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "8"},
			want: Env{KindOpenMPI, 9, 16, 1, 8}},
		{name: "ompi missing local size", env: map[string]string{"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "1", "OMPI_COMM_WORLD_LOCAL_RANK": "0"}, err: "OMPI_COMM_WORLD_LOCAL_SIZE is not set"},
		{name: "ompi rank out of range", env: map[string]string{"OMPI_COMM_WORLD_RANK": "4", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "0", "OMPI_COMM_WORLD_LOCAL_SIZE": "1"}, err: "OMPI_COMM_WORLD_RANK=4 is not below OMPI_COMM_WORLD_SIZE=4"},
		// mpirun inside a Slurm allocation: Open MPI describes the process.
		{name: "ompi in slurm allocation", env: map[string]string{"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "2", "OMPI_COMM_WORLD_LOCAL_SIZE": "4", "SLURM_PROCID": "0", "SLURM_NTASKS": "4"},
			want: Env{KindOpenMPI, 2, 4, 2, 4}},

		{name: "hydra", env: map[string]string{"PMI_RANK": "3", "PMI_SIZE": "4", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2"},
			want: Env{KindPMI, 3, 4, 1, 2}},
		{name: "cray pmi", env: map[string]string{"PMI_RANK": "3", "PMI_SIZE": "4", "PMI_LOCAL_RANK": "1", "PMI_LOCAL_SIZE": "2"},
			want: Env{KindPMI, 3, 4, 1, 2}},
		{name: "pmi both local names agree", env: map[string]string{"PMI_RANK": "3", "PMI_SIZE": "4", "MPI_LOCALRANKID": "1", "PMI_LOCAL_RANK": "1", "MPI_LOCALNRANKS": "2"},
			want: Env{KindPMI, 3, 4, 1, 2}},
		{name: "pmi local names conflict", env: map[string]string{"PMI_RANK": "3", "PMI_SIZE": "4", "MPI_LOCALRANKID": "1", "PMI_LOCAL_RANK": "0", "MPI_LOCALNRANKS": "2"},
			err: "PMI_LOCAL_RANK=0 conflicts with MPI_LOCALRANKID=1"},
		{name: "pmi2 under srun", env: map[string]string{"PMI_RANK": "5", "PMI_SIZE": "8", "SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1", "SLURM_NODEID": "1", "SLURM_TASKS_PER_NODE": "4(x2)"},
			want: Env{KindPMI, 5, 8, 1, 4}},
		{name: "pmi without local", env: map[string]string{"PMI_RANK": "0", "PMI_SIZE": "2"}, err: "MPI_LOCALRANKID or PMI_LOCAL_RANK is not set"},
		{name: "pmi without local size", env: map[string]string{"PMI_RANK": "0", "PMI_SIZE": "2", "MPI_LOCALRANKID": "0"}, err: "MPI_LOCALNRANKS or PMI_LOCAL_SIZE is not set"},
		{name: "pmi missing size", env: map[string]string{"PMI_RANK": "0"}, err: "PMI_SIZE is not set"},

		{name: "slurm ntasks per node", env: map[string]string{"SLURM_PROCID": "6", "SLURM_NTASKS": "8", "SLURM_LOCALID": "2", "SLURM_NTASKS_PER_NODE": "4"},
			want: Env{KindSlurm, 6, 8, 2, 4}},
		{name: "slurm tasks per node list", env: map[string]string{"SLURM_PROCID": "9", "SLURM_NTASKS": "10", "SLURM_LOCALID": "0", "SLURM_NODEID": "3", "SLURM_TASKS_PER_NODE": "3(x3),1"},
			want: Env{KindSlurm, 9, 10, 0, 1}},
		{name: "slurm step list wins", env: map[string]string{"SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_LOCALID": "1", "SLURM_NODEID": "0", "SLURM_STEP_TASKS_PER_NODE": "2", "SLURM_TASKS_PER_NODE": "8"},
			want: Env{KindSlurm, 1, 2, 1, 2}},
		{name: "slurm uniform list without node id", env: map[string]string{"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1", "SLURM_TASKS_PER_NODE": "4(x2)"},
			want: Env{KindSlurm, 5, 8, 1, 4}},
		{name: "slurm nprocs", env: map[string]string{"SLURM_PROCID": "0", "SLURM_NPROCS": "2", "SLURM_LOCALID": "0", "SLURM_NTASKS_PER_NODE": "2"},
			want: Env{KindSlurm, 0, 2, 0, 2}},
		{name: "slurm ntasks conflict", env: map[string]string{"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_NPROCS": "4", "SLURM_LOCALID": "0", "SLURM_NTASKS_PER_NODE": "2"},
			err: "SLURM_NPROCS=4 conflicts with SLURM_NTASKS=2"},
		{name: "slurm ragged list without node id", env: map[string]string{"SLURM_PROCID": "0", "SLURM_NTASKS": "3", "SLURM_LOCALID": "0", "SLURM_TASKS_PER_NODE": "2,1"},
			err: "SLURM_NODEID is not set"},
		{name: "slurm node id past list", env: map[string]string{"SLURM_PROCID": "0", "SLURM_NTASKS": "3", "SLURM_LOCALID": "0", "SLURM_NODEID": "2", "SLURM_TASKS_PER_NODE": "2,1"},
			err: "SLURM_NODEID=2"},
		{name: "slurm bad list", env: map[string]string{"SLURM_PROCID": "0", "SLURM_NTASKS": "3", "SLURM_LOCALID": "0", "SLURM_TASKS_PER_NODE": "2(x"},
			err: `SLURM_TASKS_PER_NODE="2(x"`},
		{name: "slurm no local size", env: map[string]string{"SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_LOCALID": "0"},
			err: "SLURM_NTASKS_PER_NODE or SLURM_TASKS_PER_NODE is not set"},
		{name: "slurm local id too large", env: map[string]string{"SLURM_PROCID": "3", "SLURM_NTASKS": "4", "SLURM_LOCALID": "2", "SLURM_NTASKS_PER_NODE": "2"},
			err: "SLURM_LOCALID=2 is not below SLURM_NTASKS_PER_NODE=2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := detect(func(k string) (string, bool) { v, ok := tc.env[k]; return v, ok })
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("got %+v, %v; want an error containing %q", got, err, tc.err)
				}
				return
			}
			if err != nil || !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("got %+v, %v; want %+v", got, err, tc.want)
			}
		})
	}
}

func TestParseTasksPerNode(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []int
	}{
		{"4", []int{4}},
		{"2(x3),1", []int{2, 2, 2, 1}},
		{"1,3(x2)", []int{1, 3, 3}},
	} {
		got, err := parseTasksPerNode(tc.in)
		if err != nil || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%q: %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}
	huge := strings.Repeat("1(x1048576),", 400) + "1" // once expanded item by item: GBs
	for _, bad := range []string{"", "x", "0", "2(x0)", "2(x3", "2(3)", ",1", huge} {
		if got, err := parseTasksPerNode(bad); err == nil {
			t.Errorf("%q: %v, want an error", bad, got)
		}
	}
}

// TestDetectProcess checks that Detect reads the process environment.
func TestDetectProcess(t *testing.T) {
	t.Setenv("RANK", "1")
	t.Setenv("WORLD_SIZE", "3")
	t.Setenv("LOCAL_RANK", "0")
	t.Setenv("LOCAL_WORLD_SIZE", "1")
	got, err := Detect()
	if want := (Env{KindTorchrun, 1, 3, 0, 1}); err != nil || got != want {
		t.Errorf("got %+v, %v; want %+v", got, err, want)
	}
}
