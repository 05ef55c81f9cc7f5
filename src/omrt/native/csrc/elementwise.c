/* Elementwise activations over flat float32 arrays, split in runs over the native workers. */
#include "omrt_native.h"

typedef struct {
    const float *x, *cdf, *slope;
    float *y;
    int64_t n, parts;
} gelu_job;

/* The node arithmetic of omrt.kernels.activations.Gelu.from_table, operation for operation in
 * float32 (so that both paths give the same bits): x * 1024 clamped to the table's nodes,
 * rounded to the nearest node by adding 1.5 * 2**23, then Phi linear from that node. */
static OMRT_HOT void gelu_part(void *p, int64_t item, int64_t thread) {
    const gelu_job *j = p;
    (void)thread;
    const float rounder = 12582912.0f;
    int32_t rounder_bits;
    memcpy(&rounder_bits, &rounder, sizeof rounder_bits);
    for (int64_t i = omrt_part(j->n, j->parts, item); i < omrt_part(j->n, j->parts, item + 1); i++) {
        const float x = j->x[i];
        if (x != x) {
            j->y[i] = x;
            continue;
        }
        float pos = x * 1024.0f;
        pos = pos < -7168.0f ? -7168.0f : (pos > 6144.0f ? 6144.0f : pos);
        float node = pos + rounder;
        int32_t bits;
        memcpy(&bits, &node, sizeof bits);
        const int64_t k = (int64_t)bits - rounder_bits + 7168;
        node -= rounder;
        pos -= node;
        float phi = j->slope[k] * pos;
        phi += j->cdf[k];
        j->y[i] = phi * x;
    }
}

/* y = Gelu(x) for n floats (y may be x) from the table of Phi and its slope per node that
 * omrt.kernels.activations builds (nodes 1/1024 apart over [-7, 6]), on `threads` threads. */
OMRT_EXPORT void omrt_gelu_f32(const float *x, float *y, const float *cdf, const float *slope, int64_t n,
                               int64_t threads) {
    gelu_job j = {.x = x, .cdf = cdf, .slope = slope, .y = y, .n = n, .parts = threads < n ? threads : n};
    omrt_parallel(gelu_part, &j, j.parts, threads);
}
