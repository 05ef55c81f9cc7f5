/* 2-D max and average pooling over NCHW planes. */
#include "omrt_lanes.h"

/* Narrow planes can go 16 at a time, one vector lane each (omrt_lanes.h, pool_lanes.h): every
 * output pixel is then whole vectors, where the plane loops below spend most of their time on the
 * scalar ends of short rows and on per-plane setup (the caller decides:
 * omrt.kernels.pool.NARROW_ROW). On 14x14 and 7x7 planes this took 0.43-0.91 of their time with
 * AVX-512; rows of 28 took longer (1.13). */

/* The bits of |f|: above NAN_BITS (infinity's) for a NaN, and ordered as the magnitudes. */
#define NAN_BITS 0x7f800000u
static inline uint32_t magnitude_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u & 0x7fffffffu;
}

static inline uint32_t max_u32(uint32_t a, uint32_t b) { return a > b ? a : b; }

/* Whether one of x[0..n) is a NaN: one flat pass of integer maxima (long rows scan fastest so;
 * a pass per short row, or a float compare per value, cost more). */
static OMRT_INLINE int holds_nan(const float *x, int64_t n) {
    uint32_t top = 0;
    for (int64_t i = 0; i < n; i++) top = max_u32(top, magnitude_bits(x[i]));
    return top > NAN_BITS;
}

/* dst[i] = the max over TAPS rows `step` apart of src[i], for i < n (TAPS a constant at the call
 * sites, so that the loop vectorizes whole); returns the largest magnitude_bits read. */
static OMRT_INLINE uint32_t max_rows_fixed(float *dst, const float *src, int64_t n, int64_t TAPS, int64_t step) {
    uint32_t top = 0;
    for (int64_t i = 0; i < n; i++) {
        float m = src[i];
        top = max_u32(top, magnitude_bits(m));
        for (int64_t t = 1; t < TAPS; t++) {
            const float v = src[i + t * step];
            m = v > m ? v : m;
            top = max_u32(top, magnitude_bits(v));
        }
        dst[i] = m;
    }
    return top;
}

/* dst[i] = the max over `taps` rows `step` apart of src[i], for i < n; nonzero when a value read
 * is a NaN, which the max drops. The check rides along in the same pass, as an integer max of
 * the values' magnitudes: the separate scan it replaced took a third of a wide pool's time. */
static OMRT_INLINE int max_rows_checked(float *dst, const float *src, int64_t n, int64_t taps, int64_t step) {
    uint32_t top;
    if (taps == 2)
        top = max_rows_fixed(dst, src, n, 2, step);
    else if (taps == 3)
        top = max_rows_fixed(dst, src, n, 3, step);
    else {
        top = max_rows_fixed(dst, src, n, 1, step);
        for (int64_t t = 1; t < taps; t++)
            for (int64_t i = 0; i < n; i++) {
                const float v = src[i + t * step];
                dst[i] = v > dst[i] ? v : dst[i];
                top = max_u32(top, magnitude_bits(v));
            }
    }
    return top > NAN_BITS;
}

/* Max (the x86 max instruction's form, which a NaN need not win: rows holding one are redone by
 * nan_windows), or the sum for average pooling. */
static inline float pool_step(float acc, float v, int64_t is_max) {
    return is_max ? (v > acc ? v : acc) : acc + v;
}

/* Set to NaN the maxima of output row `oh` whose window holds a NaN (numpy's maximum semantics). */
static void nan_windows(float *yr, const float *xp, const int64_t *lo, const int64_t *hi, int64_t oh,
                        int64_t H, int64_t W, int64_t KH, int64_t KW, int64_t SH, int64_t SW,
                        int64_t DH, int64_t DW, int64_t PT, int64_t PL) {
    for (int64_t kh = 0; kh < KH; kh++) {
        int64_t ih = oh * SH + kh * DH - PT;
        if (ih < 0 || ih >= H) continue;
        for (int64_t kw = 0; kw < KW; kw++) {
            int64_t shift = kw * DW - PL;
            for (int64_t ow = lo[kw]; ow < hi[kw]; ow++) {
                float v = xp[ih * W + ow * SW + shift];
                if (v != v) yr[ow] = v;
            }
        }
    }
}

/* The input rows of a band, padded: the plane (H x W) placed at row PT (< 0: the band starts
 * below the plane's top), column PL of a grid of Hp x Wp, then `tail` more floats, every element
 * outside the plane `fill`. */
static inline void pad_band(const float *xp, float *pad, float fill, int64_t H, int64_t W, int64_t Hp, int64_t Wp,
                            int64_t tail, int64_t PT, int64_t PL) {
    for (int64_t i = 0; i < Hp * Wp + tail; i++) pad[i] = fill;
    int64_t c0 = PL < 0 ? -PL : 0, c1 = W < Wp - PL ? W : Wp - PL;
    for (int64_t r = 0; r < Hp; r++) {
        int64_t ih = r - PT;
        if (ih >= 0 && ih < H && c1 > c0)
            memcpy(pad + r * Wp + PL + c0, xp + ih * W + c0, (size_t)(c1 - c0) * sizeof(float));
    }
}

