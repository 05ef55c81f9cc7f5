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

#include "omrt_math.h"

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
