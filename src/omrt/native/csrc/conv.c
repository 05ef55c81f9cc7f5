/* Convolution loops: depthwise 2-D convolution (every output channel reads one input channel),
 * and the im2col gather of the dense layers that BLAS then multiplies. */
#include "omrt_lanes.h"

/* Layers run 16 channels at a time, one vector lane each: a band of output rows of 16 planes is
 * copied, zero-padded, into scratch with the channels interleaved, every output pixel is then one
 * vector per tap (a 7x7 plane with a 5x5 window keeps all 16 lanes busy, where a loop along the
 * plane's rows would not; a strided window reads whole vectors, where along the rows it would
 * gather), and the band is copied back into the 16 output planes. Without AVX2 those copies go
 * element by element, and planes of at least DW_WIDE_PLANE output columns run plane by plane
 * instead (below): their rows are long enough for vectors. So do they when the caller's scratch
 * holds only the bands of that path (a plan an older omrt made). */
#define DW_WIDE_PLANE 16

typedef struct {
    const float *x, *w, *bias;
    float *y, *scratch;
    int64_t pitch, band, bands, blocks, parts, N, M, mult, H, W, OH, OW, KH, KW, SH, SW, DH, DW, PT, PL, act;
    float alpha, beta;
} dw_job;

/* Wide planes go a band of output rows at a time, every tap one flat loop over the whole band:
 * the band's padded input is first split into SH x SW phases (phase (a, b) holds the padded rows
 * a, a + SH, ... and in them the columns b, b + SW, ...), Wq = wide / SW columns each, so that tap
 * (kh, kw) reads one phase at one offset for every output pixel. Output rows come out Wq apart
 * (the columns past OW are computed and dropped). Stride 1 is one phase: the padded band. */
static inline int64_t dw_phase_width(const dw_job *j) {
    return ((j->OW - 1) * j->SW + (j->KW - 1) * j->DW + j->SW) / j->SW;
}

/* Phase (a, b) of the padded input rows from `top` (may be < 0: padding) of plane xp: Hq rows of
 * Wq columns, then `tail` zeros; SW is a constant at the call sites. */
static OMRT_INLINE void dw_phase(const dw_job *j, const float *xp, float *ph, int64_t top, int64_t a, int64_t b,
                                 int64_t Hq, int64_t Wq, int64_t tail, int64_t SW) {
    const int64_t SH = j->SH, first = j->PL - b > 0 ? (j->PL - b + SW - 1) / SW : 0;
    const int64_t end = (j->W + j->PL - b + SW - 1) / SW, last = end < Wq ? end : Wq;
    for (int64_t r = 0; r < Hq; r++, ph += Wq) {
        const int64_t ih = top + r * SH + a;
        if (ih < 0 || ih >= j->H || last <= first) {
            for (int64_t c = 0; c < Wq; c++) ph[c] = 0.0f;
            continue;
        }
        const float *row = xp + ih * j->W;
        const int64_t shift = b - j->PL;
        for (int64_t c = 0; c < first; c++) ph[c] = 0.0f;
        for (int64_t c = first; c < last; c++) ph[c] = row[c * SW + shift];
        for (int64_t c = last; c < Wq; c++) ph[c] = 0.0f;
    }
    for (int64_t i = 0; i < tail; i++) ph[i] = 0.0f;
}

/* Elements of the wide path's sums kept in registers through all the taps (eight vectors of 8):
 * summing tap by tap over the whole band would load and store every sum at each tap. */
#define DW_CHUNK 64

/* Taps of the wide path whose weights are spread over vectors at a time, on the stack (a window
 * may have up to MAX_TAPS). */
#define DW_TAP_BLOCK 32

/* acc[i] = b + sum over taps t of w[t] * phases[at[t] + i] for i < L (the wide path's band), DW_CHUNK
 * sums at a time kept in registers through DW_TAP_BLOCK taps (all of a common window's); the last
 * L % DW_CHUNK a plain loop. Each weight is spread over a vector once per band, not in the loop.
 * 8 floats a vector (omrt_lanes_half): the wide path runs where the CPU lacks AVX2 (or a plan an
 * older omrt made asks for it). */
static OMRT_INLINE void dw_sums(const float *phases, const int64_t *at, const float *w, int64_t taps, float b,
                                int64_t L, float *acc) {
    enum { VL = sizeof(omrt_lanes_half) / sizeof(float) };
    const int64_t whole = L - L % DW_CHUNK;
    omrt_lanes_half wv[DW_TAP_BLOCK], bv;
    for (int64_t l = 0; l < VL; l++) bv[l] = b;
    for (int64_t t0 = 0; t0 < taps; t0 += DW_TAP_BLOCK) {
        const int64_t t1 = t0 + DW_TAP_BLOCK < taps ? t0 + DW_TAP_BLOCK : taps;
        for (int64_t t = t0; t < t1; t++)
            for (int64_t l = 0; l < VL; l++) wv[t - t0][l] = w[t];
        for (int64_t i = 0; i < whole; i += DW_CHUNK) {
            omrt_lanes_half sum[DW_CHUNK / VL];
            for (int64_t k = 0; k < DW_CHUNK / VL; k++) sum[k] = t0 ? *(const omrt_lanes_half *)(acc + i + k * VL) : bv;
            for (int64_t t = t0; t < t1; t++) {
                const float *src = phases + at[t] + i;
                for (int64_t k = 0; k < DW_CHUNK / VL; k++)
                    sum[k] += wv[t - t0] * *(const omrt_lanes_half *)(src + k * VL);
            }
            for (int64_t k = 0; k < DW_CHUNK / VL; k++) *(omrt_lanes_half *)(acc + i + k * VL) = sum[k];
        }
    }
    for (int64_t e = whole; e < L; e++) acc[e] = b;
    for (int64_t t = 0; t < taps; t++)
        for (int64_t e = whole; e < L; e++) acc[e] += w[t] * phases[at[t] + e];
}

