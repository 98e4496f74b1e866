/*
 * a2a_mpi: a hand-written MoE dispatch over Open MPI, the yardstick of
 * eprun's a2a baseline (internal/bench.A2A) and of goep's dispatch on the
 * host (docs/PERFORMANCE.md, 1.2 and 3.1).
 *
 * Per call, as a C user would write it: count the rows for each
 * destination, exchange the counts (MPI_Alltoall), pack for each
 * destination [n rows][n x K int32 expert ids][n x K fp32 weights] in token
 * order with memcpy into buffers reused from one call to the next, one
 * MPI_Alltoallv of the messages, then keep the slots of this rank's
 * experts (dispatch); dispatch-permute adds the permute: every received
 * row copied into the segment of each local expert it chose (expert-major,
 * receive order within a segment, no padding), with its weight.
 *
 * The routing and payload are eprun bench's, draw for draw (uniform
 * routing: PCG-DXSM as Go's math/rand/v2, internal/bench.Routing; rows and
 * weights from the splitmix hash of internal/bench.World.XRow and Weight;
 * bf16), so its counts match eprun's for the same seed, and every rank
 * checks every output row against them after the timed loops: a wrong row
 * makes it exit 1.
 *
 * Timing as eprun's across processes (rank_max): each iteration after a
 * barrier, the maximum over ranks of each rank's time, the median over
 * iterations after the warm-up.
 *
 *   mpicc -O2 -o a2a_mpi scripts/a2a_mpi.c
 *   mpirun --allow-run-as-root --oversubscribe -np 4 ./a2a_mpi [flags]
 *     --tokens 256,512,1024,2048,4096  --hidden 2048  --experts 64
 *     --topk 8  --iters 20  --warmup 3  --seed 1
 *     --counts    also print each rank's received and permuted rows
 *     --corrupt   damage one received byte on the last rank before the
 *                 check (the check must fail: a test of the check)
 */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef unsigned __int128 u128;

static int me, R;

