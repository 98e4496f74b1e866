package comm

import (
	"context"
	"encoding/binary"
	"fmt"
	"sync"
)

// NewLocal returns n in-process ranks forming one group, for tests and the
// embedded benchmark. Each Group must be used by one goroutine at a time.
func NewLocal(n int) []Group {
	w := &localWorld{size: n, rounds: map[uint64]*round{}, closed: make([]bool, n), closeCh: make(chan struct{})}
	gs := make([]Group, n)
	for r := range gs {
		gs[r] = &localGroup{w: w, rank: r}
	}
	return gs
}

// localWorld is the state shared by the members of one in-process group.
// The k-th collective of every member meets in round k.
type localWorld struct {
	size    int
	mu      sync.Mutex
	rounds  map[uint64]*round
	closed  []bool
	closeCh chan struct{} // closed when any member closes
	anyDown bool
}

type round struct {
	data [][]byte
	// counts holds, in an AllToAllv, each member's send counts (its data
	// is its send buffer).
	counts  [][]int
	arrived []bool
	count   int
	left    int // members that have not yet collected the result
	done    chan struct{}
	// void is the member that left before the round completed, where
	// members lend their buffers (AllToAllv), else -1: the round then
	// fails on every member, none reading a buffer its owner may free.
	void int
	// children holds the sub-worlds a Split creates, by color.
	children map[int]*localWorld
}

type localGroup struct {
	w    *localWorld
	rank int
	seq  uint64
}

func (g *localGroup) Rank() int { return g.rank }
func (g *localGroup) Size() int { return g.w.size }

// exchange is the one primitive: deposit a copy of data in this member's
// next round and wait for everyone's.
func (g *localGroup) exchange(ctx context.Context, op string, data []byte) ([][]byte, *round, error) {
	return g.deposit(ctx, op, append([]byte(nil), data...), nil, false)
}

// deposit is exchange of data the caller gives up: no one writes it again,
// so it is deposited as it is; counts, if any, go beside it (AllToAllv).
// lent: data is the caller's buffer, which peers read after the round
// (AllToAllv): a member that leaves before the round completes voids it.
func (g *localGroup) deposit(ctx context.Context, op string, data []byte, counts []int, lent bool) ([][]byte, *round, error) {
	w := g.w
	seq := g.seq
	g.seq++
	w.mu.Lock()
	if w.closed[g.rank] {
		w.mu.Unlock()
		return nil, nil, fmt.Errorf("comm: %s on rank %d: %w", op, g.rank, ErrClosed)
	}
	rd := w.rounds[seq]
	if rd == nil {
		rd = &round{data: make([][]byte, w.size), counts: make([][]int, w.size), arrived: make([]bool, w.size), left: w.size, done: make(chan struct{}), void: -1}
		w.rounds[seq] = rd
	}
	rd.data[g.rank] = data
	rd.counts[g.rank] = counts
	rd.arrived[g.rank] = true
	rd.count++
	if rd.count == w.size {
		close(rd.done)
	}
	closeCh := w.closeCh
	w.mu.Unlock()

	select {
	case <-rd.done:
	case <-ctx.Done():
		// A round that completed stands, whatever ended ctx meanwhile:
		// every other member has its data (select picks at random among
		// ready cases). One that did not is left, and voided if lent.
		w.mu.Lock()
		complete := rd.count == w.size
		if !complete && lent && rd.void < 0 {
			rd.void = g.rank
		}
		w.mu.Unlock()
		if !complete {
			return nil, nil, g.fail(op, rd, ctx.Err())
		}
	case <-closeCh:
		select {
		case <-rd.done:
		default:
			return nil, nil, g.fail(op, rd, ErrClosed)
		}
	}
	w.mu.Lock()
	rd.left--
	if rd.left == 0 {
		delete(w.rounds, seq)
	}
	void := rd.void
	w.mu.Unlock()
	if void >= 0 {
		return nil, nil, fmt.Errorf("comm: %s on rank %d: rank %d left the exchange before every rank had arrived (its context ended): %w", op, g.rank, void, ErrPeerLost)
	}
	return rd.data, rd, nil
}

func (g *localGroup) fail(op string, rd *round, cause error) error {
	g.w.mu.Lock()
	var missing []int
	for r, ok := range rd.arrived {
		if !ok {
			missing = append(missing, r)
		}
	}
	g.w.mu.Unlock()
	if cause == ErrClosed {
		return fmt.Errorf("comm: %s on rank %d: a peer closed the group while rank(s) %v had not arrived: %w", op, g.rank, missing, ErrClosed)
	}
	if cause == context.Canceled {
		return fmt.Errorf("comm: %s on rank %d: %w", op, g.rank, cause)
	}
	return &TimeoutError{Op: fmt.Sprintf("%s on rank %d", op, g.rank), Missing: missing}
}

func (g *localGroup) AllGather(ctx context.Context, data []byte) ([][]byte, error) {
	all, _, err := g.exchange(ctx, "allgather", data)
	return all, err
}

