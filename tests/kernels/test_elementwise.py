"""Elementwise kernels against onnx.reference: dtypes, broadcasting, attributes, edge cases, in place."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from elementwise_check import CAST_TYPES, FLOATS, INTS, randint, randn, rng, tol
from kernel_check import check, reference, run_kernel
from omrt.errors import ShapeError
from omrt.kernels.base import ZERO_BYTES


# ----------------------------------------------------------------------------- unary


@pytest.mark.parametrize("op", ["Relu", "Sigmoid", "Tanh", "Neg", "Abs", "Exp", "Floor", "Ceil"])
@pytest.mark.parametrize("dtype", FLOATS)
def test_unary_float(op, dtype):
    x = randn(3, 4, 5, dtype=dtype) * 4
    check(op, [x], **tol(dtype))


@pytest.mark.parametrize("op", ["Log", "Sqrt", "Reciprocal"])
@pytest.mark.parametrize("dtype", FLOATS)
def test_unary_positive_domain(op, dtype):
    x = np.abs(randn(2, 7, dtype=dtype)) + dtype(0.1)
    check(op, [x], **tol(dtype))


@pytest.mark.parametrize("op", ["Log", "Sqrt", "Reciprocal", "Exp", "Sigmoid", "Tanh"])
def test_unary_special_values(op):
    x = np.array([0.0, -0.0, -1.0, np.inf, -np.inf, np.nan, 1e-40, 100.0, -100.0], np.float32)
    check(op, [x])


@pytest.mark.parametrize("op", ["Relu", "Neg", "Abs"])
@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.int64])
def test_unary_int(op, dtype):
    check(op, [randint(4, 6, dtype=dtype)])


def test_abs_unsigned():
    check("Abs", [randint(5, dtype=np.uint16)])


def test_not():
    check("Not", [rng.random((3, 4)) > 0.5])


def test_unary_empty_and_scalar():
    for op in ("Relu", "Exp", "Sigmoid", "LeakyRelu", "Erf"):
        check(op, [np.zeros((0, 3), np.float32)])
        check(op, [np.array(0.5, np.float32)])


def test_unary_rejects_wrong_dtype():
    with pytest.raises(ShapeError, match="Sigmoid"):
        run_kernel("Sigmoid", [np.arange(3)])
    with pytest.raises(ShapeError, match="Not"):
        run_kernel("Not", [np.arange(3.0)])


# ----------------------------------------------------------------------------- binary


BINARY_SHAPES = [((3, 4), (3, 4)), ((2, 3, 4), (4,)), ((3, 1), (1, 5)), ((1,), (2, 3)),
                 ((), (2, 2)), ((0, 3), (1, 3)), ((2, 1, 4), (3, 1))]


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div"])
@pytest.mark.parametrize("sa,sb", BINARY_SHAPES)
def test_arith_broadcast(op, sa, sb):
    a, b = randn(*sa), randn(*sb)
    if op == "Div":
        b = np.where(np.abs(b) < 0.1, 1, b).astype(np.float32)
    check(op, [a, b])


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div"])
@pytest.mark.parametrize("dtype", FLOATS + INTS)
def test_arith_dtypes(op, dtype):
    if np.dtype(dtype).kind == "f":
        a, b = randn(4, 5, dtype=dtype), randn(5, dtype=dtype)
    else:
        a, b = randint(4, 5, dtype=dtype), randint(5, dtype=dtype, lo=1, hi=9)
    check(op, [a, b], opset=7, **tol(dtype))
    check(op, [a, b], **tol(dtype))


@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.int64])
def test_integer_div_truncates(dtype):
    a = np.array([7, -7, 7, -7, 6, -6, 0, 1], dtype)
    b = np.array([2, 2, -2, -2, 3, -3, 5, -3], dtype)
    got = run_kernel("Div", [a, b])[0]
    np.testing.assert_array_equal(got, [3, -3, -3, 3, 2, 2, 0, 0])
    check("Div", [randint(6, 7, dtype=dtype, lo=-100, hi=100), randint(7, dtype=dtype, lo=1, hi=9)])
    check("Div", [randint(6, 7, dtype=dtype, lo=-100, hi=100), -randint(7, dtype=dtype, lo=1, hi=9)])


def test_float_div_by_zero():
    check("Div", [np.array([1.0, -1.0, 0.0], np.float32), np.zeros(3, np.float32)])


@pytest.mark.parametrize("a_dtype,b_dtype", [(np.float32, np.float32), (np.float32, np.int64),
                                              (np.float64, np.float32), (np.int32, np.int32),
                                              (np.int64, np.float32), (np.float16, np.float32),
                                              (np.float32, np.float64)])
def test_pow_keeps_base_dtype(a_dtype, b_dtype):
    a = (np.abs(randn(3, 4)) + 0.5).astype(a_dtype) if np.dtype(a_dtype).kind == "f" \
        else randint(3, 4, dtype=a_dtype, lo=0, hi=6)
    b = randint(4, dtype=b_dtype, lo=0, hi=4).astype(b_dtype) if np.dtype(b_dtype).kind != "f" \
        else (randn(4) * 2).astype(b_dtype)
    check("Pow", [a, b], **tol(a_dtype))
    check("Pow", [a, b], opset=7, **tol(a_dtype))


@pytest.mark.parametrize("e", [2, 2.0, 0.5, 3])
def test_pow_scalar_exponent(e):
    x = randn(5, 6)
    check("Pow", [x, np.array(e, np.float32)], const=[1])
    check("Pow", [x, np.array([e], np.int64 if isinstance(e, int) else np.float32)])


def test_binary_rejects_bad_inputs():
    with pytest.raises(ShapeError, match="broadcast"):
        run_kernel("Add", [randn(3, 4), randn(3, 5)])
    with pytest.raises(ShapeError, match="dtype"):
        run_kernel("Add", [randn(3), randint(3)])


def test_binary_symbolic_infer():
    from omrt.kernels import OpContext, TensorInfo, lookup
    f32 = np.dtype(np.float32)
    out = lookup("Add", 21).infer(OpContext({}, 21, "n"),
                                  [TensorInfo(f32, ("batch", 1, 4)), TensorInfo(f32, (3, None))])
    assert out[0].shape == ("batch", 3, 4)


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(["Add", "Sub", "Mul", "Max", "Min", "Greater", "Equal"]),
       hnp.mutually_broadcastable_shapes(num_shapes=2, max_dims=4, max_side=4))
def test_binary_broadcast_property(op, shapes):
    a, b = (randint(*s, dtype=np.int64, lo=-3, hi=3) for s in shapes.input_shapes)
    check(op, [a, b], const=[])


@pytest.mark.parametrize("op", ["Sub", "Div", "Add", "Equal", "Pow"])
@pytest.mark.parametrize("small_first", [False, True])
def test_binary_tiles_an_input_that_repeats_a_short_pattern(op, small_first):
    """x - mean over an HWC image: the (3,) input is tiled in the workspace to long rows; a
    strided operand at run time takes numpy's own broadcast instead."""
    from omrt.kernels import OpContext, TensorInfo, lookup
    frame, pattern = randn(48, 64, 3) + 2, randn(64, 3) + 2
    inputs = [pattern, frame] if small_first else [frame, pattern]
    ctx = OpContext({}, 21, "n", op_type=op)
    infos = [TensorInfo(x.dtype, x.shape) for x in inputs]
    kernel = lookup(op, 21)(ctx, infos, lookup(op, 21).infer(ctx, infos))
    assert kernel.tile == (0 if small_first else 1, 48 * 64 * 3)
    check(op, inputs, rtol=1e-5)
    strided = np.ascontiguousarray(frame.transpose(1, 0, 2)).transpose(1, 0, 2)
    args = [pattern, strided] if small_first else [strided, pattern]
    out = np.empty(kernel.outputs[0].shape, kernel.outputs[0].dtype)
    kernel.run(args, [out], np.zeros(kernel.workspace(), np.uint8))
    np.testing.assert_allclose(out, reference(op, inputs)[0], rtol=1e-5)


