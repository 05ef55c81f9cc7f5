"""Pooling kernels against onnx.reference and, where that is incomplete, a per-pixel model of the spec."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import omrt.kernels.window as window
from omrt.errors import ShapeError
from omrt.kernels import OpContext, TensorInfo, lookup
from tests.kernel_check import check, run_kernel

rng = np.random.default_rng(0)


def rand(*shape, dtype=np.float32):
    if np.dtype(dtype).kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, size=shape, endpoint=True).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


# ------------------------------------------------------------------------- a per-pixel model of the spec

def spec_window(size, attrs):
    """Output size and (begin, end) pads per spatial dim, written from the ONNX formulas."""
    kernel = attrs["kernel_shape"]
    nd = len(kernel)
    strides = attrs.get("strides", [1] * nd)
    dil = attrs.get("dilations", [1] * nd)
    pads = attrs.get("pads", [0] * 2 * nd)
    auto_pad = attrs.get("auto_pad", "NOTSET")
    out, pad = [], []
    for i in range(nd):
        span = (kernel[i] - 1) * dil[i] + 1
        if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            o = math.ceil(size[i] / strides[i])
            total = max(0, (o - 1) * strides[i] + span - size[i])
            small, big = total // 2, total - total // 2
            pad.append((small, big) if auto_pad == "SAME_UPPER" else (big, small))
        else:
            b, e = (pads[i], pads[i + nd]) if auto_pad == "NOTSET" else (0, 0)
            frac = (size[i] + b + e - span) / strides[i] + 1
            o = math.ceil(frac) if attrs.get("ceil_mode") else math.floor(frac)
            if attrs.get("ceil_mode") and (o - 1) * strides[i] >= size[i] + b:
                o -= 1
            pad.append((b, e))
        out.append(o)
    return out, pad


def spec_pool(x, kind, attrs):
    """Pool one output pixel at a time; returns (Y, Indices)."""
    kernel = attrs["kernel_shape"]
    nd = len(kernel)
    strides = attrs.get("strides", [1] * nd)
    dil = attrs.get("dilations", [1] * nd)
    out, pad = spec_window(x.shape[2:], attrs)
    y = np.zeros(x.shape[:2] + tuple(out), x.dtype)
    idx = np.zeros(y.shape, np.int64)
    column_major = attrs.get("storage_order", 0) == 1
    for n, c, *o in itertools.product(*(range(d) for d in y.shape)):
        values, where, padded = [], [], 0
        for t in itertools.product(*(range(k) for k in kernel)):
            pos = [o[i] * strides[i] + t[i] * dil[i] - pad[i][0] for i in range(nd)]
            if all(0 <= p < s for p, s in zip(pos, x.shape[2:])):
                values.append(x[(n, c, *pos)])
                dims = x.shape[2:][::-1] if column_major else x.shape[2:]
                where.append(np.ravel_multi_index(pos[::-1] if column_major else pos, dims))
            elif all(-pad[i][0] <= p < x.shape[2 + i] + pad[i][1] for i, p in enumerate(pos)):
                padded += 1
        values = np.array(values, np.float64)
        if kind == "max":
            best = int(np.argmax(values)) if len(values) else 0
            y[(n, c, *o)] = values[best] if len(values) else -np.inf
            idx[(n, c, *o)] = (n * x.shape[1] + c) * math.prod(x.shape[2:]) + where[best]
        elif kind == "avg":
            count = len(values) + (padded if attrs.get("count_include_pad") else 0)
            y[(n, c, *o)] = values.sum() / count
        else:
            p = attrs.get("p", 2)
            y[(n, c, *o)] = (np.abs(values) ** p).sum() ** (1 / p)
    return y, idx


# ------------------------------------------------------------------------- windowed pools vs onnx.reference

POOL_CASES = [
    ((1, 3, 7, 7), dict(kernel_shape=[3, 3])),
    ((2, 3, 9, 8), dict(kernel_shape=[3, 2], pads=[1, 0, 1, 1], strides=[2, 1])),
    ((2, 3, 9, 8), dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[2, 2], ceil_mode=1)),
    ((1, 3, 7, 7), dict(kernel_shape=[3, 3], auto_pad="VALID", strides=[2, 2])),
    ((1, 3, 8, 8), dict(kernel_shape=[3, 3], auto_pad="SAME_UPPER", strides=[2, 2])),
    ((1, 3, 9, 9), dict(kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1)),
    ((1, 4, 112, 112), dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[2, 2])),
    ((1, 2, 10), dict(kernel_shape=[3], auto_pad="SAME_UPPER", strides=[2])),
]


@pytest.mark.parametrize("xs,attrs", POOL_CASES)
def test_maxpool(xs, attrs):
    check("MaxPool", [rand(*xs)], attrs, n_outputs=1)


@pytest.mark.parametrize("opset", [7, 11, 19])
@pytest.mark.parametrize("include_pad", [0, 1])
@pytest.mark.parametrize("xs,attrs", POOL_CASES)
def test_averagepool(xs, attrs, include_pad, opset):
    if attrs.get("ceil_mode") and opset < 10:
        pytest.skip("ceil_mode is opset 10+")
    check("AveragePool", [rand(*xs)], dict(attrs, count_include_pad=include_pad), opset=opset)


@pytest.mark.parametrize("storage_order", [0, 1])
@pytest.mark.parametrize("attrs", [dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[2, 2]),
                                   dict(kernel_shape=[2, 3], strides=[1, 2], dilations=[2, 1])])
def test_maxpool_indices(attrs, storage_order):
    """onnx.reference gets Indices right only on its strided/dilated path; these cases take it."""
    check("MaxPool", [rand(2, 3, 9, 8)], dict(attrs, storage_order=storage_order), n_outputs=2)


@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.float64, np.float16])
def test_maxpool_dtypes(dtype):
    check("MaxPool", [rand(2, 3, 9, 8, dtype=dtype)],
          dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[2, 2]), opset=12, n_outputs=1)


def test_maxpool_opset1_has_one_output():
    got = run_kernel("MaxPool", [rand(1, 2, 5, 5)], dict(kernel_shape=[2, 2]), opset=1)
    assert len(got) == 1


@pytest.mark.parametrize("xs,attrs", [((2, 3, 5, 6), dict(kernel_shape=[2, 3], strides=[1, 2])),
                                      ((1, 2, 7, 7), dict(kernel_shape=[3, 3], p=3, strides=[2, 2]))])
def test_lppool(xs, attrs):
    check("LpPool", [rand(*xs)], attrs, rtol=1e-4)


# ------------------------------------------------------------------------- windowed pools vs the spec model

@st.composite
def pool_problems(draw):
    nd = draw(st.integers(1, 3))
    kernel = [draw(st.integers(1, 3)) for _ in range(nd)]
    dil = [draw(st.integers(1, 2)) for _ in range(nd)]
    strides = [draw(st.integers(1, 3)) for _ in range(nd)]
    size = [draw(st.integers((k - 1) * d + 1, 7)) for k, d in zip(kernel, dil)]
    attrs = dict(kernel_shape=kernel, strides=strides, dilations=dil)
    auto_pad = draw(st.sampled_from(["NOTSET", "NOTSET", "VALID", "SAME_UPPER", "SAME_LOWER"]))
    if auto_pad == "NOTSET":
        attrs["pads"] = [draw(st.integers(0, k - 1)) for k in kernel * 2]
        attrs["ceil_mode"] = draw(st.integers(0, 1))
    else:
        attrs["auto_pad"] = auto_pad
    attrs["storage_order"] = draw(st.integers(0, 1))
    return (draw(st.integers(1, 2)), draw(st.integers(1, 2)), *size), attrs


@settings(max_examples=60, deadline=None)
@given(pool_problems())
def test_maxpool_random(problem):
    xs, attrs = problem
    x = rand(*xs)
    y, indices = run_kernel("MaxPool", [x], attrs)
    want_y, want_i = spec_pool(x, "max", attrs)
    np.testing.assert_array_equal(y, want_y)
    np.testing.assert_array_equal(indices, want_i)


@settings(max_examples=60, deadline=None)
@given(pool_problems(), st.integers(0, 1))
def test_averagepool_random(problem, include_pad):
    xs, attrs = problem
    attrs = dict(attrs, count_include_pad=include_pad)
    attrs.pop("storage_order")
    x = rand(*xs)
    (y,) = run_kernel("AveragePool", [x], attrs)
    np.testing.assert_allclose(y, spec_pool(x, "avg", attrs)[0], rtol=1e-5, atol=1e-6)


@settings(max_examples=30, deadline=None)
@given(pool_problems(), st.sampled_from([1, 2, 3]))
def test_lppool_random(problem, p):
    """The spec sums |x|^p over the window; onnx.reference rescales a padded average instead."""
    xs, attrs = problem
    attrs = dict(attrs, p=p)
    attrs.pop("storage_order")
    x = rand(*xs)
    (y,) = run_kernel("LpPool", [x], attrs)
    np.testing.assert_allclose(y, spec_pool(x, "lp", attrs)[0], rtol=1e-4, atol=1e-6)


def test_pool_infer_symbolic():
    x = TensorInfo(np.dtype(np.float32), ("N", 3, None, 9))
    attrs = dict(kernel_shape=[3, 3], strides=[2, 2])
    y, indices = lookup("MaxPool", 12).infer(OpContext(attrs, 12, name="p"), [x])
    assert y.shape == ("N", 3, None, 4) and indices.dtype == np.int64


@pytest.mark.parametrize("op", ["MaxPool", "AveragePool", "LpPool"])
@pytest.mark.parametrize("xs,attrs,msg", [
    ((1, 3, 5, 5), {}, "kernel_shape"),
    ((1, 3, 5), dict(kernel_shape=[2, 2]), "rank"),
    ((1, 3, 2, 2), dict(kernel_shape=[3, 3]), "does not fit"),
    ((1, 3, 5, 5), dict(kernel_shape=[2, 2], auto_pad="SAME"), "auto_pad"),
])
def test_pool_shape_errors(op, xs, attrs, msg):
    with pytest.raises(ShapeError, match=msg):
        lookup(op, 21).infer(OpContext(attrs, 21, name="p"), [TensorInfo(np.dtype(np.float32), xs)])


# ----------------------------------------------------------------------------- global pools

@pytest.mark.parametrize("op", ["GlobalAveragePool", "GlobalMaxPool"])
def test_global_pools(op):
    check(op, [rand(2, 3, 5, 6)], {}, rtol=1e-5)


@pytest.mark.parametrize("op,fn", [("GlobalAveragePool", np.mean), ("GlobalMaxPool", np.max)])
@pytest.mark.parametrize("xs", [(1, 4, 7), (1, 2, 3, 4, 2), (2, 3, 1, 1)])
def test_global_pools_any_rank(op, fn, xs):
    """onnx.reference's GlobalMaxPool assumes 2 spatial dims: compare with numpy."""
    x = rand(*xs)
    (y,) = run_kernel(op, [x], {})
    np.testing.assert_allclose(y, fn(x, axis=tuple(range(2, x.ndim)), keepdims=True), rtol=1e-5)


