"""The native C loops (native/csrc) against the numpy paths of the same kernels (themselves checked
against onnx.reference in the family tests), over many window geometries."""

from __future__ import annotations

import copy
import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from kernel_check import check, randn, reference, run_kernel
import omrt
from omrt.kernels import OpContext, TensorInfo, elementwise, lookup, packed, winograd
from omrt.kernels import conv as conv_module
from omrt.kernels import parallel, pool
from omrt.kernels import window as window_module

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def _activated(y: np.ndarray, act: str | None) -> np.ndarray:
    if act == "Relu":
        return np.maximum(y, 0)
    if act == "Clip":
        return np.clip(y, -0.5, 0.5)
    if act == "LeakyRelu":
        return np.where(y < 0, y * 0.1, y)
    if act == "HardSigmoid":
        return np.clip(y * np.float32(0.2) + np.float32(0.5), 0, 1)
    return y


ACTS = {None: {}, "Relu": {"_act": "Relu"}, "Clip": {"_act": "Clip", "_act_alpha": -0.5, "_act_beta": 0.5},
        "LeakyRelu": {"_act": "LeakyRelu", "_act_alpha": 0.1},
        "HardSigmoid": {"_act": "HardSigmoid", "_act_alpha": 0.2, "_act_beta": 0.5}}


@pytest.fixture(scope="module")
def native_without_blas(native):
    """The same library as handed over when numpy's BLAS has no CBLAS sgemm to call."""
    library = copy.copy(native)
    library.blas = False
    return library


@pytest.fixture
def threads(request):
    """Run at request.param threads, splitting even the tiny layers of these tests."""
    omrt.set_num_threads(request.param)
    patch = pytest.MonkeyPatch()
    patch.setattr(parallel, "NATIVE_SPLIT_FLOPS", 0)
    patch.setattr(parallel, "NATIVE_SPLIT_BYTES", 0)
    yield request.param
    patch.undo()
    omrt.set_num_threads(1)


def agree(op_type: str, inputs: list, attrs: dict, native) -> np.ndarray:
    """The native path's output, asserted equal (to rounding) to the numpy path's."""
    return agree_domain(op_type, inputs, attrs, native, "")


def agree_domain(op_type: str, inputs: list, attrs: dict, native, domain: str) -> np.ndarray:
    """agree() for an op of `domain` (opset 1 of omrt's own ops)."""
    opset = 1 if domain else 21
    got = run_kernel(op_type, inputs, attrs, opset, native=native, n_outputs=1, domain=domain)[0]
    want = run_kernel(op_type, inputs, attrs, opset, n_outputs=1, domain=domain)[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=f"{op_type} {attrs}")
    return got


def _kernel(op_type: str, x: np.ndarray, w: np.ndarray | None, attrs: dict, native):
    """The kernel built for these inputs."""
    ctx = OpContext(dict(attrs), 21, name="t", op_type=op_type, native=native)
    infos = [TensorInfo(a.dtype, a.shape) for a in ([x] if w is None else [x, w])]
    cls = lookup(op_type, 21)
    return cls(ctx, infos, cls.infer(ctx, infos))


def _uses_native(op_type: str, x: np.ndarray, w: np.ndarray | None, attrs: dict, native) -> bool:
    """Whether the kernel built for these inputs takes its native path."""
    kernel = _kernel(op_type, x, w, attrs, native)
    return (kernel.native_pool if op_type != "Conv" else kernel.native_depthwise) is not None


@st.composite
def windows(draw, max_kernel: int = 4, max_size: int = 12):
    kh, kw = draw(st.integers(1, max_kernel)), draw(st.integers(1, max_kernel))
    sh, sw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    pads = [draw(st.integers(0, k - 1)) for k in (kh, kw, kh, kw)]
    h = draw(st.integers(kh, max_size))
    w = draw(st.integers(kw, max_size))
    return {"kernel_shape": [kh, kw], "strides": [sh, sw], "pads": pads}, (h, w)


BANDS = [pool.BAND_FLOATS, 160, 64, 0]
"""Scratch the native pools get: the default (whole small planes), bands of a few output rows,
and too little for one (the row path)."""


@pytest.fixture(params=["register", "lanes", "planes"],
                ids=["a row in a register", "16 planes at a time", "plane by plane"])
def lanes(request, monkeypatch):
    """Narrow planes (all of these tests', at most 12 wide) asked to pool each row in one register
    (taken on AVX-512 CPUs; 16 planes at a time on AVX2 ones) or 16 planes at a time (on either),
    or plane by plane: whether the pool is asked for 16 planes at a time (which the register path
    also says, and takes first)."""
    if request.param != "register":
        monkeypatch.setattr(pool, "REGISTER_ROW", 0)
    if request.param == "planes":
        monkeypatch.setattr(pool, "NARROW_ROW", 0)
    return request.param != "planes"


@pytest.mark.parametrize("threads", [1, 2], indirect=True)
@pytest.mark.parametrize("band_floats", BANDS)
@SETTINGS
@given(windows(), st.booleans(), st.sampled_from([1, 3, 20]), st.integers(1, 2))
def test_max_pool_matches_reference(native, threads, lanes, band_floats, window, ceil_mode, planes, dilation):
    """20 planes make a full block of 16 and a partial one."""
    attrs, (h, w) = window
    attrs = {**attrs, "ceil_mode": int(ceil_mode), "dilations": [dilation, 1]}
    x = randn(1, planes, h + attrs["kernel_shape"][0] * (dilation - 1), w)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(pool, "BAND_FLOATS", band_floats)
        assert _uses_native("MaxPool", x, None, attrs, native)
        assert _kernel("MaxPool", x, None, attrs, native).lanes == lanes
        agree("MaxPool", [x], attrs, native)


@pytest.mark.parametrize("threads", [1, 2], indirect=True)
@pytest.mark.parametrize("band_floats", BANDS)
@SETTINGS
@given(windows(), st.booleans(), st.booleans(), st.sampled_from([3, 20]))
def test_average_pool_matches_reference(native, threads, lanes, band_floats, window, ceil_mode, include_pad,
                                        channels):
    attrs, (h, w) = window
    attrs = {**attrs, "ceil_mode": int(ceil_mode), "count_include_pad": int(include_pad)}
    x = randn(2, channels, h, w)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(pool, "BAND_FLOATS", band_floats)
        assert _kernel("AveragePool", x, None, attrs, native).lanes == lanes
        agree("AveragePool", [x], attrs, native)


def test_pools_match_reference(native):
    x = randn(1, 4, 13, 11)
    for op in ("MaxPool", "AveragePool"):
        for attrs in ({"kernel_shape": [3, 3], "strides": [2, 2]},
                      {"kernel_shape": [3, 2], "strides": [1, 2], "pads": [1, 0, 1, 1]},
                      {"kernel_shape": [2, 2], "strides": [2, 2], "dilations": [2, 1]}):
            if op == "AveragePool" and "dilations" in attrs:
                continue
            check(op, [x], attrs, native=native)


@pytest.mark.parametrize("band_floats", BANDS)
@pytest.mark.parametrize("stride, nans", [(2, [(1, 1), (1, 2)]),
                                          (1, [(r, c) for r in (1, 2, 3) for c in (2, 3, 4)])])
def test_max_pool_propagates_nan_like_numpy(native, lanes, band_floats, stride, nans, monkeypatch):
    monkeypatch.setattr(pool, "BAND_FLOATS", band_floats)
    x = randn(1, 2, 6, 6)
    x[0, 0, 2, 3] = np.nan
    attrs = {"kernel_shape": [3, 3], "strides": [stride, stride], "pads": [1, 1, 1, 1]}
    got = agree("MaxPool", [x], attrs, native)
    assert all(np.isnan(got[0, 0, r, c]) for r, c in nans) and np.isnan(got).sum() == len(nans)


@pytest.mark.parametrize("threads", [1, 2], indirect=True)
@pytest.mark.parametrize("op", ["MaxPool", "AveragePool"])
@pytest.mark.parametrize("width, window, stride, pads", [
    (16, 3, 1, [1, 1, 1, 1]), (16, 3, 2, [0, 0, 1, 1]), (15, 5, 1, [2, 2, 2, 2]), (16, 16, 1, [0, 0, 0, 0]),
    (14, 2, 2, [0, 0, 0, 0]), (17, 3, 1, [1, 1, 1, 1])])
