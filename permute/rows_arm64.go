package permute

import "golang.org/x/sys/cpu"

// useAsm selects the assembly row loops (rows_arm64.s, sum_arm64.s): NEON
// (ASIMD), which every arm64 CPU Go runs on has. Tests and benchmarks
// switch it off to run the reference loops.
var useAsm = cpu.ARM64.HasASIMD
