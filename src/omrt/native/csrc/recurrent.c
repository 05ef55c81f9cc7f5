/* The time loop of a recurrent layer (LSTM): the input projection of every step is done before
 * (one matrix product over the whole sequence), so each step is the hidden state times R and the
 * gates, for every batch entry, with no Python between the steps. The directions of a
 * bidirectional layer are independent and run on two threads.
 *
 * exp (omrt_fx_exp, omrt_math.h) and tanh are Cephes' single-precision approximations (within a
 * few ulp of the correctly rounded values), written so that the loops vectorize: glibc's expf and
 * tanhf do not. Their clamps and selects become vector blends only when floating-point exceptions may be
 * raised where the scalar code would not raise them, which nothing here observes.
 */
#include "omrt_math.h"

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-trapping-math")
#endif

static inline void sigmoid_f32(float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] = 1.0f / (1.0f + omrt_fx_exp(-x[i]));
}

/* tanh: an odd polynomial below |x| 0.625 (where 1 - 2 / (e^2x + 1) would cancel), else that. */
static inline float tanh_f32(float x) {
    const float s = x * x;
    const float small = ((((-5.70498872745e-3f * s + 2.06390887954e-2f) * s - 5.37397155531e-2f) * s +
                          1.33314422036e-1f) * s - 3.33332819422e-1f) * s * x + x;
    const float large = 1.0f - 2.0f / (omrt_fx_exp(2.0f * x) + 1.0f);
    return s < 0.390625f ? small : large;
}

typedef struct {
    const float *proj, *R, *RT, *P, *h0, *c0;
    float *y, *yh, *yc, *work;
    int64_t dirs, seq, batch, hidden, layout, reverse, slices;
} lstm_job;

/* Offset of state (direction d, batch entry b) in Y_h, Y_c, initial_h and initial_c. */
static inline int64_t state_at(const lstm_job *j, int64_t d, int64_t b) {
    return (j->layout ? b * j->dirs + d : d * j->batch + b) * j->hidden;
}

/* One step of one batch entry: g (4h) holds the projected input plus R h; h and c are updated.
 * Cloned on its own: the clones of its caller would not inline it. */
static OMRT_HOT void lstm_cell(float *g, float *h, float *c, const float *P, int64_t hidden) {
    float *i = g, *o = g + hidden, *f = g + 2 * hidden, *cand = g + 3 * hidden;
    if (P)
        for (int64_t k = 0; k < hidden; k++) {
            i[k] += P[k] * c[k];
            f[k] += P[2 * hidden + k] * c[k];
        }
    sigmoid_f32(i, hidden);
    sigmoid_f32(f, hidden);
    for (int64_t k = 0; k < hidden; k++) c[k] = f[k] * c[k] + i[k] * tanh_f32(cand[k]);
    if (P)
        for (int64_t k = 0; k < hidden; k++) o[k] += P[hidden + k] * c[k];
    sigmoid_f32(o, hidden);
    for (int64_t k = 0; k < hidden; k++) h[k] = o[k] * tanh_f32(c[k]);
}

/* R^T in panels of PANEL rows of R (the last padded with zeros): panel p holds, for each k,
 * R[p * PANEL + l][k] for l < PANEL, so that R h is, panel by panel, a sum of PANEL-wide columns
 * scaled by h[k], accumulated in registers (a row of R by h would end in a sum across lanes, one
 * per gate). The compiler may store them so (omrt.kernels.recurrent.pack_recurrence). */
enum { PANEL = 64 };

static void r_panels(const float *R, float *RT, int64_t G, int64_t H) {
    for (int64_t r0 = 0; r0 < G; r0 += PANEL)
        for (int64_t l = 0; l < PANEL; l++)
            for (int64_t k = 0; k < H; k++) RT[r0 * H + k * PANEL + l] = r0 + l < G ? R[(r0 + l) * H + k] : 0.0f;
}

enum { BATCH_TILE = 4 };

