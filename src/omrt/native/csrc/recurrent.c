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

enum { PANEL = 64 }; /* rows of R per panel (r_panels) */

typedef struct {
    const float *proj, *R, *RT, *P, *Rbh, *h0, *c0;
    float *y, *yh, *yc, *work;
    int64_t dirs, seq, batch, hidden, layout, reverse, lbr, rbh_step;
    int64_t gates, first, slices;
    /* R's rows (gates x hidden) and those of its first group of panels (the rest, GRU's
     * candidate rows, have panels of their own); the batch's slices per direction */
} rnn_job;

/* Rows rounded up to whole panels. */
static inline int64_t panel_rows(int64_t rows) { return (rows + PANEL - 1) / PANEL * PANEL; }

/* Rows of a direction's panels: its first group's and the rest's, each rounded up. */
static inline int64_t panels_rows(const rnn_job *j) {
    return panel_rows(j->first) + panel_rows(j->gates * j->hidden - j->first);
}

/* Offset of state (direction d, batch entry b) in Y_h, Y_c, initial_h and initial_c. */
static inline int64_t state_at(const rnn_job *j, int64_t d, int64_t b) {
    return (j->layout ? b * j->dirs + d : d * j->batch + b) * j->hidden;
}

/* The item's direction and slice [lo, hi) of the batch entries. */
static void slice_of(const rnn_job *j, int64_t item, int64_t *d, int64_t *lo, int64_t *hi) {
    *d = item / j->slices;
    *lo = omrt_part(j->batch, j->slices, item % j->slices);
    *hi = omrt_part(j->batch, j->slices, item % j->slices + 1);
}

/* Entries [lo, hi) of direction d's states s (batch x h) from `initial` (NULL: zeros), or into
 * `out` (NULL: not written). */
static void load_states(const rnn_job *j, const float *initial, float *s, int64_t d, int64_t lo, int64_t hi) {
    for (int64_t b = lo; b < hi; b++)
        for (int64_t k = 0; k < j->hidden; k++) s[b * j->hidden + k] = initial ? initial[state_at(j, d, b) + k] : 0.0f;
}

static void store_states(const rnn_job *j, float *out, const float *s, int64_t d, int64_t lo, int64_t hi) {
    if (out)
        for (int64_t b = lo; b < hi; b++)
            memcpy(out + state_at(j, d, b), s + b * j->hidden, (size_t)j->hidden * sizeof(float));
}

/* Entry b's state at step t into Y, when it is wanted. */
static inline void store_y(const rnn_job *j, const float *h, int64_t t, int64_t d, int64_t b) {
    if (j->y) {
        const int64_t at = j->layout ? (b * j->seq + t) * j->dirs + d : (t * j->dirs + d) * j->batch + b;
        memcpy(j->y + at * j->hidden, h, (size_t)j->hidden * sizeof(float));
    }
}

/* One LSTM step of one batch entry: g (4h) holds the projected input plus R h; h and c are
 * updated. Cloned on its own: the clones of its caller would not inline it. */
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

/* One GRU step of one batch entry, its update and reset gates z, r (g, 2h) activated: the
 * candidate's sums `cand` are R_h h + Rbh with linear_before_reset (`lbr`; `xh` then its
 * projected input), else the projected input plus R_h (r h); h is updated. */
static OMRT_HOT void gru_cell(const float *g, const float *cand, const float *xh, float *h, int64_t hidden,
                              int64_t lbr) {
    const float *z = g, *r = g + hidden;
    for (int64_t k = 0; k < hidden; k++) {
        const float n = tanh_f32(lbr ? xh[k] + r[k] * cand[k] : cand[k]);
        h[k] = (1.0f - z[k]) * n + z[k] * h[k];
    }
}