/* Output rows [o0, o0 + rows) of plane q (input plane xp, filter wp, bias b) through its phases, activated. */
static OMRT_INLINE void dw_band(const dw_job *j, const float *xp, const float *wp, float b, float *yp, float *scratch,
                                int64_t o0, int64_t rows) {
    const int64_t SH = j->SH, SW = j->SW, Wq = dw_phase_width(j), Hq = rows + (j->KH - 1) * j->DH / SH;
    const int64_t tail = (j->KW - 1) * j->DW / SW, size = Hq * Wq + tail, L = rows * Wq, top = o0 * SH - j->PT;
    for (int64_t a = 0; a < SH; a++)
        for (int64_t c = 0; c < SW; c++) {
            float *ph = scratch + (a * SW + c) * size;
            if (SW == 1) dw_phase(j, xp, ph, top, a, c, Hq, Wq, tail, 1);
            else if (SW == 2) dw_phase(j, xp, ph, top, a, c, Hq, Wq, tail, 2);
            else dw_phase(j, xp, ph, top, a, c, Hq, Wq, tail, SW);
        }
    float *acc = scratch + SH * SW * size;
    const int64_t taps = j->KH * j->KW;
    int64_t at[taps];
    for (int64_t kh = 0; kh < j->KH; kh++)
        for (int64_t kw = 0; kw < j->KW; kw++) {
            const int64_t ry = kh * j->DH, rx = kw * j->DW;
            at[kh * j->KW + kw] = (ry % SH * SW + rx % SW) * size + ry / SH * Wq + rx / SW;
        }
    dw_sums(scratch, at, wp, taps, b, L, acc);
    for (int64_t oh = 0; oh < rows; oh++)
        omrt_activate_into(yp + (o0 + oh) * j->OW, acc + oh * Wq, j->OW, j->act, j->alpha, j->beta);
}

/* Planes [part starts, next part starts) of the N x M, one by one, `band` output rows at a time
 * (wide planes). */
static OMRT_HOT void plane_part(void *p, int64_t item, int64_t thread) {
    const dw_job *j = p;
    float *scratch = j->scratch + thread * j->pitch;
    for (int64_t q = omrt_part(j->N * j->M, j->parts, item); q < omrt_part(j->N * j->M, j->parts, item + 1); q++) {
        int64_t n = q / j->M, m = q % j->M;
        const float *xp = j->x + (n * (j->M / j->mult) + m / j->mult) * j->H * j->W;
        float *yp = j->y + q * j->OH * j->OW;
        float b = j->bias ? j->bias[m] : 0.0f;
        for (int64_t o0 = 0; o0 < j->OH; o0 += j->band)
            dw_band(j, xp, j->w + m * j->KH * j->KW, b, yp, scratch, o0, j->OH - o0 < j->band ? j->OH - o0 : j->band);
    }
}

/* Output pixels of a row of the narrow path computed together, each its own chain of FMAs. */
#define DW_PIXELS 8

#define DW_VEC omrt_lanes_half
#define DW_NAME(f) f##_8
#define DW_TARGET OMRT_HOT_AVX2
#define DW_SPAN OMRT_LANES
#include "conv_lanes.h"
#define DW_VEC omrt_lanes_half
#define DW_NAME(f) f##_8_of_8
#define DW_TARGET OMRT_HOT_AVX2
#define DW_SPAN (OMRT_LANES / 2)
#include "conv_lanes.h"
#ifdef OMRT_X86
#define DW_VEC omrt_lanes_vec
#define DW_NAME(f) f##_16
#define DW_TARGET OMRT_AVX512
#define DW_SPAN OMRT_LANES
#include "conv_lanes.h"
#endif

/* Output rows [o0, o1) of the block of `lanes` channels from the gathered rows (see dw_rows), at
 * the CPU's width; 8 floats a vector, a block of at most 8 channels (a layer's last, of 24, 40,
 * 72 or 88) computes only its first 8 lanes, the others written as zeros. AVX2, one thread, AMD
 * Zen 4, one-layer models: 24 channels 3x3 stride 2 over 112x112 took 0.96 of the time, 8
 * channels over 56x56 0.86, 72 over 56x56 0.98-1.02; mobilenetv3's 88-channel layer 0.93. */
