/* Elementwise loops over flat float32 arrays, each split in consecutive runs over the native workers. */
#include "omrt_gemm.h"

/* The work of elements [lo, hi) of a flat loop described by `job`. */
typedef void (*run_fn)(const void *job, int64_t lo, int64_t hi);

typedef struct {
    run_fn run;
    const void *job;
    int64_t n, parts;
} split_job;

static void split_part(void *p, int64_t item, int64_t thread) {
    const split_job *s = p;
    (void)thread;
    s->run(s->job, omrt_part(s->n, s->parts, item), omrt_part(s->n, s->parts, item + 1));
}

/* run(job, lo, hi) over [0, n) cut in one nearly equal run per thread: elementwise work costs the
 * same everywhere, so finer parts would only add handoffs. */
static void split(run_fn run, const void *job, int64_t n, int64_t threads) {
    split_job s = {.run = run, .job = job, .n = n, .parts = threads < n ? threads : n};
    omrt_parallel(split_part, &s, s.parts, threads);
}

typedef struct {
    const float *x, *cdf, *slope;
    float *y;
} gelu_job;

/* The node arithmetic of omrt.kernels.activations.Gelu.from_table, operation for operation in
 * float32 (so that every path gives the same bits): x * 1024 clamped to the table's nodes,
 * rounded to the nearest node by adding 1.5 * 2**23 (the node's index is then in the low bits),
 * then Phi linear from that node. A NaN clamps to the first node, and Phi times the NaN is that
 * NaN, quieted, as numpy gives it. */
#define GELU_SCALE 1024.0f
#define GELU_LOW (-7168.0f)
#define GELU_HIGH 6144.0f
#define GELU_ROUNDER 12582912.0f

/* Each product and sum rounded on its own, as numpy rounds them (the library is built with
 * -ffp-contract=fast, which would fuse them, even written as intrinsics, into one FMA). */
#define GELU_EXACT __attribute__((optimize("fp-contract=off")))

static int32_t gelu_rounder_bits(void) {
    const float rounder = GELU_ROUNDER;
    int32_t bits;
    memcpy(&bits, &rounder, sizeof bits);
    return bits;
}

GELU_EXACT static void gelu_c(const gelu_job *j, int64_t lo, int64_t hi) {
    const int32_t rounder_bits = gelu_rounder_bits();
    for (int64_t i = lo; i < hi; i++) {
        const float x = j->x[i];
        float pos = x * GELU_SCALE;
        pos = !(pos >= GELU_LOW) ? GELU_LOW : (pos > GELU_HIGH ? GELU_HIGH : pos);
        float node = pos + GELU_ROUNDER;
        int32_t bits;
        memcpy(&bits, &node, sizeof bits);
        const int64_t k = (int64_t)bits - rounder_bits - (int64_t)GELU_LOW;
        node -= GELU_ROUNDER;
        pos -= node;
        float phi = j->slope[k] * pos;
        phi += j->cdf[k];
        j->y[i] = phi * x;
    }
}

#ifdef OMRT_X86
/* gelu_c 16 floats at a time, the table read by gathers (a scalar loop of two table reads per
 * float took 8-10% of a MiniLM encoder's run). max and min return their second operand, the
 * bound, for a NaN; the separate multiply and add give gelu_c's bits. */
