/* Winograd convolution transforms: a 3x3 stride-1 layer as GEMMs over transformed tiles, in
 * one of two sizes the compiler picks per layer (omrt.kernels.winograd.tile_for):
 * - F(2x2, 3x3): 2x2 output tiles from 4x4 input tiles, 16 GEMMs, 2.25x fewer multiplies than
 *   direct; B^T = [1 0 -1 0; 0 1 1 0; 0 -1 1 0; 0 1 0 -1], A^T = [1 1 1 0; 0 1 -1 -1].
 * - F(4x4, 3x3): 4x4 output tiles from 6x6 input tiles, 36 GEMMs, 4x fewer multiplies, and
 *   transforms of 2.25 input and output elements per output against 4; for wide planes (56x56
 *   and 28x28 layers 0.75-0.85 of F(2x2)'s time, 14x14 ones no faster, for 2.25x the filters'
 *   bytes). B^T = [4 0 -5 0 1 0; 0 -4 -4 1 1 0; 0 4 -4 -1 1 0; 0 -2 -1 2 1 0; 0 2 -1 -2 1 0;
 *   0 4 0 -5 0 1], A^T = [1 1 1 1 1 0; 0 1 -1 2 -2 0; 0 1 1 4 4 0; 0 1 -1 8 -8 1].
 * The matrices are Lavin and Gray's. The filters are transformed once, at compile time
 * (U = G g G^T), each element's F x C matrix packed in panels for omrt's own GEMM (omrt_gemm.h);
 * per run the input tiles are transformed (V = B^T d B), multiplied by U, and the products
 * transformed back (Y = A^T M A). With T output rows and columns per tile (2 or 4), a tile reads
 * T + 2 of each; tiles are numbered row-major over a grid `tw` tiles wide; element
 * e = i * (T + 2) + k of a transformed tile is row i, column k. */
#include "omrt_gemm.h"

/* u[0..T+1] = B^T d for d[0..T+1] `step` floats apart (a column of input rows, or a row of
 * columns), stored `to` floats apart. */
static OMRT_INLINE void wg_in(int T, const float *d, int64_t step, float *u, int64_t to) {
    if (T == 2) {
        const float d0 = d[0], d1 = d[step], d2 = d[2 * step], d3 = d[3 * step];
        u[0] = d0 - d2;
        u[to] = d1 + d2;
        u[2 * to] = d2 - d1;
        u[3 * to] = d1 - d3;
        return;
    }
    const float d0 = d[0], d1 = d[step], d2 = d[2 * step], d3 = d[3 * step], d4 = d[4 * step], d5 = d[5 * step];
    const float a = d4 - 4.0f * d2, b = d3 - 4.0f * d1, c = d4 - d2, e = 2.0f * (d3 - d1);
    u[0] = 4.0f * d0 - 5.0f * d2 + d4;
    u[to] = a + b;
    u[2 * to] = a - b;
    u[3 * to] = c + e;
    u[4 * to] = c - e;
    u[5 * to] = 4.0f * d1 - 5.0f * d3 + d5;
}

/* o[0..T-1] = A^T m for m[0..T+1] `step` floats apart, plus `add`. */
static OMRT_INLINE void wg_out(int T, const float *m, int64_t step, float add, float *o) {
    if (T == 2) {
        o[0] = m[0] + m[step] + m[2 * step] + add;
        o[1] = m[step] - m[2 * step] - m[3 * step] + add;
        return;
    }
    const float a = m[step] + m[2 * step], b = m[step] - m[2 * step];
    const float c = m[3 * step] + m[4 * step], d = m[3 * step] - m[4 * step];
    o[0] = m[0] + a + c + add;
    o[1] = b + 2.0f * d + add;
    o[2] = a + 4.0f * c + add;
    o[3] = b + 8.0f * d + m[5 * step] + add;
}

/* Floats of the rows scratch closing a slot: the input transform's (T + 3 rows of the padded
 * width T * tw + 2) or the output transform's (2T(T + 1) per tile of a chunk of `tiles`),
 * whichever is more, in whole cache lines. */
static int64_t wg_rows(int64_t T, int64_t tw, int64_t tiles) {
    const int64_t in = (T + 3) * (T * tw + 2), out = 2 * T * (T + 1) * tiles;
    return ((in > out ? in : out) + 15) & ~(int64_t)15;
}

