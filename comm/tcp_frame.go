package comm

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"os"
	"slices"
	"sync/atomic"
	"time"
)

// The TCP rendezvous speaks length-prefixed binary frames. Every frame is a
// 28-byte header followed by Len bytes of payload:
//
//	offset size field
//	0      4    Len     payload length, little-endian, at most frameLimit()
//	4      1    Type    frameType
//	5      1    Op      collective (tcpOp) for contributions and replies, else 0
//	6      2    reserved, must be 0
//	8      8    GID     group id (0 = the world group)
//	16     8    Seq     collective sequence number within the group
//	24     4    Rank    sender's rank, or the rank a notice is about
//
// A decoder never trusts Len: it is capped, and the payload buffer grows only
// as bytes actually arrive, so a corrupt or hostile header cannot make it
// allocate more than about twice what the peer really sent.
const (
	frameHeaderLen = 28
	// maxFramePayload is the protocol's frame limit, 1 GiB: far above any
	// control message.
	maxFramePayload = 1 << 30
	tcpMagic        = 0x50454f47 // "GOEP" little-endian
	// tcpVersion 2: the welcome's Seq carries the world id, and AllToAll
	// runs over direct peer connections (peer hello, data and bye frames).
	// 3: every connection proves the world secret (tcp_auth.go), and a rank
	// may abort.
	tcpVersion = 3
	// helloGID is the GID of a query about the rendezvous itself (who has
	// not connected yet).
	helloGID = ^uint64(0)
)

type frameType uint8

const (
	fHello       frameType = iota + 1 // client → server: payload helloMsg
	fWelcome                          // server → client: every rank is in; payload per-rank addresses
	fReject                           // server → client: payload a message; the connection ends
	fContrib                          // client → server: this member's part of round (GID, Seq)
	fResult                           // server → client: the round's result for this member
	fFail                             // server → client: the round failed; payload a message
	fQuery                            // client → server: who has not arrived in round (GID, Seq)?
	fMissing                          // server → client: payload the missing group ranks (u32 each)
	fBye                              // client → server: this rank closes the world group
	fGroupBye                         // client → server: this rank closes sub-group GID
	fLost                             // server → client: world rank Rank disappeared; payload the cause (client → server, before the welcome: its launcher says so)
	fClosed                           // server → client: world rank Rank closed the world group
	fGroupClosed                      // server → client: world rank Rank closed sub-group GID
	fShutdown                         // server → client: rank 0 closed; the server stops
	fPeerHello                        // peer → peer (AllToAll connection): Rank the sender's world rank, Seq the world id; payload peerHello
	fPeerData                         // peer → peer: Rank's AllToAll part for round (GID, Seq); payload the bytes
	fPeerBye                          // peer → peer: the sender closes group GID (0: the world; EOF after it is not a loss)
	fAbandon                          // client → server: this member cannot take part in round (GID, Seq); payload why
	fChallenge                        // accepting side → connecting side, first: payload challengeMsg
	fProof                            // server → client: its answer to a proven hello; payload an HMAC
	fAbort                            // client → server, and peer → peer: this rank aborts (it is about to exit); payload why
	frameTypeEnd
)

var frameTypeNames = [...]string{"", "hello", "welcome", "reject", "contrib", "result", "fail", "query",
	"missing", "bye", "groupbye", "lost", "closed", "groupclosed", "shutdown", "peerhello", "peerdata", "peerbye", "abandon",
	"challenge", "proof", "abort"}

func (t frameType) String() string {
	if int(t) < len(frameTypeNames) && t != 0 {
		return frameTypeNames[t]
	}
	return fmt.Sprintf("frame(%d)", uint8(t))
}

// tcpOp names a collective on the wire, so that ranks calling different
// collectives in the same round are told so instead of exchanging garbage.
type tcpOp uint8

const (
	opAllGather tcpOp = iota + 1
	opBroadcast
	opBarrier
	opAllToAll
	opSplit
	opEnd
)

var opNames = [...]string{"", "allgather", "broadcast", "barrier", "alltoall", "split"}

