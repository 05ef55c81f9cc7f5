/* Planes 16 at a time, one vector lane each: loops over narrow planes (depthwise convolution,
 * pooling) copy a band of rows of 16 planes into scratch with the planes interleaved, so that
 * each output pixel is one full vector per tap however short the planes' rows, then copy the
 * results back into the 16 output planes. With AVX-512 both copies go 16 columns at a time
 * through a 16 x 16 transpose, with AVX2 8 at a time through two 8 x 8 ones; elsewhere element
 * by element. The same transposes bring back the sums of omrt's GEMM tile run with the filters
 * in the lanes (omrt_lanes_gemm, below).
 */
#ifndef OMRT_LANES_H
#define OMRT_LANES_H

#include "omrt_gemm.h"

#define OMRT_LANES 16
typedef float omrt_lanes_vec __attribute__((vector_size(OMRT_LANES * sizeof(float)), aligned(4)));
/* Half of those, 8 floats: for CPUs without AVX-512, where GCC moves 64-byte vectors through the
 * stack (a depthwise loop ran 2.5-4x slower so). */
typedef float omrt_lanes_half __attribute__((vector_size(OMRT_LANES / 2 * sizeof(float)), aligned(4)));

/* The planes a band is read from: H x W, placed PL columns into each interleaved row; every
 * element outside them (padding, and lanes past the last plane) is `fill`. */
typedef struct {
    int64_t H, W, PL;
    float fill;
} omrt_lanes_source;

/* Rows [i0, i0 + rows) of the first `lanes` of `planes`, `wide` columns from -PL, interleaved
 * into `in` (rows x wide x OMRT_LANES floats). */
static inline void omrt_lanes_gather_c(const omrt_lanes_source *s, const float *const *planes, int64_t lanes,
                                       int64_t i0, int64_t rows, int64_t wide, float *in) {
    for (int64_t i = 0; i < rows * wide * OMRT_LANES; i++) in[i] = s->fill;
    const int64_t lo = s->PL > 0 ? s->PL : 0, hi = s->W + s->PL < wide ? s->W + s->PL : wide;
    for (int64_t l = 0; l < lanes; l++)
        for (int64_t r = 0; r < rows; r++) {
            const int64_t ih = i0 + r;
            if (ih < 0 || ih >= s->H) continue;
            const float *row = planes[l] + ih * s->W;
            for (int64_t col = lo; col < hi; col++) in[(r * wide + col) * OMRT_LANES + l] = row[col - s->PL];
        }
}

/* out (count pixels, lanes interleaved) into the first `lanes` of `planes`. */
static inline void omrt_lanes_scatter_c(const float *out, int64_t count, float *const *planes, int64_t lanes) {
    for (int64_t l = 0; l < lanes; l++)
        for (int64_t i = 0; i < count; i++) planes[l][i] = out[i * OMRT_LANES + l];
}

#ifdef OMRT_X86
/* out[k] = column k of the 16x16 matrix whose rows are r[0..15]. */
OMRT_AVX512 static inline void omrt_transpose16(const __m512 r[16], __m512 out[16]) {
    __m512 t[16], u[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int g = 0; g < 16; g += 4)
        for (int h = 0; h < 2; h++) {
            __m512d a = _mm512_castps_pd(t[g + h]), b = _mm512_castps_pd(t[g + 2 + h]);
            u[g + 2 * h] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, b));
            u[g + 2 * h + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, b));
        }
    for (int e = 0; e < 4; e++) {
        __m512 s0 = _mm512_shuffle_f32x4(u[e], u[4 + e], 0x44), s1 = _mm512_shuffle_f32x4(u[e], u[4 + e], 0xEE);
        __m512 s2 = _mm512_shuffle_f32x4(u[8 + e], u[12 + e], 0x44);
        __m512 s3 = _mm512_shuffle_f32x4(u[8 + e], u[12 + e], 0xEE);
        out[e] = _mm512_shuffle_f32x4(s0, s2, 0x88);
        out[4 + e] = _mm512_shuffle_f32x4(s0, s2, 0xDD);
        out[8 + e] = _mm512_shuffle_f32x4(s1, s3, 0x88);
        out[12 + e] = _mm512_shuffle_f32x4(s1, s3, 0xDD);
    }
}