/* Floats of scratch the plane path of a pool takes for bands of OH output rows (pool_plane); the
 * widest band the caller's pitch holds is taken, and planes where not even one row fits go row by
 * row. */
static inline int64_t pool_plane_floats(int64_t OH, int64_t OW, int64_t KH, int64_t KW, int64_t SH, int64_t SW,
                                        int64_t DH, int64_t DW) {
    int64_t Wq = ((OW - 1) * SW + (KW - 1) * DW + SW) / SW, Hp = (OH - 1) * SH + (KH - 1) * DH + 1;
    int64_t grid = Hp * Wq * SW + (KW - 1) * DW, out = OH * SH * Wq;
    return (grid > out ? grid : out) + (Hp + SH - 1) * Wq;
}

/* dst[i] = op over taps t of src[i * SW + t * step], for i < n; SW is a constant at the call sites
 * below, so that the compiler vectorizes the strided reads, and so is is_max. Two or three taps
 * (most windows) go in one pass, more in one pass per tap. */
static OMRT_INLINE void pool_taps(float *dst, const float *src, int64_t n, int64_t SW, int64_t taps, int64_t step,
                             int64_t is_max) {
    if (taps == 2) {
        for (int64_t i = 0; i < n; i++) dst[i] = pool_step(src[i * SW], src[i * SW + step], is_max);
        return;
    }
    if (taps == 3) {
        for (int64_t i = 0; i < n; i++) {
            const float *at = src + i * SW;
            dst[i] = pool_step(pool_step(at[0], at[step], is_max), at[2 * step], is_max);
        }
        return;
    }
    for (int64_t i = 0; i < n; i++) dst[i] = src[i * SW];
    for (int64_t t = 1; t < taps; t++)
        for (int64_t i = 0; i < n; i++) dst[i] = pool_step(dst[i], src[i * SW + t * step], is_max);
}

static OMRT_INLINE void pool_taps_any(float *dst, const float *src, int64_t n, int64_t SW, int64_t taps, int64_t step,
                                 int64_t is_max) {
    if (is_max) {
        if (SW == 1) pool_taps(dst, src, n, 1, taps, step, 1);
        else if (SW == 2) pool_taps(dst, src, n, 2, taps, step, 1);
        else pool_taps(dst, src, n, SW, taps, step, 1);
    } else {
        if (SW == 1) pool_taps(dst, src, n, 1, taps, step, 0);
        else if (SW == 2) pool_taps(dst, src, n, 2, taps, step, 0);
        else pool_taps(dst, src, n, SW, taps, step, 0);
    }
}

/* OH output rows of a plane (a band of them: PT < 0 starts below the plane's top) in a few long
 * loops over their padded rows (see pad_band), however short the rows: the grid's width is a
 * multiple of SW, so its columns pool in one flat pass (SW apart, Wq = Wp / SW results per row),
 * and the rows of those in another, each output row SH * Wq apart (the results between them are
 * computed and dropped). 0 when the plane holds a NaN: the row path then propagates it. */
static OMRT_INLINE int pool_plane(const float *xp, float *yp, const float *inv_count, float *scratch, int64_t H,
                                  int64_t W, int64_t OH, int64_t OW, int64_t KH, int64_t KW, int64_t SH, int64_t SW,
                                  int64_t DH, int64_t DW, int64_t PT, int64_t PL, int64_t is_max) {
    const int64_t Wq = ((OW - 1) * SW + (KW - 1) * DW + SW) / SW, Wp = Wq * SW,
                  Hp = (OH - 1) * SH + (KH - 1) * DH + 1, tail = (KW - 1) * DW;
    const int64_t grid = Hp * Wp + tail, out = OH * SH * Wq;
    float *pad = scratch, *cols = scratch + (grid > out ? grid : out), fill = is_max ? -INFINITY : 0.0f;
    pad_band(xp, pad, fill, H, W, Hp, Wp, tail, PT, PL);
    if (is_max && holds_nan(pad, grid)) return 0;
    pool_taps_any(cols, pad, Hp * Wq, SW, KW, DW, is_max);
    for (int64_t i = Hp * Wq; i < (Hp + SH - 1) * Wq; i++) cols[i] = fill;
    pool_taps_any(pad, cols, out, 1, KH, DH * Wq, is_max);
    for (int64_t oh = 0; oh < OH; oh++) {
        float *yr = yp + oh * OW;
        const float *src = pad + oh * SH * Wq;
        if (is_max) {
            memcpy(yr, src, (size_t)OW * sizeof(float));
        } else {
            const float *inv = inv_count + oh * OW;
            for (int64_t ow = 0; ow < OW; ow++) yr[ow] = src[ow] * inv[ow];
        }
    }
    return 1;
}

typedef struct {
    const float *x, *inv_count;
    float *y, *scratch;
    int64_t planes, parts, pitch, H, W, OH, OW, KH, KW, SH, SW, DH, DW, PT, PL, is_max;
    int64_t band; /* output rows per item of the lanes path */
} pool_job;