# ----------------------------------------------------------------------------- comparisons and logic


@pytest.mark.parametrize("op", ["Equal", "Greater", "Less", "GreaterOrEqual", "LessOrEqual"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int64, np.uint8])
def test_compare(op, dtype):
    a, b = randint(3, 4, dtype=dtype, lo=0, hi=4), randint(4, dtype=dtype, lo=0, hi=4)
    check(op, [a, b])


def test_compare_nan_and_old_opsets():
    a = np.array([np.nan, 1.0, 2.0], np.float32)
    b = np.array([np.nan, 1.0, 3.0], np.float32)
    for op in ("Equal", "Greater", "Less"):
        check(op, [a, b], opset=7)
        check(op, [a, b], opset=13)


def test_equal_bool_and_strings():
    check("Equal", [rng.random(6) > 0.5, rng.random(6) > 0.5])
    a = np.array(["a", "bc", "d"], dtype=object)
    b = np.array(["a", "b", "d"], dtype=object)
    got = run_kernel("Equal", [a, b])[0]
    np.testing.assert_array_equal(got, [True, False, True])


@pytest.mark.parametrize("op", ["And", "Or", "Xor"])
def test_logic(op):
    check(op, [rng.random((2, 3, 4)) > 0.5, rng.random((3, 1)) > 0.5])
    with pytest.raises(ShapeError):
        run_kernel(op, [randn(3), randn(3)])


