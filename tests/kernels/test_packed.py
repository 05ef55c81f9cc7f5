"""PackedConv and PackedMatMul: weights packed at compile time for omrt's own GEMM
(csrc/omrt_gemm.h), against onnx.reference over many shapes, on every tile a CPU may pick, and
after a swap of the weights they were packed from."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from kernel_check import randn, reference
import omrt
from omrt.errors import ShapeError
from omrt.kernels import OpContext, TensorInfo, packed, parallel, window
from omrt.native.bindings import GEMM_TILES
from test_native_kernels import ACTS, _activated


def _pack(w: np.ndarray, group: int, lanes: bool) -> np.ndarray:
    """The filters as the compiler packs them: panels, or strips with the filters in the lanes."""
    return packed.pack_filter_strips(w, group) if lanes else packed.pack_panels(w, group)


def _kernel(x: np.ndarray, w: np.ndarray, bias: np.ndarray | None, attrs: dict, native,
            residual: np.ndarray | None = None, shuffled: bool = False, lanes: bool = False) -> packed.PackedConv:
    attrs = {**attrs, "lanes": 1} if lanes else attrs
    panels = _pack(w, attrs.get("group", 1), lanes)
    ctx = OpContext(attrs, 1, name="t", op_type="PackedConv", native=native)
    infos = [TensorInfo(x.dtype, x.shape), TensorInfo(w.dtype, w.shape),
             None if bias is None else TensorInfo(bias.dtype, bias.shape), TensorInfo(panels.dtype, panels.shape)]
    cls = packed.PackedConv if residual is None else packed.PackedResidualConv
    cls = packed.PackedShuffledConv if shuffled else cls
    if residual is not None:
        infos.append(TensorInfo(residual.dtype, residual.shape))
    return cls(ctx, infos, cls.infer(ctx, infos[:4]))


def _run(kernel: packed.PackedConv, x, w, bias, residual: np.ndarray | None = None,
         over_residual: bool = False) -> np.ndarray:
    """The kernel's output, every float of it written (NaN before; or written over a copy of the
    residual, the output then being that residual), over a workspace of garbage."""
    y = np.full(kernel.outputs[0].shape, np.nan, np.float32)
    if over_residual:
        y = residual = residual.copy()
    inputs = [x, w, bias, _pack(w, kernel.group, kernel.lanes)] + ([] if residual is None else [residual])
    kernel.run(inputs, [y], np.full(kernel.workspace(), 0xCD, np.uint8))
    return y


def _takes_the_tile(kernel: packed.PackedConv, native) -> bool:
    """Whether a PackedConv over the library `native` should run on omrt's tile: enough output
    positions (or one, with the filters in the lanes), and a vector tile on this CPU (else BLAS
    multiplies: OMRT_GEMM_TILE=c)."""
    positions = int(np.prod(kernel.outputs[0].shape[2:]))
    many = positions >= packed.MIN_POSITIONS or (kernel.lanes and positions == 1)
    return many and packed.gemm_tile(native) > 0


def test_each_group_has_panels_of_its_own():
    w = randn(14, 3, 1, 1)
    panels = packed.pack_panels(w, 2)
    assert panels.shape == (2, 3, packed.PANEL)
    np.testing.assert_array_equal(panels[0], packed.pack_panels(w[:7])[0])
    np.testing.assert_array_equal(panels[1], packed.pack_panels(w[7:])[0])


def test_panels_hold_twelve_filters_per_tap_and_zeros_past_the_last():
    w = randn(14, 3, 2, 2)
    panels = packed.pack_panels(w)
    assert panels.shape == (2, 12, packed.PANEL) and panels.flags.c_contiguous
    flat = w.reshape(14, 12)
    for m in range(14):
        np.testing.assert_array_equal(panels[m // 12, :, m % 12], flat[m])
    assert not panels[1, :, 2:].any()


def test_strips_hold_thirty_two_columns_per_row_and_zeros_past_the_last():
    b = randn(5, 40)
    strips = packed.pack_strips(b)
    assert strips.shape == (2, 5, packed.STRIP) and strips.flags.c_contiguous
    np.testing.assert_array_equal(strips[0], b[:, :32])
    np.testing.assert_array_equal(strips[1, :, :8], b[:, 32:])
    assert not strips[1, :, 8:].any()


def test_filter_strips_hold_thirty_two_filters_per_tap_each_group_on_its_own():
    w = randn(80, 3, 2, 2)
    strips = packed.pack_filter_strips(w, 2)
    assert strips.shape == (4, 12, packed.STRIP) and strips.flags.c_contiguous
    for g in range(2):
        flat = w[40 * g:40 * (g + 1)].reshape(40, 12)
        np.testing.assert_array_equal(strips[2 * g], flat[:32].T)
        np.testing.assert_array_equal(strips[2 * g + 1, :, :8], flat[32:].T)
        assert not strips[2 * g + 1, :, 8:].any()


@pytest.mark.parametrize("lanes", [False, True])
def test_packed_filters_of_another_packing_than_the_node_names_are_refused(native, lanes):
    """96 filters fill 8 panels of 12 and 3 strips of 32 alike: the native call's size check cannot
    tell the packings apart, so the kernel checks their shape."""
    x, w = randn(1, 4, 7, 7), randn(96, 4, 1, 1)
    wrong = packed.pack_panels(w) if lanes else packed.pack_filter_strips(w)
    assert wrong.size == _pack(w, 1, lanes).size
    ctx = OpContext({"lanes": 1} if lanes else {}, 1, name="conv7", op_type="PackedConv", native=native)
    infos = [TensorInfo(x.dtype, x.shape), TensorInfo(w.dtype, w.shape), None, TensorInfo(w.dtype, wrong.shape)]
    want = (3, 4, 32) if lanes else (8, 4, 12)
    with pytest.raises(ShapeError, match=re.escape(f"conv7: its packed filters (input 3) have shape {wrong.shape}, "
                                                   f"but W (96, 4, 1, 1) packed ") + ".*" +
                       re.escape(f"(attribute lanes={int(lanes)}) has shape {want}: the file is damaged")):
        packed.PackedConv(ctx, infos, packed.PackedConv.infer(ctx, infos))


@pytest.mark.parametrize("positions, filters, taps, lanes", [
    (21, 512, 2048, True), (21, 64, 64, True),          # 3x7: strips of positions 0.66 full
    (21, 64, 16, False),                                # too shallow
    (17, 40, 67, False), (20, 40, 67, False),           # the last 1-4 in the tail, strips full
    (49, 512, 2048, False), (49, 64, 64, False),        # 7x7: the 49th in the tail
    (196, 256, 128, False), (196, 128, 64, False),      # 14x14: the last 4 in the tail
    (169, 1000, 512, False), (169, 256, 64, False),     # 13x13, 56x56: as full either way
    (3136, 64, 256, False), (3136, 256, 64, False),
    (12321, 64, 27, False), (21, 40, 64, False),        # a stem; 40 filters: strips 0.83 full
    (1, 1000, 1024, True), (1, 4, 1024, False)])        # one position: lanes unless 4 filters or fewer
def test_layers_of_few_positions_and_deep_enough_products_put_the_filters_in_the_lanes(positions, filters, taps,
                                                                                       lanes):
    assert packed.filter_lanes(positions, filters, taps) is lanes


def test_a_3x7_layer_compiles_with_its_filters_in_the_lanes_and_agrees_untrusted(native, tmp_path):
    rng = np.random.default_rng(3)
    w = (rng.standard_normal((64, 96, 1, 1)) / 10).astype(np.float32)
    b = rng.standard_normal(64).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w", "b"], ["c"]), helper.make_node("Relu", ["c"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 96, 3, 7])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64, 3, 7])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    src, path = tmp_path / "m.onnx", tmp_path / "m.om"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), src)
    omrt.compile(str(src), str(path), progress=None)
    trusted = omrt.load(str(path), trust_kernels=True)
    node = trusted.graph.nodes[0]
    assert (node.op_type, node.attrs.get("lanes"), node.inputs[3]) == ("PackedConv", 1, "w__lanes")
    x = rng.standard_normal((1, 96, 3, 7)).astype(np.float32)
    want = np.maximum(np.einsum("mc,nchw->nmhw", w[:, :, 0, 0], x) + b[:, None, None], 0)
    for model in (trusted, omrt.load(str(path))):
        got = model.session().run({"x": x})["y"]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * float(np.abs(want).max()))


def test_only_dense_2d_float_layers_with_a_c_activation_are_packed():
    x, w = TensorInfo(np.dtype(np.float32), (1, 8, 6, 6)), randn(4, 8, 3, 3)
    assert packed.eligible({}, x, w) and packed.eligible({"strides": [2, 2], "_act": "Clip"}, x, w)
    assert not packed.eligible({"group": 2}, x, randn(4, 4, 3, 3))  # groups of 2 filters
    assert packed.eligible({"group": 2}, x, randn(12, 4, 3, 3))
    assert not packed.eligible({"_act": "Sigmoid"}, x, w)
    assert not packed.eligible({}, TensorInfo(np.dtype(np.float32), (1, 8, 6)), randn(4, 8, 3))
    assert not packed.eligible({}, TensorInfo(np.dtype(np.float64), (1, 8, 6, 6)), w.astype(np.float64))
    assert not packed.eligible({}, TensorInfo(np.dtype(np.float32), ("N", 8, 6, 6)), w)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.integers(1, 2), st.integers(1, 20), st.integers(1, 40), st.integers(1, 12), st.integers(1, 12),
       st.integers(1, 5), st.integers(1, 3), st.integers(1, 2), st.lists(st.integers(0, 2), min_size=4, max_size=4),
       st.sampled_from(sorted(ACTS, key=str)), st.booleans(), st.integers(1, 2), st.booleans(), st.booleans(),
       st.booleans())
def test_packed_conv_matches_reference(native, monkeypatch, n, c, f, h, w, k, stride, dilation, pads, act, bias,
                                       threads, residual, numpy_path, lanes):
    """Against onnx.reference: act(Conv(X, W, B) [+ R]), through the tile, with the filters in panels
    or in the vector lanes (BLAS for few positions, or on a CPU without a vector tile) or, without
    the library, numpy."""
    if h + pads[0] + pads[2] < (k - 1) * dilation + 1 or w + pads[1] + pads[3] < (k - 1) * dilation + 1:
        return
    x, weight = randn(n, c, h, w), randn(f, c, k, k)
    b = randn(f) if bias else None
    attrs = {"pads": pads, "strides": [stride, stride], "dilations": [dilation, dilation]}
    conv = reference("Conv", [x, weight] + ([b] if bias else []), attrs)[0]
    r = randn(*conv.shape) if residual else None
    library = None if numpy_path else native
    monkeypatch.setattr(parallel, "NATIVE_SPLIT_FLOPS", 0)
    omrt.set_num_threads(threads)
    try:
        kernel = _kernel(x, weight, b, {**attrs, **ACTS[act]}, library, r, lanes=lanes)
        assert (kernel.native_packed is not None) == (_takes_the_tile(kernel, native) and not numpy_path)
        y = _run(kernel, x, weight, b, r)
    finally:
        omrt.set_num_threads(1)
    want = _activated(conv if r is None else conv + r, act)
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4 * max(1.0, float(np.abs(want).max())))


@pytest.mark.parametrize("c, k, stride, pads", [(60, 3, 1, [1, 1, 1, 1]), (100, 3, 2, [0, 1, 1, 0]),
                                                (600, 1, 1, [0, 0, 0, 0]), (6000, 1, 1, [0, 0, 0, 0])])
@pytest.mark.parametrize("act", ["Clip", None])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("filters", [40, 140])
@pytest.mark.parametrize("lanes", [False, True], ids=["panels", "lanes"])
def test_long_products_keep_bias_residual_and_activation(native, monkeypatch, c, k, stride, pads, act, threads,
                                                         filters, lanes):
    """Products over more rows (C * KH * KW, 540 to 6000) than the property test reaches, with a
    partial strip at the end (99 positions); up to 600 rows the columns fit the GEMM's whole pass
    on an L2 of 512 KiB or more (omrt_b_in_l2): every whole strip read in place; at 6000, past the most any L2 is
    given (OMRT_B_IN_L2_MOST), 40 filters still read them in place and 140 (more than the GEMM's
    in-place rows) copy every strip, a block at a time; with the
    filters in the lanes, 99 positions are 8 whole panels read in place and 3 copied, 40 or 140
    filters end in a partial strip, and 6000 rows go in parts (the sums so far kept in y); once
    into y and once over the residual (the plan's PackedResidualConv.inplace)."""
    x, weight = randn(1, c, 9, 11), randn(filters, c, k, k) / np.float32(np.sqrt(c * k * k))
    _matches_into_y_and_over_the_residual(native, monkeypatch, x, weight, {"pads": pads, "strides": [stride, stride]},
                                          act, threads, lanes)


def _matches_into_y_and_over_the_residual(native, monkeypatch, x, weight, attrs, act, threads, lanes) -> None:
    """act(Conv(x, weight, bias) + a residual) by a PackedConv on `threads` threads (every call
    split), against onnx.reference, run once into y and once over the residual; on the tile
    exactly where `_takes_the_tile` says."""
    b = randn(weight.shape[0])
    conv = reference("Conv", [x, weight, b], attrs)[0]
    r = randn(*conv.shape)
    monkeypatch.setattr(parallel, "NATIVE_SPLIT_FLOPS", 0)
    omrt.set_num_threads(threads)
    try:
        kernel = _kernel(x, weight, b, {**attrs, **ACTS[act]}, native, r, lanes=lanes)
        assert (kernel.native_packed is not None) == _takes_the_tile(kernel, native)
        ys = [_run(kernel, x, weight, b, r, over_residual) for over_residual in (False, True)]
    finally:
        omrt.set_num_threads(1)
    want = _activated(conv + r, act)
    for y in ys:
        np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4 * max(1.0, float(np.abs(want).max())))