/* Floats of scratch a band of `rows` output rows of 16 planes takes on the lanes path: its
 * input rows interleaved, `wide` columns from -PL, its results, and a row of column results. */
static inline int64_t pool_lanes_floats(const pool_job *j, int64_t rows) {
    const int64_t in_rows = (rows - 1) * j->SH + (j->KH - 1) * j->DH + 1;
    const int64_t wide = (j->OW - 1) * j->SW + (j->KW - 1) * j->DW + 1;
    return OMRT_LANES * ((in_rows + 1) * wide + rows * j->OW);
}

#ifdef OMRT_X86
/* The 16-planes path is built for AVX-512 and AVX2 alone, the CPUs it pays on, each at its
 * vector width (pool_lanes.h): GCC's generic lowering of its vectors for older ones took ten
 * times the rest of this file to compile. */
typedef int32_t pool_mask_vec __attribute__((vector_size(OMRT_LANES * sizeof(int32_t))));
typedef int32_t pool_mask_half __attribute__((vector_size(OMRT_LANES / 2 * sizeof(int32_t))));

#define POOL_VEC omrt_lanes_vec
#define POOL_MASK pool_mask_vec
#define POOL_NAME(f) f##_16
#define POOL_TARGET OMRT_AVX512
#define POOL_GATHER omrt_lanes_gather_avx512
#define POOL_SCATTER omrt_lanes_scatter_avx512
#define POOL_MAX(a, b) _mm512_max_ps((__m512)(a), (__m512)(b))
#include "pool_lanes.h"
#define POOL_VEC omrt_lanes_half
#define POOL_MASK pool_mask_half
#define POOL_NAME(f) f##_8
#define POOL_TARGET OMRT_AVX2
#define POOL_GATHER omrt_lanes_gather_avx2
#define POOL_SCATTER omrt_lanes_scatter_avx2
#define POOL_MAX(a, b) _mm256_max_ps((__m256)(a), (__m256)(b))
#include "pool_lanes.h"

/* Output columns the vector path takes in a row at most: the column maxima of the row's windows
 * (VECTOR_COLS floats) are kept on the thread's stack. */
#define VECTOR_MAX_OUT 1024
#define VECTOR_COLS (2 * VECTOR_MAX_OUT + 3 * OMRT_LANES)

/* Columns [0, n) of the column buffer a row of the vector path reads: up to the last vector of
 * outputs' furthest tap (stride 2: its even and odd lanes, and the lane after them). */
static inline int64_t vector_cols(const pool_job *j) {
    const int64_t vectors = (j->OW + OMRT_LANES - 1) / OMRT_LANES * OMRT_LANES;
    return j->SW == 2 ? 2 * vectors + OMRT_LANES : vectors + (j->KW - 1) * j->DW;
}

/* Whether a max pool can take the vector path (vector_part): stride 1 along rows, or stride 2
 * with the taps of a window at columns 0, 1 or 2 of its start (windows 3 or 2 wide, undilated; 2
 * wide dilated by 2; 1 wide), and rows whose column maxima fit VECTOR_COLS. Which pools ask for
 * it: omrt.kernels.pool (vector_rows). */
static inline int vector_path(const pool_job *j) {
    const int strided = j->SW == 2 && (j->KW - 1) * j->DW <= 2;
    return j->is_max && (j->SW == 1 || strided) && j->OW <= VECTOR_MAX_OUT &&
           j->PL + vector_cols(j) + OMRT_LANES <= VECTOR_COLS;
}

/* The max over TAPS input rows (`step` apart from src) of 16 columns, the lanes outside `in`
 * -inf when `masked`; the lanes where a value read is a NaN (which the max drops) are added to
 * `nan`: one compare per pair of rows. */
OMRT_AVX512 static OMRT_INLINE __m512 column_vector(const float *src, int64_t TAPS, int64_t step, int masked,
                                                   __mmask16 in, __mmask16 *nan) {
    const __m512 fill = _mm512_set1_ps(-INFINITY);
    __m512 acc = fill;
    for (int64_t t = 0; t < TAPS; t += 2) {
        const __m512 a = masked ? _mm512_mask_loadu_ps(fill, in, src + t * step) : _mm512_loadu_ps(src + t * step);
        __m512 m = a;
        if (t + 1 < TAPS) {
            const __m512 b = masked ? _mm512_mask_loadu_ps(fill, in, src + (t + 1) * step)
                                    : _mm512_loadu_ps(src + (t + 1) * step);
            *nan |= _mm512_cmp_ps_mask(a, b, _CMP_UNORD_Q);
            m = _mm512_max_ps(a, b);
        } else {
            *nan |= _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q);
        }
        acc = t ? _mm512_max_ps(acc, m) : m;
    }
    return acc;
}

/* col[i] = the max over TAPS input rows (`step` apart from src) of column i, for i < n, and -inf
 * up to the next multiple of 16: whole vectors are stored, since a load waits for a masked store
 * before it to retire where it would take an unmasked one's value at once. Nonzero when a value
 * read is a NaN. TAPS is a constant at the common call sites (column_maxima), so that the loop
 * over it unrolls. */
