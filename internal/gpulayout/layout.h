// The layout on the GPU (DESIGN.md section 2): the per-thread code of the
// layout kernels of layout.cu, in plain C so that package
// github.com/goep/goep/internal/gpulayout can also run it on the host, one
// thread after another, in tests without a GPU. Every function here is the
// body of one thread (or, for the scan, of one thread of one phase); no
// thread reads what another thread of the same launch writes, except
// through the counters' atomic adds and the error key's atomic minimum,
// whose results do not depend on the order.
//
// The inputs are every rank of the domain's routing, as the routing
// exchange left them in this rank's route window: rt[s*maxT*K + t*K + k]
// for t < nt[s]. The outputs are the handle's tables (executor's
// gpuTables, one int32 array, -1 where nothing is written) and a summary
// that the host downloads. The tables are exactly those executor's
// buildTables makes from ComputeLayout's Layout, and the summary holds the
// world counts and the first routing error in ComputeLayout's order.
//
// Launch sequence (executor/internal/gpu/layout.go; internal/gpulayout runs the same):
//
//	ws = 0, *errKey = ~0
//	count     threads R*maxT          counters and routing errors
//	scan      one block, 3 phases     prefix sums, segments, summary
//	          (host: download the summary; stop on an error)
//	tables = -1
//	colcount  threads C*chunks        flags per (column, chunk of tokens)
//	colscan   threads C               exclusive prefix over the chunks
//	colwrite  threads C*chunks        the tables
//
// A layout captured into a CUDA graph (a capacity-mode Relayout) has no
// host between scan and the tables: finish (one thread, after scan)
// writes the handle's counts and, on a routing error or (under the
// capacity error policy) a rank over capacity, a copy of the summary into
// a report the host reads at its next synchronize; the column kernels see
// the summary's error and write nothing, so the tables stay -1 (no row
// moves).
//
// Columns: c < R is the send column of destination c over this rank's
// tokens; c = R + s*(1+L) + j is, over source s's tokens, the receive
// column (j = 0: the token goes to this rank) or the column of this rank's
// local expert j-1.
#ifndef GOEP_LAYOUT_H
#define GOEP_LAYOUT_H

#include <stdint.h>

#ifdef __CUDACC__
#define LFN static __device__ __forceinline__
#define LAYOUT_ADD(p, v) atomicAdd((p), (v))
#define LAYOUT_MIN64(p, v) atomicMin((unsigned long long *)(p), (unsigned long long)(v))
#define LAYOUT_RESTRICT __restrict__
#else
#define LFN static inline
#define LAYOUT_ADD(p, v) (*(p) += (v))
#define LAYOUT_MIN64(p, v) (*(p) = *(p) < (uint64_t)(v) ? *(p) : (uint64_t)(v))
#define LAYOUT_RESTRICT restrict
#endif

// Many loops here are one thread's walk over a rank's experts or a
// column's chunks, which on the GPU would wait a memory round trip a step
// if every load waited for the store before it. They read layoutBatch
// values before they use any (layout_copy, layout_scan_b, layout_colscan),
// and the routing, the workspace and the tables are restrict pointers
// (distinct buffers), so that a thread's loads of a token's routing row
// are made once and not after each store into the tables.
enum { layoutBatch = 8 };

// The summary's int32 words: the error (0 none, 1 expert out of range, 2
// expert repeated), its rank, token, slot, expert and, for a repeat, the
// earlier slot; then RecvCount and PermutedCount of this rank; then the
// RecvCounts[R] and PermutedCounts[R] of every rank, TokensPerExpert[L]
// and ExpertOffsets[L+1] of this rank.
enum {
	sumErr = 0,
	sumErrRank = 1,
	sumErrToken = 2,
	sumErrSlot = 3,
	sumErrExpert = 4,
	sumErrPrev = 5,
	sumRecv = 6,
	sumPermuted = 7,
	sumHeader = 8,
};

// layout_dims are a layout's sizes, all by value in every kernel: R ranks
// in the domain, me this rank's index, K slots, L local experts (E = R*L),
// maxT tokens at most per rank, pad the segment multiple, ch tokens per
// chunk of a column, maxRecv the rows a rank keeps (capacity mode; a
// larger number in blocking mode), T this rank's tokens and rowCap the
// handle's receive rows (the tables' sizes).
struct layout_dims {
	int64_t R, me, K, L, maxT, pad, ch, maxRecv, T, rowCap;
};