static void dw_compute(const dw_job *j, const float *in, int64_t wide, const float *tap, const float *bias,
                       int64_t o0, int64_t o1, float *out, int64_t lanes) {
#ifdef OMRT_X86
    if (omrt_gemm_level_once() == 2) {
        dw_compute_16(j, in, wide, tap, bias, o0, o1, out);
        return;
    }
#endif
    if (lanes <= OMRT_LANES / 2)
        dw_compute_8_of_8(j, in, wide, tap, bias, o0, o1, out);
    else
        dw_compute_8(j, in, wide, tap, bias, o0, o1, out);
}

/* Item (image, block of 16 channels, band of output rows) on the thread's scratch (narrow planes). */
static OMRT_HOT void block_part(void *p, int64_t item, int64_t thread) {
    const dw_job *j = p;
    const int64_t band = item % j->bands, block = item / j->bands % j->blocks, n = item / j->bands / j->blocks;
    const int64_t c0 = block * OMRT_LANES, lanes = j->M - c0 < OMRT_LANES ? j->M - c0 : OMRT_LANES;
    const int64_t o0 = band * j->band, o1 = o0 + j->band < j->OH ? o0 + j->band : j->OH;
    const int64_t rows = (o1 - o0 - 1) * j->SH + (j->KH - 1) * j->DH + 1;
    const int64_t wide = (j->OW - 1) * j->SW + (j->KW - 1) * j->DW + 1, taps = j->KH * j->KW;
    float *tap = j->scratch + thread * j->pitch, *in = tap + taps * OMRT_LANES, *out = in + rows * wide * OMRT_LANES;
    float bias[OMRT_LANES] = {0};
    const float *src[OMRT_LANES] = {0};
    float *dst[OMRT_LANES] = {0};
    for (int64_t l = 0; l < lanes; l++) {
        src[l] = j->x + (n * (j->M / j->mult) + (c0 + l) / j->mult) * j->H * j->W;
        dst[l] = j->y + (n * j->M + c0 + l) * j->OH * j->OW + o0 * j->OW;
    }
    for (int64_t l = 0; l < OMRT_LANES; l++) {
        for (int64_t t = 0; t < taps; t++) tap[t * OMRT_LANES + l] = l < lanes ? j->w[(c0 + l) * taps + t] : 0.0f;
        if (j->bias && l < lanes) bias[l] = j->bias[c0 + l];
    }
    const int64_t count = (o1 - o0) * j->OW;
    const omrt_lanes_source source = {j->H, j->W, j->PL, 0.0f};
    omrt_lanes_gather(&source, src, lanes, o0 * j->SH - j->PT, rows, wide, in);
    dw_compute(j, in, wide, tap, bias, o0, o1, out, lanes);
    omrt_activate(out, count * OMRT_LANES, j->act, j->alpha, j->beta);
    omrt_lanes_scatter(out, count, dst, lanes);
}

/* y (N x M planes of OH x OW): plane (n, m) reads input plane (n, m / mult) of x (N x M/mult
 * planes of H x W) with filter w[m] (KH x KW), adds bias[m] (when bias is not NULL) and applies
 * the fused activation `act`, over `threads` threads, each with `pitch` floats of scratch. Items
 * of 16 channels by `band` output rows (see block_part); wide planes, without AVX2 or unless
 * `lanes`, go plane by plane, `band` output rows at a time (see dw_band). */
OMRT_EXPORT void omrt_dwconv2d_f32(const float *x, const float *w, const float *bias, float *y, float *scratch,
                                   int64_t pitch, int64_t band, int64_t threads, int64_t lanes, int64_t N, int64_t M,
                                   int64_t mult,
                                   int64_t H, int64_t W, int64_t OH, int64_t OW, int64_t KH, int64_t KW, int64_t SH,
                                   int64_t SW, int64_t DH, int64_t DW, int64_t PT, int64_t PL, int64_t act,
                                   float alpha, float beta) {
    dw_job j = {x, w, bias, y, scratch, pitch, band, (OH + band - 1) / band, (M + OMRT_LANES - 1) / OMRT_LANES, 0, N, M,
                mult, H, W, OH, OW, KH, KW, SH, SW, DH, DW, PT, PL, act, alpha, beta};
    if (OW >= DW_WIDE_PLANE && !(lanes && omrt_gemm_level_once() >= 1)) {
        j.parts = threads < N * M ? threads : N * M;
        omrt_parallel(plane_part, &j, j.parts, threads);
    } else {
        omrt_parallel(block_part, &j, N * j.blocks * j.bands, threads);
    }
}

/* An output row's im2col run into dst[0, OW): the input row src (NULL: a row of padding) at
 * ow * SW + shift for the positions ow in [lo, hi), 0 elsewhere. */
