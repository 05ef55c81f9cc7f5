/* omrt's own GEMM for products whose left operand is weights packed at compile time.
 *
 * The weights (M x K, row-major) are stored in panels of OMRT_PANEL rows: panel i holds rows
 * [12 i, 12 i + 12) as K groups of 12 floats (row r of the panel at k is panel[12 k + r]), zero
 * rows past M (omrt.kernels.packed.pack_panels writes them). The right operand is copied per
 * call, NR columns at a time, into a K x NR strip of scratch, and a register-blocked tile
 * multiplies a panel by the strip with the bias and activation applied before its one store.
 *
 * The tile is chosen once per process by the CPU's features: 12 x 32 with AVX-512 (24 zmm
 * accumulators), 6 x 16 with AVX2 and FMA (12 ymm; it reads a 12-row panel as two 6-row halves),
 * and plain C loops elsewhere. Every load and store of a partial strip or panel is masked or
 * bounded: nothing outside the arrays given is touched.
 */
#ifndef OMRT_GEMM_H
#define OMRT_GEMM_H

#include <stdlib.h>
#include <unistd.h>

#include "omrt_native.h"

#define OMRT_PANEL 12
#define OMRT_MAX_NR 32

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define OMRT_X86 1
#endif

/* How far ahead, in steps of k, the AVX-512 tile asks for its operands: the panel of weights streams
 * from memory on a layer's first pass over it (3 cache lines every 4 steps), the strip from L2. On
 * 7x7 and 14x14 layers whose weights were not in cache, the two together took 0.75-0.9 of the
 * time; the distances themselves (8 to 256 steps) made no difference. The AVX2 tile, forced on
 * the same host, ran 0.95-1.3 of its time with them: its 12 FMAs a step leave less room. */
#define OMRT_AHEAD_A 64
#define OMRT_AHEAD_B 16

/* Ask for step k's operands ahead in the AVX-512 tile, which reads the panel `a` (12 floats a
 * step, lda apart) and the strip `b` (32 floats a step, pitch bks), K steps: only cache lines of
 * the operands. Always inlined: GCC counts a prefetch as no effect, so a call left out of line is
 * dropped. */
static OMRT_INLINE void omrt_prefetch_ahead(const float *a, int64_t lda, const float *b, int64_t bks, int64_t k,
                                            int64_t K) {
    if (k + OMRT_AHEAD_B < K) {
        __builtin_prefetch(b + bks * (k + OMRT_AHEAD_B));
        __builtin_prefetch(b + bks * (k + OMRT_AHEAD_B) + 16);
    }
    if ((k & 3) == 0 && k + OMRT_AHEAD_A + 4 <= K) {
        const float *ahead = a + (k + OMRT_AHEAD_A) * lda;
        __builtin_prefetch(ahead);
        __builtin_prefetch(ahead + 16);
        __builtin_prefetch(ahead + 32);
    }
}

typedef struct {
    const float *bias;     /* per row of the output (NULL: none) */
    const float *col_bias; /* per column of the output (NULL: none) */
    int64_t act;
    float alpha, beta;
    const float *residual; /* laid out as the tile's output, same pitch, added before the activation */
} omrt_epilogue;

/* Cache lines a tile asks for into L2 while it runs (`lines` lines from `at`; none when 0): its
 * share of the weights the tiles after it read, so that weights streaming from memory arrive
 * ahead of the tile that reads them. */
typedef struct {
    const void *at;
    int64_t lines;
} omrt_fetch;

static const omrt_fetch omrt_no_fetch = {NULL, 0};

/* The cache lines of the `floats` floats at w (the last, partial one left out). */
static inline omrt_fetch omrt_fetch_floats(const float *w, int64_t floats) {
    return (omrt_fetch){w, floats * (int64_t)sizeof(float) / 64};
}

/* Part `part` of `parts` of f's lines (none of none, without a division). */
static inline omrt_fetch omrt_fetch_part(omrt_fetch f, int64_t part, int64_t parts) {
    if (f.lines <= 0) return omrt_no_fetch;
    const int64_t first = f.lines * part / parts;
    return (omrt_fetch){(const char *)f.at + 64 * first, f.lines * (part + 1) / parts - first};
}

/* Ask for all of f's lines now. Always inlined: GCC counts a prefetch as no effect, so a call left
 * out of line is dropped. */
static OMRT_INLINE void omrt_fetch_now(omrt_fetch f) {
    for (int64_t line = 0; line < f.lines; line++) __builtin_prefetch((const char *)f.at + 64 * line, 0, 2);
}

static inline float omrt_act1(float v, const omrt_epilogue *e) {
    switch (e->act) {
    case OMRT_ACT_RELU: return v > 0.0f ? v : 0.0f;
    case OMRT_ACT_LEAKY: return v < 0.0f ? v * e->alpha : v;
    case OMRT_ACT_CLIP: return v < e->alpha ? e->alpha : (v > e->beta ? e->beta : v);
    case OMRT_ACT_HARD_SIGMOID: return omrt_hard_sigmoid(v, e->alpha, e->beta);
    default: return v;
    }
}

/* c[f, r] = the epilogue of sums[r, f] (OMRT_MAX_NR floats per row r) for filters f < filters and
 * columns r < cols; bias and residual as a tile's (bias[f], residual laid out as c; no col_bias). */
static inline void omrt_store_transposed(const float *sums, int64_t filters, int64_t cols, float *c, int64_t ldc,
                                         const omrt_epilogue *e) {
    for (int64_t f = 0; f < filters; f++)
        for (int64_t r = 0; r < cols; r++)
            c[f * ldc + r] = omrt_act1(sums[r * OMRT_MAX_NR + f] + (e->bias ? e->bias[f] : 0.0f) +
                                           (e->residual ? e->residual[f * ldc + r] : 0.0f), e);
}

/* c rows [0, rows), columns [0, cols) (pitch ldc) = a (rows of a panel from `a`, lda floats apart
 * per k: OMRT_PANEL, or the pitch of columns read in place) times strip b (K rows of the tile's
 * width, `bks` floats apart), then the epilogue; the plain C tile, 16 columns wide. */
static inline void omrt_tile_c(int64_t K, const float *a, int64_t lda, const float *b, int64_t bks, float *c,
                               int64_t ldc, int64_t rows, int64_t cols, const omrt_epilogue *e) {
    for (int64_t r = 0; r < rows; r++) {
        float acc[16] = {0};
        for (int64_t k = 0; k < K; k++) {
            float av = a[k * lda + r];
            for (int64_t j = 0; j < 16; j++) acc[j] += av * b[k * bks + j];
        }
        float add = e->bias ? e->bias[r] : 0.0f;
        for (int64_t j = 0; j < cols; j++)
            c[r * ldc + j] = omrt_act1(acc[j] + add + (e->col_bias ? e->col_bias[j] : 0.0f) +
                                           (e->residual ? e->residual[r * ldc + j] : 0.0f), e);
    }
}

#ifdef OMRT_X86
#define OMRT_AVX512 __attribute__((target("avx512f,fma")))
#define OMRT_AVX2 __attribute__((target("avx2,fma")))

