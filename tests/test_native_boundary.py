"""The boundary between Python and omrt's C code: every binding matches its C prototype, and no
native function can be handed an array whose dtype, size or layout differs from what it reads."""

from __future__ import annotations

import os
import re

import numpy as np
import pytest

from omrt.errors import KernelError
from omrt.kernels.activations import _gelu_table
from omrt.native import bindings, fused
from omrt.native.library import SOURCES
from omrt.native.signature import CONSTANTS


def _exported_prototypes() -> dict[str, str]:
    """symbol -> `void name(type arg, ...)` for every OMRT_EXPORT function in csrc/, whitespace normalised."""
    found = {}
    for name in sorted(os.listdir(SOURCES)):
        text = open(os.path.join(SOURCES, name)).read()
        for m in re.finditer(r"OMRT_EXPORT\s+(?:OMRT_\w+\s+)*void\s+(\w+)\s*\(([^)]*)\)", text):
            args = ", ".join(" ".join(a.split()).replace(" *", " *") for a in m.group(2).split(","))
            found[m.group(1)] = f"void {m.group(1)}({args})"
    return found


def test_every_exported_c_function_has_a_binding_that_matches_its_prototype():
    exported = _exported_prototypes()
    assert exported, "no OMRT_EXPORT function found in csrc"
    functions = (*bindings.FUNCTIONS, fused.USE_POOL)  # the last: the fused kernels' prelude
    assert {f.symbol for f in functions} == set(exported)
    for fn in functions:
        assert fn.prototype() == exported[fn.symbol]


def _c_constant(source: str, pattern: str) -> int:
    match = re.search(pattern, open(os.path.join(SOURCES, source)).read())
    assert match, f"{pattern!r} not found in {source}"
    return int(match.group(1))


def test_the_constants_contracts_use_are_the_c_codes():
    assert CONSTANTS["POOL_THREADS"] == _c_constant("omrt_native.h", r"#define OMRT_MAX_THREADS (\d+)")
    assert CONSTANTS["LSTM_PANEL"] == _c_constant("recurrent.c", r"PANEL = (\d+)")
    assert CONSTANTS["GEMM_PANEL"] == _c_constant("omrt_gemm.h", r"#define OMRT_PANEL (\d+)")
    assert CONSTANTS["GEMM_MAX_NR"] == _c_constant("omrt_gemm.h", r"#define OMRT_MAX_NR (\d+)")
    assert CONSTANTS["GEMM_TAIL_COLS"] == _c_constant("omrt_gemm.h", r"#define OMRT_TAIL_COLS (\d+)")
    assert CONSTANTS["DECONV_MAX_K"] == _c_constant("conv.c", r"#define DECONV_MAX_K (\d+)")
    assert CONSTANTS["WINOGRAD_SKEW"] == _c_constant("winograd.c", r"#define WG_SKEW (\d+)")


@pytest.fixture
def native(native):
    if not native.blas:
        pytest.skip("numpy's BLAS offers no CBLAS sgemm here")
    return native


def _f32(*shape: int) -> np.ndarray:
    return np.random.default_rng(0).standard_normal(shape).astype(np.float32)