static OMRT_INLINE void im2col_run(float *dst, const float *src, int64_t OW, int64_t lo, int64_t hi, int64_t SW,
                                   int64_t shift) {
    if (src == NULL) {
        memset(dst, 0, (size_t)OW * sizeof(float));
        return;
    }
    for (int64_t ow = 0; ow < lo; ow++) dst[ow] = 0.0f;
    if (SW == 1)
        memcpy(dst + lo, src + lo + shift, (size_t)(hi - lo) * sizeof(float));
    else if (SW == 2)
        for (int64_t ow = lo; ow < hi; ow++) dst[ow] = src[2 * ow + shift];
    else
        for (int64_t ow = lo; ow < hi; ow++) dst[ow] = src[ow * SW + shift];
    for (int64_t ow = hi; ow < OW; ow++) dst[ow] = 0.0f;
}

/* The most columns gathered straight into a packed product's strips (gathers_into_strips): each
 * row of them is gathered on the stack, then copied into the strips a strip at a time. */
#define IM2COL_ROW 256

/* The im2col columns of output rows [r0, r1) of one image x (C x H x W): row (c, kh, kw) of the
 * columns (C*KH*KW rows) holds, for each output position (oh, ow) of those rows, the input element
 * its window reads at tap (kh, kw), or 0 where that is padding. Row k lies at cols + k * pitch, or
 * with `laid` (at most IM2COL_ROW columns), as omrt_panel_gemm reads a b in its scratch. */
static OMRT_HOT void im2col(const float *x, float *cols, int64_t pitch, const omrt_scratch_b *laid, int64_t r0,
                            int64_t r1, int64_t C, int64_t H, int64_t W, int64_t OW, int64_t KH, int64_t KW,
                            int64_t SH, int64_t SW, int64_t DH, int64_t DW, int64_t PT, int64_t PL) {
    int64_t lo[KW], hi[KW];
    float row[IM2COL_ROW];
    for (int64_t kw = 0; kw < KW; kw++) omrt_span(kw * DW - PL, W, SW, OW, &lo[kw], &hi[kw]);
    for (int64_t c = 0; c < C; c++)
        for (int64_t kh = 0; kh < KH; kh++)
            for (int64_t kw = 0; kw < KW; kw++) {
                const int64_t k = (c * KH + kh) * KW + kw, shift = kw * DW - PL;
                float *dst = laid ? row : cols + k * pitch;
                for (int64_t oh = r0; oh < r1; oh++) {
                    const int64_t ih = oh * SH + kh * DH - PT;
                    const float *src = ih < 0 || ih >= H ? NULL : x + (c * H + ih) * W;
                    im2col_run(dst + (oh - r0) * OW, src, OW, lo[kw], hi[kw], SW, shift);
                }
                if (laid) omrt_scratch_row(laid, cols, k, row);
            }
}

/* im2col of rows [r0, r1) of one image x into cols, row k at cols + k * pitch. */
OMRT_EXPORT void omrt_im2col_f32(const float *x, float *cols, int64_t pitch, int64_t r0, int64_t r1, int64_t C,
                                 int64_t H, int64_t W, int64_t OW, int64_t KH, int64_t KW, int64_t SH, int64_t SW,
                                 int64_t DH, int64_t DW, int64_t PT, int64_t PL) {
    im2col(x, cols, pitch, NULL, r0, r1, C, H, W, OW, KH, KW, SH, SW, DH, DW, PT, PL);
}

/* A dense or grouped 2-d convolution: im2col (none for 1x1 stride-1 unpadded layers) and one
 * GEMM per group, through BLAS with bias and activation applied to each block of the output as
 * soon as it is written, or (with `panels`, each group's filters packed on their own) through
 * omrt_panel_gemm with them in its epilogue; with `lanes`, the filters are packed as strips of
 * OMRT_MAX_NR instead, for omrt_lanes_gemm (filters in the vector lanes). */
typedef struct {
    const float *x, *w, *bias, *panels, *residual;
    float *y, *work, *strips;
    int64_t N, C, H, W, M, G, shuffle, OH, OW, KH, KW, SH, SW, DH, DW, PT, PL, act, lanes;
    float alpha, beta;
    int64_t K, Fg, P, step, pitch, buffer, block, fparts, pparts, gparts;
    /* with a buffer per thread: chunks per image, of at most `step` rows each (omrt_whole_rounds) */
    int64_t chunks;
    /* what the shared phases work on: output rows [r0, r1) of `image`, their columns b (pitch ldb) */
    int64_t image, r0, r1, ldb;
    const float *b;
    /* per pool thread: whether its strips hold `image`'s columns yet (own_part) */
    unsigned char gathered[OMRT_MAX_THREADS];
} conv_job;

/* Filters per unit of the packing: a panel, or with `lanes` a strip. */
static inline int64_t filter_unit(const conv_job *j) { return j->lanes ? OMRT_MAX_NR : OMRT_PANEL; }

/* Rows [r0, r1) of `image`'s columns into cols, as im2col lays them (pitch, laid). */
static void gather(const conv_job *j, int64_t image, float *cols, int64_t pitch, const omrt_scratch_b *laid,
                   int64_t r0, int64_t r1) {
    im2col(j->x + image * j->C * j->H * j->W, cols, pitch, laid, r0, r1, j->C, j->H, j->W, j->OW, j->KH, j->KW,
           j->SH, j->SW, j->DH, j->DW, j->PT, j->PL);
}