# ----------------------------------------------------------------------------- variadic


@pytest.mark.parametrize("op", ["Sum", "Mean", "Max", "Min"])
@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_variadic(op, n):
    shapes = [(3, 4), (4,), (2, 1, 1), (1, 4)][:n]
    xs = [randn(*s) for s in shapes]
    if op == "Mean":  # the reference cannot grow its accumulator past input 0's shape
        got = run_kernel(op, xs)[0]
        np.testing.assert_allclose(got, sum(np.broadcast_arrays(*xs)) / n, rtol=1e-6)
    else:
        check(op, xs)
    check(op, [randn(3, 4) for _ in range(n)], opset=6)


@pytest.mark.parametrize("op", ["Max", "Min"])
@pytest.mark.parametrize("dtype", [np.int8, np.int64, np.uint32, np.float16])
def test_max_min_dtypes(op, dtype):
    check(op, [randint(3, 4, dtype=dtype), randint(4, dtype=dtype), randint(3, 1, dtype=dtype)])


@pytest.mark.parametrize("op", ["Max", "Min", "Sum", "Mean"])
def test_variadic_nan(op):
    a = np.array([np.nan, 1.0, 2.0, np.nan], np.float32)
    b = np.array([0.0, np.nan, 1.0, np.nan], np.float32)
    check(op, [a, b])


# ----------------------------------------------------------------------------- Where, Clip


def test_where():
    cond = rng.random((3, 1, 4)) > 0.5
    check("Where", [cond, randn(2, 4), randn(3, 2, 1)])
    check("Where", [cond, randint(3, 2, 4, dtype=np.int64), randint(3, 2, 4, dtype=np.int64)])
    check("Where", [cond, randn(3, 2, 4), randn(3, 2, 4)], opset=9)
    check("Where", [np.array(True), randn(2), randn(2)])
    with pytest.raises(ShapeError):
        run_kernel("Where", [cond, randn(4), randint(4, dtype=np.int64)])


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int64, np.uint8])
def test_clip_inputs(dtype):
    x = randint(5, 6, dtype=dtype, lo=0, hi=20) if np.dtype(dtype).kind in "iu" else randn(5, 6, dtype=dtype) * 5
    lo, hi = np.array(2, dtype), np.array(10, dtype)
    check("Clip", [x, lo, hi])
    check("Clip", [x, lo])
    check("Clip", [x, None, hi])
    check("Clip", [x])
    check("Clip", [x, hi, lo])  # min > max: everything becomes max


