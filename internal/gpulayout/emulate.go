//go:build cgo

package gpulayout

/*
#include "layout.h"

static struct layout_dims dims(int64_t R, int64_t me, int64_t K, int64_t L, int64_t maxT, int64_t pad,
			       int64_t ch, int64_t maxRecv, int64_t T, int64_t rowCap)
{
	return layout_dims_of(R, me, K, L, maxT, pad, ch, maxRecv, T, rowCap);
}

// The launches of layout.cu, every thread in turn.
static void run_count(struct layout_dims d, const int32_t *rt, const int32_t *nt, int32_t *ws, uint64_t *errKey)
{
	for (int64_t i = 0; i < d.R * d.maxT; i++) {
		layout_count(&d, rt, nt, ws, errKey, i);
	}
}

static void run_scan(struct layout_dims d, const int32_t *rt, int32_t *ws, const uint64_t *errKey, int64_t nth)
{
	for (int64_t tid = 0; tid < nth; tid++) {
		layout_scan_a(&d, ws, tid, nth);
	}
	for (int64_t tid = 0; tid < nth; tid++) {
		layout_scan_b(&d, ws, tid, nth);
	}
	layout_scan_c(&d, rt, ws, errKey);
}

static void run_tables(struct layout_dims d, const int32_t *rt, const int32_t *nt, int32_t *ws, int32_t *tb)
{
	int64_t n = layout_cols(&d) * layout_chunks(&d);
	for (int64_t i = 0; i < n; i++) {
		layout_colcount(&d, rt, nt, ws, i);
	}
	for (int64_t c = 0; c < layout_cols(&d); c++) {
		layout_colscan(&d, ws, c);
	}
	for (int64_t i = 0; i < n; i++) {
		layout_colwrite(&d, rt, nt, ws, tb, i);
	}
}

static void run_finish(struct layout_dims d, const int32_t *ws, int32_t *counts, int32_t *report, int64_t maxPerm,
		       int32_t capErr)
{
	layout_finish(&d, ws, counts, report, maxPerm, capErr);
}

static int64_t d_ws_size(struct layout_dims d) { return ws_size(&d); }
static int64_t d_ws_summary(struct layout_dims d) { return ws_summary(&d); }
static int64_t d_ws_summaryLen(struct layout_dims d) { return ws_summaryLen(&d); }
static int64_t d_tb_size(struct layout_dims d) { return tb_size(&d); }
static int64_t d_cols(struct layout_dims d) { return layout_cols(&d); }
static int64_t d_chunks(struct layout_dims d) { return layout_chunks(&d); }
*/
import "C"

import (
	"fmt"
	"math"
	"unsafe"
)

// Dims are a layout's sizes (layout.h's layout_dims), in the order the
// kernels take them after their pointers.
type Dims struct {
	// R ranks in the domain, Me this rank's index, K slots per token, L
	// experts per rank, MaxT tokens per rank at most, Pad the segment
	// multiple (at least 1), Chunk tokens per chunk of a column, MaxRecv
	// the rows a rank keeps (capacity mode; math.MaxInt32 in blocking
	// mode), T this rank's tokens and RowCap the handle's receive rows.
	R, Me, K, L, MaxT, Pad, Chunk, MaxRecv, T, RowCap int
}

func (d Dims) c() C.struct_layout_dims {
	return C.dims(C.int64_t(d.R), C.int64_t(d.Me), C.int64_t(d.K), C.int64_t(d.L), C.int64_t(d.MaxT),
		C.int64_t(d.Pad), C.int64_t(d.Chunk), C.int64_t(d.MaxRecv), C.int64_t(d.T), C.int64_t(d.RowCap))
}

// Args are the dims as kernel arguments (int64 each, layout.cu's
// DIM_PARAMS).
func (d Dims) Args() []any {
	return []any{int64(d.R), int64(d.Me), int64(d.K), int64(d.L), int64(d.MaxT), int64(d.Pad),
		int64(d.Chunk), int64(d.MaxRecv), int64(d.T), int64(d.RowCap)}
}

// Check reports dims the kernels cannot take: sizes out of range, or
// workspace or tables past int32 offsets.
func (d Dims) Check() error {
	if d.R < 1 || d.Me < 0 || d.Me >= d.R || d.K < 1 || d.L < 1 || d.MaxT < 1 || d.Pad < 1 || d.Chunk < 1 ||
		d.MaxRecv < 0 || d.T < 0 || d.T > d.MaxT || d.RowCap < 0 {
		return fmt.Errorf("gpulayout: layout dims %+v out of range", d)
	}
	if d.WorkspaceInts() > math.MaxInt32 || d.TableInts() > math.MaxInt32 || d.R*d.MaxT*d.K > math.MaxInt32 {
		return fmt.Errorf("gpulayout: layout dims %+v: buffers past 2^31 entries", d)
	}
	return nil
}

// WorkspaceInts is the int32s of the workspace.
func (d Dims) WorkspaceInts() int { return int(C.d_ws_size(d.c())) }