/* The thread's strips: K * block floats of scratch for the packed product. */
static float *strips_of(const conv_job *j, int64_t thread) { return j->strips + thread * j->K * j->block; }

/* Whether the columns of `rows` output rows are gathered straight into a thread's strips, laid out
 * as the packed product reads them there (OMRT_B_IN_SCRATCH): panels of one group, and the columns
 * fit one block. Gathered into a column buffer, the GEMM copied them into the strips again (with
 * AVX2, every column of a 7x7 plane, whose rows, 49 floats, do not start on cache lines:
 * omrt_copies_whole_b); and a buffer that two threads gather half each and both read sends half
 * of it between their cores, across dies where those are far apart. */
static int gathers_into_strips(const conv_job *j, int64_t rows) {
    return j->panels && !j->lanes && j->G == 1 && rows * j->OW <= j->block && rows * j->OW <= IM2COL_ROW;
}

/* Rows [r0, r1) of `image`'s columns into the thread's strips, laid out for OMRT_B_IN_SCRATCH;
 * the strips. */
static float *gather_strips(const conv_job *j, int64_t image, int64_t r0, int64_t r1, int64_t thread) {
    float *strips = strips_of(j, thread);
    const omrt_scratch_b laid = omrt_scratch_b_of(j->K, (r1 - r0) * j->OW, j->block);
    gather(j, image, strips, 0, &laid, r0, r1);
    return strips;
}

/* Filters [f0, f1) of group g times columns [p0, p1) of b (pitch ldb; K rows per group), into the
 * image's output from position `at` on; `thread` picks the packed product's strip. A b that is the
 * thread's strips was laid out there by gather_strips (one group, all its columns, no pitch). */
static void multiply(const conv_job *j, int64_t image, int64_t g, int64_t f0, int64_t f1, const float *b,
                     int64_t ldb, int64_t p0, int64_t p1, int64_t at, int64_t thread) {
    int64_t m = g * j->Fg + f0;
    /* shuffled: filter f of group g writes channel f * G + g, so a group's rows lie G planes apart */
    const int64_t row = j->shuffle ? f0 * j->G + g : m, ldc = j->shuffle ? j->G * j->P : j->P;
    float *c = j->y + (image * j->M + row) * j->P + at + p0;
    const float *bg = b + g * j->K * ldb + p0; /* the group's rows of columns */
    if (j->panels) {
        const int64_t unit = filter_unit(j), group_panels = (j->Fg + unit - 1) / unit * unit * j->K;
        omrt_epilogue e = {j->bias ? j->bias + g * j->Fg : NULL, NULL, j->act, j->alpha, j->beta,
                           j->residual ? j->residual + (c - j->y) : NULL};
        float *strips = strips_of(j, thread);
        if (j->lanes) {
            omrt_lanes_gemm(j->panels + g * group_panels, j->K, f0, f1, bg, ldb, p1 - p0, c, ldc, &e, strips);
            return;
        }
        const omrt_b_at where = b == strips                                  ? OMRT_B_IN_SCRATCH
                                : b == j->x + image * j->C * j->H * j->W ? OMRT_B_INPUT
                                                                         : OMRT_B_GATHERED;
        omrt_panel_gemm(j->panels + g * group_panels, j->K, f0, f1, bg, ldb, p1 - p0, c, ldc, &e, strips, j->block,
                        where);
        return;
    }
    omrt_sgemm(f1 - f0, p1 - p0, j->K, j->w + m * j->K, j->K, bg, ldb, c, ldc);
    omrt_bias_act(c, f1 - f0, p1 - p0, ldc, j->bias ? j->bias + m : NULL, j->act, j->alpha, j->beta);
}

/* Start of filter block `fp`: on a panel (or strip) boundary for packed filters. */
static int64_t filter_cut(const conv_job *j, int64_t fp) {
    int64_t f = omrt_part(j->Fg, j->fparts, fp);
    if (!j->panels || fp == j->fparts) return f;
    return (f + filter_unit(j) / 2) / filter_unit(j) * filter_unit(j);
}

/* Part `item` (group, filter block, position block) of the shared product; position blocks
 * start on 16-float boundaries. */
static void product_part(void *p, int64_t item, int64_t thread) {
    const conv_job *j = p;
    int64_t pp = item % j->pparts, fp = item / j->pparts % j->fparts, g = item / j->pparts / j->fparts;
    int64_t width = (j->r1 - j->r0) * j->OW;
    int64_t p0 = omrt_part(width, j->pparts, pp) & ~(int64_t)15;
    int64_t p1 = pp + 1 == j->pparts ? width : omrt_part(width, j->pparts, pp + 1) & ~(int64_t)15;
    multiply(j, j->image, g, filter_cut(j, fp), filter_cut(j, fp + 1), j->b, j->ldb, p0, p1, j->r0 * j->OW, thread);
}

