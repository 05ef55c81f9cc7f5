/* Branch-free float math the native loops share (the fused kernels' prelude, omrt_fused.h, and
 * the units' own loops): written so that the loops that use it vectorize, each within a few float
 * ulps of libm. */
#ifndef OMRT_MATH_H
#define OMRT_MATH_H

#include "omrt_native.h"

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

#endif
