"""Every exported C function of omrt's native library, argument by argument, with its contract.

Each binding below is checked against its C prototype in csrc/ by a test, and every call goes
through `Function.check` (omrt.native.signature): dtypes, layouts and sizes of the arrays the C
code reads and writes, as the expressions here state them, and the conditions on its integers.
"""

from __future__ import annotations

from .signature import Address, Array, Float, Function, Int, Matrix

ACTIVATIONS = {None: 0, "Relu": 1, "LeakyRelu": 2, "Clip": 3, "HardSigmoid": 4}
"""The fused activations the C loops apply themselves (csrc/omrt_native.h, OMRT_ACT_*)."""


def activation_code(attrs: dict) -> tuple[int, float, float] | None:
    """(code, alpha, beta) of a node's fused activation when the C loops apply it, or None when
    they do not (the kernel then applies it with numpy afterwards)."""
    act = attrs.get("_act")
    if act not in ACTIVATIONS:
        return None
    return ACTIVATIONS[act], float(attrs.get("_act_alpha", 0.0) or 0.0), float(attrs.get("_act_beta", 0.0) or 0.0)


def _window(*extra: Int) -> tuple[Int, ...]:
    """The 2-d window arguments the conv and pool loops share."""
    return (Int("KH", 1), Int("KW", 1), Int("SH", 1), Int("SW", 1), Int("DH", 1), Int("DW", 1),
            Int("PT"), Int("PL"), *extra)


_ACT = (Int("act"), Float("alpha"), Float("beta"))
_TAPS = "KW <= MAX_TAPS"
_ACT_KNOWN = "act <= 4"

USE_BLAS = Function("workers", "omrt_use_blas", (Address("sgemm"), Address("sgemv"), Int("ilp64")))

POOL_BUSY = Function("workers", "omrt_pool_busy", (Array("ns", "n", write=True, dtype="int64"), Int("n")),
                     requires=("n <= POOL_THREADS",))
"""The nanoseconds each of the worker pool's first n threads spent running items so far."""

POOL_ROUND_TRIP = Function("workers", "omrt_pool_round_trip",
                           (Int("rounds", 1), Array("ns", "1", write=True, dtype="int64")),
                           requires=("rounds <= 100000",))
"""Nanoseconds a cache line took to pass `rounds` times from the calling thread to pool worker 1
and back, or -1 when no worker took part within 20 ms."""

RUN_CALLS = Function("workers", "omrt_run_calls", (Array("table", "2 * calls", dtype="int64"), Int("calls", 1)))
"""Checked calls in one: `calls` pairs (thunk, argument vector), addresses the executor took
from calls it checked (omrt.native.library.Checked)."""

DWCONV2D = Function(
    "conv", "omrt_dwconv2d_f32",
    (Array("x", "N * (M // mult) * H * W"), Array("w", "M * KH * KW"), Array("bias", "M", optional=True),
     Array("y", "N * M * OH * OW", write=True),
     Array("scratch", "pitch * min(threads, max(N * M if OW >= 16 else 1, N * -(-M // 16) * -(-OH // band)))",
           write=True, scratch=True),
     Int("pitch"), Int("band", 1), Int("threads", 1), Int("lanes"), Int("N"), Int("M"), Int("mult", 1), Int("H"),
     Int("W"), Int("OH"), Int("OW"), *_window(), *_ACT),
    derived=(("wide", "(OW - 1) * SW + (KW - 1) * DW + 1"), ("rows", "(min(band, OH) - 1) * SH + (KH - 1) * DH + 1"),
             ("Wq", "(wide + SW - 1) // SW"),
             ("phase", "(min(band, OH) + (KH - 1) * DH // SH) * Wq + (KW - 1) * DW // SW")),
    requires=("M % mult == 0", "KH * KW <= MAX_TAPS", _ACT_KNOWN,
              "OW >= 16 and not lanes or pitch >= 16 * (KH * KW + rows * wide + min(band, OH) * OW)",
              "OW < 16 or pitch >= SH * SW * phase + min(band, OH) * Wq"))
"""Depthwise layers: 16 channels at a time in bands of `band` output rows; planes of 16 or more
output columns, without AVX2 or unless `lanes`, one by one, in bands of `band` output rows
split into stride phases in the scratch. With `lanes` the scratch fits either, whichever the CPU
takes."""