def test_clip_opset6_attrs():
    x = randn(4, 5) * 5
    check("Clip", [x], {"min": -1.0, "max": 2.0}, opset=6)
    check("Clip", [x], {"max": 0.5}, opset=6)
    check("Clip", [x], {}, opset=6)
    check("Clip", [x, np.array(-1.0, np.float32), np.array(2.0, np.float32)], opset=11)


def test_clip_nan():
    x = np.array([np.nan, -5, 5, 0], np.float32)
    check("Clip", [x, np.array(-1, np.float32), np.array(1, np.float32)])


# ----------------------------------------------------------------------------- Cast


@pytest.mark.parametrize("src", list(CAST_TYPES.values()))
@pytest.mark.parametrize("to", list(CAST_TYPES))
def test_cast_numeric(src, to):
    if np.dtype(src) == np.bool_:
        x = rng.random((3, 5)) > 0.5
    elif np.dtype(src).kind == "f":
        x = (randn(3, 5) * 40).astype(src)
        x[0, :3] = [0.0, -0.0, 0.5]
    else:
        x = randint(3, 5, dtype=src, lo=-100, hi=100)
    if np.dtype(CAST_TYPES[to]).kind == "u" and np.dtype(src).kind == "f":
        x = np.abs(x)
    got = check("Cast", [x], {"to": to})[0]
    assert got.dtype == CAST_TYPES[to]
    check("Cast", [x], {"to": to}, opset=6)


def test_cast_wraps_and_bool_rules():
    got = run_kernel("Cast", [np.array([200, 300, -1], np.int16)], {"to": 3})[0]
    np.testing.assert_array_equal(got, [-56, 44, -1])
    got = run_kernel("Cast", [np.array([0.0, -0.0, np.nan, 0.1, -np.inf], np.float32)], {"to": 9})[0]
    np.testing.assert_array_equal(got, [False, False, True, True, True])
    check("Cast", [np.array([1e5, -1e5, np.inf, np.nan], np.float32)], {"to": 10})


def test_cast_strings():
    x = np.array(["1.5", "-2", "1e-5", "+INF", "-inf", "NaN"], dtype=object)
    got = run_kernel("Cast", [x], {"to": 1})[0]
    np.testing.assert_array_equal(got, np.array([1.5, -2, 1e-5, np.inf, -np.inf, np.nan], np.float32))
    got = run_kernel("Cast", [np.array(["100", "-7"], dtype=object)], {"to": 7})[0]
    np.testing.assert_array_equal(got, [100, -7])
    got = run_kernel("Cast", [np.array([1.5, -2.0], np.float32)], {"to": 8})[0]
    assert got.dtype == object and list(got) == ["1.5", "-2.0"]
    got = run_kernel("Cast", [np.array([3, -4], np.int64)], {"to": 8})[0]
    assert list(got) == ["3", "-4"]


def test_cast_errors():
    with pytest.raises(ShapeError, match="99"):
        run_kernel("Cast", [randn(3)], {"to": 99})
    with pytest.raises(ShapeError, match="to"):
        run_kernel("Cast", [randn(3)], {})


# ----------------------------------------------------------------------------- in place


