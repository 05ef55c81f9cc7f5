/* Winograd F(2x2, 3x3) convolution transforms: a 3x3 stride-1 layer as 16 GEMMs over 4x4 tiles
 * (2.25x fewer multiplies than direct). The filters are transformed once, at compile time
 * (U = G g G^T); per run the input tiles are transformed (V = B^T d B), multiplied by U with
 * BLAS, and the products transformed back (Y = A^T M A), with Lavin and Gray's matrices
 * B^T = [1 0 -1 0; 0 1 1 0; 0 -1 1 0; 0 1 0 -1] and A^T = [1 1 1 0; 0 1 -1 -1]. Tiles are numbered row-major over a
 * grid `tw` tiles wide; element e = i * 4 + k of a transformed tile is row i, column k. */
#include "omrt_native.h"

/* V[e][c][t - t0] for tiles t in [t0, t1) of every channel c of x (C x H x W); tile (ty, tx)
 * reads rows 2ty - PT .. +3 and columns 2tx - PL .. +3, zero outside. `scratch` holds
 * 8 * (2 * tw + 2) floats. */
OMRT_EXPORT OMRT_HOT_AVX2 void omrt_winograd_in_f32(const float *restrict x, float *restrict V,
                                                    float *restrict scratch, int64_t C, int64_t H,
                                                    int64_t W, int64_t PT, int64_t PL, int64_t tw,
                                                    int64_t t0, int64_t t1) {
    const int64_t wp = 2 * tw + 2, n = t1 - t0, cn = C * n;
    float *restrict rows = scratch, *restrict cols = scratch + 4 * wp;
    for (int64_t c = 0; c < C; c++) {
        const float *xc = x + c * H * W;
        for (int64_t t = t0; t < t1;) {
            const int64_t ty = t / tw, tx0 = t % tw;
            const int64_t tx1 = tx0 + (t1 - t < tw - tx0 ? t1 - t : tw - tx0);
            const int64_t lo = 2 * tx0, hi = 2 * tx1 + 2;
            for (int64_t j = 0; j < 4; j++) {
                float *row = rows + j * wp;
                const int64_t iy = 2 * ty - PT + j;
                const int64_t in_lo = iy < 0 || iy >= H ? hi : (PL > lo ? PL : lo);
                const int64_t in_hi = iy < 0 || iy >= H ? hi : (W + PL < hi ? W + PL : hi);
                const float *src = xc + iy * W - PL;
                for (int64_t q = lo; q < in_lo; q++) row[q] = 0.0f;
                for (int64_t q = in_lo; q < in_hi; q++) row[q] = src[q];
                for (int64_t q = in_hi > in_lo ? in_hi : in_lo; q < hi; q++) row[q] = 0.0f;
            }
            const float *r0 = rows, *r1 = rows + wp, *r2 = rows + 2 * wp, *r3 = rows + 3 * wp;
            float *u0 = cols, *u1 = cols + wp, *u2 = cols + 2 * wp, *u3 = cols + 3 * wp;
#pragma GCC ivdep
            for (int64_t q = lo; q < hi; q++) {
                u0[q] = r0[q] - r2[q];
                u1[q] = r1[q] + r2[q];
                u2[q] = r2[q] - r1[q];
                u3[q] = r1[q] - r3[q];
            }
            for (int64_t i = 0; i < 4; i++) {
                const float *restrict ui = cols + i * wp;
                float *restrict v = V + 4 * i * cn + c * n + (t - t0) - tx0;
#pragma GCC ivdep
                for (int64_t tx = tx0; tx < tx1; tx++) {
                    const float *d = ui + 2 * tx;
                    v[tx] = d[0] - d[2];
                    v[tx + cn] = d[1] + d[2];
                    v[tx + 2 * cn] = d[2] - d[1];
                    v[tx + 3 * cn] = d[1] - d[3];
                }
            }
            t += tx1 - tx0;
        }
    }
}

/* y (F x OH x OW) for tiles [t0, t1) from the products M[e][f][t - t0], plus bias[f] (when not
 * NULL) and the fused activation; only the rows and columns inside y are written. `scratch`
 * holds 4 * tw floats. */
OMRT_EXPORT OMRT_HOT_AVX2 void omrt_winograd_out_f32(const float *restrict M, const float *restrict bias,
                                                     float *restrict y, float *restrict scratch, int64_t F,
                                                     int64_t OH, int64_t OW, int64_t tw, int64_t t0,
                                                     int64_t t1, int64_t act, float alpha, float beta) {
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
                float *dst = yf + (2 * ty + k) * OW;
                for (int64_t q = lo; q < hi; q++) dst[q] = scratch[k * wb + q];
                omrt_activate(dst + lo, hi - lo, act, alpha, beta);
            }
            t += tx1 - tx0;
        }
    }
}