OMRT_AVX512 static inline __m512 omrt_act16(__m512 v, const omrt_epilogue *e) {
    switch (e->act) {
    case OMRT_ACT_RELU: return _mm512_max_ps(v, _mm512_setzero_ps());
    case OMRT_ACT_LEAKY: {
        __mmask16 neg = _mm512_cmp_ps_mask(v, _mm512_setzero_ps(), _CMP_LT_OQ);
        return _mm512_mask_mul_ps(v, neg, v, _mm512_set1_ps(e->alpha));
    }
    case OMRT_ACT_CLIP: return _mm512_min_ps(_mm512_max_ps(v, _mm512_set1_ps(e->alpha)), _mm512_set1_ps(e->beta));
    case OMRT_ACT_HARD_SIGMOID: {
        __m512 t = _mm512_fmadd_ps(v, _mm512_set1_ps(e->alpha), _mm512_set1_ps(e->beta));
        return _mm512_min_ps(_mm512_max_ps(t, _mm512_setzero_ps()), _mm512_set1_ps(1.0f));
    }
    default: return v;
    }
}

/* The AVX-512 tile's sums over K steps in acc: the first `prows` (4, 8 or 12) rows of the panel,
 * `halves` (1 or 2) vectors of 16 columns per row. Rows past prows stay zero. */
OMRT_AVX512 static OMRT_INLINE void omrt_sums_avx512(int64_t K, const float *a, int64_t lda, const float *b,
                                                     int64_t bks, __m512 acc[OMRT_PANEL][2], int halves, int prows) {
#pragma GCC unroll 12
    for (int r = 0; r < OMRT_PANEL; r++) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    for (int64_t k = 0; k < K; k++) {
        __m512 b0 = _mm512_loadu_ps(b + bks * k), b1 = halves > 1 ? _mm512_loadu_ps(b + bks * k + 16) : b0;
        const float *ak = a + k * lda;
        omrt_prefetch_ahead(a, lda, b, bks, k, K);
#pragma GCC unroll 12
        for (int r = 0; r < OMRT_PANEL; r++) {
            if (r >= prows) break;
            __m512 av = _mm512_set1_ps(ak[r]);
            acc[r][0] = _mm512_fmadd_ps(av, b0, acc[r][0]);
            if (halves > 1) acc[r][1] = _mm512_fmadd_ps(av, b1, acc[r][1]);
        }
    }
}

/* omrt_sums_avx512 for `rows` rows of the panel and `cols` columns, with the row and column counts
 * made constants: a product's last panel often holds only 4 or 8 rows (M = 16, 64, 128, 256), and
 * its last strip only 16 columns or fewer (14x14 and 13x13 layers: 4 and 9). */
OMRT_AVX512 static OMRT_INLINE void omrt_sums_fit_avx512(int64_t K, const float *a, int64_t lda, const float *b,
                                                         int64_t bks, __m512 acc[OMRT_PANEL][2], int64_t rows,
                                                         int64_t cols) {
    const int prows = rows <= 4 ? 4 : rows <= 8 ? 8 : 12;
    if (cols <= 16)
        prows == 4 ? omrt_sums_avx512(K, a, lda, b, bks, acc, 1, 4)
        : prows == 8 ? omrt_sums_avx512(K, a, lda, b, bks, acc, 1, 8)
                     : omrt_sums_avx512(K, a, lda, b, bks, acc, 1, 12);
    else
        prows == 4 ? omrt_sums_avx512(K, a, lda, b, bks, acc, 2, 4)
        : prows == 8 ? omrt_sums_avx512(K, a, lda, b, bks, acc, 2, 8)
                     : omrt_sums_avx512(K, a, lda, b, bks, acc, 2, 12);
}

/* The AVX-512 tile's epilogue: as omrt_finish_avx2, 12 rows and 32 columns at most. Plain products
 * (Winograd's, of as few as 16 steps) store the sums as they are. */
OMRT_AVX512 static OMRT_INLINE void omrt_finish_avx512(__m512 acc[OMRT_PANEL][2], float *c, int64_t ldc, int64_t rows,
                                                       int64_t cols, const omrt_epilogue *e, int64_t act) {
    const omrt_epilogue as = {e->bias, e->col_bias, act, e->alpha, e->beta, e->residual};
    const __mmask16 m0 = cols >= 16 ? 0xFFFF : (__mmask16)((1u << cols) - 1);
    const __mmask16 m1 = cols >= 32 ? 0xFFFF : cols <= 16 ? 0 : (__mmask16)((1u << (cols - 16)) - 1);
    __m512 col0 = _mm512_setzero_ps(), col1 = _mm512_setzero_ps();
    if (as.col_bias) {
        col0 = _mm512_maskz_loadu_ps(m0, as.col_bias);
        col1 = _mm512_maskz_loadu_ps(m1, as.col_bias + 16);
    }
#pragma GCC unroll 12
    for (int r = 0; r < OMRT_PANEL; r++) {
        if (r < rows) {
            __m512 v0 = acc[r][0], v1 = acc[r][1];
            if (as.bias) {
                const __m512 add = _mm512_set1_ps(as.bias[r]);
                v0 = _mm512_add_ps(v0, add);
                v1 = _mm512_add_ps(v1, add);
            }
            if (as.col_bias) {
                v0 = _mm512_add_ps(v0, col0);
                v1 = _mm512_add_ps(v1, col1);
            }
            if (as.residual) {
                v0 = _mm512_add_ps(v0, _mm512_maskz_loadu_ps(m0, as.residual + r * ldc));
                v1 = _mm512_add_ps(v1, _mm512_maskz_loadu_ps(m1, as.residual + r * ldc + 16));
            }
            _mm512_mask_storeu_ps(c + r * ldc, m0, omrt_act16(v0, &as));
            _mm512_mask_storeu_ps(c + r * ldc + 16, m1, omrt_act16(v1, &as));
        }
    }
}

/* The AVX-512 tile: 12 rows x 32 columns, accumulators in 24 registers, fewer for a partial panel
 * or strip. */
OMRT_AVX512 static inline void omrt_tile_avx512(int64_t K, const float *a, int64_t lda, const float *b, int64_t bks,
                                                float *c, int64_t ldc, int64_t rows, int64_t cols,
                                                const omrt_epilogue *e) {
    __m512 acc[OMRT_PANEL][2];
    omrt_sums_fit_avx512(K, a, lda, b, bks, acc, rows, cols);
    switch (e->act) {
    case OMRT_ACT_NONE: omrt_finish_avx512(acc, c, ldc, rows, cols, e, OMRT_ACT_NONE); break;
    case OMRT_ACT_RELU: omrt_finish_avx512(acc, c, ldc, rows, cols, e, OMRT_ACT_RELU); break;
    default: omrt_finish_avx512(acc, c, ldc, rows, cols, e, e->act); break;
    }
}

OMRT_AVX2 static inline __m256 omrt_act8(__m256 v, const omrt_epilogue *e) {
    switch (e->act) {
    case OMRT_ACT_RELU: return _mm256_max_ps(v, _mm256_setzero_ps());
    case OMRT_ACT_LEAKY: {
        __m256 neg = _mm256_cmp_ps(v, _mm256_setzero_ps(), _CMP_LT_OQ);
        return _mm256_blendv_ps(v, _mm256_mul_ps(v, _mm256_set1_ps(e->alpha)), neg);
    }
    case OMRT_ACT_CLIP: return _mm256_min_ps(_mm256_max_ps(v, _mm256_set1_ps(e->alpha)), _mm256_set1_ps(e->beta));
    case OMRT_ACT_HARD_SIGMOID: {
        __m256 t = _mm256_fmadd_ps(v, _mm256_set1_ps(e->alpha), _mm256_set1_ps(e->beta));
        return _mm256_min_ps(_mm256_max_ps(t, _mm256_setzero_ps()), _mm256_set1_ps(1.0f));
    }
    default: return v;
    }
}

