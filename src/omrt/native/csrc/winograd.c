/* Winograd F(2x2, 3x3) convolution transforms: a 3x3 stride-1 layer as 16 GEMMs over 4x4 tiles
 * (2.25x fewer multiplies than direct). The filters are transformed once, at compile time
 * (U = G g G^T), each of the 16 elements' F x C matrices packed in panels for omrt's own GEMM
 * (omrt_gemm.h); per run the input tiles are transformed (V = B^T d B), multiplied by U, and the
 * products transformed back (Y = A^T M A), with Lavin and Gray's matrices
 * B^T = [1 0 -1 0; 0 1 1 0; 0 -1 1 0; 0 1 0 -1] and A^T = [1 1 1 0; 0 1 -1 -1]. Tiles are numbered row-major over a
 * grid `tw` tiles wide; element e = i * 4 + k of a transformed tile is row i, column k. */
#include "omrt_gemm.h"

/* The floats of one element of V over n tiles: strips of OMRT_MAX_NR tiles, `ctot` channels each. */
static inline int64_t element_floats(int64_t ctot, int64_t n) {
    return ctot * ((n + OMRT_MAX_NR - 1) / OMRT_MAX_NR * OMRT_MAX_NR);
}

/* V for tiles t in [t0, t1) of every channel c of x (C x H x W), laid out for omrt's GEMM: element
 * e is element_floats(ctot, n) floats after e - 1, a matrix of channels by tiles in strips of
 * OMRT_MAX_NR tiles (strip s holds tiles 32 s.., `ctot` channels of 32 floats each; V points at
 * channel 0 of these C), zero past the last tile. Tile (ty, tx) reads rows 2ty - PT .. +3 and
 * columns 2tx - PL .. +3, zero outside. `scratch` holds 5 * (2 * tw + 2) floats. The column
 * transform reads the input rows in place (a row above or below the plane reads a zero row):
 * copying them first left its loads waiting on the copy's stores. */
static OMRT_HOT_AVX2 void transform_in(const float *restrict x, float *restrict V, float *restrict scratch,
                                       int64_t C, int64_t ctot, int64_t H, int64_t W, int64_t PT, int64_t PL,
                                       int64_t tw, int64_t t0, int64_t t1) {
    const int64_t wp = 2 * tw + 2, n = t1 - t0, es = element_floats(ctot, n), strip = ctot * OMRT_MAX_NR;
    float *restrict zero = scratch, *restrict cols = scratch + wp;
    for (int64_t q = 0; q < wp; q++) zero[q] = 0.0f;
    for (int64_t c = 0; c < C; c++) {
        const float *xc = x + c * H * W;
        for (int64_t t = t0; t < t1;) {
            const int64_t ty = t / tw, tx0 = t % tw;
            const int64_t tx1 = tx0 + (t1 - t < tw - tx0 ? t1 - t : tw - tx0);
            const int64_t lo = 2 * tx0, hi = 2 * tx1 + 2;
            const int64_t in_lo = PL > lo ? (PL < hi ? PL : hi) : lo;
            const int64_t in_hi = W + PL < hi ? (W + PL > in_lo ? W + PL : in_lo) : hi;
            const float *r[4];
            for (int64_t j = 0; j < 4; j++) {
                const int64_t iy = 2 * ty - PT + j;
                r[j] = iy < 0 || iy >= H ? zero : xc + iy * W - PL;
            }
            const float *r0 = r[0], *r1 = r[1], *r2 = r[2], *r3 = r[3];
            float *u0 = cols, *u1 = cols + wp, *u2 = cols + 2 * wp, *u3 = cols + 3 * wp;
            for (int64_t q = lo; q < in_lo; q++) u0[q] = u1[q] = u2[q] = u3[q] = 0.0f;
#pragma GCC ivdep
            for (int64_t q = in_lo; q < in_hi; q++) {
                u0[q] = r0[q] - r2[q];
                u1[q] = r1[q] + r2[q];
                u2[q] = r2[q] - r1[q];
                u3[q] = r1[q] - r3[q];
            }
            for (int64_t q = in_hi; q < hi; q++) u0[q] = u1[q] = u2[q] = u3[q] = 0.0f;
            for (int64_t tx = tx0; tx < tx1;) { /* a run of tiles inside one strip */
                const int64_t q = t - t0 + tx - tx0, at = q % OMRT_MAX_NR;
                const int64_t run = tx1 - tx < OMRT_MAX_NR - at ? tx1 - tx : OMRT_MAX_NR - at;
                float *restrict base = V + q / OMRT_MAX_NR * strip + c * OMRT_MAX_NR + at - tx;
                for (int64_t i = 0; i < 4; i++) {
                    const float *restrict ui = cols + i * wp;
                    float *restrict v = base + 4 * i * es;
#pragma GCC ivdep
                    for (int64_t k = tx; k < tx + run; k++) {
                        const float *d = ui + 2 * k;
                        v[k] = d[0] - d[2];
                        v[k + es] = d[1] + d[2];
                        v[k + 2 * es] = d[2] - d[1];
                        v[k + 3 * es] = d[1] - d[3];
                    }
                }
                tx += run;
            }
            t += tx1 - tx0;
        }
        if (n % OMRT_MAX_NR) /* the last strip's columns past the last tile */
            for (int64_t e = 0; e < 16; e++)
                memset(V + e * es + n / OMRT_MAX_NR * strip + c * OMRT_MAX_NR + n % OMRT_MAX_NR, 0,
                       (size_t)(OMRT_MAX_NR - n % OMRT_MAX_NR) * sizeof(float));
    }
}