IM2COL2D = Function(
    "conv", "omrt_im2col_f32",
    (Array("x", "C * H * W"), Array("cols", "(C * KH * KW - 1) * pitch + (r1 - r0) * OW", write=True),
     Int("pitch"), Int("r0"), Int("r1"), Int("C", 1), Int("H"), Int("W"), Int("OW"), *_window()),
    requires=("r0 <= r1", "pitch >= (r1 - r0) * OW", _TAPS))

CONV2D = Function(
    "conv", "omrt_conv2d_f32",
    (Array("x", "N * C * H * W"), Array("w", "M * (C // G) * KH * KW"), Array("bias", "M", optional=True),
     Array("y", "N * M * OH * OW", write=True),
     Array("work", "0 if pointwise else min(threads, chunks) * buffer if buffer else rows * step * OW",
           write=True, scratch=True),
     Int("step"), Int("buffer"), Int("threads", 1), Int("N"), Int("C"), Int("H"), Int("W"), Int("M"), Int("G", 1),
     Int("shuffle"), Int("OH"), Int("OW"), *_window(), *_ACT),
    derived=(("pointwise", "KH == KW == SH == SW == 1 and PT == PL == 0 and (OH, OW) == (H, W)"),
             ("rows", "C * KH * KW"), ("chunks", "N * -(-OH // max(step, 1))")),
    requires=("C % G == 0", "M % G == 0", "shuffle <= 1", "pointwise or step >= 1",
              "pointwise or not buffer or buffer >= rows * step * OW", _TAPS, _ACT_KNOWN),
    blas=True)

PCONV2D = Function(
    "conv", "omrt_pconv2d_f32",
    (Array("x", "N * C * H * W"), Array("panels", "G * -(-(M // G) // unit) * unit * taps"),
     Array("bias", "M", optional=True), Array("residual", "N * M * OH * OW", optional=True),
     Array("y", "N * M * OH * OW", write=True),
     Array("work", "0 if pointwise else min(threads, chunks) * buffer if buffer else rows * step * OW",
           write=True, scratch=True),
     Array("strips", "threads * taps * block", write=True, scratch=True),
     Int("step"), Int("buffer"), Int("block", 1), Int("threads", 1), Int("N"), Int("C", 1), Int("H"), Int("W"), Int("M"),
     Int("G", 1), Int("shuffle"), Int("lanes"), Int("OH"), Int("OW"), *_window(), *_ACT),
    derived=(("pointwise", "KH == KW == SH == SW == 1 and PT == PL == 0 and (OH, OW) == (H, W)"),
             ("rows", "C * KH * KW"), ("taps", "C // G * KH * KW"), ("chunks", "N * -(-OH // max(step, 1))"),
             ("unit", "GEMM_MAX_NR if lanes else GEMM_PANEL")),
    requires=("pointwise or step >= 1", "pointwise or not buffer or buffer >= rows * step * OW",
              "block % GEMM_MAX_NR == 0", "C % G == 0", "M % G == 0", "shuffle <= 1", "lanes <= 1", _TAPS,
              _ACT_KNOWN))
"""Conv in G groups, each group's filters packed at compile time (omrt.kernels.packed), through omrt's
own GEMM; shuffled as ShuffleNet does with `shuffle`; plus a residual laid out as y, when given,
before the activation. The residual may be y itself: each element of it is read just before the same
element of y is written. With `lanes`, the filters are packed as strips of GEMM_MAX_NR (the filters
in the vector lanes: products of few columns) instead of panels of GEMM_PANEL."""

GEMM_TILE = Function("workers", "omrt_gemm_tile", (Array("level", "1", write=True, dtype="int64"),))
"""The widest tile of omrt's GEMM on this CPU: 2 AVX-512, 1 AVX2 and FMA, 0 plain C."""

GEMM_TILES = {0: "plain C 12x16", 1: "AVX2 6x16", 2: "AVX-512 12x32"}

POOL2D = Function(
    "pool", "omrt_pool2d_f32",
    (Array("x", "planes * H * W"), Array("y", "planes * OH * OW", write=True),
     Array("inv_count", "0 if is_max else OH * OW"),
     Array("scratch", "pitch * min(threads, planes)", write=True, scratch=True),
     Int("pitch"), Int("threads", 1), Int("planes"), Int("H"), Int("W"), Int("OH"), Int("OW"),
     *_window(Int("is_max"), Int("path"))),
    requires=("pitch >= W", _TAPS, "is_max <= 1", "path <= 3"))
"""Max or average pools of 2-d planes: on an AVX-512 CPU, with `path` 3 each row of planes at most
16 wide in one register, with 2 a max pool's rows through their column maxima, with 1 16 planes
at a time in bands of output rows when `pitch` holds one (omrt.kernels.pool.pool_lanes_floats);
else in a few flat passes over a padded plane when `pitch` holds one
(omrt.kernels.pool.pool_plane_floats), else row by row."""