def _calls() -> dict:
    """A valid call of every kernel function: its arguments, in prototype order."""
    cdf, slope = _gelu_table()
    window3 = (3, 3, 1, 1, 1, 1, 1, 1)  # 3x3 kernel, stride 1, dilation 1, pads 1
    return {
        # bands of 3 output rows (two items, over two threads): 16 lanes x (9 taps + 5 x 7 + 3 x 5)
        bindings.DWCONV2D: [_f32(1, 4, 5, 5), _f32(4, 1, 3, 3), _f32(4), _f32(1, 4, 5, 5), _f32(2 * 944), 944, 3,
                            2, 1, 1, 4, 1, 5, 5, 5, 5, *window3, 0, 0.0, 0.0],
        bindings.IM2COL2D: [_f32(2, 4, 4), _f32(2 * 9, 16), 16, 0, 4, 2, 4, 4, 4, *window3],
        # 2 groups, their channels shuffled
        bindings.CONV2D: [_f32(1, 4, 5, 5), _f32(6, 2, 3, 3), _f32(6), _f32(1, 6, 5, 5), _f32(36 * 25), 5, 0, 1,
                          1, 4, 5, 5, 6, 2, 1, 5, 5, *window3, 1, 0.0, 0.0],
        # 14 filters: a full panel and a partial one; a residual; the shared buffer split over two threads
        bindings.PCONV2D: [_f32(1, 4, 5, 5), _f32(2, 36, 12), _f32(14), _f32(1, 14, 5, 5), _f32(1, 14, 5, 5),
                           _f32(36 * 25),
                           _f32(2 * 36 * 32), 5, 0, 32, 2, 1, 4, 5, 5, 14, 1, 0, 0, 5, 5, *window3, 1, 0.0, 0.0],
        bindings.GEMM_TILE: [np.zeros(1, np.int64)],
        # 16 planes at a time (4 of them), in bands of one output row: the most 240 floats hold
        bindings.POOL2D: [_f32(4, 6, 6), _f32(4, 3, 3), None, _f32(240), 240, 1, 4, 6, 6, 3, 3, 2, 2, 2, 2, 1, 1,
                          0, 0, 1, 1],
        # 16 filters in passes of one panel: a full one and a partial one
        bindings.WINOGRAD: [_f32(1, 16, 6, 6), _f32(16, 2, 16, 12), _f32(16), _f32(1, 16, 6, 6), _f32(10496),
                            8448, 10496, 9, 0, 12, 2, 1, 1, 16, 6, 6, 16, 6, 6, 1, 1, 0, 0.0, 0.0],
        bindings.MATMUL: [_f32(3, 4), _f32(4, 5), _f32(5), _f32(3, 5), 1, 3, 5, 4, 4, 5, 5, 0, 0, 0, 0, 0, 1,
                          0, 0.0, 0.0],
        # 13 rows (a full panel and one row) by 64 columns in two parts of one strip each, over two threads
        bindings.PMATMUL: [_f32(13, 4), _f32(2, 4, 32), _f32(64), _f32(2, 13, 32), _f32(2 * 12 * 4), 13, 64, 4, 4,
                           32, 32, 13 * 32, 2, 0, 0.0, 0.0],
        # 2 batches, 2 query heads on 1 key/value head, 3-D Q and Y, a mask per batch, over two threads
        # through BLAS
        bindings.ATTENTION: [_f32(2, 3, 10), _f32(2, 4, 5), _f32(2, 4, 3), _f32(2, 1, 3, 4), _f32(2, 3, 6),
                             _f32(2 * 2 * 3 * 4), 2, 2, 2, 3, 4, 5, 3, 30, 5, 10, 20, 5, 5, 12, 3, 3, 18, 3, 6, 12,
                             0, 4, 0.5, 0, 2],
        bindings.GELU: [_f32(100), _f32(100), cdf, slope, 100, 1],
        # 2 images of 5 channels, windows of 2 below and 2 above, 7 pixels split over two threads
        bindings.LRN: [_f32(2, 5, 7), _f32(2, 5, 7), 2, 5, 7, 2, 2, 1e-4, 1.0, 2],
        # 3 planes of 2 x 5 rows, each element 2 x 3 times, over two threads
        bindings.REPEAT2D: [_f32(3, 2, 5), _f32(3, 4, 15), 6, 5, 2, 3, 2],
        # 2x2 stride 2: 3 channels to 2 filters, Relu, over two threads
        bindings.DECONV: [_f32(1, 3, 4, 5), _f32(3, 2, 2, 2), _f32(2), _f32(1, 2, 8, 10), 1, 3, 4, 5, 2, 2, 2, 1,
                          0.0, 0.0],
        # x[4, 24] * s[4, 1] then Relu, on two threads
        bindings.BINARY: [_f32(4, 24), _f32(4, 1), _f32(4, 24), 2, 4, 24, 4, 1, 2, 1, 0.0, 0.0],
        bindings.POOL_BUSY: [np.zeros(4, np.int64), 4],
        bindings.GLOBAL_POOL: [_f32(6, 10), _f32(6), 6, 10, 0, 2],
        # 3 blocks of 4 floats into an output of 10 floats per block, the last block ending it
        bindings.COPY_BLOCKS: [_f32(12), _f32(24), 3, 4, 10],
        # bidirectional, 3 steps, batch 2, hidden 5, peepholes, layout 1, on two threads
        bindings.LSTM: [_f32(3, 2, 2, 20), _f32(2, 20, 5), _f32(2, 15), _f32(2, 2, 5), _f32(2, 2, 5),
                        _f32(2, 3, 2, 5), _f32(2, 2, 5), _f32(2, 2, 5), _f32(2 * (2 * (10 + 64) + 64 * 5)),
                        2, 3, 2, 5, 1, 0, 2],
        # GRU: bidirectional, 3 steps, batch 2, hidden 5, linear_before_reset, layout 0, on two threads;
        # work: per direction h and r h (2 x 5 each) and gates (2 x 128), then R's 128 panel rows
        # (Rbh each direction's 5 floats 30 apart, as in B from its 25th float on)
        bindings.GRU: [_f32(3, 2, 2, 15), _f32(2, 15, 5), _f32(35), _f32(2, 2, 5), _f32(3, 2, 2, 5),
                       _f32(2, 2, 5), _f32(2 * (2 * (10 + 128) + 128 * 5)), 2, 3, 2, 5, 0, 0, 1, 30, 2],
        # the same over R's panels packed beforehand, Rbh after the folded bias (5 floats apart)
        bindings.GRU_PACKED: [_f32(3, 2, 2, 15), _f32(2, 2, 5, 64), _f32(10), _f32(2, 2, 5), _f32(3, 2, 2, 5),
                              _f32(2, 2, 5), _f32(2 * 2 * (10 + 128)), 2, 3, 2, 5, 0, 0, 1, 5, 2],
        # the same over R's panels packed beforehand (2 directions x 64 rows x hidden 5)
        bindings.LSTM_PACKED: [_f32(3, 2, 2, 20), _f32(2, 5, 64), _f32(2, 15), _f32(2, 2, 5), _f32(2, 2, 5),
                               _f32(2, 3, 2, 5), _f32(2, 2, 5), _f32(2, 2, 5), _f32(2 * 2 * (10 + 64)),
                               2, 3, 2, 5, 1, 0, 2],
    }