@pytest.mark.parametrize("filters, channels, k", [(40, 577, 1), (1000, 1024, 1), (24, 72, 1), (40, 5, 3)])
@pytest.mark.parametrize("act", ["Clip", None])
@pytest.mark.parametrize("threads", [1, 2])
def test_layers_over_one_position_stream_their_strips_with_bias_residual_and_activation(native, monkeypatch,
                                                                                      filters, channels, k, act,
                                                                                      threads):
    """A layer of one output position (a 1x1 layer over a 1x1 plane: a classifier after global
    pooling, a squeeze-excite block's; or a 3x3 one over a 3x3 plane, its taps gathered into a
    column of the im2col buffer rather than read from x) with its filters in the lanes runs on
    omrt's GEMM, each strip of 32 filters read once: an odd depth (577 and 45: a last single
    step), a last partial strip (40, 1000 and 24 filters), split over threads by filters; once
    into y and once over the residual."""
    assert packed.filter_lanes(1, filters, channels * k * k)
    x, weight = randn(2, channels, k, k), randn(filters, channels, k, k) / np.float32(np.sqrt(channels * k * k))
    _matches_into_y_and_over_the_residual(native, monkeypatch, x, weight, {}, act, threads, lanes=True)


@pytest.mark.parametrize("plane", [(1, 17), (2, 9), (1, 19), (4, 5), (7, 7)])
@pytest.mark.parametrize("channels", [5, 67])
@pytest.mark.parametrize("filters", [40, 36])
@pytest.mark.parametrize("threads", [1, 2])
def test_the_last_few_positions_past_a_multiple_of_16_go_through_the_tail(native, monkeypatch, plane, channels,
                                                                          filters, threads):
    """1 to 4 positions past a multiple of 16 (17-20 and a 7x7 plane's 49) are multiplied by whole
    panels of filters in the GEMM's narrow tail, not by a tile of 16 or 32 columns, one panel at a
    time for one position and a pair for more: every count of them, depths that leave steps over
    after the tail's unrolled ones (5 and 67 taps), 40 filters (two pairs of panels, the last panel
    of 4) and 36 (a last panel alone), split over threads by filters (17-20 positions: 24 and 16
    or 12) or by positions (49: [16, 49) on the second, 32 columns and the tail); with bias,
    residual and activation, into y and over the residual. With AVX2, a plane whose rows do not
    start on cache lines (7x7: 49 floats apart) is first copied whole into the GEMM's scratch."""
    x, weight = randn(1, channels, *plane), randn(filters, channels, 1, 1) / np.float32(np.sqrt(channels))
    _matches_into_y_and_over_the_residual(native, monkeypatch, x, weight, {}, "Clip", threads, lanes=False)