/* Floats between one element of V and the next past its strips: the transform writes all the
 * elements of a tile at once, and with channels and strips powers of two, elements a power of
 * two apart fell in the same few L1 sets (a 128-channel 56x56 layer spent 2/3 of its time in
 * transform_in). */
#define WG_SKEW 16

/* The floats of one element of V over n tiles: strips of OMRT_MAX_NR tiles, `ctot` channels
 * each, then WG_SKEW. */
static inline int64_t element_floats(int64_t ctot, int64_t n) {
    return ctot * ((n + OMRT_MAX_NR - 1) / OMRT_MAX_NR * OMRT_MAX_NR) + WG_SKEW;
}

/* V for tiles t in [t0, t1) of every channel c of x (C x H x W), laid out for omrt's GEMM: element
 * e is element_floats(ctot, n) floats after e - 1, a matrix of channels by tiles in strips of
 * OMRT_MAX_NR tiles (strip s holds tiles 32 s.., `ctot` channels of 32 floats each; V points at
 * channel 0 of these C), zero past the last tile. Tile (ty, tx) reads rows T ty - PT .. + T + 1
 * and columns T tx - PL .. + T + 1, zero outside. `scratch` holds wg_rows' T + 3 rows. The column
 * transform reads the input rows in place (a row above or below the plane reads a zero row):
 * copying them first left its loads waiting on the copy's stores. */
static OMRT_INLINE void transform_in(const int T, const float *restrict x, float *restrict V,
                                     float *restrict scratch, int64_t C, int64_t ctot, int64_t H, int64_t W,
                                     int64_t PT, int64_t PL, int64_t tw, int64_t t0, int64_t t1) {
    const int S = T + 2, E = S * S;
    const int64_t wp = T * tw + 2, n = t1 - t0, es = element_floats(ctot, n), strip = ctot * OMRT_MAX_NR;
    float *restrict zero = scratch, *restrict cols = scratch + wp;
    for (int64_t q = 0; q < wp; q++) zero[q] = 0.0f;
    for (int64_t c = 0; c < C; c++) {
        const float *xc = x + c * H * W;
        for (int64_t t = t0; t < t1;) {
            const int64_t ty = t / tw, tx0 = t % tw;
            const int64_t tx1 = tx0 + (t1 - t < tw - tx0 ? t1 - t : tw - tx0);
            const int64_t lo = T * tx0, hi = T * tx1 + 2;
            const int64_t in_lo = PL > lo ? (PL < hi ? PL : hi) : lo;
            const int64_t in_hi = W + PL < hi ? (W + PL > in_lo ? W + PL : in_lo) : hi;
            const float *r[6];
            for (int64_t j = 0; j < S; j++) {
                const int64_t iy = T * ty - PT + j;
                r[j] = iy < 0 || iy >= H ? zero : xc + iy * W - PL;
            }
            const float *r0 = r[0], *r1 = r[1], *r2 = r[2], *r3 = r[3], *r4 = r[S - 2], *r5 = r[S - 1];
            for (int64_t i = 0; i < S; i++)
                for (int64_t q = lo; q < in_lo; q++) cols[i * wp + q] = 0.0f;
#pragma GCC ivdep
            for (int64_t q = in_lo; q < in_hi; q++) {
                const float d[6] = {r0[q], r1[q], r2[q], r3[q], r4[q], r5[q]};
                wg_in(T, d, 1, cols + q, wp);
            }
            for (int64_t i = 0; i < S; i++)
                for (int64_t q = in_hi; q < hi; q++) cols[i * wp + q] = 0.0f;
            for (int64_t tx = tx0; tx < tx1;) { /* a run of tiles inside one strip */
                const int64_t q = t - t0 + tx - tx0, at = q % OMRT_MAX_NR;
                const int64_t run = tx1 - tx < OMRT_MAX_NR - at ? tx1 - tx : OMRT_MAX_NR - at;
                float *restrict base = V + q / OMRT_MAX_NR * strip + c * OMRT_MAX_NR + at - tx;
                for (int64_t i = 0; i < S; i++) {
                    const float *restrict ui = cols + i * wp;
                    float *restrict v = base + S * i * es;
#pragma GCC ivdep
                    for (int64_t k = tx; k < tx + run; k++) wg_in(T, ui + T * k, 1, v + k, es);
                }
                tx += run;
            }
            t += tx1 - tx0;
        }
        if (n % OMRT_MAX_NR) /* the last strip's columns past the last tile */
            for (int64_t e = 0; e < E; e++)
                memset(V + e * es + n / OMRT_MAX_NR * strip + c * OMRT_MAX_NR + n % OMRT_MAX_NR, 0,
                       (size_t)(OMRT_MAX_NR - n % OMRT_MAX_NR) * sizeof(float));
    }
}

