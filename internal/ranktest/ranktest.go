// Package ranktest runs a test's ranks as goroutines of one process: the
// multi-rank tests of comm, nvlink, rdma, executor and its data paths give
// each rank of an in-process group (comm.NewLocal) or of a TCP rendezvous
// a goroutine, and compare what each returned.
package ranktest

import (
	"errors"
	"fmt"
	"sync"
)

// Run calls fn(r) for every rank r < n, each on a goroutine of its own,
// and returns each rank's error once every call has returned.
func Run(n int, fn func(r int) error) []error {
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Go(func() { errs[r] = fn(r) })
	}
	wg.Wait()
	return errs
}

// Err joins the ranks' errors, each prefixed with its rank; nil when every
// rank succeeded.
func Err(errs []error) error {
	var all []error
	for r, err := range errs {
		if err != nil {
			all = append(all, fmt.Errorf("rank %d: %w", r, err))
		}
	}
	return errors.Join(all...)
}