OMRT_AVX512 static OMRT_INLINE int column_maxima_fixed(const float *src, int64_t n, int64_t TAPS, int64_t step,
                                                       float *col) {
    __mmask16 nan = 0;
    int64_t i = 0;
    for (; i + OMRT_LANES <= n; i += OMRT_LANES)
        _mm512_storeu_ps(col + i, column_vector(src + i, TAPS, step, 0, 0xffff, &nan));
    if (i < n)
        _mm512_storeu_ps(col + i, column_vector(src + i, TAPS, step, 1, omrt_lane_mask(0, n - i), &nan));
    return nan != 0;
}

OMRT_AVX512 static int column_maxima(const float *src, int64_t n, int64_t taps, int64_t step, float *col) {
    if (taps == 3) return column_maxima_fixed(src, n, 3, step, col);
    if (taps == 2) return column_maxima_fixed(src, n, 2, step, col);
    return column_maxima_fixed(src, n, taps, step, col);
}

/* yr[o] = the max over the window's taps of col[o * SW + kw * DW], for o < OW (col 64-byte
 * aligned, read up to vector_cols). At stride 2 the taps are picked from two vectors of column
 * maxima: their even lanes, their odd ones, and the even ones one further on. SW, KW and DW are
 * constants at the common call sites (row_maxima), so that the loop over the taps unrolls. */
OMRT_AVX512 static OMRT_INLINE void row_maxima_fixed(const float *col, float *yr, int64_t OW, int64_t SW, int64_t KW,
                                                     int64_t DW) {
    const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
    __m512 lo = _mm512_load_ps(col);
    for (int64_t o = 0; o < OW; o += OMRT_LANES) {
        const __mmask16 out = OW - o >= OMRT_LANES ? (__mmask16)0xffff : omrt_lane_mask(0, OW - o);
        __m512 acc;
        if (SW == 1) {
            acc = _mm512_loadu_ps(col + o);
            for (int64_t kw = 1; kw < KW; kw++) acc = _mm512_max_ps(acc, _mm512_loadu_ps(col + o + kw * DW));
        } else {
            const __m512 hi = _mm512_load_ps(col + 2 * o + OMRT_LANES);
            const __m512 next = _mm512_load_ps(col + 2 * o + 2 * OMRT_LANES);
            const __m512 first = _mm512_permutex2var_ps(lo, even, hi); /* columns 2o, 2o + 2, ... */
            acc = first;
            for (int64_t kw = 1; kw < KW; kw++) /* columns 2o + 1, 2o + 3, ... or 2o + 2, 2o + 4, ... */
                acc = _mm512_max_ps(acc, kw * DW == 1 ? _mm512_permutex2var_ps(lo, odd, hi)
                                                      : _mm512_castsi512_ps(_mm512_alignr_epi32(
                                                            _mm512_castps_si512(next), _mm512_castps_si512(first), 1)));
            lo = next;
        }
        _mm512_mask_storeu_ps(yr + o, out, acc);
    }
}

OMRT_AVX512 static void row_maxima(const pool_job *j, const float *col, float *yr) {
    const int64_t SW = j->SW, KW = j->KW, DW = j->DW, OW = j->OW;
    if (SW == 2 && KW == 3 && DW == 1) row_maxima_fixed(col, yr, OW, 2, 3, 1);
    else if (SW == 2 && KW == 2 && DW == 1) row_maxima_fixed(col, yr, OW, 2, 2, 1);
    else if (SW == 1 && KW == 3 && DW == 1) row_maxima_fixed(col, yr, OW, 1, 3, 1);
    else row_maxima_fixed(col, yr, OW, SW, KW, DW);
}

/* The maxima over `taps` input rows (`step` apart from src) of columns [0, n) into col, -inf up
 * to the next whole vector; nonzero when a value read is a NaN. */
typedef int (*column_maxima_fn)(const float *src, int64_t n, int64_t taps, int64_t step, float *col);

/* yr[o] = the max over the window's taps of the column maxima `col`, for o < OW. */
typedef void (*row_maxima_fn)(const pool_job *j, const float *col, float *yr);

/* Planes part `item` of a max pool of the vector path (vector_path), row by row: the maxima of
 * each column over the rows a window reads (column_maxima) into a buffer on the stack, -inf where
 * that is padding, then the windows along the row from them (row_maxima), at the width of the
 * two given (inlined into each caller, with its ISA). The windows of a row whose input rows hold
 * a NaN get it (nan_windows). */