#define CHECK_MPI(call)                                                        \
	do {                                                                   \
		int rc_ = (call);                                              \
		if (rc_ != MPI_SUCCESS) {                                      \
			fprintf(stderr, "a2a_mpi: rank %d: %s failed: %d\n", me, \
				#call, rc_);                                   \
			MPI_Abort(MPI_COMM_WORLD, 1);                          \
		}                                                              \
	} while (0)

static void *xmalloc(size_t n)
{
	void *p = malloc(n ? n : 1);
	if (!p) {
		fprintf(stderr, "a2a_mpi: rank %d: out of memory (%zu bytes)\n", me, n);
		MPI_Abort(MPI_COMM_WORLD, 1);
	}
	return p;
}

/* grow makes *b hold at least n bytes, keeping it when it does. */
static void grow(char **b, size_t *cap, size_t n)
{
	if (n <= *cap)
		return;
	free(*b);
	*b = xmalloc(n);
	*cap = n;
}

/* PCG-DXSM, as Go's math/rand/v2 PCG. */
typedef struct {
	uint64_t hi, lo;
} pcg;

static uint64_t pcg_next(pcg *p)
{
	const u128 mul = ((u128)2549297995355413924ULL << 64) | 4865540595714422341ULL;
	const u128 inc = ((u128)6364136223846793005ULL << 64) | 1442695040888963407ULL;
	u128 s = (((u128)p->hi << 64) | p->lo) * mul + inc;
	p->hi = (uint64_t)(s >> 64);
	p->lo = (uint64_t)s;
	uint64_t hi = p->hi, lo = p->lo;
	hi ^= hi >> 32;
	hi *= 0xda942042e4dd58b5ULL;
	hi ^= hi >> 48;
	hi *= (lo | 1);
	return hi;
}

/* intn is Go's Rand.IntN (Lemire's method, as rand/v2's uint64n). */
static uint64_t intn(pcg *p, uint64_t n)
{
	if ((n & (n - 1)) == 0)
		return pcg_next(p) & (n - 1);
	u128 m = (u128)pcg_next(p) * n;
	uint64_t lo = (uint64_t)m;
	if (lo < n) {
		uint64_t thresh = -n % n;
		while (lo < thresh) {
			m = (u128)pcg_next(p) * n;
			lo = (uint64_t)m;
		}
	}
	return (uint64_t)(m >> 64);
}

/* routing is internal/bench.Routing: tokens rows of topk distinct experts,
 * a partial Fisher-Yates shuffle per row. */
static void routing(uint64_t seed, int rank, int tokens, int topk, int experts, int32_t *out)
{
	pcg p = {seed, 0x9e3779b97f4a7c15ULL ^ (uint64_t)rank};
	int32_t *perm = xmalloc(sizeof(int32_t) * experts);
	int *swaps = xmalloc(sizeof(int) * topk);
	for (int i = 0; i < experts; i++)
		perm[i] = i;
	for (int t = 0; t < tokens; t++) {
		for (int j = 0; j < topk; j++) {
			int i = j + (int)intn(&p, (uint64_t)(experts - j));
			int32_t v = perm[i];
			perm[i] = perm[j];
			perm[j] = v;
			swaps[j] = i;
			out[t * topk + j] = perm[j];
		}
		for (int j = topk - 1; j >= 0; j--) {
			int i = swaps[j];
			int32_t v = perm[i];
			perm[i] = perm[j];
			perm[j] = v;
		}
	}
	free(perm);
	free(swaps);
}

static uint64_t mix(uint64_t x)
{
	x ^= x >> 30;
	x *= 0xbf58476d1ce4e5b9ULL;
	x ^= x >> 27;
	x *= 0x94d049bb133111ebULL;
	x ^= x >> 31;
	return x;
}

static uint64_t seed;

static uint64_t row_key(int s, int t)
{
	return mix(seed ^ mix(((uint64_t)s << 32) | (uint32_t)t));
}

/* xrow is World.XRow in bf16: integers in [-16, 16], exact in bf16 (the
 * top half of their fp32 bits). */
static void xrow(uint16_t *dst, int hidden, int s, int t)
{
	uint64_t k = row_key(s, t);
	for (int j = 0; j < hidden; j++) {
		float v = (float)((int)(mix(k + (uint64_t)j) % 33) - 16);
		uint32_t bits;
		memcpy(&bits, &v, 4);
		dst[j] = (uint16_t)(bits >> 16);
	}
}

/* weight is World.Weight: a multiple of 1/64 in (0, 1]. */
static float weight(int s, int t, int k)
{
	return (float)(mix(row_key(s, t) ^ 0xa5a5a5a5ULL ^ ((uint64_t)k << 48)) % 64 + 1) / 64;
}

/* One rank's state for one size. */
static int T, H, K, E, L;
static size_t rb;              /* row bytes */
static char *x;                /* [T, H] bf16 */
static int32_t *idx;           /* [T*K] */
static float *wts;             /* [T*K] */
static int *scnt, *rcnt;       /* rows to and from each rank */
static int *sbytes, *sdispl, *rbytes, *rdispl, *seen, *fill;
static char *sbuf, *rbuf, *px; /* messages, permuted rows */
static size_t scap, rcap, pcap;
static int N, P;
static int32_t *ridx;  /* [N*K] local expert ids, else -1 */
static float *rw;      /* [N*K] */
static size_t *rowoff; /* [N] offset of each received row in rbuf */
static float *pw;      /* [P] */
static int32_t *pos;   /* [N*K] */
static size_t ncap, pwcap;

static void dispatch(void)
{
	size_t meta = 8 * (size_t)K;
	memset(scnt, 0, sizeof(int) * R);
	memset(seen, 0, sizeof(int) * R);
	for (int t = 0; t < T; t++)
		for (int q = 0; q < K; q++) {
			int d = idx[t * K + q] / L;
			if (seen[d] != t + 1) {
				seen[d] = t + 1;
				scnt[d]++;
			}
		}
	CHECK_MPI(MPI_Alltoall(scnt, 1, MPI_INT, rcnt, 1, MPI_INT, MPI_COMM_WORLD));
	size_t so = 0, ro = 0;
	N = 0;
	for (int p = 0; p < R; p++) {
		sbytes[p] = (int)(scnt[p] * (rb + meta));
		sdispl[p] = (int)so;
		so += sbytes[p];
		rbytes[p] = (int)(rcnt[p] * (rb + meta));
		rdispl[p] = (int)ro;
		ro += rbytes[p];
		N += rcnt[p];
	}
	grow(&sbuf, &scap, so);
	grow(&rbuf, &rcap, ro);
	memset(fill, 0, sizeof(int) * R);
	memset(seen, 0, sizeof(int) * R);
	for (int t = 0; t < T; t++)
		for (int q = 0; q < K; q++) {
			int d = idx[t * K + q] / L;
			if (seen[d] == t + 1)
				continue;
			seen[d] = t + 1;
			int n = scnt[d], j = fill[d]++;
			char *m = sbuf + sdispl[d];
			memcpy(m + j * rb, x + t * rb, rb);
			memcpy(m + n * rb + (size_t)j * 4 * K, idx + t * K, 4 * (size_t)K);
			memcpy(m + n * rb + (size_t)n * 4 * K + (size_t)j * 4 * K, wts + t * K, 4 * (size_t)K);
		}
	CHECK_MPI(MPI_Alltoallv(sbuf, sbytes, sdispl, MPI_BYTE, rbuf, rbytes, rdispl, MPI_BYTE, MPI_COMM_WORLD));
	if ((size_t)N > ncap) {
		free(ridx);
		free(rw);
		free(rowoff);
		free(pos);
		ridx = xmalloc(sizeof(int32_t) * N * K);
		rw = xmalloc(sizeof(float) * N * K);
		rowoff = xmalloc(sizeof(size_t) * N);
		pos = xmalloc(sizeof(int32_t) * N * K);
		ncap = N;
	}
	int i = 0;
	for (int s = 0; s < R; s++) {
		int c = rcnt[s];
		char *m = rbuf + rdispl[s];
		const int32_t *ids = (const int32_t *)(m + c * rb);
		const float *ws = (const float *)(m + c * rb + (size_t)c * 4 * K);
		for (int j = 0; j < c; j++, i++) {
			rowoff[i] = rdispl[s] + j * rb;
			for (int q = 0; q < K; q++) {
				int32_t e = ids[j * K + q];
				int local = e >= 0 && e / L == me;
				ridx[i * K + q] = local ? e % L : -1;
				rw[i * K + q] = local ? ws[j * K + q] : 0;
			}
		}
	}
}

static void permute(void)
{
	int *cnt = calloc(L, sizeof(int)), *off = calloc(L + 1, sizeof(int)), *f = calloc(L, sizeof(int));
	for (int i = 0; i < N * K; i++)
		if (ridx[i] >= 0)
			cnt[ridx[i]]++;
	for (int e = 0; e < L; e++)
		off[e + 1] = off[e] + cnt[e];
	P = off[L];
	for (int i = 0; i < N * K; i++)
		pos[i] = ridx[i] < 0 ? -1 : off[ridx[i]] + f[ridx[i]]++;
	grow(&px, &pcap, (size_t)P * rb);
	if ((size_t)P > pwcap) {
		free(pw);
		pw = xmalloc(sizeof(float) * (P ? P : 1));
		pwcap = P;
	}
	for (int i = 0; i < N; i++)
		for (int q = 0; q < K; q++) {
			int p = pos[i * K + q];
			if (p >= 0) {
				memcpy(px + (size_t)p * rb, rbuf + rowoff[i], rb);
				pw[p] = rw[i * K + q];
			}
		}
	free(cnt);
	free(off);
	free(f);
}

/* check compares the outputs with the routing of every rank and the
 * payload; it returns the wrong rows (received and permuted). */
static long check(void)
{
	long wrong = 0;
	uint16_t *want = xmalloc(rb);
	int32_t *other = xmalloc(sizeof(int32_t) * T * K);
	int *segfill = calloc(L, sizeof(int)), *segoff = calloc(L + 1, sizeof(int)), *cnt = calloc(L, sizeof(int));
	for (int i = 0; i < N * K; i++)
		if (ridx[i] >= 0)
			cnt[ridx[i]]++;
	for (int e = 0; e < L; e++)
		segoff[e + 1] = segoff[e] + cnt[e];
	int i = 0, perm = 0;
	for (int s = 0; s < R; s++) {
		routing(seed, s, T, K, E, other);
		for (int t = 0; t < T; t++) {
			int here = 0;
			for (int q = 0; q < K; q++)
				here |= other[t * K + q] / L == me;
			if (!here)
				continue;
			if (i >= N) {
				wrong++;
				continue;
			}
			xrow(want, H, s, t);
			int bad = memcmp(rbuf + rowoff[i], want, rb) != 0;
			for (int q = 0; q < K; q++) {
				int32_t e = other[t * K + q];
				int local = e / L == me;
				if (ridx[i * K + q] != (local ? e % L : -1) || rw[i * K + q] != (local ? weight(s, t, q) : 0))
					bad = 1;
				if (local) {
					int p = segoff[e % L] + segfill[e % L]++;
					perm++;
					if (p >= P || memcmp(px + (size_t)p * rb, want, rb) != 0 || pw[p] != weight(s, t, q))
						wrong++;
				}
			}
			wrong += bad;
			i++;
		}
	}
	wrong += (long)(N - i > 0 ? N - i : 0) + (perm != P);
	free(want);
	free(other);
	free(segfill);
	free(segoff);
	free(cnt);
	return wrong;
}

static double now_us(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

/* timed runs op warmup+iters times after a barrier each, and returns the
 * median over the timed iterations of the maximum over ranks (on every
 * rank). */
static double timed(void (*op)(int), int warmup, int iters)
{
	double *mine = xmalloc(sizeof(double) * iters), *most = xmalloc(sizeof(double) * iters);
	for (int it = 0; it < warmup + iters; it++) {
		CHECK_MPI(MPI_Barrier(MPI_COMM_WORLD));
		double t0 = now_us();
		op(1);
		double t1 = now_us();
		if (it >= warmup)
			mine[it - warmup] = t1 - t0;
	}
	CHECK_MPI(MPI_Allreduce(mine, most, iters, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD));
	qsort(most, iters, sizeof(double), cmp_double);
	double med = iters % 2 ? most[iters / 2] : (most[iters / 2 - 1] + most[iters / 2]) / 2;
	free(mine);
	free(most);
	return med;
}

static void op_dispatch(int unused) { (void)unused, dispatch(); }
static void op_dispatch_permute(int unused) { (void)unused, dispatch(), permute(); }

static int parse_ints(const char *s, int *out, int most)
{
	int n = 0;
	while (*s && n < most) {
		char *end;
		long v = strtol(s, &end, 10);
		if (end == s || v < 0)
			return -1;
		out[n++] = (int)v;
		s = *end == ',' ? end + 1 : end;
		if (*end && *end != ',')
			return -1;
	}
	return n;
}

int main(int argc, char **argv)
{
	int sizes[32] = {256, 512, 1024, 2048, 4096}, nsizes = 5;
	int iters = 20, warmup = 3, counts = 0, corrupt = 0;
	H = 2048, E = 64, K = 8, seed = 1;
	MPI_Init(&argc, &argv);
	MPI_Comm_rank(MPI_COMM_WORLD, &me);
	MPI_Comm_size(MPI_COMM_WORLD, &R);
	for (int a = 1; a < argc; a++) {
		const char *f = argv[a], *v = a + 1 < argc ? argv[a + 1] : NULL;
		int ok = 1;
		if (!strcmp(f, "--counts"))
			counts = 1;
		else if (!strcmp(f, "--corrupt"))
			corrupt = 1;
		else if (v && !strcmp(f, "--tokens"))
			ok = (nsizes = parse_ints(v, sizes, 32)) > 0, a++;
		else if (v && !strcmp(f, "--hidden"))
			H = atoi(v), a++;
		else if (v && !strcmp(f, "--experts"))
			E = atoi(v), a++;
		else if (v && !strcmp(f, "--topk"))
			K = atoi(v), a++;
		else if (v && !strcmp(f, "--iters"))
			iters = atoi(v), a++;
		else if (v && !strcmp(f, "--warmup"))
			warmup = atoi(v), a++;
		else if (v && !strcmp(f, "--seed"))
			seed = strtoull(v, NULL, 10), a++;
		else
			ok = 0;
		if (!ok) {
			if (me == 0)
				fprintf(stderr, "a2a_mpi: bad flag %s (see the comment at the top of scripts/a2a_mpi.c)\n", f);
			MPI_Finalize();
			return 2;
		}
	}
	if (H <= 0 || K <= 0 || iters <= 0 || warmup < 0 || E % R || K > E) {
		if (me == 0)
			fprintf(stderr, "a2a_mpi: want hidden, topk, iters > 0, warmup >= 0, topk <= experts and experts a multiple of the %d ranks\n", R);
		MPI_Finalize();
		return 2;
	}
	L = E / R;
	rb = 2 * (size_t)H;
	scnt = xmalloc(sizeof(int) * R), rcnt = xmalloc(sizeof(int) * R);
	sbytes = xmalloc(sizeof(int) * R), sdispl = xmalloc(sizeof(int) * R);
	rbytes = xmalloc(sizeof(int) * R), rdispl = xmalloc(sizeof(int) * R);
	seen = xmalloc(sizeof(int) * R), fill = xmalloc(sizeof(int) * R);
	if (me == 0)
		printf("# a2a_mpi: %d ranks, hidden %d, experts %d, topk %d, bf16, uniform routing, seed %llu, %d iterations after %d\n"
		       "# time_us: median over iterations of the maximum over ranks\n"
		       "%8s %8s %5s %14s %22s %10s %7s\n",
		       R, H, E, K, (unsigned long long)seed, iters, warmup, "tokens", "hidden", "topk", "dispatch_us", "dispatch_permute_us", "recv_rows", "#wrong");
	long total_wrong = 0;
	for (int c = 0; c < nsizes; c++) {
		T = sizes[c];
		x = xmalloc((size_t)T * rb);
		idx = xmalloc(sizeof(int32_t) * T * K);
		wts = xmalloc(sizeof(float) * T * K);
		routing(seed, me, T, K, E, idx);
		for (int t = 0; t < T; t++) {
			xrow((uint16_t *)(x + t * rb), H, me, t);
			for (int q = 0; q < K; q++)
				wts[t * K + q] = weight(me, t, q);
		}
		double td = timed(op_dispatch, warmup, iters);
		double tdp = timed(op_dispatch_permute, warmup, iters);
		if (corrupt && me == R - 1 && N > 0)
			rbuf[rowoff[N - 1]] ^= 1;
		long wrong = check(), all = 0;
		CHECK_MPI(MPI_Allreduce(&wrong, &all, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD));
		int nrows = N, sum = 0;
		CHECK_MPI(MPI_Allreduce(&nrows, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD));
		if (me == 0)
			printf("%8d %8d %5d %14.1f %22.1f %10d %7ld\n", T, H, K, td, tdp, sum, all);
		if (counts) {
			for (int r = 0; r < R; r++) {
				if (r == me) {
					printf("# rank %d tokens %d recv %d permuted %d\n", me, T, N, P);
					fflush(stdout);
				}
				CHECK_MPI(MPI_Barrier(MPI_COMM_WORLD));
			}
		}
		fflush(stdout);
		total_wrong += all;
		free(x);
		free(idx);
		free(wts);
	}
	if (me == 0)
		printf("# check: %s\n", total_wrong ? "FAILED" : "OK, every row of every rank as expected");
	MPI_Finalize();
	return total_wrong ? 1 : 0;
}
