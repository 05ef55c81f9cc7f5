/* The pools' 16-planes path (lanes_part) at one vector width, included by pool.c once per width:
 * POOL_VEC is the vector type (VL floats) and POOL_MASK the integer vector of as many lanes,
 * POOL_NAME(f) names this width's copy of f, POOL_TARGET the ISA it is compiled for (the other
 * never runs it), POOL_GATHER and POOL_SCATTER the interleaving copies for that ISA
 * (omrt_lanes.h), POOL_MAX(a, b) its max instruction (a > b ? a : b). With AVX-512 a pixel of
 * 16 planes is one vector; with AVX2 two of 8, one after the other, since GCC moves 64-byte
 * vectors through the stack there. */

/* One tap: the sum, or the max, which a NaN wins only when `nan` (the band holds one). */
POOL_TARGET static OMRT_INLINE POOL_VEC POOL_NAME(lanes_step)(POOL_VEC acc, POOL_VEC v, int is_max, int nan) {
    if (!is_max) return acc + v;
    if (!nan) return (POOL_VEC)POOL_MAX(v, acc); /* v > acc ? v : acc */
    const POOL_MASK take = (v > acc) | (v != v);
    return (POOL_VEC)((take & (POOL_MASK)v) | (~take & (POOL_MASK)acc));
}

/* An output row of 16 planes from its window's interleaved input rows `top` (`wide` floats x 16
 * apart), into `out`, averages scaled by their `inv` divisors: first each column over the
 * window's KH rows (DH apart) into `col`, then each output over its KW columns (DW apart, windows
 * SW apart), as the numpy path reduces one axis after the other. A 3x3 window takes 4 steps an
 * output where tap by tap it took 8. Called with the window constant, the tap loops unroll. */
POOL_TARGET static OMRT_INLINE void POOL_NAME(lanes_row)(const float *top, int64_t wide, int64_t OW, const float *inv,
                                                         float *col, float *out, int is_max, int nan, const int64_t KH,
                                                         const int64_t KW, const int64_t SW, const int64_t DH,
                                                         const int64_t DW) {
    const int64_t VL = sizeof(POOL_VEC) / sizeof(float);
    for (int64_t h = 0; h < OMRT_LANES; h += VL) {
        for (int64_t c = 0; c < wide; c++) {
            POOL_VEC acc = *(const POOL_VEC *)(top + c * OMRT_LANES + h);
            for (int64_t kh = 1; kh < KH; kh++)
                acc = POOL_NAME(lanes_step)(acc, *(const POOL_VEC *)(top + (kh * DH * wide + c) * OMRT_LANES + h),
                                            is_max, nan);
            *(POOL_VEC *)(col + c * OMRT_LANES + h) = acc;
        }
        for (int64_t o = 0; o < OW; o++) {
            const float *at = col + o * SW * OMRT_LANES + h;
            POOL_VEC acc = *(const POOL_VEC *)at;
            for (int64_t kw = 1; kw < KW; kw++)
                acc = POOL_NAME(lanes_step)(acc, *(const POOL_VEC *)(at + kw * DW * OMRT_LANES), is_max, nan);
            *(POOL_VEC *)(out + o * OMRT_LANES + h) = is_max ? acc : acc * inv[o];
        }
    }
}

/* Output rows [o0, o1) of 16 planes from their interleaved input rows `in`, into `out`, a row of
 * column results at a time in `col` (`wide` x 16 floats); 3x3 windows at stride 1 or 2 with
 * their shape constant. */
POOL_TARGET static OMRT_INLINE void POOL_NAME(lanes_rows)(const pool_job *j, const float *in, int64_t wide, int64_t o0,
                                                          int64_t o1, float *col, float *out, int is_max, int nan) {
    const int square3 = j->KH == 3 && j->KW == 3 && j->DH == 1 && j->DW == 1;
    for (int64_t oh = o0; oh < o1; oh++) {
        const float *top = in + (oh - o0) * j->SH * wide * OMRT_LANES;
        const float *inv = is_max ? NULL : j->inv_count + oh * j->OW;
        float *row = out + (oh - o0) * j->OW * OMRT_LANES;
        if (square3 && j->SW == 1)
            POOL_NAME(lanes_row)(top, wide, j->OW, inv, col, row, is_max, nan, 3, 3, 1, 1, 1);
        else if (square3 && j->SW == 2)
            POOL_NAME(lanes_row)(top, wide, j->OW, inv, col, row, is_max, nan, 3, 3, 2, 1, 1);
        else
            POOL_NAME(lanes_row)(top, wide, j->OW, inv, col, row, is_max, nan, j->KH, j->KW, j->SW, j->DH, j->DW);
    }
}

/* Item (block of 16 planes, band of output rows) of the lanes path, on the thread's scratch. */
POOL_TARGET static void POOL_NAME(lanes_part)(void *p, int64_t item, int64_t thread) {
    const pool_job *j = p;
    const int64_t bands = (j->OH + j->band - 1) / j->band, p0 = item / bands * OMRT_LANES;
    const int64_t lanes = j->planes - p0 < OMRT_LANES ? j->planes - p0 : OMRT_LANES;
    const int64_t o0 = item % bands * j->band, o1 = o0 + j->band < j->OH ? o0 + j->band : j->OH;
    const int64_t rows = (o1 - o0 - 1) * j->SH + (j->KH - 1) * j->DH + 1;
    const int64_t wide = (j->OW - 1) * j->SW + (j->KW - 1) * j->DW + 1;
    float *in = j->scratch + thread * j->pitch, *out = in + rows * wide * OMRT_LANES;
    float *col = out + (o1 - o0) * j->OW * OMRT_LANES;
    const float *src[OMRT_LANES] = {0};
    float *dst[OMRT_LANES] = {0};
    for (int64_t l = 0; l < lanes; l++) {
        src[l] = j->x + (p0 + l) * j->H * j->W;
        dst[l] = j->y + (p0 + l) * j->OH * j->OW + o0 * j->OW;
    }
    const omrt_lanes_source source = {j->H, j->W, j->PL, j->is_max ? -INFINITY : 0.0f};
    POOL_GATHER(&source, src, o0 * j->SH - j->PT, rows, wide, in);
    const int nan = j->is_max && holds_nan(in, rows * wide * OMRT_LANES);
    if (!j->is_max)
        POOL_NAME(lanes_rows)(j, in, wide, o0, o1, col, out, 0, 0);
    else if (nan)
        POOL_NAME(lanes_rows)(j, in, wide, o0, o1, col, out, 1, 1);
    else
        POOL_NAME(lanes_rows)(j, in, wide, o0, o1, col, out, 1, 0);
    POOL_SCATTER(out, (o1 - o0) * j->OW, dst, lanes);
}

#undef POOL_VEC
#undef POOL_MASK
#undef POOL_NAME
#undef POOL_TARGET
#undef POOL_GATHER
#undef POOL_SCATTER
#undef POOL_MAX