// Summary is the offset and length, in int32s, of the summary in the
// workspace.
func (d Dims) Summary() (off, n int) {
	return int(C.d_ws_summary(d.c())), int(C.d_ws_summaryLen(d.c()))
}

// TableInts is the int32s of the tables.
func (d Dims) TableInts() int { return int(C.d_tb_size(d.c())) }

// Columns is the column kernels' columns: colscan runs a thread per
// column, colcount and colwrite one per column and chunk.
func (d Dims) Columns() int { return int(C.d_cols(d.c())) }

// Chunks is the chunks of Chunk tokens per column (of MaxT tokens).
func (d Dims) Chunks() int { return int(C.d_chunks(d.c())) }

// Summary word indices (layout.h).
const (
	SumErr       = C.sumErr
	SumErrRank   = C.sumErrRank
	SumErrToken  = C.sumErrToken
	SumErrSlot   = C.sumErrSlot
	SumErrExpert = C.sumErrExpert
	SumErrPrev   = C.sumErrPrev
	SumRecv      = C.sumRecv
	SumPermuted  = C.sumPermuted
	SumHeader    = C.sumHeader
)

// EmulateLayout runs the layout kernels on the host for rank d.Me, with
// routing[s] rank s's [T_s*K] routing (d.T must be this rank's T), and a
// scan block of scanThreads threads. It returns the summary and the
// tables, the column kernels run whatever the summary holds (as in a
// layout captured into a CUDA graph: after a routing error they write
// nothing, and every entry is -1).
func EmulateLayout(d Dims, routing [][]int32, scanThreads int) (summary, tables []int32, err error) {
	if err := d.Check(); err != nil {
		return nil, nil, err
	}
	if len(routing) != d.R || len(routing[d.Me]) != d.T*d.K || scanThreads < 1 {
		return nil, nil, fmt.Errorf("gpulayout: emulate: %d routings for %d ranks (T %d, scan threads %d)", len(routing), d.R, d.T, scanThreads)
	}
	// The route window: every rank's routing at its slot; garbage past
	// each rank's tokens, as a window holds.
	rt := make([]int32, d.R*d.MaxT*d.K)
	for i := range rt {
		rt[i] = int32(i*7919 + 13)
	}
	nt := make([]int32, d.R)
	for s, idx := range routing {
		if len(idx)%d.K != 0 || len(idx)/d.K > d.MaxT {
			return nil, nil, fmt.Errorf("gpulayout: emulate: rank %d has %d indices", s, len(idx))
		}
		copy(rt[s*d.MaxT*d.K:], idx)
		nt[s] = int32(len(idx) / d.K)
	}
	ws := make([]int32, d.WorkspaceInts())
	errKey := uint64(math.MaxUint64)
	cd := d.c()
	prt, pnt, pws := (*C.int32_t)(unsafe.Pointer(&rt[0])), (*C.int32_t)(unsafe.Pointer(&nt[0])), (*C.int32_t)(unsafe.Pointer(&ws[0]))
	C.run_count(cd, prt, pnt, pws, (*C.uint64_t)(unsafe.Pointer(&errKey)))
	C.run_scan(cd, prt, pws, (*C.uint64_t)(unsafe.Pointer(&errKey)), C.int64_t(scanThreads))
	off, n := d.Summary()
	summary = append([]int32(nil), ws[off:off+n]...)
	tables = make([]int32, max(d.TableInts(), 1))
	for i := range tables {
		tables[i] = -1
	}
	C.run_tables(cd, prt, pnt, pws, (*C.int32_t)(unsafe.Pointer(&tables[0])))
	return summary, tables[:d.TableInts()], nil
}

// EmulateFinish runs the finish kernel of a layout captured into a CUDA
// graph on the host, for rank d.Me with the given summary (the scan's, as
// EmulateLayout returns it), report the report as the previous finish
// left it (1 + the summary's length words). It returns the handle's
// counts (4 + L words) and updates report.
func EmulateFinish(d Dims, summary, report []int32, maxPerm int, capErr bool) ([]int32, error) {
	off, n := d.Summary()
	if err := d.Check(); err != nil {
		return nil, err
	}
	if len(summary) != n || len(report) != 1+n {
		return nil, fmt.Errorf("gpulayout: emulate finish: summary of %d words, report of %d, want %d and %d", len(summary), len(report), n, 1+n)
	}
	ws := make([]int32, d.WorkspaceInts())
	copy(ws[off:], summary)
	counts := make([]int32, 4+d.L)
	ce := C.int32_t(0)
	if capErr {
		ce = 1
	}
	C.run_finish(d.c(), (*C.int32_t)(unsafe.Pointer(&ws[0])), (*C.int32_t)(unsafe.Pointer(&counts[0])),
		(*C.int32_t)(unsafe.Pointer(&report[0])), C.int64_t(maxPerm), ce)
	return counts, nil
}