func (g *localGroup) AllToAll(ctx context.Context, send [][]byte) ([][]byte, error) {
	if len(send) != g.w.size {
		return nil, fmt.Errorf("comm: alltoall on rank %d: %d buffers for %d ranks", g.rank, len(send), g.w.size)
	}
	// Deposit one copy of every outgoing buffer (framed by length) and pick
	// out column g.rank of everyone's: the one copy a message takes, into
	// one allocation of the exact size (the callers reuse their send
	// buffers, so the receivers cannot hold those).
	n := 8 * len(send)
	for _, b := range send {
		n += len(b)
	}
	enc := make([]byte, 0, n)
	for _, b := range send {
		enc = binary.LittleEndian.AppendUint64(enc, uint64(len(b)))
		enc = append(enc, b...)
	}
	all, _, err := g.deposit(ctx, "alltoall", enc, nil, false)
	if err != nil {
		return nil, err
	}
	// Each receiver's part is a view of the sender's deposit, capped so that
	// an append to it reallocates instead of writing over the next part.
	out := make([][]byte, g.w.size)
	for r, d := range all {
		for p := 0; p <= g.rank; p++ {
			n := int(binary.LittleEndian.Uint64(d))
			d = d[8:]
			if p == g.rank {
				out[r] = d[:n:n]
			}
			d = d[n:]
		}
	}
	return out, nil
}

// AllToAllv (see the function AllToAllv): every rank deposits its send
// buffer, as it is, with its counts; each copies its part of every peer's
// into its recv; a second round keeps every rank from returning, and
// writing its send buffer again, until every peer has copied from it.
func (g *localGroup) AllToAllv(ctx context.Context, send []byte, sendCounts []int, recv []byte, recvCounts []int) error {
	if err := checkV(g.rank, g.w.size, send, sendCounts, recv, recvCounts); err != nil {
		return err
	}
	all, rd, err := g.deposit(ctx, "alltoallv", send, sendCounts, true)
	if err != nil {
		return err
	}
	var bad error
	off := 0
	for p, n := range recvCounts {
		src, counts := all[p], rd.counts[p]
		from := 0
		for _, c := range counts[:g.rank] {
			from += c
		}
		if counts[g.rank] != n {
			if bad == nil {
				bad = fmt.Errorf("comm: alltoallv on rank %d: rank %d sent %d bytes, %d expected", g.rank, p, counts[g.rank], n)
			}
		} else {
			copy(recv[off:off+n], src[from:from+n])
		}
		off += n
	}
	// The end round waits for every member's copies whatever ends ctx
	// meanwhile: once the first round completed, every member copies
	// (bounded work, no peer to wait for) and then arrives here, and none
	// may return, and free or reuse its send buffer, while a peer still
	// reads it (a buffer outside the Go heap would be unmapped under the
	// reader).
	if _, _, err := g.exchange(context.WithoutCancel(ctx), "alltoallv (end)", nil); err != nil {
		return err
	}
	return bad
}

func (g *localGroup) Broadcast(ctx context.Context, root int, data []byte) ([]byte, error) {
	if root < 0 || root >= g.w.size {
		return nil, fmt.Errorf("comm: broadcast root %d out of range [0, %d)", root, g.w.size)
	}
	if g.rank != root {
		data = nil
	}
	all, _, err := g.exchange(ctx, "broadcast", data)
	if err != nil {
		return nil, err
	}
	return all[root], nil
}

func (g *localGroup) Barrier(ctx context.Context) error {
	_, _, err := g.exchange(ctx, "barrier", nil)
	return err
}

func (g *localGroup) Split(ctx context.Context, color, key int) (Group, error) {
	var b [16]byte
	binary.LittleEndian.PutUint64(b[:], uint64(int64(color)))
	binary.LittleEndian.PutUint64(b[8:], uint64(int64(key)))
	all, rd, err := g.exchange(ctx, "split", b[:])
	if err != nil {
		return nil, err
	}
	colors := make([]int, len(all))
	keys := make([]int, len(all))
	for r, d := range all {
		colors[r] = int(int64(binary.LittleEndian.Uint64(d)))
		keys[r] = int(int64(binary.LittleEndian.Uint64(d[8:])))
	}
	members, index := splitMembers(g.rank, colors, keys)
	g.w.mu.Lock()
	defer g.w.mu.Unlock()
	if rd.children == nil {
		rd.children = map[int]*localWorld{}
	}
	child := rd.children[color]
	if child == nil {
		n := len(members)
		child = &localWorld{size: n, rounds: map[uint64]*round{}, closed: make([]bool, n), closeCh: make(chan struct{})}
		rd.children[color] = child
	}
	return &localGroup{w: child, rank: index}, nil
}

func (g *localGroup) Close() error {
	w := g.w
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed[g.rank] {
		return nil
	}
	w.closed[g.rank] = true
	if !w.anyDown {
		w.anyDown = true
		close(w.closeCh)
	}
	return nil
}