func (o tcpOp) String() string {
	if o > 0 && o < opEnd {
		return opNames[o]
	}
	return fmt.Sprintf("op(%d)", uint8(o))
}

type frameHeader struct {
	Type frameType
	Op   tcpOp
	GID  uint64
	Seq  uint64
	Rank int32
	Len  uint32
}

// frameLimitBytes is the frame limit in force: maxFramePayload, except in
// tests, which lower it to check what happens past the limit with MBs
// rather than GBs. Atomic because the goroutines of groups that are still
// closing read it while a test sets it.
var frameLimitBytes atomic.Int64

func init() { frameLimitBytes.Store(maxFramePayload) }

// frameLimit is the largest payload a frame may carry.
func frameLimit() int { return int(frameLimitBytes.Load()) }

// errFrame marks a malformed frame or payload.
var errFrame = errors.New("malformed frame")

func appendHeader(b []byte, h frameHeader) []byte {
	b = binary.LittleEndian.AppendUint32(b, h.Len)
	b = append(b, byte(h.Type), byte(h.Op), 0, 0)
	b = binary.LittleEndian.AppendUint64(b, h.GID)
	b = binary.LittleEndian.AppendUint64(b, h.Seq)
	return binary.LittleEndian.AppendUint32(b, uint32(h.Rank))
}

func parseHeader(b []byte) (frameHeader, error) {
	if len(b) < frameHeaderLen {
		return frameHeader{}, fmt.Errorf("%w: header of %d bytes", errFrame, len(b))
	}
	h := frameHeader{
		Len:  binary.LittleEndian.Uint32(b),
		Type: frameType(b[4]),
		Op:   tcpOp(b[5]),
		GID:  binary.LittleEndian.Uint64(b[8:]),
		Seq:  binary.LittleEndian.Uint64(b[16:]),
		Rank: int32(binary.LittleEndian.Uint32(b[24:])),
	}
	switch {
	case h.Type == 0 || h.Type >= frameTypeEnd:
		return h, fmt.Errorf("%w: unknown type %d", errFrame, b[4])
	case h.Op >= opEnd:
		return h, fmt.Errorf("%w: unknown op %d", errFrame, b[5])
	case b[6] != 0 || b[7] != 0:
		return h, fmt.Errorf("%w: reserved bytes %#x %#x", errFrame, b[6], b[7])
	case int64(h.Len) > int64(frameLimit()):
		return h, fmt.Errorf("%w: %s payload of %d bytes exceeds the %d-byte limit", errFrame, h.Type, h.Len, frameLimit())
	}
	return h, nil
}

// readFrame reads one frame. The payload buffer grows with the bytes that
// arrive (doubling from 64 KiB), never straight to the declared length.
func readFrame(r io.Reader) (frameHeader, []byte, error) {
	return readFrameUpfront(r, 64<<10)
}

// readFrameUpfront is readFrame allocating up to upfront bytes of payload
// before any arrive (then doubling). Peer connections, whose other end has
// proved it belongs to the world, use a large upfront so that an AllToAll
// part of a few MB is read without being copied as the buffer grows; a
// lying header still costs at most upfront bytes.
func readFrameUpfront(r io.Reader, upfront int) (frameHeader, []byte, error) {
	var hb [frameHeaderLen]byte
	if _, err := io.ReadFull(r, hb[:]); err != nil {
		return frameHeader{}, nil, err
	}
	h, err := parseHeader(hb[:])
	if err != nil {
		return h, nil, err
	}
	n := int(h.Len)
	if n == 0 {
		return h, nil, nil
	}
	const chunk = 64 << 10
	p := make([]byte, 0, min(n, max(upfront, chunk)))
	for len(p) < n {
		step := min(n-len(p), max(len(p), chunk))
		p = slices.Grow(p, step)
		m, err := io.ReadFull(r, p[len(p):len(p)+step])
		p = p[:len(p)+m]
		if err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return h, nil, fmt.Errorf("%s payload: %w", h.Type, err)
		}
	}
	return h, p, nil
}

// writeFrame writes header and payload with one writev where it can,
// under whatever write deadline the connection has.
func writeFrame(w io.Writer, h frameHeader, payload []byte) error {
	return writeFrameBy(w, h, payload, func() error { return nil })
}

