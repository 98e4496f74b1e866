// Package poll waits for work that can only be asked whether it is done:
// GPU streams and events (cuStreamQuery), MPI requests (MPI_Test), UCX
// requests (which move only while the worker is progressed), signal words
// and rings in memory that another process or a device writes.
//
// Such a wait has two costs to balance: sleeping adds latency (Go's timers
// wake no sooner than asked, and often later), and spinning burns a
// processor. Until spins first, for work that is about to complete, then
// sleeps with growing delays, for work that is late. Each caller picks the
// numbers (a Policy) for what it waits on.
//
// Usage:
//
//	p := poll.Policy{Spin: 200 * time.Microsecond, First: 20 * time.Microsecond, Most: 500 * time.Microsecond}
//	err := poll.Until(ctx, p, s.Query) // s.Query() (done bool, err error)
package poll
