// Package device is goep's backend layer: memory, ordered streams, events and
// tensors.
//
// A backend behaves like a GPU whatever it runs on. Work is enqueued on a
// Stream and runs later, in order; results are ready after Synchronize or once
// an Event recorded after the work has completed. Memory is freed in stream
// order: a Free (or a Tensor's Close, or its garbage collection) returns the
// memory to the pool only after every task queued before it has finished, so
// no queued work ever sees its memory handed to someone else (DESIGN.md
// invariant 2).
//
// The host backend (NewHost) keeps "device memory" in mmap'd regions, never
// on the Go heap, and runs each stream's tasks on a worker goroutine; large
// copies fan out over all cores (ParallelFor). The CUDA backend (build tag
// cuda) implements the same types over the CUDA driver.
//
// Usage:
//
//	b := device.NewHost()
//	s, _ := b.NewStream()
//	x, _ := device.NewTensor(s, device.BF16, 128, 7168)
//	_ = device.Upload(ctx, x, hostBytes)
//	... enqueue work on s ...
//	err := s.Synchronize(ctx)
package device