LFN struct layout_dims layout_dims_of(int64_t R, int64_t me, int64_t K, int64_t L, int64_t maxT, int64_t pad,
				      int64_t ch, int64_t maxRecv, int64_t T, int64_t rowCap)
{
	struct layout_dims d = {R, me, K, L, maxT, pad, ch, maxRecv, T, rowCap};
	return d;
}

LFN int64_t layout_cols(const struct layout_dims *d) { return d->R + d->R * (1 + d->L); }
LFN int64_t layout_chunks(const struct layout_dims *d) { return (d->maxT + d->ch - 1) / d->ch; }

// Workspace (int32) offsets: fromSrc[R*R] and expFrom[R*E] (rows and
// expert slots from source s to destination d / expert e), rowBase[R*R]
// and expBase[R*E] (their prefixes over the sources), perExpert[E],
// segStart[E], recvCounts[R], permCounts[R], colCnt[C*chunks], summary.
LFN int64_t ws_fromSrc(const struct layout_dims *d) { return 0; }
LFN int64_t ws_expFrom(const struct layout_dims *d) { return d->R * d->R; }
LFN int64_t ws_rowBase(const struct layout_dims *d) { return ws_expFrom(d) + d->R * d->R * d->L; }
LFN int64_t ws_expBase(const struct layout_dims *d) { return ws_rowBase(d) + d->R * d->R; }
LFN int64_t ws_perExpert(const struct layout_dims *d) { return ws_expBase(d) + d->R * d->R * d->L; }
LFN int64_t ws_segStart(const struct layout_dims *d) { return ws_perExpert(d) + d->R * d->L; }
LFN int64_t ws_recvCounts(const struct layout_dims *d) { return ws_segStart(d) + d->R * d->L; }
LFN int64_t ws_permCounts(const struct layout_dims *d) { return ws_recvCounts(d) + d->R; }
LFN int64_t ws_colCnt(const struct layout_dims *d) { return ws_permCounts(d) + d->R; }
LFN int64_t ws_summary(const struct layout_dims *d) { return ws_colCnt(d) + layout_cols(d) * layout_chunks(d); }
LFN int64_t ws_summaryLen(const struct layout_dims *d) { return sumHeader + 2 * d->R + 2 * d->L + 1; }
LFN int64_t ws_size(const struct layout_dims *d) { return ws_summary(d) + ws_summaryLen(d); }

// Table (int32) offsets, executor's gpuTables order: entTok, entDest,
// entRow [T*W], slotEnt [T*K], recvSrc, recvEnt [rowCap], recvIdx, pos
// [rowCap*K]; W = min(K, R).
LFN int64_t layout_W(const struct layout_dims *d) { return d->K < d->R ? d->K : d->R; }
LFN int64_t tb_entTok(const struct layout_dims *d) { return 0; }
LFN int64_t tb_entDest(const struct layout_dims *d) { return d->T * layout_W(d); }
LFN int64_t tb_entRow(const struct layout_dims *d) { return 2 * d->T * layout_W(d); }
LFN int64_t tb_slotEnt(const struct layout_dims *d) { return 3 * d->T * layout_W(d); }
LFN int64_t tb_recvSrc(const struct layout_dims *d) { return tb_slotEnt(d) + d->T * d->K; }
LFN int64_t tb_recvEnt(const struct layout_dims *d) { return tb_recvSrc(d) + d->rowCap; }
LFN int64_t tb_recvIdx(const struct layout_dims *d) { return tb_recvEnt(d) + d->rowCap; }
LFN int64_t tb_pos(const struct layout_dims *d) { return tb_recvIdx(d) + d->rowCap * d->K; }
LFN int64_t tb_size(const struct layout_dims *d) { return tb_pos(d) + d->rowCap * d->K; }

// ntok is source s's token count, clamped to [0, maxT] (the route window
// may hold anything after a failed exchange; the host then discards the
// results, but no thread reads outside the window).
LFN int64_t ntok(const struct layout_dims *d, const int32_t *nt, int64_t s)
{
	int64_t n = nt[s];
	return n < 0 ? 0 : (n > d->maxT ? d->maxT : n);
}

LFN const int32_t *route_row(const struct layout_dims *d, const int32_t *rt, int64_t s, int64_t t)
{
	return rt + (s * d->maxT + t) * d->K;
}

