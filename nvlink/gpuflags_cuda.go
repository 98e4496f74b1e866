//go:build cuda && cgo

package nvlink

import (
	"bytes"
	"context"
	_ "embed"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/goep/goep/comm"
	"github.com/goep/goep/device"
)

//go:embed kernels/flags.ptx
var flagsPTX []byte

// GPUFlags is a domain's synchronization on the GPU: the protocol of the
// host exchange (Domain.Exchange), enqueued on a stream so that the host
// never waits. Every collective call of the GPU data path is
//
//  1. Begin: wait until every peer has signalled done for the previous
//     call (its windows are free again); the epoch advances;
//  2. the call's stores into the peers' windows;
//  3. Arrive: signal arrived to every peer (after a system-wide fence),
//     and wait until every peer has signalled arrived for this call, with
//     the same operation;
//  4. the call's reads of its own windows;
//  5. Finish: signal done to every peer.
//
// Flags are epochs, equal on all ranks since the calls are, never reset;
// waits are clock-bounded and record a failure in the status words instead
// of spinning for ever, and raise the alarm, a word in host memory mapped
// for the GPU: after a synchronize the host reads the status words back
// (Check) only when the alarm was raised (TakeAlarm). A rank that
// rejected its input signals OpRejected (Reject, Abandon): its peers fail
// the call at once. The words are described in kernels/flags.cuh.
type GPUFlags struct {
	s                    *device.CUDAStream
	mod                  *device.Module
	wait, signal, arrive *device.Kernel
	own                  *device.Buffer   // this rank's flags region
	peers                *device.Buffer   // uint64 [R]: every rank's flags region as mapped here
	regions              []*device.Buffer // every rank's flags region as mapped here
	pids                 []int            // every rank's process
	// R ranks in the domain, me this rank's index, base the global rank of
	// index 0.
	R, me, base int
	timeoutNs   int64
	// alarm is the alarm word in alarmMem (a page of host memory, mapped
	// for the GPU by alarmMap), which a wait that records a failure sets.
	alarm    *atomic.Uint64
	alarmMem []byte
	alarmMap *device.HostMapping
}

// NewGPUFlags starts the protocol over region of win, which every rank
// allocated with GPUFlagsSize bytes (zeroed by MapGPU), on stream s: it
// loads the kernels and uploads the peers' addresses. Waits give up after
// timeout; base is the global rank of the domain's first rank.
func NewGPUFlags(ctx context.Context, s *device.CUDAStream, win *GPUWindows, region, base int, timeout time.Duration) (*GPUFlags, error) {
	R := len(win.Peers[region])
	me := -1
	for p, b := range win.Peers[region] {
		if b == win.Own[region] {
			me = p
		}
	}
	if me < 0 || win.Own[region].Size() < GPUFlagsSize(R) {
		return nil, fmt.Errorf("nvlink: GPU flags: region %d of %d bytes does not hold the flags of %d ranks", region, win.Own[region].Size(), R)
	}
	f := &GPUFlags{s: s, own: win.Own[region], regions: win.Peers[region], pids: win.PIDs, R: R, me: me, base: base, timeoutNs: timeout.Nanoseconds()}
	var err error
	if f.mod, err = s.CUDA().LoadModule(flagsPTX); err != nil {
		return nil, fmt.Errorf("nvlink: GPU flags: %w", err)
	}
	for _, k := range []struct {
		dst  **device.Kernel
		name string
	}{{&f.wait, "goep_nvlink_wait"}, {&f.signal, "goep_nvlink_signal"}, {&f.arrive, "goep_nvlink_arrive"}} {
		if *k.dst, err = f.mod.Kernel(k.name); err != nil {
			return nil, errors.Join(fmt.Errorf("nvlink: GPU flags: %w", err), f.Close())
		}
	}
	addrs := make([]byte, 8*R)
	for p, b := range win.Peers[region] {
		binary.LittleEndian.PutUint64(addrs[8*p:], b.DevicePtr())
	}
	if f.peers, err = s.Alloc(len(addrs)); err != nil {
		return nil, errors.Join(fmt.Errorf("nvlink: GPU flags: %w", err), f.Close())
	}
	if err := s.UploadBuffer(ctx, f.peers, addrs); err != nil {
		return nil, errors.Join(fmt.Errorf("nvlink: GPU flags: %w", err), f.Close())
	}
	if err := f.mapAlarm(ctx); err != nil {
		return nil, errors.Join(fmt.Errorf("nvlink: GPU flags: alarm word: %w", err), f.Close())
	}
	return f, nil
}