@pytest.mark.parametrize("op,inputs", [
    ("Add", [randn(4, 5), randn(5)]),
    ("Pow", [np.abs(randn(4, 5)), randn(4, 5)]),
    ("Where", [rng.random((4, 5)) > 0.5, randn(5), randn(4, 5)]),
    ("Sum", [randn(4, 5), randn(4, 5), randn(5)]),
    ("LeakyRelu", [randn(40_000)]),
    ("Erf", [randn(40_000)]),
    ("Clip", [randn(40), np.array(-0.5, np.float32), np.array(0.5, np.float32)]),
    ("Div", [randint(30, dtype=np.int32), randint(30, dtype=np.int32, lo=1, hi=5)]),
    ("PRelu", [randn(2, 3, 4, 5), randn(3, 1, 1)]),
    ("Shrink", [randn(40_000) * 3]),
    ("Mod", [randint(30, dtype=np.int64), randint(30, dtype=np.int64, lo=1, hi=5)]),
])
def test_in_place(op, inputs):
    """run_kernel re-runs with the output aliasing the declared input and compares."""
    check(op, inputs)
    check("Gelu", [randn(40_000) * 3], opset=20)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, np.int32])
def test_relu_over_several_blocks_of_zeros(dtype):
    """More values than two blocks of zeros hold, the last block partly used; NaN stays NaN."""
    x = (randn(2 * ZERO_BYTES // np.dtype(dtype).itemsize + 7) * 5).astype(dtype)
    if np.dtype(dtype).kind == "f":
        x[:4] = [np.nan, np.inf, -np.inf, -0.0]
    check("Relu", [x])


# ----------------------------------------------------------------------------- fused activations


def _activated(y, act, alpha, beta):
    """onnx.reference's `act` of `y`, with the values a fused node carries in _act_alpha/_act_beta."""
    if act == "Clip":
        return reference("Clip", [y, np.array(alpha, y.dtype), np.array(beta, y.dtype)])[0]
    attrs = {"LeakyRelu": {"alpha": alpha}, "HardSigmoid": {"alpha": alpha, "beta": beta}}.get(act, {})
    return reference(act, [y], attrs)[0]


@pytest.mark.parametrize("act,alpha,beta", [("Relu", None, None), ("LeakyRelu", 0.1, None),
                                            ("Clip", -0.5, 0.7), ("Sigmoid", None, None),
                                            ("Tanh", None, None), ("HardSigmoid", 0.3, 0.4)])
@pytest.mark.parametrize("op,inputs", [("Add", [randn(2, 3, 4, 5), randn(3, 1, 1)]),
                                       ("Sum", [randn(2, 3, 4, 5), randn(2, 3, 4, 5), randn(5)])])
def test_add_and_sum_apply_a_fused_activation(op, inputs, act, alpha, beta):
    """run_kernel also reruns the node over its input 0 (in place) and compares."""
    want = _activated(reference(op, inputs)[0], act, alpha, beta)
    got = run_kernel(op, inputs, {"_act": act, "_act_alpha": alpha, "_act_beta": beta})[0]
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


# ----------------------------------------------------------------------------- more unary math


@pytest.mark.parametrize("op,lo,hi", [("Sin", -10, 10), ("Cos", -10, 10), ("Tan", -1.5, 1.5),
                                      ("Asin", -1, 1), ("Acos", -1, 1), ("Atan", -10, 10),
                                      ("Sinh", -5, 5), ("Cosh", -5, 5), ("Asinh", -10, 10),
                                      ("Acosh", 1, 10), ("Atanh", -0.99, 0.99),
                                      ("Softplus", -30, 30), ("Round", -5, 5)])
@pytest.mark.parametrize("dtype", FLOATS)
def test_unary_math(op, lo, hi, dtype):
    x = rng.uniform(lo, hi, (4, 6)).astype(dtype)
    check(op, [x], **tol(dtype))
    check(op, [x], opset=9 if op != "Round" else 11, **tol(dtype))


def test_unary_math_out_of_domain():
    x = np.array([-2.0, 2.0, np.inf, -np.inf, np.nan, 0.0], np.float32)
    for op in ("Asin", "Acos", "Acosh", "Atanh", "Sin", "Cos", "Softplus"):
        check(op, [x])


def test_round_halves_to_even():
    x = np.array([0.5, 1.5, 2.5, -0.5, -2.5, 2.3, -4.5, 0.9, np.nan, np.inf], np.float32)
    got = run_kernel("Round", [x])[0]
    np.testing.assert_array_equal(got, [0, 2, 2, -0.0, -2, 2, -4, 1, np.nan, np.inf])


@pytest.mark.parametrize("dtype", FLOATS + [np.int8, np.int64, np.uint16])
def test_sign(dtype):
    x = randint(20, dtype=dtype, lo=-3, hi=3)
    if np.dtype(dtype).kind == "f":
        x[:3] = [np.nan, -0.0, 0.0]
    check("Sign", [x])


def test_isnan_isinf():
    x = np.array([np.nan, np.inf, -np.inf, 0.0, -1.0, 3.0], np.float32)
    for dtype in FLOATS:
        check("IsNaN", [x.astype(dtype)])
        for pos in (0, 1):
            for neg in (0, 1):
                check("IsInf", [x.astype(dtype)], {"detect_positive": pos, "detect_negative": neg})
    check("IsInf", [x], opset=10)


@pytest.mark.parametrize("dtype", INTS)
def test_bitwise(dtype):
    a, b = randint(3, 4, dtype=dtype, lo=-100, hi=100), randint(4, dtype=dtype, lo=-100, hi=100)
    for op in ("BitwiseAnd", "BitwiseOr", "BitwiseXor"):
        check(op, [a, b])
    check("BitwiseNot", [a])
    with pytest.raises(ShapeError):
        run_kernel("BitwiseAnd", [randn(3), randn(3)])


# ----------------------------------------------------------------------------- Mod, BitShift


@pytest.mark.parametrize("dtype", INTS)
@pytest.mark.parametrize("fmod", [0, 1])
def test_mod_int(dtype, fmod):
    a = randint(4, 5, dtype=dtype, lo=-30, hi=30)
    b = randint(5, dtype=dtype, lo=1, hi=7)
    if np.dtype(dtype).kind == "i":
        b[::2] *= -1
    check("Mod", [a, b], {"fmod": fmod})
    check("Mod", [a, b], {"fmod": fmod}, opset=10)


@pytest.mark.parametrize("dtype", FLOATS)
def test_mod_float(dtype):
    a = (randn(4, 5) * 10).astype(dtype)
    b = np.array([3.0, -3.0, 0.7, -0.7, 2.5], dtype)
    check("Mod", [a, b], {"fmod": 1}, **tol(dtype))
    check("Mod", [a, b], {"fmod": 1}, opset=13, **tol(dtype))
    check("Mod", [a, b], {"fmod": 0}, opset=28, **tol(dtype))
    special = np.array([np.inf, 5.0, -0.0, 0.0, 1.0, -1.0, np.nan], dtype)
    divisor = np.array([2.0, 0.0, 3.0, -3.0, np.inf, np.inf, 1.0], dtype)
    for fmod in (0, 1):
        check("Mod", [special, divisor], {"fmod": fmod}, opset=28)


@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.uint32, np.uint64])
@pytest.mark.parametrize("direction", ["LEFT", "RIGHT"])
def test_bitshift_unsigned(dtype, direction):
    x = randint(3, 4, dtype=dtype, lo=0, hi=200)
    y = randint(4, dtype=dtype, lo=0, hi=8)
    check("BitShift", [x, y], {"direction": direction}, opset=11)
    bits = np.dtype(dtype).itemsize * 8
    got = run_kernel("BitShift", [np.array([5, 5], dtype), np.array([bits, bits + 3], dtype)],
                     {"direction": direction})[0]
    np.testing.assert_array_equal(got, [0, 0])