CALLS = _calls()

OTHER_PATHS = [
    # plane by plane: with too little scratch for 16 planes at a time, or not asked to
    (bindings.POOL2D, [_f32(4, 6, 6), _f32(4, 3, 3), None, _f32(6), 6, 1, 4, 6, 6, 3, 3, 2, 2, 2, 2, 1, 1, 0, 0,
                       1, 1]),
    (bindings.POOL2D, [_f32(4, 6, 6), _f32(4, 3, 3), None, _f32(480), 240, 2, 4, 6, 6, 3, 3, 2, 2, 2, 2, 1, 1, 0,
                       0, 1, 0]),
    # the vector path (AVX-512): rows of 50 read as 16-column vectors, the first from column -1 and
    # the last ones past the row masked, 25 outputs a masked store; two planes on two threads
    (bindings.POOL2D, [_f32(2, 5, 50), _f32(2, 3, 25), None, _f32(100), 50, 2, 2, 5, 50, 3, 25, 3, 3, 2, 2, 1, 1,
                       1, 1, 1, 2]),
    # a row in a register (AVX-512): rows of all 16 lanes averaged, 3x3 padded, the divisors read
    # per output row; then 7-wide rows, the max at stride 2 into 4 outputs; over two threads
    (bindings.POOL2D, [_f32(4, 6, 16), _f32(4, 6, 16), _f32(96), _f32(32), 16, 2, 4, 6, 16, 6, 16, 3, 3, 1, 1, 1, 1,
                       1, 1, 0, 3]),
    (bindings.POOL2D, [_f32(3, 7, 7), _f32(3, 4, 4), None, _f32(14), 7, 2, 3, 7, 7, 4, 4, 3, 3, 2, 2, 1, 1, 1, 1,
                       1, 3]),
    # a 1x1 layer of 64 positions: the tile reads both strips of 32 columns in place, the last one
    # ending at x's last float
    (bindings.PCONV2D, [_f32(1, 4, 8, 8), _f32(1, 4, 12), _f32(5), _f32(1, 5, 8, 8), _f32(1, 5, 8, 8), _f32(1),
                        _f32(4 * 32), 8, 0, 32, 1, 1, 4, 8, 8, 5, 1, 0, 0, 8, 8, 1, 1, 1, 1, 1, 1, 0, 0, 1, 0.0, 0.0]),
    # the same with the filters in the lanes: 5 panels of 12 positions read in place, the last 4
    # copied (zero-padded) into the thread's strips, 14 filters of a strip of 32
    (bindings.PCONV2D, [_f32(1, 4, 8, 8), _f32(1, 4, 32), _f32(14), _f32(1, 14, 8, 8), _f32(1, 14, 8, 8), _f32(1),
                        _f32(4 * 32), 8, 0, 32, 1, 1, 4, 8, 8, 14, 1, 0, 1, 8, 8, 1, 1, 1, 1, 1, 1, 0, 0, 1, 0.0,
                        0.0]),
    # a 1x1 layer over a 7x7 plane on two threads: positions [16, 49) on the second, the last one
    # through the tail (each panel's 12 floats a step, the column's last float x's last), with AVX2
    # the 32 before it copied into the thread's block of 64 columns (rows 49 floats apart)
    (bindings.PCONV2D, [_f32(1, 4, 7, 7), _f32(2, 4, 12), _f32(14), _f32(1, 14, 7, 7), _f32(1, 14, 7, 7), _f32(1),
                        _f32(2 * 4 * 64), 7, 0, 64, 2, 1, 4, 7, 7, 14, 1, 0, 0, 7, 7, 1, 1, 1, 1, 1, 1, 0, 0, 1, 0.0,
                        0.0]),
    # 3x3, the filters in the lanes, 40 of them (a strip and part of one) cut between two threads
    (bindings.PCONV2D, [_f32(1, 4, 5, 5), _f32(2, 36, 32), _f32(40), _f32(1, 40, 5, 5), _f32(1, 40, 5, 5),
                        _f32(36 * 25), _f32(2 * 36 * 32), 5, 0, 32, 2, 1, 4, 5, 5, 40, 1, 0, 1, 5, 5, 3, 3, 1, 1,
                        1, 1, 1, 1, 1, 0.0, 0.0]),
    # a 1x1 layer over a 1x1 plane, the filters in the lanes: each strip streamed once over 5 taps
    # (a last single step), 40 filters (a strip and part of one) with a residual, on two threads
    (bindings.PCONV2D, [_f32(1, 5, 1, 1), _f32(2, 5, 32), _f32(40), _f32(1, 40, 1, 1), _f32(1, 40, 1, 1), _f32(1),
                        _f32(2 * 5 * 32), 1, 0, 32, 2, 1, 5, 1, 1, 40, 1, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 1, 0.0,
                        0.0]),
    # 2 groups of 7 filters, 1x1, shuffled: each group's single panel reads its own 2 channels and
    # writes every other plane, the residual beside it
    (bindings.PCONV2D, [_f32(1, 4, 8, 8), _f32(2, 2, 12), _f32(14), _f32(1, 14, 8, 8), _f32(1, 14, 8, 8), _f32(1),
                        _f32(2 * 2 * 32), 8, 0, 32, 2, 1, 4, 8, 8, 14, 2, 1, 0, 8, 8, 1, 1, 1, 1, 1, 1, 0, 0, 1,
                        0.0, 0.0]),
    # attention on the tile, 16 values per head (V's rows read 16 floats at a time, the last ending
    # V), two slots of 5 x (32 + 12) + 4 x 32 + 2 x 32 floats: a mask per query, then over the keys
    (bindings.ATTENTION, [_f32(2, 3, 10), _f32(2, 4, 5), _f32(2, 4, 16), _f32(2, 1, 3, 4), _f32(2, 3, 32),
                          _f32(2 * 412), 2, 2, 2, 3, 4, 5, 16, 30, 5, 10, 20, 5, 5, 64, 16, 16, 96, 16, 32, 12, 0, 4,
                          0.5, 1, 2]),
    (bindings.ATTENTION, [_f32(2, 3, 10), _f32(2, 4, 5), _f32(2, 4, 16), _f32(2, 1, 1, 4), _f32(2, 3, 32),
                          _f32(2 * 412), 2, 2, 2, 3, 4, 5, 16, 30, 5, 10, 20, 5, 5, 64, 16, 16, 96, 16, 32, 4, 0, 0,
                          0.5, 1, 2]),
    # 4x4 tiles (36 elements): 4 tiles in two chunks of 2, over two threads
    (bindings.WINOGRAD, [_f32(1, 16, 6, 6), _f32(36, 2, 16, 12), _f32(16), _f32(1, 16, 6, 6), _f32(2 * 19952),
                         19008, 19952, 2, 0, 12, 4, 2, 1, 16, 6, 6, 16, 6, 6, 1, 1, 0, 0.0, 0.0]),
]
"""Valid calls that take other paths through a function than its entry in CALLS."""