// owner is the rank of expert e >= 0, in 32-bit arithmetic (experts and
// ranks are int32s): a GPU divides 64-bit integers in software, about
// five times the instructions, and the column kernels divide in their
// inner loops.
LFN int32_t owner(const struct layout_dims *d, int32_t e) { return e / (int32_t)d->L; }

// goes_to reports whether a (valid) routing row has an expert on rank r.
LFN int goes_to(const struct layout_dims *d, const int32_t *row, int64_t r)
{
	for (int64_t k = 0; k < d->K; k++) {
		if (row[k] >= 0 && owner(d, row[k]) == r) {
			return 1;
		}
	}
	return 0;
}

// dests_below is the number of distinct ranks below r that own an expert
// of the row: the index of rank r among the row's destinations
// (ascending), when the row goes to r.
LFN int64_t dests_below(const struct layout_dims *d, const int32_t *row, int64_t r)
{
	int64_t n = 0;
	for (int64_t k = 0; k < d->K; k++) {
		if (row[k] < 0 || owner(d, row[k]) >= r) {
			continue;
		}
		int first = 1;
		for (int64_t j = 0; j < k; j++) {
			if (row[j] >= 0 && owner(d, row[j]) == owner(d, row[k])) {
				first = 0;
				break;
			}
		}
		n += first;
	}
	return n;
}

// layout_copy copies n int32s from src to dst (distinct), layoutBatch
// loads at a time.
LFN void layout_copy(int32_t *LAYOUT_RESTRICT dst, const int32_t *LAYOUT_RESTRICT src, int64_t n)
{
	for (int64_t i0 = 0; i0 < n; i0 += layoutBatch) {
		int32_t v[layoutBatch];
		for (int j = 0; j < layoutBatch; j++) {
			v[j] = i0 + j < n ? src[i0 + j] : 0;
		}
		for (int j = 0; j < layoutBatch && i0 + j < n; j++) {
			dst[i0 + j] = v[j];
		}
	}
}

LFN int64_t valid_recv(const struct layout_dims *d, const int32_t *ws, int64_t r)
{
	int64_t n = ws[ws_recvCounts(d) + r];
	return n < d->maxRecv ? n : d->maxRecv;
}

// layout_count is thread i = s*maxT + t of count: it checks token t of
// source s (checkRouting: each expert in [-1, E), none repeated; the
// smallest (s, t, k) at fault wins the error key) and counts, for a valid
// row, one row to each distinct destination and one slot to each expert.
LFN void layout_count(const struct layout_dims *d, const int32_t *LAYOUT_RESTRICT rt,
		      const int32_t *LAYOUT_RESTRICT nt, int32_t *LAYOUT_RESTRICT ws, uint64_t *LAYOUT_RESTRICT errKey,
		      int64_t i)
{
	int64_t s = i / d->maxT, t = i % d->maxT;
	if (s >= d->R || t >= ntok(d, nt, s)) {
		return;
	}
	const int32_t *row = route_row(d, rt, s, t);
	int64_t E = d->R * d->L;
	for (int64_t k = 0; k < d->K; k++) {
		int64_t e = row[k];
		int bad = e < -1 || e >= E;
		for (int64_t j = 0; j < k && !bad && e >= 0; j++) {
			bad = row[j] == e;
		}
		if (bad) {
			LAYOUT_MIN64(errKey, (uint64_t)i * (uint64_t)d->K + (uint64_t)k);
			return;
		}
	}
	for (int64_t k = 0; k < d->K; k++) {
		int64_t e = row[k];
		if (e < 0) {
			continue;
		}
		int first = 1;
		for (int64_t j = 0; j < k; j++) {
			if (row[j] >= 0 && owner(d, row[j]) == owner(d, (int32_t)e)) {
				first = 0;
				break;
			}
		}
		if (first) {
			LAYOUT_ADD(&ws[ws_fromSrc(d) + s * d->R + owner(d, (int32_t)e)], 1);
		}
		LAYOUT_ADD(&ws[ws_expFrom(d) + s * E + e], 1);
	}
}

// layout_scan_column is the exclusive prefix sum over the sources s < R of
// column c of an R x width matrix of counts (counts[s*width + c]): it
// writes base[s*width + c] and returns the column's total.
LFN int32_t layout_scan_column(const int32_t *counts, int32_t *base, int64_t R, int64_t width, int64_t c)
{
	int32_t run = 0;
	for (int64_t s = 0; s < R; s++) {
		base[s * width + c] = run;
		run += counts[s * width + c];
	}
	return run;
}