/* R^T in panels of PANEL rows of R (the last padded with zeros): panel p holds, for each k,
 * R[p * PANEL + l][k] for l < PANEL, so that R h is, panel by panel, a sum of PANEL-wide columns
 * scaled by h[k], accumulated in registers (a row of R by h would end in a sum across lanes, one
 * per gate). The compiler may store them so (omrt.kernels.recurrent.pack_recurrence). */

static void r_panels(const float *R, float *RT, int64_t G, int64_t H) {
    for (int64_t r0 = 0; r0 < G; r0 += PANEL)
        for (int64_t l = 0; l < PANEL; l++)
            for (int64_t k = 0; k < H; k++) RT[r0 * H + k * PANEL + l] = r0 + l < G ? R[(r0 + l) * H + k] : 0.0f;
}

/* Direction `d`'s R packed into its panels, at its place in RT: the first group's rows, then
 * the rest's. */
static void pack_direction(void *p, int64_t d, int64_t thread) {
    const rnn_job *j = p;
    (void)thread;
    const int64_t H = j->hidden, G = j->gates * H;
    const float *R = j->R + d * G * H;
    float *RT = (float *)j->RT + d * panels_rows(j) * H;
    r_panels(R, RT, j->first, H);
    if (j->first < G) r_panels(R + j->first * H, RT + panel_rows(j->first) * H, G - j->first, H);
}

enum { BATCH_TILE = 4 };

/* For NB batch entries b (NB <= BATCH_TILE): g + b g_step (`padded` floats) = x + b x_step
 * (`rows` floats, zeros past them; x NULL: zeros) + R (h + b H), R as `padded` rows of panels:
 * each column of a panel is read once for the NB entries, which wait on R's bytes, not on their
 * arithmetic. Always inlined (with NB a constant, so the loops over it unroll): left out of
 * line, GCC built such a helper once, for the baseline CPU (SSE2), outside the clones of its
 * caller. */
static OMRT_INLINE void r_times_h(float *g, int64_t g_step, const float *x, int64_t x_step, const float *RT,
                                  const float *h, int64_t rows, int64_t padded, int64_t H, const int NB) {
    for (int64_t r0 = 0; r0 < padded; r0 += PANEL) {
        float acc[BATCH_TILE][PANEL];
        for (int b = 0; b < NB; b++)
            for (int l = 0; l < PANEL; l++) acc[b][l] = x && r0 + l < rows ? x[b * x_step + r0 + l] : 0.0f;
        const float *panel = RT + r0 * H;
        for (int64_t k = 0; k < H; k++)
            for (int b = 0; b < NB; b++)
                for (int l = 0; l < PANEL; l++) acc[b][l] += panel[k * PANEL + l] * h[b * H + k];
        for (int b = 0; b < NB; b++) memcpy(g + b * g_step + r0, acc[b], sizeof acc[b]);
    }
}

/* r_times_h for the entries [lo, hi), BATCH_TILE at a time, the tile's width a constant. */
static OMRT_INLINE void r_times_hs(float *g, int64_t g_step, const float *x, int64_t x_step, const float *RT,
                                   const float *h, int64_t rows, int64_t padded, int64_t H, int64_t lo,
                                   int64_t hi) {
    for (int64_t b = lo; b < hi; b += BATCH_TILE) {
        float *gb = g + b * g_step;
        const float *xb = x ? x + b * x_step : NULL, *hb = h + b * H;
        switch (hi - b < BATCH_TILE ? hi - b : BATCH_TILE) {
        case 4: r_times_h(gb, g_step, xb, x_step, RT, hb, rows, padded, H, 4); break;
        case 3: r_times_h(gb, g_step, xb, x_step, RT, hb, rows, padded, H, 3); break;
        case 2: r_times_h(gb, g_step, xb, x_step, RT, hb, rows, padded, H, 2); break;
        default: r_times_h(gb, g_step, xb, x_step, RT, hb, rows, padded, H, 1);
        }
    }
}

/* Item `item` of an LSTM: the whole sequence of one direction for one slice of the batch
 * entries, in their part of the work (h, c and the gates of each direction's entries). */