@pytest.mark.parametrize("opset,p", [(1, 2.0), (2, 1), (2, 2), (2, 3)])
@pytest.mark.parametrize("xs", [(2, 3, 5, 6), (1, 4, 7)])
def test_global_lppool(xs, opset, p):
    """onnx.reference has no GlobalLpPool: compare with the spec's (sum |x|^p)^(1/p)."""
    x = rand(*xs)
    (y,) = run_kernel("GlobalLpPool", [x], dict(p=p), opset=opset)
    axes = tuple(range(2, x.ndim))
    want = (np.abs(x.astype(np.float64)) ** p).sum(axis=axes, keepdims=True) ** (1 / p)
    np.testing.assert_allclose(y, want, rtol=1e-5)


# ----------------------------------------------------------------------------- MaxRoiPool, MaxUnpool

def spec_roi_pool(x, rois, pooled, scale):
    """Fast R-CNN RoI max pooling, one bin at a time."""
    ph, pw = pooled
    y = np.zeros((len(rois), x.shape[1], ph, pw), x.dtype)
    for r, roi in enumerate(rois):
        x1, y1, x2, y2 = (int(np.sign(v) * math.floor(abs(v) * scale + 0.5)) for v in roi[1:])
        bh, bw = max(y2 - y1 + 1, 1) / ph, max(x2 - x1 + 1, 1) / pw
        for i, j in itertools.product(range(ph), range(pw)):
            h0 = min(max(math.floor(i * bh) + y1, 0), x.shape[2])
            h1 = min(max(math.ceil((i + 1) * bh) + y1, 0), x.shape[2])
            w0 = min(max(math.floor(j * bw) + x1, 0), x.shape[3])
            w1 = min(max(math.ceil((j + 1) * bw) + x1, 0), x.shape[3])
            if h1 > h0 and w1 > w0:
                y[r, :, i, j] = x[int(roi[0]), :, h0:h1, w0:w1].max(axis=(1, 2))
    return y


