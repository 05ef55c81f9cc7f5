"""Quantization kernels against onnx.reference (and plain numpy where the reference falls short)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto

import omrt.kernels.quantization
from omrt.errors import ShapeError
from tests.kernel_check import check, run_kernel

rng = np.random.default_rng(0)


def floats(shape, scale=10.0, dtype=np.float32):
    return (rng.standard_normal(shape) * scale).astype(dtype)


def ints(shape, dtype):
    info = np.iinfo(dtype)
    return rng.integers(info.min, int(info.max) + 1, size=shape).astype(dtype)


def scalar(v, dtype):
    return np.array(v, dtype=dtype)


# ----------------------------------------------------------------------------- QuantizeLinear

@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.uint16, np.int16])
def test_quantize_per_tensor(dtype):
    x = floats((3, 4, 5), scale=300.0)
    zp = scalar(3 if np.dtype(dtype).kind == "u" else -3, dtype)
    check("QuantizeLinear", [x, scalar(0.7, np.float32), zp])


def test_quantize_rounds_half_to_even_and_saturates():
    x = np.array([0.5, 1.5, 2.5, -0.5, -1.5, 1000.0, -1000.0, 0.0], np.float32)
    got = check("QuantizeLinear", [x, scalar(1.0, np.float32), scalar(0, np.int8)])[0]
    np.testing.assert_array_equal(got, [0, 2, 2, 0, -2, 127, -128, 0])


def test_quantize_without_zero_point_is_uint8():
    check("QuantizeLinear", [floats((2, 3)), scalar(0.1, np.float32)])


def test_quantize_output_dtype_attribute():
    got = check("QuantizeLinear", [floats((2, 3)), scalar(0.1, np.float32)],
                {"output_dtype": TensorProto.INT16})
    assert got[0].dtype == np.int16


@pytest.mark.parametrize("axis", [0, 1, -1, -3])
def test_quantize_per_axis(axis):
    x = floats((3, 4, 5))
    n = x.shape[axis]
    scale = rng.uniform(0.05, 0.5, n).astype(np.float32)
    zp = rng.integers(-10, 10, n).astype(np.int8)
    check("QuantizeLinear", [x, scale, zp], {"axis": axis}, opset=13)


@pytest.mark.parametrize("dim,block", [(6, 3), (7, 3), (2, 4)])
def test_quantize_blocked(dim, block):
    x = floats((2, dim, 3))
    nblocks = -(-dim // block)
    scale = rng.uniform(0.05, 0.5, (2, nblocks, 3)).astype(np.float32)
    zp = rng.integers(0, 20, (2, nblocks, 3)).astype(np.uint8)
    check("QuantizeLinear", [x, scale, zp], {"axis": 1, "block_size": block})
    check("QuantizeLinear", [x, scale], {"axis": 1, "block_size": block})


def test_quantize_int32_and_float16_inputs():
    check("QuantizeLinear", [rng.integers(-500, 500, (4, 4)).astype(np.int32), scalar(3.0, np.float32),
                             scalar(1, np.int8)], opset=13)
    check("QuantizeLinear", [floats((4, 4), dtype=np.float16), scalar(0.25, np.float16),
                             scalar(7, np.uint8)], opset=19)


def test_quantize_precision_attribute():
    x = floats((8,), dtype=np.float16)
    check("QuantizeLinear", [x, scalar(0.3, np.float32), scalar(0, np.int8)],
          {"precision": TensorProto.FLOAT}, opset=23)


@pytest.mark.parametrize("saturate", [0, 1])
@pytest.mark.parametrize("dtype", [ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2])
def test_quantize_float8(dtype, saturate):
    x = np.array([0.0, 1.0, -3.5, 100.0, 1e5, -1e5, 0.3], np.float32)
    got = run_kernel("QuantizeLinear", [x, scalar(1.0, np.float32), np.zeros((), dtype)],
                     {"saturate": saturate})[0]
    want = check("QuantizeLinear", [x, scalar(1.0, np.float32), np.zeros((), dtype)],
                 {"saturate": saturate}, atol=0)[0]
    np.testing.assert_array_equal(got.astype(np.float32), want.astype(np.float32))


@pytest.mark.parametrize("dtype", [ml_dtypes.int4, ml_dtypes.uint4])
def test_quantize_and_dequantize_4bit(dtype):
    x = floats((4, 6), scale=5.0)
    q = run_kernel("QuantizeLinear", [x, scalar(0.5, np.float32), np.zeros((), dtype)])[0]
    assert q.dtype == dtype
    low, high = (-8, 7) if dtype == ml_dtypes.int4 else (0, 15)
    want = np.clip(np.rint(x / 0.5), low, high)
    np.testing.assert_array_equal(q.astype(np.float32), want)
    y = run_kernel("DequantizeLinear", [q, scalar(0.5, np.float32), np.zeros((), dtype)])[0]
    np.testing.assert_array_equal(y, want * 0.5)


def test_quantize_empty_tensor():
    got = check("QuantizeLinear", [np.zeros((0, 3), np.float32), scalar(1.0, np.float32),
                                   scalar(0, np.uint8)])
    assert got[0].shape == (0, 3)


def test_quantize_bad_scale_shape():
    with pytest.raises(ShapeError, match="axis"):
        run_kernel("QuantizeLinear", [floats((3, 4)), np.ones(5, np.float32)], {"axis": 1})
    with pytest.raises(ShapeError, match="block_size"):
        run_kernel("QuantizeLinear", [floats((3, 4)), np.ones((3, 3), np.float32)],
                   {"axis": 1, "block_size": 3})


@settings(max_examples=30, deadline=None)
@given(shape=st.lists(st.integers(1, 5), min_size=1, max_size=4), data=st.data())
def test_quantize_per_axis_any_shape(shape, data):
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    x = floats(shape)
    n = shape[axis]
    scale = rng.uniform(0.05, 1.0, n).astype(np.float32)
    zp = rng.integers(0, 255, n).astype(np.uint8)
    check("QuantizeLinear", [x, scale, zp], {"axis": axis})
    check("DequantizeLinear", [ints(shape, np.uint8), scale, zp], {"axis": axis})


# ----------------------------------------------------------------------------- DequantizeLinear

@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.uint16, np.int16])
def test_dequantize_per_tensor(dtype):
    x = ints((3, 4), dtype)
    check("DequantizeLinear", [x, scalar(0.02, np.float32), ints((), dtype)])
    check("DequantizeLinear", [x, scalar(0.02, np.float32)])


def test_dequantize_int32_without_zero_point():
    x = rng.integers(-(1 << 20), 1 << 20, (5, 2)).astype(np.int32)
    want = check("DequantizeLinear", [x, scalar(0.001, np.float32)], opset=19)[0]
    got = run_kernel("DequantizeLinear", [x, scalar(0.001, np.float32)], opset=10)[0]
    np.testing.assert_array_equal(got, want)


def test_dequantize_float16_scale_and_output_dtype():
    x = ints((3, 4), np.uint8)
    got = check("DequantizeLinear", [x, scalar(0.5, np.float16), scalar(128, np.uint8)], opset=19)
    assert got[0].dtype == np.float16
    got = check("DequantizeLinear", [x, scalar(0.5, np.float16), scalar(128, np.uint8)],
                {"output_dtype": TensorProto.FLOAT}, opset=23)
    assert got[0].dtype == np.float32


@pytest.mark.parametrize("axis", [0, -1])
def test_dequantize_per_axis(axis):
    x = ints((4, 3), np.int8)
    n = x.shape[axis]
    check("DequantizeLinear", [x, rng.uniform(0.1, 1, n).astype(np.float32),
                               rng.integers(-5, 5, n).astype(np.int8)], {"axis": axis}, opset=19)


def test_dequantize_blocked():
    x = ints((2, 7), np.uint8)
    scale = rng.uniform(0.1, 1, (2, 3)).astype(np.float32)
    zp = rng.integers(0, 20, (2, 3)).astype(np.uint8)
    check("DequantizeLinear", [x, scale, zp], {"axis": -1, "block_size": 3})


def test_dequantize_float8_ignores_zero_point():
    x = np.array([1.0, -2.0, 448.0, 0.125], np.float32).astype(ml_dtypes.float8_e4m3fn)
    check("DequantizeLinear", [x, scalar(2.0, np.float32), np.zeros((), ml_dtypes.float8_e4m3fn)])


# ----------------------------------------------------------------------------- DynamicQuantizeLinear

@pytest.mark.parametrize("x", [
    floats((3, 4)),
    np.abs(floats((6,))) + 1,
    -np.abs(floats((2, 2, 2))) - 1,
    np.zeros((3,), np.float32),
])
def test_dynamic_quantize(x):
    check("DynamicQuantizeLinear", [x], n_outputs=3)


def test_dynamic_quantize_empty():
    y, scale, zp = run_kernel("DynamicQuantizeLinear", [np.zeros((0, 2), np.float32)])
    assert y.shape == (0, 2) and zp == 0 and scale > 0


# ----------------------------------------------------------------------------- integer MatMul

@pytest.mark.parametrize("a_shape,b_shape", [((3, 4), (4, 5)), ((2, 3, 4), (4, 5)),
                                             ((2, 1, 3, 4), (3, 4, 2)), ((4,), (4, 3)), ((2, 4), (4,)),
                                             ((0, 4), (4, 2))])
def test_matmul_integer(a_shape, b_shape):
    a, b = ints(a_shape, np.uint8), ints(b_shape, np.int8)
    check("MatMulInteger", [a, b, scalar(12, np.uint8), scalar(-3, np.int8)])
    check("MatMulInteger", [a, b])


def test_matmul_integer_large_k_is_exact():
    a, b = ints((2, 3000), np.uint8), ints((3000, 3), np.uint8)
    got = run_kernel("MatMulInteger", [a, b, scalar(255, np.uint8), scalar(0, np.uint8)])[0]
    np.testing.assert_array_equal(got, (a.astype(np.int64) - 255) @ b.astype(np.int64))


def test_matmul_integer_per_row_and_column_zero_points():
    a, b = ints((3, 4), np.int8), ints((4, 5), np.uint8)
    za, zb = ints((3,), np.int8), ints((5,), np.uint8)
    got = run_kernel("MatMulInteger", [a, b, za, zb])[0]
    want = (a.astype(np.int32) - za[:, None]) @ (b.astype(np.int32) - zb)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
@pytest.mark.parametrize("opset", [10, 21])
def test_qlinear_matmul(dtype, opset):
    a, b = ints((2, 3, 4), dtype), ints((4, 5), dtype)
    args = [a, scalar(0.05, np.float32), ints((), dtype), b, scalar(0.02, np.float32), ints((), dtype),
            scalar(0.1, np.float32), ints((), dtype)]
    check("QLinearMatMul", args, opset=opset)


def test_qlinear_matmul_float16_scales():
    a, b = ints((3, 4), np.uint8), ints((4, 2), np.uint8)
    args = [a, scalar(0.05, np.float16), scalar(100, np.uint8), b, scalar(0.02, np.float16),
            scalar(120, np.uint8), scalar(0.1, np.float16), scalar(10, np.uint8)]
    check("QLinearMatMul", args, opset=21)


def test_qlinear_matmul_per_row_and_column():
    a, b = ints((3, 4), np.uint8), ints((4, 5), np.int8)
    sa, za = rng.uniform(0.01, 0.1, 3).astype(np.float32), ints((3,), np.uint8)
    sb, zb = rng.uniform(0.01, 0.1, 5).astype(np.float32), ints((5,), np.int8)
    sy, zy = scalar(0.2, np.float32), scalar(5, np.int8)
    got = run_kernel("QLinearMatMul", [a, sa, za, b, sb, zb, sy, zy])[0]
    acc = (a.astype(np.int64) - za[:, None]) @ (b.astype(np.int64) - zb)
    want = np.clip(np.rint(acc * (sa[:, None] * sb / sy)) + 5, -128, 127)
    np.testing.assert_array_equal(got, want)


# ----------------------------------------------------------------------------- ConvInteger, QLinearConv

CONV_CASES = [
    ((1, 2, 5, 5), (3, 2, 3, 3), {}),
    ((2, 2, 6, 7), (4, 2, 3, 2), {"pads": [1, 0, 2, 1], "strides": [2, 1]}),
    ((1, 4, 7, 7), (4, 2, 3, 3), {"group": 2, "dilations": [2, 2]}),
    ((1, 3, 5, 6), (2, 3, 3, 3), {"auto_pad": "SAME_UPPER", "strides": [2, 2]}),
    ((1, 3, 5, 6), (2, 3, 2, 2), {"auto_pad": "SAME_LOWER"}),
    ((1, 3, 5, 6), (2, 3, 3, 3), {"auto_pad": "VALID", "strides": [1, 2]}),
    ((2, 3, 9), (4, 3, 3), {"pads": [2, 1], "strides": [2]}),
    ((1, 2, 4, 4, 4), (2, 2, 2, 2, 2), {"pads": [1, 0, 0, 0, 1, 1]}),
    ((1, 6, 4, 4), (6, 1, 3, 3), {"group": 6, "pads": [1, 1, 1, 1], "kernel_shape": [3, 3]}),
]


@pytest.mark.parametrize("x_shape,w_shape,attrs", CONV_CASES)
def test_conv_integer(x_shape, w_shape, attrs):
    x, w = ints(x_shape, np.uint8), ints(w_shape, np.int8)
    check("ConvInteger", [x, w, scalar(100, np.uint8), scalar(-2, np.int8)], attrs)
    check("ConvInteger", [x, w], attrs)


def test_conv_integer_per_channel_weight_zero_point():
    x, w = ints((1, 2, 5, 5), np.int8), ints((3, 2, 3, 3), np.uint8)
    check("ConvInteger", [x, w, scalar(-5, np.int8), ints((3,), np.uint8)], {"pads": [1, 1, 1, 1]})


@pytest.mark.parametrize("x_shape,w_shape,attrs", CONV_CASES[:6])
@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
def test_qlinear_conv(x_shape, w_shape, attrs, dtype):
    x, w = ints(x_shape, dtype), ints(w_shape, np.int8)
    m = w_shape[0]
    bias = rng.integers(-1000, 1000, m).astype(np.int32)
    args = [x, scalar(0.03, np.float32), ints((), dtype), w, scalar(0.01, np.float32),
            scalar(0, np.int8), scalar(0.5, np.float32), ints((), dtype)]
    check("QLinearConv", args, attrs)
    check("QLinearConv", args + [bias], attrs)


def test_qlinear_conv_per_channel_weights():
    x, w = ints((1, 3, 6, 6), np.uint8), ints((4, 3, 3, 3), np.int8)
    args = [x, scalar(0.03, np.float32), scalar(120, np.uint8), w,
            rng.uniform(0.005, 0.02, 4).astype(np.float32), np.zeros(4, np.int8),
            scalar(0.4, np.float32), scalar(128, np.uint8), rng.integers(-500, 500, 4).astype(np.int32)]
    check("QLinearConv", args, {"pads": [1, 1, 1, 1], "strides": [2, 2]})


def test_conv_integer_rejects_channel_mismatch():
    with pytest.raises(ShapeError, match="channels"):
        run_kernel("ConvInteger", [ints((1, 3, 5, 5), np.uint8), ints((2, 2, 3, 3), np.uint8)])


def test_conv_integer_empty_batch():
    got = run_kernel("ConvInteger", [np.zeros((0, 2, 4, 4), np.uint8), ints((3, 2, 3, 3), np.uint8)])[0]
    assert got.shape == (0, 3, 2, 2)


@pytest.mark.parametrize("x_shape,w_shape,attrs", [CONV_CASES[1], CONV_CASES[2], CONV_CASES[7]])
def test_conv_in_row_chunks(monkeypatch, x_shape, w_shape, attrs):
    monkeypatch.setattr(omrt.kernels.quantization, "COLUMNS_CAP", 64)
    x, w = ints(x_shape, np.int8), ints(w_shape, np.uint8)
    check("ConvInteger", [x, w, scalar(3, np.int8), scalar(7, np.uint8)], attrs)
    args = [x, scalar(0.03, np.float32), scalar(3, np.int8), w, scalar(0.01, np.float32),
            scalar(7, np.uint8), scalar(0.5, np.float32), scalar(-4, np.int8),
            rng.integers(-99, 99, w_shape[0]).astype(np.int32)]
    check("QLinearConv", args, attrs)