/* Lanes [lo, hi) of 16 set (none when hi <= lo). */
static inline __mmask16 omrt_lane_mask(int64_t lo, int64_t hi) {
    lo = lo < 0 ? 0 : lo;
    hi = hi > 16 ? 16 : hi;
    return hi > lo ? (__mmask16)(((1u << hi) - 1) & ~((1u << lo) - 1)) : 0;
}

/* omrt_lanes_gather_c, 16 columns at a time: each plane's row is read with a masked load (the
 * lanes outside it are `fill` and never read); `planes` past `lanes` are NULL. */
OMRT_AVX512 static void omrt_lanes_gather_avx512(const omrt_lanes_source *s, const float *const *planes, int64_t i0,
                                                 int64_t rows, int64_t wide, float *in) {
    const __m512 fill = _mm512_set1_ps(s->fill);
    for (int64_t r = 0; r < rows; r++) {
        const int64_t ih = i0 + r;
        float *dst = in + r * wide * OMRT_LANES;
        if (ih < 0 || ih >= s->H) {
            for (int64_t i = 0; i < wide; i++) _mm512_storeu_ps(dst + i * OMRT_LANES, fill);
            continue;
        }
        for (int64_t c = 0; c < wide; c += 16) {
            const int64_t from = c - s->PL, cols = wide - c < 16 ? wide - c : 16;
            const __mmask16 inside = omrt_lane_mask(-from, s->W - from);
            __m512 v[16], t[16];
            for (int l = 0; l < OMRT_LANES; l++)
                v[l] = planes[l] && inside ? _mm512_mask_loadu_ps(fill, inside, planes[l] + ih * s->W + from) : fill;
            omrt_transpose16(v, t);
            if (cols == 16) /* whole: unrolled stores, where the loop below would become a memcpy */
                for (int k = 0; k < 16; k++) _mm512_storeu_ps(dst + (c + k) * OMRT_LANES, t[k]);
            else
                for (int64_t k = 0; k < cols; k++) _mm512_storeu_ps(dst + (c + k) * OMRT_LANES, t[k]);
        }
    }
}

/* omrt_lanes_scatter_c, 16 pixels at a time through a transpose. */
OMRT_AVX512 static void omrt_lanes_scatter_avx512(const float *out, int64_t count, float *const *planes,
                                                  int64_t lanes) {
    for (int64_t i = 0; i < count; i += 16) {
        const int64_t n = count - i < 16 ? count - i : 16;
        __m512 v[16], t[16];
        for (int64_t k = 0; k < 16; k++)
            v[k] = k < n ? _mm512_loadu_ps(out + (i + k) * OMRT_LANES) : _mm512_setzero_ps();
        omrt_transpose16(v, t);
        for (int64_t l = 0; l < lanes; l++) _mm512_mask_storeu_ps(planes[l] + i, omrt_lane_mask(0, n), t[l]);
    }
}

/* out[k] = column k of the 8x8 matrix whose rows are r[0..7]. */
OMRT_AVX2 static inline void omrt_transpose8(const __m256 r[8], __m256 out[8]) {
    __m256 t[8], u[8];
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int g = 0; g < 8; g += 4) {
        u[g] = _mm256_shuffle_ps(t[g], t[g + 2], 0x44);
        u[g + 1] = _mm256_shuffle_ps(t[g], t[g + 2], 0xEE);
        u[g + 2] = _mm256_shuffle_ps(t[g + 1], t[g + 3], 0x44);
        u[g + 3] = _mm256_shuffle_ps(t[g + 1], t[g + 3], 0xEE);
    }
    for (int k = 0; k < 4; k++) {
        out[k] = _mm256_permute2f128_ps(u[k], u[4 + k], 0x20);
        out[k + 4] = _mm256_permute2f128_ps(u[k], u[4 + k], 0x31);
    }
}

