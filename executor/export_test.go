package executor

import "fmt"

// SetAllocHook sets, for the tests of package executor_test (the
// multi-process children), the hook that runs before every NewTensor of
// the engines; nil clears it.
func SetAllocHook(f func(rank int) error) { testHookAlloc = f }

// RandomInputs is randomInputs for the tests of package executor_test: T
// tokens' routing over E experts (up to K distinct a token), rows of H
// elements and weights.
var RandomInputs = randomInputs

// RunEngines is runRanks for the tests of package executor_test: an
// in-process world of R engines on one host backend, fn on every rank,
// the engines closed and every buffer checked freed.
var RunEngines = runRanks

// SetFakeFabric makes, for the tests of package executor_test (the
// multi-process children), the ranks look as if they ran on hosts of
// perHost ranks each, all in one NVLink fabric clique (an NVL72 rack's
// trays, emulated on one machine).
func SetFakeFabric(perHost int) {
	testHookDomainKeys = func(rank int, host, fabric, why string) (string, string, string) {
		return fmt.Sprintf("host:fake-tray%d", rank/perHost), "fabric:fake/1", ""
	}
}
