/* Convolution loops: depthwise 2-D convolution (every output channel reads one input channel),
 * and the im2col gather of the dense layers that BLAS then multiplies. */
#include "omrt_gemm.h"

/* One output plane of a stride-1 layer, on the padded plane (see omrt_pad_plane). */
static inline void plane_stride1(const float *xp, const float *wp, float b, float *yp, float *scratch, int64_t H,
                          int64_t W, int64_t OH, int64_t OW, int64_t KH, int64_t KW, int64_t DH, int64_t DW,
                          int64_t PT, int64_t PL) {
    int64_t Wp = OW + (KW - 1) * DW, Hp = OH + (KH - 1) * DH, L = OH * Wp;
    float *pad = scratch, *acc = scratch + Hp * Wp + (KW - 1) * DW;
    omrt_pad_plane(xp, pad, 0.0f, H, W, Hp, Wp, (KW - 1) * DW, PT, PL);
    for (int64_t i = 0; i < L; i++) acc[i] = b;
    for (int64_t kh = 0; kh < KH; kh++)
        for (int64_t kw = 0; kw < KW; kw++) {
            const float *src = pad + kh * DH * Wp + kw * DW;
            float wv = wp[kh * KW + kw];
            for (int64_t i = 0; i < L; i++) acc[i] += wv * src[i];
        }
    for (int64_t oh = 0; oh < OH; oh++) memcpy(yp + oh * OW, acc + oh * Wp, (size_t)OW * sizeof(float));
}

/* yr[ow] += wv * xr[ow * SW + shift] over [lo, hi); SW is a constant at the call sites. */
static inline void row_tap(float *yr, const float *xr, float wv, int64_t lo, int64_t hi, int64_t SW,
                           int64_t shift) {
    for (int64_t ow = lo; ow < hi; ow++) yr[ow] += wv * xr[ow * SW + shift];
}

/* One output plane of a strided layer, row by row. */
static inline void plane_strided(const float *xp, const float *wp, float b, float *yp, const int64_t *lo,
                          const int64_t *hi, int64_t H, int64_t W, int64_t OH, int64_t OW, int64_t KH,
                          int64_t KW, int64_t SH, int64_t SW, int64_t DH, int64_t DW, int64_t PT, int64_t PL) {
    for (int64_t oh = 0; oh < OH; oh++) {
        float *yr = yp + oh * OW;
        for (int64_t ow = 0; ow < OW; ow++) yr[ow] = b;
        for (int64_t kh = 0; kh < KH; kh++) {
            int64_t ih = oh * SH + kh * DH - PT;
            if (ih < 0 || ih >= H) continue;
            const float *xr = xp + ih * W;
            for (int64_t kw = 0; kw < KW; kw++) {
                float wv = wp[kh * KW + kw];
                if (SW == 2)
                    row_tap(yr, xr, wv, lo[kw], hi[kw], 2, kw * DW - PL);
                else
                    row_tap(yr, xr, wv, lo[kw], hi[kw], SW, kw * DW - PL);
            }
        }
    }
}

/* Layers of narrow planes (fewer than DW_WIDE_PLANE output columns) run 16 channels at a time,
 * one vector lane each: a band of output rows of 16 planes is copied, zero-padded, into scratch
 * with the channels interleaved, every output pixel is then one vector per tap (a 7x7 plane with
 * a 5x5 window keeps all 16 lanes busy, where a loop along the plane's rows would not), and the
 * band is copied back into the 16 output planes. Wider planes run plane by plane (above): their
 * rows are long enough for vectors, and interleaving would cost more than the taps. */
#define DW_WIDE_PLANE 16
#define DW_LANES 16
typedef float dw_vec __attribute__((vector_size(DW_LANES * sizeof(float)), aligned(4)));

typedef struct {
    const float *x, *w, *bias;
    float *y, *scratch;
    int64_t pitch, band, bands, blocks, parts, N, M, mult, H, W, OH, OW, KH, KW, SH, SW, DH, DW, PT, PL, act;
    float alpha, beta;
} dw_job;