@pytest.mark.parametrize("dtype", [np.int8, np.int16, np.int32, np.int64])
def test_bitshift_signed(dtype):
    bits = np.dtype(dtype).itemsize * 8
    x = np.array([-5, 5, -5, 5, -1, 64, -5, 3], dtype)
    y = np.array([1, 1, bits, bits, -1, 1, 2, bits - 1], dtype)
    for direction in ("LEFT", "RIGHT"):
        check("BitShift", [x, y], {"direction": direction}, opset=28)
    got = run_kernel("BitShift", [x, y], {"direction": "RIGHT"}, opset=28)[0]
    np.testing.assert_array_equal(got[[2, 3, 4]], [-1, 0, -1])
    with pytest.raises(ShapeError, match="direction"):
        run_kernel("BitShift", [x, y], {"direction": "UP"})


# ----------------------------------------------------------------------------- CastLike, bfloat16


def test_castlike():
    x = randn(3, 4) * 100
    for like in (np.zeros(1, np.int8), np.zeros(2, np.float16), np.zeros((), np.bool_),
                 np.zeros(1, np.uint64)):
        check("CastLike", [np.abs(x), like])
    check("CastLike", [x, np.zeros(1, np.float64)], opset=15)
    got = run_kernel("CastLike", [x, np.array(["a"], dtype=object)])[0]
    assert got.dtype == object and got.shape == (3, 4)