static OMRT_INLINE void vector_rows(const pool_job *j, int64_t item, column_maxima_fn column_maxima,
                                    row_maxima_fn row_maxima) {
    float col[VECTOR_COLS] __attribute__((aligned(64)));
    const int64_t n = vector_cols(j), inside = j->W < n - j->PL ? j->W : n - j->PL;
    for (int64_t i = 0; i < n; i++) col[i] = -INFINITY;
    int64_t lo[j->KW], hi[j->KW];
    for (int64_t kw = 0; kw < j->KW; kw++) omrt_span(kw * j->DW - j->PL, j->W, j->SW, j->OW, &lo[kw], &hi[kw]);
    for (int64_t p = omrt_part(j->planes, j->parts, item); p < omrt_part(j->planes, j->parts, item + 1); p++) {
        const float *xp = j->x + p * j->H * j->W;
        float *yp = j->y + p * j->OH * j->OW;
        for (int64_t oh = 0; oh < j->OH; oh++) {
            int64_t first = 0, taps = 0; /* the rows inside the plane: a run of the window's */
            for (int64_t kh = 0; kh < j->KH; kh++) {
                const int64_t ih = oh * j->SH + kh * j->DH - j->PT;
                if (ih >= 0 && ih < j->H) first = taps++ ? first : ih;
            }
            const int nan = column_maxima(xp + first * j->W, inside, taps, j->DH * j->W, col + j->PL);
            row_maxima(j, col, yp + oh * j->OW);
            if (nan)
                nan_windows(yp + oh * j->OW, xp, lo, hi, oh, j->H, j->W, j->KH, j->KW, j->SH, j->SW, j->DH, j->DW,
                            j->PT, j->PL);
        }
    }
}

OMRT_AVX512 static void vector_part(void *p, int64_t item, int64_t thread) {
    (void)thread;
    vector_rows(p, item, column_maxima, row_maxima);
}

/* column_vector, 8 columns: the max over TAPS rows, the lanes outside `in` -inf; the lanes where a
 * value read is a NaN are or-ed into `nan`. */
OMRT_AVX2 static OMRT_INLINE __m256 column_vector8(const float *src, int64_t TAPS, int64_t step, int masked,
                                                   __m256i in, __m256 *nan) {
    const __m256 fill = _mm256_set1_ps(-INFINITY);
    __m256 acc = fill;
    for (int64_t t = 0; t < TAPS; t += 2) {
        const __m256 a = masked ? _mm256_blendv_ps(fill, _mm256_maskload_ps(src + t * step, in),
                                                   _mm256_castsi256_ps(in))
                                : _mm256_loadu_ps(src + t * step);
        __m256 m = a;
        if (t + 1 < TAPS) {
            const __m256 b = masked ? _mm256_blendv_ps(fill, _mm256_maskload_ps(src + (t + 1) * step, in),
                                                       _mm256_castsi256_ps(in))
                                    : _mm256_loadu_ps(src + (t + 1) * step);
            *nan = _mm256_or_ps(*nan, _mm256_cmp_ps(a, b, _CMP_UNORD_Q));
            m = _mm256_max_ps(a, b);
        } else {
            *nan = _mm256_or_ps(*nan, _mm256_cmp_ps(a, a, _CMP_UNORD_Q));
        }
        acc = t ? _mm256_max_ps(acc, m) : m;
    }
    return acc;
}

/* column_maxima_fixed, 8 columns at a time. */
OMRT_AVX2 static OMRT_INLINE int column_maxima8_fixed(const float *src, int64_t n, int64_t TAPS, int64_t step,
                                                      float *col) {
    __m256 nan = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(col + i, column_vector8(src + i, TAPS, step, 0, _mm256_setzero_si256(), &nan));
    if (i < n) _mm256_storeu_ps(col + i, column_vector8(src + i, TAPS, step, 1, omrt_lanes8(n - i), &nan));
    return _mm256_movemask_ps(nan) != 0;
}

OMRT_AVX2 static int column_maxima8(const float *src, int64_t n, int64_t taps, int64_t step, float *col) {
    if (taps == 3) return column_maxima8_fixed(src, n, 3, step, col);
    if (taps == 2) return column_maxima8_fixed(src, n, 2, step, col);
    return column_maxima8_fixed(src, n, taps, step, col);
}

/* row_maxima_fixed, 8 outputs at a time. At stride 2 the taps are the even lanes of two vectors of
 * column maxima, their odd ones, and the even ones two columns on, each picked within 128-bit
 * halves (one shuffle: the outputs come out in the order 0 1 4 5 2 3 6 7, the same for every tap)
 * and put in order once for all of them. */
OMRT_AVX2 static OMRT_INLINE void row_maxima8_fixed(const float *col, float *yr, int64_t OW, int64_t SW, int64_t KW,
                                                    int64_t DW) {
    for (int64_t o = 0; o < OW; o += 8) {
        __m256 acc;
        if (SW == 1) {
            acc = _mm256_loadu_ps(col + o);
            for (int64_t kw = 1; kw < KW; kw++) acc = _mm256_max_ps(acc, _mm256_loadu_ps(col + o + kw * DW));
        } else {
            const float *at = col + 2 * o;
            const __m256 lo = _mm256_loadu_ps(at), hi = _mm256_loadu_ps(at + 8);
            acc = _mm256_shuffle_ps(lo, hi, 0x88); /* columns 2o, 2o + 2, ... */
            for (int64_t kw = 1; kw < KW; kw++) {
                const __m256 next = kw * DW == 1 /* 2o + 1, 2o + 3, ..., or 2o + 2, 2o + 4, ... */
                                        ? _mm256_shuffle_ps(lo, hi, 0xDD)
                                        : _mm256_shuffle_ps(_mm256_loadu_ps(at + 2), _mm256_loadu_ps(at + 10), 0x88);
                acc = _mm256_max_ps(acc, next);
            }
            acc = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(acc), 0xD8));
        }
        omrt_store8(yr + o, omrt_lanes8(OW - o), OW - o >= 8, acc);
    }
}