/* A mask of the first n (0..8) lanes, for maskstore. */
OMRT_AVX2 static inline __m256i omrt_lanes8(int64_t n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* 8 floats at p, the lanes of `m` alone unless `whole` (a plain load: a masked one costs more,
 * many uops on AMD's cores); the lanes outside m read as 0. */
OMRT_AVX2 static inline __m256 omrt_load8(const float *p, __m256i m, int whole) {
    return whole ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, m);
}

OMRT_AVX2 static inline void omrt_store8(float *p, __m256i m, int whole, __m256 v) {
    if (whole)
        _mm256_storeu_ps(p, v);
    else
        _mm256_maskstore_ps(p, m, v);
}

/* The AVX2 tile: 6 rows x 16 columns, accumulators in 12 registers. */
/* Steps [k0, k1) of the AVX2 tile's sums into acc, for the first `prows` rows. */
OMRT_AVX2 static OMRT_INLINE void omrt_steps_avx2(const float *a, int64_t lda, const float *b, int64_t bks,
                                                  int64_t k0, int64_t k1, __m256 acc[6][2], int prows) {
    for (int64_t k = k0; k < k1; k++) {
        __m256 b0 = _mm256_loadu_ps(b + bks * k), b1 = _mm256_loadu_ps(b + bks * k + 8);
        const float *ak = a + k * lda;
#pragma GCC unroll 6
        for (int r = 0; r < 6; r++) {
            if (r >= prows) break;
            __m256 av = _mm256_broadcast_ss(ak + r);
            acc[r][0] = _mm256_fmadd_ps(av, b0, acc[r][0]);
            acc[r][1] = _mm256_fmadd_ps(av, b1, acc[r][1]);
        }
    }
}

/* The AVX2 tile's epilogue: the sums in acc plus e's bias, column bias and residual, then the
 * activation `act` (a constant where omrt_tile_of_avx2 calls it, so that no row asks which), into
 * `rows` rows and `cols` columns of c. e's fields are copied into `as` before the first store:
 * read again after every row's stores (which may alias them, for all the compiler knows), with
 * the activation chosen per row, 64 filters of 64 taps over 56x56 with bias and Relu took
 * 1.02-1.04 times as long with either tile (AMD Zen 4, one thread, a C loop). The epilogue now
 * costs 3-5% of that product's time with this tile (5-7% before), none measurable with AVX-512's. */
OMRT_AVX2 static OMRT_INLINE void omrt_finish_avx2(__m256 acc[6][2], float *c, int64_t ldc, int64_t rows, int64_t cols,
                                                   const omrt_epilogue *e, int64_t act) {
    const omrt_epilogue as = {e->bias, e->col_bias, act, e->alpha, e->beta, e->residual};
    const int whole = cols >= 16;
    const __m256i m0 = omrt_lanes8(cols > 8 ? 8 : cols), m1 = omrt_lanes8(cols > 16 ? 8 : cols > 8 ? cols - 8 : 0);
    __m256 col0 = _mm256_setzero_ps(), col1 = _mm256_setzero_ps();
    if (as.col_bias) {
        col0 = omrt_load8(as.col_bias, m0, whole);
        col1 = omrt_load8(as.col_bias + 8, m1, whole);
    }
#pragma GCC unroll 6
    for (int r = 0; r < 6; r++) {
        if (r < rows) {
            __m256 v0 = acc[r][0], v1 = acc[r][1];
            if (as.bias) {
                const __m256 add = _mm256_set1_ps(as.bias[r]);
                v0 = _mm256_add_ps(v0, add);
                v1 = _mm256_add_ps(v1, add);
            }
            if (as.col_bias) {
                v0 = _mm256_add_ps(v0, col0);
                v1 = _mm256_add_ps(v1, col1);
            }
            if (as.residual) {
                v0 = _mm256_add_ps(v0, omrt_load8(as.residual + r * ldc, m0, whole));
                v1 = _mm256_add_ps(v1, omrt_load8(as.residual + r * ldc + 8, m1, whole));
            }
            omrt_store8(c + r * ldc, m0, whole, omrt_act8(v0, &as));
            omrt_store8(c + r * ldc + 8, m1, whole, omrt_act8(v1, &as));
        }
    }
}

/* The AVX2 tile's sums over K steps in acc: the first `prows` (2, 4 or 6) rows, rows past it zero.
 * With lines to fetch, the steps go in runs of `every`, each asking first for the next `per` of
 * them, so that they are asked for a few at a time across the tile, not all at once before it
 * (512 requests for a third of a 2048-step panel). One thread, AMD Zen 4, weights from memory:
 * 512 filters of 2048 taps over 7x7 took 1131-1136 us against 1282-1293 in a C loop, and
 * ResNet-50's 7x7 1x1 layers 0.78-0.87 of their time in the model; weights that L3 holds
 * (squeezenet's classifier) gain nothing: 0.97-1.03 of the time in the C loop over two sets of
 * runs, 0.99 in the model. */
OMRT_AVX2 static OMRT_INLINE void omrt_sums_avx2(int64_t K, const float *a, int64_t lda, const float *b, int64_t bks,
                                                 __m256 acc[6][2], int prows, omrt_fetch fetch) {
#pragma GCC unroll 6
    for (int r = 0; r < 6; r++) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    if (fetch.lines <= 0 || K <= 0) {
        omrt_steps_avx2(a, lda, b, bks, 0, K, acc, prows);
        return;
    }
    const int64_t every = K > fetch.lines ? K / fetch.lines : 1, per = (fetch.lines * every + K - 1) / K;
    for (int64_t k = 0, line = 0; k < K; k += every, line += per) {
        const int64_t lines = fetch.lines - line < per ? fetch.lines - line : per; /* <= 0 once all asked */
        omrt_fetch_now((omrt_fetch){(const char *)fetch.at + 64 * line, lines});
        omrt_steps_avx2(a, lda, b, bks, k, K - k > every ? k + every : K, acc, prows);
    }
}

/* The AVX2 tile, asking for `fetch`'s lines as it goes (omrt_sums_avx2). */
OMRT_AVX2 static OMRT_INLINE void omrt_tile_of_avx2(int64_t K, const float *a, int64_t lda, const float *b,
                                                   int64_t bks, float *c, int64_t ldc, int64_t rows, int64_t cols,
                                                   const omrt_epilogue *e, omrt_fetch fetch) {
    __m256 acc[6][2];
    /* the row count a constant: a product's last rows are often 4 (M = 16, 40, 64, 88) or 2 */
    rows <= 2 ? omrt_sums_avx2(K, a, lda, b, bks, acc, 2, fetch)
    : rows <= 4 ? omrt_sums_avx2(K, a, lda, b, bks, acc, 4, fetch)
                : omrt_sums_avx2(K, a, lda, b, bks, acc, 6, fetch);
    if (!e->bias && !e->col_bias && !e->residual && e->act == OMRT_ACT_NONE) {
        /* plain products (Winograd's, of as few as 16 steps) store the sums as they are, on a path
         * of their own: through omrt_finish_avx2 they took 1.03 (64 steps) to 1.11 (16) times as
         * long on an AMD Zen 4, where the AVX-512 tile's took the same */
        const int whole = cols >= 16;
        const __m256i m0 = omrt_lanes8(cols > 8 ? 8 : cols), m1 = omrt_lanes8(cols > 16 ? 8 : cols > 8 ? cols - 8 : 0);
#pragma GCC unroll 6
        for (int r = 0; r < 6; r++) {
            if (r < rows) {
                omrt_store8(c + r * ldc, m0, whole, acc[r][0]);
                omrt_store8(c + r * ldc + 8, m1, whole, acc[r][1]);
            }
        }
        return;
    }
    switch (e->act) {
    case OMRT_ACT_NONE: omrt_finish_avx2(acc, c, ldc, rows, cols, e, OMRT_ACT_NONE); break;
    case OMRT_ACT_RELU: omrt_finish_avx2(acc, c, ldc, rows, cols, e, OMRT_ACT_RELU); break;
    default: omrt_finish_avx2(acc, c, ldc, rows, cols, e, e->act); break;
    }
}

OMRT_AVX2 static inline void omrt_tile_avx2(int64_t K, const float *a, int64_t lda, const float *b, int64_t bks,
                                            float *c, int64_t ldc, int64_t rows, int64_t cols,
                                            const omrt_epilogue *e) {
    omrt_tile_of_avx2(K, a, lda, b, bks, c, ldc, rows, cols, e, omrt_no_fetch);
}

OMRT_AVX2 static inline void omrt_tile_fetching_avx2(int64_t K, const float *a, int64_t lda, const float *b,
                                                     int64_t bks, float *c, int64_t ldc, int64_t rows, int64_t cols,
                                                     const omrt_epilogue *e, omrt_fetch fetch) {
    omrt_tile_of_avx2(K, a, lda, b, bks, c, ldc, rows, cols, e, fetch);
}

/* Columns of a product past its last multiple of 16, when at most this many: they go through
 * omrt_panel_tail_avx2, not through a tile 16 or 32 columns wide, which costs as much for one
 * column as for all of them (a 7x7 layer's 49th position, a 14x14 layer's last 4). */
#define OMRT_TAIL_COLS 4

/* Step k of omrt_tail_sums_avx2 into the sums from `at` on: the 12 floats at k of one panel, or
 * of two panels side by side (`vecs` 3: 24 rows in three vectors), times each column's element
 * at k. */
OMRT_AVX2 static OMRT_INLINE void omrt_tail_step_avx2(const float *panel, const float *next, const float *b,
                                                      int64_t bks, int64_t k, int cols, int vecs, int at,
                                                      __m256 acc[3][OMRT_TAIL_COLS]) {
    const float *p = panel + k * OMRT_PANEL;
    __m256 a[3];
    a[0] = _mm256_loadu_ps(p);
    if (vecs == 3) {
        const float *q = next + k * OMRT_PANEL;
        a[1] = _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_loadu_ps(p + 8)), _mm_loadu_ps(q), 1);
        a[2] = _mm256_loadu_ps(q + 4);
    } else {
        a[1] = _mm256_insertf128_ps(_mm256_setzero_ps(), _mm_loadu_ps(p + 8), 0);
    }
