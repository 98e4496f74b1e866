package ranktest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
)

// Collectives are one rank's handles on a group's collectives, named as in
// comm.Group: the same rounds check comm's groups and the communicators of
// internal/mpi underneath them.
type Collectives struct {
	Rank, Size int
	AllGather  func(ctx context.Context, data []byte) ([][]byte, error)
	AllToAll   func(ctx context.Context, send [][]byte) ([][]byte, error)
	// Broadcast returns root's data on every rank; data is ignored
	// elsewhere.
	Broadcast func(ctx context.Context, root int, data []byte) ([]byte, error)
	Barrier   func(ctx context.Context) error
}

// Payload is rank r's data for peer p in round i; it names all three, and
// lengths differ, 0 included.
func Payload(i, r, p int) []byte {
	b := make([]byte, (r*3+p+i)%5)
	for j := range b {
		b[j] = byte(100*i + 10*r + p + j)
	}
	return b
}

// CheckCollectives runs rounds of AllGather, AllToAll, Broadcast (from a
// different root each round) and Barrier with Payload's data, and returns
// every mismatch it sees; a failed call ends it. Every rank of the group
// must call it with the same rounds.
func CheckCollectives(ctx context.Context, c Collectives, rounds int) error {
	me, n := c.Rank, c.Size
	var errs []error
	for i := range rounds {
		all, err := c.AllGather(ctx, Payload(i, me, 0))
		if err != nil {
			return err
		}
		if len(all) != n {
			return fmt.Errorf("allgather round %d: %d buffers, want %d", i, len(all), n)
		}
		for r := range n {
			if want := Payload(i, r, 0); !bytes.Equal(all[r], want) {
				errs = append(errs, fmt.Errorf("allgather round %d: from rank %d got %v, want %v", i, r, all[r], want))
			}
		}

		send := make([][]byte, n)
		for p := range send {
			send[p] = Payload(i, me, p)
		}
		recv, err := c.AllToAll(ctx, send)
		if err != nil {
			return err
		}
		if len(recv) != n {
			return fmt.Errorf("alltoall round %d: %d buffers, want %d", i, len(recv), n)
		}
		for r := range n {
			if want := Payload(i, r, me); !bytes.Equal(recv[r], want) {
				errs = append(errs, fmt.Errorf("alltoall round %d: from rank %d got %v, want %v", i, r, recv[r], want))
			}
		}

		// Every other round the ranks but root pass nothing: either way
		// only root's data may arrive.
		root := i % n
		var data []byte
		if me == root || i%2 == 0 {
			data = Payload(i, me, 7)
		}
		got, err := c.Broadcast(ctx, root, data)
		if err != nil {
			return err
		}
		if want := Payload(i, root, 7); !bytes.Equal(got, want) {
			errs = append(errs, fmt.Errorf("broadcast round %d from %d: got %v, want %v", i, root, got, want))
		}

		if err := c.Barrier(ctx); err != nil {
			return err
		}
	}
	return errors.Join(errs...)
}