// writePiece is the most payload a frame's write hands the kernel under one
// deadline.
const writePiece = 1 << 20

// writeFrameBy writes one frame in pieces of at most writePiece bytes of
// payload (the header goes with the first, in one writev), calling before
// ahead of each piece to set that piece's write deadline. A deadline per
// piece, taken when the piece starts, bounds how long the reader may read
// nothing, not how long a large frame takes to reach a reader that keeps
// reading, however slowly (its process descheduled on a loaded machine,
// say): a slow reader is not a dead one.
func writeFrameBy(w io.Writer, h frameHeader, payload []byte, before func() error) error {
	if len(payload) > frameLimit() {
		return fmt.Errorf("comm: %s payload of %d bytes exceeds the %d-byte frame limit", h.Type, len(payload), frameLimit())
	}
	h.Len = uint32(len(payload))
	first := min(len(payload), writePiece)
	bufs := net.Buffers{appendHeader(make([]byte, 0, frameHeaderLen), h)}
	if first > 0 {
		bufs = append(bufs, payload[:first])
	}
	if err := before(); err != nil {
		return err
	}
	if _, err := bufs.WriteTo(w); err != nil {
		return err
	}
	for off := first; off < len(payload); {
		n := min(len(payload)-off, writePiece)
		if err := before(); err != nil {
			return err
		}
		if _, err := w.Write(payload[off : off+n]); err != nil {
			return err
		}
		off += n
	}
	return nil
}

// writeBound says how long the write of a frame may take: each piece at
// most stall from its start (0: no such bound), and nothing past hard
// (zero: no such bound).
type writeBound struct {
	hard  time.Time
	stall time.Duration
}

// next is the write deadline of a piece that starts now.
func (b writeBound) next() time.Time {
	if b.stall == 0 {
		return b.hard
	}
	d := time.Now().Add(b.stall)
	if !b.hard.IsZero() && b.hard.Before(d) {
		return b.hard
	}
	return d
}

// isTimeout reports whether a write failed at its deadline (the reader
// read too little in time, or this side cut the write short), as opposed
// to a broken connection.
func isTimeout(err error) bool { return errors.Is(err, os.ErrDeadlineExceeded) }

// helloMsg is the payload of a client's hello: who this rank says it is,
// and its proof of the world secret (see tcp_auth.go).
type helloMsg struct {
	Magic     uint32
	Version   uint16
	Size      int
	LocalRank int
	LocalSize int
	Nonce     [nonceLen]byte // the client's, for the server's answer
	MAC       [macLen]byte   // helloMAC
	PeerAddr  string         // where this rank accepts AllToAll connections
}

// helloFixed is the length of a hello without its peer address.
const helloFixed = 4 + 2 + 4 + 4 + 4 + nonceLen + macLen

// fields is what the hello's MAC covers besides the nonces and the rank.
func (m helloMsg) fields() []byte {
	b := binary.LittleEndian.AppendUint32(nil, m.Magic)
	b = binary.LittleEndian.AppendUint16(b, m.Version)
	b = binary.LittleEndian.AppendUint32(b, uint32(m.Size))
	b = binary.LittleEndian.AppendUint32(b, uint32(m.LocalRank))
	b = binary.LittleEndian.AppendUint32(b, uint32(m.LocalSize))
	return append(b, m.PeerAddr...)
}

func (m helloMsg) encode() []byte {
	b := binary.LittleEndian.AppendUint32(nil, m.Magic)
	b = binary.LittleEndian.AppendUint16(b, m.Version)
	b = binary.LittleEndian.AppendUint32(b, uint32(m.Size))
	b = binary.LittleEndian.AppendUint32(b, uint32(m.LocalRank))
	b = binary.LittleEndian.AppendUint32(b, uint32(m.LocalSize))
	b = append(b, m.Nonce[:]...)
	b = append(b, m.MAC[:]...)
	return append(b, m.PeerAddr...)
}