OMRT_AVX512 GELU_EXACT static void gelu_avx512(const gelu_job *j, int64_t lo, int64_t hi) {
    const __m512i first = _mm512_set1_epi32(gelu_rounder_bits() + (int32_t)GELU_LOW);
    const __m512 scale = _mm512_set1_ps(GELU_SCALE), low = _mm512_set1_ps(GELU_LOW);
    const __m512 high = _mm512_set1_ps(GELU_HIGH), rounder = _mm512_set1_ps(GELU_ROUNDER);
    for (int64_t i = lo; i < hi; i += 16) {
        const __mmask16 m = hi - i >= 16 ? 0xFFFF : (__mmask16)((1u << (hi - i)) - 1);
        const __m512 x = _mm512_maskz_loadu_ps(m, j->x + i);
        __m512 pos = _mm512_min_ps(_mm512_max_ps(_mm512_mul_ps(x, scale), low), high);
        __m512 node = _mm512_add_ps(pos, rounder);
        const __m512i k = _mm512_sub_epi32(_mm512_castps_si512(node), first);
        pos = _mm512_sub_ps(pos, _mm512_sub_ps(node, rounder));
        __m512 phi = _mm512_mul_ps(_mm512_i32gather_ps(k, j->slope, 4), pos);
        phi = _mm512_add_ps(phi, _mm512_i32gather_ps(k, j->cdf, 4));
        _mm512_mask_storeu_ps(j->y + i, m, _mm512_mul_ps(phi, x));
    }
}

/* gelu_avx512 8 floats at a time, the tail through gelu_c. */
OMRT_AVX2 GELU_EXACT static void gelu_avx2(const gelu_job *j, int64_t lo, int64_t hi) {
    const __m256i first = _mm256_set1_epi32(gelu_rounder_bits() + (int32_t)GELU_LOW);
    const __m256 scale = _mm256_set1_ps(GELU_SCALE), low = _mm256_set1_ps(GELU_LOW);
    const __m256 high = _mm256_set1_ps(GELU_HIGH), rounder = _mm256_set1_ps(GELU_ROUNDER);
    int64_t i = lo;
    for (; i + 8 <= hi; i += 8) {
        const __m256 x = _mm256_loadu_ps(j->x + i);
        __m256 pos = _mm256_min_ps(_mm256_max_ps(_mm256_mul_ps(x, scale), low), high);
        __m256 node = _mm256_add_ps(pos, rounder);
        const __m256i k = _mm256_sub_epi32(_mm256_castps_si256(node), first);
        pos = _mm256_sub_ps(pos, _mm256_sub_ps(node, rounder));
        __m256 phi = _mm256_mul_ps(_mm256_i32gather_ps(j->slope, k, 4), pos);
        phi = _mm256_add_ps(phi, _mm256_i32gather_ps(j->cdf, k, 4));
        _mm256_storeu_ps(j->y + i, _mm256_mul_ps(phi, x));
    }
    gelu_c(j, i, hi);
}
#endif

static void gelu_run(const void *p, int64_t lo, int64_t hi) {
#ifdef OMRT_X86
    const int level = omrt_gemm_level_once();
    if (level == 2) return gelu_avx512(p, lo, hi);
    if (level == 1) return gelu_avx2(p, lo, hi);
#endif
    gelu_c(p, lo, hi);
}

/* y = Gelu(x) for n floats (y may be x) from the table of Phi and its slope per node that
 * omrt.kernels.activations builds (nodes 1/1024 apart over [-7, 6]), on `threads` threads. */
OMRT_EXPORT void omrt_gelu_f32(const float *x, float *y, const float *cdf, const float *slope, int64_t n,
                               int64_t threads) {
    gelu_job j = {.x = x, .cdf = cdf, .slope = slope, .y = y};
    split(gelu_run, &j, n, threads);
}

/* Pixels of one image LRN computes together: the channel rows a window reads stay in L1. */
#define LRN_BLOCK 512

typedef struct {
    const float *x;
    float *y;
    int64_t C, P, below, above;
    float scale, bias;
} lrn_job;

/* LRN (beta 0.75) of pixels [p0, p0 + n) of every channel of one image (x, y: C planes of P):
 * each channel's window of squares summed in the order omrt.kernels.normalization.LRN adds them,
 * then y = x * t^-0.75 with t = sum * scale + bias, as 1/sqrt(t) times its square root. */
