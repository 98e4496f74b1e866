// Package launcher starts goep's ranks and tells each where it stands.
//
// A program run by mpirun, srun, torchrun or eprun launch calls Bootstrap
// once, early in main: it detects the launcher from the environment, binds
// the process to its GPU (GOEP_DEVICE = local rank) and the CPUs near it,
// and returns the group of all ranks.
//
//	g, env, err := launcher.Bootstrap(ctx, launcher.WithLogger(log))
//	if err != nil { ... }
//	defer g.Close()
//	// env.Rank of env.Size, GPU env.LocalRank
//
// Spawn is the local spawner behind eprun launch: it runs N ranks of a
// command on this machine with the TCP rendezvous environment (and a fresh
// world secret, so that only its ranks can join), prefixes their output
// with "[rank K] ", tells the ranks when one's process ends (so that a rank
// gone before it joined fails the others' Bootstrap at once), and when one
// rank fails terminates the others and reports which failed and how.
//
//	err := launcher.Spawn(ctx, launcher.SpawnConfig{N: 4, Command: []string{"eprun", "bench"}})
package launcher