// layout_scan_a is thread tid of nth of scan's first phase: prefix sums
// over the sources of the row counts (column d) and expert counts (column
// e), and the totals.
LFN void layout_scan_a(const struct layout_dims *d, int32_t *ws, int64_t tid, int64_t nth)
{
	int64_t R = d->R, E = d->R * d->L;
	for (int64_t c = tid; c < R; c += nth) {
		ws[ws_recvCounts(d) + c] = layout_scan_column(ws + ws_fromSrc(d), ws + ws_rowBase(d), R, R, c);
	}
	for (int64_t e = tid; e < E; e += nth) {
		ws[ws_perExpert(d) + e] = layout_scan_column(ws + ws_expFrom(d), ws + ws_expBase(d), R, E, e);
	}
}

// layout_segments writes seg[l], the exclusive prefix over l of n[l]
// rounded up to pad, and their total at *total; n, seg and total are
// distinct parts of the workspace.
LFN void layout_segments(const int32_t *LAYOUT_RESTRICT n, int32_t *LAYOUT_RESTRICT seg, int64_t L, int64_t pad,
			 int32_t *LAYOUT_RESTRICT total)
{
	int32_t off = 0;
	for (int64_t l0 = 0; l0 < L; l0 += layoutBatch) {
		int32_t v[layoutBatch];
		for (int j = 0; j < layoutBatch; j++) {
			v[j] = l0 + j < L ? n[l0 + j] : 0;
		}
		for (int j = 0; j < layoutBatch && l0 + j < L; j++) {
			seg[l0 + j] = off;
			off += (int32_t)((v[j] + pad - 1) / pad * pad);
		}
	}
	*total = off;
}

// layout_scan_b is scan's second phase: the padded segment starts of
// every rank's experts and every rank's permuted count.
LFN void layout_scan_b(const struct layout_dims *d, int32_t *ws, int64_t tid, int64_t nth)
{
	for (int64_t r = tid; r < d->R; r += nth) {
		layout_segments(ws + ws_perExpert(d) + r * d->L, ws + ws_segStart(d) + r * d->L, d->L, d->pad,
				ws + ws_permCounts(d) + r);
	}
}

// layout_scan_c is scan's last phase (one thread): the summary.
LFN void layout_scan_c(const struct layout_dims *d, const int32_t *rt, int32_t *ws, const uint64_t *errKey)
{
	int32_t *sum = ws + ws_summary(d);
	int64_t R = d->R, L = d->L, me = d->me;
	for (int64_t i = 0; i < sumHeader; i++) {
		sum[i] = -1;
	}
	sum[sumErr] = 0;
	uint64_t key = *errKey;
	if (key != ~(uint64_t)0) {
		int64_t k = (int64_t)(key % (uint64_t)d->K), i = (int64_t)(key / (uint64_t)d->K);
		int64_t s = i / d->maxT, t = i % d->maxT;
		const int32_t *row = route_row(d, rt, s, t);
		sum[sumErr] = 1;
		sum[sumErrRank] = (int32_t)s;
		sum[sumErrToken] = (int32_t)t;
		sum[sumErrSlot] = (int32_t)k;
		sum[sumErrExpert] = row[k];
		if (row[k] >= -1 && row[k] < R * L) {
			sum[sumErr] = 2;
			for (int64_t j = 0; j < k; j++) {
				if (row[j] == row[k]) {
					sum[sumErrPrev] = (int32_t)j;
					break;
				}
			}
		}
	}
	sum[sumRecv] = ws[ws_recvCounts(d) + me];
	sum[sumPermuted] = ws[ws_permCounts(d) + me];
	layout_copy(sum + sumHeader, ws + ws_recvCounts(d), R);
	layout_copy(sum + sumHeader + R, ws + ws_permCounts(d), R);
	layout_copy(sum + sumHeader + 2 * R, ws + ws_perExpert(d) + me * L, L);
	layout_copy(sum + sumHeader + 2 * R + L, ws + ws_segStart(d) + me * L, L);
	sum[sumHeader + 2 * R + 2 * L] = ws[ws_permCounts(d) + me];
}

// layout_col is column c's source rank, and through *kind its meaning: -1
// the send column of destination c, 0 the receive column, 1+l the column
// of local expert l.
LFN int64_t layout_col(const struct layout_dims *d, int64_t c, int64_t *kind)
{
	if (c < d->R) {
		*kind = -1;
		return d->me;
	}
	c -= d->R;
	*kind = c % (1 + d->L);
	return c / (1 + d->L);
}

