// The layout kernels of the GPU data path (package gpu): the layout of one
// NVLink domain computed on the GPU from every rank's routing in this
// rank's route window. go generate ./executor/internal/gpu builds them to
// layout.ptx (internal/ptxgen).
//
// Each kernel runs the per-thread code of internal/gpulayout/layout.h
// (read there what each computes and the launch sequence); package
// internal/gpulayout runs the same code on the host in tests. Every
// pointer is device memory; sizes arrive by value (DESIGN.md invariant 1).
#include "layout.h"

#define DIMS layout_dims_of(R, me, K, L, maxT, pad, ch, maxRecv, T, rowCap)
#define DIM_PARAMS                                                                                       \
	int64_t R, int64_t me, int64_t K, int64_t L, int64_t maxT, int64_t pad, int64_t ch, int64_t maxRecv, \
		int64_t T, int64_t rowCap

static __device__ __forceinline__ int64_t thread_index()
{
	return (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
}

// goep_layout_count: threads R*maxT (layout_count).
extern "C" __global__ void goep_layout_count(const int32_t *rt, const int32_t *nt, int32_t *ws, uint64_t *errKey,
					     DIM_PARAMS)
{
	struct layout_dims d = DIMS;
	int64_t i = thread_index();
	if (i < d.R * d.maxT) {
		layout_count(&d, rt, nt, ws, errKey, i);
	}
}

// goep_layout_scan: one block, its phases apart (layout_scan_a, _b, _c).
extern "C" __global__ void goep_layout_scan(const int32_t *rt, int32_t *ws, const uint64_t *errKey, DIM_PARAMS)
{
	struct layout_dims d = DIMS;
	layout_scan_a(&d, ws, threadIdx.x, blockDim.x);
	__syncthreads();
	layout_scan_b(&d, ws, threadIdx.x, blockDim.x);
	__syncthreads();
	if (threadIdx.x == 0) {
		layout_scan_c(&d, rt, ws, errKey);
	}
}

// goep_layout_finish: one thread (layout_finish), after scan, in a layout
// captured into a CUDA graph: the handle's counts and the report; a
// report to read raises the alarm (nvlink's GPUFlags.Alarm, host memory),
// which tells the host's next synchronize to read it back.
extern "C" __global__ void goep_layout_finish(const int32_t *ws, int32_t *counts, int32_t *report, int64_t maxPerm,
					      int32_t capErr, uint64_t *alarm, DIM_PARAMS)
{
	struct layout_dims d = DIMS;
	if (blockIdx.x == 0 && threadIdx.x == 0) {
		layout_finish(&d, ws, counts, report, maxPerm, capErr);
		if (*(volatile int32_t *)report != 0) {
			*(volatile uint64_t *)alarm = 1;
			__threadfence_system();
		}
	}
}

// goep_layout_colcount: threads cols*chunks (layout_colcount).
extern "C" __global__ void goep_layout_colcount(const int32_t *rt, const int32_t *nt, int32_t *ws, DIM_PARAMS)
{
	struct layout_dims d = DIMS;
	int64_t i = thread_index();
	if (i < layout_cols(&d) * layout_chunks(&d)) {
		layout_colcount(&d, rt, nt, ws, i);
	}
}

// goep_layout_colscan: threads cols (layout_colscan).
extern "C" __global__ void goep_layout_colscan(int32_t *ws, DIM_PARAMS)
{
	struct layout_dims d = DIMS;
	layout_colscan(&d, ws, thread_index());
}

// goep_layout_colwrite: threads cols*chunks (layout_colwrite).
extern "C" __global__ void goep_layout_colwrite(const int32_t *rt, const int32_t *nt, const int32_t *ws, int32_t *tb,
						DIM_PARAMS)
{
	struct layout_dims d = DIMS;
	int64_t i = thread_index();
	if (i < layout_cols(&d) * layout_chunks(&d)) {
		layout_colwrite(&d, rt, nt, ws, tb, i);
	}
}

// goep_layout_put is the routing exchange: this rank's routing idx (T
// tokens of K slots) goes to slot me of every domain rank's route window
// (peerRoute[p], p < R: [R*maxT*K] int32 routing, then [R] int32 token
// counts), and T to its token count. Threads R*T*K (at least R).
extern "C" __global__ void goep_layout_put(const int32_t *idx, int32_t *const *peerRoute, int64_t R, int64_t me,
					   int64_t maxT, int64_t K, int64_t T)
{
	int64_t i = thread_index(), n = T * K;
	if (i < R * n) {
		int64_t p = i / n, j = i % n;
		peerRoute[p][me * maxT * K + j] = idx[j];
	}
	if (i < R) {
		peerRoute[i][R * maxT * K + me] = (int32_t)T;
	}
}