@pytest.mark.parametrize("plane", [(13, 13), (14, 14)])
@pytest.mark.parametrize("threads", [1, 2])
def test_a_plane_whose_rows_straddle_cache_lines_is_copied_whole(native, monkeypatch, plane, threads):
    """A 13x13 or 14x14 plane (rows 169 or 196 floats apart) of 67 taps gets one block of all its
    columns (192 or 224), so that with AVX2 the GEMM copies it whole, aligned, and reads each panel
    once: 140 filters (more than the GEMM's in-place rows), split over threads by positions, the
    last 9 columns in a masked strip (13x13) or 4 in the tail (14x14); with bias, residual and
    activation, into y and over the residual. An aligned plane (28x28) or one of more floats than
    WHOLE_PLANE_FLOATS keeps blocks about an L1."""
    assert packed.block_columns(67, 169) == 192 and packed.block_columns(67, 196) == 224
    assert packed.block_columns(512, 169) == 192 and packed.block_columns(1024, 196) == 32
    assert packed.block_columns(67, 784) == packed.block_columns(67, 10_001) == 96
    x, weight = randn(1, 67, *plane), randn(140, 67, 1, 1) / np.float32(np.sqrt(67))
    assert _kernel(x, weight, None, {}, native).block == -(-plane[0] * plane[1] // 32) * 32
    _matches_into_y_and_over_the_residual(native, monkeypatch, x, weight, {}, "Clip", threads, lanes=False)


@pytest.mark.parametrize("channels, stride, size", [(30, 1, 7), (240, 1, 7), (70, 2, 14), (20, 1, 10)])
@pytest.mark.parametrize("filters", [60, 140])
@pytest.mark.parametrize("threads", [1, 2])
def test_a_small_plane_is_gathered_into_each_threads_own_strips(native, monkeypatch, channels, stride, size,
                                                                filters, threads):
    """A 3x3 layer whose output plane fits one block of the GEMM (7x7: 49 columns, 10x10: 100) has
    its columns gathered straight into the thread's strips, zero past the last column, and
    multiplied there in place. On two threads, with more filters than positions, each thread
    gathers the whole plane into its own strips and takes half the filters (where the plan has one
    shared column buffer); with fewer (60 filters over 10x10), each gathers its chunks into its
    strips; on one, its chunk is the whole plane. Depths of 180, 270 and 630 taps, and 2160 (past
    OMRT_SPLIT_FROM: with AVX2, passes of the strips in place); stride 2 from 14x14; two images,
    so that each gathers again; with bias, residual and activation, into y and over the residual."""
    x = randn(2, channels, size, size)
    weight = randn(filters, channels, 3, 3) / np.float32(np.sqrt(channels * 9))
    attrs = {"pads": [1, 1, 1, 1], "strides": [stride, stride]}
    out = (size + 2 - 3) // stride + 1
    kernel = _kernel(x, weight, None, attrs, native)
    assert kernel.block >= out * out  # the whole plane fits one block (conv.c: gathers_into_strips)
    split = kernel._split(threads)
    if threads == 1 or filters < out * out:
        assert split.buffer > 0 and split.step * out <= kernel.block  # chunks a thread gathers alone
    else:
        assert split.buffer == 0 and split.step >= out  # the one shared plane, gathered per thread
    _matches_into_y_and_over_the_residual(native, monkeypatch, x, weight, attrs, "Clip", threads, lanes=False)


@pytest.mark.parametrize("filters", [20, 140])
@pytest.mark.parametrize("threads", [1, 2])
def test_a_deep_product_goes_in_passes_whose_sums_the_output_carries(native, monkeypatch, filters, threads):
    """A 1x1 layer of 2305 taps over a 17x17 plane: with a tile 16 columns wide (AVX2, plain C) the
    GEMM takes its steps in ten passes (the last shorter), each adding to the sums in y, the first
    with the bias and the residual, only the last with the activation (a Clip of partial sums would
    show), and its columns 288 at a time (the last, 289th, alone through the tail). 20 filters read
    b in place, 140 copy its strips; split over threads by positions; into y and over the
    residual. b (2305 x 289 floats) is more than the GEMM takes whole on any L2."""
    assert packed.block_columns(2305, 289) == 32
    x, weight = randn(1, 2305, 17, 17), randn(filters, 2305, 1, 1) / np.float32(48)
    _matches_into_y_and_over_the_residual(native, monkeypatch, x, weight, {}, "Clip", threads, lanes=False)


def test_a_plan_an_older_omrt_made_runs_a_small_plane_a_block_at_a_time(native):
    """A 7x7 layer of 512 taps copies its 49 columns into one block of 64 per thread (with its
    filters in the lanes it copies at most a panel of columns: blocks of 32); a plan made before
    (a file an older omrt compiled) gives blocks of 32: the kernel fits itself to them and still
    runs on the tile, in two blocks."""
    x, weight, b = randn(1, 512, 7, 7), randn(40, 512, 1, 1) / np.float32(16), randn(40)
    assert _kernel(x, weight, b, {}, native, lanes=True).block == 32
    kernel = _kernel(x, weight, b, {}, native)
    assert kernel.block == 64
    older = kernel.conv_workspace_bytes + parallel.MAX_SLOTS * packed.align(512 * 32 * 4)
    assert kernel.fit_workspace(older) and kernel.workspace() == older and kernel.block == 32
    assert (kernel.native_packed is not None) == _takes_the_tile(kernel, native)
    want = reference("Conv", [x, weight, b], {})[0]
    np.testing.assert_allclose(_run(kernel, x, weight, b), want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))


