package executor

// SetAllocHook sets, for the tests of package executor_test (the
// multi-process children), the hook that runs before every NewTensor of
// the engines; nil clears it.
func SetAllocHook(f func(rank int) error) { testHookAlloc = f }

// RunEngines is runRanks for the tests of package executor_test: an
// in-process world of R engines on one host backend, fn on every rank,
// the engines closed and every buffer checked freed.
var RunEngines = runRanks