/* out[k] = (row[0][k], ..., row[7][k]): omrt_transpose8 of eight rows read from memory, the
 * exchange of 128-bit halves done by the loads (a row's half read into the upper half of a
 * register), so that 16 shuffles remain of its 24. */
OMRT_AVX2 static inline void omrt_load_transpose8(const float *const row[8], __m256 out[8]) {
    for (int half = 0; half < 8; half += 4) {
        __m256 a[4], t[4];
        for (int i = 0; i < 4; i++)
            a[i] = _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_loadu_ps(row[i] + half)),
                                        _mm_loadu_ps(row[i + 4] + half), 1);
        t[0] = _mm256_unpacklo_ps(a[0], a[1]);
        t[1] = _mm256_unpackhi_ps(a[0], a[1]);
        t[2] = _mm256_unpacklo_ps(a[2], a[3]);
        t[3] = _mm256_unpackhi_ps(a[2], a[3]);
        out[half] = _mm256_shuffle_ps(t[0], t[2], 0x44);
        out[half + 1] = _mm256_shuffle_ps(t[0], t[2], 0xEE);
        out[half + 2] = _mm256_shuffle_ps(t[1], t[3], 0x44);
        out[half + 3] = _mm256_shuffle_ps(t[1], t[3], 0xEE);
    }
}

/* Lanes [lo, hi) of 8 set, as a maskload/maskstore mask. */
OMRT_AVX2 static inline __m256i omrt_lane_mask8(int64_t lo, int64_t hi) {
    const __m256i index = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    lo = lo < 0 ? 0 : lo > 8 ? 8 : lo;
    hi = hi < 0 ? 0 : hi > 8 ? 8 : hi;
    const __m256i from = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)lo), index);
    const __m256i to = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)hi), index);
    return _mm256_andnot_si256(from, to);
}

/* omrt_lanes_gather_c, 8 columns of 8 planes at a time: each plane's row is read with a masked
 * load (the lanes outside it are `fill` and never read); `planes` past `lanes` are NULL. */
OMRT_AVX2 static void omrt_lanes_gather_avx2(const omrt_lanes_source *s, const float *const *planes, int64_t i0,
                                             int64_t rows, int64_t wide, float *in) {
    const __m256 fill = _mm256_set1_ps(s->fill);
    for (int64_t r = 0; r < rows; r++) {
        const int64_t ih = i0 + r;
        float *dst = in + r * wide * OMRT_LANES;
        if (ih < 0 || ih >= s->H) {
            for (int64_t i = 0; i < wide * 2; i++) _mm256_storeu_ps(dst + i * 8, fill);
            continue;
        }
        for (int64_t c = 0; c < wide; c += 8) {
            const int64_t from = c - s->PL, cols = wide - c < 8 ? wide - c : 8;
            const __m256i inside = omrt_lane_mask8(-from, s->W - from);
            const int whole = from >= 0 && from + 8 <= s->W; /* all 8 columns inside the planes */
            for (int h = 0; h < OMRT_LANES; h += 8) {
                __m256 v[8], t[8];
                const float *at[8];
                int present = whole;
                for (int l = 0; l < 8; l++) {
                    at[l] = planes[h + l] ? planes[h + l] + ih * s->W + from : NULL;
                    present &= at[l] != NULL;
                }
                if (present) {
                    omrt_load_transpose8(at, t);
                } else {
                    for (int l = 0; l < 8; l++)
                        v[l] = at[l] ? _mm256_blendv_ps(fill, _mm256_maskload_ps(at[l], inside),
                                                        _mm256_castsi256_ps(inside))
                                     : fill;
                    omrt_transpose8(v, t);
                }
                for (int64_t k = 0; k < cols; k++) _mm256_storeu_ps(dst + (c + k) * OMRT_LANES + h, t[k]);
            }
        }
    }
}