#pragma GCC unroll 4
    for (int j = 0; j < cols; j++) {
        const __m256 x = _mm256_broadcast_ss(b + k * bks + j);
#pragma GCC unroll 3
        for (int v = 0; v < vecs; v++) acc[v][at + j] = _mm256_fmadd_ps(a[v], x, acc[v][at + j]);
    }
}

/* sums[j * OMRT_MAX_NR + r] = row r of a whole panel, or of it and the `next` (vecs 3; 24 rows),
 * K steps of OMRT_PANEL floats each, times column j of b (K rows, bks floats apart), for `cols`
 * columns (a constant, at most OMRT_TAIL_COLS), the panels read once; `unroll` steps (a
 * constant, unroll x cols at most OMRT_TAIL_COLS) at a time, each into sums of its own, so that
 * enough chains of FMAs run side by side. */
OMRT_AVX2 static OMRT_INLINE void omrt_tail_sums_avx2(int64_t K, const float *panel, const float *next,
                                                      const float *b, int64_t bks, int cols, int unroll, int vecs,
                                                      float *sums) {
    __m256 acc[3][OMRT_TAIL_COLS];
    for (int v = 0; v < vecs; v++)
#pragma GCC unroll 4
        for (int i = 0; i < unroll * cols; i++) acc[v][i] = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + unroll <= K; k += unroll)
#pragma GCC unroll 4
        for (int u = 0; u < unroll; u++) omrt_tail_step_avx2(panel, next, b, bks, k + u, cols, vecs, u * cols, acc);
    for (; k < K; k++) omrt_tail_step_avx2(panel, next, b, bks, k, cols, vecs, 0, acc);
    /* every loop over the sums unrolled whole: one indexed at run time keeps them all in memory,
     * stored at every step (4 columns of one panel took 10 cycles a step, not 5) */
#pragma GCC unroll 4
    for (int j = 0; j < cols; j++)
        for (int v = 0; v < vecs; v++) {
            for (int u = 1; u < unroll; u++) acc[v][j] = _mm256_add_ps(acc[v][j], acc[v][u * cols + j]);
            _mm256_storeu_ps(sums + j * OMRT_MAX_NR + 8 * v, acc[v][j]);
        }
}

/* omrt_tail_sums_avx2 for one panel (next NULL) or two, each form with its vector count a
 * constant. */
OMRT_AVX2 static OMRT_INLINE void omrt_tail_sums_of(int64_t K, const float *panel, const float *next, const float *b,
                                                    int64_t bks, int cols, int unroll, float *sums) {
    if (next)
        omrt_tail_sums_avx2(K, panel, next, b, bks, cols, unroll, 3, sums);
    else
        omrt_tail_sums_avx2(K, panel, NULL, b, bks, cols, unroll, 2, sums);
}

/* c (rows <= 2 * OMRT_PANEL rows, cols <= OMRT_TAIL_COLS columns, pitch ldc) = K steps of a
 * panel, and of the `next` one (NULL: none; rows > OMRT_PANEL only with it), times columns of b
 * (K rows, bks floats apart), then the epilogue (no col_bias). A step reads the panels' floats
 * once and makes one FMA per vector and column, where the 6 x 16 tiles it stands for make two per
 * row. Two panels fill three vectors where one filled one and a half: 4 columns took 7.5 cycles a
 * step for 24 rows against 5 for 12 (AMD Zen 4); 512 filters of 4608 taps over 100 columns took
 * 0.93 of the time (AVX2 tile) and 0.93-0.94 (AVX-512), of 2304 taps over 196 columns 0.97-0.98
 * and 0.99, 256 of 1024 over 196 0.96 with either tile. One column waits on its loads either way
 * (3.9 cycles a step for 24 rows, 1.9 for 12): omrt_gemm_pass gives it one panel at a time. */
OMRT_AVX2 static inline void omrt_panel_tail_avx2(int64_t K, const float *panel, const float *next, const float *b,
                                                  int64_t bks, float *c, int64_t ldc, int64_t rows, int64_t cols,
                                                  const omrt_epilogue *e) {
    float sums[OMRT_TAIL_COLS * OMRT_MAX_NR];
    switch (cols) {
    case 1: omrt_tail_sums_of(K, panel, next, b, bks, 1, 3, sums); break;
    case 2: omrt_tail_sums_of(K, panel, next, b, bks, 2, 2, sums); break;
    case 3: omrt_tail_sums_of(K, panel, next, b, bks, 3, 1, sums); break;
    default: omrt_tail_sums_of(K, panel, next, b, bks, 4, 1, sums); break;
    }
    omrt_store_transposed(sums, rows, cols, c, ldc, e);
}
#endif

typedef void (*omrt_tile_fn)(int64_t, const float *, int64_t, const float *, int64_t, float *, int64_t, int64_t,
                             int64_t, const omrt_epilogue *);
typedef void (*omrt_fetching_tile_fn)(int64_t, const float *, int64_t, const float *, int64_t, float *, int64_t,
                                      int64_t, int64_t, const omrt_epilogue *, omrt_fetch);