/* y (F x OH x OW) for tiles [t0, t1) from the products M[e][f][t - t0], plus bias[f] (when not
 * NULL) and the fused activation; only the rows and columns inside y are written. `scratch`
 * holds 2T(T + 1) * (t1 - t0) floats: A^T applied down the columns of every tile (T (T + 2) rows
 * of tiles), then across (T output rows, T floats per tile), each pass one loop over all the
 * tiles, whose elements lie next to each other in M; the rows then go into y a row of tiles at a
 * time. Loops over one tile's elements, or over a row of tiles (4 to 14 of them), vectorized
 * badly and took 14-20% of squeezenet's run. */
static OMRT_INLINE void transform_out(const int T, const float *restrict M, const float *restrict bias,
                                      float *restrict y, float *restrict scratch, int64_t F, int64_t OH, int64_t OW,
                                      int64_t tw, int64_t t0, int64_t t1, int64_t act, float alpha, float beta) {
    const int S = T + 2;
    const int64_t n = t1 - t0, fn = F * n;
    float *restrict cols = scratch, *restrict rows = scratch + T * S * n;
    for (int64_t f = 0; f < F; f++) {
        const float *restrict m = M + f * n;
        for (int64_t k = 0; k < S; k++) {
            float *restrict c0 = cols + k * n, *restrict c1 = c0 + S * n;
            float *restrict c2 = c1 + S * n, *restrict c3 = c2 + S * n;
#pragma GCC ivdep
            for (int64_t i = 0; i < n; i++) {
                float o[4];
                wg_out(T, m + k * fn + i, S * fn, 0.0f, o);
                c0[i] = o[0];
                c1[i] = o[1];
                if (T == 4) {
                    c2[i] = o[2];
                    c3[i] = o[3];
                }
            }
        }
        const float b = bias ? bias[f] : 0.0f;
        for (int64_t r = 0; r < T; r++) {
            const float *restrict s = cols + r * S * n;
            float *restrict out = rows + r * T * n;
#pragma GCC ivdep
            for (int64_t i = 0; i < n; i++) {
                float o[4];
                wg_out(T, s + i, n, b, o);
                for (int64_t k = 0; k < T; k++) out[T * i + k] = o[k];
            }
        }
        float *yf = y + f * OH * OW;
        for (int64_t t = t0; t < t1;) {
            const int64_t ty = t / tw, tx0 = t % tw, run = t1 - t < tw - tx0 ? t1 - t : tw - tx0;
            const int64_t lo = T * tx0, hi = T * (tx0 + run) < OW ? T * (tx0 + run) : OW;
            for (int64_t r = 0; r < T && T * ty + r < OH; r++)
                omrt_activate_into(yf + (T * ty + r) * OW + lo, rows + (r * n + t - t0) * T, hi - lo, act, alpha,
                                   beta);
            t += run;
        }
    }
}

/* transform_in and transform_out for each tile size, the size a constant in each. */
static OMRT_HOT_AVX2 void transform_in2(const float *restrict x, float *restrict V, float *restrict scratch,
                                        int64_t C, int64_t ctot, int64_t H, int64_t W, int64_t PT, int64_t PL,
                                        int64_t tw, int64_t t0, int64_t t1) {
    transform_in(2, x, V, scratch, C, ctot, H, W, PT, PL, tw, t0, t1);
}

static OMRT_HOT_AVX2 void transform_in4(const float *restrict x, float *restrict V, float *restrict scratch,
                                        int64_t C, int64_t ctot, int64_t H, int64_t W, int64_t PT, int64_t PL,
                                        int64_t tw, int64_t t0, int64_t t1) {
    transform_in(4, x, V, scratch, C, ctot, H, W, PT, PL, tw, t0, t1);
}

