/* Matrix products (MatMul, FusedMatMul, Gemm): A @ B, plus a bias over the columns and the fused
 * activation, split in blocks of the output over the native workers, each block one BLAS call;
 * and products by weights packed at compile time, through omrt's own GEMM (omrt_gemm.h). */
#include "omrt_gemm.h"

typedef struct {
    const float *a, *b, *bias;
    float *c;
    int64_t M, N, K, lda, ldb, ldc, ta, tb, sa, sb, sc, rparts, cparts, act;
    float alpha, beta;
} mm_job;

/* Block `item` (matrix, row part, column part); column parts start on 16-float boundaries. */
static void mm_part(void *p, int64_t item, int64_t thread) {
    const mm_job *j = p;
    (void)thread;
    const int64_t cp = item % j->cparts, rp = item / j->cparts % j->rparts, m = item / j->cparts / j->rparts;
    const int64_t r0 = omrt_part(j->M, j->rparts, rp), r1 = omrt_part(j->M, j->rparts, rp + 1);
    const int64_t c0 = omrt_part(j->N, j->cparts, cp) & ~(int64_t)15;
    const int64_t c1 = cp + 1 == j->cparts ? j->N : omrt_part(j->N, j->cparts, cp + 1) & ~(int64_t)15;
    if (r1 <= r0 || c1 <= c0) return;
    const float *a = j->a + m * j->sa + (j->ta ? r0 : r0 * j->lda);
    const float *b = j->b + m * j->sb + (j->tb ? c0 * j->ldb : c0);
    float *c = j->c + m * j->sc + r0 * j->ldc + c0;
    if (j->M == 1)
        /* a row times B: B's columns (its rows as stored when tb) times the row, by gemv, which
         * reads B once where gemm would first pack it */
        omrt_sgemv(!j->tb, j->tb ? c1 - c0 : j->K, j->tb ? j->K : c1 - c0, b, j->ldb, a, j->ta ? j->lda : 1, c, 1);
    else if (j->N == 1)
        omrt_sgemv(j->ta, j->ta ? j->K : r1 - r0, j->ta ? r1 - r0 : j->K, a, j->lda, b, j->tb ? 1 : j->ldb, c,
                   j->ldc);
    else
        omrt_sgemm_t(j->ta, j->tb, r1 - r0, c1 - c0, j->K, a, j->lda, b, j->ldb, c, j->ldc);
    for (int64_t r = 0; r < r1 - r0; r++) {
        float *row = c + r * j->ldc;
        if (j->bias)
            for (int64_t i = 0; i < c1 - c0; i++) row[i] += j->bias[c0 + i];
        omrt_activate(row, c1 - c0, j->act, j->alpha, j->beta);
    }
}

/* c[m] (M x N, pitch ldc) = a[m] (M x K) @ b[m] (K x N) + bias (N floats, when not NULL), then
 * the activation, for each of `batch` matrices m, `sa`, `sb` and `sc` floats apart (0: the same
 * matrix for all). a is stored transposed when ta (K x M, pitch lda), b when tb (N x K). */
OMRT_EXPORT void omrt_matmul_f32(const float *a, const float *b, const float *bias, float *c, int64_t batch,
                                 int64_t M, int64_t N, int64_t K, int64_t lda, int64_t ldb, int64_t ldc, int64_t ta,
                                 int64_t tb, int64_t sa, int64_t sb, int64_t sc, int64_t threads, int64_t act,
                                 float alpha, float beta) {
    mm_job j = {.a = a, .b = b, .bias = bias, .c = c, .M = M, .N = N, .K = K, .lda = lda, .ldb = ldb, .ldc = ldc,
                .ta = ta, .tb = tb, .sa = sa, .sb = sb, .sc = sc, .rparts = 1, .cparts = 1, .act = act,
                .alpha = alpha, .beta = beta};
    const int64_t parts = omrt_parts_per(batch, threads);
    if (M >= N)
        j.rparts = parts < M ? parts : M;
    else
        j.cparts = parts < N / 16 ? parts : (N / 16 > 1 ? N / 16 : 1);
    omrt_parallel(mm_part, &j, batch * j.rparts * j.cparts, threads);
}

/* omrt_pmatmul_f32's work: A copied into row panels, then one tile per (strip, panel). A thread's
 * next strip is `ahead` strips on from its current one. */
typedef struct {
    const float *a, *strips, *bias;
    float *c, *panels;
    int64_t M, N, K, lda, ldc, P, part_cols, part_stride, act, ahead;
    float alpha, beta;
} pmm_job;

static void pack_part(void *p, int64_t item, int64_t thread) {
    const pmm_job *j = p;
    (void)thread;
    omrt_pack_rows(j->a, j->lda, j->M, j->K, item * OMRT_PANEL, j->panels + item * j->K * OMRT_PANEL);
}