/* Planes [part starts, next part starts) of the N x M, one by one (wide planes). */
static OMRT_HOT void plane_part(void *p, int64_t item, int64_t thread) {
    const dw_job *j = p;
    int64_t lo[j->KW], hi[j->KW];
    for (int64_t kw = 0; kw < j->KW; kw++) omrt_span(kw * j->DW - j->PL, j->W, j->SW, j->OW, &lo[kw], &hi[kw]);
    for (int64_t q = omrt_part(j->N * j->M, j->parts, item); q < omrt_part(j->N * j->M, j->parts, item + 1); q++) {
        int64_t n = q / j->M, m = q % j->M;
        const float *xp = j->x + (n * (j->M / j->mult) + m / j->mult) * j->H * j->W;
        float *yp = j->y + q * j->OH * j->OW;
        float b = j->bias ? j->bias[m] : 0.0f;
        if (j->SH == 1 && j->SW == 1)
            plane_stride1(xp, j->w + m * j->KH * j->KW, b, yp, j->scratch + thread * j->pitch, j->H, j->W, j->OH,
                          j->OW, j->KH, j->KW, j->DH, j->DW, j->PT, j->PL);
        else
            plane_strided(xp, j->w + m * j->KH * j->KW, b, yp, lo, hi, j->H, j->W, j->OH, j->OW, j->KH, j->KW,
                          j->SH, j->SW, j->DH, j->DW, j->PT, j->PL);
        omrt_activate(yp, j->OH * j->OW, j->act, j->alpha, j->beta);
    }
}

/* The padded input rows [i0, i0 + rows) of the block's planes, `wide` columns from -PL, lanes
 * interleaved; lanes past the last channel and pixels outside the image are zero. */
static OMRT_INLINE void dw_gather(const dw_job *j, int64_t n, int64_t c0, int64_t lanes, int64_t i0, int64_t rows, int64_t wide,
                      float *in) {
    for (int64_t i = 0; i < rows * wide * DW_LANES; i++) in[i] = 0.0f;
    for (int64_t l = 0; l < lanes; l++) {
        const float *plane = j->x + (n * (j->M / j->mult) + (c0 + l) / j->mult) * j->H * j->W;
        for (int64_t r = 0; r < rows; r++) {
            const int64_t ih = i0 + r;
            if (ih < 0 || ih >= j->H) continue;
            const int64_t lo = j->PL > 0 ? j->PL : 0, hi = j->W + j->PL < wide ? j->W + j->PL : wide;
            const float *row = plane + ih * j->W;
            for (int64_t col = lo; col < hi; col++) in[(r * wide + col) * DW_LANES + l] = row[col - j->PL];
        }
    }
}

/* Output rows [o0, o1) of the block from the gathered rows, lanes interleaved, bias included. */
static OMRT_HOT void dw_compute(const dw_job *j, const float *in, int64_t wide, const float *tap,
                                const float *bias, int64_t o0, int64_t o1, float *out) {
    const dw_vec *taps = (const dw_vec *)tap;
    for (int64_t oh = o0; oh < o1; oh++)
        for (int64_t ow = 0; ow < j->OW; ow++) {
            dw_vec acc = *(const dw_vec *)bias;
            const float *at = in + (((oh - o0) * j->SH) * wide + ow * j->SW) * DW_LANES;
            for (int64_t kh = 0; kh < j->KH; kh++)
                for (int64_t kw = 0; kw < j->KW; kw++)
                    acc += taps[kh * j->KW + kw] * *(const dw_vec *)(at + (kh * j->DH * wide + kw * j->DW) * DW_LANES);
            *(dw_vec *)(out + ((oh - o0) * j->OW + ow) * DW_LANES) = acc;
        }
}