GLOBAL_POOL = Function("pool", "omrt_global_pool_f32",
                       (Array("x", "planes * size"), Array("y", "planes", write=True), Int("planes", 1),
                        Int("size", 1), Int("is_max"), Int("threads", 1)), requires=("is_max <= 1",))
"""The mean or maximum of each plane (GlobalAveragePool, GlobalMaxPool)."""

WINOGRAD = Function(
    "winograd", "omrt_winograd_f32",
    (Array("x", "N * C * H * W"), Array("U", "elements * -(-F // GEMM_PANEL) * GEMM_PANEL * C"),
     Array("bias", "F", optional=True), Array("y", "N * F * OH * OW", write=True),
     Array("work", "v_floats + min(threads, max(C, F)) * slot_floats if shared "
                   "else min(threads, N * chunks) * slot_floats", write=True, scratch=True),
     Int("v_floats"), Int("slot_floats"), Int("chunk_tiles", 1), Int("shared"), Int("fpass", 1), Int("T", 2),
     Int("threads", 1), Int("N"), Int("C"), Int("H"), Int("W"), Int("F"), Int("OH"), Int("OW"), Int("PT"), Int("PL"),
     *_ACT),
    derived=(("tw", "-(-OW // T)"), ("tiles", "tw * -(-OH // T)"), ("elements", "(T + 2) ** 2"),
             ("chunks", "min(-(-(-(-tiles // chunk_tiles)) // threads) * threads, tiles)"),
             ("per_chunk", "-(-tiles // max(chunks, 1))"),
             ("rows", "(max((T + 3) * (T * tw + 2), 2 * T * (T + 1) * (tiles if shared else per_chunk)) + 15)"
                      " // 16 * 16"),
             ("strips", "-(-(tiles if shared else per_chunk) // GEMM_MAX_NR) * GEMM_MAX_NR"),
             ("per_block", "-(-(-(-F // max(min(threads, F), 1))) // GEMM_PANEL) * GEMM_PANEL")),
    requires=("T in (2, 4)", "shared <= 1", "not shared or N == 1",
              "v_floats >= elements * (C * strips + WINOGRAD_SKEW)",
              "slot_floats >= (elements * min(fpass, per_block) * tiles + rows if shared "
              "else v_floats + elements * min(fpass, F) * per_chunk + rows)",
              "fpass % GEMM_PANEL == 0", _ACT_KNOWN))
"""Winograd F(T x T, 3x3) of a 3x3 stride-1 layer, T = 2 or 4: V, the transformed tiles, in strips of
GEMM_MAX_NR tiles (`strips` of them, padded), multiplied by U in panels of GEMM_PANEL filters."""

MATMUL = Function(
    "linalg", "omrt_matmul_f32",
    (Matrix("a", "M", "K", "lda", "sa", "batch", "ta"), Matrix("b", "K", "N", "ldb", "sb", "batch", "tb"),
     Array("bias", "N", optional=True), Matrix("c", "M", "N", "ldc", "sc", "batch", write=True),
     Int("batch", 1), Int("M", 1), Int("N", 1), Int("K", 1), Int("lda"), Int("ldb"), Int("ldc"), Int("ta"),
     Int("tb"), Int("sa"), Int("sb"), Int("sc"), Int("threads", 1), *_ACT),
    requires=("ta <= 1", "tb <= 1", _ACT_KNOWN),
    blas=True)

PMATMUL = Function(
    "linalg", "omrt_pmatmul_f32",
    (Array("a", "(M - 1) * lda + K"), Array("strips", "-(-N // GEMM_MAX_NR) * K * GEMM_MAX_NR"),
     Array("bias", "N", optional=True),
     Array("c", "(N // part_cols - 1) * part_stride + (M - 1) * ldc + part_cols", write=True),
     Array("panels", "-(-M // GEMM_PANEL) * GEMM_PANEL * K", write=True, scratch=True),
     Int("M", 1), Int("N", 1), Int("K", 1), Int("lda"), Int("ldc"), Int("part_cols", 1), Int("part_stride"),
     Int("threads", 1), *_ACT),
    requires=("lda >= K", "ldc >= part_cols", "N % part_cols == 0",
              "part_cols == N or part_cols % GEMM_MAX_NR == 0",
              "part_cols == N or part_stride >= (M - 1) * ldc + part_cols", _ACT_KNOWN))