// mapAlarm maps the alarm word for the GPU and writes its device address
// into this rank's flags region, where the waits that record a failure
// find it (flags.cuh, fail_status).
func (f *GPUFlags) mapAlarm(ctx context.Context) error {
	mem, err := unix.Mmap(-1, 0, os.Getpagesize(), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		return fmt.Errorf("mmap: %w", err)
	}
	f.alarmMem = mem
	if f.alarmMap, err = f.s.CUDA().MapHost(mem); err != nil {
		return err
	}
	f.alarm = (*atomic.Uint64)(unsafe.Pointer(&mem[0])) // page-aligned
	addr := binary.LittleEndian.AppendUint64(nil, f.alarmMap.Buffer().DevicePtr())
	return f.s.UploadBuffer(ctx, f.view(alarmOff(f.R), 8), addr)
}

// Close frees the kernels and the peer table; the caller has synchronized
// the stream.
func (f *GPUFlags) Close() error {
	if f == nil {
		return nil
	}
	if f.peers != nil {
		f.s.Free(f.peers)
	}
	var errs []error
	if f.alarmMap != nil {
		errs = append(errs, f.alarmMap.Close())
	}
	if f.alarmMem != nil {
		errs = append(errs, unix.Munmap(f.alarmMem))
	}
	if f.mod != nil {
		errs = append(errs, f.mod.Close())
	}
	return errors.Join(errs...)
}

// Size is the number of ranks in the domain; Rank this rank's index.
func (f *GPUFlags) Size() int { return f.R }

// Rank is this rank's index in the domain.
func (f *GPUFlags) Rank() int { return f.me }

// view is bytes [off, off+n) of this rank's flags region.
func (f *GPUFlags) view(off, n int) *device.Buffer {
	v, err := f.own.View(off, n)
	if err != nil {
		panic(fmt.Sprintf("nvlink: flags view [%d, +%d): %v", off, n, err)) // offsets are the region's own
	}
	return v
}

// Flag words: arrived[p] at word p, done[p] at word R+p.
func (f *GPUFlags) arrivedSlot() int64 { return 0 }
func (f *GPUFlags) doneSlot() int64    { return int64(f.R) }

func (f *GPUFlags) block() [3]uint32 { return [3]uint32{uint32((f.R + 31) / 32 * 32), 1, 1} }

// Begin starts a collective call: the wait for every peer's done of the
// previous call, which also advances the epoch.
func (f *GPUFlags) Begin() error {
	return f.s.Launch(f.wait, [3]uint32{1, 1, 1}, f.block(), 0,
		f.view(int(f.doneSlot())*8, f.R*8), int32(f.R), f.Counter(), int32(1), int64(1), uint32(0),
		f.timeoutNs, f.Status(), f.Missing())
}

// signalPeers enqueues the store of epoch<<8|op into word slot+me of every
// peer's flags.
func (f *GPUFlags) signalPeers(slot int64, op uint32) error {
	return f.s.Launch(f.signal, [3]uint32{1, 1, 1}, f.block(), 0,
		f.peers, int32(f.R), slot+int64(f.me), f.Counter(), op)
}

// Arrive signals that this rank's stores into the peers' windows are done
// and waits for every peer's, which must carry the same op (a data call's
// op also names its dtype and whether weights travel, so that such calls
// mismatch instead of misreading each other's rows): one launch.
func (f *GPUFlags) Arrive(op uint32) error { return f.arriveWithin(op, f.timeoutNs) }

// ArriveAfterRound is Arrive for a call whose peers ran a round of their
// own (the rail's) since Begin: it waits RelayMargin longer, so that a
// peer whose round timed out is heard reporting it (Reject with the
// cause) before this rank's wait gives up on that live peer.
func (f *GPUFlags) ArriveAfterRound(op uint32) error {
	return f.arriveWithin(op, f.timeoutNs+RelayMargin(time.Duration(f.timeoutNs)).Nanoseconds())
}