/* Rows part `item` of the shared column buffer of rows [r0, r1). */
static void gather_part(void *p, int64_t item, int64_t thread) {
    const conv_job *j = p;
    (void)thread;
    int64_t rows = j->r1 - j->r0;
    int64_t a = j->r0 + omrt_part(rows, j->gparts, item), b = j->r0 + omrt_part(rows, j->gparts, item + 1);
    gather(j, j->image, j->work + (a - j->r0) * j->OW, j->pitch, NULL, a, b);
}

/* Filter part `item` of the whole plane of `image` (see gathers_into_strips), which each thread
 * gathers into its own strips once per call. */
static void own_part(void *p, int64_t item, int64_t thread) {
    conv_job *j = p;
    const float *strips = strips_of(j, thread);
    if (!j->gathered[thread]) {
        gather_strips(j, j->image, 0, j->OH, thread);
        j->gathered[thread] = 1;
    }
    multiply(j, j->image, 0, filter_cut(j, item), filter_cut(j, item + 1), strips, 0, 0, j->OH * j->OW, 0, thread);
}

/* Chunk `item` (image, rows) gathered into the thread's own buffer (or strips) and multiplied whole. */
static void chunk_part(void *p, int64_t item, int64_t thread) {
    const conv_job *j = p;
    const int64_t image = item / j->chunks, chunk = item % j->chunks;
    const int64_t r0 = omrt_part(j->OH, j->chunks, chunk), r1 = omrt_part(j->OH, j->chunks, chunk + 1);
    const float *cols;
    int64_t ldb = j->pitch;
    if (gathers_into_strips(j, r1 - r0)) {
        cols = gather_strips(j, image, r0, r1, thread);
        ldb = 0; /* laid out in the strips: no pitch */
    } else {
        float *buffer = j->work + thread * j->buffer;
        gather(j, image, buffer, ldb, NULL, r0, r1);
        cols = buffer;
    }
    for (int64_t g = 0; g < j->G; g++)
        multiply(j, image, g, 0, j->Fg, cols, ldb, 0, (r1 - r0) * j->OW, r0 * j->OW, thread);
}

/* How the shared product of `width` positions is cut (see omrt_parts_per), along filters when
 * they outnumber positions. */
static void cut_product(conv_job *j, int64_t width, int64_t threads) {
    int64_t per_group = omrt_parts_per(j->G, threads);
    int64_t blocks = width / 16 > 1 ? width / 16 : 1;
    j->fparts = j->Fg >= width ? (per_group < j->Fg ? per_group : j->Fg) : 1;
    j->pparts = j->Fg >= width ? 1 : (per_group < blocks ? per_group : blocks);
}

/* The whole plane of j->image with each thread gathering it into its own strips (own_part), when
 * its product splits by filters alone; whether it ran so. */
static int run_own_plane(conv_job *j, int64_t threads) {
    cut_product(j, j->OH * j->OW, threads);
    if (j->pparts != 1) return 0;
    memset(j->gathered, 0, sizeof j->gathered);
    omrt_parallel(own_part, j, j->fparts, threads);
    return 1;
}

/* The layer of job j (its pointers, geometry, step and buffer set) on `threads` threads. */
static void run_conv(conv_job *j, int64_t threads) {
    const int64_t OH = j->OH, OW = j->OW, step = j->step;
    int pointwise = j->KH == 1 && j->KW == 1 && j->SH == 1 && j->SW == 1 && j->PT == 0 && j->PL == 0 && OH == j->H &&
                    OW == j->W;
    if (!pointwise && j->buffer > 0) {
        j->chunks = omrt_whole_rounds((OH + step - 1) / step, OH, threads); /* rows split evenly */
        omrt_parallel(chunk_part, j, j->N * j->chunks, threads);
        return;
    }
    const int64_t rows = pointwise ? OH : step;
    for (j->image = 0; j->image < j->N; j->image++)
        for (j->r0 = 0; j->r0 < OH; j->r0 += rows) {
            j->r1 = j->r0 + rows < OH ? j->r0 + rows : OH;
            if (!pointwise && j->r1 - j->r0 == OH && gathers_into_strips(j, OH) && run_own_plane(j, threads))
                continue;
            if (pointwise) {
                j->b = j->x + j->image * j->C * j->H * j->W;
                j->ldb = j->P;
            } else {
                j->gparts = threads < j->r1 - j->r0 ? threads : j->r1 - j->r0;
                omrt_parallel(gather_part, j, j->gparts, threads);
                j->b = j->work;
                j->ldb = j->pitch;
            }
            cut_product(j, (j->r1 - j->r0) * OW, threads);
            omrt_parallel(product_part, j, j->G * j->fparts * j->pparts, threads);
        }
}

#define CONV_JOB(...)                                                                                             \
    {.x = x, .bias = bias, .y = y, .work = work, .N = N, .C = C, .H = H, .W = W, .M = M, .OH = OH, .OW = OW,     \
     .KH = KH, .KW = KW, .SH = SH, .SW = SW, .DH = DH, .DW = DW, .PT = PT, .PL = PL, .act = act, .alpha = alpha, \
     .beta = beta, .P = OH * OW, .step = step, .pitch = step * OW, .buffer = buffer, __VA_ARGS__}