@pytest.mark.parametrize("scale", [1.0, 0.5])
def test_maxroipool(scale):
    x = rand(2, 3, 10, 12)
    rois = np.array([[0, 0, 0, 9, 9], [1, 2, 3, 7, 8], [1, 5, 5, 5, 5], [0, -4, 2, 30, 40],
                     [0, 11, 9, 11, 9]], np.float32)
    attrs = dict(pooled_shape=[3, 2], spatial_scale=scale)
    (y,) = run_kernel("MaxRoiPool", [x, rois], attrs)
    np.testing.assert_array_equal(y, spec_roi_pool(x, rois, (3, 2), scale))


def test_maxunpool_roundtrip():
    x = rand(2, 3, 6, 8)
    attrs = dict(kernel_shape=[2, 2], strides=[2, 2])
    y, indices = run_kernel("MaxPool", [x], attrs)
    check("MaxUnpool", [y, indices], attrs, const=[])


def test_maxunpool_output_shape():
    """The spec example: indices address the default 4x4 unpooled tensor, padded out to 5x5."""
    x = np.array([[[[5, 6], [7, 8]]]], np.float32)
    indices = np.array([[[[5, 7], [13, 15]]]], np.int64)
    shape = np.array([1, 1, 5, 5], np.int64)
    attrs = dict(kernel_shape=[2, 2], strides=[2, 2])
    (y,) = check("MaxUnpool", [x, indices, shape], attrs, const=[2])
    assert y[0, 0, 1, 1] == 5 and y[0, 0, 3, 3] == 8 and y.sum() == 26


