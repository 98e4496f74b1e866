package nvlink

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/goep/goep/comm"
)

// The GPU flag protocol (GPUFlags, kernels/flags.cuh) in the words both
// sides read: every rank's flags region holds arrived[R] and done[R]
// (uint64 each, epoch<<8 | op, written only by the peer they are named
// after), then status (uint64: the first failure of a wait), the rank's
// epoch counter (uint64), then missing[R] (int32: what a wait found of
// each peer), then, at the next multiple of 8 bytes, grid[4] (uint32: the
// counters of the one-launch kernels, zero between launches), then
// the report: why this rank failed its last failed call, for its peers'
// hosts (the kernels never read it; see GPUReport).

// OpRejected is the operation a rank signals for a call whose input it
// rejected (flags.cuh's opRejected): its peers fail the call at once.
const OpRejected = 0x7f

// The codes of missing[p] after a failed GPU wait (0: heard from).
const (
	WaitTimeout  = 1 // the peer did not signal within the timeout
	WaitMismatch = 2 // the peer signalled another operation
	WaitRejected = 3 // the peer rejected its input (OpRejected)
)

// GPUFlagsSize is the size of a domain's flags region for R ranks.
func GPUFlagsSize(R int) int { return reportOff(R) + reportSize }

// Byte offsets in the flags region of a domain of R ranks.
func statusOff(R int) int  { return 2 * R * 8 }
func counterOff(R int) int { return (2*R + 1) * 8 }
func alarmOff(R int) int   { return (2*R + 2) * 8 } // the alarm word's address (kernels/flags.cuh)
func missingOff(R int) int { return (2*R + 3) * 8 }
func gridOff(R int) int    { return (missingOff(R) + 4*R + 7) / 8 * 8 }
func reportOff(R int) int  { return gridOff(R) + 16 }

// A report is the failure a rank signalled OpRejected for when it was a
// timeout, a lost peer or a peer's reported failure, found outside the
// domain's GPU waits (in the rail's round, say): epoch (uint64, the
// call's epoch; 0 while the rank writes the rest), status (uint64, as
// StatusOf classes the failure), the number of named ranks (uint32), the
// message's length (uint32), the named ranks (int32, MaxNamed), the
// message (msgCap bytes). A peer whose wait found the rejection reads it
// to relay the failure's class, names and first cause instead of blaming
// the rank that reported it.
const (
	reportNamedOff = 24
	reportMsgOff   = reportNamedOff + 4*MaxNamed
	reportSize     = (reportMsgOff + msgCap + 7) / 8 * 8
)

// GPUReport is the report (without its epoch, which the GPU stamps) of a
// failure err, and whether err is one the peers relay: a timeout, a lost
// peer, or a failure another rank reported (a *PeerError). A rank's own
// rejection of its input is signalled as such, with no report.
func GPUReport(err error) ([]byte, bool) {
	var pe *PeerError
	st := StatusOf(err)
	if st != StatusTimeout && st != StatusFailed && !errors.As(err, &pe) {
		return nil, false
	}
	b := make([]byte, reportSize)
	binary.LittleEndian.PutUint64(b[8:], st)
	named := Named(err)
	named = named[:min(len(named), MaxNamed)]
	binary.LittleEndian.PutUint32(b[16:], uint32(len(named)))
	for i, r := range named {
		binary.LittleEndian.PutUint32(b[reportNamedOff+4*i:], uint32(int32(r)))
	}
	msg := err.Error()
	if len(msg) > msgCap {
		msg = msg[:msgCap]
	}
	binary.LittleEndian.PutUint32(b[20:], uint32(len(msg)))
	copy(b[reportMsgOff:], msg)
	return b, true
}

// decodeReport is the relayed failure of global rank rank from its report
// b, if the report is of the call at epoch (this rank's epoch of the call
// whose rejection this rank saw): a *PeerError of the report's class and names, or nil.
func decodeReport(b []byte, epoch uint64, rank int) *PeerError {
	if len(b) < reportSize || epoch == 0 || binary.LittleEndian.Uint64(b) != epoch {
		return nil
	}
	st := binary.LittleEndian.Uint64(b[8:])
	if st == StatusOK {
		return nil
	}
	n := min(int(binary.LittleEndian.Uint32(b[16:])), MaxNamed)
	m := min(int(binary.LittleEndian.Uint32(b[20:])), msgCap)
	pe := &PeerError{Rank: rank, Status: st, Msg: string(b[reportMsgOff : reportMsgOff+m])}
	for i := range n {
		pe.Ranks = append(pe.Ranks, int(int32(binary.LittleEndian.Uint32(b[reportNamedOff+4*i:]))))
	}
	return pe
}

// StatusBytes is the size of the status words a rank reads back after a
// synchronize: status, epoch counter, the alarm's address, missing[R].
func StatusBytes(R int) int { return missingOff(R) + 4*R - statusOff(R) }

// WaitError is the error of a failed GPU wait from its codes, one per
// rank of the domain whose first global rank is base: the ranks that
// timed out, rejected their input or ran another call. A rail peer
// decodes a forwarded report with it too, so both sides name the same
// cause. A rejection wraps ErrPeerReported, as a host exchange's does.
func WaitError(codes []byte, base int) error {
	var timedOut, mismatched, rejected []int
	for p, c := range codes {
		switch c {
		case WaitTimeout:
			timedOut = append(timedOut, base+p)
		case WaitMismatch:
			mismatched = append(mismatched, base+p)
		case WaitRejected:
			rejected = append(rejected, base+p)
		}
	}
	switch {
	case len(timedOut) > 0:
		return &comm.TimeoutError{Op: "nvlink: GPU wait for peers' flags", Missing: timedOut}
	case len(rejected) > 0:
		return fmt.Errorf("nvlink: rank(s) %v rejected their input to a collective call: %w", rejected, ErrPeerReported)
	case len(mismatched) > 0:
		return fmt.Errorf("nvlink: rank(s) %v ran another collective call, or this one on rows of another dtype or with weights where this rank had none (or none where it had them): %w", mismatched, ErrPeerMismatch)
	default:
		return errors.New("nvlink: a GPU wait failed without naming a rank")
	}
}

// statusCodes reads the status words as read back (StatusBytes of them
// for R ranks): nil when no wait failed, else missing[R]'s codes.
func statusCodes(raw []byte, R int) []byte {
	if binary.LittleEndian.Uint64(raw) == 0 {
		return nil
	}
	m := raw[missingOff(R)-statusOff(R):]
	codes := make([]byte, R)
	for p := range codes {
		codes[p] = m[4*p]
	}
	return codes
}

// statusEpoch is the epoch counter in status words as read back: the
// epoch of this rank's last call, the failed one when the host
// synchronized right after it.
func statusEpoch(raw []byte) uint64 {
	return binary.LittleEndian.Uint64(raw[8:]) // the counter follows the status word
}

// decodeStatus reads the status words as read back (StatusBytes of them
// for R ranks): nil, or the failure they record (WaitError).
func decodeStatus(raw []byte, R, base int) error {
	codes := statusCodes(raw, R)
	if codes == nil {
		return nil
	}
	return WaitError(codes, base)
}