static OMRT_INLINE void lrn_pixels(const lrn_job *j, const float *x, float *y, int64_t p0, int64_t n) {
    float acc[LRN_BLOCK];
    for (int64_t c = 0; c < j->C; c++) {
        for (int64_t i = 0; i < n; i++) acc[i] = 0.0f;
        for (int64_t at = c - j->below; at <= c + j->above; at++) {
            if (at < 0 || at >= j->C) continue;
            const float *row = x + at * j->P + p0;
            for (int64_t i = 0; i < n; i++) acc[i] += row[i] * row[i];
        }
        const float *xr = x + c * j->P + p0;
        float *yr = y + c * j->P + p0;
        for (int64_t i = 0; i < n; i++) {
            const float t = acc[i] * j->scale + j->bias, r = 1.0f / sqrtf(t);
            yr[i] = xr[i] * (r * sqrtf(r));
        }
    }
}

/* Pixels [lo, hi) of the flat (image, pixel) range, in blocks within one image each. */
static OMRT_HOT void lrn_run(const void *p, int64_t lo, int64_t hi) {
    const lrn_job *j = p;
    for (int64_t q = lo; q < hi;) {
        const int64_t image = q / j->P, p0 = q % j->P;
        int64_t n = hi - q < j->P - p0 ? hi - q : j->P - p0;
        n = n < LRN_BLOCK ? n : LRN_BLOCK;
        lrn_pixels(j, j->x + image * j->C * j->P, j->y + image * j->C * j->P, p0, n);
        q += n;
    }
}

/* Local response normalization across channels, beta 0.75 (every model that uses LRN): y = x /
 * (bias + scale * the sum of x^2 over channels c - below .. c + above)^0.75, x and y N images of
 * C planes of P pixels (y is not x: the windows read x after y's first channels are written), on
 * `threads` threads. `scale` is alpha / size. */
OMRT_EXPORT void omrt_lrn_f32(const float *x, float *y, int64_t N, int64_t C, int64_t P, int64_t below,
                              int64_t above, float scale, float bias, int64_t threads) {
    lrn_job j = {.x = x, .y = y, .C = C, .P = P, .below = below, .above = above, .scale = scale, .bias = bias};
    split(lrn_run, &j, N * P, threads);
}

/* The arithmetic ops (omrt.native.bindings.ARITHMETIC); SUB_FROM and DIV_INTO take their operands
 * swapped. MAX and MIN return a NaN operand (numpy's maximum and minimum). */
enum { OP_ADD, OP_SUB, OP_MUL, OP_DIV, OP_SUB_FROM, OP_DIV_INTO, OP_MAX, OP_MIN };

/* Elements the binary loop computes before applying the activation to them, while they are in L1. */
#define BLOCK 2048

typedef struct {
    const float *a, *b;
    float *y;
    int64_t op, inner, b_rows, b_cols, act;
    float alpha, beta;
} binary_job;

/* y[i] = expr for i in [0, n), B being b[i] (b_step) or b[0]. y may be a or b itself: each
 * element is read before it is written, so ivdep (no dependence between iterations) holds. */
#define EACH(expr)                                                               \
    do {                                                                         \
        if (b_step) {                                                            \
            _Pragma("GCC ivdep") for (int64_t i = 0; i < n; i++) {               \
                const float B = b[i];                                            \
                y[i] = (expr);                                                   \
            }                                                                    \
        } else {                                                                 \
            const float B = b[0];                                                \
            _Pragma("GCC ivdep") for (int64_t i = 0; i < n; i++) y[i] = (expr); \
        }                                                                        \
    } while (0)

/* Always inlined: left out of line, GCC built it once, for the baseline CPU (SSE2), outside the
 * clones of binary_run. */
static OMRT_INLINE void arith(int64_t op, const float *a, const float *b, int b_step, float *y, int64_t n) {
    switch (op) {
    case OP_ADD: EACH(a[i] + B); break;
    case OP_SUB: EACH(a[i] - B); break;
    case OP_MUL: EACH(a[i] * B); break;
    case OP_DIV: EACH(a[i] / B); break;
    case OP_SUB_FROM: EACH(B - a[i]); break;
    case OP_DIV_INTO: EACH(B / a[i]); break;
    case OP_MAX: EACH(a[i] > B || a[i] != a[i] ? a[i] : B); break;
    case OP_MIN: EACH(a[i] < B || a[i] != a[i] ? a[i] : B); break;
    default: break;
    }
}