/* y (F x OH x OW) for tiles [t0, t1) from the products M[e][f][t - t0], plus bias[f] (when not
 * NULL) and the fused activation; only the rows and columns inside y are written. `scratch`
 * holds 4 * tw floats. */
static OMRT_HOT_AVX2 void transform_out(const float *restrict M, const float *restrict bias, float *restrict y,
                                        float *restrict scratch, int64_t F, int64_t OH, int64_t OW, int64_t tw,
                                        int64_t t0, int64_t t1, int64_t act, float alpha, float beta) {
    const int64_t wb = 2 * tw, n = t1 - t0, fn = F * n;
    for (int64_t f = 0; f < F; f++) {
        const float b = bias ? bias[f] : 0.0f;
        float *yf = y + f * OH * OW;
        for (int64_t t = t0; t < t1;) {
            const int64_t ty = t / tw, tx0 = t % tw;
            const int64_t tx1 = tx0 + (t1 - t < tw - tx0 ? t1 - t : tw - tx0);
            const float *restrict m = M + f * n + (t - t0) - tx0;
#pragma GCC ivdep
            for (int64_t tx = tx0; tx < tx1; tx++) {
                float e[16];
                for (int64_t k = 0; k < 16; k++) e[k] = m[k * fn + tx];
                float s0[4], s1[4];
                for (int64_t k = 0; k < 4; k++) {
                    s0[k] = e[k] + e[4 + k] + e[8 + k];
                    s1[k] = e[4 + k] - e[8 + k] - e[12 + k];
                }
                scratch[2 * tx] = s0[0] + s0[1] + s0[2] + b;
                scratch[2 * tx + 1] = s0[1] - s0[2] - s0[3] + b;
                scratch[wb + 2 * tx] = s1[0] + s1[1] + s1[2] + b;
                scratch[wb + 2 * tx + 1] = s1[1] - s1[2] - s1[3] + b;
            }
            const int64_t lo = 2 * tx0, hi = 2 * tx1 < OW ? 2 * tx1 : OW;
            for (int64_t k = 0; k < 2 && 2 * ty + k < OH; k++) {
                omrt_activate_into(yf + (2 * ty + k) * OW + lo, scratch + k * wb + lo, hi - lo, act, alpha, beta);
            }
            t += tx1 - tx0;
        }
    }
}

typedef struct {
    const float *x, *U, *bias;
    float *y, *work;
    int64_t v_floats, slot_floats, fpass, C, H, W, F, OH, OW, PT, PL, act;
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
        for (int64_t e = 0; e < 16; e++) {
            const float *Ue = j->U + (e * panels + a / OMRT_PANEL) * C * OMRT_PANEL;
            for (int64_t s = 0; s * OMRT_MAX_NR < n; s++)
                for (int64_t r0 = 0; r0 < fp; r0 += OMRT_PANEL)
                    omrt_strip_tile(Ue + r0 * C, V + e * es, s, C, fp, n, r0, M + e * fp * n, n, &none);
        }
        transform_out(M, j->bias ? j->bias + a : NULL, y + a * j->OH * j->OW, rows, fp, j->OH, j->OW, j->tw, t0, t1,
                      j->act, j->alpha, j->beta);
    }
}