func (f *GPUFlags) arriveWithin(op uint32, timeoutNs int64) error {
	slot := f.arrivedSlot()
	return f.s.Launch(f.arrive, [3]uint32{1, 1, 1}, f.block(), 0,
		f.peers, int32(f.R), slot+int64(f.me), f.view(int(slot)*8, f.R*8),
		f.Counter(), op, timeoutNs, f.Status(), f.Missing())
}

// Finish signals that this rank's windows may be written again.
func (f *GPUFlags) Finish(op uint32) error { return f.signalPeers(f.doneSlot(), op) }

// Reject joins a collective call that failed on this rank before it
// began (its input rejected, or its rail round failed): its peers see
// OpRejected and fail the call at once. A cause that is a timeout, a
// lost peer or another rank's reported failure is written to this rank's
// report first, so that the peers relay its class, names and first cause
// (GPUReport) instead of blaming this rank.
func (f *GPUFlags) Reject(cause error) error {
	report := f.writeReport(cause)
	err := f.Begin()
	if report {
		err = errors.Join(err, f.stampReport())
	}
	return errors.Join(err, f.signalPeers(f.arrivedSlot(), OpRejected), f.Finish(OpRejected))
}

// Abandon ends a call that failed on this rank between its Begin and its
// Arrive (a launch refused, say): the peers see OpRejected and fail the
// call at once instead of at their timeout, and the epochs stay in step.
// cause is reported as Reject's is.
func (f *GPUFlags) Abandon(cause error) error {
	var err error
	if f.writeReport(cause) {
		err = f.stampReport()
	}
	return errors.Join(err, f.signalPeers(f.arrivedSlot(), OpRejected), f.Finish(OpRejected))
}

// writeReport writes cause's report (GPUReport), its epoch cleared, into
// this rank's flags region, when cause is one the peers relay and the
// stream is not being captured (the upload waits for the stream: this is
// a failed call's path). It says whether the report was written.
func (f *GPUFlags) writeReport(cause error) bool {
	b, ok := GPUReport(cause)
	if !ok || f.s.Capturing() {
		return false
	}
	return f.s.UploadBuffer(context.Background(), f.view(reportOff(f.R), reportSize), b) == nil
}

// stampReport enqueues the copy of the call's epoch into the report, after
// the call's Begin and before its rejection signal: a peer takes the
// report as the rejection's cause only when the epochs match.
func (f *GPUFlags) stampReport() error {
	return f.s.Copy(f.own, reportOff(f.R), f.own, counterOff(f.R), 8)
}

// Status is the status word (uint64: 0, or the first failure of a wait);
// Counter the epoch counter; Missing the codes missing[R] (int32). Kernels
// that report a call's outcome read them.
func (f *GPUFlags) Status() *device.Buffer  { return f.view(statusOff(f.R), 8) }
func (f *GPUFlags) Counter() *device.Buffer { return f.view(counterOff(f.R), 8) }
func (f *GPUFlags) Missing() *device.Buffer { return f.view(missingOff(f.R), 4*f.R) }

// Words is this rank's whole flags region (kernels/flags.cuh,
// flag_words_of); Peers the device table of every rank's flags region as
// mapped here (uint64 [R]); TimeoutNs the waits' bound. A kernel that
// runs a whole call in one launch takes part in the protocol with them.
func (f *GPUFlags) Words() *device.Buffer { return f.own }
func (f *GPUFlags) Peers() *device.Buffer { return f.peers }
func (f *GPUFlags) TimeoutNs() int64      { return f.timeoutNs }

// StatusBytes is the size of the status words: status, epoch counter,
// the alarm's address, missing[R].
func (f *GPUFlags) StatusBytes() int { return StatusBytes(f.R) }

// CopyStatus enqueues the copy of the status words into dst at off;
// ClearStatus enqueues clearing status and missing. A call that must not
// be ended by an earlier call's failure (a layout) moves the failure aside
// with both, and reports it later (StatusError on the copy).
func (f *GPUFlags) CopyStatus(dst *device.Buffer, off int) error {
	return f.s.Copy(dst, off, f.own, statusOff(f.R), f.StatusBytes())
}

// ClearStatus enqueues clearing the status word and missing[R].
func (f *GPUFlags) ClearStatus() error {
	return errors.Join(f.s.Memset(f.own, statusOff(f.R), 8, 0), f.s.Memset(f.own, missingOff(f.R), 4*f.R, 0))
}