/* Item (image, block of 16 channels, band of output rows) on the thread's scratch (narrow planes). */
static OMRT_HOT void block_part(void *p, int64_t item, int64_t thread) {
    const dw_job *j = p;
    const int64_t band = item % j->bands, block = item / j->bands % j->blocks, n = item / j->bands / j->blocks;
    const int64_t c0 = block * DW_LANES, lanes = j->M - c0 < DW_LANES ? j->M - c0 : DW_LANES;
    const int64_t o0 = band * j->band, o1 = o0 + j->band < j->OH ? o0 + j->band : j->OH;
    const int64_t rows = (o1 - o0 - 1) * j->SH + (j->KH - 1) * j->DH + 1;
    const int64_t wide = (j->OW - 1) * j->SW + (j->KW - 1) * j->DW + 1, taps = j->KH * j->KW;
    float *tap = j->scratch + thread * j->pitch, *in = tap + taps * DW_LANES, *out = in + rows * wide * DW_LANES;
    float bias[DW_LANES] = {0};
    for (int64_t l = 0; l < DW_LANES; l++) {
        for (int64_t t = 0; t < taps; t++) tap[t * DW_LANES + l] = l < lanes ? j->w[(c0 + l) * taps + t] : 0.0f;
        if (j->bias && l < lanes) bias[l] = j->bias[c0 + l];
    }
    dw_gather(j, n, c0, lanes, o0 * j->SH - j->PT, rows, wide, in);
    dw_compute(j, in, wide, tap, bias, o0, o1, out);
    const int64_t count = (o1 - o0) * j->OW;
    for (int64_t l = 0; l < lanes; l++) {
        float *plane = j->y + (n * j->M + c0 + l) * j->OH * j->OW + o0 * j->OW;
        for (int64_t i = 0; i < count; i++) plane[i] = out[i * DW_LANES + l];
        omrt_activate(plane, count, j->act, j->alpha, j->beta);
    }
}

/* y (N x M planes of OH x OW): plane (n, m) reads input plane (n, m / mult) of x (N x M/mult
 * planes of H x W) with filter w[m] (KH x KW), adds bias[m] (when bias is not NULL) and applies
 * the fused activation `act`, over `threads` threads, each with `pitch` floats of scratch. Wide
 * planes go plane by plane (stride-1 layers pad each into the scratch, see omrt_pad_plane);
 * narrow ones in items of 16 channels by `band` output rows (see block_part). */
OMRT_EXPORT void omrt_dwconv2d_f32(const float *x, const float *w, const float *bias, float *y, float *scratch,
                                   int64_t pitch, int64_t band, int64_t threads, int64_t N, int64_t M, int64_t mult,
                                   int64_t H, int64_t W, int64_t OH, int64_t OW, int64_t KH, int64_t KW, int64_t SH,
                                   int64_t SW, int64_t DH, int64_t DW, int64_t PT, int64_t PL, int64_t act,
                                   float alpha, float beta) {
    dw_job j = {x, w, bias, y, scratch, pitch, band, (OH + band - 1) / band, (M + DW_LANES - 1) / DW_LANES, 0, N, M,
                mult, H, W, OH, OW, KH, KW, SH, SW, DH, DW, PT, PL, act, alpha, beta};
    if (OW >= DW_WIDE_PLANE) {
        j.parts = threads < N * M ? threads : N * M;
        omrt_parallel(plane_part, &j, j.parts, threads);
    } else {
        omrt_parallel(block_part, &j, N * j.blocks * j.bands, threads);
    }
}

/* The im2col columns of output rows [r0, r1) of one image x (C x H x W): row (c, kh, kw) of
 * `cols` (C*KH*KW rows, `pitch` floats apart) holds, for each output position (oh, ow) of those
 * rows, the input element its window reads at tap (kh, kw), or 0 where that is padding. */