@pytest.mark.parametrize("fn, values", [*CALLS.items(), *OTHER_PATHS], ids=lambda f: getattr(f, "symbol", ""))
def test_a_valid_call_runs(native, fn, values):
    native.get(fn)(*values)
    written = next(v for a, v in zip(fn.args, values)
                   if getattr(a, "write", False) and not getattr(a, "scratch", False))
    assert np.isfinite(written).all()


def _array_positions(fn) -> list[int]:
    return [i for i, a in enumerate(fn.args) if isinstance(a, (bindings.Array, bindings.Matrix))
            and CALLS[fn][i] is not None]


def _misuses(fn) -> list[tuple[str, int, object]]:
    """(what, position, bad value) for every array argument of a valid call."""
    out = []
    for i in _array_positions(fn):
        arg, good = fn.args[i], CALLS[fn][i]
        if not getattr(arg, "scratch", False):
            out.append(("float64", i, good.astype(np.float64)))
        out.append(("one float short", i, good.reshape(-1)[:-1] if isinstance(arg, bindings.Array)
                    else good[:-1]))
        if good.size > 1:  # numpy calls any one-element array contiguous
            out.append(("non-contiguous", i, np.repeat(good, 2, axis=-1)[..., ::2]))
        out.append(("not an array", i, list(good.reshape(-1))))
        if getattr(arg, "write", False):
            frozen = good.copy()
            frozen.flags.writeable = False
            out.append(("read-only", i, frozen))
        if not getattr(arg, "optional", False):
            out.append(("NULL", i, None))
    return out


