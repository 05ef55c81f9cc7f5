/* The depthwise pixel loop over interleaved lanes at one vector width, included by conv.c once
 * per width: DW_VEC is the vector type (VL floats), DW_NAME(f) names this width's copy of f,
 * DW_TARGET the ISAs it is compiled for (the others would never run it), DW_SPAN the lanes it
 * computes (OMRT_LANES, or the first 8 for a block of at most 8 channels). Where the CPU has
 * AVX-512 it runs 16 floats at a time; elsewhere 8, since GCC moves 64-byte vectors through the
 * stack on AVX2 (the loop ran 2.5-4x slower there). A 16-lane pixel is then two vectors, one
 * after the other. */

/* Pixels [0, n) of a row of the narrow path, the first reading `at`, into `out`, lanes
 * interleaved: KW taps across, DW apart, windows SW apart, each pixel its own chain of FMAs (one
 * accumulator alone would wait on its previous FMA at every tap). Called with constant KW, SW, DW
 * and n, the loops unroll, and an input vector that several (pixel, tap) pairs read is loaded
 * once for all of them. */
static OMRT_INLINE void DW_NAME(dw_pixels)(const dw_job *j, const float *at, int64_t wide, const float *tap,
                                           const float *bias, float *out, const int64_t KW, const int64_t SW,
                                           const int64_t DW, const int64_t n) {
    const int64_t VL = sizeof(DW_VEC) / sizeof(float);
    for (int64_t h = 0; h < DW_SPAN; h += VL) {
        DW_VEC acc[DW_PIXELS];
        for (int64_t p = 0; p < n; p++) acc[p] = *(const DW_VEC *)(bias + h);
        for (int64_t kh = 0; kh < j->KH; kh++) {
            const float *row = at + kh * j->DH * wide * OMRT_LANES + h;
            for (int64_t kw = 0; kw < KW; kw++) {
                const DW_VEC t = *(const DW_VEC *)(tap + (kh * KW + kw) * OMRT_LANES + h);
                for (int64_t p = 0; p < n; p++) acc[p] += t * *(const DW_VEC *)(row + (p * SW + kw * DW) * OMRT_LANES);
            }
        }
        for (int64_t p = 0; p < n; p++) *(DW_VEC *)(out + p * OMRT_LANES + h) = acc[p];
    }
    for (int64_t h = DW_SPAN; h < OMRT_LANES; h += VL) /* lanes past the block's channels: zeros */
        for (int64_t p = 0; p < n; p++) *(DW_VEC *)(out + p * OMRT_LANES + h) = (DW_VEC){0};
}

/* The common windows (3, 5 or 7 taps across, stride 1 or 2, DW_PIXELS or DW_PIXELS - 1 pixels: a
 * 7-wide plane) with their shape constant; any other runs with it read from the job. The case
 * is KW * 4 + SW, unique for strides up to 3. */
#define DW_FIXED(kw, sw)                                                                                  \
    case kw * 4 + sw:                                                                                     \
        if (n == DW_PIXELS)                                                                               \
            DW_NAME(dw_pixels)(j, at, wide, tap, bias, out, kw, sw, 1, DW_PIXELS);                          \
        else                                                                                              \
            DW_NAME(dw_pixels)(j, at, wide, tap, bias, out, kw, sw, 1, DW_PIXELS - 1);                      \
        return

static OMRT_INLINE void DW_NAME(dw_pixels_any)(const dw_job *j, const float *at, int64_t wide, const float *tap,
                                               const float *bias, int64_t n, float *out) {
    switch (j->DW == 1 && j->SW <= 2 && n >= DW_PIXELS - 1 ? j->KW * 4 + j->SW : 0) {
        DW_FIXED(3, 1);
        DW_FIXED(3, 2);
        DW_FIXED(5, 1);
        DW_FIXED(5, 2);
        DW_FIXED(7, 1);
    }
    DW_NAME(dw_pixels)(j, at, wide, tap, bias, out, j->KW, j->SW, j->DW, n);
}
#undef DW_FIXED

/* Output rows [o0, o1) of a block of the narrow path from its gathered rows, lanes interleaved,
 * bias included. A row's last DW_PIXELS pixels go as one group, overlapping the group before (a
 * 14-wide row is two groups of 8): a shorter group would run the loop without its constants. */
static OMRT_INLINE void DW_NAME(dw_rows)(const dw_job *j, const float *in, int64_t wide, const float *tap,
                                         const float *bias, int64_t o0, int64_t o1, float *out) {
    const int64_t n = j->OW < DW_PIXELS ? j->OW : DW_PIXELS;
    for (int64_t oh = o0; oh < o1; oh++)
        for (int64_t next = 0; next < j->OW; next += DW_PIXELS) {
            const int64_t ow = next + n > j->OW ? j->OW - n : next;
            const float *at = in + (((oh - o0) * j->SH) * wide + ow * j->SW) * OMRT_LANES;
            DW_NAME(dw_pixels_any)(j, at, wide, tap, bias, n, out + ((oh - o0) * j->OW + ow) * OMRT_LANES);
        }
}

/* dw_rows at this width, compiled for DW_TARGET alone. */
static DW_TARGET void DW_NAME(dw_compute)(const dw_job *j, const float *in, int64_t wide, const float *tap,
                                          const float *bias, int64_t o0, int64_t o1, float *out) {
    DW_NAME(dw_rows)(j, in, wide, tap, bias, o0, o1, out);
}

#undef DW_VEC
#undef DW_NAME
#undef DW_TARGET
#undef DW_SPAN