/* y (N, M, OH, OW) = conv of x (N, C, H, W) with w (M, C/G, KH, KW) in G groups, plus bias (when
 * not NULL) and the activation `act`; with `shuffle`, the channels shuffled as ShuffleNet does
 * (filter f of group g into channel f * G + g). Columns are gathered at most `step` output rows
 * at a time into `work`: with buffer > 0 every thread has a buffer of its own (`buffer` floats
 * apart) and takes whole chunks, as many for each thread (omrt_whole_rounds), the rows split
 * evenly between them; with buffer == 0 the threads gather one shared buffer of `step` rows at a
 * time, then split its product. A packed layer (omrt_pconv2d_f32) gathers a chunk or plane that
 * fits one block of its GEMM into the thread's strips instead (gathers_into_strips). */
OMRT_EXPORT void omrt_conv2d_f32(const float *x, const float *w, const float *bias, float *y, float *work,
                                 int64_t step, int64_t buffer, int64_t threads, int64_t N, int64_t C, int64_t H,
                                 int64_t W, int64_t M, int64_t G, int64_t shuffle, int64_t OH, int64_t OW, int64_t KH,
                                 int64_t KW, int64_t SH, int64_t SW, int64_t DH, int64_t DW, int64_t PT, int64_t PL,
                                 int64_t act, float alpha, float beta) {
    conv_job j = CONV_JOB(.w = w, .G = G, .shuffle = shuffle, .K = C / G * KH * KW, .Fg = M / G);
    run_conv(&j, threads);
}

/* omrt_conv2d_f32 with each group's filters packed in panels of their own (see omrt_gemm.h; group
 * g's M / G filters start ceil(M / G / OMRT_PANEL) panels after group g - 1's) and multiplied by
 * omrt's own GEMM, which copies `block` columns at a time into `strips` (K * block floats per
 * thread, K = C / G * KH * KW); `residual` (laid out as y, or y itself; NULL: none) is added
 * before the activation. With `lanes`, `panels` holds each group's filters as strips of
 * OMRT_MAX_NR (ceil(M / G / OMRT_MAX_NR) strips per group), multiplied with the filters in the
 * vector lanes (omrt_lanes_gemm; its partial panel of columns in `strips`). */
OMRT_EXPORT void omrt_pconv2d_f32(const float *x, const float *panels, const float *bias, const float *residual,
                                  float *y, float *work, float *strips, int64_t step, int64_t buffer, int64_t block,
                                  int64_t threads, int64_t N, int64_t C, int64_t H, int64_t W, int64_t M, int64_t G,
                                  int64_t shuffle, int64_t lanes, int64_t OH, int64_t OW, int64_t KH, int64_t KW,
                                  int64_t SH, int64_t SW, int64_t DH, int64_t DW, int64_t PT, int64_t PL, int64_t act,
                                  float alpha, float beta) {
    conv_job j = CONV_JOB(.panels = panels, .residual = residual, .strips = strips, .block = block, .G = G,
                          .shuffle = shuffle, .lanes = lanes, .K = C / G * KH * KW, .Fg = M / G);
    run_conv(&j, threads);
}

/* Input pixels a transposed convolution's row loop takes together, per output column tap, and
 * the widest kernel it takes (the sums of each of its taps are on the stack). */
#define DECONV_BLOCK 256
#define DECONV_MAX_K 8

/* Input pixels a 2x2 kernel's register loop takes together: two vectors of 8. */
#define DECONV_PIXELS 16

typedef float deconv_vec __attribute__((vector_size(8 * sizeof(float)), aligned(4)));
typedef int32_t deconv_i32 __attribute__((vector_size(8 * sizeof(int32_t))));

typedef struct {
    const float *x, *w, *bias;
    float *y;
    int64_t N, C, H, W, M, K, parts, act;
    float alpha, beta;
} deconv_job;

/* Output rows ih * K + kh of channel m (out: the first of them, OW apart), columns [i0 * K,
 * i1 * K), from input pixels [i0, i1) of row ih (x: the row of channel 0, channels H * W apart)
 * and taps w (channel 0's for filter m, channels M * K * K apart), bias b: for each kh and block
 * of pixels, the K taps' sums over the channels, then stored interleaved (output column
 * K * iw + kw). */