@pytest.mark.parametrize("threads", [1, 2])
def test_a_chunk_of_one_position_reads_its_column_a_chunk_pitch_apart(native, monkeypatch, threads):
    """A 2x2 layer over a 50x2 plane has 49 output rows of one position each. With the column
    buffer's cap lowered so that this small layer needs chunks (as a deep layer over a tall, thin
    plane would under the real cap), each thread's buffer holds two rows, and the rows are split
    evenly into 25 chunks on one thread, 26 on two (as many for each thread: omrt_whole_rounds),
    so some chunks hold one position: its column lies in a buffer whose rows are two floats apart,
    and each strip of filters streams over it reading every such row."""
    monkeypatch.setattr(window, "WORKSPACE_CAP", 16 * 2 * 2 * 4 * 2 * threads)
    x, weight = randn(1, 16, 50, 2), randn(40, 16, 2, 2) / np.float32(8)
    split = _kernel(x, weight, None, {}, native, lanes=True)._split(threads)
    assert split.step == 2 and split.buffer > 0
    _matches_into_y_and_over_the_residual(native, monkeypatch, x, weight, {}, "Clip", threads, lanes=True)


def _product(a: np.ndarray, b: np.ndarray, bias: np.ndarray | None, attrs: dict, native) -> packed.PackedMatMul:
    strips = packed.pack_strips(b)
    ctx = OpContext(attrs, 1, name="t", op_type="PackedMatMul", native=native)
    infos = [TensorInfo(a.dtype, a.shape), TensorInfo(b.dtype, b.shape),
             None if bias is None else TensorInfo(bias.dtype, bias.shape), TensorInfo(strips.dtype, strips.shape)]
    return packed.PackedMatMul(ctx, infos, packed.PackedMatMul.infer(ctx, infos))


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.integers(1, 5), min_size=0, max_size=2), st.integers(1, 30), st.integers(1, 70),
       st.integers(1, 300), st.sampled_from(sorted(ACTS, key=str)), st.booleans(), st.integers(1, 2))
