/* Shared definitions of omrt's native kernel units (omrt/native/bindings.py states each exported
 * function's contract, which Python checks before every call).
 *
 * Every exported function takes float32 arrays and int64 sizes and returns nothing (the pool's
 * omrt_pool_busy fills int64 counters);
 * a `threads` argument says how many of the worker pool's threads (workers.c) it may spread its
 * work over, each with its part of any scratch it is given. Hot loops are compiled once per
 * x86-64 level and picked at load time by the dynamic loader, so one library runs on any x86-64
 * host at its best.
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
/* Inlined into each per-ISA clone of its caller, so that it is compiled for that ISA too. */
#define OMRT_INLINE inline __attribute__((always_inline))

/* One argument of a call in a call list (omrt_run_calls, workers.c): a generated thunk per
 * exported function (omrt.native.signature.Function.thunk) reads a vector of them, pointers and
 * integers as they are, floats stored as doubles. */
typedef union {
    int64_t i;
    double f;
    void *p;
} omrt_arg;
typedef void (*omrt_thunk)(const omrt_arg *args);

/* Fused activations (omrt.native.bindings.ACTIVATIONS). */
enum { OMRT_ACT_NONE = 0, OMRT_ACT_RELU = 1, OMRT_ACT_LEAKY = 2, OMRT_ACT_CLIP = 3, OMRT_ACT_HARD_SIGMOID = 4 };

/* HardSigmoid: alpha * v + beta, clamped to [0, 1]. */
static inline float omrt_hard_sigmoid(float v, float alpha, float beta) {
    float t = alpha * v + beta;
    return t < 0.0f ? 0.0f : (t > 1.0f ? 1.0f : t);
}

/* dst[i] = act(src[i]) for i < n (dst may be src). Copying and activating in one pass also keeps a
 * row from being read back right after a copy wrote it, which stalls when the copy was a string
 * move (glibc's memcpy for short runs). */
static inline void omrt_activate_into(float *dst, const float *src, int64_t n, int64_t act, float alpha, float beta) {
    switch (act) {
    case OMRT_ACT_RELU:
        for (int64_t i = 0; i < n; i++) dst[i] = src[i] > 0.0f ? src[i] : 0.0f;
        break;
    case OMRT_ACT_LEAKY:
        for (int64_t i = 0; i < n; i++) dst[i] = src[i] < 0.0f ? src[i] * alpha : src[i];
        break;
    case OMRT_ACT_CLIP:
        for (int64_t i = 0; i < n; i++) dst[i] = src[i] < alpha ? alpha : (src[i] > beta ? beta : src[i]);
        break;
    case OMRT_ACT_HARD_SIGMOID:
        for (int64_t i = 0; i < n; i++) dst[i] = omrt_hard_sigmoid(src[i], alpha, beta);
        break;
    default:
        if (dst != src)
            for (int64_t i = 0; i < n; i++) dst[i] = src[i];
        break;
    }
}

static inline void omrt_activate(float *y, int64_t n, int64_t act, float alpha, float beta) {
    omrt_activate_into(y, y, n, act, alpha, beta);
}

/* The worker pool (workers.c): fn(ctx, item, thread) for every item in [0, count), on up to
 * `threads` threads (thread 0 is the caller; at most OMRT_MAX_THREADS), returning when all are
 * done. Items must write disjoint memory; `thread` lets each use scratch of its own. */
#define OMRT_MAX_THREADS 64
typedef void (*omrt_item_fn)(void *ctx, int64_t item, int64_t thread);
void omrt_parallel(omrt_item_fn fn, void *ctx, int64_t count, int64_t threads);

/* c (m x n, row pitch ldc) = a (m x k) @ b (k x n), row-major, through the BLAS numpy uses; ta
 * (tb) when a (b) is stored transposed, lda (ldb) then its pitch as stored. */
void omrt_sgemm_t(int64_t ta, int64_t tb, int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
                  const float *b, int64_t ldb, float *c, int64_t ldc);

/* y (every incy-th float) = A x, or A^T x when ta, A (m x n, row pitch lda) as stored. */
void omrt_sgemv(int64_t ta, int64_t m, int64_t n, const float *a, int64_t lda, const float *x, int64_t incx,
                float *y, int64_t incy);

/* omrt_sgemm_t of untransposed operands; one column (a layer on 1x1 planes) through sgemv, since
 * BLAS's sgemm would copy all of a first. */
static inline void omrt_sgemm(int64_t m, int64_t n, int64_t k, const float *a, int64_t lda, const float *b,
                              int64_t ldb, float *c, int64_t ldc) {
    if (n == 1)
        omrt_sgemv(0, m, k, a, lda, b, ldb, c, ldc);
    else
        omrt_sgemm_t(0, 0, m, n, k, a, lda, b, ldb, c, ldc);
}

/* How many parts to cut each of `items` independent items into for `threads` threads: the
 * fewest that give every thread as many parts (or at least four each). */
static inline int64_t omrt_parts_per(int64_t items, int64_t threads) {
    int64_t parts = 1;
    while (threads > 1 && (items * parts) % threads != 0 && items * parts < 4 * threads) parts++;
    return parts;
}

/* Chunks of a split whose work per chunk is all alike: `chunks` (as few as fit a thread's scratch)
 * rounded up to whole rounds, as many for each of `threads` threads, at most `most` (one unit of
 * work each). 7 chunks of a layer on 2 threads left one thread the seventh alone; 8, each a little
 * smaller, do not. */
static inline int64_t omrt_whole_rounds(int64_t chunks, int64_t most, int64_t threads) {
    const int64_t rounded = (chunks + threads - 1) / threads * threads;
    return rounded < most ? rounded : most;
}

/* Start of part i of `total` split into `parts` nearly equal consecutive ranges. */
static inline int64_t omrt_part(int64_t total, int64_t parts, int64_t i) { return total * i / parts; }

/* Rows of c (rows x cols, pitch ldc): + bias[row] (when bias is not NULL), then the activation. */
static inline void omrt_bias_act(float *c, int64_t rows, int64_t cols, int64_t ldc, const float *bias,
                                 int64_t act, float alpha, float beta) {
    for (int64_t r = 0; r < rows; r++) {
        float *row = c + r * ldc;
        if (bias) {
            const float b = bias[r];
            for (int64_t i = 0; i < cols; i++) row[i] += b;
        }
        omrt_activate(row, cols, act, alpha, beta);
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

#endif