"""a @ B + bias, then the activation, B packed at compile time (omrt.kernels.packed), through omrt's own
GEMM; the columns in parts of part_cols, each its own matrix part_stride floats after the last."""

ATTENTION = Function(
    "attention", "omrt_attention_f32",
    (Array("q", "(B - 1) * qb + (H - 1) * qh + (S - 1) * qs + D"),
     Array("k", "(B - 1) * kb + (H // G - 1) * kh + (T - 1) * kt + D"),
     Array("v", "(B - 1) * vb + (H // G - 1) * vh + (T - 1) * vt + DV"),
     Array("mask", "(B - 1) * mb + (H - 1) * mh + (S - 1) * ms + T", optional=True),
     Array("y", "(B - 1) * yb + (H - 1) * yh + (S - 1) * ys + DV", write=True),
     Array("scores", "tiles * threads * (D * (SP + TP) + T * SP + 2 * SP) + (1 - tiles) * B * H * S * T", write=True,
           scratch=True),
     Int("B", 1), Int("H", 1), Int("G", 1), Int("S", 1), Int("T", 1), Int("D", 1), Int("DV", 1),
     Int("qb"), Int("qh"), Int("qs"), Int("kb"), Int("kh"), Int("kt"), Int("vb"), Int("vh"), Int("vt"),
     Int("yb"), Int("yh"), Int("ys"), Int("mb"), Int("mh"), Int("ms"), Float("scale"), Int("tiles"),
     Int("threads", 1)),
    requires=("H % G == 0", "qs >= D", "kt >= D", "vt >= DV", "ys >= DV", "tiles <= 1", "tiles == 0 or DV % 16 == 0"),
    derived=(("SP", "max(-(-S // GEMM_MAX_NR) * GEMM_MAX_NR, -(-S // GEMM_PANEL) * GEMM_PANEL)"),
             ("TP", "-(-T // GEMM_PANEL) * GEMM_PANEL")),
    blas=True)
"""softmax(Q K^T * scale + mask) V per (batch, head), the scores in the workspace (csrc/attention.c):
through BLAS, or with `tiles` on omrt's GEMM tile, each thread in a slot of its own (SP queries
and TP keys padded for the tile)."""

GELU = Function(
    "elementwise", "omrt_gelu_f32",
    (Array("x", "n"), Array("y", "n", write=True), Array("cdf", "GELU_NODES"), Array("slope", "GELU_NODES"),
     Int("n"), Int("threads", 1)))

LRN = Function(
    "elementwise", "omrt_lrn_f32",
    (Array("x", "N * C * P"), Array("y", "N * C * P", write=True), Int("N"), Int("C", 1), Int("P"), Int("below"),
     Int("above"), Float("scale"), Float("bias"), Int("threads", 1)))
"""Local response normalization across channels with beta 0.75; y is not x (a plan never puts an
LRN's output over its input)."""

ARITHMETIC = {"Add": 0, "Sub": 1, "Mul": 2, "Div": 3, "Max": 6, "Min": 7}
"""The ops omrt_binary_f32 computes, by code (csrc/elementwise.c)."""

SWAPPED = {0: 0, 1: 4, 2: 2, 3: 5, 6: 6, 7: 7}
"""The code of each op with its operands swapped: b - a and b / a are 4 and 5."""

BINARY = Function(
    "elementwise", "omrt_binary_f32",
    (Array("a", "rows * inner"), Array("b", "b_rows * b_cols"), Array("y", "rows * inner", write=True),
     Int("op"), Int("rows", 1), Int("inner", 1), Int("b_rows", 1), Int("b_cols", 1), Int("threads", 1), *_ACT),
    requires=("op <= 7", "b_cols == 1 or b_cols == inner", _ACT_KNOWN))

COPY_BLOCKS = Function("elementwise", "omrt_copy_blocks_f32",
                       (Array("x", "blocks * size"), Array("y", "(blocks - 1) * pitch + size", write=True),
                        Int("blocks", 1), Int("size", 1), Int("pitch")), requires=("pitch >= size",))
"""A Concat input's blocks into the output, `pitch` floats apart; x and y must not overlap."""

DECONV = Function(
    "conv", "omrt_deconv_f32",
    (Array("x", "N * C * H * W"), Array("w", "C * M * K * K"), Array("bias", "M", optional=True),
     Array("y", "N * M * H * K * W * K", write=True), Int("N"), Int("C", 1), Int("H"), Int("W"), Int("M", 1),
     Int("K", 1), Int("threads", 1), *_ACT),
    requires=("K <= DECONV_MAX_K", _ACT_KNOWN))