def test_packed_matmul_matches_reference(native, monkeypatch, batch, rows, depth, cols, act, bias, threads):
    a, b = randn(*batch, rows, depth), randn(depth, cols)
    c = randn(cols) if bias else None
    monkeypatch.setattr(parallel, "NATIVE_SPLIT_FLOPS", 0)
    omrt.set_num_threads(threads)
    try:
        kernel = _product(a, b, c, ACTS[act], native)
        vector_tile = packed.gemm_tile(native) > 0
        assert (kernel.native_packed is not None) == (np.prod(batch, dtype=int) * rows >= packed.MIN_ROWS and vector_tile)
        y = np.full(kernel.outputs[0].shape, np.nan, np.float32)
        kernel.run([a, b, c, packed.pack_strips(b)], [y], np.full(kernel.workspace(), 0xCD, np.uint8))
    finally:
        omrt.set_num_threads(1)
    want = _activated(a.astype(np.float64) @ b + (0 if c is None else c), act)
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4 * max(1.0, float(np.abs(want).max())))


def test_only_float_products_by_a_matrix_with_a_bias_over_columns_are_packed():
    a, b = TensorInfo(np.dtype(np.float32), (2, 7, 8)), randn(8, 5)
    bias = TensorInfo(np.dtype(np.float32), (5,))
    assert packed.product_eligible({}, a, b, None) and packed.product_eligible({"_act": "Relu"}, a, b, bias)
    assert not packed.product_eligible({}, a, b, TensorInfo(np.dtype(np.float32), (7, 5)))
    assert not packed.product_eligible({"_perm_b": [1, 0]}, a, b, None)
    assert not packed.product_eligible({"_act": "Sigmoid"}, a, b, None)
    assert not packed.product_eligible({}, TensorInfo(np.dtype(np.float32), (8,)), b, None)
    assert not packed.product_eligible({}, a, randn(2, 8, 5), None)


def test_a_plan_too_small_for_the_strips_runs_as_a_conv(native):
    x, weight = randn(1, 8, 9, 9), randn(20, 8, 3, 3)
    kernel = _kernel(x, weight, None, {"strides": [2, 2]}, native)
    if packed.gemm_tile(native) == 0:
        pytest.skip("no vector tile on this CPU (or OMRT_GEMM_TILE=c): the layer runs as a Conv anyway")
    assert kernel.native_packed is not None and kernel.workspace() > kernel.conv_workspace_bytes
    assert kernel.fit_workspace(kernel.conv_workspace_bytes) and kernel.native_packed is None
    np.testing.assert_allclose(_run(kernel, x, weight, None), reference("Conv", [x, weight], {"strides": [2, 2]})[0],
                               rtol=1e-4, atol=1e-4)