/* omrt_lanes_scatter_c, 8 pixels of 8 planes at a time through a transpose. */
OMRT_AVX2 static void omrt_lanes_scatter_avx2(const float *out, int64_t count, float *const *planes, int64_t lanes) {
    for (int64_t i = 0; i < count; i += 8) {
        const int64_t n = count - i < 8 ? count - i : 8;
        const __m256i first = omrt_lane_mask8(0, n);
        for (int64_t h = 0; h < lanes; h += 8) {
            __m256 v[8], t[8];
            if (n == 8) { /* whole (see omrt_load8) */
                const float *rows[8];
                for (int k = 0; k < 8; k++) rows[k] = out + (i + k) * OMRT_LANES + h;
                omrt_load_transpose8(rows, t);
            } else {
                for (int64_t k = 0; k < 8; k++)
                    v[k] = k < n ? _mm256_loadu_ps(out + (i + k) * OMRT_LANES + h) : _mm256_setzero_ps();
                omrt_transpose8(v, t);
            }
            for (int64_t l = 0; l < 8 && h + l < lanes; l++) omrt_store8(planes[h + l] + i, first, n == 8, t[l]);
        }
    }
}
#endif

/* The band's rows, interleaved (see omrt_lanes_gather_c); `planes` past `lanes` are NULL. */
static inline void omrt_lanes_gather(const omrt_lanes_source *s, const float *const *planes, int64_t lanes,
                                     int64_t i0, int64_t rows, int64_t wide, float *in) {
#ifdef OMRT_X86
    if (omrt_gemm_level_once() == 2) {
        omrt_lanes_gather_avx512(s, planes, i0, rows, wide, in);
        return;
    }
    if (omrt_gemm_level_once() == 1) {
        omrt_lanes_gather_avx2(s, planes, i0, rows, wide, in);
        return;
    }
#endif
    omrt_lanes_gather_c(s, planes, lanes, i0, rows, wide, in);
}

/* The band's results back into their planes (see omrt_lanes_scatter_c). */
static inline void omrt_lanes_scatter(const float *out, int64_t count, float *const *planes, int64_t lanes) {
#ifdef OMRT_X86
    if (omrt_gemm_level_once() == 2) {
        omrt_lanes_scatter_avx512(out, count, planes, lanes);
        return;
    }
    if (omrt_gemm_level_once() == 1) {
        omrt_lanes_scatter_avx2(out, count, planes, lanes);
        return;
    }
#endif
    omrt_lanes_scatter_c(out, count, planes, lanes);
}


/* Filters in the vector lanes, for products of few columns: the 49 positions of a 7x7 layer, or
 * 196 of a 14x14 one, fill the tile's columns to 0.77 and 0.94, where filters packed in strips
 * of OMRT_MAX_NR (omrt.kernels.packed.pack_filter_strips: K x 32 floats each, filter j of strip s
 * at [s][k][j], zero past the last) fill them whole. The tile then runs transposed: its columns
 * are 32 filters, its rows 12 of the product's columns, read from b in place (the last partial
 * panel of them copied first, zero-padded, into `panel`: K x OMRT_PANEL floats), and rows come
 * 4 at a time, so 49 columns take 52 rows. Each tile's sums go back transposed through the
 * registers, the bias (per filter), the residual and the activation applied on the way. */

#ifdef OMRT_X86
/* omrt_store_transposed through 16 x 16 transposes. */
OMRT_AVX512 static inline void omrt_lanes_store_avx512(const float *sums, int64_t filters, int64_t cols, float *c,
                                                       int64_t ldc, const omrt_epilogue *e) {
    const __mmask16 inside = omrt_lane_mask(0, cols);
    for (int64_t h = 0; h * 16 < filters; h++) {
        __m512 v[16], t[16];
        for (int64_t k = 0; k < 16; k++)
            v[k] = k < cols ? _mm512_loadu_ps(sums + k * OMRT_MAX_NR + h * 16) : _mm512_setzero_ps();
        omrt_transpose16(v, t);
        for (int64_t l = 0; l < 16 && h * 16 + l < filters; l++) {
            const int64_t f = h * 16 + l;
            __m512 out = _mm512_add_ps(t[l], _mm512_set1_ps(e->bias ? e->bias[f] : 0.0f));
            if (e->residual) out = _mm512_add_ps(out, _mm512_maskz_loadu_ps(inside, e->residual + f * ldc));
            _mm512_mask_storeu_ps(c + f * ldc, inside, omrt_act16(out, e));
        }
    }
}

