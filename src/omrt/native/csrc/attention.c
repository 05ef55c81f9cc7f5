/* Attention, one (batch, head) per item on the native workers: the scores Q K^T, scaled, plus the
 * mask, their softmax and its product by V, the scores staying in the workspace (in cache between
 * the three steps) where the unfused graph wrote the scores, read them for the softmax, wrote the
 * probabilities and read them again.
 *
 * Two ways: through BLAS, each item's scores S x T in its own slice of the workspace; or on
 * omrt's GEMM tile (omrt_gemm.h), the scores transposed, T x S, so that both products read their
 * operands where the tile wants them: K^T's columns are a panel's rows, Q^T (both copied) the
 * strips, and the probabilities transposed are the panels of the product by V, whose rows are its
 * strips. The softmax then runs down columns, a query per vector lane, and its normalization
 * scales Y's rows. Each thread works in a slot of its own (attention_slot). A MiniLM-style
 * encoder's attention (12 heads of 32, 128 tokens) on an Intel Xeon took 0.87-0.92 of the time
 * through BLAS at one thread and 0.78-0.82 at two with AVX-512, 0.86-0.91 and 0.73-0.78 with
 * AVX2. */
#include "omrt_gemm.h"
#include "omrt_math.h"

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-trapping-math")
#endif

typedef struct {
    const float *q, *k, *v, *mask;
    float *y, *scores;
    int64_t H, G, S, T, D, DV;
    int64_t qb, qh, qs, kb, kh, kt, vb, vh, vt, yb, yh, ys, mb, mh, ms;
    float scale;
    int64_t SP, TP, slot; /* the tile path's padded queries and keys, and floats per slot */
} attention_job;

/* Reductions go in REDUCE_LANES partial results, so that they vectorize as the maps do: 8, a
 * vector of AVX2 (16 ran AVX2's clone 1.6 times as long: GCC splits wider vectors badly). */
#define REDUCE_LANES 8

/* REDUCE_LANES floats (loaded from anywhere a float may lie) and a mask over them. */
typedef float reduce_vec __attribute__((vector_size(REDUCE_LANES * sizeof(float)), aligned(4)));
typedef int32_t reduce_mask __attribute__((vector_size(REDUCE_LANES * sizeof(int32_t))));

/* The largest of a row's T floats, NaNs passed over (-inf for none). The maxima are kept in
 * vectors by a compare and select, then halved in a tree: GCC leaves the scalar form
 * (a > b ? a : b) a chain of scalar maxima. A MiniLM-style encoder's attention on an Intel Xeon
 * took 0.81-0.89 of the time with AVX-512 at one thread, 0.84-0.87 at two, even with AVX2 (this
 * and the tree of sums). */
static OMRT_INLINE float row_max(const float *row, int64_t T) {
    reduce_vec lanes = (reduce_vec){0} - INFINITY;
    int64_t t = 0;
    for (; t + REDUCE_LANES <= T; t += REDUCE_LANES) {
        const reduce_vec x = *(const reduce_vec *)(row + t);
        const reduce_mask more = x > lanes;
        lanes = (reduce_vec)((more & (reduce_mask)x) | (~more & (reduce_mask)lanes));
    }
    for (; t < T; t++) lanes[0] = row[t] > lanes[0] ? row[t] : lanes[0];
    for (int64_t w = REDUCE_LANES / 2; w > 0; w /= 2)
        for (int64_t l = 0; l < w; l++) lanes[l] = lanes[l + w] > lanes[l] ? lanes[l + w] : lanes[l];
    return lanes[0];
}

/* The sum of a row's T floats: REDUCE_LANES partial sums, added in a tree. */
static OMRT_INLINE float row_sum(const float *row, int64_t T) {
    reduce_vec lanes = {0};
    int64_t t = 0;
    for (; t + REDUCE_LANES <= T; t += REDUCE_LANES) lanes += *(const reduce_vec *)(row + t);
    for (; t < T; t++) lanes[0] += row[t];
    for (int64_t w = REDUCE_LANES / 2; w > 0; w /= 2)
        for (int64_t l = 0; l < w; l++) lanes[l] += lanes[l + w];
    return lanes[0];
}

/* A row of scores (T floats) -> softmax(row * scale + mask) in place. A row whose every score is
 * -inf (fully masked) becomes zeros, as ONNX asks; a NaN makes the row NaN, as in numpy. */
static OMRT_INLINE void softmax_row(float *row, const float *mask, int64_t T, float scale) {
    if (mask)
        for (int64_t t = 0; t < T; t++) row[t] = row[t] * scale + mask[t];
    else
        for (int64_t t = 0; t < T; t++) row[t] *= scale;
    const float top = row_max(row, T);
    if (top == -INFINITY) {
        memset(row, 0, (size_t)T * sizeof(float));
        return;
    }
    for (int64_t t = 0; t < T; t++) row[t] = omrt_fx_exp(row[t] - top);
    const float inv = 1.0f / row_sum(row, T);
    for (int64_t t = 0; t < T; t++) row[t] *= inv;
}

