package rdma

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/goep/goep/comm"
)

// TestFeed runs FeedRounds on the in-process transport (over UCX:
// TestInProcessFeed, tag ucx).
func TestFeed(t *testing.T) {
	const R, chunk = 3, 64
	cfg := Config{SendBytes: R * chunk, RecvBytes: R * chunk}
	runLocal(t, R, cfg, NewInProcess, func(ctx context.Context, g comm.Group, tr Transport) error {
		return FeedRounds(ctx, g, tr, 40, chunk)
	})
}

// FeedRounds has a "device" goroutine write descriptors into a Feed of tr
// the way the rail kernel does (Ring.Store, after the bytes), while the
// host announces them and drains: every peer must receive every round's
// bytes (chunk of them, self-checking words) under the round's signal,
// over rounds that wrap a ring of 4 descriptors several times, with
// descriptors written before and after Expect. tr's regions hold
// Size()*chunk bytes.
func FeedRounds(ctx context.Context, g comm.Group, tr Transport, rounds uint64, chunk int) (err error) {
	f, err := NewFeed(tr, 4)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, f.Close()) }()
	me, R := tr.Rank(), tr.Size()
	var peers []int
	for p := range R {
		if p != me {
			peers = append(peers, p)
		}
	}
	ring := &Ring{mem: f.Memory(), size: uint64(f.Size()), mask: uint64(f.Size() - 1)}
	for e := uint64(1); e <= rounds; e++ {
		send := tr.SendBuffer()
		for _, p := range peers {
			for o := 0; o < chunk; o += 8 {
				binary.LittleEndian.PutUint64(send[p*chunk+o:], ChunkWord(me, p, e, o))
			}
		}
		// Per peer, the rail kernel's two descriptors: the bytes, then
		// the signal alone (with 2 peers, every round fills the ring).
		n := 2 * len(peers)
		pos, err := f.Next(n)
		if err != nil {
			return err
		}
		device := func() {
			for i, p := range peers {
				ring.Store(pos+uint64(2*i), Work{Peer: p, LocalOff: p * chunk, RemoteOff: me * chunk, Bytes: chunk})
				ring.Store(pos+uint64(2*i+1), Work{Peer: p, Epoch: e})
			}
		}
		if e%3 == 0 {
			device() // written before the host announces them
			f.Expect(n)
		} else {
			f.Expect(n)
			go func() {
				time.Sleep(time.Duration(e%4) * 100 * time.Microsecond)
				device()
			}()
		}
		if err := f.Drain(ctx); err != nil {
			return err
		}
		if err := tr.WaitAll(ctx, peers, e); err != nil {
			return err
		}
		recv := tr.RecvBuffer()
		for _, p := range peers {
			for o := 0; o < chunk; o += 8 {
				if got, want := binary.LittleEndian.Uint64(recv[p*chunk+o:]), ChunkWord(p, me, e, o); got != want {
					return fmt.Errorf("round %d: word %d from rank %d is %#x, want %#x", e, o, p, got, want)
				}
			}
		}
		// The send region is reused next round (its puts must be done),
		// and nobody rewrites the receive region before every peer has
		// read it.
		if err := tr.Flush(ctx); err != nil {
			return err
		}
		if err := g.Barrier(ctx); err != nil {
			return err
		}
	}
	return nil
}

// TestFeedErrors: a descriptor out of bounds fails the Drain with the
// transport's ErrInvalidWork (and the next Drain is clean), a device that
// writes fewer descriptors than announced is named at the deadline, Next
// refuses more descriptors than the ring has free slots, and Close reports
// descriptors left behind.
func TestFeedErrors(t *testing.T) {
	runLocal(t, 1, Config{SendBytes: 64, RecvBytes: 64}, NewInProcess, func(ctx context.Context, g comm.Group, tr Transport) error {
		f, err := NewFeed(tr, 2)
		if err != nil {
			return err
		}
		ring := &Ring{mem: f.Memory(), size: 2, mask: 1}
		if _, err := f.Next(3); !errors.Is(err, ErrInvalidWork) {
			return fmt.Errorf("Next(3) on a ring of 2: %v, want ErrInvalidWork", err)
		}
		pos, err := f.Next(1)
		if err != nil {
			return err
		}
		ring.Store(pos, Work{Peer: 0, LocalOff: 32, Bytes: 64, Epoch: 1})
		f.Expect(1)
		if err := f.Drain(ctx); !errors.Is(err, ErrInvalidWork) || !strings.Contains(err.Error(), "device descriptor 0") {
			return fmt.Errorf("drain after a bad descriptor: %v, want ErrInvalidWork naming descriptor 0", err)
		}
		if pos, err = f.Next(2); err != nil || pos != 1 {
			return fmt.Errorf("Next(2) after the drain: %d, %v; want position 1", pos, err)
		}
		ring.Store(pos, Work{Peer: 0, Bytes: 8, Epoch: 1})
		f.Expect(2) // the device writes only the first
		dctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		defer cancel()
		if err := f.Drain(dctx); !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "[2, 3)") {
			return fmt.Errorf("drain with a descriptor missing: %v, want a deadline naming [2, 3)", err)
		}
		if _, err := f.Next(2); !errors.Is(err, ErrInvalidWork) {
			return fmt.Errorf("Next(2) with a slot busy: %v, want ErrInvalidWork", err)
		}
		if err := f.Close(); err == nil || !strings.Contains(err.Error(), "1 device descriptors") {
			return fmt.Errorf("Close with a descriptor missing: %v, want it reported", err)
		}
		return nil
	})
}

// BenchmarkFeed times a put and a signal to this rank handed to the
// in-process transport through a Feed (the descriptors stored as a device
// stores them, then announced and drained: the GPU-fed rail's extra hop)
// against the same two Puts made directly.
//
//	go test ./rdma -run '^$' -bench Feed
func BenchmarkFeed(b *testing.B) {
	for _, fed := range []bool{false, true} {
		b.Run(fmt.Sprintf("fed=%v", fed), func(b *testing.B) {
			g := comm.NewLocal(1)[0]
			defer g.Close()
			tr, err := NewInProcess(b.Context(), g, Config{SendBytes: 4096, RecvBytes: 4096})
			if err != nil {
				b.Fatal(err)
			}
			defer tr.Close()
			f, err := NewFeed(tr, 4)
			if err != nil {
				b.Fatal(err)
			}
			defer f.Close()
			ring := &Ring{mem: f.Memory(), size: 4, mask: 3}
			ctx := b.Context()
			e := uint64(0)
			for b.Loop() {
				e++
				ws := []Work{{Peer: 0, Bytes: 4096}, {Peer: 0, Epoch: e}}
				if !fed {
					for _, w := range ws {
						if err := tr.Put(ctx, w); err != nil {
							b.Fatal(err)
						}
					}
					continue
				}
				pos, err := f.Next(len(ws))
				if err != nil {
					b.Fatal(err)
				}
				for i, w := range ws {
					ring.Store(pos+uint64(i), w)
				}
				f.Expect(len(ws))
				if err := f.Drain(ctx); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
