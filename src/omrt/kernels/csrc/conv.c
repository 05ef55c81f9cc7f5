/* Convolution loops: depthwise 2-D convolution (every output channel reads one input channel),
 * and the im2col gather of the dense layers that BLAS then multiplies. */
#include "omrt_native.h"

/* One output plane of a stride-1 layer, on the padded plane (see omrt_pad_plane). */
static void plane_stride1(const float *xp, const float *wp, float b, float *yp, float *scratch, int64_t H,
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
static void plane_strided(const float *xp, const float *wp, float b, float *yp, const int64_t *lo,
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

/* Output planes q in [q0, q1) of y (N x M planes of OH x OW): plane q = (n, m) reads input plane
 * (n, m / mult) of x (N x M/mult planes of H x W) with filter w[m] (KH x KW), adds bias[m] (when
 * bias is not NULL) and applies the fused activation `act`. Stride-1 layers need `scratch` for
 * one padded plane (see omrt_pad_plane). */
OMRT_EXPORT OMRT_HOT void omrt_dwconv2d_f32(const float *x, const float *w, const float *bias, float *y,
                                            float *scratch, int64_t q0, int64_t q1, int64_t M, int64_t mult,
                                            int64_t H, int64_t W, int64_t OH, int64_t OW, int64_t KH,
                                            int64_t KW, int64_t SH, int64_t SW, int64_t DH, int64_t DW,
                                            int64_t PT, int64_t PL, int64_t act, float alpha, float beta) {
    int64_t lo[KW], hi[KW];
    for (int64_t kw = 0; kw < KW; kw++) omrt_span(kw * DW - PL, W, SW, OW, &lo[kw], &hi[kw]);
    for (int64_t q = q0; q < q1; q++) {
        int64_t n = q / M, m = q % M;
        const float *xp = x + (n * (M / mult) + m / mult) * H * W;
        float *yp = y + q * OH * OW;
        float b = bias ? bias[m] : 0.0f;
        if (SH == 1 && SW == 1)
            plane_stride1(xp, w + m * KH * KW, b, yp, scratch, H, W, OH, OW, KH, KW, DH, DW, PT, PL);
        else
            plane_strided(xp, w + m * KH * KW, b, yp, lo, hi, H, W, OH, OW, KH, KW, SH, SW, DH, DW, PT, PL);
        omrt_activate(yp, OH * OW, act, alpha, beta);
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