OMRT_AVX2 static void row_maxima8(const pool_job *j, const float *col, float *yr) {
    const int64_t SW = j->SW, KW = j->KW, DW = j->DW, OW = j->OW;
    if (SW == 2 && KW == 3 && DW == 1) row_maxima8_fixed(col, yr, OW, 2, 3, 1);
    else if (SW == 2 && KW == 2 && DW == 1) row_maxima8_fixed(col, yr, OW, 2, 2, 1);
    else if (SW == 1 && KW == 3 && DW == 1) row_maxima8_fixed(col, yr, OW, 1, 3, 1);
    else row_maxima8_fixed(col, yr, OW, SW, KW, DW);
}

OMRT_AVX2 static void vector_part8(void *p, int64_t item, int64_t thread) {
    (void)thread;
    vector_rows(p, item, column_maxima8, row_maxima8);
}

/* Planes at most this wide, with rows of at most this many outputs, can pool each row in one
 * register (register_part). */
#define REGISTER_ROW OMRT_LANES

/* Whether a pool can take the register path: its planes' rows, its output rows and its windows'
 * width fit one vector. Which pools ask for it: omrt.kernels.pool (REGISTER_ROW). */
static inline int register_path(const pool_job *j) {
    return j->W <= REGISTER_ROW && j->OW <= REGISTER_ROW && j->KW <= REGISTER_ROW;
}

/* One tap: the sum, or the max, which a NaN in either operand wins (numpy's maximum). */
OMRT_AVX512 static OMRT_INLINE __m512 register_step(__m512 acc, __m512 v, int is_max) {
    if (!is_max) return _mm512_add_ps(acc, v);
    const __m512 top = _mm512_max_ps(acc, v); /* v when either is a NaN */
    return _mm512_mask_mov_ps(top, _mm512_cmp_ps_mask(acc, acc, _CMP_UNORD_Q), acc);
}

/* The planes of part `item`, each output row in one register: the window's KH input rows (each
 * one masked load) pooled lane by lane, then its KW taps along the row picked by permutes
 * (`at[kw]`, lanes outside the plane off in `valid[kw]`), averages scaled by their divisors. */
OMRT_AVX512 static OMRT_INLINE void register_planes(const pool_job *j, int64_t item, const __m512i *at,
                                                    const __mmask16 *valid, int is_max, int64_t KH, int64_t KW) {
    const __m512 fill = _mm512_set1_ps(is_max ? -INFINITY : 0.0f);
    const __mmask16 row = omrt_lane_mask(0, j->W), out = omrt_lane_mask(0, j->OW);
    for (int64_t p = omrt_part(j->planes, j->parts, item); p < omrt_part(j->planes, j->parts, item + 1); p++) {
        const float *xp = j->x + p * j->H * j->W;
        float *yp = j->y + p * j->OH * j->OW;
        for (int64_t oh = 0; oh < j->OH; oh++) {
            __m512 rows = fill, taps = fill;
            for (int64_t kh = 0; kh < KH; kh++) {
                const int64_t ih = oh * j->SH + kh * j->DH - j->PT;
                if (ih >= 0 && ih < j->H)
                    rows = register_step(rows, _mm512_mask_loadu_ps(fill, row, xp + ih * j->W), is_max);
            }
            for (int64_t kw = 0; kw < KW; kw++)
                taps = register_step(taps, _mm512_mask_permutexvar_ps(fill, valid[kw], at[kw], rows), is_max);
            if (!is_max) taps = _mm512_mul_ps(taps, _mm512_maskz_loadu_ps(out, j->inv_count + oh * j->OW));
            _mm512_mask_storeu_ps(yp + oh * j->OW, out, taps);
        }
    }
}

/* Planes part `item` of a pool of the register path (register_path), with AVX-512. */
OMRT_AVX512 static void register_part(void *p, int64_t item, int64_t thread) {
    const pool_job *j = p;
    (void)thread;
    __m512i at[REGISTER_ROW];
    __mmask16 valid[REGISTER_ROW];
    for (int64_t kw = 0; kw < j->KW; kw++) {
        int32_t column[REGISTER_ROW] = {0};
        valid[kw] = 0;
        for (int64_t o = 0; o < j->OW; o++) {
            const int64_t c = o * j->SW + kw * j->DW - j->PL;
            if (c >= 0 && c < j->W) {
                column[o] = (int32_t)c;
                valid[kw] |= (__mmask16)(1u << o);
            }
        }
        at[kw] = _mm512_loadu_si512(column);
    }
    const int square3 = j->KH == 3 && j->KW == 3; /* most windows: their loops unrolled */
    if (j->is_max)
        square3 ? register_planes(j, item, at, valid, 1, 3, 3) : register_planes(j, item, at, valid, 1, j->KH, j->KW);
    else
        square3 ? register_planes(j, item, at, valid, 0, 3, 3) : register_planes(j, item, at, valid, 0, j->KH, j->KW);
}