static OMRT_HOT void lstm_part(void *p, int64_t item, int64_t thread) {
    const rnn_job *j = p;
    (void)thread;
    const int64_t H = j->hidden, B = j->batch, G = 4 * H, Gp = panels_rows(j), dirs = j->dirs;
    int64_t d, lo, hi;
    slice_of(j, item, &d, &lo, &hi);
    float *h = j->work + d * B * (2 * H + Gp), *c = h + B * H, *gates = c + B * H;
    const float *P = j->P ? j->P + d * 3 * H : NULL, *RT = j->RT + d * Gp * H;
    load_states(j, j->h0, h, d, lo, hi);
    load_states(j, j->c0, c, d, lo, hi);
    for (int64_t s = 0; s < j->seq; s++) {
        const int64_t t = j->reverse || d == 1 ? j->seq - 1 - s : s;
        r_times_hs(gates, Gp, j->proj + t * B * dirs * G + d * G, dirs * G, RT, h, G, Gp, H, lo, hi);
        for (int64_t b = lo; b < hi; b++) {
            lstm_cell(gates + b * Gp, h + b * H, c + b * H, P, H);
            store_y(j, h + b * H, t, d, b);
        }
    }
    store_states(j, j->yh, h, d, lo, hi);
    store_states(j, j->yc, c, d, lo, hi);
}

/* Item `item` of a GRU, as lstm_part: h, r h and the gates of each direction's entries. */
static OMRT_HOT void gru_part(void *p, int64_t item, int64_t thread) {
    const rnn_job *j = p;
    (void)thread;
    const int64_t H = j->hidden, B = j->batch, G = 3 * H, Gzr = panel_rows(j->first), Gp = panels_rows(j),
                  Gh = Gp - Gzr, dirs = j->dirs;
    int64_t d, lo, hi;
    slice_of(j, item, &d, &lo, &hi);
    float *h = j->work + d * B * (2 * H + Gp), *rh = h + B * H, *gates = rh + B * H;
    const float *RT = j->RT + d * Gp * H, *Rbh = j->Rbh && j->lbr ? j->Rbh + d * j->rbh_step : NULL;
    load_states(j, j->h0, h, d, lo, hi);
    for (int64_t s = 0; s < j->seq; s++) {
        const int64_t t = j->reverse || d == 1 ? j->seq - 1 - s : s;
        const float *x = j->proj + t * B * dirs * G + d * G;
        r_times_hs(gates, Gp, x, dirs * G, RT, h, 2 * H, Gzr, H, lo, hi);
        if (j->lbr) r_times_hs(gates + Gzr, Gp, Rbh, 0, RT + Gzr * H, h, H, Gh, H, lo, hi);
        for (int64_t b = lo; b < hi; b++) sigmoid_f32(gates + b * Gp, 2 * H);
        if (!j->lbr) {
            for (int64_t b = lo; b < hi; b++)
                for (int64_t k = 0; k < H; k++) rh[b * H + k] = gates[b * Gp + H + k] * h[b * H + k];
            r_times_hs(gates + Gzr, Gp, x + 2 * H, dirs * G, RT + Gzr * H, rh, H, Gh, H, lo, hi);
        }
        for (int64_t b = lo; b < hi; b++) {
            gru_cell(gates + b * Gp, gates + b * Gp + Gzr, x + b * dirs * G + 2 * H, h + b * H, H, j->lbr);
            store_y(j, h + b * H, t, d, b);
        }
    }
    store_states(j, j->yh, h, d, lo, hi);
}

/* The layer's items over up to `threads` threads: each direction in as many slices of the batch
 * as there are threads for it (a slice reads all of R, from its own core's cache). R, when given
 * as ONNX stores it, is packed first, a direction per thread. */