/* For NB batch entries b (NB <= BATCH_TILE): g + b Gp (Gp floats) = x + b x_step (G floats, zeros
 * past them) + R (h + b H), R as panels: each column of a panel is read once for the NB entries,
 * which wait on R's bytes, not on their arithmetic. Always inlined (with NB a constant, so the
 * loops over it unroll): left out of line, GCC built such a helper once, for the baseline CPU
 * (SSE2), outside the clones of its caller. */
static OMRT_INLINE void r_times_h(float *g, const float *x, int64_t x_step, const float *RT, const float *h,
                                  int64_t G, int64_t Gp, int64_t H, const int NB) {
    for (int64_t r0 = 0; r0 < Gp; r0 += PANEL) {
        float acc[BATCH_TILE][PANEL];
        for (int b = 0; b < NB; b++)
            for (int l = 0; l < PANEL; l++) acc[b][l] = r0 + l < G ? x[b * x_step + r0 + l] : 0.0f;
        const float *panel = RT + r0 * H;
        for (int64_t k = 0; k < H; k++)
            for (int b = 0; b < NB; b++)
                for (int l = 0; l < PANEL; l++) acc[b][l] += panel[k * PANEL + l] * h[b * H + k];
        for (int b = 0; b < NB; b++) memcpy(g + b * Gp + r0, acc[b], sizeof acc[b]);
    }
}

/* r_times_h for the `nb` entries from b (nb <= BATCH_TILE), the tile's width a constant. */
static OMRT_INLINE void r_times_hs(float *g, const float *x, int64_t x_step, const float *RT, const float *h,
                                   int64_t G, int64_t Gp, int64_t H, int64_t nb) {
    switch (nb) {
    case 4: r_times_h(g, x, x_step, RT, h, G, Gp, H, 4); break;
    case 3: r_times_h(g, x, x_step, RT, h, G, Gp, H, 3); break;
    case 2: r_times_h(g, x, x_step, RT, h, G, Gp, H, 2); break;
    default: r_times_h(g, x, x_step, RT, h, G, Gp, H, 1);
    }
}

/* Gp, 4h rounded up to whole panels. */
static inline int64_t padded_gates(int64_t hidden) { return (4 * hidden + PANEL - 1) / PANEL * PANEL; }

/* Direction `d`'s R packed into its panels, at its place in RT. */
static void pack_direction(void *p, int64_t d, int64_t thread) {
    const lstm_job *j = p;
    (void)thread;
    const int64_t H = j->hidden;
    r_panels(j->R + d * 4 * H * H, (float *)j->RT + d * padded_gates(H) * H, 4 * H, H);
}

/* Item `item`: the whole sequence of one direction for one slice of the batch entries, in their
 * part of the work (h, c and the gates of each direction's entries, side by side). */
static OMRT_HOT void lstm_part(void *p, int64_t item, int64_t thread) {
    const lstm_job *j = p;
    (void)thread;
    const int64_t H = j->hidden, B = j->batch, G = 4 * H, Gp = padded_gates(H), dirs = j->dirs;
    const int64_t d = item / j->slices, lo = omrt_part(B, j->slices, item % j->slices),
                  hi = omrt_part(B, j->slices, item % j->slices + 1);
    float *h = j->work + d * B * (2 * H + Gp), *c = h + B * H, *gates = c + B * H;
    const float *P = j->P ? j->P + d * 3 * H : NULL, *RT = j->RT + d * Gp * H;
    for (int64_t b = lo; b < hi; b++) {
        const int64_t at = state_at(j, d, b);
        for (int64_t k = 0; k < H; k++) {
            h[b * H + k] = j->h0 ? j->h0[at + k] : 0.0f;
            c[b * H + k] = j->c0 ? j->c0[at + k] : 0.0f;
        }
    }
    for (int64_t s = 0; s < j->seq; s++) {
        const int64_t t = j->reverse || d == 1 ? j->seq - 1 - s : s;
        for (int64_t b0 = lo; b0 < hi; b0 += BATCH_TILE) {
            const int64_t nb = hi - b0 < BATCH_TILE ? hi - b0 : BATCH_TILE;
            r_times_hs(gates + b0 * Gp, j->proj + (t * B + b0) * dirs * G + d * G, dirs * G, RT, h + b0 * H, G, Gp,
                       H, nb);
        }
        for (int64_t b = lo; b < hi; b++) {
            float *hb = h + b * H;
            lstm_cell(gates + b * Gp, hb, c + b * H, P, H);
            if (j->y) {
                float *y = j->y + (j->layout ? (b * j->seq + t) * dirs + d : (t * dirs + d) * B + b) * H;
                memcpy(y, hb, (size_t)H * sizeof(float));
            }
        }
    }
    for (int64_t b = lo; b < hi; b++) {
        const int64_t at = state_at(j, d, b);
        if (j->yh) memcpy(j->yh + at, h + b * H, (size_t)H * sizeof(float));
        if (j->yc) memcpy(j->yc + at, c + b * H, (size_t)H * sizeof(float));
    }
}