def test_pools_over_planes_of_up_to_16_columns_take_a_register_per_row(native, threads, op, width, window, stride,
                                                                        pads):
    """The register path's edges: rows of 16 columns and 16 outputs (all lanes), a window as wide
    as the row, padding on both sides, stride 2, 3x3 and other windows (its unrolled and generic
    loops); 17 columns do not fit and go another way. A NaN wins every max window it falls in."""
    x = randn(1, 20, 9, width)
    x[0, 3, 4, 5] = np.nan
    attrs = {"kernel_shape": [3, window], "strides": [stride, stride], "pads": pads}
    kernel = _kernel(op, x, None, attrs, native)
    assert (kernel._path(op == "MaxPool") == 3) is (width <= pool.REGISTER_ROW)
    got = agree(op, [x], attrs, native)
    assert np.isnan(got[0, 3]).any() and not np.isnan(np.delete(got, 3, axis=1)).any()


@pytest.mark.parametrize("band_floats", BANDS)
@pytest.mark.parametrize("column", [0, 17, 104, 110])
def test_wide_max_pools_keep_each_nan_and_take_infinities_as_values(native, band_floats, column, monkeypatch):
    """Rows of 111 (the row path's vectors, then its tail of 7), a NaN at `column` of one plane,
    rows of +inf and -inf in another (an infinity is no NaN: nothing is rescanned for it)."""
    monkeypatch.setattr(pool, "BAND_FLOATS", band_floats)
    x = randn(1, 3, 9, 111)
    x[0, 1, 4, column] = -np.nan
    x[0, 2, 3] = np.inf
    x[0, 2, 6, ::2] = -np.inf
    got = agree("MaxPool", [x], {"kernel_shape": [3, 3], "strides": [2, 2]}, native)
    windows = [c for c in range(55) if 2 * c <= column <= 2 * c + 2]
    assert {(r, c) for r, c in zip(*np.nonzero(np.isnan(got[0, 1])))} == {(r, c) for r in (1, 2) for c in windows}
    assert not np.isnan(got[0, [0, 2]]).any() and (got[0, 2, 1] == np.inf).all()


@pytest.mark.parametrize("threads", [1, 2], indirect=True)
@SETTINGS
@given(st.integers(16, 130), st.sampled_from([1, 2]), st.sampled_from([(1, 1), (2, 1), (3, 1), (2, 2)]),
       st.integers(1, 4), st.integers(1, 3), st.integers(1, 2), st.data())
def test_wide_max_pools_match_reference(native, threads, width, sw, across, kh, sh, dh, data):
    """Rows 16 to 130 wide at stride 2 along them, from VECTOR_ROW_WIDTH on the vector path on
    AVX2 and AVX-512 CPUs (both widths: test_wide_max_pools_agree_at_every_vector_width), and at
    stride 1, from VECTOR_ROW_WIDTH_STRIDE_1 on it (whole vectors of column maxima, a last one
    filled out with -inf, the left padding read as -inf): the values, the NaNs a few windows read
    and the infinities others hold, as numpy's."""
    kw, dw = across
    pads = [data.draw(st.integers(0, k - 1)) for k in (kh, kw, kh, kw)]
    x = randn(1, 3, data.draw(st.integers((kh - 1) * dh + 1, 9)), width)
    spots = st.tuples(st.integers(0, 2), st.integers(0, x.shape[2] - 1), st.integers(0, width - 1))
    for value in (np.nan, np.inf, -np.inf):
        for plane, row, column in data.draw(st.lists(spots, max_size=2)):
            x[0, plane, row, column] = value
    attrs = {"kernel_shape": [kh, kw], "strides": [sh, sw], "pads": pads, "dilations": [dh, dw],
             "ceil_mode": int(data.draw(st.booleans()))}
    kernel = _kernel("MaxPool", x, None, attrs, native)
    assert kernel.native_pool is not None
    least = pool.VECTOR_ROW_WIDTH if sw == 2 else pool.VECTOR_ROW_WIDTH_STRIDE_1
    assert kernel.vector_rows == (width >= least)
    agree("MaxPool", [x], attrs, native)


@pytest.mark.parametrize("threads", [1, 2], indirect=True)
@pytest.mark.parametrize("width", [2 * 1024, 8 * 1024 + 5])
@pytest.mark.parametrize("sw", [1, 2])
def test_rows_wider_than_the_vector_paths_buffer_pool_by_the_row_path(native, threads, width, sw):
    """The C loop keeps a row's column maxima on its stack, for up to 1024 outputs (csrc/pool.c,
    VECTOR_MAX_OUT): rows of 2046, 4098 and 8195 outputs asked for the vector path take the row
    path instead (past the buffer's end they would write the stack), and their values agree, as
    those of the row of 1023, under the limit, on the vector path."""
    x = randn(1, 2, 5, width)
    x[0, 1, 2, width - 3] = np.nan
    attrs = {"kernel_shape": [3, 3], "strides": [1, sw]}
    assert _kernel("MaxPool", x, None, attrs, native).vector_rows
    agree("MaxPool", [x], attrs, native)


@pytest.mark.parametrize("threads", [1, 2], indirect=True)
@pytest.mark.parametrize("band_bytes", [conv_module.DEPTHWISE_BAND_BYTES, 2048])
@SETTINGS
@given(windows(5, 40), st.integers(1, 2), st.sampled_from([None, "Relu", "Clip", "LeakyRelu", "HardSigmoid"]),
       st.integers(1, 2), st.booleans(), st.sampled_from([3, 20]))
def test_depthwise_conv_matches_numpy_path(native, threads, band_bytes, window, dilation, act, mult, bias, channels):
    """Layers go 16 channels at a time, 20 channels making a full block and a partial one (with
    AVX2; without, wide planes, of 16 output columns or more, go plane by plane split into stride
    phases: see test_depthwise_layers_agree_at_every_vector_width). Both go in bands of output
    rows: whole planes, or (with little scratch) a few rows."""
    attrs, (h, w) = window
    kh, kw = attrs["kernel_shape"]
    if (kh - 1) * dilation + 1 > h + attrs["pads"][0] + attrs["pads"][2] or \
            (kw - 1) * dilation + 1 > w + attrs["pads"][1] + attrs["pads"][3]:
        return
    attrs = {**attrs, "dilations": [dilation, dilation], "group": channels}
    x = randn(2, channels, h, w)
    weight = randn(channels * mult, 1, kh, kw)
    inputs = [x, weight] + ([randn(channels * mult)] if bias else [])
    fused = {} if act is None else {"_act": act, "_act_alpha": -0.5 if act == "Clip" else 0.1,
                                    "_act_beta": 0.5 if act == "Clip" else 0.0}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(conv_module, "DEPTHWISE_BAND_BYTES", band_bytes)
        assert _uses_native("Conv", x, weight, {**attrs, **fused}, native)
        agree("Conv", inputs, {**attrs, **fused}, native)


DEPTHWISE_LAYERS = [(30, 3, 1, 1), (30, 3, 2, 1), (30, 5, 2, 1), (30, 3, 1, 2), (30, 2, 1, 1), (30, 7, 1, 1),
                    (16, 5, 1, 1), (16, 3, 2, 1), (9, 5, 1, 1), (9, 7, 1, 1), (9, 3, 2, 2), (40, 2, 5, 1)]
"""(input size, taps across, stride, dilation) of the depthwise layers checked at every vector
width: wide planes (16 or more output columns) and narrow ones, the windows the loop has
unrolled (3, 5 and 7 taps at stride 1 or 2; a 7-wide output row) and others (2 taps at stride 5:
8 output columns, the group size of the unrolled loops); 49 taps are more than the
plane-by-plane path spreads over vectors at once."""


@pytest.fixture(scope="module")
def depthwise_om(tmp_path_factory, native):
    nodes, inputs, outputs, weights = [], [], [], []
    for i, (size, k, stride, dilation) in enumerate(DEPTHWISE_LAYERS):
        inputs.append(helper.make_tensor_value_info(f"x{i}", TensorProto.FLOAT, [1, 20, size, size]))
        outputs.append(helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, None))
        weights += [numpy_helper.from_array(randn(20, 1, k, k), f"w{i}"), numpy_helper.from_array(randn(20), f"b{i}")]
        pad = (k - 1) * dilation // 2
        nodes.append(helper.make_node("Conv", [f"x{i}", f"w{i}", f"b{i}"], [f"y{i}"], group=20, strides=[stride] * 2,
                                      dilations=[dilation] * 2, pads=[pad] * 4))
    model = helper.make_model(helper.make_graph(nodes, "depthwise", inputs, outputs, weights),
                              opset_imports=[helper.make_opsetid("", 17)])
    path = str(tmp_path_factory.mktemp("depthwise") / "depthwise.om")
    omrt.compile(model, path)
    return path


