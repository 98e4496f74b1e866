package comm

import (
	"context"
	"encoding/binary"
	"fmt"
	"strings"
	"testing"

	"golang.org/x/sync/errgroup"
)

// checkAllToAllv runs AllToAllv twice over the same buffers, as a user
// would: first the counts (8 bytes to each rank), then parts of those
// lengths, ragged and some empty, every byte naming its sender, receiver
// and round, so that a misplaced or stale byte names itself.
func checkAllToAllv(ctx context.Context, g Group) error {
	n, me := g.Size(), g.Rank()
	length := func(s, d, round int) int { return (3*s + 5*d + round) % 7 * 100 } // 0 for some pairs
	eight := make([]int, n)
	for p := range eight {
		eight[p] = 8
	}
	cs, cr := make([]byte, 8*n), make([]byte, 8*n)
	var send, recv []byte
	for round := range 3 {
		for d := range n {
			binary.LittleEndian.PutUint64(cs[8*d:], uint64(length(me, d, round)))
		}
		if err := AllToAllv(ctx, g, cs, eight, cr, eight); err != nil {
			return err
		}
		sc, rc := make([]int, n), make([]int, n)
		st, rt := 0, 0
		for p := range n {
			sc[p], rc[p] = length(me, p, round), int(binary.LittleEndian.Uint64(cr[8*p:]))
			if rc[p] != length(p, me, round) {
				return fmt.Errorf("rank %d round %d: count %d from rank %d, want %d", me, round, rc[p], p, length(p, me, round))
			}
			st += sc[p]
			rt += rc[p]
		}
		if len(send) < st {
			send = make([]byte, st)
		}
		if len(recv) < rt {
			recv = make([]byte, rt)
		}
		off := 0
		for d, c := range sc {
			for i := range c {
				send[off+i] = byte(31*me + 7*d + round + i)
			}
			off += c
		}
		if err := AllToAllv(ctx, g, send, sc, recv, rc); err != nil {
			return err
		}
		off = 0
		for s, c := range rc {
			for i := range c {
				if want := byte(31*s + 7*me + round + i); recv[off+i] != want {
					return fmt.Errorf("rank %d round %d: byte %d from rank %d is %d, want %d", me, round, i, s, recv[off+i], want)
				}
			}
			off += c
		}
	}
	return nil
}

func TestAllToAllv(t *testing.T) {
	each(t, NewLocal(5), func(g Group) error { return checkAllToAllv(t.Context(), g) })
}

func TestAllToAllvTCP(t *testing.T) {
	each(t, tcpWorld(t, 3), func(g Group) error { return checkAllToAllv(t.Context(), g) })
}

// TestAllToAllvErrors: counts that do not fit the buffers fail before any
// exchange; a receiver that expects another count than its sender sends
// fails, and the others do not.
func TestAllToAllvErrors(t *testing.T) {
	g := NewLocal(2)[0]
	for _, c := range []struct {
		name       string
		send, recv int
		sc, rc     []int
		want       string
	}{
		{"counts for too few ranks", 4, 4, []int{1}, []int{1, 1}, "1 send and 2 receive counts for 2 ranks"},
		{"send past the buffer", 3, 4, []int{2, 2}, []int{1, 1}, "send counts total 4 bytes, the buffer has 3"},
		{"receive past the buffer", 4, 1, []int{1, 1}, []int{1, 1}, "receive counts total 2 bytes, the buffer has 1"},
		{"negative count", 4, 4, []int{1, -1}, []int{1, 1}, "send count -1 for rank 1"},
	} {
		err := AllToAllv(t.Context(), g, make([]byte, c.send), c.sc, make([]byte, c.recv), c.rc)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got %v, want an error saying %q", c.name, err, c.want)
		}
	}

	gs := NewLocal(3)
	errs := make([]error, len(gs))
	var eg errgroup.Group
	for r, g := range gs {
		eg.Go(func() error {
			rc := []int{2, 2, 2}
			if r == 1 {
				rc[2] = 3 // rank 2 sends 2
			}
			errs[r] = AllToAllv(t.Context(), g, make([]byte, 6), []int{2, 2, 2}, make([]byte, 7), rc)
			return nil
		})
	}
	eg.Wait()
	for r, err := range errs {
		want := ""
		if r == 1 {
			want = "rank 2 sent 2 bytes, 3 expected"
		}
		if (err == nil) != (want == "") || (err != nil && !strings.Contains(err.Error(), want)) {
			t.Errorf("rank %d: got %v, want %q", r, err, want)
		}
	}
}