/* Queries padded for the tile path: the strips of Q^T are read whole (OMRT_MAX_NR columns) and the
 * probabilities' panels OMRT_PANEL at a time. */
static inline int64_t padded_queries(int64_t S) {
    const int64_t strips = (S + OMRT_MAX_NR - 1) / OMRT_MAX_NR * OMRT_MAX_NR;
    const int64_t panels = (S + OMRT_PANEL - 1) / OMRT_PANEL * OMRT_PANEL;
    return strips > panels ? strips : panels;
}

/* Keys padded for the tile path: K^T's columns are read as panels, OMRT_PANEL at a time. */
static inline int64_t padded_keys(int64_t T) { return (T + OMRT_PANEL - 1) / OMRT_PANEL * OMRT_PANEL; }

/* dst (n x rows, pitch ld, a multiple of 4) = src (rows x n, pitch sp) transposed, 4 x 4 blocks
 * at a time; zero in columns [rows, ld), which the tile reads for rows or columns it does not
 * store: zeros keep those sums free of stray NaNs and denormals. */
static OMRT_INLINE void transpose_padded(const float *src, int64_t sp, int64_t rows, int64_t n, float *dst,
                                         int64_t ld) {
    for (int64_t r = 0; r < rows; r += 4) {
        const int live = rows - r < 4 ? (int)(rows - r) : 4;
        const float *quad[4];
        for (int i = 0; i < 4; i++) quad[i] = i < live ? src + (r + i) * sp : NULL;
        int64_t d = 0;
        for (; d + 4 <= n; d += 4) omrt_pack_quad(quad, live, d, dst + d * ld + r, ld);
        for (; d < n; d++)
            for (int i = 0; i < 4; i++) dst[d * ld + r + i] = i < live ? quad[i][d] : 0.0f;
    }
    const int64_t done = (rows + 3) / 4 * 4;
    for (int64_t d = 0; d < n; d++) memset(dst + d * ld + done, 0, (size_t)(ld - done) * sizeof(float));
}

/* c (M x N, pitch ldc) = a (panel-like: element [r, k] at a[k * lda + r], rows up to the tile's
 * past M readable) times b (K x N, pitch bks, whole strips readable past N), on the tile. */
static void tile_product(const float *a, int64_t lda, const float *b, int64_t bks, float *c, int64_t ldc, int64_t M,
                         int64_t N, int64_t K) {
    const omrt_gemm_kind kind = omrt_gemm_pick();
    const omrt_epilogue plain = {NULL, NULL, OMRT_ACT_NONE, 0.0f, 0.0f, NULL};
    for (int64_t m = 0, rows; m < M; m += rows) {
        rows = omrt_step_rows(&kind, M - m);
        for (int64_t n = 0; n < N; n += kind.nr)
            kind.tile(K, a + m, lda, b + n, bks, c + m * ldc + n, ldc, rows, N - n < kind.nr ? N - n : kind.nr,
                      &plain);
    }
}

/* The softmax of each of the S columns of st (T x S, pitch SP) times `scale`, plus the mask (mask[i,
 * t] at mask[i * ms + t]), left unnormalized, zeros past column S: inv[i] gets what column i's
 * exponentials are to be multiplied by (0 for a column of -inf, which becomes zeros; a NaN makes
 * the column NaN). `top` holds S floats of scratch. */
static OMRT_INLINE void softmax_columns(float *st, int64_t T, int64_t S, int64_t SP, float scale, const float *mask,
                                        int64_t ms, float *top, float *inv) {
    for (int64_t i = 0; i < S; i++) top[i] = -INFINITY;
    for (int64_t t = 0; t < T; t++) {
        float *row = st + t * SP;
        if (mask && ms) {
            for (int64_t i = 0; i < S; i++) row[i] = row[i] * scale + mask[i * ms + t];
            for (int64_t i = 0; i < S; i++) top[i] = row[i] > top[i] ? row[i] : top[i];
            continue;
        }
        const float add = mask ? mask[t] : 0.0f; /* a mask over the keys alone: one per row */
        for (int64_t i = 0; i < S; i++) {
            const float x = row[i] * scale + add;
            row[i] = x;
            top[i] = x > top[i] ? x : top[i];
        }
    }
    for (int64_t i = 0; i < S; i++) {
        top[i] = top[i] == -INFINITY ? 0.0f : top[i];
        inv[i] = 0.0f;
    }
    for (int64_t t = 0; t < T; t++) {
        float *row = st + t * SP;
        for (int64_t i = 0; i < S; i++) {
            row[i] = omrt_fx_exp(row[i] - top[i]);
            inv[i] += row[i];
        }
        memset(row + S, 0, (size_t)(SP - S) * sizeof(float)); /* read, not stored, by P V's last panel */
    }
    for (int64_t i = 0; i < S; i++) inv[i] = inv[i] == 0.0f ? 0.0f : 1.0f / inv[i];
}