/* The layer's items over up to `threads` threads: each direction in as many slices of the batch
 * as there are threads for it (a slice reads all of R, from its own core's cache). */
static void lstm_run(lstm_job *j, int64_t threads) {
    const int64_t per_direction = threads / j->dirs > 1 ? threads / j->dirs : 1;
    j->slices = per_direction < j->batch ? per_direction : (j->batch > 0 ? j->batch : 1);
    omrt_parallel(lstm_part, j, j->dirs * j->slices, threads);
}

/* An LSTM layer with the default activations (sigmoid, tanh, tanh), no clip, no coupled input
 * and forget gates, every sequence full length. `proj` (seq x batch x dirs x 4h) holds
 * X W^T + Wb + Rb, gates in ONNX's order i, o, f, c; R (dirs x 4h x h) and the peepholes P
 * (dirs x 3h: i, o, f; NULL: none) are as ONNX stores them. The initial states (NULL: zeros) and
 * Y_h, Y_c are dirs x batch x h, Y seq x dirs x batch x h (layout 0), or batch first
 * (layout 1); a NULL output is not written. Direction 1, and direction 0 when `reverse`, runs
 * from the last step to the first. `work` holds each direction's h, c and gates (batch * (2h + Gp)
 * floats, Gp = 4h rounded up to PANEL), then each direction's R in panels (Gp * h floats); the
 * directions and slices of the batch run on up to `threads` threads. */
OMRT_EXPORT void omrt_lstm_f32(const float *proj, const float *R, const float *P, const float *h0, const float *c0,
                               float *y, float *yh, float *yc, float *work, int64_t dirs, int64_t seq, int64_t batch,
                               int64_t hidden, int64_t layout, int64_t reverse, int64_t threads) {
    float *panels = work + dirs * batch * (2 * hidden + padded_gates(hidden));
    lstm_job j = {proj, R, panels, P, h0, c0, y, yh, yc, work, dirs, seq, batch, hidden, layout, reverse, 1};
    omrt_parallel(pack_direction, &j, dirs, threads);
    lstm_run(&j, threads);
}

/* omrt_lstm_f32 with R's panels packed at compile time: RT is each direction's Gp x h panels one
 * after the other (as r_panels lays them out), and `work` each direction's h, c and gates
 * (batch * (2h + Gp) floats). */
OMRT_EXPORT void omrt_lstm_packed_f32(const float *proj, const float *RT, const float *P, const float *h0,
                                      const float *c0, float *y, float *yh, float *yc, float *work, int64_t dirs,
                                      int64_t seq, int64_t batch, int64_t hidden, int64_t layout, int64_t reverse,
                                      int64_t threads) {
    lstm_job j = {proj, NULL, RT, P, h0, c0, y, yh, yc, work, dirs, seq, batch, hidden, layout, reverse, 1};
    lstm_run(&j, threads);
}