typedef struct {
    omrt_tile_fn tile;
    omrt_fetching_tile_fn fetching; /* the tile asking for lines as it goes (NULL: none) */
    int64_t rows, nr;               /* the tile's rows (a divisor of OMRT_PANEL) and columns */
} omrt_gemm_kind;

/* The widest tile this CPU runs: 2 AVX-512, 1 AVX2 and FMA, 0 plain C; OMRT_GEMM_TILE=avx2 or
 * =c in the environment caps it (to test the narrower tiles on a wider CPU). */
static inline int omrt_gemm_level(void) {
    int level = 0;
#ifdef OMRT_X86
    __builtin_cpu_init();
    level = __builtin_cpu_supports("avx512f") ? 2 : __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#endif
    const char *cap = getenv("OMRT_GEMM_TILE");
    if (cap && strcmp(cap, "c") == 0) return 0;
    if (cap && strcmp(cap, "avx2") == 0 && level > 1) return 1;
    return level;
}

/* omrt_gemm_level, decided once per unit (the race of two first callers is benign): what the
 * tiles and the other AVX-512 paths of a unit pick by. */
static inline int omrt_gemm_level_once(void) {
    static int level = -1;
    if (level < 0) level = omrt_gemm_level();
    return level;
}

/* The tile for this CPU. */
static inline omrt_gemm_kind omrt_gemm_pick(void) {
#ifdef OMRT_X86
    const int level = omrt_gemm_level_once();
    if (level == 2) return (omrt_gemm_kind){omrt_tile_avx512, NULL, OMRT_PANEL, 32};
    if (level == 1) return (omrt_gemm_kind){omrt_tile_avx2, omrt_tile_fetching_avx2, 6, 16};
#endif
    return (omrt_gemm_kind){omrt_tile_c, NULL, OMRT_PANEL, 16};
}

/* The kind's tile, asking for f's lines as it goes where it can (see omrt_fetch), else all of
 * them first. */
static inline void omrt_tile_with(const omrt_gemm_kind *kind, omrt_fetch f, int64_t K, const float *a, int64_t lda,
                                  const float *b, int64_t bks, float *c, int64_t ldc, int64_t rows, int64_t cols,
                                  const omrt_epilogue *e) {
    if (f.lines > 0 && kind->fetching) {
        kind->fetching(K, a, lda, b, bks, c, ldc, rows, cols, e, f);
        return;
    }
    omrt_fetch_now(f);
    kind->tile(K, a, lda, b, bks, c, ldc, rows, cols, e);
}

/* Rows the next tile of a panel takes when `left` of the panel's rows are left: the kind's, or 4
 * of a last 7 or 8 with the 6-row AVX2 tile, where 6 and then 1 or 2 would leave the last tile's
 * few sums each waiting on its own previous step. AVX2 tile, one thread, AMD Zen 4, in a C loop:
 * 32 filters of 128 taps over 27x27 took 0.92-0.95 of the time, 128 of 128 over 28x28 0.97-0.98;
 * in the model, minilm's products (128 rows) 0.97-0.99. */
static inline int64_t omrt_step_rows(const omrt_gemm_kind *kind, int64_t left) {
    if (kind->rows == 6 && (left == 7 || left == 8)) return 4;
    return left < kind->rows ? left : kind->rows;
}

/* Which tile of its panel (0, 1, ...) the step of rows starting `at` rows into the panel is. */
static inline int64_t omrt_step_of(const omrt_gemm_kind *kind, int64_t at) {
    return (at + kind->rows - 1) / kind->rows;
}

/* How b's columns lie in the GEMM's scratch, as the tiles and the tail read them: columns
 * [0, tiled) as strips of the tile's nr columns, K rows each, one after another, the last `last`
 * wide and zero past its columns; then the `tail` last columns side by side, K x tail, for
 * omrt_panel_tail_avx2. omrt_pack_strips copies strips of nr and no tail; a b its caller lays out
 * there (OMRT_B_IN_SCRATCH, omrt_scratch_b_of) has a last strip only as wide as its columns rounded
 * up to 16 (the AVX-512 tile reads half a strip for 16 columns or fewer) and its tail
 * (omrt_tail_cols) where that fits the scratch's `block` columns (else the last strip takes it). */
typedef struct {
    int64_t K, nr, tiled, tail, strips, last;
} omrt_scratch_b;

static inline omrt_scratch_b omrt_scratch_b_with(int64_t K, int64_t n, int64_t nr, int64_t tail) {
    const int64_t tiled = n - tail, strips = (tiled + nr - 1) / nr;
    const int64_t last = strips > 0 ? (tiled - (strips - 1) * nr + 15) / 16 * 16 : 0;
    return (omrt_scratch_b){K, nr, tiled, tail, strips, last};
}

/* The columns of room (K rows each) that the strips of l take. */
static inline int64_t omrt_scratch_strips_width(const omrt_scratch_b *l) {
    return l->strips > 0 ? (l->strips - 1) * l->nr + l->last : 0;
}

/* Strip s of the b laid out as l in `scratch`, from step k; its pitch in *bks. */
static inline float *omrt_scratch_strip(const omrt_scratch_b *l, float *scratch, int64_t s, int64_t k,
                                        int64_t *bks) {
    *bks = s + 1 == l->strips ? l->last : l->nr;
    return scratch + s * l->K * l->nr + k * *bks;
}

/* The tail's columns of the b laid out as l in `scratch`, from step k (pitch l->tail). */
static inline float *omrt_scratch_tail(const omrt_scratch_b *l, float *scratch, int64_t k) {
    return scratch + omrt_scratch_strips_width(l) * l->K + k * l->tail;
}

/* Row k of the b laid out as l in `scratch` from its columns in `row`, zero past column `tiled`
 * in the last strip. */
static inline void omrt_scratch_row(const omrt_scratch_b *l, float *scratch, int64_t k, const float *row) {
    for (int64_t s = 0; s < l->strips; s++) {
        int64_t pitch;
        float *at = omrt_scratch_strip(l, scratch, s, k, &pitch);
        const int64_t col = s * l->nr, cols = l->tiled - col;
        if (cols >= pitch && pitch == 32)
            memcpy(at, row + col, 32 * sizeof(float));
        else if (cols >= pitch && pitch == 16)
            memcpy(at, row + col, 16 * sizeof(float));
        else
            for (int64_t j = 0; j < pitch; j++) at[j] = j < cols ? row[col + j] : 0.0f;
    }
    float *tail = omrt_scratch_tail(l, scratch, k);
    for (int64_t j = 0; j < l->tail; j++) tail[j] = row[l->tiled + j];
}

/* Columns [0, w) of b (K rows, pitch ldb) as strips of nr columns, K x nr each, one after another
 * in `block`, zero past column w. Each row of b is read once, front to back. */
static inline void omrt_pack_strips(const float *b, int64_t ldb, int64_t K, int64_t w, int64_t nr, float *block) {
    omrt_scratch_b strips = omrt_scratch_b_with(K, w, nr, 0);
    strips.last = nr; /* every strip whole, as the tiles that read this copy take them */
    for (int64_t k = 0; k < K; k++) omrt_scratch_row(&strips, block, k, b + k * ldb);
}

/* Ask for columns [p, p + w) of `rows` rows of x (pitch ld) to be brought into L2, one prefetch
 * per cache line (for writing when `write`). */
