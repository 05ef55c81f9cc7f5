"""Convolution kernels against onnx.reference: Conv (im2col, chunked, 1x1 and depthwise paths)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import omrt.kernels.window as window
from omrt.errors import ShapeError
from omrt.kernels import OpContext, TensorInfo, lookup
from tests.kernel_check import check, reference, run_kernel

rng = np.random.default_rng(0)


def rand(*shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


CONV_CASES = [
    ((1, 3, 7, 7), (4, 3, 3, 3), {}),
    ((2, 4, 9, 8), (6, 2, 3, 3), dict(group=2, pads=[1, 0, 2, 1], strides=[2, 1])),
    ((1, 4, 9, 8), (4, 1, 3, 3), dict(group=4, pads=[1, 1, 1, 1])),
    ((2, 4, 9, 8), (8, 1, 3, 2), dict(group=4, pads=[1, 0, 2, 1], strides=[2, 3], dilations=[2, 1])),
    ((1, 3, 10), (5, 3, 3), dict(auto_pad="SAME_UPPER", strides=[2])),
    ((1, 3, 10), (5, 3, 4), dict(auto_pad="SAME_LOWER", strides=[3])),
    ((1, 3, 11, 9), (2, 3, 3, 4), dict(auto_pad="SAME_LOWER", dilations=[2, 1])),
    ((1, 2, 5, 6, 7), (3, 2, 2, 3, 2), dict(pads=[1, 0, 1, 0, 1, 1])),
    ((2, 6, 5, 5), (4, 3, 1, 1), dict(group=2)),
    ((2, 6, 5, 5), (4, 6, 1, 1), dict(strides=[2, 2])),
    ((1, 3, 7, 7), (4, 3, 3, 3), dict(auto_pad="VALID", strides=[2, 2])),
    ((1, 3, 7, 7), (4, 3, 3, 3), dict(kernel_shape=[3, 3], pads=[4, 4, 4, 4])),
    ((1, 2, 3, 3), (2, 2, 5, 5), dict(pads=[2, 2, 2, 2], strides=[3, 3])),
]


@pytest.mark.parametrize("opset", [1, 11, 21])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("xs,ws,attrs", CONV_CASES)
def test_conv(xs, ws, attrs, bias, opset):
    inputs = [rand(*xs), rand(*ws)] + ([rand(ws[0])] if bias else [])
    check("Conv", inputs, attrs, opset=opset, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype,tol", [(np.float64, 1e-10), (np.float16, 2e-2)])
def test_conv_dtypes(dtype, tol):
    inputs = [rand(2, 4, 6, 6, dtype=dtype), rand(4, 2, 3, 3, dtype=dtype), rand(4, dtype=dtype)]
    check("Conv", inputs, dict(group=2, pads=[1, 1, 1, 1]), rtol=tol, atol=tol)


@pytest.mark.parametrize("cap", [1, 700, 3000])
@pytest.mark.parametrize("xs,ws,attrs", [
    ((2, 3, 9, 7), (4, 3, 3, 3), dict(pads=[1, 2, 1, 0], strides=[1, 2])),
    ((1, 2, 7, 4, 5), (4, 2, 3, 2, 2), dict(pads=[1, 0, 1, 2, 1, 1], strides=[2, 1, 1])),
    ((1, 6, 8, 8), (6, 1, 3, 3), dict(group=6, pads=[1, 1, 1, 1], strides=[2, 2])),
    ((2, 3, 9, 7), (4, 3, 3, 3), dict(pads=[1, 1, 1, 1])),
    ((1, 4, 9, 7), (4, 2, 3, 5), dict(group=2, pads=[2, 4, 2, 4], dilations=[2, 2])),
    ((1, 2, 5, 4, 6), (3, 2, 3, 3, 3), dict(auto_pad="SAME_LOWER")),
    ((1, 3, 11), (2, 3, 4), dict(auto_pad="SAME_UPPER")),
])
def test_conv_chunked(monkeypatch, cap, xs, ws, attrs):
    """Small workspace caps split im2col into row chunks, down to one output row per chunk.

    The stride-1 "same" cases gather each tap as one shifted run per channel (then zero the edges).
    """
    monkeypatch.setattr(window, "WORKSPACE_CAP", cap)
    check("Conv", [rand(*xs), rand(*ws), rand(ws[0])], attrs, rtol=1e-4, atol=1e-4)


def _activate(y, act, alpha, beta):
    return {
        "Relu": lambda: np.maximum(y, 0),
        "LeakyRelu": lambda: np.where(y < 0, y * alpha, y),
        "Clip": lambda: np.clip(y, alpha, beta),
        "Sigmoid": lambda: 1 / (1 + np.exp(-y)),
        "Tanh": lambda: np.tanh(y),
        "HardSigmoid": lambda: np.clip(y * alpha + beta, 0, 1),
    }[act]()


@pytest.mark.parametrize("act,alpha,beta", [("Relu", None, None), ("LeakyRelu", 0.1, None),
                                            ("Clip", -0.5, 0.7), ("Sigmoid", None, None),
                                            ("Tanh", None, None), ("HardSigmoid", 0.2, 0.5)])
@pytest.mark.parametrize("ws,attrs", [((5, 3, 3, 3), dict(pads=[1, 1, 1, 1])), ((5, 3, 1, 1), {})])
def test_conv_fused_activation(act, alpha, beta, ws, attrs):
    inputs = [rand(2, 3, 6, 5), rand(*ws), rand(ws[0])]
    want = _activate(reference("Conv", inputs, attrs)[0], act, alpha, beta)
    got = run_kernel("Conv", inputs, dict(attrs, _act=act, _act_alpha=alpha, _act_beta=beta))[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@st.composite
def conv_problems(draw):
    nd = draw(st.integers(1, 3))
    group = draw(st.sampled_from([1, 1, 2, 3]))
    cg, mg = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    kernel = [draw(st.integers(1, 3)) for _ in range(nd)]
    dil = [draw(st.integers(1, 2)) for _ in range(nd)]
    strides = [draw(st.integers(1, 3)) for _ in range(nd)]
    size = [draw(st.integers((k - 1) * d + 1, 8)) for k, d in zip(kernel, dil)]
    attrs = dict(group=group, strides=strides, dilations=dil)
    auto_pad = draw(st.sampled_from(["NOTSET", "NOTSET", "VALID", "SAME_UPPER", "SAME_LOWER"]))
    if auto_pad == "NOTSET":
        attrs["pads"] = [draw(st.integers(0, k - 1)) for k in kernel * 2]
    else:
        attrs["auto_pad"] = auto_pad
    x = (draw(st.integers(1, 2)), cg * group, *size)
    w = (mg * group, cg, *kernel)
    return x, w, attrs, draw(st.booleans())


@settings(max_examples=60, deadline=None)
@given(conv_problems())
def test_conv_random(problem):
    xs, ws, attrs, bias = problem
    inputs = [rand(*xs), rand(*ws)] + ([rand(ws[0])] if bias else [])
    check("Conv", inputs, attrs, rtol=1e-4, atol=1e-4)


def test_conv_empty_batch():
    y = run_kernel("Conv", [rand(0, 3, 5, 5), rand(2, 3, 3, 3)], {})[0]
    assert y.shape == (0, 2, 3, 3)


def _infer(op, infos, attrs, opset=21):
    return lookup(op, opset).infer(OpContext(attrs, opset, name="n", op_type=op), infos)


def test_conv_infer_symbolic():
    x = TensorInfo(np.dtype(np.float32), ("N", 3, None, 8))
    w = TensorInfo(np.dtype(np.float32), (4, 3, 3, 3))
    (y,) = _infer("Conv", [x, w], dict(pads=[1, 1, 1, 1]))
    assert y.shape == ("N", 4, None, 8) and y.dtype == np.float32


@pytest.mark.parametrize("xs,ws,attrs,msg", [
    ((1, 4, 5, 5), (2, 3, 3, 3), {}, "channels"),
    ((1, 4, 5, 5), (3, 2, 3, 3), dict(group=2), "group"),
    ((1, 3, 2, 2), (2, 3, 3, 3), {}, "does not fit"),
    ((1, 3, 5, 5), (2, 3, 3, 3), dict(pads=[1, 1]), "pads"),
    ((1, 3, 5, 5), (2, 3, 3, 3), dict(strides=[1, 1, 1]), "strides"),
    ((1, 3, 5, 5), (2, 3, 3), {}, "rank"),
])
def test_conv_shape_errors(xs, ws, attrs, msg):
    f = np.dtype(np.float32)
    with pytest.raises(ShapeError, match=msg):
        _infer("Conv", [TensorInfo(f, xs), TensorInfo(f, ws)], attrs)


@pytest.mark.parametrize("op", ["Conv", "ConvTranspose"])
def test_unknown_auto_pad_is_refused(op):
    x, w = TensorInfo(np.dtype(np.float32), (1, 2, 5, 5)), TensorInfo(np.dtype(np.float32), (2, 2, 3, 3))
    ctx = OpContext({"auto_pad": "SAME"}, 11, name="n", op_type=op)
    with pytest.raises(ShapeError, match=r"n: auto_pad='SAME' is not one of NOTSET, VALID, SAME_UPPER, "
                                         r"SAME_LOWER"):
        lookup(op, 11).infer(ctx, [x, w])