/* omrt_store_transposed through 8 x 8 transposes. */
OMRT_AVX2 static inline void omrt_lanes_store_avx2(const float *sums, int64_t filters, int64_t cols, float *c,
                                                   int64_t ldc, const omrt_epilogue *e) {
    for (int64_t r0 = 0; r0 < cols; r0 += 8) {
        const __m256i inside = omrt_lane_mask8(0, cols - r0);
        const int whole = r0 + 8 <= cols; /* see omrt_load8 */
        for (int64_t f0 = 0; f0 < filters; f0 += 8) {
            __m256 v[8], t[8];
            if (whole) {
                const float *rows[8];
                for (int k = 0; k < 8; k++) rows[k] = sums + (r0 + k) * OMRT_MAX_NR + f0;
                omrt_load_transpose8(rows, t);
            } else {
                for (int64_t k = 0; k < 8; k++)
                    v[k] = r0 + k < cols ? _mm256_loadu_ps(sums + (r0 + k) * OMRT_MAX_NR + f0) : _mm256_setzero_ps();
                omrt_transpose8(v, t);
            }
            for (int64_t l = 0; l < 8 && f0 + l < filters; l++) {
                const int64_t f = f0 + l;
                __m256 out = _mm256_add_ps(t[l], _mm256_set1_ps(e->bias ? e->bias[f] : 0.0f));
                if (e->residual) out = _mm256_add_ps(out, omrt_load8(e->residual + f * ldc + r0, inside, whole));
                omrt_store8(c + f * ldc + r0, inside, whole, omrt_act8(out, e));
            }
        }
    }
}
#endif

/* The tile's sums (sums[r, f]) into c transposed, at the CPU's width (see omrt_store_transposed). */
static inline void omrt_lanes_store(const float *sums, int64_t filters, int64_t cols, float *c, int64_t ldc,
                                    const omrt_epilogue *e) {
#ifdef OMRT_X86
    if (omrt_gemm_level_once() == 2) {
        omrt_lanes_store_avx512(sums, filters, cols, c, ldc, e);
        return;
    }
    if (omrt_gemm_level_once() == 1) {
        omrt_lanes_store_avx2(sums, filters, cols, c, ldc, e);
        return;
    }
#endif
    omrt_store_transposed(sums, filters, cols, c, ldc, e);
}

/* Rows of the product a tile narrower than a strip (AVX2: 16 of its 32 filters) takes at a time:
 * it reads each row of b's columns in four passes (two halves of the strip, two groups of 6
 * columns), and the columns of a deep product (a 3x3 layer's 4608 rows over a 7x7 plane: 900
 * KiB) would come from L2 or further in every pass of every strip; 512 of them (100 KiB) stay near
 * while every strip passes over them. The sums so far wait in c, the bias and the residual added
 * with the first rows, the activation with the last. Alone (a C loop, one thread, Intel Xeon, AVX2
 * tile), 512 filters x 4608 rows over 49 columns took 0.87 of the time of the whole depth at
 * once (128 rows: 0.99, 256: 0.90); 1152 rows over 196 columns about the same either way. */
#define OMRT_LANES_DEPTH 512

/* Rows of the product omrt_lanes_gemm takes at a time. The AVX-512 tile reads a strip whole:
 * it takes the whole depth while a strip and b's columns over it fit in a quarter of L2
 * (omrt_b_in_l2() / 2 floats), else equal parts of at most as many rows as fit (or as
 * OMRT_LANES_DEPTH, where fewer fit), so that the part of a strip read from memory for the first
 * panel of columns is still in L2 for the others. ResNet-50's 3x3 layers over 7x7 planes (4608
 * rows: 3 parts of 1536 with 2 MiB of L2) on an Intel Xeon took 0.82-0.85 of the time of the
 * whole depth at one thread and 0.87-0.91 at two (parts of 512: 0.89-0.93 at one; of 2304:
 * 0.84-0.89); its 1x1 layers of 2048 rows (2 parts of 1024) 0.88-1.03. */