// has_expert returns the slot of expert e in the row, or -1.
LFN int64_t has_expert(const struct layout_dims *d, const int32_t *row, int64_t e)
{
	for (int64_t k = 0; k < d->K; k++) {
		if (row[k] == e) {
			return k;
		}
	}
	return -1;
}

LFN int col_flag(const struct layout_dims *d, const int32_t *row, int64_t c, int64_t kind)
{
	if (kind < 0) {
		return goes_to(d, row, c);
	}
	if (kind == 0) {
		return goes_to(d, row, d->me);
	}
	return has_expert(d, row, d->me * d->L + kind - 1) >= 0;
}

// layout_finish is finish's one thread: the handle's device counts
// (executor's plan.Counts: RecvCount, PermutedCount, the overflow flag of
// this rank, 0, TokensPerExpert[L]; all 0 after a routing error) from the
// summary, and the report: report[0] = 1 and the summary copied after it
// when the summary holds a routing error or, with capErr set, some rank
// is over capacity (maxRecv rows, maxPerm permuted rows), unless report[0]
// already holds an earlier report.
LFN void layout_finish(const struct layout_dims *d, const int32_t *LAYOUT_RESTRICT ws, int32_t *LAYOUT_RESTRICT counts,
		       int32_t *LAYOUT_RESTRICT report, int64_t maxPerm, int32_t capErr)
{
	const int32_t *sum = ws + ws_summary(d);
	int64_t R = d->R, L = d->L;
	int bad = sum[sumErr] != 0, over = 0;
	for (int64_t r = 0; r < R; r++) {
		over |= sum[sumHeader + r] > d->maxRecv || sum[sumHeader + R + r] > maxPerm;
	}
	counts[0] = bad ? 0 : sum[sumRecv];
	counts[1] = bad ? 0 : sum[sumPermuted];
	counts[2] = !bad && (sum[sumRecv] > d->maxRecv || sum[sumPermuted] > maxPerm);
	counts[3] = 0;
	if (bad) {
		for (int64_t l = 0; l < L; l++) {
			counts[4 + l] = 0;
		}
	} else {
		layout_copy(counts + 4, sum + sumHeader + 2 * R, L);
	}
	if (report[0] == 0 && (bad || (capErr && over))) {
		layout_copy(report + 1, sum, ws_summaryLen(d));
		report[0] = 1;
	}
}

// layout_failed reports whether the summary holds a routing error: the
// column kernels then write nothing.
LFN int layout_failed(const struct layout_dims *d, const int32_t *ws) { return ws[ws_summary(d) + sumErr] != 0; }

// layout_colcount is thread i = c*chunks + chunk of colcount: the tokens
// of the chunk whose flag of column c is set.
LFN void layout_colcount(const struct layout_dims *d, const int32_t *LAYOUT_RESTRICT rt,
			 const int32_t *LAYOUT_RESTRICT nt, int32_t *LAYOUT_RESTRICT ws, int64_t i)
{
	int64_t nch = layout_chunks(d), c = i / nch, ch = i % nch, kind;
	if (c >= layout_cols(d) || layout_failed(d, ws)) {
		return;
	}
	int64_t s = layout_col(d, c, &kind), end = ntok(d, nt, s), n = 0;
	if (end > (ch + 1) * d->ch) {
		end = (ch + 1) * d->ch;
	}
	for (int64_t t = ch * d->ch; t < end; t++) {
		n += col_flag(d, route_row(d, rt, s, t), c, kind);
	}
	ws[ws_colCnt(d) + i] = (int32_t)n;
}

// layout_colscan is thread c of colscan: column c's chunk counts become
// their exclusive prefix sums.
LFN void layout_colscan(const struct layout_dims *d, int32_t *ws, int64_t c)
{
	int64_t nch = layout_chunks(d);
	if (c >= layout_cols(d)) {
		return;
	}
	int32_t *cnt = ws + ws_colCnt(d) + c * nch, run = 0;
	for (int64_t ch0 = 0; ch0 < nch; ch0 += layoutBatch) {
		int32_t v[layoutBatch];
		for (int j = 0; j < layoutBatch; j++) {
			v[j] = ch0 + j < nch ? cnt[ch0 + j] : 0;
		}
		for (int j = 0; j < layoutBatch && ch0 + j < nch; j++) {
			cnt[ch0 + j] = run;
			run += v[j];
		}
	}
}