def _conv_model(f: int, c: int, size: int) -> onnx.ModelProto:
    """A pointwise Conv then a padded 3x3 stride-2 one (both packed), a residual block (a packed
    pointwise Conv whose output is added to its input, then Relu: one PackedConv) and a 3x3
    stride-1 Conv (Winograd), each with bias and Relu, then a product by a matrix with a bias
    (packed): every path that reads weights derived at compile time."""
    rng = np.random.default_rng(3)
    weights = {"w1": rng.standard_normal((f, c, 1, 1)), "w2": rng.standard_normal((f, f, 3, 3)) / 3,
               "w3": rng.standard_normal((f, f, 3, 3)) / 3, "w4": rng.standard_normal((size // 2, 37)) / 3,
               "b4": rng.standard_normal(37), "w5": rng.standard_normal((f, f, 1, 1)) / 3}
    inits = [numpy_helper.from_array(v.astype(np.float32), k) for k, v in weights.items()]
    inits += [numpy_helper.from_array(rng.standard_normal(f).astype(np.float32), f"b{i}") for i in (1, 2, 3, 5)]
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"]), helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1], strides=[2, 2]),
             helper.make_node("Relu", ["c2"], ["r2"]),
             helper.make_node("Conv", ["r2", "w5", "b5"], ["c5"]), helper.make_node("Add", ["r2", "c5"], ["s5"]),
             helper.make_node("Relu", ["s5"], ["r5"]),
             helper.make_node("Conv", ["r5", "w3", "b3"], ["c3"], pads=[1, 1, 1, 1]),
             helper.make_node("MatMul", ["c3", "w4"], ["p"]), helper.make_node("Add", ["p", "b4"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, size, size])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture(scope="module")
def packed_om(tmp_path_factory, native):
    path = str(tmp_path_factory.mktemp("packed") / "convs.om")
    omrt.compile(_conv_model(20, 16, 12), path)
    nodes = omrt.load(path).graph.nodes
    ops = [n.op_type for n in nodes]
    assert ops == ["PackedConv", "PackedConv", "PackedResidualConv", "WinogradConv", "PackedMatMul"], ops
    assert nodes[2].inputs[packed.RESIDUAL] == nodes[1].outputs[0] and nodes[2].attrs["_act"] == "Relu"
    return path


def _scaled_error(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.abs(got - want).max() / np.abs(want).max())


def test_swapped_filters_are_used_not_what_was_packed_from_them(packed_om):
    x = randn(1, 16, 12, 12)
    plain, trusted = omrt.load(packed_om), omrt.load(packed_om, trust_kernels=True)
    session = trusted.session()
    assert _scaled_error(session.run({"x": x})["y"], plain.session().run({"x": x})["y"]) < 1e-5
    check = plain.session()
    for name in ("w1", "w2", "w3", "w4", "w5"):
        new = randn(*plain.graph.constants[name].shape) / 3
        session.set_weight(name, new)
        check.set_weight(name, new)
        assert _scaled_error(session.run({"x": x})["y"], check.run({"x": x})["y"]) < 1e-5, name


TILE_CHECK = """
import copy
import numpy as np, omrt
from omrt.kernels import OpContext, TensorInfo, packed
rng = np.random.default_rng(0)
x = rng.standard_normal((1, 16, 12, 12)).astype(np.float32)
trusted = omrt.load({path!r}, trust_kernels=True)
got = trusted.session().run({{"x": x}})["y"]
want = omrt.load({path!r}).session().run({{"x": x}})["y"]
model_error = float(np.abs(got - want).max() / np.abs(want).max())

# layers where numpy has no CBLAS: the tile runs even where BLAS would be faster. A 3x3 layer of
# stride 2 with its filters in panels, then in the lanes (40 filters: a whole strip and part of
# one; 36 positions: 3 panels, or 32 columns and the last 4 through the tail), a 1x1 layer over
# a 7x7 plane (the 49th position through the tail; with AVX2 the plane copied whole first), and
# one of 140 filters over 13x13 (with AVX2 copied whole, too many filters to read it in place),
# and one of 2305 taps over 17x17 (with AVX2 or C in passes of fewer steps)
library = copy.copy(trusted.native)
library.blas = False
w, b = rng.standard_normal((140, 16, 3, 3)).astype(np.float32), rng.standard_normal(140).astype(np.float32)
x7, x13 = (rng.standard_normal((1, 16, h, h)).astype(np.float32) for h in (7, 13))
x17 = rng.standard_normal((1, 2305, 17, 17)).astype(np.float32)
w17 = rng.standard_normal((24, 2305, 1, 1)).astype(np.float32)
layer_error = 0.0
for x_in, w_in, attrs, plane in ((x, w[:40], {{"pads": [1, 1, 1, 1], "strides": [2, 2]}}, (6, 6)),
                                 (x7, w[:40, :, 1:2, 1:2].copy(), {{}}, (7, 7)),
                                 (x13, w[:, :, 1:2, 1:2].copy(), {{}}, (13, 13)),
                                 (x17, w17, {{}}, (17, 17))):
    b_in = b[:w_in.shape[0]]
    ref = np.empty((1, w_in.shape[0]) + plane, np.float32)
    omrt.run_op("Conv", [x_in, w_in, b_in], [ref], **attrs)
    for lanes, packing in ((0, packed.pack_panels(w_in)), (1, packed.pack_filter_strips(w_in))):
        infos = [TensorInfo(x_in.dtype, x_in.shape), TensorInfo(w_in.dtype, w_in.shape),
                 TensorInfo(b_in.dtype, b_in.shape), TensorInfo(w_in.dtype, packing.shape)]
        ctx = OpContext({{**attrs, "lanes": lanes}}, 1, name="t", op_type="PackedConv", native=library)
        kernel = packed.PackedConv(ctx, infos, packed.PackedConv.infer(ctx, infos))
        assert kernel.native_packed is not None
        y = np.full(kernel.outputs[0].shape, np.nan, np.float32)
        kernel.run([x_in, w_in, b_in, packing], [y], np.zeros(kernel.workspace(), np.uint8))
        layer_error = max(layer_error, float(np.abs(y - ref).max() / np.abs(ref).max()))
print(packed.gemm_tile(trusted.native), model_error, layer_error)
"""


@pytest.mark.parametrize("tile", ["c", "avx2", None])
def test_every_tile_a_cpu_may_pick_computes_the_same(packed_om, tile):
    env = {k: v for k, v in os.environ.items() if k != "OMRT_GEMM_TILE"}
    if tile:
        env["OMRT_GEMM_TILE"] = tile
    done = subprocess.run([sys.executable, "-c", TILE_CHECK.format(path=packed_om)], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    level, model_error, layer_error = done.stdout.split()
    assert GEMM_TILES[int(level)]
    if tile == "c":
        assert int(level) == 0
    elif tile == "avx2":
        assert int(level) <= 1
    assert float(model_error) < 1e-5 and float(layer_error) < 1e-5


@pytest.mark.parametrize("trust", [True, False])
def test_a_weight_budget_holds_only_the_form_of_each_weight_that_is_read(packed_om, trust):
    model = omrt.load(packed_om, trust_kernels=trust, weight_budget=1 << 20)
    plan = model.default.stream
    held = set(plan.resident) | {f.key for f in plan.fills}
    forms = {"w1": "w1__panels", "w2": "w2__panels", "w3": "w3__winograd2", "w4": "w4__strips"}
    vector_tile = trust and packed.gemm_tile(model.native) > 0  # else BLAS multiplies (OMRT_GEMM_TILE=c)
    read = {k: v if vector_tile else k for k, v in forms.items()}
    assert held & (set(forms) | set(forms.values())) == set(read.values())
    x = randn(1, 16, 12, 12)
    want = omrt.load(packed_om).session().run({"x": x})["y"]
    assert _scaled_error(model.session().run({"x": x})["y"], want) < 1e-5


def test_a_bias_fed_as_a_strided_view_takes_the_blas_path(native):
    a, b, wide = randn(16, 8), randn(8, 5), randn(10)
    kernel = _product(a, b, wide[::2], {}, native)
    y = np.full(kernel.outputs[0].shape, np.nan, np.float32)
    kernel.run([a, b, wide[::2], packed.pack_strips(b)], [y], np.zeros(kernel.workspace(), np.uint8))
    np.testing.assert_allclose(y, a.astype(np.float64) @ b + wide[::2], rtol=1e-5, atol=1e-5)


def _residual_model(case: str) -> onnx.ModelProto:
    """x -> packed pointwise Conv (c) -> Add(c, other) -> activation; `case` breaks one condition
    of fusing the Add into the Conv, or none ("fused")."""
    rng = np.random.default_rng(5)
    inits = [numpy_helper.from_array((rng.standard_normal((8, 8, 1, 1)) / 3).astype(np.float32), "w"),
             numpy_helper.from_array(rng.standard_normal((1, 8, 1, 1)).astype(np.float32), "row")]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"])]
    conv, other, act = "c", "x", "Relu"
    if case == "activated conv":
        nodes.append(helper.make_node("Relu", ["c"], ["rc"]))
        conv = "rc"
    if case == "broadcast":
        other = "row"
    if case == "sigmoid":
        act = "Sigmoid"
    nodes += [helper.make_node("Add", [other, conv], ["s"]), helper.make_node(act, ["s"], ["y"])]
    outputs = ["y"] + (["c"] if case == "conv read twice" else [])
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 6, 6])],
                              [helper.make_tensor_value_info(v, TensorProto.FLOAT, None) for v in outputs], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("case", ["fused", "activated conv", "broadcast", "sigmoid", "conv read twice"])