static inline int64_t omrt_lanes_depth(int64_t K, int64_t n, int64_t nr) {
    if (nr < OMRT_MAX_NR) return OMRT_LANES_DEPTH;
    const int64_t fit = omrt_b_in_l2() / 2 / (OMRT_MAX_NR + n);
    const int64_t most = fit > OMRT_LANES_DEPTH ? fit : OMRT_LANES_DEPTH, parts = (K + most - 1) / most;
    return (K + parts - 1) / parts;
}

#ifdef OMRT_X86
/* sums[f] = strip (K x OMRT_MAX_NR) times the column b (K floats, ldb apart), for all 32 filters:
 * the strip read front to back as one stream, two steps at a time into two sets of sums. */
OMRT_AVX2 static inline void omrt_strip_column_avx2(const float *strip, int64_t K, const float *b, int64_t ldb,
                                                    float *sums) {
    __m256 acc[2][4];
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++) acc[0][j] = acc[1][j] = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + 2 <= K; k += 2)
#pragma GCC unroll 2
        for (int u = 0; u < 2; u++) {
            const __m256 x = _mm256_broadcast_ss(b + (k + u) * ldb);
#pragma GCC unroll 4
            for (int j = 0; j < 4; j++)
                acc[u][j] = _mm256_fmadd_ps(x, _mm256_loadu_ps(strip + (k + u) * OMRT_MAX_NR + 8 * j), acc[u][j]);
        }
    if (k < K) {
        const __m256 x = _mm256_broadcast_ss(b + k * ldb);
        for (int j = 0; j < 4; j++)
            acc[0][j] = _mm256_fmadd_ps(x, _mm256_loadu_ps(strip + k * OMRT_MAX_NR + 8 * j), acc[0][j]);
    }
    for (int j = 0; j < 4; j++) _mm256_storeu_ps(sums + 8 * j, _mm256_add_ps(acc[0][j], acc[1][j]));
}

/* omrt_lanes_gemm of one column (a layer over a 1x1 plane: a squeeze-excite block, a classifier
 * after global pooling): each strip is read once, front to back, and its sums go through the
 * epilogue. Such a layer is bound by reading its filters. One stream of strips beats rows read 4
 * side by side (as BLAS's sgemv reads them): 1024 filters, weights out of cache, in a C loop on an
 * AMD Zen 4, 28.5 GB/s against 13.8 over 576 taps and 21.7 against 18.1 over 1024; the tile's
 * way (half strips, a column of 12 mostly zero) took 1.8x the time of that sgemv with AVX2. */
static inline void omrt_lanes_column(const float *strips, int64_t K, int64_t f0, int64_t f1, const float *b,
                                     int64_t ldb, float *c, int64_t ldc, const omrt_epilogue *e) {
    float sums[OMRT_MAX_NR];
    for (int64_t f = f0; f < f1; f += OMRT_MAX_NR) {
        const float *strip = strips + f / OMRT_MAX_NR * K * OMRT_MAX_NR;
        const int64_t filters = f1 - f < OMRT_MAX_NR ? f1 - f : OMRT_MAX_NR;
        omrt_strip_column_avx2(strip, K, b, ldb, sums);
        const omrt_epilogue at = {e->bias ? e->bias + f : NULL, NULL, e->act, e->alpha, e->beta,
                                  e->residual ? e->residual + (f - f0) * ldc : NULL};
        omrt_store_transposed(sums, filters, 1, c + (f - f0) * ldc, ldc, &at);
    }
}
#endif