#endif

/* Output columns [o0, o1) of a row from its input rows pooled in `pooled`, tap by tap, only the
 * taps inside the row: the columns whose window reaches into the padding. */
static OMRT_INLINE void pool_edge(const pool_job *j, float *yr, const float *pooled, int64_t o0, int64_t o1,
                                  const int64_t *lo, const int64_t *hi) {
    for (int64_t ow = o0; ow < o1; ow++) {
        float acc = j->is_max ? -INFINITY : 0.0f;
        for (int64_t kw = 0; kw < j->KW; kw++)
            if (ow >= lo[kw] && ow < hi[kw]) acc = pool_step(acc, pooled[ow * j->SW + kw * j->DW - j->PL], j->is_max);
        yr[ow] = acc;
    }
}

/* A plane by the row path: each output row's input rows pooled into scratch (W floats), then its
 * columns, each in one pass (pool_taps); only the columns whose window reaches into the padding
 * take the taps one by one. The max drops NaNs: an output row whose input rows hold one
 * (max_rows_checked) has its windows that read one set to it (nan_windows). */
static OMRT_INLINE void pool_rows(const pool_job *j, const float *xp, float *yp, const float *inv_count,
                                  float *scratch, const int64_t *lo, const int64_t *hi) {
    const int64_t H = j->H, W = j->W, OH = j->OH, OW = j->OW, KH = j->KH, KW = j->KW, SH = j->SH, SW = j->SW,
                  DH = j->DH, DW = j->DW, PT = j->PT, PL = j->PL, is_max = j->is_max;
    const float init = is_max ? -INFINITY : 0.0f;
    int64_t in_lo = 0, in_hi = OW;
    for (int64_t kw = 0; kw < KW; kw++) {
        in_lo = lo[kw] > in_lo ? lo[kw] : in_lo;
        in_hi = hi[kw] < in_hi ? hi[kw] : in_hi;
    }
    if (in_hi < in_lo) in_hi = in_lo;
    for (int64_t oh = 0; oh < OH; oh++) {
        int64_t first = -1, taps = 0; /* the rows inside the plane: a run of the window's */
        for (int64_t kh = 0; kh < KH; kh++) {
            const int64_t ih = oh * SH + kh * DH - PT;
            if (ih >= 0 && ih < H) {
                first = first < 0 ? ih : first;
                taps++;
            }
        }
        int nan = 0; /* the row's input rows hold a NaN */
        if (taps && is_max)
            nan = max_rows_checked(scratch, xp + first * W, W, taps, DH * W);
        else if (taps)
            pool_taps_any(scratch, xp + first * W, W, 1, taps, DH * W, 0);
        else
            for (int64_t iw = 0; iw < W; iw++) scratch[iw] = init;
        float *yr = yp + oh * OW;
        pool_taps_any(yr + in_lo, scratch + in_lo * SW - PL, in_hi - in_lo, SW, KW, DW, is_max);
        pool_edge(j, yr, scratch, 0, in_lo, lo, hi);
        pool_edge(j, yr, scratch, in_hi, OW, lo, hi);
        if (!is_max) {
            const float *inv = inv_count + oh * OW;
            for (int64_t ow = 0; ow < OW; ow++) yr[ow] *= inv[ow];
        } else if (nan) {
            nan_windows(yr, xp, lo, hi, oh, H, W, KH, KW, SH, SW, DH, DW, PT, PL);
        }
    }
}

static OMRT_HOT void pool_part(void *p, int64_t item, int64_t thread) {
    const pool_job *j = p;
    const int64_t H = j->H, W = j->W, OH = j->OH, OW = j->OW, KH = j->KH, KW = j->KW, SH = j->SH, SW = j->SW,
                  DH = j->DH, DW = j->DW, PT = j->PT, PL = j->PL, is_max = j->is_max;
    const float *inv_count = j->inv_count;
    float *scratch = j->scratch + thread * j->pitch;
    int64_t band = OH;
    while (band > 0 && pool_plane_floats(band, OW, KH, KW, SH, SW, DH, DW) > j->pitch) band--;
    int64_t lo[KW], hi[KW];
    for (int64_t kw = 0; kw < KW; kw++) omrt_span(kw * DW - PL, W, SW, OW, &lo[kw], &hi[kw]);
    for (int64_t p = omrt_part(j->planes, j->parts, item); p < omrt_part(j->planes, j->parts, item + 1); p++) {
        const float *xp = j->x + p * H * W;
        float *yp = j->y + p * OH * OW;
        int banded = band > 0;
        for (int64_t o0 = 0; banded && o0 < OH; o0 += band)
            banded = pool_plane(xp, yp + o0 * OW, is_max ? NULL : inv_count + o0 * OW, scratch, H, W,
                                OH - o0 < band ? OH - o0 : band, OW, KH, KW, SH, SW, DH, DW, PT - o0 * SH, PL, is_max);
        if (!banded) pool_rows(j, xp, yp, inv_count, scratch, lo, hi);
    }
}