MISUSES = [(fn, what, i, bad) for fn in CALLS for what, i, bad in _misuses(fn)]


@pytest.mark.parametrize("fn, what, position, bad", MISUSES,
                         ids=[f"{fn.symbol}-{fn.args[i].name}-{what}" for fn, what, i, _ in MISUSES])
def test_a_misfit_array_is_refused_before_the_call(native, fn, what, position, bad):
    values = list(CALLS[fn])
    values[position] = bad
    before = [v.copy() if isinstance(v, np.ndarray) else v for v in values]
    name = fn.args[position].name
    with pytest.raises(KernelError, match=rf"native {fn.symbol}: .*{name}"):
        native.get(fn)(*values)
    for v, b in zip(values, before):  # nothing was written: the C code never ran
        if isinstance(v, np.ndarray):
            np.testing.assert_array_equal(v, b)


BROKEN_RULES = [
    (bindings.DWCONV2D, 5, 943, r"requires OW >= 16 and not lanes or pitch >= 16 \* \(KH"),  # a band does not fit
    (bindings.DWCONV2D, 11, 3, r"requires M % mult == 0"),
    (bindings.DWCONV2D, 16, 70000, r"requires KH \* KW <= MAX_TAPS"),  # the wide path keeps an int64 per tap
    (bindings.IM2COL2D, 2, 15, r"requires pitch >= \(r1 - r0\) \* OW"),
    (bindings.IM2COL2D, 3, 5, r"requires r0 <= r1"),
    (bindings.CONV2D, 13, 4, r"requires M % G == 0"),
    (bindings.CONV2D, 6, 10, r"requires pointwise or not buffer or buffer >="),
    (bindings.CONV2D, 14, 2, r"requires shuffle <= 1"),
    (bindings.POOL2D, 4, 5, r"requires pitch >= W"),
    (bindings.PCONV2D, 9, 48, r"requires block % GEMM_MAX_NR == 0"),
    (bindings.PCONV2D, 17, 2, r"requires shuffle <= 1"),
    (bindings.PCONV2D, 18, 2, r"requires lanes <= 1"),
    (bindings.PCONV2D, 18, 1, r"panels must hold .* = 1152 floats"),  # panels of 12 read as strips of 32
    (bindings.WINOGRAD, 5, 8447, r"requires v_floats >="),
    (bindings.WINOGRAD, 8, 1, r"work must hold v_floats \+ min\(threads, max\(C, F\)\) \* slot_floats"),
    (bindings.WINOGRAD, 9, 6, r"requires fpass % GEMM_PANEL == 0"),
    (bindings.WINOGRAD, 10, 3, r"requires T in \(2, 4\)"),
    (bindings.MATMUL, 8, 3, r"a must be a \(3, 4\) view with strides \(12, 4\)"),  # a pitch shorter than a row
    (bindings.MATMUL, 17, 7, r"requires act <= 4"),
    (bindings.PMATMUL, 10, 24, r"requires N % part_cols == 0"),
    (bindings.PMATMUL, 11, 13 * 32 - 1, r"requires part_cols == N or part_stride >="),  # parts would overlap
    (bindings.ATTENTION, 8, 3, r"requires H % G == 0"),
    (bindings.ATTENTION, 15, 4, r"requires qs >= D"),  # Q's rows would overlap
    (bindings.ATTENTION, 29, 2, r"requires tiles <= 1"),
    (bindings.ATTENTION, 29, 1, r"requires tiles == 0 or DV % 16 == 0"),  # V's rows read 16 floats at a time
    (bindings.GELU, 4, 101, r"x must hold n = 101 floats"),
    (bindings.GELU, 5, 0, r"threads must be an integer >= 1"),
    (bindings.POOL2D, 17, -1, r"PT must be an integer >= 0"),
    (bindings.POOL2D, 20, 4, r"requires path <= 3"),
    (bindings.BINARY, 3, 8, r"requires op <= 7"),
    (bindings.BINARY, 7, 2, r"requires b_cols == 1 or b_cols == inner"),
    (bindings.BINARY, 4, 5, r"a must hold rows \* inner = 120 floats"),
    (bindings.BINARY, 6, 5, r"b must hold b_rows \* b_cols = 5 floats"),
    (bindings.BINARY, 9, 5, r"requires act <= 4"),
    (bindings.POOL_BUSY, 1, 65, r"requires n <= POOL_THREADS"),
    (bindings.GLOBAL_POOL, 4, 2, r"requires is_max <= 1"),
    (bindings.COPY_BLOCKS, 4, 3, r"requires pitch >= size"),
    (bindings.DECONV, 9, 9, r"requires K <= DECONV_MAX_K"),  # the loop keeps 8 taps' sums
    (bindings.REPEAT2D, 4, 3, r"y must hold rows \* kh \* W \* kw = 270 floats"),
    (bindings.LSTM, 9, 3, r"requires dirs <= 2"),
    (bindings.LSTM, 12, 6, r"proj must hold seq \* batch \* dirs \* 4 \* hidden = 288 floats"),
    (bindings.LSTM_PACKED, 14, 2, r"requires reverse <= 1"),
    (bindings.GRU, 13, 2, r"requires lbr <= 1"),
    (bindings.GRU, 14, 4, r"requires rbh_step >= hidden"),
    (bindings.GRU, 10, 6, r"proj must hold seq \* batch \* dirs \* 3 \* hidden = 216 floats"),
]