/* c (filters [f0, f1) as rows, n columns, pitch ldc; f0 a multiple of OMRT_MAX_NR) = those
 * filters, packed as strips (`strips`, indexed from filter 0), times b (K x n, pitch ldb), the
 * epilogue applied (bias indexed from filter 0, residual laid out as c). Strip by strip, so that
 * each is read from memory once and from L2 for every panel of b's columns; omrt_lanes_depth
 * rows of the product at a time, every strip over them. */
static inline void omrt_lanes_gemm(const float *strips, int64_t K, int64_t f0, int64_t f1, const float *b,
                                   int64_t ldb, int64_t n, float *c, int64_t ldc, const omrt_epilogue *e,
                                   float *panel) {
    const omrt_gemm_kind kind = omrt_gemm_pick();
#ifdef OMRT_X86
    if (n == 1 && omrt_gemm_level_once() >= 1) {
        omrt_lanes_column(strips, K, f0, f1, b, ldb, c, ldc, e);
        return;
    }
#endif
    const omrt_epilogue plain = {NULL, NULL, OMRT_ACT_NONE, 0.0f, 0.0f, NULL};
    const int64_t whole = n / OMRT_PANEL * OMRT_PANEL, depth = omrt_lanes_depth(K, n, kind.nr);
    if (whole < n) omrt_copy_columns(b + whole, ldb, K, n - whole, panel, OMRT_PANEL);
    float sums[OMRT_PANEL * OMRT_MAX_NR];
    for (int64_t k0 = 0; k0 < K; k0 += depth) {
        const int64_t kk = K - k0 < depth ? K - k0 : depth, first = k0 == 0, last = k0 + kk == K;
        for (int64_t f = f0; f < f1; f += OMRT_MAX_NR) {
            const float *strip = strips + f / OMRT_MAX_NR * K * OMRT_MAX_NR + k0 * OMRT_MAX_NR;
            const int64_t filters = f1 - f < OMRT_MAX_NR ? f1 - f : OMRT_MAX_NR;
            for (int64_t p = 0; p < n; p += OMRT_PANEL) {
                const int64_t cols = n - p < OMRT_PANEL ? n - p : OMRT_PANEL;
                /* the next strip's rows, a piece per panel, shared out among its tiles */
                const omrt_fetch piece = kind.nr < OMRT_MAX_NR && f + OMRT_MAX_NR < f1
                                             ? omrt_fetch_part(omrt_fetch_floats(strip + K * OMRT_MAX_NR,
                                                                                 kk * OMRT_MAX_NR),
                                                               p / OMRT_PANEL, (n + OMRT_PANEL - 1) / OMRT_PANEL)
                                             : omrt_no_fetch;
                const int64_t lda = p < whole ? ldb : OMRT_PANEL;
                const float *a = (p < whole ? b + p : panel) + k0 * lda;
                const int64_t steps = (cols + kind.rows - 1) / kind.rows;
                const int64_t tiles = (filters + kind.nr - 1) / kind.nr * steps;
                for (int64_t h = 0; h * kind.nr < filters; h++)
                    for (int64_t r = 0, rows; r < cols; r += rows) {
                        rows = omrt_step_rows(&kind, cols - r);
                        omrt_tile_with(&kind, omrt_fetch_part(piece, h * steps + omrt_step_of(&kind, r), tiles), kk,
                                       a + r, lda, strip + h * kind.nr, OMRT_MAX_NR,
                                       sums + r * OMRT_MAX_NR + h * kind.nr, OMRT_MAX_NR, rows,
                                       filters - h * kind.nr < kind.nr ? filters - h * kind.nr : kind.nr, &plain);
                    }
                float *out = c + (f - f0) * ldc + p;
                const float *before = first ? (e->residual ? e->residual + (f - f0) * ldc + p : NULL) : out;
                const omrt_epilogue at = {first && e->bias ? e->bias + f : NULL, NULL,
                                          last ? e->act : OMRT_ACT_NONE, e->alpha, e->beta, before};
                omrt_lanes_store(sums, filters, cols, out, ldc, &at);
            }
        }
    }
}

#endif