/* Elements [lo, hi) of y, row by row (b's row r % b_rows each), in blocks of at most BLOCK. */
static OMRT_HOT void binary_run(const void *p, int64_t lo, int64_t hi) {
    const binary_job *j = p;
    const int vector = j->b_cols != 1;
    for (int64_t i = lo; i < hi;) {
        const int64_t row = i / j->inner, col = i - row * j->inner;
        int64_t end = (row + 1) * j->inner;
        if (end > hi) end = hi;
        if (end > i + BLOCK) end = i + BLOCK;
        const float *b = j->b + (row % j->b_rows) * j->b_cols + (vector ? col : 0);
        arith(j->op, j->a + i, b, vector, j->y + i, end - i);
        omrt_activate(j->y + i, end - i, j->act, j->alpha, j->beta);
        i = end;
    }
}

/* y = a op b, then the activation, for y and a of rows x inner floats and b of b_rows x b_cols:
 * row r of y reads row r % b_rows of b, whole (b_cols == inner) or one value for the row
 * (b_cols == 1). y may be a or b (same size), not overlap them otherwise. On `threads` threads. */
OMRT_EXPORT void omrt_binary_f32(const float *a, const float *b, float *y, int64_t op, int64_t rows, int64_t inner,
                                 int64_t b_rows, int64_t b_cols, int64_t threads, int64_t act, float alpha,
                                 float beta) {
    binary_job j = {.a = a, .b = b, .y = y, .op = op, .inner = inner, .b_rows = b_rows, .b_cols = b_cols,
                    .act = act, .alpha = alpha, .beta = beta};
    split(binary_run, &j, rows * inner, threads);
}

/* y[b * pitch + i] = x[b * size + i] for every block b < blocks and i < size: an input of a
 * Concat into its slice of the output (pitch: the output's floats per block). */
OMRT_EXPORT void omrt_copy_blocks_f32(const float *x, float *y, int64_t blocks, int64_t size, int64_t pitch) {
    for (int64_t b = 0; b < blocks; b++) memcpy(y + b * pitch, x + b * size, (size_t)size * sizeof(float));
}

typedef struct {
    const float *x;
    float *y;
    int64_t W, kh, kw;
} repeat_job;

/* Input rows [lo, hi) of the planes (W floats each, rows of every plane in order), each widened
 * kw times into its first output row, then that row copied to the kh - 1 rows below it. */
static OMRT_HOT void repeat_run(const void *p, int64_t lo, int64_t hi) {
    const repeat_job *j = p;
    const int64_t wide = j->W * j->kw;
    for (int64_t r = lo; r < hi; r++) {
        const float *row = j->x + r * j->W;
        float *out = j->y + r * j->kh * wide;
        if (j->kw == 2)
            for (int64_t i = 0; i < j->W; i++) out[2 * i] = out[2 * i + 1] = row[i];
        else
            for (int64_t i = 0; i < j->W; i++)
                for (int64_t k = 0; k < j->kw; k++) out[i * j->kw + k] = row[i];
        for (int64_t k = 1; k < j->kh; k++) memcpy(out + k * wide, out, (size_t)wide * sizeof(float));
    }
}

/* Nearest upsampling by whole factors of the last two axes: y (rows * kh x W * kw) holds each
 * element of x (rows x W; rows: every plane's rows in order) kh x kw times, on `threads` threads. */
OMRT_EXPORT void omrt_repeat2d_f32(const float *x, float *y, int64_t rows, int64_t W, int64_t kh, int64_t kw,
                                   int64_t threads) {
    repeat_job j = {.x = x, .y = y, .W = W, .kh = kh, .kw = kw};
    split(repeat_run, &j, rows, threads);
}