// layout_colwrite is thread i = c*chunks + chunk of colwrite: it writes
// the table entries of the chunk's flagged tokens in column c.
//
//   - send column of destination r (this rank's token t): entry t*W + x,
//     x the index of r among t's destinations: entTok, entDest, and entRow
//     (the token's row on r) when r keeps that row; then slotEnt of the
//     slots whose expert r owns.
//   - receive column of source s: received row i (s's rows start at
//     rowBase[s][me]), when this rank keeps it: recvSrc, recvEnt (the
//     entry on s) and recvIdx of the slots whose expert this rank owns.
//   - column of local expert l of source s: pos of the slot holding
//     expert me*L+l, in the segment of that expert after the rows of
//     earlier sources and earlier tokens of s.
LFN void layout_colwrite(const struct layout_dims *d, const int32_t *LAYOUT_RESTRICT rt,
			 const int32_t *LAYOUT_RESTRICT nt, const int32_t *LAYOUT_RESTRICT ws, int32_t *LAYOUT_RESTRICT tb,
			 int64_t i)
{
	int64_t nch = layout_chunks(d), c = i / nch, ch = i % nch, kind;
	if (c >= layout_cols(d) || layout_failed(d, ws)) {
		return;
	}
	int64_t R = d->R, L = d->L, K = d->K, W = layout_W(d), me = d->me;
	int64_t s = layout_col(d, c, &kind), end = ntok(d, nt, s);
	if (end > (ch + 1) * d->ch) {
		end = (ch + 1) * d->ch;
	}
	int64_t run = ws[ws_colCnt(d) + i];
	if (kind < 0) {
		int64_t rowBase = ws[ws_rowBase(d) + me * R + c], keep = valid_recv(d, ws, c);
		for (int64_t t = ch * d->ch; t < end && t < d->T; t++) {
			const int32_t *row = route_row(d, rt, s, t);
			if (!goes_to(d, row, c)) {
				continue;
			}
			int64_t ent = t * W + dests_below(d, row, c), r = rowBase + run++;
			tb[tb_entTok(d) + ent] = (int32_t)t;
			tb[tb_entDest(d) + ent] = (int32_t)c;
			if (r >= keep) {
				continue;
			}
			tb[tb_entRow(d) + ent] = (int32_t)r;
			for (int64_t k = 0; k < K; k++) {
				if (row[k] >= 0 && owner(d, row[k]) == c) {
					tb[tb_slotEnt(d) + t * K + k] = (int32_t)ent;
				}
			}
		}
		return;
	}
	int64_t keep = valid_recv(d, ws, me);
	if (keep > d->rowCap) {
		keep = d->rowCap;
	}
	if (kind == 0) {
		int64_t rowBase = ws[ws_rowBase(d) + s * R + me];
		for (int64_t t = ch * d->ch; t < end; t++) {
			const int32_t *row = route_row(d, rt, s, t);
			if (!goes_to(d, row, me)) {
				continue;
			}
			int64_t r = rowBase + run++;
			if (r >= keep) {
				continue;
			}
			tb[tb_recvSrc(d) + r] = (int32_t)s;
			tb[tb_recvEnt(d) + r] = (int32_t)(t * W + dests_below(d, row, me));
			for (int64_t k = 0; k < K; k++) {
				if (row[k] >= me * L && row[k] < (me + 1) * L) {
					tb[tb_recvIdx(d) + r * K + k] = (int32_t)(row[k] - me * L);
				}
			}
		}
		return;
	}
	// The rows of s on this rank before this chunk: the receive column's
	// prefix (column R + s*(1+L), the same chunk).
	int64_t e = me * L + kind - 1, E = R * L;
	int64_t r = ws[ws_rowBase(d) + s * R + me] + ws[ws_colCnt(d) + (R + s * (1 + L)) * nch + ch];
	int64_t base = (int64_t)ws[ws_segStart(d) + e] + ws[ws_expBase(d) + s * E + e];
	for (int64_t t = ch * d->ch; t < end; t++) {
		const int32_t *row = route_row(d, rt, s, t);
		if (!goes_to(d, row, me)) {
			continue;
		}
		int64_t k = has_expert(d, row, e);
		if (k >= 0) {
			if (r < keep) {
				tb[tb_pos(d) + r * K + k] = (int32_t)(base + run);
			}
			run++;
		}
		r++;
	}
}

#endif