static OMRT_INLINE void deconv_pixels(const deconv_job *j, const float *x, const float *w, float b, float *out,
                                      int64_t i0, int64_t i1) {
    const int64_t K = j->K, OW = j->W * K;
    float acc[DECONV_MAX_K][DECONV_BLOCK];
    for (int64_t kh = 0; kh < K; kh++)
        for (int64_t p0 = i0; p0 < i1; p0 += DECONV_BLOCK) {
            const int64_t nb = i1 - p0 < DECONV_BLOCK ? i1 - p0 : DECONV_BLOCK;
            for (int64_t kw = 0; kw < K; kw++)
                for (int64_t i = 0; i < nb; i++) acc[kw][i] = 0.0f;
            for (int64_t c = 0; c < j->C; c++) {
                const float *xr = x + c * j->H * j->W + p0, *tap = w + c * j->M * K * K + kh * K;
                for (int64_t kw = 0; kw < K; kw++) {
                    const float wv = tap[kw];
                    for (int64_t i = 0; i < nb; i++) acc[kw][i] += wv * xr[i];
                }
            }
            float *dst = out + kh * OW + p0 * K;
            for (int64_t i = 0; i < nb; i++)
                for (int64_t kw = 0; kw < K; kw++) dst[i * K + kw] = acc[kw][i] + b;
            omrt_activate(dst, nb * K, j->act, j->alpha, j->beta);
        }
}

/* deconv_pixels of a 2x2 kernel for DECONV_PIXELS pixels from i0: the 8 sums (2 x 2 taps, two
 * vectors of pixels) stay in registers over all the channels, where the loop above loads and
 * stores its sums for every channel and tap (dbnet's 16 -> 16 upsampling of 80 x 80 planes took
 * 0.57 of the time alone, one thread, 0.41 in the model at two with AVX-512 hidden). */
static OMRT_INLINE void deconv_pixels2(const deconv_job *j, const float *x, const float *w, float b, float *out,
                                       int64_t i0) {
    const int64_t OW = j->W * 2;
    deconv_vec acc[2][2][2] = {{{{0}}}}; /* [kh][kw][vector] */
    for (int64_t c = 0; c < j->C; c++) {
        const float *xr = x + c * j->H * j->W + i0, *tap = w + c * j->M * 4;
        const deconv_vec first = *(const deconv_vec *)xr, second = *(const deconv_vec *)(xr + 8);
        for (int64_t t = 0; t < 4; t++) {
            const deconv_vec wv = (deconv_vec){0} + tap[t];
            acc[t / 2][t % 2][0] += wv * first;
            acc[t / 2][t % 2][1] += wv * second;
        }
    }
    const deconv_i32 lo = {0, 8, 1, 9, 2, 10, 3, 11}, hi = lo + 4;
    for (int64_t kh = 0; kh < 2; kh++) {
        float *dst = out + kh * OW + i0 * 2;
        for (int64_t v = 0; v < 2; v++) {
            const deconv_vec left = acc[kh][0][v] + b, right = acc[kh][1][v] + b;
            *(deconv_vec *)(dst + 16 * v) = __builtin_shuffle(left, right, lo);
            *(deconv_vec *)(dst + 16 * v + 8) = __builtin_shuffle(left, right, hi);
        }
        omrt_activate(dst, 2 * DECONV_PIXELS, j->act, j->alpha, j->beta);
    }
}

/* The K output rows of input row `row` (image, filter, input row): 2x2 kernels DECONV_PIXELS
 * pixels at a time in registers, the rest (other kernels, a row's last pixels) by deconv_pixels. */
static OMRT_INLINE void deconv_row(const deconv_job *j, int64_t row) {
    const int64_t ih = row % j->H, m = row / j->H % j->M, n = row / j->H / j->M, K = j->K, W = j->W;
    const float *x = j->x + n * j->C * j->H * W + ih * W, *w = j->w + m * K * K;
    float *out = j->y + ((n * j->M + m) * j->H + ih) * K * W * K;
    const float b = j->bias ? j->bias[m] : 0.0f;
    int64_t i0 = 0;
    for (; K == 2 && i0 + DECONV_PIXELS <= W; i0 += DECONV_PIXELS) deconv_pixels2(j, x, w, b, out, i0);
    if (i0 < W) deconv_pixels(j, x, w, b, out, i0, W);
}

static OMRT_HOT void deconv_part(void *p, int64_t item, int64_t thread) {
    const deconv_job *j = p;
    (void)thread;
    const int64_t rows = j->N * j->M * j->H;
    for (int64_t r = omrt_part(rows, j->parts, item); r < omrt_part(rows, j->parts, item + 1); r++) deconv_row(j, r);
}

/* y (N, M, H*K, W*K) = the transposed convolution of x (N, C, H, W) by w (C, M, K, K) with stride
 * K, unpadded (every output pixel takes one tap of one input pixel: a 2x2 stride-2 upsampling),
 * plus bias (when not NULL), then the activation, on `threads` threads. */
OMRT_EXPORT void omrt_deconv_f32(const float *x, const float *w, const float *bias, float *y, int64_t N, int64_t C,
                                 int64_t H, int64_t W, int64_t M, int64_t K, int64_t threads, int64_t act, float alpha,
                                 float beta) {
    const int64_t rows = N * M * H;
    deconv_job j = {.x = x, .w = w, .bias = bias, .y = y, .N = N, .C = C, .H = H, .W = W, .M = M, .K = K,
                    .parts = threads > 1 ? (rows < 8 * threads ? rows : 8 * threads) : 1, .act = act,
                    .alpha = alpha, .beta = beta};
    omrt_parallel(deconv_part, &j, j.parts, threads);
}