// StatusError decodes status words as read back (StatusBytes of them):
// nil, or the failure they record.
func (f *GPUFlags) StatusError(raw []byte) error { return decodeStatus(raw, f.R, f.base) }

// Check reads the status words back (the caller has synchronized the
// stream) and explains them: nil, or the first failure, with the class
// and names a rejecting peer reported (its report) and, for a timeout,
// the peers whose process has exited named as lost. A failure other than
// a timeout of this rank's own waits leaves the ranks in step (every call
// advanced every epoch), so the status is cleared, on the stream, for the
// next call.
//
// A status it leaves in place (a timeout), or cannot read, raises the
// alarm again, so that the next Synchronize's TakeAlarm looks again.
func (f *GPUFlags) Check(ctx context.Context) error {
	raw, err := f.s.DownloadBuffer(ctx, f.view(statusOff(f.R), f.StatusBytes()))
	if err != nil {
		f.RaiseAlarm()
		return err
	}
	codes := statusCodes(raw, f.R)
	if codes == nil {
		return nil
	}
	err = f.explain(ctx, codes, statusEpoch(raw))
	if bytes.Contains(codes, []byte{WaitTimeout}) {
		f.RaiseAlarm()
	} else {
		err = errors.Join(err, f.ClearStatus())
	}
	return err
}

// TakeAlarm reports whether the alarm was raised since the last
// TakeAlarm (by a wait that recorded a failure, by a kernel that
// reported one, or by RaiseAlarm), and lowers it; the caller has
// synchronized the stream. While it is lowered no wait has failed since:
// the status words hold no failure, and Check need not read them.
func (f *GPUFlags) TakeAlarm() bool { return f.alarm.Swap(0) != 0 }

// RaiseAlarm raises the alarm from the host: a failure is known that the
// next TakeAlarm must see.
func (f *GPUFlags) RaiseAlarm() { f.alarm.Store(1) }

// Alarm is the alarm word (uint64, host memory mapped for the GPU): a
// kernel that reports a failure outside the status words (a captured
// layout's report) sets it to 1 after writing the report.
func (f *GPUFlags) Alarm() *device.Buffer { return f.alarmMap.Buffer() }

// Settle is Check on status words already read back, without the peers'
// reports: nil, or the failure, the status cleared unless it is a timeout.
func (f *GPUFlags) Settle(raw []byte) error {
	err := f.StatusError(raw)
	if err != nil && !errors.Is(err, comm.ErrTimeout) {
		err = errors.Join(err, f.ClearStatus())
	}
	return err
}

// explain is the failure of a wait whose codes are codes: peers timed
// out on whose process has exited are lost (evidence of death outranks
// silence); a rejecting peer whose report is of the rejected call relays
// that report; else WaitError.
func (f *GPUFlags) explain(ctx context.Context, codes []byte, e uint64) error {
	var late, rejected []int
	for p, c := range codes {
		switch c {
		case WaitTimeout:
			late = append(late, p)
		case WaitRejected:
			rejected = append(rejected, p)
		}
	}
	var dead []int
	for _, p := range late {
		if p < len(f.pids) && f.pids[p] > 0 && f.pids[p] != myPID && !processAlive(f.pids[p]) {
			dead = append(dead, f.base+p)
		}
	}
	if len(dead) > 0 {
		return &comm.PeerLostError{Op: "nvlink: GPU wait for peers' flags", Ranks: dead, Cause: "process exited"}
	}
	if len(late) == 0 {
		for _, p := range rejected {
			if pe := f.report(ctx, p, e); pe != nil {
				return pe
			}
		}
	}
	return WaitError(codes, f.base)
}

// report is peer p's report if it is of call e (this rank's epoch when
// its wait found p's rejection), else nil. The peer may have gone on to
// later calls since (this rank signalled done for e): a later rejection of
// its own overwrites the report, whose epoch then differs.
func (f *GPUFlags) report(ctx context.Context, p int, e uint64) *PeerError {
	if p >= len(f.regions) {
		return nil
	}
	rv, err := f.regions[p].View(reportOff(f.R), reportSize)
	if err != nil {
		return nil
	}
	b, err := f.s.DownloadBuffer(ctx, rv)
	if err != nil {
		return nil
	}
	return decodeReport(b, e, f.base+p)
}