/* Chunk `item` (image, tiles) in the thread's own slot: V, then the products, then rows. */
static void chunk_part(void *p, int64_t item, int64_t thread) {
    const wg_job *j = p;
    const int64_t image = item / j->chunks, k = item % j->chunks;
    const int64_t t0 = omrt_part(j->tiles, j->chunks, k), t1 = omrt_part(j->tiles, j->chunks, k + 1);
    float *V = j->work + thread * j->slot_floats, *M = V + j->v_floats, *rows = V + j->slot_floats - j->rows;
    transform_in(j->x + image * j->C * j->H * j->W, V, rows, j->C, j->C, j->H, j->W, j->PT, j->PL, j->tw, t0, t1);
    multiply(j, V, M, rows, j->y + image * j->F * j->OH * j->OW, 0, j->F, t0, t1);
}

/* Shared phase 1, part `item`: a block of channels of all tiles into the shared V. */
static void channels_part(void *p, int64_t item, int64_t thread) {
    const wg_job *j = p;
    const int64_t c0 = omrt_part(j->C, j->cblocks, item), c1 = omrt_part(j->C, j->cblocks, item + 1);
    float *rows = j->work + j->v_floats + (thread + 1) * j->slot_floats - j->rows;
    transform_in(j->x + c0 * j->H * j->W, j->work + c0 * OMRT_MAX_NR, rows, c1 - c0, j->C, j->H, j->W, j->PT, j->PL,
                 j->tw, 0, j->tiles);
}

/* Start of filter block `item` of the shared phase 2: on a panel boundary. */
static int64_t filter_cut(const wg_job *j, int64_t item) {
    const int64_t f = (omrt_part(j->F, j->fblocks, item) + OMRT_PANEL - 1) / OMRT_PANEL * OMRT_PANEL;
    return f < j->F ? f : j->F;
}

/* Shared phase 2, part `item`: a block of filters multiplied and transformed back. */
static void filters_part(void *p, int64_t item, int64_t thread) {
    const wg_job *j = p;
    float *M = j->work + j->v_floats + thread * j->slot_floats, *rows = M + j->slot_floats - j->rows;
    multiply(j, j->work, M, rows, j->y, filter_cut(j, item), filter_cut(j, item + 1), 0, j->tiles);
}

/* y (N, F, OH, OW) = the 3x3 stride-1 convolution of x (N, C, H, W), pads PT/PL, whose filters
 * transformed are U (16 elements, each F x C in panels: 16, ceil(F / 12), C, 12), plus bias and
 * activation, on `threads` threads.
 * shared == 0: tiles go in chunks of at most `chunk_tiles` (at least one per thread), each in a
 * thread's own slot of `slot_floats` floats in `work` (V: v_floats, then the products, then
 * rows). shared == 1 (one image, all tiles at once): the threads transform blocks of channels
 * into a V of v_floats floats at the start of `work`, then multiply blocks of filters, each in a
 * slot of its own after V (the products, then rows). */
OMRT_EXPORT void omrt_winograd_f32(const float *x, const float *U, const float *bias, float *y, float *work,
                                   int64_t v_floats, int64_t slot_floats, int64_t chunk_tiles, int64_t shared,
                                   int64_t fpass, int64_t threads, int64_t N, int64_t C, int64_t H, int64_t W,
                                   int64_t F, int64_t OH, int64_t OW, int64_t PT, int64_t PL, int64_t act, float alpha,
                                   float beta) {
    const int64_t tw = (OW + 1) / 2;
    wg_job j = {.x = x, .U = U, .bias = bias, .y = y, .work = work, .v_floats = v_floats,
                .slot_floats = slot_floats, .fpass = fpass, .C = C, .H = H, .W = W, .F = F,
                .OH = OH, .OW = OW, .PT = PT, .PL = PL, .act = act, .alpha = alpha, .beta = beta, .tw = tw,
                .tiles = tw * ((OH + 1) / 2),
                .rows = ((5 * (2 * tw + 2) > 4 * tw ? 5 * (2 * tw + 2) : 4 * tw) + 15) & ~(int64_t)15};
    if (shared) {
        j.cblocks = threads < C ? threads : C;
        j.fblocks = threads < F ? threads : F;
        omrt_parallel(channels_part, &j, j.cblocks, threads);
        omrt_parallel(filters_part, &j, j.fblocks, threads);
        return;
    }
    j.chunks = (j.tiles + chunk_tiles - 1) / chunk_tiles;
    if (j.chunks < threads) j.chunks = threads < j.tiles ? threads : j.tiles;
    omrt_parallel(chunk_part, &j, N * j.chunks, threads);
}