@pytest.mark.parametrize("fn, position, value, why", BROKEN_RULES,
                         ids=[f"{fn.symbol}-{fn.args[i].name}={v}" for fn, i, v, _ in BROKEN_RULES])
def test_integers_that_break_the_contract_are_refused(native, fn, position, value, why):
    values = list(CALLS[fn])
    values[position] = value
    with pytest.raises(KernelError, match=rf"native {fn.symbol}: {why}"):
        native.get(fn)(*values)


def test_the_abi_is_a_digest_of_the_sources():
    from omrt.native.library import kernel_abi

    assert re.fullmatch(r"[0-9a-f]{16}", kernel_abi())


GUARDED = r'''
import ctypes, mmap, sys
import numpy as np
sys.path.insert(0, {tests!r})
from test_native_boundary import CALLS, OTHER_PATHS
from omrt.native.build import build
from omrt.native.loader import load

PAGE = mmap.PAGESIZE
libc = ctypes.CDLL(None, use_errno=True)
libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
keep = []


def guarded(a):
    """A copy of `a` whose last byte is followed by an unmapped page: a read or write past it faults."""
    pages = -(-a.nbytes // PAGE) + 1
    m = mmap.mmap(-1, pages * PAGE)
    base = ctypes.addressof(ctypes.c_char.from_buffer(m))
    assert libc.mprotect(base + (pages - 1) * PAGE, PAGE, 0) == 0
    out = np.frombuffer(m, a.dtype, a.size, (pages - 1) * PAGE - a.nbytes).reshape(a.shape)
    out[...] = a
    keep.append(m)
    return out


from omrt.native.bindings import UNITS
library = load([build(list(UNITS), lambda msg: None)], trusted=True)
for fn, values in [*CALLS.items(), *OTHER_PATHS]:
    library.get(fn)(*[guarded(v) if isinstance(v, np.ndarray) else v for v in values])
    print(fn.symbol, "ok")
'''


def test_valid_calls_stay_inside_their_arrays(native, tmp_path):
    """Each array of a valid call ends against an unmapped page: the C code reading or writing one
    float past what its contract states would kill the process."""
    import subprocess
    import sys

    script = tmp_path / "guarded.py"
    script.write_text(GUARDED.format(tests=os.path.dirname(os.path.abspath(__file__))))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.count(" ok") == len(CALLS) + len(OTHER_PATHS)