func decodeHello(p []byte) (helloMsg, error) {
	if len(p) < helloFixed {
		return helloMsg{}, fmt.Errorf("%w: hello of %d bytes", errFrame, len(p))
	}
	m := helloMsg{
		Magic:     binary.LittleEndian.Uint32(p),
		Version:   binary.LittleEndian.Uint16(p[4:]),
		Size:      int(int32(binary.LittleEndian.Uint32(p[6:]))),
		LocalRank: int(int32(binary.LittleEndian.Uint32(p[10:]))),
		LocalSize: int(int32(binary.LittleEndian.Uint32(p[14:]))),
		PeerAddr:  string(p[helloFixed:]),
	}
	copy(m.Nonce[:], p[18:])
	copy(m.MAC[:], p[18+nonceLen:])
	if len(m.PeerAddr) > maxPeerAddr {
		return m, fmt.Errorf("%w: hello address of %d bytes", errFrame, len(m.PeerAddr))
	}
	return m, nil
}

// peerHello is the payload of the first frame each way on a direct peer
// connection (the header's Rank is the sender's world rank and Seq the world
// id from the welcome), after the acceptor's challenge: the receiver checks
// that it is spoken to, in its protocol, by a member of its own world, which
// the MAC proves (peerMAC).
type peerHello struct {
	Magic   uint32
	Version uint16
	Size    int // world size
	To      int // the world rank the sender means to reach
	Nonce   [nonceLen]byte
	MAC     [macLen]byte
}

const peerHelloLen = 4 + 2 + 4 + 4 + nonceLen + macLen

func (m peerHello) encode() []byte {
	b := binary.LittleEndian.AppendUint32(nil, m.Magic)
	b = binary.LittleEndian.AppendUint16(b, m.Version)
	b = binary.LittleEndian.AppendUint32(b, uint32(m.Size))
	b = binary.LittleEndian.AppendUint32(b, uint32(m.To))
	b = append(b, m.Nonce[:]...)
	return append(b, m.MAC[:]...)
}

func decodePeerHello(p []byte) (peerHello, error) {
	if len(p) != peerHelloLen {
		return peerHello{}, fmt.Errorf("%w: peer hello of %d bytes", errFrame, len(p))
	}
	m := peerHello{
		Magic:   binary.LittleEndian.Uint32(p),
		Version: binary.LittleEndian.Uint16(p[4:]),
		Size:    int(int32(binary.LittleEndian.Uint32(p[6:]))),
		To:      int(int32(binary.LittleEndian.Uint32(p[10:]))),
	}
	copy(m.Nonce[:], p[14:])
	copy(m.MAC[:], p[14+nonceLen:])
	return m, nil
}

// appendChunks appends each chunk as a u64 length and its bytes.
func appendChunks(b []byte, chunks [][]byte) []byte {
	for _, c := range chunks {
		b = binary.LittleEndian.AppendUint64(b, uint64(len(c)))
		b = append(b, c...)
	}
	return b
}

func chunksLen(chunks [][]byte) int {
	n := 0
	for _, c := range chunks {
		n += 8 + len(c)
	}
	return n
}

// splitChunks parses exactly n chunks written by appendChunks. The chunks
// alias p.
func splitChunks(p []byte, n int) ([][]byte, error) {
	if n < 0 || n > len(p)/8 {
		return nil, fmt.Errorf("%w: %d bytes cannot hold %d chunks", errFrame, len(p), n)
	}
	out := make([][]byte, n)
	for i := range out {
		if len(p) < 8 {
			return nil, fmt.Errorf("%w: chunk %d of %d: truncated length", errFrame, i, n)
		}
		m := binary.LittleEndian.Uint64(p)
		p = p[8:]
		if m > uint64(len(p)) {
			return nil, fmt.Errorf("%w: chunk %d of %d says %d bytes, %d left", errFrame, i, n, m, len(p))
		}
		out[i] = p[:m:m]
		p = p[m:]
	}
	if len(p) != 0 {
		return nil, fmt.Errorf("%w: %d bytes after %d chunks", errFrame, len(p), n)
	}
	return out, nil
}