"""ConvTranspose whose kernel is its stride (K x K, unpadded, one group): no two taps meet."""

REPEAT2D = Function("elementwise", "omrt_repeat2d_f32",
                    (Array("x", "rows * W"), Array("y", "rows * kh * W * kw", write=True), Int("rows"), Int("W"),
                     Int("kh", 1), Int("kw", 1), Int("threads", 1)))
"""Resize's nearest upsampling of float32 by whole factors of the last two axes."""

_STATE = "dirs * batch * hidden"


def _lstm(name: str, weights: Array, panels: str) -> Function:
    """An LSTM time loop over R given as `weights`, its work holding `panels` floats of R's
    panels per direction beside the states and gates."""
    return Function(
        "recurrent", name,
        (Array("proj", "seq * batch * dirs * 4 * hidden"), weights,
         Array("P", "dirs * 3 * hidden", optional=True), Array("h0", _STATE, optional=True),
         Array("c0", _STATE, optional=True), Array("y", f"seq * {_STATE}", write=True, optional=True),
         Array("yh", _STATE, write=True, optional=True), Array("yc", _STATE, write=True, optional=True),
         Array("work", f"dirs * (batch * (2 * hidden + Gp) + {panels})", write=True, scratch=True),
         Int("dirs", 1), Int("seq"), Int("batch"), Int("hidden", 1), Int("layout"), Int("reverse"),
         Int("threads", 1)),
        derived=(("Gp", "-(-4 * hidden // LSTM_PANEL) * LSTM_PANEL"),),
        requires=("dirs <= 2", "layout <= 1", "reverse <= 1"))


LSTM = _lstm("omrt_lstm_f32", Array("R", "dirs * 4 * hidden * hidden"), "Gp * hidden")
"""An LSTM layer's time loop (csrc/recurrent.c), R as ONNX stores it, packed into panels per call."""

LSTM_PACKED = _lstm("omrt_lstm_packed_f32", Array("RT", "dirs * Gp * hidden"), "0")
"""The same over R's panels packed at compile time (omrt.kernels.recurrent.pack_recurrence)."""

def _gru(name: str, weights: Array, panels: str) -> Function:
    """A GRU time loop over R given as `weights`, as _lstm's."""
    return Function(
        "recurrent", name,
        (Array("proj", "seq * batch * dirs * 3 * hidden"), weights,
         Array("Rbh", "(dirs - 1) * rbh_step + hidden", optional=True), Array("h0", _STATE, optional=True),
         Array("y", f"seq * {_STATE}", write=True, optional=True), Array("yh", _STATE, write=True, optional=True),
         Array("work", f"dirs * (batch * (2 * hidden + Gp) + {panels})", write=True, scratch=True),
         Int("dirs", 1), Int("seq"), Int("batch"), Int("hidden", 1), Int("layout"), Int("reverse"), Int("lbr"),
         Int("rbh_step"), Int("threads", 1)),
        derived=(("Gp", "-(-2 * hidden // LSTM_PANEL) * LSTM_PANEL + -(-hidden // LSTM_PANEL) * LSTM_PANEL"),),
        requires=("dirs <= 2", "layout <= 1", "reverse <= 1", "lbr <= 1", "rbh_step >= hidden"))


GRU = _gru("omrt_gru_f32", Array("R", "dirs * 3 * hidden * hidden"), "Gp * hidden")
"""A GRU layer's time loop (csrc/recurrent.c), R as ONNX stores it, packed into panels per call:
its update and reset rows, then its candidate rows."""

GRU_PACKED = _gru("omrt_gru_packed_f32", Array("RT", "dirs * Gp * hidden"), "0")
"""The same over R's panels packed at compile time (omrt.kernels.recurrent.pack_recurrence)."""

FUNCTIONS = (USE_BLAS, POOL_BUSY, POOL_ROUND_TRIP, RUN_CALLS, GEMM_TILE, DWCONV2D, IM2COL2D, CONV2D, PCONV2D, POOL2D,
             GLOBAL_POOL, WINOGRAD, MATMUL, PMATMUL, ATTENTION, GELU, LRN, BINARY, COPY_BLOCKS, REPEAT2D, DECONV, LSTM,
             LSTM_PACKED, GRU, GRU_PACKED)
"""Every exported C function, the library's entry point first."""

UNITS = tuple(sorted({fn.unit for fn in FUNCTIONS} - {USE_BLAS.unit}))
"""The C units (csrc/<unit>.c) a library may be built from, beside the core every library holds."""