static OMRT_INLINE void omrt_prefetch_columns(const float *x, int64_t ld, int64_t rows, int64_t p, int64_t w,
                                              int write) {
    for (int64_t r = 0; r < rows; r++) {
        const float *row = x + r * ld;
        for (int64_t j = p; j < p + w + 15; j += 16) { /* the last line: the run need not start one */
            const float *at = row + (j < p + w ? j : p + w - 1);
            write ? __builtin_prefetch(at, 1, 2) : __builtin_prefetch(at, 0, 2);
        }
    }
}

/* Products of at most this many rows read the whole strips of b where b lies: copying a strip
 * costs more than the few panels that read it save. 1x1 layers with 16-64 filters took 0.72-0.9
 * of the time, 128 filters 0.91-0.98; from 256 filters on, the copy paid for itself. */
#define OMRT_IN_PLACE_ROWS (11 * OMRT_PANEL)

/* Products whose b spans at most an eighth of this core's L2 in floats (half of it in bytes: K
 * rows at its pitch) read its whole strips where it lies and take all its columns at once: b then
 * stays in L2 while every panel streams past it once. Taken a block at a time instead, each panel
 * of weights is read again for every block, from L3 or memory when a layer's weights are not in
 * cache: on a Zen 5 (1 MiB L2), 1000 filters x 512 taps over a 13x13 layer's 169 columns, weights
 * out of cache, took 0.94 of the time of blocks of 32; on an Intel Xeon (2 MiB L2), half its L2
 * instead of a quarter took ResNet-50 0.94-0.98 of the time at one thread and squeezenet
 * 0.97-0.99, models at two threads 0.95-1.01 (two runs). At most
 * OMRT_B_IN_L2_MOST floats; OMRT_B_IN_L2 where the C library does not say. */
#define OMRT_B_IN_L2 (128 * 1024)
#define OMRT_B_IN_L2_MOST (512 * 1024)

/* The floats of b taken whole (see OMRT_B_IN_L2), read once per unit. */
static inline int64_t omrt_b_in_l2(void) {
    static int64_t floats = 0;
    if (floats == 0) {
        long bytes = -1;
#ifdef _SC_LEVEL2_CACHE_SIZE
        bytes = sysconf(_SC_LEVEL2_CACHE_SIZE);
#endif
        floats = bytes <= 0 ? OMRT_B_IN_L2 : bytes / 8 < OMRT_B_IN_L2_MOST ? bytes / 8 : OMRT_B_IN_L2_MOST;
    }
    return floats;
}

/* Columns [0, w) of b (K rows, pitch ldb) into `out`, K rows of `pitch` floats, zero past column
 * w. A row of zeros in whole stores, then the few columns there are: element by element, the
 * copy of a 7x7 layer's last column (4608 rows) into a panel took as long as its products. */
static inline void omrt_copy_columns(const float *b, int64_t ldb, int64_t K, int64_t w, float *out, int64_t pitch) {
    for (int64_t k = 0; k < K; k++) {
        if (w < pitch) memset(out + k * pitch, 0, (size_t)pitch * sizeof(float));
        for (int64_t r = 0; r < w; r++) out[k * pitch + r] = b[k * ldb + r];
    }
}

/* Whether omrt_panel_gemm copies all n columns of b (pitch ldb) into one block of its scratch
 * (`block` columns) rather than reading them where b lies: with a tile 16 columns wide (AVX2,
 * or the plain C one),
 * when b's rows do not start on cache lines, since each of its loads then touches two. 512 -> 2048
 * filters over a 7x7 plane (49 floats a row), one thread, weights out of cache, on an AMD Zen 4:
 * 1230 us a layer copied, 1475 in place, 1090 for 48 columns in place at a pitch of 48. The
 * AVX-512 tile asks for its operands ahead and took the same time either way. */
static inline int omrt_copies_whole_b(int64_t ldb, int64_t n, int64_t block, int64_t nr) {
    return nr < OMRT_MAX_NR && ldb % 16 != 0 && n <= block;
}

/* The last columns of w that omrt_panel_gemm takes through omrt_panel_tail_avx2: those past the
 * last 16 (a whole AVX2 strip, half an AVX-512 one, whose tile then costs half), when there are
 * at most OMRT_TAIL_COLS of them and a vector tile runs. */
static inline int64_t omrt_tail_cols(int64_t w) {
    return omrt_gemm_level_once() >= 1 && w % 16 <= OMRT_TAIL_COLS ? w % 16 : 0;
}

/* The `tail` columns at b (K rows, pitch ldb) where omrt_panel_tail_avx2 reads them, their pitch
 * in *ld: copied side by side (K x tail) into `scratch` past the `packed` columns of strips of nr
 * already there, when it has room (`cap` columns of K rows); else b itself. Every panel reads them
 * again: read a row of b apart each step, 7x7 layers (AVX2, one thread, their other columns
 * copied, six runs of each alternating) took 1204-1250 us (512 -> 2048) and 1220-1385
 * (2048 -> 512), copied side by side 1179-1223 and 1191-1237. */
static inline const float *omrt_tail_columns(const float *b, int64_t ldb, int64_t K, int64_t tail, int64_t packed,
                                             int64_t nr, int64_t cap, float *scratch, int64_t *ld) {
    const int64_t used = (packed + nr - 1) / nr * nr;
    *ld = ldb;
    if (tail == 0 || used + tail > cap) return b;
    omrt_copy_columns(b, ldb, K, tail, scratch + used * K, tail);
    *ld = tail;
    return scratch + used * K;
}

/* The layout of a b of n columns that omrt_panel_gemm reads in its scratch of `block` columns:
 * the tail where it fits. */
static inline omrt_scratch_b omrt_scratch_b_of(int64_t K, int64_t n, int64_t block) {
    const int64_t nr = omrt_gemm_pick().nr;
    const omrt_scratch_b l = omrt_scratch_b_with(K, n, nr, omrt_tail_cols(n));
    return omrt_scratch_strips_width(&l) + l.tail <= block ? l : omrt_scratch_b_with(K, n, nr, 0);
}

/* Products deeper than OMRT_SPLIT_FROM steps, when b is taken a block at a time by a tile 16
 * columns wide (AVX2, plain C), go in passes of about OMRT_DEPTH steps, each adding its sums to c:
 * a pass's strips (OMRT_DEPTH x 16 floats, 16 KiB) stay in L1 while the panels' steps of the pass
 * stream past them, where each strip of a deep product (4608 x 16 floats) came from L2 again for
 * every panel; and a pass takes as many more columns as its fewer rows leave room for in the
 * scratch, so each panel is read once per wider pass of columns rather than once per block. AVX2
 * tile, one thread, AMD Zen 4, two builds alternating in one process: dbnet's 512 -> 512 3x3
 * layers over 10x10 (4608 steps) 5.16-5.19 ms against 5.54-5.64 (two runs), its stride-2
 * 256 -> 512 one (2304) 0.92 of the time, resnet50's 3x3 layers over 7x7 0.95; layers of 1152
 * steps took 1.03 (hence OMRT_SPLIT_FROM). The AVX-512 tile's strips of 32 floats fill L1 at
 * this depth: it took 1.02-1.04 of the time so (vgg19's 512-channel 14x14 layers) and takes K
 * whole. */
#define OMRT_DEPTH 256
#define OMRT_SPLIT_FROM 2048

/* Steps per pass (*depth) and columns per pass (*span) of omrt_panel_gemm over a b of K rows taken
 * `block` columns at a time by a tile `nr` columns wide, in a scratch of K * block floats (see
 * OMRT_DEPTH). */
