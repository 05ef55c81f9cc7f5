/* Attention, one (batch, head) per item on the native workers: the scores Q K^T, scaled, plus the
 * mask, their softmax and its product by V, the scores staying in the item's own slice of the
 * workspace (S x T floats, in cache between the three steps) where the unfused graph wrote the
 * scores, read them for the softmax, wrote the probabilities and read them again. */
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

static OMRT_HOT void attention_part(void *p, int64_t item, int64_t thread) {
    const attention_job *j = p;
    (void)thread;
    const int64_t b = item / j->H, h = item % j->H, kv = h / j->G;
    const float *q = j->q + b * j->qb + h * j->qh;
    const float *k = j->k + b * j->kb + kv * j->kh, *v = j->v + b * j->vb + kv * j->vh;
    float *s = j->scores + item * j->S * j->T;
    omrt_sgemm_t(0, 1, j->S, j->T, j->D, q, j->qs, k, j->kt, s, j->T);
    for (int64_t r = 0; r < j->S; r++)
        softmax_row(s + r * j->T, j->mask ? j->mask + b * j->mb + h * j->mh + r * j->ms : NULL, j->T, j->scale);
    omrt_sgemm_t(0, 0, j->S, j->DV, j->T, s, j->T, v, j->vt, j->y + b * j->yb + h * j->yh, j->ys);
}

/* y[b, h] (S x DV, rows ys apart) = softmax(q[b, h] k[b, h / G]^T * scale + mask[b, h]) v[b, h / G]
 * for B batches of H query heads, G of them per key/value head (grouped-query attention). Each
 * matrix's rows are contiguous, `*s` floats apart; its first element is `*b` floats from the
 * previous batch's and `*h` from the previous head's (Q, Y: [B, S, H * D] or [B, H, S, D] alike).
 * mask (NULL: none) is added to the scaled scores, T floats per row, with strides mb, mh, ms (0
 * where it broadcasts). `scores` holds B * H * S * T floats, one block per item. */
OMRT_EXPORT void omrt_attention_f32(const float *q, const float *k, const float *v, const float *mask, float *y,
                                    float *scores, int64_t B, int64_t H, int64_t G, int64_t S, int64_t T, int64_t D,
                                    int64_t DV, int64_t qb, int64_t qh, int64_t qs, int64_t kb, int64_t kh,
                                    int64_t kt, int64_t vb, int64_t vh, int64_t vt, int64_t yb, int64_t yh,
                                    int64_t ys, int64_t mb, int64_t mh, int64_t ms, float scale, int64_t threads) {
    attention_job j = {q, k, v, mask, y, scores, H, G, S, T, D, DV, qb, qh, qs, kb, kh, kt,
                       vb, vh, vt, yb, yh, ys, mb, mh, ms, scale};
    omrt_parallel(attention_part, &j, B * H, threads);
}
