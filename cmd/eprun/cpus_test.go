package main

import (
	"runtime"
	"testing"

	"github.com/goep/goep/launcher"
)

func TestShareCPUs(t *testing.T) {
	have := runtime.GOMAXPROCS(0)
	t.Cleanup(func() { runtime.GOMAXPROCS(have) })
	t.Setenv("GOMAXPROCS", "")
	mpi := func(local int) launcher.Env {
		return launcher.Env{Kind: launcher.KindOpenMPI, Size: 2 * local, LocalSize: local}
	}
	for _, tc := range []struct {
		name    string
		env     launcher.Env
		set     string // the GOMAXPROCS variable
		want    int
		changed bool
	}{
		{"one process", launcher.Env{Kind: launcher.KindSingle, Size: 1, LocalSize: 1}, "", have, false},
		{"one rank on the node", mpi(1), "", have, false},
		{"two ranks", mpi(2), "", max(1, have/2), have > 1},
		{"more ranks than CPUs", mpi(4 * have), "", 1, have > 1},
		{"the variable set", mpi(4 * have), "3", have, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			runtime.GOMAXPROCS(have)
			t.Setenv("GOMAXPROCS", tc.set)
			n, changed := shareCPUs(tc.env)
			if n != tc.want || changed != tc.changed || runtime.GOMAXPROCS(0) != tc.want {
				t.Errorf("shareCPUs(%v) = %d, %v (GOMAXPROCS now %d); want %d, %v", tc.env, n, changed, runtime.GOMAXPROCS(0), tc.want, tc.changed)
			}
		})
	}
}