WIDTH_CHECK = """
import numpy as np, omrt
rng = np.random.default_rng(0)
trusted, plain = omrt.load({path!r}, trust_kernels=True), omrt.load({path!r})
feeds = {{i.name: rng.standard_normal(i.shape).astype(np.float32) for i in plain.inputs}}
got, want = trusted.session().run(feeds), plain.session().run(feeds)
print(max(float(np.abs(got[k] - want[k]).max() / np.abs(want[k]).max()) for k in want))
"""


def _capped(script: str, tile: str | None) -> str:
    """The output of `script` run in a process of its own with the native loops' ISA capped at
    `tile` (OMRT_GEMM_TILE: "c", "avx2"; None: the CPU's own)."""
    env = {k: v for k, v in os.environ.items() if k != "OMRT_GEMM_TILE"}
    if tile:
        env["OMRT_GEMM_TILE"] = tile
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


@pytest.mark.parametrize("tile", ["c", "avx2", None])
def test_depthwise_layers_agree_at_every_vector_width(depthwise_om, tile):
    """The loop picks its copies, path and vector width by the CPU (16 channels interleaved
    through 16 x 16 transposes into 16-float vectors with AVX-512, through 8 x 8 ones into
    8-float vectors with AVX2; without either, element by element and wide planes plane by
    plane): OMRT_GEMM_TILE caps what it sees, in a process of its own."""
    assert float(_capped(WIDTH_CHECK.format(path=depthwise_om), tile)) < 1e-5


WIDE_POOLS = [(111, 3, 2, 0), (112, 3, 2, 1), (27, 2, 2, 0), (40, 3, 2, 1), (85, 3, 1, 1), (20, 3, 2, 1)]
"""(input size, window, stride, pad) of the max pools checked at every vector width: rows the
vector path takes (3- and 2-wide windows at stride 2, from VECTOR_ROW_WIDTH on, and at stride 1
from VECTOR_ROW_WIDTH_STRIDE_1), padded and not, ragged ends of 8- and 16-float vectors."""

NARROW_POOLS = [("MaxPool", 14, 3, 1, 1), ("MaxPool", 14, 3, 2, 0), ("MaxPool", 7, 3, 1, 1), ("MaxPool", 13, 3, 2, 0),
                ("AveragePool", 14, 3, 1, 1), ("AveragePool", 7, 3, 1, 1), ("AveragePool", 28, 2, 2, 0),
                ("AveragePool", 9, 5, 1, 2)]
"""(op, input size, window, stride, pad) of the pools over narrow planes (20 of them: a block of 16
and a partial one) checked at every vector width: 16 planes at a time with AVX2 (and with AVX-512
where the rows do not fit a register), 3x3 windows at stride 1 and 2 (their loops with the window
constant) and others, padded and not."""

POOL_CHECK = """
import numpy as np, omrt
rng = np.random.default_rng(1)
trusted, plain = omrt.load({path!r}, trust_kernels=True), omrt.load({path!r})
feeds = {{i.name: rng.standard_normal(i.shape).astype(np.float32) for i in plain.inputs}}
for x in feeds.values():
    x[0, 1, 2, 5], x[0, 2, 4, -1], x[0, 3, 0, 0] = np.nan, np.inf, -np.nan
got, want = trusted.session().run(feeds), plain.session().run(feeds)
for k in want:
    if k in {exact!r}:
        np.testing.assert_array_equal(got[k], want[k])
    else:  # averages of standard normals, sums of up to 25 of them in another order
        np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-5)
print(sum(int(np.isnan(v).sum()) for v in got.values()))
"""


def _compile_pools(path: str, pools: list[tuple[str, int, int, int, int]], rows: int | None, planes: int) -> None:
    """A model of the pools (op, input size, window, stride, pad) over `planes` planes of `rows`
    rows (None: square), compiled at `path`; pool i reads x{i} and writes y{i}."""
    nodes, inputs, outputs = [], [], []
    for i, (op, size, k, stride, pad) in enumerate(pools):
        inputs.append(helper.make_tensor_value_info(f"x{i}", TensorProto.FLOAT, [1, planes, rows or size, size]))
        outputs.append(helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, None))
        nodes.append(helper.make_node(op, [f"x{i}"], [f"y{i}"], kernel_shape=[k, k], strides=[stride] * 2,
                                      pads=[pad] * 4))
    model = helper.make_model(helper.make_graph(nodes, "pools", inputs, outputs),
                              opset_imports=[helper.make_opsetid("", 17)])
    omrt.compile(model, path)


@pytest.mark.parametrize("tile", ["c", "avx2", None])
@pytest.mark.parametrize("wide", [True, False], ids=["wide", "narrow"])
def test_pools_agree_at_every_vector_width(tmp_path, native, tile, wide):
    """The vector path of wide max pools runs 16 columns at a time with AVX-512 and 8 with AVX2
    (its stride-2 taps picked by other shuffles), the 16-planes path of narrow pools one vector
    of 16 or two of 8 a pixel, the plane loops without either: each as numpy gives them (maxima
    exactly), NaNs (which every window reading one gets) and infinities included."""
    path = str(tmp_path / "pools.om")
    pools = [("MaxPool", *pool_) for pool_ in WIDE_POOLS] if wide else NARROW_POOLS
    _compile_pools(path, pools, rows=9 if wide else None, planes=4 if wide else 20)
    exact = {f"y{i}" for i, (op, *_) in enumerate(pools) if op == "MaxPool"}
    assert int(_capped(POOL_CHECK.format(path=path, exact=exact), tile)) >= 2 * len(pools)  # both NaNs, every pool


def test_a_plan_with_room_for_plane_by_plane_bands_only_runs_wide_planes_that_way(native):
    """A file an older omrt planned gives a wide depthwise layer the scratch of its plane-by-plane
    bands alone: the layer runs that way, in it, rather than refusing the file. (A 1x1 layer: the
    numpy path's im2col scratch of wider windows would leave room for either.)"""
    x, weight, bias = randn(1, 20, 30, 30), randn(20, 1, 1, 1), randn(20)
    attrs = {"group": 20}
    kernel = _kernel("Conv", x, weight, attrs, native)
    old = max(kernel.im2col_bytes, parallel.MAX_SLOTS * kernel._band(kernel.inputs[0], 20, lanes=False)[1])
    assert kernel.lanes and old < kernel.workspace()
    assert kernel.fit_workspace(old) and not kernel.lanes and kernel.workspace() <= old
    y = np.full(kernel.outputs[0].shape, np.nan, np.float32)
    kernel.run([x, weight, bias], [y], np.zeros(old, np.uint8))
    want = reference("Conv", [x, weight, bias], attrs)[0]
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def test_depthwise_conv_matches_reference(native):
    x, weight, bias = randn(1, 8, 10, 9), randn(16, 1, 3, 3), randn(16)
    for attrs in ({"pads": [1, 1, 1, 1]}, {"strides": [2, 2], "pads": [0, 1, 2, 1]},
                  {"dilations": [2, 2], "pads": [2, 2, 2, 2]}):
        check("Conv", [x, weight, bias], {**attrs, "group": 8}, native=native, rtol=1e-5, atol=1e-5)


def _conv_kernel(x: np.ndarray, weight: np.ndarray, attrs: dict, native):
    ctx = OpContext(dict(attrs), 21, name="t", op_type="Conv", native=native)
    infos = [TensorInfo(x.dtype, x.shape), TensorInfo(weight.dtype, weight.shape)]
    return lookup("Conv", 21)(ctx, infos, lookup("Conv", 21).infer(ctx, infos))


