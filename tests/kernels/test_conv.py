"""Convolution kernels against onnx.reference: Conv (im2col, chunked, 1x1 and depthwise paths)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import omrt.kernels.conv as conv
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
    monkeypatch.setattr(conv, "WORKSPACE_CAP", cap)
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


# ----------------------------------------------------------------------------- ConvTranspose

def ort_run(op, inputs, attrs, opset=17):
    """onnxruntime's output for one node: the oracle where onnx.reference is incomplete."""
    ort = pytest.importorskip("onnxruntime")
    import onnx
    from onnx import helper

    names = [f"x{i}" for i in range(len(inputs))]
    node = helper.make_node(op, names, ["y"], **attrs)
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
         for n, a in zip(names, inputs)],
        [helper.make_value_info("y", onnx.TypeProto())])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, dict(zip(names, inputs)))[0]


CONVT_CASES = [
    ((1, 3, 4, 4), (3, 2, 3, 3), {}),
    ((2, 4, 5, 4), (4, 3, 3, 3), dict(strides=[2, 2], pads=[1, 0, 1, 1])),
    ((1, 2, 5, 4), (2, 3, 3, 2), dict(strides=[2, 3], output_padding=[1, 1], dilations=[2, 1])),
    ((1, 2, 5, 4), (2, 3, 3, 3), dict(strides=[2, 2], auto_pad="SAME_UPPER")),
    ((1, 2, 5, 4), (2, 3, 4, 4), dict(strides=[2, 2], auto_pad="SAME_LOWER")),
    ((1, 2, 5), (2, 3, 4), dict(strides=[3])),
    ((1, 2, 3, 4, 3), (2, 2, 2, 3, 2), dict(strides=[2, 1, 2], pads=[0, 1, 0, 1, 0, 1])),
]


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("xs,ws,attrs", CONVT_CASES)
def test_convtranspose(xs, ws, attrs, bias):
    inputs = [rand(*xs), rand(*ws)] + ([rand(ws[1] * attrs.get("group", 1))] if bias else [])
    check("ConvTranspose", inputs, attrs, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("xs,ws,attrs", [
    ((2, 4, 5, 4), (4, 3, 3, 3), dict(group=2, strides=[2, 2], pads=[1, 0, 1, 1])),
    ((1, 6, 4, 3), (6, 2, 2, 3), dict(group=3, strides=[1, 2], output_padding=[0, 1])),
    ((1, 2, 5, 4), (2, 3, 3, 3), dict(strides=[2, 2], output_shape=[10, 8])),
    ((1, 2, 5, 4), (2, 3, 3, 3), dict(strides=[2, 2], output_shape=[12, 9])),
    ((1, 2, 5, 4), (2, 3, 3, 3), dict(strides=[2, 2], output_shape=[10, 8], auto_pad="SAME_UPPER")),
    ((1, 4, 5, 5), (4, 1, 3, 3), dict(group=4, strides=[2, 2])),
])
def test_convtranspose_vs_onnxruntime(xs, ws, attrs):
    """onnx.reference mishandles group > 1 (weights and bias) and output_shape without auto_pad."""
    inputs = [rand(*xs), rand(*ws), rand(ws[1] * attrs.get("group", 1))]
    (got,) = run_kernel("ConvTranspose", inputs, attrs)
    np.testing.assert_allclose(got, ort_run("ConvTranspose", inputs, attrs), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("cap", [1, 500])
def test_convtranspose_chunked(monkeypatch, cap):
    monkeypatch.setattr(conv, "WORKSPACE_CAP", cap)
    inputs = [rand(2, 3, 5, 4), rand(3, 2, 3, 3), rand(2)]
    check("ConvTranspose", inputs, dict(strides=[2, 1], pads=[1, 1, 0, 2]), rtol=1e-4, atol=1e-4)


@st.composite
def convt_problems(draw):
    nd = draw(st.integers(1, 3))
    kernel = [draw(st.integers(1, 3)) for _ in range(nd)]
    dil = [draw(st.integers(1, 2)) for _ in range(nd)]
    strides = [draw(st.integers(1, 3)) for _ in range(nd)]
    extra = [draw(st.integers(0, s - 1)) for s in strides]
    pads = [draw(st.integers(0, k - 1)) for k in kernel * 2]
    x = (draw(st.integers(1, 2)), draw(st.integers(1, 3)), *(draw(st.integers(1, 5)) for _ in range(nd)))
    w = (x[1], draw(st.integers(1, 3)), *kernel)
    out = [(n - 1) * s + e + (k - 1) * d + 1 - pads[i] - pads[i + nd]
           for i, (n, s, e, k, d) in enumerate(zip(x[2:], strides, extra, kernel, dil))]
    assume(min(out) >= 1)
    return x, w, dict(strides=strides, dilations=dil, output_padding=extra, pads=pads)


@settings(max_examples=40, deadline=None)
@given(convt_problems())
def test_convtranspose_random(problem):
    xs, ws, attrs = problem
    inputs = [rand(*xs), rand(*ws), rand(ws[1])]
    check("ConvTranspose", inputs, attrs, rtol=1e-4, atol=1e-4)


def test_convtranspose_fused_activation():
    inputs = [rand(1, 3, 4, 4), rand(3, 2, 3, 3), rand(2)]
    attrs = dict(strides=[2, 2])
    want = np.maximum(reference("ConvTranspose", inputs, attrs)[0], 0)
    got = run_kernel("ConvTranspose", inputs, dict(attrs, _act="Relu"))[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_convtranspose_shape_errors():
    f = np.dtype(np.float32)
    with pytest.raises(ShapeError, match="dim 0"):
        _infer("ConvTranspose", [TensorInfo(f, (1, 3, 4, 4)), TensorInfo(f, (2, 2, 3, 3))], {})
    with pytest.raises(ShapeError, match="group"):
        _infer("ConvTranspose", [TensorInfo(f, (1, 3, 4, 4)), TensorInfo(f, (3, 2, 3, 3))],
               dict(group=2))
    with pytest.raises(ShapeError, match="spatial dims"):
        _infer("ConvTranspose", [TensorInfo(f, (1, 3, 4, 4)), TensorInfo(f, (3, 2, 3, 3))],
               dict(output_shape=[1, 2, 6, 6]))
    with pytest.raises(ShapeError, match="would be"):
        _infer("ConvTranspose", [TensorInfo(f, (1, 3, 1, 1)), TensorInfo(f, (3, 2, 1, 1))],
               dict(pads=[1, 1, 0, 0]))


# ----------------------------------------------------------------------------- Col2Im, DeformConv

@pytest.mark.parametrize("xs,image,block,attrs", [
    ((1, 8, 9), [5, 5], [2, 2], dict(strides=[2, 2], pads=[1, 1, 1, 1])),
    ((2, 18, 12), [5, 4], [2, 3], dict(dilations=[2, 1], pads=[0, 1, 0, 1])),
    ((1, 6, 20), [5, 5], [1, 2], {}),
])
def test_col2im(xs, image, block, attrs):
    check("Col2Im", [rand(*xs), np.array(image), np.array(block)], attrs, const=[1, 2], opset=18)


def test_col2im_block_count_mismatch():
    i64 = np.dtype(np.int64)
    infos = [TensorInfo(np.dtype(np.float32), (1, 8, 10)), TensorInfo.of(np.array([5, 5])),
             TensorInfo.of(np.array([2, 2]))]
    with pytest.raises(ShapeError, match="blocks"):
        _infer("Col2Im", infos, dict(strides=[2, 2], pads=[1, 1, 1, 1]), opset=18)
    (y,) = _infer("Col2Im", [infos[0], TensorInfo(i64, (2,)), infos[2]], {}, opset=18)
    assert y.shape == (1, None, None, None)


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("xs,ws,attrs", [
    ((1, 2, 5, 5), (3, 2, 3, 3), {}),
    ((2, 4, 6, 5), (4, 2, 2, 3), dict(group=2, pads=[1, 0, 1, 1], strides=[2, 1], offset_group=2)),
    ((1, 2, 7, 7), (2, 2, 3, 3), dict(dilations=[2, 2], pads=[1, 1, 1, 1])),
])
def test_deformconv(xs, ws, attrs, masked):
    (y,) = _infer("DeformConv", [TensorInfo.of(rand(*xs)), TensorInfo.of(rand(*ws))], attrs, opset=19)
    groups, taps = attrs.get("offset_group", 1), ws[2] * ws[3]
    offset = rand(xs[0], groups * taps * 2, *y.shape[2:]) * 2
    inputs = [rand(*xs), rand(*ws), offset]
    if masked:
        inputs += [rand(ws[0]), rng.random((xs[0], groups * taps, *y.shape[2:])).astype(np.float32)]
    check("DeformConv", inputs, attrs, opset=19, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("op", ["Conv", "ConvTranspose"])
def test_unknown_auto_pad_is_refused(op):
    x, w = TensorInfo(np.dtype(np.float32), (1, 2, 5, 5)), TensorInfo(np.dtype(np.float32), (2, 2, 3, 3))
    ctx = OpContext({"auto_pad": "SAME"}, 11, name="n", op_type=op)
    with pytest.raises(ShapeError, match=r"n: auto_pad='SAME' is not one of NOTSET, VALID, SAME_UPPER, "
                                         r"SAME_LOWER"):
        lookup(op, 11).infer(ctx, [x, w])