/* y[p] = pool of x[p] for each of the `planes` planes, split over `threads` threads, on the path
 * asked for where the CPU has it (elsewhere `path` is ignored). With `path` 3 and AVX-512, planes
 * whose rows fit a vector (register_path) go row by row, each in one register (register_part).
 * With `path` 2 and AVX2 or AVX-512, a max pool whose geometry allows (vector_path) goes row by
 * row, each row's column maxima over its window's rows first (vector_part, vector_part8). With
 * `path` 1 (or 3 without AVX-512) and AVX2 or AVX-512, planes go 16 at a time in bands of output
 * rows (lanes_part_8, lanes_part_16), the widest whose pool_lanes_floats `pitch` holds. Otherwise, or where `pitch`
 * does not hold one row of those, planes pool in bands of output rows, each in a few flat passes
 * over a padded copy (pool_plane), the widest band whose pool_plane_floats `pitch` holds; where
 * not even one row fits (pitch is at least W), one output row at a time: the rows its windows
 * read are first reduced into scratch (W floats), then the columns.
 * Each thread's scratch is `pitch` floats after the previous one's. `inv_count` (OH*OW) holds
 * 1 / the divisor of each window for average pooling (ignored for max). Reads outside the input
 * are padding: -inf for max, nothing for average (the divisor says whether pads count). */
OMRT_EXPORT void omrt_pool2d_f32(const float *x, float *y, const float *inv_count, float *scratch, int64_t pitch,
                                 int64_t threads, int64_t planes, int64_t H, int64_t W, int64_t OH, int64_t OW,
                                 int64_t KH, int64_t KW, int64_t SH, int64_t SW, int64_t DH, int64_t DW, int64_t PT,
                                 int64_t PL, int64_t is_max, int64_t path) {
    pool_job j = {x, inv_count, y, scratch, planes, threads < planes ? threads : planes, pitch, H, W, OH, OW, KH,
                  KW, SH, SW, DH, DW, PT, PL, is_max, 0};
#ifdef OMRT_X86
    if (path == 3 && register_path(&j) && omrt_gemm_level_once() == 2) {
        omrt_parallel(register_part, &j, j.parts, threads);
        return;
    }
    if (path == 2 && vector_path(&j) && omrt_gemm_level_once() >= 1) {
        omrt_parallel(omrt_gemm_level_once() == 2 ? vector_part : vector_part8, &j, j.parts, threads);
        return;
    }
    if ((path == 1 || path == 3) && omrt_gemm_level_once() >= 1) /* 3: the register path needs AVX-512 */
        for (j.band = OH; j.band > 0 && pool_lanes_floats(&j, j.band) > pitch;) j.band--;
    if (j.band > 0) {
        omrt_parallel(omrt_gemm_level_once() == 2 ? lanes_part_16 : lanes_part_8, &j,
                      (planes + OMRT_LANES - 1) / OMRT_LANES * ((OH + j.band - 1) / j.band), j.parts);
        return;
    }
#else
    (void)path;
#endif
    omrt_parallel(pool_part, &j, j.parts, threads);
}

typedef struct {
    const float *x;
    float *y;
    int64_t planes, size, parts, is_max;
} global_job;

/* The planes of one part: sums in eight double lanes (numpy's mean is no less exact), or the
 * maximum, which a NaN wins as in numpy. */
OMRT_HOT static void global_part(void *ctx, int64_t part, int64_t thread) {
    (void)thread;
    const global_job *j = ctx;
    const int64_t n = j->size;
    for (int64_t p = omrt_part(j->planes, j->parts, part); p < omrt_part(j->planes, j->parts, part + 1); p++) {
        const float *xp = j->x + p * n;
        if (j->is_max) {
            float m = xp[0];
            for (int64_t i = 1; i < n; i++) m = (xp[i] > m || xp[i] != xp[i]) ? xp[i] : m;
            j->y[p] = m;
            continue;
        }
        double lanes[8] = {0};
        int64_t i = 0;
        for (; i + 8 <= n; i += 8)
            for (int64_t l = 0; l < 8; l++) lanes[l] += xp[i + l];
        double sum = 0;
        for (; i < n; i++) sum += xp[i];
        for (int64_t l = 0; l < 8; l++) sum += lanes[l];
        j->y[p] = (float)(sum / (double)n);
    }
}

/* y[p] = the mean (or maximum) of plane p's `size` floats, for the `planes` planes, split over
 * `threads` threads: GlobalAveragePool and GlobalMaxPool. */
OMRT_EXPORT void omrt_global_pool_f32(const float *x, float *y, int64_t planes, int64_t size, int64_t is_max,
                                      int64_t threads) {
    global_job j = {x, y, planes, size, threads < planes ? threads : planes, is_max};
    omrt_parallel(global_part, &j, j.parts, threads);
}
