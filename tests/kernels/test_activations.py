"""Activation kernels against onnx.reference: dtypes, attributes, chunks, special values."""

from __future__ import annotations

import math

import numpy as np
import pytest

from elementwise_check import FLOATS, randint, randn, tol
from kernel_check import check, run_kernel
from omrt.errors import ShapeError


# ----------------------------------------------------------------------------- HardSigmoid, LeakyRelu


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


# ----------------------------------------------------------------------------- activations


ACTIVATIONS = [
    ("Elu", {}), ("Elu", {"alpha": 0.5}), ("Selu", {}), ("Selu", {"alpha": 2.0, "gamma": 0.5}),
    ("Celu", {}), ("Celu", {"alpha": 2.5}), ("Softsign", {}), ("HardSwish", {}), ("Mish", {}),
    ("Gelu", {}), ("Gelu", {"approximate": "tanh"}), ("ThresholdedRelu", {}),
    ("ThresholdedRelu", {"alpha": -0.5}), ("Shrink", {}), ("Shrink", {"bias": 1.5, "lambd": 1.0}),
    ("Swish", {}), ("Swish", {"alpha": 1.7}), ("Softplus", {}),
]
OPSET = {"Gelu": 20, "Swish": 24, "Mish": 18, "HardSwish": 14}


@pytest.mark.parametrize("op,attrs", ACTIVATIONS)
@pytest.mark.parametrize("dtype", FLOATS)
def test_activation(op, attrs, dtype):
    x = (randn(2, 3, 5, dtype=np.float64) * 4).astype(dtype)
    check(op, [x], attrs, opset=max(OPSET.get(op, 21), 21) if op != "Swish" else 24, **tol(dtype))


@pytest.mark.parametrize("op,attrs", ACTIVATIONS)
def test_activation_chunks_and_specials(op, attrs):
    """More than one chunk, the special values, and an empty tensor."""
    x = np.concatenate([randn(40_000) * 5, np.array([0.0, -0.0, 1e-30, 30.0, -30.0], np.float32)])
    check(op, [x], attrs, opset=OPSET.get(op, 21) if op == "Swish" else 21)
    check(op, [np.zeros((2, 0), np.float32)], attrs, opset=24 if op == "Swish" else 21)
    specials = np.array([np.nan, np.inf, -np.inf], np.float32)
    got = run_kernel(op, [specials], attrs, opset=24 if op == "Swish" else 21)[0]
    assert np.isnan(got[0]) or op in ("ThresholdedRelu", "Shrink")
    if op not in ("Softsign", "Swish", "HardSwish", "Mish", "Gelu"):
        np.testing.assert_allclose(got[1:], reference_specials(op, attrs), rtol=1e-6)


def reference_specials(op, attrs):
    """The limits at +inf and -inf."""
    alpha = attrs.get("alpha", {"Selu": 1.67326319217681884765625}.get(op, 1.0))
    gamma = attrs.get("gamma", 1.05070102214813232421875 if op == "Selu" else 1.0)
    return {"Elu": [np.inf, -alpha], "Selu": [np.inf, -alpha * gamma], "Celu": [np.inf, -alpha],
            "ThresholdedRelu": [np.inf, 0.0], "Shrink": [np.inf, -np.inf], "Softplus": [np.inf, 0.0]}[op]


def test_activation_old_opsets():
    x = randn(3, 4) * 3
    for op in ("Elu", "Selu"):
        check(op, [x], opset=6)
    check("Celu", [x], opset=12)
    check("ThresholdedRelu", [x], {"alpha": 0.3}, opset=10)
    check("Shrink", [x], opset=9)
    check("Softsign", [x], opset=1)
    check("Softplus", [x], opset=1)


def test_gelu_accuracy():
    x = np.linspace(-8, 8, 50001)
    want = np.array([0.5 * v * math.erfc(-v / math.sqrt(2)) for v in x])
    got = run_kernel("Gelu", [x.astype(np.float32)], opset=20)[0]
    np.testing.assert_allclose(got, want, rtol=3e-7, atol=1e-7)
    got = run_kernel("Gelu", [x], opset=20)[0]  # float64 keeps relative accuracy in the tail
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=0)
    # float32 goes through a table of the normal CDF: beyond it, at its nodes and between them
    special = np.array([np.inf, -np.inf, np.nan, 0.0, -0.0, 1e30, -1e30, 1e-40, -7, 6, 3 + 1 / 2048,
                        -5.99951171875], np.float32)
    got = run_kernel("Gelu", [special], opset=20)[0]
    with np.errstate(invalid="ignore"):
        want = np.array([0.5 * v * math.erfc(-v / math.sqrt(2)) if math.isfinite(v) else v * (v > 0)
                         for v in special.astype(np.float64)])
    np.testing.assert_allclose(got, want, rtol=3e-7, atol=1e-7)
    assert np.signbit(got[4]) and got[0] == np.inf
    with pytest.raises(ShapeError, match="approximate"):
        run_kernel("Gelu", [x], {"approximate": "fast"}, opset=20)


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint8])
def test_shrink_ints(dtype):
    check("Shrink", [randint(30, dtype=dtype, lo=-10, hi=10)], {"bias": 2.0, "lambd": 3.0})


# ----------------------------------------------------------------------------- PRelu


@pytest.mark.parametrize("xs,ss", [((2, 3, 4, 5), (3, 1, 1)), ((2, 3, 4, 5), (5,)), ((2, 3), (1,)),
                                   ((2, 3), ()), ((2, 3, 4), (2, 3, 4)), ((0, 3), (3,))])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int32, np.int64, np.uint32])
def test_prelu(xs, ss, dtype):
    x = randint(*xs, dtype=dtype, lo=-9, hi=9) if np.dtype(dtype).kind in "iu" else randn(*xs, dtype=dtype)
    slope = randint(*ss, dtype=dtype, lo=-3, hi=3) if np.dtype(dtype).kind in "iu" else randn(*ss, dtype=dtype)
    check("PRelu", [x, slope], **tol(dtype))
    check("PRelu", [x, slope], opset=9, **tol(dtype))


def test_prelu_rejects_two_way_broadcast():
    with pytest.raises(ShapeError, match="slope"):
        run_kernel("PRelu", [randn(2, 3, 4), randn(3)])
    with pytest.raises(ShapeError, match="slope"):
        run_kernel("PRelu", [randn(3, 1), randn(3, 4)])


@pytest.mark.parametrize("xs", [(2, 3, 4), (2, 3, 4, 5), (1, 3, 2, 2, 2)])
def test_prelu_per_channel_slope_of_models_upgraded_from_opset_6(xs):
    x, slope = randn(*xs), randn(3)
    got = run_kernel("PRelu", [x, slope], opset=7)[0]
    channel = slope.reshape((3,) + (1,) * (len(xs) - 2))
    np.testing.assert_array_equal(got, np.where(x < 0, x * channel, x))
    with pytest.raises(ShapeError, match="slope"):
        run_kernel("PRelu", [x, slope], opset=9)
