/* Shared definitions of omrt's native kernel units (see omrt/kernels/native.py).
 *
 * Every exported function takes C-contiguous float32 arrays and int64 sizes, returns nothing and
 * touches only the output range it is given, so that omrt's threads may call it on disjoint parts
 * of one tensor at once. Hot loops are compiled once per x86-64 level and picked at load time by
 * the dynamic loader, so one library runs on any x86-64 host at its best.
 */
#ifndef OMRT_NATIVE_H
#define OMRT_NATIVE_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define OMRT_HOT __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define OMRT_HOT
#endif
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
/* For loops too short for 16-wide vectors to pay (they measured slower than 8-wide). */
#define OMRT_HOT_AVX2 __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define OMRT_HOT_AVX2
#endif
#define OMRT_EXPORT __attribute__((visibility("default")))

/* Fused activations (omrt.kernels.native.activation_code). */
enum { OMRT_ACT_NONE = 0, OMRT_ACT_RELU = 1, OMRT_ACT_LEAKY = 2, OMRT_ACT_CLIP = 3 };

static inline void omrt_activate(float *y, int64_t n, int64_t act, float alpha, float beta) {
    switch (act) {
    case OMRT_ACT_RELU:
        for (int64_t i = 0; i < n; i++) y[i] = y[i] > 0.0f ? y[i] : 0.0f;
        break;
    case OMRT_ACT_LEAKY:
        for (int64_t i = 0; i < n; i++) y[i] = y[i] < 0.0f ? y[i] * alpha : y[i];
        break;
    case OMRT_ACT_CLIP:
        for (int64_t i = 0; i < n; i++) y[i] = y[i] < alpha ? alpha : (y[i] > beta ? beta : y[i]);
        break;
    default:
        break;
    }
}

/* Window positions [*lo, *hi) of an output row of `out` positions whose tap at offset `shift`
 * (tap * dilation - begin pad) reads inside an input row of `size` elements with this stride. */
static inline void omrt_span(int64_t shift, int64_t size, int64_t stride, int64_t out,
                             int64_t *lo, int64_t *hi) {
    int64_t a = shift < 0 ? (-shift + stride - 1) / stride : 0;
    int64_t b = size - 1 - shift < 0 ? 0 : (size - 1 - shift) / stride + 1;
    *lo = a < out ? a : out;
    *hi = b < out ? b : out;
    if (*hi < *lo) *hi = *lo;
}

/* Stride-1 window loops work on a padded copy of each plane: the plane (H x W) placed at row
 * PT, column PL of a grid Hp = OH + (KH-1)*DH rows by Wp = OW + (KW-1)*DW columns, followed by
 * (KW-1)*DW floats, every element outside the plane `fill`. Each tap (kh, kw) is then one long
 * loop over all OH rows at once, element i reading i + kh*DH*Wp + kw*DW; the Wp - OW extra
 * columns of each row are computed and dropped. Scratch per plane: the grid, then as much again
 * for sums: (Hp + OH) * Wp + 2 * (KW-1) * DW floats. */
static inline void omrt_pad_plane(const float *xp, float *pad, float fill, int64_t H, int64_t W, int64_t Hp,
                                  int64_t Wp, int64_t tail, int64_t PT, int64_t PL) {
    for (int64_t i = 0; i < Hp * Wp + tail; i++) pad[i] = fill;
    int64_t c0 = PL < 0 ? -PL : 0, c1 = W < Wp - PL ? W : Wp - PL;
    for (int64_t r = 0; r < Hp; r++) {
        int64_t ih = r - PT;
        if (ih >= 0 && ih < H && c1 > c0)
            memcpy(pad + r * Wp + PL + c0, xp + ih * W + c0, (size_t)(c1 - c0) * sizeof(float));
    }
}

#endif