/* The panel-th of P pieces of strip s, for a tile narrower than a strip (AVX2), which reads a
 * strip in passes over half its lines: each item asks for a piece of the strip the thread does
 * next (see omrt_fetch), so that weights coming from memory arrive ahead of it. In a MiniLM-style
 * encoder on an Intel Xeon with AVX-512 hidden, its products took 0.92-0.98 of the time; with the
 * AVX-512 tile, which reads each strip whole, alone in a C loop asking took 1.03-1.04 of it. The
 * piece spread across the tiles (omrt_strip_tile) rather than asked for at once: its feed-forward
 * products 0.92-0.95 of the time (AMD Zen 4, AVX-512 hidden). */
static omrt_fetch strip_piece(const pmm_job *j, int64_t s, int64_t panel) {
    if (s >= (j->N + OMRT_MAX_NR - 1) / OMRT_MAX_NR || omrt_gemm_pick().nr == OMRT_MAX_NR) return omrt_no_fetch;
    return omrt_fetch_part(omrt_fetch_floats(j->strips + s * j->K * OMRT_MAX_NR, j->K * OMRT_MAX_NR), panel, j->P);
}

/* Tile (strip s, panel): the tile writes column n at c + n, so c is shifted for part p's columns
 * to land at its own start. */
static void strip_tile(const pmm_job *j, int64_t s, int64_t panel) {
    const int64_t part = s * OMRT_MAX_NR / j->part_cols;
    omrt_epilogue e = {NULL, j->bias, j->act, j->alpha, j->beta, NULL};
    float *c = j->c + part * (j->part_stride - j->part_cols);
    omrt_strip_tile(j->panels + panel * j->K * OMRT_PANEL, j->strips, s, j->K, j->M, j->N, panel * OMRT_PANEL, c,
                    j->ldc, &e, strip_piece(j, s + j->ahead, panel));
}

/* Item (strip, panel), panels fastest: a thread's next item mostly reads the strip it just did. */
static void strip_part(void *p, int64_t item, int64_t thread) {
    const pmm_job *j = p;
    (void)thread;
    strip_tile(j, item / j->P, item % j->P);
}

/* Item: one strip over every panel, so that each thread reads only its own strips of weights. */
static void whole_strip_part(void *p, int64_t item, int64_t thread) {
    const pmm_job *j = p;
    (void)thread;
    for (int64_t panel = 0; panel < j->P; panel++) strip_tile(j, item, panel);
}

/* Whether threads take whole strips: when there are enough of them to share out evenly, and A's
 * panels stay in L2 for each thread to read again for each of its strips. Split by panels
 * instead, every thread reads every strip: a MiniLM-style encoder's products (128 tokens, weights
 * out of cache) on an Intel Xeon at two threads took 0.93 of the time with AVX-512 and 0.98 with
 * AVX2 taking whole strips. */
static int takes_whole_strips(const pmm_job *j, int64_t nstrips, int64_t threads) {
    return threads > 1 && nstrips >= 4 * threads && j->P * OMRT_PANEL * j->K <= omrt_b_in_l2();
}

/* c (M x N, pitch ldc) = a (M x K, pitch lda) @ B + bias (N floats, when not NULL), then the
 * activation, B (K x N) packed at compile time as strips of OMRT_MAX_NR columns (K x OMRT_MAX_NR
 * each, zero past column N; omrt.kernels.packed.pack_strips); a is first copied into `panels`
 * (OMRT_PANEL rows per panel), on `threads` threads. The columns go in parts of `part_cols` (N
 * itself, or a multiple of OMRT_MAX_NR), part p's M x part_cols block `part_stride` floats after
 * part p - 1's: sibling products of one A (attention's Q, K and V) as one product, each result
 * a matrix of its own. */
OMRT_EXPORT void omrt_pmatmul_f32(const float *a, const float *strips, const float *bias, float *c, float *panels,
                                  int64_t M, int64_t N, int64_t K, int64_t lda, int64_t ldc, int64_t part_cols,
                                  int64_t part_stride, int64_t threads, int64_t act, float alpha, float beta) {
    pmm_job j = {.a = a, .strips = strips, .bias = bias, .c = c, .panels = panels, .M = M, .N = N, .K = K,
                 .lda = lda, .ldc = ldc, .P = (M + OMRT_PANEL - 1) / OMRT_PANEL, .part_cols = part_cols,
                 .part_stride = part_stride, .act = act, .alpha = alpha, .beta = beta};
    omrt_parallel(pack_part, &j, j.P, threads);
    const int64_t nstrips = (N + OMRT_MAX_NR - 1) / OMRT_MAX_NR;
    if (takes_whole_strips(&j, nstrips, threads)) {
        j.ahead = threads;
        omrt_parallel(whole_strip_part, &j, nstrips, threads);
    } else {
        j.ahead = 1;
        omrt_parallel(strip_part, &j, j.P * nstrips, threads);
    }
}