static inline void omrt_passes(int64_t K, int64_t block, int64_t nr, int64_t *depth, int64_t *span) {
    const int64_t parts = nr < OMRT_MAX_NR && K > OMRT_SPLIT_FROM ? (K + OMRT_DEPTH - 1) / OMRT_DEPTH : 1;
    *depth = (K + parts - 1) / parts;
    *span = parts == 1 ? block : K * block / *depth / OMRT_MAX_NR * OMRT_MAX_NR;
}

/* Where omrt_panel_gemm's b lies. */
typedef enum {
    /* just gathered into a buffer: near already (asking for it again took 6-8% of a 7x7 stem's time) */
    OMRT_B_GATHERED,
    /* a layer's input, where no cache holds it: each block asks for the next block's columns */
    OMRT_B_INPUT,
    /* in the scratch itself, laid out there by the caller as omrt_scratch_b_of(K, n, block) says (b
     * and ldb unused): read where it lies, nothing copied (see gathers_into_strips in conv.c) */
    OMRT_B_IN_SCRATCH,
} omrt_b_at;

/* What every pass of one omrt_panel_gemm call shares: its operands (see there) and tile. */
typedef struct {
    omrt_gemm_kind kind;
    const float *panels, *b;
    float *c, *scratch;
    const omrt_epilogue *e;
    int64_t K, m0, m1, ldb, ldc, block;
    int whole, fetch_b, fetch_panels, in_scratch;
    omrt_scratch_b laid; /* with in_scratch: how b lies in the scratch */
} omrt_gemm_call;

/* The epilogue of a pass (see omrt_gemm_pass) over steps [k0, k0 + kk) for rows from m and
 * columns from at_c of its output: the first pass of K adds the bias and the residual, later ones
 * the sums c holds, and the last one applies the activation. */
static inline omrt_epilogue omrt_pass_epilogue(const omrt_gemm_call *g, int64_t k0, int64_t kk, int64_t m,
                                               int64_t at_c) {
    const omrt_epilogue *e = g->e;
    const int64_t at = (m - g->m0) * g->ldc + at_c;
    const float *residual = k0 > 0 ? g->c + at : e->residual ? e->residual + at : NULL;
    return (omrt_epilogue){k0 == 0 && e->bias ? e->bias + m : NULL, NULL,
                           k0 + kk == g->K ? e->act : OMRT_ACT_NONE, e->alpha, e->beta, residual};
}

/* One pass of omrt_panel_gemm: steps [k0, k0 + kk) of the call's panels times columns [p, p + w)
 * of b into c (see omrt_pass_epilogue), `next` columns of the next pass asked for ahead when this
 * is the last pass over these columns. The tail's columns are taken a panel, or for 2-4 of them a
 * pair of panels, at a time, once the tiles have read them (the second panel of a pair, read
 * first by the tail, came from memory: the AVX-512 tile's 7x7 layers of resnet50 took 1.08-1.09 of
 * the time so). */
static inline void omrt_gemm_pass(const omrt_gemm_call *g, int64_t k0, int64_t kk, int64_t p, int64_t w,
                                  int64_t next) {
    const omrt_gemm_kind *kind = &g->kind;
    const omrt_epilogue *e = g->e;
    const int64_t tail = g->in_scratch ? g->laid.tail : omrt_tail_cols(w), tiled = w - tail, nr = kind->nr;
    const int64_t m0 = g->m0, m1 = g->m1, ldb = g->ldb, ldc = g->ldc;
    const int64_t in_place = !g->in_scratch && (g->whole || m1 - m0 <= OMRT_IN_PLACE_ROWS) ? tiled / nr * nr
                                                                                          : 0; /* columns */
    const int last = k0 + kk == g->K;
    const float *bk = g->b + k0 * ldb;
    if (tiled > in_place && !g->in_scratch)
        omrt_pack_strips(bk + p + in_place, ldb, kk, tiled - in_place, nr, g->scratch);
    int64_t tail_ld = tail;
    const float *tail_b = g->in_scratch ? omrt_scratch_tail(&g->laid, g->scratch, k0)
                                        : omrt_tail_columns(bk + p + tiled, ldb, kk, tail, tiled - in_place, nr,
                                                            g->K * g->block / kk, g->scratch, &tail_ld);
    const int64_t strips = (tiled + nr - 1) / nr;
    const int64_t tail_rows = tail > 1 ? 2 * OMRT_PANEL : OMRT_PANEL; /* see omrt_panel_tail_avx2 */
    for (int64_t m = m0, rows; m < m1; m += rows) {
        const float *a = g->panels + m / OMRT_PANEL * g->K * OMRT_PANEL + k0 * OMRT_PANEL + m % OMRT_PANEL;
        const int64_t panel_end = m - m % OMRT_PANEL + OMRT_PANEL; /* a tile never crosses it */
        rows = omrt_step_rows(kind, (m1 < panel_end ? m1 : panel_end) - m);
        float *c = g->c + (m - m0) * ldc;
        /* the next pass's columns of b, c and the residual are many short runs of rows that no
         * hardware prefetcher follows: each step of rows asks for its share of them */
        if (next > 0 && last) {
            const int64_t r0 = kk * (m - m0) / (m1 - m0), r1 = kk * (m + rows - m0) / (m1 - m0);
            if (g->fetch_b) omrt_prefetch_columns(g->b + r0 * ldb, ldb, r1 - r0, p + w, next, 0);
            omrt_prefetch_columns(c, ldc, rows, p + w, next, 1);
            if (e->residual) omrt_prefetch_columns(e->residual + (m - m0) * ldc, ldc, rows, p + w, next, 0);
        }
        const int next_panel = g->fetch_panels && panel_end < m1;
        const omrt_fetch ahead = next_panel ? omrt_fetch_floats(a - m % OMRT_PANEL + g->K * OMRT_PANEL, kk * OMRT_PANEL)
                                            : omrt_no_fetch;
        const int64_t tiles = OMRT_PANEL / kind->rows * strips, first = omrt_step_of(kind, m % OMRT_PANEL) * strips;
        for (int64_t s = 0; s < strips; s++) {
            const int64_t cols = tiled - s * nr < nr ? tiled - s * nr : nr, at_c = p + s * nr;
            const int placed = s * nr < in_place;
            int64_t bks = placed ? ldb : nr;
            const float *strip = placed        ? bk + at_c
                                 : g->in_scratch ? omrt_scratch_strip(&g->laid, g->scratch, s, k0, &bks)
                                                 : g->scratch + (s - in_place / nr) * kk * nr;
            const omrt_epilogue at = omrt_pass_epilogue(g, k0, kk, m, at_c);
            omrt_tile_with(kind, omrt_fetch_part(ahead, first + s, tiles), kk, a, OMRT_PANEL, strip, bks, c + at_c,
                           ldc, rows, cols, &at);
        }
#ifdef OMRT_X86
        const int64_t done = m + rows, from = m0 + (m - m0) / tail_rows * tail_rows;
        if (tail && (done >= m1 || (done - m0) % tail_rows == 0)) {
            const int64_t at_c = p + tiled;
            const omrt_epilogue at = omrt_pass_epilogue(g, k0, kk, from, at_c);
            const float *ap = g->panels + from / OMRT_PANEL * g->K * OMRT_PANEL + k0 * OMRT_PANEL;
            const int64_t filters = m1 - from < tail_rows ? m1 - from : tail_rows;
            omrt_panel_tail_avx2(kk, ap, filters > OMRT_PANEL ? ap + g->K * OMRT_PANEL : NULL, tail_b, tail_ld,
                                 g->c + (from - m0) * ldc + at_c, ldc, filters, tail, &at);
        }
#endif
    }
}