static OMRT_HOT_AVX2 void transform_out2(const float *restrict M, const float *restrict bias, float *restrict y,
                                         float *restrict scratch, int64_t F, int64_t OH, int64_t OW, int64_t tw,
                                         int64_t t0, int64_t t1, int64_t act, float alpha, float beta) {
    transform_out(2, M, bias, y, scratch, F, OH, OW, tw, t0, t1, act, alpha, beta);
}

static OMRT_HOT_AVX2 void transform_out4(const float *restrict M, const float *restrict bias, float *restrict y,
                                         float *restrict scratch, int64_t F, int64_t OH, int64_t OW, int64_t tw,
                                         int64_t t0, int64_t t1, int64_t act, float alpha, float beta) {
    transform_out(4, M, bias, y, scratch, F, OH, OW, tw, t0, t1, act, alpha, beta);
}

typedef void (*wg_in_fn)(const float *restrict, float *restrict, float *restrict, int64_t, int64_t, int64_t,
                         int64_t, int64_t, int64_t, int64_t, int64_t, int64_t);
typedef void (*wg_out_fn)(const float *restrict, const float *restrict, float *restrict, float *restrict, int64_t,
                          int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, float, float);

typedef struct {
    wg_in_fn transform_in;   /* transform_in2 or transform_in4, by T */
    wg_out_fn transform_out; /* transform_out2 or transform_out4 */
    const float *x, *U, *bias;
    float *y, *work;
    int64_t v_floats, slot_floats, fpass, T, C, H, W, F, OH, OW, PT, PL, act;
    float alpha, beta;
    int64_t tw, tiles, rows, chunks, cblocks, fblocks;
} wg_job;

/* The products of filters [f0, f1) (f0 on a panel boundary) with V (tiles [t0, t1), laid out by
 * transform_in), `fpass` filters (whole panels) at a time, transformed back into y. Each strip of
 * V is multiplied by every panel of the pass while it is in L1. */
static void multiply(const wg_job *j, const float *V, float *M, float *rows, float *y, int64_t f0, int64_t f1,
                     int64_t t0, int64_t t1) {
    const int64_t n = t1 - t0, es = element_floats(j->C, n), C = j->C;
    const int64_t panels = (j->F + OMRT_PANEL - 1) / OMRT_PANEL;
    const omrt_epilogue none = {NULL, NULL, 0, 0.0f, 0.0f, NULL};
    for (int64_t a = f0; a < f1; a += j->fpass) {
        const int64_t fp = f1 - a < j->fpass ? f1 - a : j->fpass;
        for (int64_t e = 0; e < (j->T + 2) * (j->T + 2); e++) {
            const float *Ue = j->U + (e * panels + a / OMRT_PANEL) * C * OMRT_PANEL;
            for (int64_t s = 0; s * OMRT_MAX_NR < n; s++)
                for (int64_t r0 = 0; r0 < fp; r0 += OMRT_PANEL)
                    omrt_strip_tile(Ue + r0 * C, V + e * es, s, C, fp, n, r0, M + e * fp * n, n, &none, omrt_no_fetch);
        }
        j->transform_out(M, j->bias ? j->bias + a : NULL, y + a * j->OH * j->OW, rows, fp, j->OH, j->OW, j->tw, t0,
                         t1, j->act, j->alpha, j->beta);
    }
}

/* Chunk `item` (image, tiles) in the thread's own slot: V, then the products, then rows. */
static void chunk_part(void *p, int64_t item, int64_t thread) {
    const wg_job *j = p;
    const int64_t image = item / j->chunks, k = item % j->chunks;
    const int64_t t0 = omrt_part(j->tiles, j->chunks, k), t1 = omrt_part(j->tiles, j->chunks, k + 1);
    float *V = j->work + thread * j->slot_floats, *M = V + j->v_floats, *rows = V + j->slot_floats - j->rows;
    j->transform_in(j->x + image * j->C * j->H * j->W, V, rows, j->C, j->C, j->H, j->W, j->PT, j->PL, j->tw, t0, t1);
    multiply(j, V, M, rows, j->y + image * j->F * j->OH * j->OW, 0, j->F, t0, t1);
}

