package permute

import "golang.org/x/sys/cpu"

// useAsm selects the assembly row loops (rows_amd64.s, sum_amd64.s). Tests
// and benchmarks switch it off to run the reference loops.
var useAsm = cpu.X86.HasAVX2