def test_bfloat16_and_float8_through_ml_dtypes():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    x = np.array([1.0, -2.5, 3.14159, 1e30, np.inf, np.nan, 1 + 2 ** -8, 1 + 3 * 2 ** -9], np.float32)
    b = run_kernel("Cast", [x], {"to": 16})[0]
    assert b.dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(b.astype(np.float32), x.astype(ml_dtypes.bfloat16).astype(np.float32))
    back = run_kernel("Cast", [b], {"to": 1})[0]
    assert back.dtype == np.float32 and back[0] == 1.0 and back[6] == 1.0
    relu = run_kernel("Relu", [b[:4]])[0]  # no NaN: the harness cannot compare bfloat16 NaNs
    assert relu.dtype == b.dtype and relu.astype(np.float32)[1] == 0
    f8 = run_kernel("Cast", [np.array([1000.0, -np.inf, 0.3], np.float32)], {"to": 17})[0]
    np.testing.assert_array_equal(f8.astype(np.float32), [448.0, -448.0, 0.3125])
    f8 = run_kernel("Cast", [np.array([1000.0], np.float32)], {"to": 17, "saturate": 0})[0]
    assert np.isnan(f8.astype(np.float32)[0])


def test_cast_unsupported_types_named():
    with pytest.raises(ShapeError, match="complex"):
        run_kernel("Cast", [randn(3)], {"to": 14})


# ----------------------------------------------------------------------------- float8e8m0

E8M0 = 24
E8M0_MIN, E8M0_MAX, E8M0_NAN = 0x00, 0xFE, 0xFF  # bit patterns: 2**-127, 2**127, NaN


def e8m0_bits(x, opset=25, **attrs):
    """omrt's cast of `x` to float8e8m0 as bit patterns (the harness cannot compare its NaNs)."""
    got = run_kernel("Cast", [x], {"to": E8M0, **attrs}, opset=opset)[0]
    assert got.dtype.name == "float8_e8m0fnu"
    return got.view(np.uint8)


@pytest.mark.parametrize("round_mode", ["up", "down", "nearest"])
@pytest.mark.parametrize("saturate", [1, 0])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_cast_to_e8m0_matches_reference(round_mode, saturate, dtype):
    info = np.finfo(dtype)
    powers = np.ldexp(1.0, np.arange(info.minexp, info.maxexp)).astype(dtype)
    x = np.concatenate([powers, powers * dtype(1.5), powers * dtype(1.25), powers * dtype(1.75),
                        np.abs(randn(64)).astype(dtype) * dtype(10), [info.max]]).astype(dtype)
    attrs = {"to": E8M0, "round_mode": round_mode, "saturate": saturate}
    want = reference("Cast", [x], attrs, opset=25)[0]
    np.testing.assert_array_equal(e8m0_bits(x, **attrs), want.view(np.uint8))
    np.testing.assert_array_equal(e8m0_bits(-x, **attrs), want.view(np.uint8))  # as |x|