OMRT_EXPORT OMRT_HOT void omrt_im2col_f32(const float *x, float *cols, int64_t pitch, int64_t r0, int64_t r1,
                                          int64_t C, int64_t H, int64_t W, int64_t OW, int64_t KH,
                                          int64_t KW, int64_t SH, int64_t SW, int64_t DH, int64_t DW,
                                          int64_t PT, int64_t PL) {
    int64_t lo[KW], hi[KW];
    for (int64_t kw = 0; kw < KW; kw++) omrt_span(kw * DW - PL, W, SW, OW, &lo[kw], &hi[kw]);
    for (int64_t c = 0; c < C; c++)
        for (int64_t kh = 0; kh < KH; kh++)
            for (int64_t kw = 0; kw < KW; kw++) {
                float *dst = cols + ((c * KH + kh) * KW + kw) * pitch;
                const int64_t shift = kw * DW - PL;
                for (int64_t oh = r0; oh < r1; oh++, dst += OW) {
                    const int64_t ih = oh * SH + kh * DH - PT;
                    if (ih < 0 || ih >= H) {
                        memset(dst, 0, (size_t)OW * sizeof(float));
                        continue;
                    }
                    const float *src = x + (c * H + ih) * W;
                    for (int64_t ow = 0; ow < lo[kw]; ow++) dst[ow] = 0.0f;
                    if (SW == 1)
                        memcpy(dst + lo[kw], src + lo[kw] + shift, (size_t)(hi[kw] - lo[kw]) * sizeof(float));
                    else if (SW == 2)
                        for (int64_t ow = lo[kw]; ow < hi[kw]; ow++) dst[ow] = src[2 * ow + shift];
                    else
                        for (int64_t ow = lo[kw]; ow < hi[kw]; ow++) dst[ow] = src[ow * SW + shift];
                    for (int64_t ow = hi[kw]; ow < OW; ow++) dst[ow] = 0.0f;
                }
            }
}

/* A dense or grouped 2-d convolution: im2col (none for 1x1 stride-1 unpadded layers) and one
 * GEMM per group, through BLAS with bias and activation applied to each block of the output as
 * soon as it is written, or (with `panels`, one group) through omrt_panel_gemm with them in its
 * epilogue. */
typedef struct {
    const float *x, *w, *bias, *panels;
    float *y, *work, *strips;
    int64_t N, C, H, W, M, G, OH, OW, KH, KW, SH, SW, DH, DW, PT, PL, act;
    float alpha, beta;
    int64_t K, Fg, P, step, pitch, buffer, block, fparts, pparts, gparts;
    /* what the shared phases work on: output rows [r0, r1) of `image`, their columns b (pitch ldb) */
    int64_t image, r0, r1, ldb;
    const float *b;
} conv_job;

static void gather(const conv_job *j, int64_t image, float *cols, int64_t r0, int64_t r1) {
    omrt_im2col_f32(j->x + image * j->C * j->H * j->W, cols, j->pitch, r0, r1, j->C, j->H, j->W, j->OW, j->KH,
                    j->KW, j->SH, j->SW, j->DH, j->DW, j->PT, j->PL);
}

/* Filters [f0, f1) of group g times columns [p0, p1) of b (pitch ldb; K rows per group), into the
 * image's output from position `at` on; `thread` picks the packed product's strip. */
static void multiply(const conv_job *j, int64_t image, int64_t g, int64_t f0, int64_t f1, const float *b,
                     int64_t ldb, int64_t p0, int64_t p1, int64_t at, int64_t thread) {
    int64_t m = g * j->Fg + f0;
    float *c = j->y + (image * j->M + m) * j->P + at + p0;
    if (j->panels) {
        omrt_epilogue e = {j->bias, NULL, j->act, j->alpha, j->beta};
        omrt_panel_gemm(j->panels, j->K, m, m + f1 - f0, b + p0, ldb, p1 - p0, c, j->P, &e,
                        j->strips + thread * j->K * j->block, j->block);
        return;
    }
    omrt_sgemm(f1 - f0, p1 - p0, j->K, j->w + m * j->K, j->K, b + g * j->K * ldb + p0, ldb, c, j->P);
    omrt_bias_act(c, f1 - f0, p1 - p0, j->P, j->bias ? j->bias + m : NULL, j->act, j->alpha, j->beta);
}

/* Start of filter block `fp`: on a panel boundary for packed filters. */
static int64_t filter_cut(const conv_job *j, int64_t fp) {
    int64_t f = omrt_part(j->Fg, j->fparts, fp);
    if (!j->panels || fp == j->fparts) return f;
    return (f + OMRT_PANEL / 2) / OMRT_PANEL * OMRT_PANEL;
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
    gather(j, j->image, j->work + (a - j->r0) * j->OW, a, b);
}