def test_an_add_of_a_packed_convs_output_folds_into_it_only_when_it_may(native, tmp_path, case):
    from onnx.reference import ReferenceEvaluator

    model = _residual_model(case)
    omrt.compile(model, str(tmp_path / "m.om"))
    loaded = omrt.load(str(tmp_path / "m.om"), trust_kernels=True)
    nodes = loaded.graph.nodes
    fused = [n for n in nodes if n.op_type == "PackedResidualConv" and len(n.inputs) > packed.RESIDUAL]
    assert (len(fused) == len(nodes) == 1) == (case == "fused"), [n.op_type for n in nodes]
    x = randn(1, 8, 6, 6)
    want = ReferenceEvaluator(model).run(None, {"x": x})
    for got, ref in zip(loaded.session().run({"x": x}).values(), want):
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4 * max(1.0, float(np.abs(ref).max())))


@pytest.mark.parametrize("trusted", [True, False])
def test_a_residual_convs_output_is_planned_over_the_residual_it_ends(native, tmp_path, trusted):
    """A residual block: r = Relu(x) is read by the block's first Conv and by the Add folded into its
    last, where r dies, so the last Conv's output takes r's buffer and the tile reads each residual
    element just before it writes over it; without the library the Conv paths run over a copy of r.
    The plan verifies, the values match the reference, and the step's output is its residual."""
    from onnx.reference import ReferenceEvaluator

    from omrt.plan import verify

    rng = np.random.default_rng(7)
    ws = [numpy_helper.from_array((rng.standard_normal((16, 16, k, k)) / (4 * k)).astype(np.float32), f"w{i}")
          for i, k in enumerate((3, 1, 1))]
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("Conv", ["r", "w0"], ["a"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["a"], ["ra"]),
             helper.make_node("Conv", ["ra", "w1"], ["b"]),
             helper.make_node("Add", ["b", "r"], ["s"]), helper.make_node("Relu", ["s"], ["y"]),
             helper.make_node("Conv", ["y", "w2"], ["z"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 7, 7])],
                              [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)], ws)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    omrt.compile(model, str(tmp_path / "m.om"))
    loaded = omrt.load(str(tmp_path / "m.om"), trust_kernels=trusted)
    program = loaded.default.program
    verify(program, loaded.default.graph)
    fused = next(n for n in loaded.graph.nodes if n.op_type == "PackedResidualConv")
    residual, out = fused.inputs[packed.RESIDUAL], fused.outputs[0]
    assert program.places[out] == program.places[residual]
    sess = loaded.session()
    x = randn(1, 16, 7, 7)
    got = sess.run({"x": x})["z"]
    want = ReferenceEvaluator(model).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * max(1.0, float(np.abs(want).max())))
    step = next(s for s in sess._executor.instructions if s.node.op_type == "PackedResidualConv")
    assert step.outputs[0].__array_interface__["data"] == step.inputs[packed.RESIDUAL].__array_interface__["data"]
    assert (step.kernel.native_packed is not None) == (trusted and packed.gemm_tile(native) > 0)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.integers(2, 4), st.integers(1, 12), st.integers(packed.MIN_GROUP_FILTERS, 30), st.integers(4, 20),
       st.sampled_from([1, 3]), st.integers(1, 2), st.booleans(), st.integers(1, 2), st.booleans(),
       st.sampled_from(sorted(ACTS, key=str)), st.booleans())
