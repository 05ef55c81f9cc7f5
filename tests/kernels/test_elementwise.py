"""Elementwise kernels against onnx.reference: dtypes, broadcasting, attributes, edge cases, in place."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from kernel_check import check, run_kernel
from omrt.errors import ShapeError

rng = np.random.default_rng(0)

FLOATS = [np.float32, np.float64, np.float16]
INTS = [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64]


def randn(*shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


def randint(*shape, dtype=np.int32, lo=-50, hi=50):
    if np.dtype(dtype).kind == "u":
        lo = 0
    return rng.integers(lo, hi, shape).astype(dtype)


def tol(dtype):
    return {"rtol": 2e-3, "atol": 2e-3} if np.dtype(dtype) == np.float16 else {}


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


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("attrs", [{}, {"alpha": 0.5, "beta": 0.3}])
def test_hard_sigmoid(dtype, attrs):
    check("HardSigmoid", [randn(4, 5, dtype=dtype) * 5], attrs, **tol(dtype))
    check("HardSigmoid", [randn(4, 5, dtype=dtype) * 5], attrs, opset=6, **tol(dtype))


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("alpha", [None, 0.2, 0.0, -0.5, 3.0])
def test_leaky_relu(dtype, alpha):
    attrs = {} if alpha is None else {"alpha": alpha}
    x = np.concatenate([randn(50_000, dtype=dtype), np.array([np.inf, 0, -0.0, np.nan], dtype)])
    check("LeakyRelu", [x], attrs, **tol(dtype))


# ----------------------------------------------------------------------------- Erf


def erf_exact(x):
    return np.array([math.erf(v) for v in np.asarray(x, np.float64).ravel()]).reshape(np.shape(x))


def test_erf_float32_faithful():
    x = np.concatenate([np.linspace(-6, 6, 40001), np.geomspace(1e-38, 6, 2000),
                        -np.geomspace(1e-38, 6, 2000)]).astype(np.float32)
    got = run_kernel("Erf", [x])[0]
    want = erf_exact(x).astype(np.float32)
    ulp = np.abs(got.astype(np.float64) - want) / np.spacing(np.abs(want))
    assert ulp.max() <= 1
    check("Erf", [x], rtol=3e-7, atol=1e-30)


def test_erf_float64_accurate():
    x = np.concatenate([np.linspace(-7, 7, 30001), np.geomspace(1e-300, 7, 2000)])
    got = run_kernel("Erf", [x])[0]
    want = erf_exact(x)
    np.testing.assert_allclose(got, want, rtol=3e-15, atol=0)


def test_erf_special_values_and_dtypes():
    x = np.array([np.inf, -np.inf, np.nan, 0.0, -0.0, 1.5, -1.5, 4.0, 10.0], np.float32)
    got = run_kernel("Erf", [x])[0]
    assert got[0] == 1 and got[1] == -1 and np.isnan(got[2])
    assert got[3] == 0 and np.signbit(got[4])
    check("Erf", [x])
    check("Erf", [randn(3, 4, dtype=np.float16)], rtol=1e-3)
    check("Erf", [randint(10, dtype=np.int32, lo=-3, hi=3)])
    # several chunks, in place
    check("Erf", [randn(70_001) * 3])


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

CAST_TYPES = {1: np.float32, 2: np.uint8, 3: np.int8, 4: np.uint16, 5: np.int16, 6: np.int32,
              7: np.int64, 9: np.bool_, 10: np.float16, 11: np.float64, 12: np.uint32, 13: np.uint64}


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
])
def test_in_place(op, inputs):
    """run_kernel re-runs with the output aliasing the declared input and compares."""
    check(op, inputs)