@SETTINGS
@given(windows(5), st.integers(1, 2), st.sampled_from([1, 2]), st.booleans())
def test_im2col_gather_matches_numpy_path(native_without_blas, window, dilation, group, bias):
    attrs, (h, w) = window
    kh, kw = attrs["kernel_shape"]
    if (kh - 1) * dilation + 1 > h + attrs["pads"][0] + attrs["pads"][2] or \
            (kw - 1) * dilation + 1 > w + attrs["pads"][1] + attrs["pads"][3] or kh * kw == 1:
        return
    attrs = {**attrs, "dilations": [dilation, dilation], "group": group}
    x, weight = randn(2, 4, h, w), randn(6, 4 // group, kh, kw)
    kernel = _conv_kernel(x, weight, attrs, native_without_blas)
    assert kernel.native_im2col is not None and kernel.native_conv is None
    agree("Conv", [x, weight] + ([randn(6)] if bias else []), attrs, native_without_blas)


@pytest.mark.parametrize("threads", [1, 2, 3], indirect=True)
@SETTINGS
@given(windows(5), st.integers(1, 2), st.sampled_from([1, 2, 3]), st.sampled_from([6, 96]), st.integers(1, 2),
       st.sampled_from(sorted(ACTS, key=str)), st.booleans(), st.sampled_from([None, 1]))
def test_native_conv_matches_numpy_path(native, threads, window, dilation, group, filters, n, act, bias,
                                        rows_per_chunk):
    """Whole layers on the native workers: gathered in private chunks or one shared buffer,
    multiplied by group, filter block and position block, bias and activation fused."""
    attrs, (h, w) = window
    kh, kw = attrs["kernel_shape"]
    if (kh - 1) * dilation + 1 > h + attrs["pads"][0] + attrs["pads"][2] or \
            (kw - 1) * dilation + 1 > w + attrs["pads"][1] + attrs["pads"][3]:
        return
    attrs = {**attrs, "dilations": [dilation, dilation], "group": group, **ACTS[act]}
    x, weight = randn(n, 6, h, w), randn(filters, 6 // group, kh, kw)
    patch = pytest.MonkeyPatch()
    if rows_per_chunk:
        patch.setattr(window_module, "WORKSPACE_CAP", 6 * kh * kw * w * 4 * rows_per_chunk)
    try:
        assert _conv_kernel(x, weight, attrs, native).native_conv is not None
        agree("Conv", [x, weight] + ([randn(filters)] if bias else []), attrs, native)
    finally:
        patch.undo()


@pytest.mark.parametrize("threads", [1, 2], indirect=True)
@pytest.mark.parametrize("shape, filters, group", [((1, 32, 20, 20), 64, 1), ((2, 24, 7, 7), 96, 4),
                                                   ((1, 12, 30, 31), 6, 3), ((1, 16, 1, 1), 40, 1)])
def test_native_pointwise_conv_matches_reference(native, threads, shape, filters, group):
    """1x1 layers multiply the input in place of columns, split along filters or positions."""
    x, weight, bias = randn(*shape), randn(filters, shape[1] // group, 1, 1), randn(filters)
    assert _conv_kernel(x, weight, {"group": group}, native).native_conv is not None
    check("Conv", [x, weight, bias], {"group": group}, native=native, rtol=1e-4, atol=1e-4)


def _padded_winograd(filters: int, size: int, native):
    """A 16-channel 3x3 WinogradConv with pads 1 over a size x size input (2x2 tiles), and its X and W."""
    x, weight = randn(1, 16, size, size), randn(filters, 16, 3, 3)
    u = winograd.packed_transform(weight, 2)
    ctx = OpContext({"pads": [1, 1, 1, 1]}, 1, name="t", op_type="WinogradConv", native=native)
    infos = [TensorInfo(x.dtype, x.shape), TensorInfo(weight.dtype, weight.shape), None, TensorInfo(u.dtype, u.shape)]
    return winograd.WinogradConv(ctx, infos, winograd.WinogradConv.infer(ctx, infos)), x, weight


def _runs_as_conv(kernel, x: np.ndarray, weight: np.ndarray) -> None:
    y = np.empty(kernel.outputs[0].shape, np.float32)
    kernel.run([x, weight, None, winograd.packed_transform(weight, 2)], [y], np.zeros(kernel.workspace(), np.uint8))
    np.testing.assert_allclose(y, reference("Conv", [x, weight], {"pads": [1, 1, 1, 1]})[0], rtol=1e-4, atol=1e-4)


def _needs_vector_tile(native) -> None:
    """Skip unless the CPU has a vector tile for omrt's GEMM (not OMRT_GEMM_TILE=c), which
    Winograd's products need."""
    if packed.gemm_tile(native) == 0:
        pytest.skip("no vector tile on this CPU (or OMRT_GEMM_TILE=c): Winograd layers run as Convs")


@pytest.fixture
def vector_tile(native):
    """The library, on a CPU with a vector tile for omrt's GEMM."""
    _needs_vector_tile(native)
    return native


def test_winograd_in_a_plan_too_small_for_it_runs_as_a_conv(vector_tile):
    native = vector_tile
    kernel, x, weight = _padded_winograd(64, 8, native)
    assert kernel.native_winograd is not None and kernel.workspace() > kernel.conv_workspace_bytes
    assert not kernel.fit_workspace(kernel.conv_workspace_bytes - 1)
    assert kernel.fit_workspace(kernel.conv_workspace_bytes) and kernel.native_winograd is None
    _runs_as_conv(kernel, x, weight)


def test_winograd_multiplies_on_omrts_tile_without_blas(native_without_blas):
    _needs_vector_tile(native_without_blas)
    kernel, x, weight = _padded_winograd(16, 6, native_without_blas)
    assert kernel.native_winograd is not None
    _runs_as_conv(kernel, x, weight)


def test_winograd_without_a_vector_tile_runs_as_a_conv(native, monkeypatch):
    monkeypatch.setattr(winograd, "gemm_tile", lambda library: 0)
    kernel, x, weight = _padded_winograd(16, 6, native)
    assert kernel.native_winograd is None
    _runs_as_conv(kernel, x, weight)


def test_winograd_filters_in_another_layout_run_as_a_conv(native):
    """Transformed filters of a layout this omrt does not write (a 1.4 file's unpacked (16, F, C),
    as many floats as the packed one for 24 filters, or a count of elements of no tile size) are
    never handed to C: the layer runs as the Conv it was."""
    x, weight = randn(1, 16, 6, 6), randn(24, 16, 3, 3)
    unpacked = winograd.filter_transform(weight, 2)
    for u in (unpacked, np.zeros((25, 2, 16, 12), np.float32)):
        ctx = OpContext({"pads": [1, 1, 1, 1]}, 1, name="t", op_type="WinogradConv", native=native)
        infos = [TensorInfo(x.dtype, x.shape), TensorInfo(weight.dtype, weight.shape), None,
                 TensorInfo(u.dtype, u.shape)]
        kernel = winograd.WinogradConv(ctx, infos, winograd.WinogradConv.infer(ctx, infos))
        assert kernel.tile is None and kernel.native_winograd is None
        y = np.empty(kernel.outputs[0].shape, np.float32)
        kernel.run([x, weight, None, u], [y], np.zeros(kernel.workspace(), np.uint8))
        np.testing.assert_allclose(y, reference("Conv", [x, weight], {"pads": [1, 1, 1, 1]})[0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("tile, elements", [(2, 16), (4, 36)])
def test_winograd_filters_are_packed_in_panels_per_element(tile, elements):
    weight = randn(14, 5, 3, 3)
    u, packed = winograd.filter_transform(weight, tile), winograd.packed_transform(weight, tile)
    assert packed.shape == (elements, 2, 5, 12) and packed.dtype == np.float32
    assert winograd.tile_of(TensorInfo(packed.dtype, packed.shape), 14, 5) == tile
    for e in range(elements):
        for f in range(14):
            np.testing.assert_array_equal(packed[e, f // 12, :, f % 12], u[e, f])
    assert not packed[:, 1, :, 2:].any()  # filters 14 to 23 are padding


def test_sigmoid_fused_depthwise_keeps_numpy_path(native):
    x, weight = randn(1, 4, 8, 8), randn(4, 1, 3, 3)
    attrs = {"group": 4, "pads": [1, 1, 1, 1], "_act": "Sigmoid"}
    assert not _uses_native("Conv", x, weight, attrs, native)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.integers(1, 2), st.integers(16, 20), st.integers(16, 80), st.integers(1, 11), st.integers(1, 11),
       st.lists(st.integers(0, 2), min_size=4, max_size=4), st.sampled_from(sorted(ACTS, key=str)),
       st.booleans(), st.integers(1, 2), st.sampled_from([None, 3]), st.sampled_from([2, 4]))
def test_winograd_conv_matches_reference(vector_tile, monkeypatch, n, c, f, h, w, pads, act, bias, threads,
                                         tiles_per_chunk, tile):
    native = vector_tile
    if h + pads[0] + pads[2] < 3 or w + pads[1] + pads[3] < 3:
        return
    if tiles_per_chunk:
        monkeypatch.setattr(winograd, "SCRATCH_CAP",
                            (tile + 2) ** 2 * (c + min(f, winograd.FILTERS_PER_PASS)) * 4 * tiles_per_chunk)
    x, weight = randn(n, c, h, w), randn(f, c, 3, 3)
    b = randn(f) if bias else None
    u = winograd.packed_transform(weight, tile)
    attrs = {"pads": pads}
    omrt.set_num_threads(threads)
    try:
        ctx = OpContext({**attrs, **ACTS[act]}, 1, name="t", op_type="WinogradConv", native=native)
        infos = [TensorInfo(x.dtype, x.shape), TensorInfo(weight.dtype, weight.shape),
                 None if b is None else TensorInfo(b.dtype, b.shape), TensorInfo(u.dtype, u.shape)]
        kernel = winograd.WinogradConv(ctx, infos, winograd.WinogradConv.infer(ctx, infos))
        assert kernel.native_winograd is not None
        y = np.full(kernel.outputs[0].shape, np.nan, np.float32)
        kernel.run([x, weight, b, u], [y], np.full(kernel.workspace(), 0xCD, np.uint8))
    finally:
        omrt.set_num_threads(1)
    sums = reference("Conv", [x, weight] + ([b] if bias else []), attrs)[0]
    # scaled to the sums before the activation: a Clip to +-0.5 keeps the rounding of sums ~10
    np.testing.assert_allclose(y, _activated(sums, act), rtol=1e-4, atol=1e-4 * max(1.0, float(np.abs(sums).max())))


def test_winograd_needs_a_3x3_stride_1_dense_float_layer():
    x, w = TensorInfo(np.dtype(np.float32), (1, 16, 8, 8)), randn(16, 16, 3, 3)
    assert winograd.eligible({}, x, w)
    assert not winograd.eligible({"strides": [2, 2]}, x, w)
    assert not winograd.eligible({"dilations": [2, 2]}, x, w)
    assert not winograd.eligible({"_act": "Sigmoid"}, x, w)
    assert not winograd.eligible({}, x, randn(16, 16, 5, 5))
    assert not winograd.eligible({}, TensorInfo(np.dtype(np.float32), (1, 8, 8, 8)), randn(16, 8, 3, 3))
    assert not winograd.eligible({"group": 2}, TensorInfo(np.dtype(np.float32), (1, 32, 8, 8)), w)
    wide = randn(512, 512, 3, 3)  # 9 MiB of filters for 14x14 positions: 48 KiB per position
    assert not winograd.eligible({"pads": [1, 1, 1, 1]}, TensorInfo(np.dtype(np.float32), (1, 512, 14, 14)), wide)
    assert winograd.eligible({"pads": [1, 1, 1, 1]}, TensorInfo(np.dtype(np.float32), (1, 512, 28, 28)), wide)


def test_winograd_takes_4x4_tiles_on_wide_planes_only(vector_tile, tmp_path):
    """A 3x3 layer over a 24x24 plane takes F(4x4, 3x3) (36 transformed filter matrices), one over
    12x12 (after a stride-2 layer) F(2x2, 3x3) (16), as do wide layers of many filters; both run
    natively and match the reference."""
    from onnx import TensorProto, helper, numpy_helper
    from onnx.reference import ReferenceEvaluator

    pads = {"pads": [1, 1, 1, 1]}
    def tile(shape, attrs=pads, filters=16):
        return winograd.tile_for(attrs, TensorInfo(np.dtype(np.float32), shape), randn(filters, shape[1], 3, 3))

    assert tile((1, 16, 20, 40)) == 4 and tile((1, 64, 20, 40), filters=112) == 4  # 1008 KiB transformed
    assert tile((1, 16, 19, 40)) == 2 and tile((1, 16, 21, 21), {}) == 2  # 19x19 out
    assert tile((1, 64, 20, 40), filters=128) == 2  # 1.125 MiB transformed
    rng = np.random.default_rng(4)
    ws = [numpy_helper.from_array((rng.standard_normal((16, 16, 3, 3)) / 12).astype(np.float32), f"w{i}")
          for i in range(3)]
    nodes = [helper.make_node("Conv", ["x", "w0"], ["a"], **pads),
             helper.make_node("Conv", ["a", "w1"], ["b"], strides=[2, 2], **pads),
             helper.make_node("Conv", ["b", "w2"], ["y"], **pads)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 24, 24])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], ws)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    omrt.compile(model, str(tmp_path / "w.om"))
    loaded = omrt.load(str(tmp_path / "w.om"), trust_kernels=True)
    sess = loaded.session()
    x = randn(1, 16, 24, 24)
    want = ReferenceEvaluator(model).run(None, {"x": x})[0]
    got = sess.run({"x": x})["y"]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * max(1.0, float(np.abs(want).max())))
    steps = [s for s in sess._executor.instructions if s.node.op_type == "WinogradConv"]
    assert [(s.kernel.tile, s.inputs[3].shape[0]) for s in steps] == [(4, 36), (2, 16)]
    assert all(s.kernel.native_winograd is not None for s in steps)


@st.composite
def products(draw):
    """(A, B) of a product BLAS reads in place, possibly batched (one side may be a single
    matrix or broadcast over the batch) and stored transposed, and the FusedMatMul attributes
    that read them."""
    vector = st.one_of(st.just(1), st.integers(1, 40))
    m, n, k = draw(vector), draw(st.one_of(st.just(1), st.integers(1, 70))), draw(st.integers(1, 30))
    batch = draw(st.sampled_from([None, 1, 3]))
    a_batch = batch if batch is None else draw(st.sampled_from([batch, 1, None]))
    b_batch = batch if batch is None else draw(st.sampled_from([batch, 1]))
    attrs, ops = {}, []
    for name, rows, cols, lead in (("_perm_a", m, k, a_batch), ("_perm_b", k, n, b_batch)):
        shape = (rows, cols) if lead is None else (lead, rows, cols)
        if draw(st.booleans()):
            perm = list(range(len(shape)))
            perm[-2:] = perm[-1], perm[-2]
            attrs[name] = perm
            shape = tuple(shape[p] for p in perm)
        ops.append(randn(*shape))
    return ops, attrs


@pytest.mark.parametrize("threads", [1, 2, 3], indirect=True)
@SETTINGS
@given(products(), st.sampled_from(sorted(ACTS, key=str)), st.booleans())
def test_native_matmul_matches_numpy_path(native, threads, operands, act, bias):
    """Products in blocks of rows or columns on the native workers, transposed operands read in
    place, bias over the columns and activation fused."""
    (a, b), attrs = operands
    a_read, b_read = (np.swapaxes(x, -1, -2) if key in attrs else x for x, key in ((a, "_perm_a"), (b, "_perm_b")))
    attrs = {**attrs, **ACTS[act]}
    n = b_read.shape[-1]
    agree_domain("FusedMatMul", [a, b, randn(n) if bias else np.zeros(n, np.float32)], attrs, native, "omrt")
    agree("MatMul", [np.ascontiguousarray(a_read), np.ascontiguousarray(b_read)], ACTS[act], native)


@pytest.mark.parametrize("threads", [1, 2], indirect=True)
def test_native_attention_products_match_numpy_path(native, threads):
    """Heads of a batch of one: the leading axis is dropped and the heads are a stack of
    matrices read through the folded Transposes."""
    q, k = randn(1, 16, 3, 8), randn(1, 16, 3, 8)
    ctx = OpContext({"_perm_a": [0, 2, 1, 3], "_perm_b": [0, 2, 3, 1]}, 21, name="t", op_type="MatMul", native=native)
    infos = [TensorInfo(q.dtype, q.shape), TensorInfo(k.dtype, k.shape)]
    kernel = lookup("MatMul", 21)(ctx, infos, lookup("MatMul", 21).infer(ctx, infos))
    before = native.calls().get("omrt_matmul_f32", 0)
    scores = np.full(kernel.outputs[0].shape, np.nan, np.float32)
    kernel.run([q, k], [scores], None)
    assert native.calls()["omrt_matmul_f32"] == before + 1
    np.testing.assert_allclose(scores, np.swapaxes(q, 1, 2) @ np.transpose(k, (0, 2, 3, 1)), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("attrs, bias_shape", [({"_act": "Sigmoid"}, (24,)), ({"_act": "Relu"}, (17, 24)),
                                               ({}, (17, 1))])
def test_native_product_leaves_what_it_cannot_fuse_to_numpy(native, attrs, bias_shape):
    """An activation the C loop lacks, or a bias that is not a vector over the columns: the
    product still runs natively, unfused, and numpy adds the bias and applies the activation."""
    a, b, bias = randn(17, 33), randn(33, 24), randn(*bias_shape)
    infos = [TensorInfo(x.dtype, x.shape) for x in (a, b, bias)]
    ctx = OpContext(dict(attrs), 1, name="t", op_type="FusedMatMul", native=native)
    cls = lookup("FusedMatMul", 1, "omrt")
    kernel = cls(ctx, infos, cls.infer(ctx, infos))
    calls = []

    class Spy:
        """The C product, its arguments kept."""

        def bind(self, *args):
            calls.append(args)
            return c_matmul.bind(*args)

    c_matmul, kernel.product.native = kernel.product.native, Spy()
    y = np.full((17, 24), np.nan, np.float32)
    assert kernel.bind([a, b, bias], [y], None) is None  # numpy's part: no call list may hold it
    kernel.run([a, b, bias], [y], None)
    assert len(calls) == 1 and calls[0][2] is None and calls[0][-3:] == (0, 0.0, 0.0)
    np.testing.assert_allclose(y, run_kernel("FusedMatMul", [a, b, bias], attrs, 1, domain="omrt")[0],
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("threads", [1, 2], indirect=True)
@pytest.mark.parametrize("m, n", [(1, 50), (30, 1), (1, 1)])
@pytest.mark.parametrize("perm_a, perm_b", [(False, False), (True, False), (False, True), (True, True)])
def test_native_matrix_vector_products(native, threads, m, n, perm_a, perm_b):
    """A row times a matrix, or a matrix times a column, is a gemv over B's (or A's) blocks;
    operands (slices of wider arrays, some stored transposed) are read with their pitch."""
    a = randn(17, m + 5)[:, :m] if perm_a else randn(m, 23)[:, :17]
    b = randn(n, 20)[:, :17] if perm_b else randn(17, n + 3)[:, :n]
    attrs = {**({"_perm_a": [1, 0]} if perm_a else {}), **({"_perm_b": [1, 0]} if perm_b else {}), **ACTS["Relu"]}
    agree_domain("FusedMatMul", [a, b, randn(n)], attrs, native, "omrt")


@pytest.mark.parametrize("threads", [1, 2], indirect=True)
@pytest.mark.parametrize("c_shape, alpha, beta", [(None, 1.0, 1.0), ((24,), 1.0, 1.0), ((1, 24), 1.0, 1.0),
                                                  ((24,), 0.5, 1.0), ((24,), 1.0, 2.0), ((17, 24), 1.0, 1.0),
                                                  ((17, 1), 1.0, 1.0), ((1,), 1.0, 1.0)])
@pytest.mark.parametrize("trans_a, trans_b", [(0, 0), (1, 0), (0, 1), (1, 1)])
def test_native_gemm_matches_reference(native, threads, c_shape, alpha, beta, trans_a, trans_b):
    """A fully connected layer (C a vector over the columns, alpha = beta = 1) is one native
    call; other Gemms multiply natively and scale and add C with numpy."""
    a = randn(*((33, 17) if trans_a else (17, 33)))
    b = randn(*((24, 33) if trans_b else (33, 24)))
    attrs = {"transA": trans_a, "transB": trans_b, "alpha": alpha, "beta": beta}
    inputs = [a, b] + ([] if c_shape is None else [randn(*c_shape)])
    ctx = OpContext(dict(attrs), 21, name="t", op_type="Gemm", native=native)
    infos = [TensorInfo(x.dtype, x.shape) for x in inputs]
    assert lookup("Gemm", 21)(ctx, infos, lookup("Gemm", 21).infer(ctx, infos)).product.native is not None
    check("Gemm", inputs, attrs, native=native, rtol=1e-4, atol=1e-4)
    got = run_kernel("Gemm", inputs, {**attrs, "_act": "Relu"}, native=native)[0]
    np.testing.assert_allclose(got, np.maximum(reference("Gemm", inputs, attrs)[0], 0), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("threads", [1, 2, 3], indirect=True)
@SETTINGS
@given(st.integers(1, 5000), st.floats(0.1, 20))
def test_native_gelu_gives_the_numpy_paths_bits(native, threads, n, scale):
    x = randn(n) * np.float32(scale)
    specials = np.array([0x7FC00000, 0xFFC00001, 0x7FA00000, 0x7F800000, 0xFF800000, 0x80000000], np.uint32)
    x[:6] = specials.view(np.float32)[:min(6, n)]  # NaNs (negative, signaling), infinities, -0
    ctx = OpContext({}, 20, name="t", op_type="Gelu", native=native)
    infos = [TensorInfo(x.dtype, x.shape)]
    assert lookup("Gelu", 20)(ctx, infos, lookup("Gelu", 20).infer(ctx, infos)).native_gelu is not None
    got = run_kernel("Gelu", [x], {}, 20, native=native)[0]
    np.testing.assert_array_equal(got.view(np.uint32), run_kernel("Gelu", [x], {}, 20)[0].view(np.uint32))
    np.testing.assert_allclose(got[6:], reference("Gelu", [x[6:]], {}, 20)[0], rtol=1e-6, atol=1e-7)


def _lrn64(x: np.ndarray, size: int, alpha: float, bias: float, beta: float = 0.75) -> np.ndarray:
    """LRN in float64, from its definition (onnx.reference's is off for even sizes and others)."""
    sq, c = x.astype(np.float64) ** 2, x.shape[1]
    window = np.stack([sq[:, max(0, i - (size - 1) // 2):min(c, i + size // 2 + 1)].sum(axis=1) for i in range(c)], 1)
    return x / (bias + alpha / size * window) ** beta


@pytest.mark.parametrize("threads", [1, 2, 3], indirect=True)
@SETTINGS
@given(st.integers(1, 3), st.integers(1, 40), st.sampled_from([(5, 5), (1, 700), (3, 17, 31), (2, 2, 1)]),
       st.sampled_from([1, 2, 3, 5, 9]), st.floats(1e-4, 2.0), st.floats(0.5, 3.0))
def test_native_lrn_agrees_with_numpy_and_the_definition(native, threads, n, c, plane, size, alpha, bias):
    """Every window size (even ones reach one channel further up than down), planes longer than
    the loop's block of 512 pixels and shorter than a vector, images split between threads."""
    x = randn(n, c, *plane) * np.float32(3)
    attrs = {"size": size, "alpha": alpha, "beta": 0.75, "bias": bias}
    before = native.calls().get("omrt_lrn_f32", 0)
    got = run_kernel("LRN", [x], attrs, 13, native=native)[0]
    assert native.calls().get("omrt_lrn_f32", 0) == before + 1
    want = _lrn64(x, size, alpha, bias)
    np.testing.assert_allclose(got, run_kernel("LRN", [x], attrs, 13)[0], rtol=3e-6, atol=1e-7 * np.abs(want).max())
    np.testing.assert_allclose(got, want, rtol=3e-6, atol=1e-7 * np.abs(want).max())


def test_native_lrn_takes_beta_three_quarters_only(native):
    """Other powers stay on numpy's power (the models that use LRN all take 0.75)."""
    x = randn(1, 6, 4, 4)
    before = native.calls().get("omrt_lrn_f32", 0)
    got = run_kernel("LRN", [x], {"size": 3, "beta": 0.5}, 13, native=native)[0]
    assert native.calls().get("omrt_lrn_f32", 0) == before
    np.testing.assert_allclose(got, _lrn64(x, 3, 1e-4, 1.0, 0.5), rtol=3e-6, atol=1e-7)


def test_native_lrn_leaves_an_input_without_channels_to_numpy(native):
    """The C contract takes at least one channel: a refused call would fail the run."""
    assert run_kernel("LRN", [randn(1, 0, 3, 3)], {"size": 3}, 13, native=native)[0].shape == (1, 0, 3, 3)


def _resize_scales(shape: tuple[int, ...], factors: tuple[int, ...]) -> np.ndarray:
    return np.array([1.0] * (len(shape) - len(factors)) + list(factors), np.float32)


@pytest.mark.parametrize("threads", [1, 2, 3], indirect=True)
@pytest.mark.parametrize("shape,factors", [((1, 64, 10, 10), (2, 2)), ((2, 3, 5, 7), (4, 4)), ((1, 16, 3, 3), (8, 8)),
                                           ((1, 2, 5, 1), (1, 3)), ((2, 3, 4, 6), (3, 1)), ((7, 33), (2, 5))])
def test_native_nearest_upsampling_copies_numpys_bits(native, threads, shape, factors):
    """Whole factors of the last two axes: every output element is its input's, bit for bit,
    NaNs and signed zeros included (onnx.reference computes in float64 and spreads NaNs: it is
    compared on finite inputs)."""
    x = randn(*shape)
    finite = run_kernel("Resize", [x, None, _resize_scales(shape, factors)], {"mode": "nearest"}, 19, native=native,
                        const=[1, 2])[0]
    np.testing.assert_array_equal(finite, reference("Resize", [x, None, _resize_scales(shape, factors)],
                                                    {"mode": "nearest"}, 19)[0])
    x.reshape(-1)[:3] = np.array([0x7FA00001, 0x80000000, 0xFFC00000], np.uint32).view(np.float32)[:x.size]
    scales = _resize_scales(shape, factors)
    before = native.calls().get("omrt_repeat2d_f32", 0)
    got = run_kernel("Resize", [x, None, scales], {"mode": "nearest"}, 19, native=native, const=[1, 2])[0]
    assert native.calls().get("omrt_repeat2d_f32", 0) == before + 1  # native, as the finite run before
    want = run_kernel("Resize", [x, None, scales], {"mode": "nearest"}, 19, const=[1, 2])[0]
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("scales,attrs", [((1, 2, 2, 2), {"mode": "nearest"}),  # a channel axis repeated too
                                          ((1, 1, 2, 2), {"mode": "linear"}),
                                          ((1, 1, 1.5, 2), {"mode": "nearest"})])
def test_other_resizes_stay_on_numpy(native, scales, attrs):
    x, scales = randn(1, 2, 4, 4), np.array(scales, np.float32)
    before = native.calls().get("omrt_repeat2d_f32", 0)
    got = run_kernel("Resize", [x, None, scales], attrs, 19, native=native, const=[1, 2])[0]
    assert native.calls().get("omrt_repeat2d_f32", 0) == before
    np.testing.assert_allclose(got, reference("Resize", [x, None, scales], attrs, 19)[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("threads", [1, 2, 3], indirect=True)
@pytest.mark.parametrize("n,c,h,w,m,k", [(1, 16, 10, 10, 16, 2), (2, 3, 5, 7, 1, 2), (1, 5, 3, 300, 4, 3),
                                         (1, 1, 1, 1, 2, 8), (2, 7, 3, 40, 3, 2), (1, 2, 2, 300, 2, 2)])
@pytest.mark.parametrize("bias,act", [(True, {}), (False, {"_act": "Relu"}), (True, ACTS["Clip"]),
                                      (True, {"_act": "Sigmoid"})])  # the last applied by numpy after the loop
def test_native_stride_k_convtranspose(native, threads, n, c, h, w, m, k, bias, act):
    """Kernel = stride (unpadded): the native loop against the numpy path and onnx.reference,
    rows longer than its block of 256 pixels, one pixel, one filter, activations fused; 2x2
    kernels over rows of whole blocks of 16 pixels and a remainder (40, 300), and shorter ones."""
    x, wt = randn(n, c, h, w), randn(c, m, k, k)
    inputs = [x, wt] + ([randn(m)] if bias else [])
    attrs = {"kernel_shape": [k, k], "strides": [k, k]}
    before = native.calls().get("omrt_deconv_f32", 0)
    got = run_kernel("ConvTranspose", inputs, {**attrs, **act}, native=native)[0]
    assert native.calls().get("omrt_deconv_f32", 0) == before + 1
    want = run_kernel("ConvTranspose", inputs, {**attrs, **act})[0]
    plain = reference("ConvTranspose", inputs, attrs)[0]
    if act.get("_act") == "Sigmoid":
        plain = 1 / (1 + np.exp(-plain))
    # each output is the bias plus c products, summed in any order: within (c + 1) float32 ulps of
    # the sum of their magnitudes (the activations shrink differences)
    magnitudes = run_kernel("ConvTranspose", [np.abs(a) for a in inputs], attrs)[0]
    bound = 2 * (c + 1) * np.finfo(np.float32).eps * magnitudes + 1e-30
    assert np.all(np.abs(got - want) <= bound)
    assert np.all(np.abs(got - _activated(plain, act.get("_act"))) <= bound)


@pytest.mark.parametrize("attrs", [{"kernel_shape": [3, 3], "strides": [2, 2]}, {"kernel_shape": [2, 2], "strides": [2, 2],
                                   "pads": [1, 1, 1, 1]}, {"kernel_shape": [2, 2], "strides": [2, 2], "group": 2},
                                   {"kernel_shape": [9, 9], "strides": [9, 9]}])  # wider than the loop's sums
def test_overlapping_or_grouped_convtranspose_stays_on_numpy(native, attrs):
    x, wt = randn(1, 4, 5, 5), randn(4, 2 // attrs.get("group", 1), *attrs["kernel_shape"])
    before = native.calls().get("omrt_deconv_f32", 0)
    got = run_kernel("ConvTranspose", [x, wt], attrs, native=native)[0]
    assert native.calls().get("omrt_deconv_f32", 0) == before
    np.testing.assert_array_equal(got, run_kernel("ConvTranspose", [x, wt], attrs)[0])


@pytest.mark.parametrize("act", ["Sigmoid", "Tanh", "Relu"])
def test_convtranspose_takes_in_only_the_activations_its_loop_applies(tmp_path, native, act):
    """A Sigmoid or Tanh after a stride-2 ConvTranspose stays a node of its own (a native chain of
    the compiler's, where folded in it would be numpy passes after the C loop); a Relu is folded
    into the loop. Either way the values are onnx.reference's."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 6, 5, 20])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    wt, b = randn(6, 3, 2, 2), randn(3)
    nodes = [helper.make_node("ConvTranspose", ["x", "w", "b"], ["t"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node(act, ["t"], ["y"])]
    model = helper.make_model(helper.make_graph(nodes, "up", [x], [y], [numpy_helper.from_array(wt, "w"),
                                                                       numpy_helper.from_array(b, "b")]),
                              opset_imports=[helper.make_opsetid("", 17)])
    path = str(tmp_path / "up.om")
    omrt.compile(model, path)
    session = omrt.load(path, trust_kernels=True).session()
    feed = randn(1, 6, 5, 20)
    nodes_run = list(session.profile({"x": feed}, repeat=1, by="node"))
    assert len(nodes_run) == (1 if act == "Relu" else 2), nodes_run
    want = reference(act, [reference("ConvTranspose", [feed, wt, b], {"kernel_shape": [2, 2], "strides": [2, 2]})[0]],
                     {})[0]
    got = session.run({"x": feed})["y"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * max(1.0, float(np.abs(want).max())))


@pytest.fixture
def arith(native, monkeypatch):
    """The native library, with even the tiny outputs of these tests going to C; yields a
    function telling how many native binary calls ran so far."""
    monkeypatch.setattr(elementwise, "MIN_NATIVE_BYTES", 0)
    return lambda: native.calls().get("omrt_binary_f32", 0)


def _operands(shapes: tuple[tuple[int, ...], ...], op: str) -> list[np.ndarray]:
    xs = [randn(*s) for s in shapes]
    if op == "Div":  # zeros of both signs, and 0 / 0, for the infinities and NaNs
        xs[1].reshape(-1)[::5] = 0.0
        xs[1].reshape(-1)[1::10] = -0.0
        xs[0].reshape(-1)[::10] = 0.0
    if op in ("Max", "Min"):  # NaN wins on either side, as in numpy
        xs[0].reshape(-1)[::7] = np.nan
        xs[1].reshape(-1)[::5] = np.nan
    return xs


LAYOUTS = [((1,), (1,)), ((7,), (7,)), ((1000003,), (1000003,)), ((2, 3, 5, 7), (2, 3, 5, 7)),
           ((2, 24, 5, 7), (2, 24, 1, 1)),   # squeeze-excitation scaling
           ((2, 24, 5, 7), (24, 1, 1)),      # a bias per channel, the same for every image
           ((2, 24, 1, 1), (2, 24, 5, 7)),   # the same, the small operand first
           ((3, 40), (40,)), ((40,), (3, 40)), ((2, 24, 5, 7), (1,)), ((), (7, 20))]


@pytest.mark.parametrize("threads", [1, 2], indirect=True)
@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div", "Max", "Min"])
@pytest.mark.parametrize("shapes", LAYOUTS, ids=str)
def test_native_arithmetic_gives_numpys_bits(arith, native, threads, op, shapes):
    xs = _operands(shapes, op)
    before = arith()
    got = run_kernel(op, xs, native=native)[0]
    assert arith() > before
    np.testing.assert_array_equal(got, run_kernel(op, xs)[0])


@pytest.mark.parametrize("threads", [1, 2], indirect=True)
@pytest.mark.parametrize("op", ["Add", "Sum"])
@pytest.mark.parametrize("act", list(ACTS), ids=str)
@pytest.mark.parametrize("shapes", [((1000003,), (1000003,)), ((2, 24, 5, 7), (2, 24, 1, 1))], ids=str)
def test_native_add_applies_the_fused_activation(arith, native, threads, op, act, shapes):
    xs = [randn(*s) for s in shapes]
    before = arith()
    got = run_kernel(op, xs, ACTS[act], native=native)[0]
    assert arith() > before
    # HardSigmoid's alpha * v + beta: a compiler may fuse it into one FMA (one rounding, not two)
    ulp = np.finfo(np.float32).eps if act == "HardSigmoid" else 0
    np.testing.assert_allclose(got, run_kernel(op, xs, ACTS[act])[0], rtol=0, atol=ulp)
    np.testing.assert_allclose(got, _activated(xs[0] + xs[1], act), rtol=0, atol=ulp)


@pytest.mark.parametrize("threads", [1, 2], indirect=True)
@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div", "Sum"])
@pytest.mark.parametrize("into", [0, 1])
@pytest.mark.parametrize("n", [7, 1000003])
def test_native_arithmetic_in_place(arith, native, threads, op, into, n):
    """The output may be either input itself, as the memory plan makes it."""
    xs = _operands(((n,), (n,)), op)
    want = run_kernel(op, xs)[0]
    ctx = OpContext(dict(ACTS["LeakyRelu"]) if op == "Sum" else {}, 14, name="t", op_type=op, native=native)
    infos = [TensorInfo(x.dtype, x.shape) for x in xs]
    kernel = lookup(op, 14)(ctx, infos, lookup(op, 14).infer(ctx, infos))
    if op == "Sum":
        want = _activated(want, "LeakyRelu")
    before = arith()
    kernel.run(xs, [xs[into]], None)
    assert arith() > before
    np.testing.assert_array_equal(xs[into], want)


@pytest.mark.parametrize("a, b", [((2, 24, 5, 7), (2, 1, 5, 7)), ((2, 24, 5, 3), (2, 24, 1, 3)),
                                  ((24, 4), (24, 1)), ((3, 1), (1, 4))], ids=str)
def test_layouts_the_native_loop_does_not_read_stay_with_numpy(arith, native, a, b):
    """A broadcast in the middle, rows shorter than MIN_RUN, both operands broadcast."""
    xs = [randn(*a), randn(*b)]
    before = arith()
    got = run_kernel("Mul", xs, native=native)[0]
    assert arith() == before
    np.testing.assert_array_equal(got, xs[0] * xs[1])


def test_small_or_other_outputs_stay_with_numpy(native):
    """Below MIN_NATIVE_BYTES numpy is faster; float64, three Sum inputs and a Sigmoid fused into
    Add (not one the loop applies) are numpy's."""
    before = native.calls().get("omrt_binary_f32", 0)
    run_kernel("Add", [randn(1000), randn(1000)], native=native)
    big = [randn(1 << 16) for _ in range(3)]
    run_kernel("Sum", big, native=native)
    run_kernel("Add", big[:2], {"_act": "Sigmoid"}, native=native)
    run_kernel("Add", [x.astype(np.float64) for x in big[:2]], native=native)
    assert native.calls().get("omrt_binary_f32", 0) == before


@pytest.mark.parametrize("into", [0, 1])
def test_an_output_partly_over_an_input_stays_with_numpy(arith, native, into):
    """numpy reads such operands through a copy; the C loop would read what it had written."""
    buf = randn(1001)
    xs = [randn(1000), randn(1000)]
    xs[into] = buf[:-1]
    want = xs[0] - xs[1]
    ctx = OpContext({}, 14, name="t", op_type="Sub", native=native)
    infos = [TensorInfo(x.dtype, x.shape) for x in xs]
    kernel = lookup("Sub", 14)(ctx, infos, lookup("Sub", 14).infer(ctx, infos))
    before = arith()
    kernel.run(xs, [buf[1:]], None)
    assert arith() == before
    np.testing.assert_array_equal(buf[1:], want)


def _shuffled(y: np.ndarray, groups: int) -> np.ndarray:
    """ShuffleNet's channel shuffle of y (N, M, H, W) across `groups` groups."""
    n, m, h, w = y.shape
    return y.reshape(n, groups, m // groups, h, w).transpose(0, 2, 1, 3, 4).reshape(n, m, h, w)


@pytest.mark.parametrize("threads", [1, 2], indirect=True)
@pytest.mark.parametrize("kernel, groups, filters", [(1, 4, 24), (3, 3, 12), (1, 2, 6)])
@pytest.mark.parametrize("library", ["native", "numpy"])
def test_shuffled_conv_is_the_conv_then_the_channel_shuffle(native, threads, kernel, groups, filters, library):
    """The native loop writes each group's planes where the shuffle puts them; the numpy paths
    shuffle afterwards through one plane of workspace."""
    x, w, b = randn(2, 12, 9, 7), randn(filters, 12 // groups, kernel, kernel), randn(filters)
    attrs = {"group": groups, "pads": [kernel // 2] * 4, **ACTS["Relu"]}
    ctx = OpContext(attrs, 1, name="t", op_type="ShuffledConv", native=native if library == "native" else None)
    infos = [TensorInfo(a.dtype, a.shape) for a in (x, w, b)]
    cls = lookup("ShuffledConv", 1, "omrt")
    conv = cls(ctx, infos, cls.infer(ctx, infos))
    assert (conv.native_conv is not None) == (library == "native")
    y = np.full(conv.outputs[0].shape, np.nan, np.float32)
    conv.run([x, w, b], [y], np.full(conv.workspace(), 0xCD, np.uint8))
    want = _shuffled(_activated(reference("Conv", [x, w, b], {"group": groups, "pads": [kernel // 2] * 4})[0],
                                "Relu"), groups)
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))


@pytest.mark.parametrize("threads", [1, 2], indirect=True)
@pytest.mark.parametrize("shape", [(2, 3, 7, 7), (1, 5, 13), (1, 2, 3, 4, 5), (3, 1, 1, 1)])
def test_global_pools_in_c_match_the_reference(native, threads, shape):
    """Planes of any size (not only multiples of the eight lanes), split over the threads."""
    x = randn(*shape) * 3 + 1
    before = native.calls().get("omrt_global_pool_f32", 0)
    mean = run_kernel("GlobalAveragePool", [x], native=native)[0]
    top = run_kernel("GlobalMaxPool", [x], native=native)[0]
    assert native.calls().get("omrt_global_pool_f32", 0) == before + 2
    axes = tuple(range(2, x.ndim))
    np.testing.assert_allclose(mean, x.astype(np.float64).mean(axis=axes, keepdims=True), rtol=1e-6,
                               atol=1e-6 * float(np.abs(x).max()))
    np.testing.assert_array_equal(top, x.max(axis=axes, keepdims=True))


def test_a_nan_wins_the_global_max_pool_in_c(native):
    x = randn(1, 3, 5, 5)
    x[0, 1, 4, 4] = np.nan
    x[0, 2, 0, 0] = np.nan
    top = run_kernel("GlobalMaxPool", [x], native=native)[0]
    np.testing.assert_array_equal(np.isnan(top.reshape(-1)), [False, True, True])
    assert top.reshape(-1)[0] == x[0, 0].max()


@pytest.mark.parametrize("op", ["AveragePool", "MaxPool"])
def test_a_window_over_the_whole_plane_pools_it_as_a_global_pool(native, op):
    """An unpadded window of the plane's size (Inception's last pool) takes the global pool's loop."""
    x = randn(1, 6, 7, 5) + 2
    before = native.calls().get("omrt_global_pool_f32", 0)
    got = run_kernel(op, [x], {"kernel_shape": [7, 5]}, native=native, n_outputs=1)[0]
    assert native.calls().get("omrt_global_pool_f32", 0) == before + 1
    np.testing.assert_allclose(got, reference(op, [x], {"kernel_shape": [7, 5]})[0], rtol=1e-6, atol=1e-6)
    padded = run_kernel(op, [x], {"kernel_shape": [7, 5], "pads": [1, 0, 0, 0]}, native=native, n_outputs=1)[0]
    assert native.calls().get("omrt_global_pool_f32", 0) == before + 1  # padding: the window loop
    np.testing.assert_allclose(padded, reference(op, [x], {"kernel_shape": [7, 5], "pads": [1, 0, 0, 0]})[0],
                               rtol=1e-6, atol=1e-6)