def test_grouped_and_shuffled_packed_convs_match_reference(native, monkeypatch, group, per_group, filters, size, k,
                                                           stride, shuffled, threads, bias, act, lanes):
    """Each group's panels (or strips, filters in the lanes) multiply its own channels (1x1 layers
    read them in place, others gather them) and, shuffled as ShuffleNet does, write filter f of
    group g to channel f * group + g."""
    x, weight = randn(1, group * per_group, size, size), randn(group * filters, per_group, k, k)
    b = randn(group * filters) if bias else None
    attrs = {"group": group, "pads": [k // 2] * 4, "strides": [stride, stride]}
    want = reference("Conv", [x, weight] + ([b] if bias else []), attrs)[0]
    if shuffled:
        n, m, h, w = want.shape
        want = want.reshape(n, group, m // group, h, w).transpose(0, 2, 1, 3, 4).reshape(want.shape)
    monkeypatch.setattr(parallel, "NATIVE_SPLIT_FLOPS", 0)
    omrt.set_num_threads(threads)
    try:
        kernel = _kernel(x, weight, b, {**attrs, **ACTS[act]}, native, shuffled=shuffled, lanes=lanes)
        assert (kernel.native_packed is not None) == _takes_the_tile(kernel, native)
        y = _run(kernel, x, weight, b)
    finally:
        omrt.set_num_threads(1)
    want = _activated(want, act)
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4 * max(1.0, float(np.abs(want).max())))


@pytest.mark.parametrize("trusted", [True, False])
def test_a_shuffled_conv_with_groups_of_panels_compiles_packed_and_runs_as_itself_untrusted(native, tmp_path, trusted):
    from test_compiler import shuffle_model

    model = shuffle_model(2, 2, [0, 2, 1, 3, 4], channels=24)  # groups of 12 filters, 25 positions
    path = str(tmp_path / "s.om")
    res = omrt.compile(model, path, autofuse=False)
    assert [n.op_type for n in res.graph.nodes] == ["PackedShuffledConv", "Exp"]
    x = randn(1, 24, 5, 5)
    loaded = omrt.load(path, trust_kernels=trusted)
    got = loaded.session().run({"x": x})["y"]
    if trusted:  # the tile, or without a vector tile (OMRT_GEMM_TILE=c) the Conv's own native loop
        tile = packed.gemm_tile(loaded.native) > 0
        assert loaded.native.calls().get("omrt_pconv2d_f32" if tile else "omrt_conv2d_f32", 0) > 0
    else:
        assert loaded.native is None
    (want,) = ReferenceEvaluator(model).run(None, {"x": x})
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.integers(2, 3), st.integers(1, 40), st.integers(1, 50), st.integers(1, 3),
       st.sampled_from(sorted(ACTS, key=str)), st.booleans(), st.integers(1, 2))
def test_stacked_products_match_each_product_alone(native, monkeypatch, parts, rows, depth, strips, act, bias,
                                                   threads):
    """PackedMatMul with parts: B's column blocks side by side, part g of the output A @ block g
    (+ its bias, then the activation), on the tile or, with few rows, through one batched product."""
    a, b = randn(rows, depth), randn(depth, parts * strips * packed.STRIP)
    c = randn(b.shape[1]) if bias else None
    monkeypatch.setattr(parallel, "NATIVE_SPLIT_FLOPS", 0)
    omrt.set_num_threads(threads)
    try:
        kernel = _product(a, b, c, {**ACTS[act], "parts": parts}, native)
        assert kernel.outputs[0].shape == (parts, rows, strips * packed.STRIP)
        y = np.full(kernel.outputs[0].shape, np.nan, np.float32)
        kernel.run([a, b, c, packed.pack_strips(b)], [y], np.full(kernel.workspace(), 0xCD, np.uint8))
    finally:
        omrt.set_num_threads(1)
    want = _activated(a.astype(np.float64) @ b + (0 if c is None else c), act)
    want = want.reshape(rows, parts, -1).transpose(1, 0, 2)
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4 * max(1.0, float(np.abs(want).max())))


def _attention_inputs_model(width: int, graph_output: bool) -> onnx.ModelProto:
    """x -> three projections (MatMul + Add) -> q * k + v; with `graph_output`, k is an output too."""
    rng = np.random.default_rng(3)
    weights = [numpy_helper.from_array((rng.standard_normal((width, width)) / width ** 0.5).astype(np.float32), n)
               for n in ("wq", "wk", "wv")]
    biases = [numpy_helper.from_array(rng.standard_normal(width).astype(np.float32), n) for n in ("bq", "bk", "bv")]
    nodes = [node for p in "qkv" for node in (helper.make_node("MatMul", ["x", f"w{p}"], [f"{p}0"]),
                                              helper.make_node("Add", [f"{p}0", f"b{p}"], [p]))]
    nodes += [helper.make_node("Mul", ["q", "k"], ["qk"]), helper.make_node("Add", ["qk", "v"], ["y"])]
    outputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("y", "k")[:1 + graph_output]]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 24, width])],
                              outputs, weights + biases)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("graph_output", [False, True])
@pytest.mark.parametrize("trusted", [True, False])
def test_sibling_projections_compile_to_one_product_whose_parts_are_read_in_place(native, tmp_path, trusted,
                                                                                   graph_output):
    """Q, K and V of one x become one stacked PackedMatMul and three Parts, planned as its slices:
    each part's array is the product's own memory at its offset (no copy), with or without the
    tile; a part that is a graph output is copied out (the caller's buffer holds it alone)."""
    from omrt.plan import verify

    model = _attention_inputs_model(64, graph_output)
    path = str(tmp_path / "m.om")
    res = omrt.compile(model, path, autofuse=False)
    ops = [n.op_type for n in res.graph.nodes]
    assert ops[:4] == ["PackedMatMul", "Part", "Part", "Part"] and ops.count("PackedMatMul") == 1
    assert res.graph.nodes[0].attrs["parts"] == 3
    loaded = omrt.load(path, trust_kernels=trusted)
    program = loaded.default.program
    verify(program, loaded.default.graph)
    stacked = res.graph.nodes[0].outputs[0]
    for g, value in enumerate("qkv"):
        assert program.places[value].offset == program.places[stacked].offset + g * 24 * 64 * 4
    assert ("k" in program.copy_only) == graph_output
    sess = loaded.session()
    x = randn(1, 24, 64)
    got = sess.run({"x": x})
    want = ReferenceEvaluator(model).run(None, {"x": x})
    for name, ref in zip(["y", "k"], want):
        np.testing.assert_allclose(got[name], ref, rtol=1e-4, atol=1e-4 * max(1.0, float(np.abs(ref).max())))
    step = next(s for s in sess._executor.instructions if s.node.op_type == "Mul")
    product = next(s for s in sess._executor.instructions if s.node.op_type == "PackedMatMul")
    assert all(np.shares_memory(v, product.outputs[0]) for v in step.inputs)
    if not graph_output:
        assert sess.stats.bytes_copied == 0
    if trusted and packed.gemm_tile(native) > 0:
        assert loaded.native.calls().get("omrt_pmatmul_f32", 0) > 0