// appendRanks and decodeRanks carry a list of ranks as u32 each.
func appendRanks(b []byte, ranks []int) []byte {
	for _, r := range ranks {
		b = binary.LittleEndian.AppendUint32(b, uint32(r))
	}
	return b
}

// appendDepartures encodes world ranks with causes (a world bye's
// payload): per rank, its number and the cause's length as uint32s, then
// the cause, in ascending rank order.
func appendDepartures(b []byte, d map[int]string) []byte {
	for _, r := range slices.Sorted(maps.Keys(d)) {
		b = binary.LittleEndian.AppendUint32(b, uint32(r))
		b = binary.LittleEndian.AppendUint32(b, uint32(len(d[r])))
		b = append(b, d[r]...)
	}
	return b
}

// decodeDepartures reads appendDepartures' encoding of ranks below limit;
// it keeps what it read before anything malformed (the news is advisory).
func decodeDepartures(p []byte, limit int) map[int]string {
	var out map[int]string
	for len(p) >= 8 {
		r, n := binary.LittleEndian.Uint32(p), binary.LittleEndian.Uint32(p[4:])
		if r >= uint32(limit) || uint64(n) > uint64(len(p)-8) {
			break
		}
		if out == nil {
			out = map[int]string{}
		}
		out[int(r)] = string(p[8 : 8+n])
		p = p[8+n:]
	}
	return out
}

func decodeRanks(p []byte, limit int) ([]int, error) {
	if len(p)%4 != 0 {
		return nil, fmt.Errorf("%w: rank list of %d bytes", errFrame, len(p))
	}
	out := make([]int, len(p)/4)
	for i := range out {
		r := binary.LittleEndian.Uint32(p[4*i:])
		if r >= uint32(limit) {
			return nil, fmt.Errorf("%w: rank %d outside [0, %d)", errFrame, r, limit)
		}
		out[i] = int(r)
	}
	return out, nil
}

// splitReply is the server's answer to a Split: the new group's id, this
// member's index in it, and its members as world ranks, in order.
type splitReply struct {
	GID     uint64
	Index   int
	Members []int
}

func (s splitReply) encode() []byte {
	b := binary.LittleEndian.AppendUint64(nil, s.GID)
	b = binary.LittleEndian.AppendUint32(b, uint32(s.Index))
	return appendRanks(b, s.Members)
}

func decodeSplitReply(p []byte, worldSize int) (splitReply, error) {
	if len(p) < 12 {
		return splitReply{}, fmt.Errorf("%w: split reply of %d bytes", errFrame, len(p))
	}
	s := splitReply{GID: binary.LittleEndian.Uint64(p), Index: int(binary.LittleEndian.Uint32(p[8:]))}
	var err error
	if s.Members, err = decodeRanks(p[12:], worldSize); err != nil {
		return s, err
	}
	if s.Index >= len(s.Members) {
		return s, fmt.Errorf("%w: split index %d of %d members", errFrame, s.Index, len(s.Members))
	}
	return s, nil
}

// encodeAddrs and decodeAddrs carry the welcome's per-rank addresses.
func encodeAddrs(addrs []string) []byte {
	var b []byte
	for _, a := range addrs {
		b = binary.LittleEndian.AppendUint16(b, uint16(len(a)))
		b = append(b, a...)
	}
	return b
}

func decodeAddrs(p []byte, n int) ([]string, error) {
	if n < 0 || len(p) < 2*n {
		return nil, fmt.Errorf("%w: %d bytes cannot hold %d addresses", errFrame, len(p), n)
	}
	out := make([]string, n)
	for i := range out {
		if len(p) < 2 {
			return nil, fmt.Errorf("%w: address %d: truncated", errFrame, i)
		}
		m := int(binary.LittleEndian.Uint16(p))
		p = p[2:]
		if m > len(p) {
			return nil, fmt.Errorf("%w: address %d says %d bytes, %d left", errFrame, i, m, len(p))
		}
		out[i] = string(p[:m])
		p = p[m:]
	}
	if len(p) != 0 {
		return nil, fmt.Errorf("%w: %d bytes after %d addresses", errFrame, len(p), n)
	}
	return out, nil
}