static void run_layer(rnn_job *j, omrt_item_fn part, int64_t threads) {
    const int64_t per_direction = threads / j->dirs > 1 ? threads / j->dirs : 1;
    j->slices = per_direction < j->batch ? per_direction : (j->batch > 0 ? j->batch : 1);
    if (j->R) omrt_parallel(pack_direction, j, j->dirs, threads);
    omrt_parallel(part, j, j->dirs * j->slices, threads);
}

/* The work's tail, where R's panels go when R is given as ONNX stores it. */
static float *panels_in(const rnn_job *j) { return j->work + j->dirs * j->batch * (2 * j->hidden + panels_rows(j)); }

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
    rnn_job j = {proj, R, NULL, P, NULL, h0, c0, y, yh, yc, work, dirs, seq, batch, hidden, layout, reverse, 0, 0,
                 4, 4 * hidden, 1};
    j.RT = panels_in(&j);
    run_layer(&j, lstm_part, threads);
}

/* omrt_lstm_f32 with R's panels packed at compile time: RT is each direction's Gp x h panels one
 * after the other (as r_panels lays them out), and `work` each direction's h, c and gates
 * (batch * (2h + Gp) floats). */
OMRT_EXPORT void omrt_lstm_packed_f32(const float *proj, const float *RT, const float *P, const float *h0,
                                      const float *c0, float *y, float *yh, float *yc, float *work, int64_t dirs,
                                      int64_t seq, int64_t batch, int64_t hidden, int64_t layout, int64_t reverse,
                                      int64_t threads) {
    rnn_job j = {proj, NULL, RT, P, NULL, h0, c0, y, yh, yc, work, dirs, seq, batch, hidden, layout, reverse, 0, 0,
                 4, 4 * hidden, 1};
    run_layer(&j, lstm_part, threads);
}

/* A GRU layer with the default activations (sigmoid, tanh), no clip, every sequence full length.
 * `proj` (seq x batch x dirs x 3h) holds X W^T + Wb + Rb, gates in ONNX's order z, r, h, but for
 * Rbh with `lbr` (linear_before_reset), which is added to R_h h before the reset gate scales it:
 * direction d's at Rbh + d rbh_step (NULL: no bias). R (dirs x 3h x h) is as ONNX stores it;
 * states and outputs as omrt_lstm_f32's. `work` holds each direction's h, r h and gates
 * (batch * (2h + Gp) floats, Gp = 2h and h each rounded up to PANEL), then each direction's R in
 * panels (Gp * h floats: its update and reset rows, then its candidate rows). */
OMRT_EXPORT void omrt_gru_f32(const float *proj, const float *R, const float *Rbh, const float *h0, float *y,
                              float *yh, float *work, int64_t dirs, int64_t seq, int64_t batch, int64_t hidden,
                              int64_t layout, int64_t reverse, int64_t lbr, int64_t rbh_step, int64_t threads) {
    rnn_job j = {proj, R, NULL, NULL, Rbh, h0, NULL, y, yh, NULL, work, dirs, seq, batch, hidden, layout, reverse, lbr,
                 rbh_step, 3, 2 * hidden, 1};
    j.RT = panels_in(&j);
    run_layer(&j, gru_part, threads);
}

/* omrt_gru_f32 with R's panels packed at compile time (RT, each direction's Gp x h panels one
 * after the other), `work` each direction's h, r h and gates (batch * (2h + Gp) floats). */
OMRT_EXPORT void omrt_gru_packed_f32(const float *proj, const float *RT, const float *Rbh, const float *h0, float *y,
                                     float *yh, float *work, int64_t dirs, int64_t seq, int64_t batch, int64_t hidden,
                                     int64_t layout, int64_t reverse, int64_t lbr, int64_t rbh_step, int64_t threads) {
    rnn_job j = {proj, NULL, RT, NULL, Rbh, h0, NULL, y, yh, NULL, work, dirs, seq, batch, hidden, layout, reverse,
                 lbr, rbh_step, 3, 2 * hidden, 1};
    run_layer(&j, gru_part, threads);
}
