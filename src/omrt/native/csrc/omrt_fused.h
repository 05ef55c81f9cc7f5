/* The prelude of the fused kernels omrt compile generates for a model's elementwise chains
 * (omrt/native/fusegen.py writes them, omrt/native/fused.py builds and loads them).
 *
 * A generated library holds one exported function per chain:
 *     void omrt_fused_<n>(const float *in0, ..., float *out0, ..., int64_t threads)
 * whose array sizes are fixed by the chain's guard (checked in Python before every call). It
 * runs its items on the worker pool of the model's native library (workers.c), handed over at
 * load through omrt_fused_use_pool; without it, on the calling thread. The math below is
 * branch-free, so the loops that use it vectorize; each stays within a few float ulps of libm.
 */
#ifndef OMRT_FUSED_H
#define OMRT_FUSED_H

#include "omrt_native.h"

typedef void (*omrt_pool_fn)(omrt_item_fn fn, void *ctx, int64_t count, int64_t threads);

static omrt_pool_fn omrt_fused_pool = 0;

OMRT_EXPORT void omrt_fused_use_pool(void *pool) { omrt_fused_pool = (omrt_pool_fn)pool; }

/* fn(ctx, item, thread) for every item in [0, count), on the pool when there is one. */
static void omrt_fused_run(omrt_item_fn fn, void *ctx, int64_t count, int64_t threads) {
    if (omrt_fused_pool && threads > 1 && count > 1) {
        omrt_fused_pool(fn, ctx, count, threads);
        return;
    }
    for (int64_t i = 0; i < count; i++) fn(ctx, i, 0);
}

static OMRT_INLINE float omrt_fx_clip(float x, float lo, float hi) { return x < lo ? lo : (x > hi ? hi : x); }

static OMRT_INLINE float omrt_fx_bits(int32_t i) {
    float f;
    memcpy(&f, &i, sizeof f);
    return f;
}

static OMRT_INLINE int32_t omrt_fx_int_bits(float f) {
    int32_t i;
    memcpy(&i, &f, sizeof i);
    return i;
}

/* exp(x): x = k ln2 + r, |r| <= ln2 / 2, e^r by Cephes' expf polynomial, 2^k from the bits (in
 * two halves, so that k = 128 at the top of the range stays finite). k is rounded by adding
 * 1.5 * 2^23, with no float-to-int conversion: a conversion of a clamped value keeps GCC from
 * vectorizing the loop for AVX2 and AVX-512. Below -87.3 the result is 0 (e^x is subnormal
 * there), above 88.7 it is +inf. */
static OMRT_INLINE float omrt_fx_exp(float x) {
    const float hi = 88.72283f, lo = -87.33654f, round = 12582912.0f;
    float c = x > hi ? hi : x;
    c = c < lo ? lo : c;
    float kf = c * 1.44269504088896341f + round;
    int32_t k = omrt_fx_int_bits(kf) - omrt_fx_int_bits(round);
    float n = kf - round;
    float r = c - n * 0.693359375f;
    r = r + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    int32_t half = k >> 1;
    float e = (p * r * r + r + 1.0f) * omrt_fx_bits((half + 127) << 23) * omrt_fx_bits((k - half + 127) << 23);
    e = x > hi ? omrt_fx_bits(0x7f800000) : e;
    e = x < lo ? 0.0f : e;
    return x != x ? x : e;
}

static OMRT_INLINE float omrt_fx_sigmoid(float x) { return 1.0f / (1.0f + omrt_fx_exp(-x)); }

/* tanh(x) = sign(x) (1 - e) / (1 + e), e = exp(-2|x|); near 0, its odd series. */
static OMRT_INLINE float omrt_fx_tanh(float x) {
    float a = fabsf(x);
    float e = omrt_fx_exp(-2.0f * a);
    float t = (1.0f - e) / (1.0f + e);
    float x2 = x * x;
    float s = a * (1.0f + x2 * (-0.333333333f + x2 * (0.133333333f + x2 * -0.0539682540f)));
    t = a < 0.0625f ? s : t;
    return x < 0.0f ? -t : t;
}

/* erf(x): a rational approximation on [-4, 4] (odd numerator, even denominator), +-1 beyond. */
static OMRT_INLINE float omrt_fx_erf(float x) {
    float c = x > 4.0f ? 4.0f : (x < -4.0f ? -4.0f : x);
    float x2 = c * c;
    float p = -2.72614225801306e-10f;
    p = p * x2 + 2.77068142495902e-08f;
    p = p * x2 + -2.10102402082508e-06f;
    p = p * x2 + -5.69250639462346e-05f;
    p = p * x2 + -7.34990630326855e-04f;
    p = p * x2 + -2.95459980854025e-03f;
    p = p * x2 + -1.60960333262415e-02f;
    float q = -1.45660718464996e-05f;
    q = q * x2 + -2.13374055278905e-04f;
    q = q * x2 + -1.68282697438203e-03f;
    q = q * x2 + -7.37332916720468e-03f;
    q = q * x2 + -1.42647390514189e-02f;
    return c * p / q;
}

#endif