/* Shared phase 1, part `item`: a block of channels of all tiles into the shared V. */
static void channels_part(void *p, int64_t item, int64_t thread) {
    const wg_job *j = p;
    const int64_t c0 = omrt_part(j->C, j->cblocks, item), c1 = omrt_part(j->C, j->cblocks, item + 1);
    float *rows = j->work + j->v_floats + (thread + 1) * j->slot_floats - j->rows;
    j->transform_in(j->x + c0 * j->H * j->W, j->work + c0 * OMRT_MAX_NR, rows, c1 - c0, j->C, j->H, j->W, j->PT,
                    j->PL, j->tw, 0, j->tiles);
}

/* Start of filter block `item` of the shared phase 2: the panels shared out evenly (128 filters,
 * 11 panels, cut at 60: blocks of 60 and 68 filters, not 72 and 56), no block more than
 * ceil(panels / fblocks) panels. */
static int64_t filter_cut(const wg_job *j, int64_t item) {
    const int64_t f = omrt_part((j->F + OMRT_PANEL - 1) / OMRT_PANEL, j->fblocks, item) * OMRT_PANEL;
    return f < j->F ? f : j->F;
}

/* Shared phase 2, part `item`: a block of filters multiplied and transformed back. */
static void filters_part(void *p, int64_t item, int64_t thread) {
    const wg_job *j = p;
    float *M = j->work + j->v_floats + thread * j->slot_floats, *rows = M + j->slot_floats - j->rows;
    multiply(j, j->work, M, rows, j->y, filter_cut(j, item), filter_cut(j, item + 1), 0, j->tiles);
}

/* y (N, F, OH, OW) = the 3x3 stride-1 convolution of x (N, C, H, W), pads PT/PL, in tiles of
 * T x T outputs (2 or 4), whose filters transformed are U ((T + 2)^2 elements, each F x C in
 * panels: (T + 2)^2, ceil(F / 12), C, 12), plus bias and activation, on `threads` threads.
 * shared == 0: tiles go in chunks of at most `chunk_tiles` (at least one per thread), each in a
 * thread's own slot of `slot_floats` floats in `work` (V: v_floats, then the products, then
 * rows). shared == 1 (one image, all tiles at once): the threads transform blocks of channels
 * into a V of v_floats floats at the start of `work`, then multiply blocks of filters, each in a
 * slot of its own after V (the products, then rows). */
OMRT_EXPORT void omrt_winograd_f32(const float *x, const float *U, const float *bias, float *y, float *work,
                                   int64_t v_floats, int64_t slot_floats, int64_t chunk_tiles, int64_t shared,
                                   int64_t fpass, int64_t T, int64_t threads, int64_t N, int64_t C, int64_t H,
                                   int64_t W, int64_t F, int64_t OH, int64_t OW, int64_t PT, int64_t PL, int64_t act,
                                   float alpha, float beta) {
    const int64_t tw = (OW + T - 1) / T;
    wg_job j = {.transform_in = T == 2 ? transform_in2 : transform_in4,
                .transform_out = T == 2 ? transform_out2 : transform_out4, .x = x, .U = U, .bias = bias, .y = y,
                .work = work, .v_floats = v_floats, .slot_floats = slot_floats, .fpass = fpass, .T = T, .C = C,
                .H = H, .W = W, .F = F, .OH = OH, .OW = OW, .PT = PT, .PL = PL, .act = act, .alpha = alpha,
                .beta = beta, .tw = tw, .tiles = tw * ((OH + T - 1) / T)};
    if (shared) {
        j.rows = wg_rows(T, tw, j.tiles);
        j.cblocks = threads < C ? threads : C;
        j.fblocks = threads < F ? threads : F;
        omrt_parallel(channels_part, &j, j.cblocks, threads);
        omrt_parallel(filters_part, &j, j.fblocks, threads);
        return;
    }
    /* whole rounds of chunks: 3 chunks on 2 threads left one thread idle a third of the layer */
    j.chunks = omrt_whole_rounds((j.tiles + chunk_tiles - 1) / chunk_tiles, j.tiles, threads);
    j.rows = wg_rows(T, tw, (j.tiles + j.chunks - 1) / j.chunks);
    omrt_parallel(chunk_part, &j, N * j.chunks, threads);
}