def test_cast_to_e8m0_round_modes():
    x = np.array([1.0, 1.25, 1.5, 1.75, 3.0, 0.75 * 2.0 ** -127], np.float32)
    assert list(e8m0_bits(x, round_mode="up")) == [127, 128, 128, 128, 129, E8M0_MIN]
    assert list(e8m0_bits(x, round_mode="down")) == [127, 127, 127, 127, 128, E8M0_MIN]  # saturated
    assert list(e8m0_bits(x, round_mode="nearest")) == [127, 127, 128, 128, 129, E8M0_MIN]
    assert list(e8m0_bits(x)) == list(e8m0_bits(x, opset=21))  # "up" by default, and before 24
    # float64 inputs are rounded as they are, not through float32 (where 1 + 2**-40 is 1)
    assert list(e8m0_bits(np.array([1 + 2.0 ** -40]), round_mode="up")) == [128]


def test_cast_to_e8m0_special_values():
    """The spec's table, with 1e-45 below E8M0_MIN and 2**127 * 1.5 above E8M0_MAX."""
    x = np.array([0.0, -0.0, np.nan, np.inf, -np.inf, 2.0 ** 127 * 1.5, 1e-45, 2.0 ** -127], np.float32)
    got = e8m0_bits(x, saturate=1, round_mode="up")
    np.testing.assert_array_equal(got, [E8M0_MIN, E8M0_MIN, E8M0_NAN, E8M0_MAX, E8M0_MAX, E8M0_MAX,
                                        E8M0_MIN, E8M0_MIN])
    got = e8m0_bits(x, saturate=0, round_mode="nearest")
    np.testing.assert_array_equal(got, [E8M0_NAN] * 7 + [E8M0_MIN])
    got = e8m0_bits(np.array([2.0 ** 127 * 1.25, 2.0 ** 127 * 1.75, 2.0 ** 200]), saturate=0)
    np.testing.assert_array_equal(got, [E8M0_NAN] * 3)
    assert list(e8m0_bits(x[5:6], saturate=0, round_mode="down")) == [E8M0_MAX]


def test_cast_from_e8m0_and_strings():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    x = np.array([E8M0_MIN, 1, 126, 127, E8M0_MAX, E8M0_NAN], np.uint8).view(ml_dtypes.float8_e8m0fnu)
    for to, dtype in ((1, np.float32), (10, np.float16), (11, np.float64)):
        got = run_kernel("Cast", [x], {"to": to}, opset=25)[0]
        np.testing.assert_array_equal(got, x.astype(dtype))
        np.testing.assert_array_equal(got, reference("Cast", [x], {"to": to}, opset=25)[0])
    strings = np.array(["3", "0", "INF", "NaN", "0.124"], dtype=object)
    np.testing.assert_array_equal(e8m0_bits(strings), [129, E8M0_MIN, E8M0_MAX, E8M0_NAN, 124])


def test_castlike_e8m0():
    x = np.array([0.0, 0.3, 1.5, 3.0, np.inf, np.nan], np.float32)
    like = run_kernel("Cast", [np.ones(1, np.float32)], {"to": E8M0}, opset=25)[0]
    for attrs in ({}, {"round_mode": "down"}, {"round_mode": "nearest", "saturate": 0}):
        got = run_kernel("CastLike", [x, like], attrs, opset=25)[0]
        np.testing.assert_array_equal(got.view(np.uint8), e8m0_bits(x, **attrs))


def test_cast_round_mode_checked():
    for op, inputs in (("Cast", [randn(3)]), ("CastLike", [randn(3), randn(1)])):
        with pytest.raises(ShapeError, match="test: .*round_mode 'ceil' is not one of up, down, nearest"):
            run_kernel(op, inputs, {"to": E8M0, "round_mode": "ceil"}, opset=25)
