/* 2-D max and average pooling over NCHW planes. */
#include "omrt_native.h"

/* Max (the x86 max instruction's form, which a NaN need not win: rows holding one are redone by
 * nan_windows), or the sum for average pooling. */
static inline float pool_step(float acc, float v, int64_t is_max) {
    return is_max ? (v > acc ? v : acc) : acc + v;
}

/* yr[ow] op= tmp[ow * SW + shift] for the positions that read inside the row; SW is a constant
 * at the call sites below, so that the compiler vectorizes the strided reads. */
static inline void pool_columns(float *yr, const float *tmp, const int64_t *lo, const int64_t *hi,
                                int64_t KW, int64_t SW, int64_t DW, int64_t PL, int64_t is_max) {
    for (int64_t kw = 0; kw < KW; kw++) {
        int64_t shift = kw * DW - PL;
        for (int64_t ow = lo[kw]; ow < hi[kw]; ow++) yr[ow] = pool_step(yr[ow], tmp[ow * SW + shift], is_max);
    }
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

/* One plane of a stride-1 pool on the padded plane (see omrt_pad_plane): the rows, then the
 * columns, each tap one long loop; 0 when the plane holds a NaN (the caller then takes the row
 * path, which propagates it). */
static int plane_stride1(const float *xp, float *yp, const float *inv_count, float *scratch, int64_t H,
                         int64_t W, int64_t OH, int64_t OW, int64_t KH, int64_t KW, int64_t DH, int64_t DW,
                         int64_t PT, int64_t PL, int64_t is_max) {
    int64_t Wp = OW + (KW - 1) * DW, Hp = OH + (KH - 1) * DH, L = OH * Wp, V = L + (KW - 1) * DW;
    float *pad = scratch, *rows = scratch + Hp * Wp + (KW - 1) * DW;
    omrt_pad_plane(xp, pad, is_max ? -INFINITY : 0.0f, H, W, Hp, Wp, (KW - 1) * DW, PT, PL);
    int nan = 0;
    for (int64_t i = 0; i < V; i++) rows[i] = pad[i];
    for (int64_t kh = 1; kh < KH; kh++) {
        const float *src = pad + kh * DH * Wp;
        for (int64_t i = 0; i < V; i++) {
            rows[i] = pool_step(rows[i], src[i], is_max);
            nan |= src[i] != src[i];
        }
    }
    for (int64_t i = 0; i < V; i++) nan |= pad[i] != pad[i];
    if (nan && is_max) return 0;
    for (int64_t i = 0; i < L; i++) pad[i] = rows[i];
    for (int64_t kw = 1; kw < KW; kw++)
        for (int64_t i = 0; i < L; i++) pad[i] = pool_step(pad[i], rows[i + kw * DW], is_max);
    for (int64_t oh = 0; oh < OH; oh++) {
        float *yr = yp + oh * OW;
        const float *src = pad + oh * Wp;
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
} pool_job;

static OMRT_HOT void pool_part(void *p, int64_t item, int64_t thread) {
    const pool_job *j = p;
    const int64_t H = j->H, W = j->W, OH = j->OH, OW = j->OW, KH = j->KH, KW = j->KW, SH = j->SH, SW = j->SW,
                  DH = j->DH, DW = j->DW, PT = j->PT, PL = j->PL, is_max = j->is_max;
    const float *inv_count = j->inv_count;
    float *scratch = j->scratch + thread * j->pitch;
    float init = is_max ? -INFINITY : 0.0f;
    int64_t lo[KW], hi[KW];
    for (int64_t kw = 0; kw < KW; kw++) omrt_span(kw * DW - PL, W, SW, OW, &lo[kw], &hi[kw]);
    for (int64_t p = omrt_part(j->planes, j->parts, item); p < omrt_part(j->planes, j->parts, item + 1); p++) {
        const float *xp = j->x + p * H * W;
        float *yp = j->y + p * OH * OW;
        if (SH == 1 && SW == 1 &&
            plane_stride1(xp, yp, inv_count, scratch, H, W, OH, OW, KH, KW, DH, DW, PT, PL, is_max))
            continue;
        for (int64_t oh = 0; oh < OH; oh++) {
            float *yr = yp + oh * OW;
            for (int64_t iw = 0; iw < W; iw++) scratch[iw] = init;
            int nan = 0;
            for (int64_t kh = 0; kh < KH; kh++) {
                int64_t ih = oh * SH + kh * DH - PT;
                if (ih < 0 || ih >= H) continue;
                const float *xr = xp + ih * W;
                for (int64_t iw = 0; iw < W; iw++) {
                    scratch[iw] = pool_step(scratch[iw], xr[iw], is_max);
                    nan |= xr[iw] != xr[iw];
                }
            }
            for (int64_t ow = 0; ow < OW; ow++) yr[ow] = init;
            if (SW == 1)
                pool_columns(yr, scratch, lo, hi, KW, 1, DW, PL, is_max);
            else if (SW == 2)
                pool_columns(yr, scratch, lo, hi, KW, 2, DW, PL, is_max);
            else
                pool_columns(yr, scratch, lo, hi, KW, SW, DW, PL, is_max);
            if (!is_max) {
                const float *inv = inv_count + oh * OW;
                for (int64_t ow = 0; ow < OW; ow++) yr[ow] *= inv[ow];
            } else if (nan) {
                nan_windows(yr, xp, lo, hi, oh, H, W, KH, KW, SH, SW, DH, DW, PT, PL);
            }
        }
    }
}

/* y[p] = pool of x[p] for each of the `planes` planes, split over `threads` threads. Stride-1
 * pools run on a padded plane in scratch (see omrt_pad_plane); the others one output row at a
 * time: the rows its windows read are first reduced into scratch (W floats), then the columns.
 * Each thread's scratch is `pitch` floats after the previous one's. `inv_count` (OH*OW) holds
 * 1 / the divisor of each window for average pooling (ignored for max). Reads outside the input
 * are padding: -inf for max, nothing for average (the divisor says whether pads count). */
OMRT_EXPORT void omrt_pool2d_f32(const float *x, float *y, const float *inv_count, float *scratch, int64_t pitch,
                                 int64_t threads, int64_t planes, int64_t H, int64_t W, int64_t OH, int64_t OW,
                                 int64_t KH, int64_t KW, int64_t SH, int64_t SW, int64_t DH, int64_t DW, int64_t PT,
                                 int64_t PL, int64_t is_max) {
    pool_job j = {x, inv_count, y, scratch, planes, threads < planes ? threads : planes, pitch, H, W, OH, OW, KH,
                  KW, SH, SW, DH, DW, PT, PL, is_max};
    omrt_parallel(pool_part, &j, j.parts, threads);
}
