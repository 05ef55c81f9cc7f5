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
    int64_t dirs, seq, batch, hidden, layout, reverse;
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

/* g (Gp floats) = x (G floats, zeros past them) + R h, R as panels. Always inlined: left out of
 * line, GCC built it once, for the baseline CPU (SSE2), outside the clones of its caller. */
static OMRT_INLINE void r_times_h(float *g, const float *x, const float *RT, const float *h, int64_t G, int64_t Gp,
                             int64_t H) {
    for (int64_t r0 = 0; r0 < Gp; r0 += PANEL) {
        float acc[PANEL];
        for (int l = 0; l < PANEL; l++) acc[l] = r0 + l < G ? x[r0 + l] : 0.0f;
        const float *panel = RT + r0 * H;
        for (int64_t k = 0; k < H; k++)
            for (int l = 0; l < PANEL; l++) acc[l] += panel[k * PANEL + l] * h[k];
        memcpy(g + r0, acc, sizeof acc);
    }
}

/* The whole sequence of direction `d`, in its part of the work: h, c, the gates, and R's panels
 * when R is given as ONNX stores it (else they are given, RT). */
static OMRT_HOT void lstm_direction(void *p, int64_t d, int64_t thread) {
    const lstm_job *j = p;
    (void)thread;
    const int64_t H = j->hidden, B = j->batch, G = 4 * H, Gp = (G + PANEL - 1) / PANEL * PANEL, dirs = j->dirs;
    const int64_t panels = j->R ? Gp * H : 0;
    float *h = j->work + d * (B * (2 * H + Gp) + panels), *c = h + B * H, *gates = c + B * H;
    const float *P = j->P ? j->P + d * 3 * H : NULL, *RT = j->R ? gates + B * Gp : j->RT + d * Gp * H;
    if (j->R) r_panels(j->R + d * G * H, gates + B * Gp, G, H);
    for (int64_t b = 0; b < B; b++) {
        const int64_t at = state_at(j, d, b);
        for (int64_t k = 0; k < H; k++) {
            h[b * H + k] = j->h0 ? j->h0[at + k] : 0.0f;
            c[b * H + k] = j->c0 ? j->c0[at + k] : 0.0f;
        }
    }
    for (int64_t s = 0; s < j->seq; s++) {
        const int64_t t = j->reverse || d == 1 ? j->seq - 1 - s : s;
        for (int64_t b = 0; b < B; b++) {
            const float *x = j->proj + (t * B + b) * dirs * G + d * G;
            float *g = gates + b * Gp, *hb = h + b * H;
            r_times_h(g, x, RT, hb, G, Gp, H);
            lstm_cell(g, hb, c + b * H, P, H);
            if (j->y) {
                float *y = j->y + (j->layout ? (b * j->seq + t) * dirs + d : (t * dirs + d) * B + b) * H;
                memcpy(y, hb, (size_t)H * sizeof(float));
            }
        }
    }
    for (int64_t b = 0; b < B; b++) {
        const int64_t at = state_at(j, d, b);
        if (j->yh) memcpy(j->yh + at, h + b * H, (size_t)H * sizeof(float));
        if (j->yc) memcpy(j->yc + at, c + b * H, (size_t)H * sizeof(float));
    }
}

/* An LSTM layer with the default activations (sigmoid, tanh, tanh), no clip, no coupled input
 * and forget gates, every sequence full length. `proj` (seq x batch x dirs x 4h) holds
 * X W^T + Wb + Rb, gates in ONNX's order i, o, f, c; R (dirs x 4h x h) and the peepholes P
 * (dirs x 3h: i, o, f; NULL: none) are as ONNX stores them. The initial states (NULL: zeros) and
 * Y_h, Y_c are dirs x batch x h, Y seq x dirs x batch x h (layout 0), or batch first
 * (layout 1); a NULL output is not written. Direction 1, and direction 0 when `reverse`, runs
 * from the last step to the first. `work` holds each direction's h, c, gates and R's panels
 * (batch * (2h + Gp) + Gp * h floats, Gp = 4h rounded up to PANEL); the directions run on up
 * to `threads` threads. */
OMRT_EXPORT void omrt_lstm_f32(const float *proj, const float *R, const float *P, const float *h0, const float *c0,
                               float *y, float *yh, float *yc, float *work, int64_t dirs, int64_t seq, int64_t batch,
                               int64_t hidden, int64_t layout, int64_t reverse, int64_t threads) {
    lstm_job j = {proj, R, NULL, P, h0, c0, y, yh, yc, work, dirs, seq, batch, hidden, layout, reverse};
    omrt_parallel(lstm_direction, &j, dirs, threads);
}

/* omrt_lstm_f32 with R's panels packed at compile time: RT is each direction's Gp x h panels one
 * after the other (as r_panels lays them out), and `work` each direction's h, c and gates
 * (batch * (2h + Gp) floats). */
OMRT_EXPORT void omrt_lstm_packed_f32(const float *proj, const float *RT, const float *P, const float *h0,
                                      const float *c0, float *y, float *yh, float *yc, float *work, int64_t dirs,
                                      int64_t seq, int64_t batch, int64_t hidden, int64_t layout, int64_t reverse,
                                      int64_t threads) {
    lstm_job j = {proj, NULL, RT, P, h0, c0, y, yh, yc, work, dirs, seq, batch, hidden, layout, reverse};
    omrt_parallel(lstm_direction, &j, dirs, threads);
}
