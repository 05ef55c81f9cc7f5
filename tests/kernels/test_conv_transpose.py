"""ConvTranspose, Col2Im and DeformConv against onnx.reference (and onnxruntime where the reference
falls short)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import omrt.kernels.window as window
from omrt.errors import ShapeError
from omrt.kernels import OpContext, TensorInfo, lookup
from tests.kernel_check import check, reference, run_kernel

rng = np.random.default_rng(0)


def rand(*shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


def _infer(op, infos, attrs, opset=21):
    return lookup(op, opset).infer(OpContext(attrs, opset, name="n", op_type=op), infos)


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
    monkeypatch.setattr(window, "WORKSPACE_CAP", cap)
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