/* Chunk `item` (image, rows) gathered into the thread's own buffer and multiplied whole. */
static void chunk_part(void *p, int64_t item, int64_t thread) {
    const conv_job *j = p;
    int64_t chunks = (j->OH + j->step - 1) / j->step, image = item / chunks, r0 = item % chunks * j->step;
    int64_t r1 = r0 + j->step < j->OH ? r0 + j->step : j->OH;
    float *cols = j->work + thread * j->buffer;
    gather(j, image, cols, r0, r1);
    for (int64_t g = 0; g < j->G; g++)
        multiply(j, image, g, 0, j->Fg, cols, j->pitch, 0, (r1 - r0) * j->OW, r0 * j->OW, thread);
}

/* How the shared product of `width` positions is cut (see omrt_parts_per), along filters when
 * they outnumber positions. */
static void cut_product(conv_job *j, int64_t width, int64_t threads) {
    int64_t per_group = omrt_parts_per(j->G, threads);
    int64_t blocks = width / 16 > 1 ? width / 16 : 1;
    j->fparts = j->Fg >= width ? (per_group < j->Fg ? per_group : j->Fg) : 1;
    j->pparts = j->Fg >= width ? 1 : (per_group < blocks ? per_group : blocks);
}

/* The layer of job j (its pointers, geometry, step and buffer set) on `threads` threads. */
static void run_conv(conv_job *j, int64_t threads) {
    const int64_t OH = j->OH, OW = j->OW, step = j->step;
    int pointwise = j->KH == 1 && j->KW == 1 && j->SH == 1 && j->SW == 1 && j->PT == 0 && j->PL == 0 && OH == j->H &&
                    OW == j->W;
    if (!pointwise && j->buffer > 0) {
        omrt_parallel(chunk_part, j, j->N * ((OH + step - 1) / step), threads);
        return;
    }
    const int64_t rows = pointwise ? OH : step;
    for (j->image = 0; j->image < j->N; j->image++)
        for (j->r0 = 0; j->r0 < OH; j->r0 += rows) {
            j->r1 = j->r0 + rows < OH ? j->r0 + rows : OH;
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
 * not NULL) and the activation `act`. Columns are gathered `step` output rows at a time into
 * `work`: with buffer > 0 every thread has a buffer of its own (`buffer` floats apart) and takes
 * whole chunks; with buffer == 0 the threads gather one shared buffer, then split its product. */
OMRT_EXPORT void omrt_conv2d_f32(const float *x, const float *w, const float *bias, float *y, float *work,
                                 int64_t step, int64_t buffer, int64_t threads, int64_t N, int64_t C, int64_t H,
                                 int64_t W, int64_t M, int64_t G, int64_t OH, int64_t OW, int64_t KH, int64_t KW,
                                 int64_t SH, int64_t SW, int64_t DH, int64_t DW, int64_t PT, int64_t PL, int64_t act,
                                 float alpha, float beta) {
    conv_job j = CONV_JOB(.w = w, .G = G, .K = C / G * KH * KW, .Fg = M / G);
    run_conv(&j, threads);
}

/* omrt_conv2d_f32 of one group, its filters packed in panels (see omrt_gemm.h) and multiplied by
 * omrt's own GEMM, which copies `block` columns at a time into `strips` (K * block floats per
 * thread). */
OMRT_EXPORT void omrt_pconv2d_f32(const float *x, const float *panels, const float *bias, float *y, float *work,
                                  float *strips, int64_t step, int64_t buffer, int64_t block, int64_t threads,
                                  int64_t N, int64_t C, int64_t H, int64_t W, int64_t M, int64_t OH, int64_t OW,
                                  int64_t KH, int64_t KW, int64_t SH, int64_t SW, int64_t DH, int64_t DW, int64_t PT,
                                  int64_t PL, int64_t act, float alpha, float beta) {
    conv_job j = CONV_JOB(.panels = panels, .strips = strips, .block = block, .G = 1, .K = C * KH * KW, .Fg = M);
    run_conv(&j, threads);
}
