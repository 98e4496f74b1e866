package comm

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"io"
	"time"
)

// The TCP world's admission. Every rank holds the world secret
// (TCPConfig.Secret, GOEP_WORLD_SECRET), which never crosses the wire: a
// connection proves it holds the secret with an HMAC-SHA256 of a nonce the
// other side chose for this connection, and the other side answers with an
// HMAC of the prover's own nonce, so that both ends know the other is of
// the world. Until then, nothing but a small bounded frame is read from it
// (maxHandshakePayload), under a short deadline (handshakeTimeout), and a
// connection that fails is closed alone: a stray or hostile process on the
// host cannot join, claim a rank, abort a forming world or inject a frame.
//
// Rendezvous (client = any rank, server = rank 0's):
//
//	server → client  fChallenge  magic, version, nonce_s
//	client → server  fHello      hello fields, nonce_c, HMAC(K, "hello", nonce_s, rank, fields, nonce_c)
//	server → client  fProof      HMAC(K, "server", nonce_c, nonce_s, rank)
//
// Peer connection (dialler = lower rank i, acceptor = higher rank j):
//
//	acceptor → dialler  fChallenge  magic, version, nonce_a
//	dialler → acceptor  fPeerHello  i, world id, peerHello{to j}, nonce_d, HMAC(K, "peer dial", nonce_a, nonce_d, i, j, size, world id)
//	acceptor → dialler  fPeerHello  j, world id, peerHello{to i}, nonce_a, HMAC(K, "peer accept", nonce_d, nonce_a, j, i, size, world id)

// nonceLen is the length of a challenge's nonce, macLen of an HMAC-SHA256.
const (
	nonceLen = 32
	macLen   = sha256.Size
)

// minSecretLen is the shortest world secret NewTCP takes: a secret short
// enough to guess is no secret.
const minSecretLen = 16

// maxHandshakePayload bounds the payload of a frame read from a connection
// that has not proved itself (a hello: its fixed fields, nonce, HMAC and a
// peer address of at most maxPeerAddr bytes; a challenge; a refusal).
const maxHandshakePayload = 2048

// maxPeerAddr bounds the peer address in a hello.
const maxPeerAddr = 1024

// handshakeTimeout bounds how long a connection to the rendezvous may take
// to prove itself once accepted: a real rank answers a challenge at once,
// so only a stray, a hostile process or a stopped one meets it. (Peer
// connections are bounded by meshTimeout.)
const handshakeTimeout = 10 * time.Second

// newNonce returns a fresh random nonce.
func newNonce() [nonceLen]byte {
	var n [nonceLen]byte
	if _, err := rand.Read(n[:]); err != nil {
		panic(fmt.Sprintf("comm: crypto/rand: %v", err)) // crypto/rand does not fail on Linux
	}
	return n
}

// NewWorldSecret returns a fresh random world secret (64 hex digits), what
// eprun launch gives its ranks in GOEP_WORLD_SECRET.
func NewWorldSecret() string {
	n := newNonce()
	return fmt.Sprintf("%x", n[:])
}

// authMAC is HMAC-SHA256 under secret of label and parts, each part
// preceded by its length so that no two inputs read the same.
func authMAC(secret, label string, parts ...[]byte) [macLen]byte {
	m := hmac.New(sha256.New, []byte(secret))
	var l [8]byte
	for _, p := range append([][]byte{[]byte("goep/tcp/v3/" + label)}, parts...) {
		binary.LittleEndian.PutUint64(l[:], uint64(len(p)))
		m.Write(l[:])
		m.Write(p)
	}
	var out [macLen]byte
	m.Sum(out[:0])
	return out
}

func u64(v uint64) []byte { return binary.LittleEndian.AppendUint64(nil, v) }

// challengeMsg opens every connection, from the side that accepted it.
type challengeMsg struct {
	Magic   uint32
	Version uint16
	Nonce   [nonceLen]byte
}

func (m challengeMsg) encode() []byte {
	b := binary.LittleEndian.AppendUint32(nil, m.Magic)
	b = binary.LittleEndian.AppendUint16(b, m.Version)
	return append(b, m.Nonce[:]...)
}

func decodeChallenge(p []byte) (challengeMsg, error) {
	if len(p) != 4+2+nonceLen {
		return challengeMsg{}, fmt.Errorf("%w: challenge of %d bytes", errFrame, len(p))
	}
	m := challengeMsg{Magic: binary.LittleEndian.Uint32(p), Version: binary.LittleEndian.Uint16(p[4:])}
	copy(m.Nonce[:], p[6:])
	return m, nil
}

// check says whether a challenge speaks this protocol.
func (m challengeMsg) check() error {
	if m.Magic != tcpMagic || m.Version != tcpVersion {
		return fmt.Errorf("speaks protocol %#x version %d, this rank %#x version %d", m.Magic, m.Version, uint32(tcpMagic), tcpVersion)
	}
	return nil
}

// helloMAC is the client's proof in its hello: it covers the server's
// nonce, the rank the client claims and every field of its hello.
func helloMAC(secret string, server [nonceLen]byte, rank int32, m helloMsg) [macLen]byte {
	return authMAC(secret, "hello", server[:], u64(uint64(uint32(rank))), m.fields(), m.Nonce[:])
}

// serverMAC is the server's answer to a proven hello.
func serverMAC(secret string, client, server [nonceLen]byte, rank int32) [macLen]byte {
	return authMAC(secret, "server", client[:], server[:], u64(uint64(uint32(rank))))
}

// peerMAC is the proof in a peer hello from rank `from` to rank `to`: the
// dialler's (label "peer dial") covers the acceptor's challenge and its own
// nonce, the acceptor's ("peer accept") the dialler's nonce and its own.
func peerMAC(secret, label string, theirs, mine [nonceLen]byte, from, to, size int, worldID uint64) [macLen]byte {
	return authMAC(secret, label, theirs[:], mine[:], u64(uint64(from)), u64(uint64(to)), u64(uint64(size)), u64(worldID))
}

// readFrameMax reads one frame of a connection that has not proved itself:
// a payload longer than limit is refused before a byte of it is read, so
// what such a connection makes this process hold is bounded by
// frameHeaderLen + limit. held, when not nil, is told how many bytes are
// held (+n before the payload is read, -n by the caller's release).
func readFrameMax(r io.Reader, limit int, held func(int)) (frameHeader, []byte, error) {
	var hb [frameHeaderLen]byte
	if _, err := io.ReadFull(r, hb[:]); err != nil {
		return frameHeader{}, nil, err
	}
	h, err := parseHeader(hb[:])
	if err != nil {
		return h, nil, err
	}
	if int64(h.Len) > int64(limit) {
		return h, nil, fmt.Errorf("%w: a %s frame of %d bytes before the connection proved itself (at most %d)", errFrame, h.Type, h.Len, limit)
	}
	if held != nil {
		held(frameHeaderLen + int(h.Len))
	}
	if h.Len == 0 {
		return h, nil, nil
	}
	p := make([]byte, h.Len)
	if _, err := io.ReadFull(r, p); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return h, nil, fmt.Errorf("%s payload: %w", h.Type, err)
	}
	return h, p, nil
}