/* c (rows [m0, m1) of the output, n columns, pitch ldc) = rows [m0, m1) of the packed weights
 * `panels` (K columns; m0 a multiple of OMRT_PANEL) times b (K x n, pitch ldb), bias (per row,
 * indexed from row 0), the residual (laid out as c) and activation applied. b is taken `block`
 * columns at a time (a multiple of OMRT_MAX_NR), and each panel is multiplied by every strip of
 * the block while it is in L1: strips are copied into `scratch` (K * block floats), except the
 * whole strips of a product of at most OMRT_IN_PLACE_ROWS rows, which the tile reads in place.
 * A product deeper than OMRT_SPLIT_FROM may take its K steps in passes (see OMRT_DEPTH). A b
 * of at most omrt_b_in_l2() floats is taken whole, its whole strips read in place (only its
 * last, partial strip copied), unless omrt_copies_whole_b. `where` says where b lies (see
 * omrt_b_at). The last few columns past the whole strips go through omrt_panel_tail_avx2 (see
 * OMRT_TAIL_COLS), copied side by side first where the scratch has room. */
static inline void omrt_panel_gemm(const float *panels, int64_t K, int64_t m0, int64_t m1, const float *b,
                                   int64_t ldb, int64_t n, float *c, int64_t ldc, const omrt_epilogue *e,
                                   float *scratch, int64_t block, omrt_b_at where) {
    omrt_gemm_call g = {omrt_gemm_pick(), panels, b, c, scratch, e, K, m0, m1, ldb, ldc, block,
                        0, where == OMRT_B_INPUT, 0, where == OMRT_B_IN_SCRATCH, {0}};
    if (g.in_scratch) g.laid = omrt_scratch_b_of(K, n, block);
    g.whole = !g.in_scratch && K * ldb <= omrt_b_in_l2() && !omrt_copies_whole_b(ldb, n, block, g.kind.nr);
    int64_t depth = K, span = n; /* steps and columns per pass */
    if (!g.whole) omrt_passes(K, block, g.kind.nr, &depth, &span);
    if (g.in_scratch) span = n;
    /* In one pass each panel is read once, from memory when the layer's weights are not in cache,
     * and a tile 16 columns wide asks for nothing ahead: the tiles of the panel before it each
     * ask for a share of it (omrt_gemm_pass). AVX2 tile, one thread, 64 layers cycled, AMD Zen 4:
     * 1024 filters of 256 taps over 14x14 (64 MiB of weights, out of cache) took 995 us against
     * 1013-1076, 512 of 128 over 28x28 (16 MiB, out of L2) 937-967 against 968-982; the AVX-512
     * tile, which asks for its panel's next steps itself, took up to 1.1 of the time so. */
    g.fetch_panels = g.kind.nr < OMRT_MAX_NR && span >= n;
    for (int64_t p = 0; p < n; p += span) {
        const int64_t w = n - p < span ? n - p : span, next = n - p - span < span ? n - p - span : span;
        for (int64_t k0 = 0; k0 < K; k0 += depth) omrt_gemm_pass(&g, k0, K - k0 < depth ? K - k0 : depth, p, w, next);
    }
}

/* Elements [k, k + 4) of the 4 rows at `rows` into 4 rows of `out`, `pitch` floats apart: one 4 x 4
 * transpose (out[i * pitch + r] = rows[r][k + i]); rows past `live` are written as zeros. */
static inline void omrt_pack_quad(const float *const *rows, int live, int64_t k, float *out, int64_t pitch) {
#ifdef OMRT_X86
    if (live >= 4) {
        __m128 x0 = _mm_loadu_ps(rows[0] + k), x1 = _mm_loadu_ps(rows[1] + k);
        __m128 x2 = _mm_loadu_ps(rows[2] + k), x3 = _mm_loadu_ps(rows[3] + k);
        _MM_TRANSPOSE4_PS(x0, x1, x2, x3);
        _mm_storeu_ps(out, x0);
        _mm_storeu_ps(out + pitch, x1);
        _mm_storeu_ps(out + 2 * pitch, x2);
        _mm_storeu_ps(out + 3 * pitch, x3);
        return;
    }
#endif
    for (int i = 0; i < 4; i++)
        for (int r = 0; r < 4; r++) out[i * pitch + r] = r < live ? rows[r][k + i] : 0.0f;
}

/* Rows [r0, r0 + OMRT_PANEL) of a (M x K, pitch lda) as a panel: element [k, r] = a[r0 + r, k],
 * zero for rows past M. The panel is written front to back, 4 steps at a time from 12 rows read
 * side by side: written a row at a time instead, a 1536-step panel (72 KiB, past L1) took over
 * twice as long, a quarter of the product's time over 128 rows. */
static inline void omrt_pack_rows(const float *a, int64_t lda, int64_t M, int64_t K, int64_t r0, float *panel) {
    const int live = M - r0 < OMRT_PANEL ? (int)(M - r0) : OMRT_PANEL;
    const float *rows[OMRT_PANEL];
    for (int r = 0; r < OMRT_PANEL; r++) rows[r] = r < live ? a + (r0 + r) * lda : NULL;
    int64_t k = 0;
    for (; k + 4 <= K; k += 4)
        for (int g = 0; g < OMRT_PANEL / 4; g++)
            omrt_pack_quad(rows + 4 * g, live - 4 * g, k, panel + k * OMRT_PANEL + 4 * g, OMRT_PANEL);
    for (; k < K; k++)
        for (int r = 0; r < OMRT_PANEL; r++) panel[k * OMRT_PANEL + r] = r < live ? rows[r][k] : 0.0f;
}

/* c rows [r0, r0 + OMRT_PANEL) clipped to M, columns of strip s (OMRT_MAX_NR wide, clipped to N) =
 * the row panel times strip s of the packed weights (K x OMRT_MAX_NR each), column bias and
 * activation applied; the tiles share out `fetch` (see omrt_fetch). */
static inline void omrt_strip_tile(const float *panel, const float *strips, int64_t s, int64_t K, int64_t M,
                                   int64_t N, int64_t r0, float *c, int64_t ldc, const omrt_epilogue *e,
                                   omrt_fetch fetch) {
    const omrt_gemm_kind kind = omrt_gemm_pick();
    const float *b = strips + s * K * OMRT_MAX_NR;
    const int64_t width = N - s * OMRT_MAX_NR < OMRT_MAX_NR ? N - s * OMRT_MAX_NR : OMRT_MAX_NR;
    const int64_t height = M - r0 < OMRT_PANEL ? M - r0 : OMRT_PANEL;
    const int64_t steps = (height + kind.rows - 1) / kind.rows, tiles = (width + kind.nr - 1) / kind.nr * steps;
    for (int64_t half = 0; half * kind.nr < width; half++) {
        const int64_t c0 = s * OMRT_MAX_NR + half * kind.nr, cols = N - c0 < kind.nr ? N - c0 : kind.nr;
        omrt_epilogue at = {NULL, e->col_bias ? e->col_bias + c0 : NULL, e->act, e->alpha, e->beta, NULL};
        for (int64_t r = 0, rows; r < height; r += rows) {
            rows = omrt_step_rows(&kind, height - r);
            omrt_tile_with(&kind, omrt_fetch_part(fetch, half * steps + omrt_step_of(&kind, r), tiles), K,
                           panel + r, OMRT_PANEL, b + half * kind.nr, OMRT_MAX_NR, c + (r0 + r) * ldc + c0, ldc,
                           rows, cols, &at);
        }
    }
}

#endif