/* One (batch, head) on the tile, in slot `work` (attention_slot floats): Q^T and K^T copied
 * (padded with zeros), the scores transposed st = K Q^T, their softmax down columns, then
 * Y = P V with P^T = st read as panels, each row of Y scaled by its column's normalization. */
static OMRT_INLINE void attention_tiles(const attention_job *j, const float *q, const float *k, const float *v,
                                        const float *mask, float *y, float *work) {
    const int64_t S = j->S, T = j->T, D = j->D, SP = j->SP, TP = j->TP;
    float *qt = work, *kt = qt + D * SP, *st = kt + D * TP, *top = st + T * SP, *inv = top + SP;
    transpose_padded(q, j->qs, S, D, qt, SP);
    transpose_padded(k, j->kt, T, D, kt, TP);
    tile_product(kt, TP, qt, SP, st, SP, T, S, D);
    softmax_columns(st, T, S, SP, j->scale, mask, j->ms, top, inv);
    tile_product(st, SP, v, j->vt, y, j->ys, S, j->DV, T);
    for (int64_t i = 0; i < S; i++)
        for (int64_t e = 0; e < j->DV; e++) y[i * j->ys + e] *= inv[i];
}

/* Floats of one thread's slot on the tile path: Q^T (D x SP), K^T (D x TP, TP keys padded to
 * panels), the scores transposed (T x SP) and two rows of SP. */
static inline int64_t attention_slot(int64_t S, int64_t T, int64_t D) {
    return D * (padded_queries(S) + padded_keys(T)) + T * padded_queries(S) + 2 * padded_queries(S);
}

static OMRT_HOT void attention_part(void *p, int64_t item, int64_t thread) {
    const attention_job *j = p;
    const int64_t b = item / j->H, h = item % j->H, kv = h / j->G;
    const float *q = j->q + b * j->qb + h * j->qh;
    const float *k = j->k + b * j->kb + kv * j->kh, *v = j->v + b * j->vb + kv * j->vh;
    const float *mask = j->mask ? j->mask + b * j->mb + h * j->mh : NULL;
    float *y = j->y + b * j->yb + h * j->yh;
    if (j->slot) {
        attention_tiles(j, q, k, v, mask, y, j->scores + thread * j->slot);
        return;
    }
    float *s = j->scores + item * j->S * j->T;
    omrt_sgemm_t(0, 1, j->S, j->T, j->D, q, j->qs, k, j->kt, s, j->T);
    for (int64_t r = 0; r < j->S; r++) softmax_row(s + r * j->T, mask ? mask + r * j->ms : NULL, j->T, j->scale);
    omrt_sgemm_t(0, 0, j->S, j->DV, j->T, s, j->T, v, j->vt, y, j->ys);
}

/* y[b, h] (S x DV, rows ys apart) = softmax(q[b, h] k[b, h / G]^T * scale + mask[b, h]) v[b, h / G]
 * for B batches of H query heads, G of them per key/value head (grouped-query attention). Each
 * matrix's rows are contiguous, `*s` floats apart; its first element is `*b` floats from the
 * previous batch's and `*h` from the previous head's (Q, Y: [B, S, H * D] or [B, H, S, D] alike).
 * mask (NULL: none) is added to the scaled scores, T floats per row, with strides mb, mh, ms (0
 * where it broadcasts). With `tiles` (DV a multiple of 16: the tile reads V's rows 16 floats at a
 * time), on omrt's GEMM tile, `scores` holding a slot of attention_slot(S, T, D) floats for each
 * of `threads` threads; else through BLAS, `scores` holding B * H * S * T floats, one block per
 * item. */
OMRT_EXPORT void omrt_attention_f32(const float *q, const float *k, const float *v, const float *mask, float *y,
                                    float *scores, int64_t B, int64_t H, int64_t G, int64_t S, int64_t T, int64_t D,
                                    int64_t DV, int64_t qb, int64_t qh, int64_t qs, int64_t kb, int64_t kh,
                                    int64_t kt, int64_t vb, int64_t vh, int64_t vt, int64_t yb, int64_t yh,
                                    int64_t ys, int64_t mb, int64_t mh, int64_t ms, float scale, int64_t tiles,
                                    int64_t threads) {
    attention_job j = {q, k, v, mask, y, scores, H, G, S, T, D, DV, qb, qh, qs, kb, kh, kt,
                       vb, vh, vt, yb, yh, ys, mb, mh, ms, scale,
                       padded_queries(S), padded_keys(T), tiles ? attention_slot(S, T, D) : 0};
    omrt_parallel(attention_part, &j, B * H, threads);
}