FLAT_CASES = [
    ((2, 3, 9, 10), dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1])),
    ((1, 2, 8, 8), dict(kernel_shape=[2, 2], strides=[2, 2])),
    ((1, 2, 10, 12), dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])),
    ((1, 2, 11, 12), dict(kernel_shape=[3, 3], strides=[1, 2], pads=[0, 1, 0, 0], ceil_mode=1)),
    ((1, 2, 12, 13), dict(kernel_shape=[3, 3], dilations=[2, 2], pads=[2, 2, 2, 2])),
    ((1, 2, 16), dict(kernel_shape=[5], pads=[3, 1])),
    ((1, 2, 6, 7, 8), dict(kernel_shape=[3, 3, 3], pads=[1, 1, 1, 1, 1, 1])),
    ((1, 2, 12, 12), dict(kernel_shape=[3, 3], auto_pad="SAME_LOWER")),
]


@pytest.mark.parametrize("xs,attrs", FLAT_CASES)
def test_pools_flat_stages(xs, attrs):
    """Windows whose stages run as flat 1-d shifts plus recomputed edges."""
    cls, ctx, infos = lookup("MaxPool", 12), OpContext(attrs, 12), [TensorInfo(np.dtype(np.float32), xs)]
    assert any(stage.shifts for stage in cls(ctx, infos, cls.infer(ctx, infos)).stages)
    x = rand(*xs)
    (y, _) = run_kernel("MaxPool", [x], attrs)
    np.testing.assert_array_equal(y, spec_pool(x, "max", attrs)[0])
    for include_pad in (0, 1):
        avg = dict(attrs, count_include_pad=include_pad)
        (y,) = run_kernel("AveragePool", [x], avg)
        np.testing.assert_allclose(y, spec_pool(x, "avg", avg)[0], rtol=1e-5, atol=1e-6)
    (y,) = run_kernel("LpPool", [x], dict(attrs, p=2))
    np.testing.assert_allclose(y, spec_pool(x, "lp", dict(attrs, p=2))[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("cap", [1, 800])
@pytest.mark.parametrize("xs,attrs", [FLAT_CASES[0], FLAT_CASES[6], POOL_CASES[2]])
def test_pools_in_plane_blocks(monkeypatch, cap, xs, attrs):
    """Small workspace caps make the pools reduce a few (N, C) planes at a time."""
    monkeypatch.setattr(window, "WORKSPACE_CAP", cap)
    x = rand(*xs)
    (y, _) = run_kernel("MaxPool", [x], attrs)
    np.testing.assert_array_equal(y, spec_pool(x, "max", attrs)[0])
    (y,) = run_kernel("AveragePool", [x], attrs)
    np.testing.assert_allclose(y, spec_pool(x, "avg", attrs)[0], rtol=1e-5, atol=1e-6)
