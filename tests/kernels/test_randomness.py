"""Random kernels: shapes, dtypes, seeds and the statistics of their draws."""

from __future__ import annotations

import numpy as np
import pytest

from elementwise_check import CAST_TYPES
from kernel_check import run_kernel
from omrt.errors import ShapeError


# ----------------------------------------------------------------------------- random


@pytest.mark.parametrize("op", ["RandomNormal", "RandomUniform"])
@pytest.mark.parametrize("dtype", [1, 10, 11])
def test_random_fill(op, dtype):
    attrs = {"shape": [200, 300], "dtype": dtype}
    attrs.update({"mean": 2.0, "scale": 0.5} if op == "RandomNormal" else {"low": -1.0, "high": 3.0})
    got = run_kernel(op, [], attrs)[0]
    assert got.shape == (200, 300) and got.dtype == CAST_TYPES[dtype]
    v = got.astype(np.float64)
    if op == "RandomNormal":
        assert abs(v.mean() - 2.0) < 0.02 and abs(v.std() - 0.5) < 0.02
    else:
        assert v.min() >= -1 and v.max() <= 3 and abs(v.mean() - 1.0) < 0.03


@pytest.mark.parametrize("op", ["RandomNormalLike", "RandomUniformLike"])
def test_random_like(op):
    x = np.zeros((4, 5), np.float64)
    got = run_kernel(op, [x])[0]
    assert got.shape == (4, 5) and got.dtype == np.float64 and np.unique(got).size == 20
    got = run_kernel(op, [x], {"dtype": 1})[0]
    assert got.dtype == np.float32
    with pytest.raises(ShapeError, match="float"):
        run_kernel(op, [x], {"dtype": 6})


def test_random_seed_reproducible_and_not_folded():
    from omrt.kernels import lookup
    a = run_kernel("RandomNormal", [], {"shape": [5], "seed": 3.0})[0]
    b = run_kernel("RandomNormal", [], {"shape": [5], "seed": 3.0})[0]
    c = run_kernel("RandomNormal", [], {"shape": [5], "seed": 4.0})[0]
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    for op in ("RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike",
               "Bernoulli", "Multinomial"):
        assert lookup(op, 21).deterministic is False


@pytest.mark.parametrize("dtype", [None, 1, 7, 9])
def test_bernoulli(dtype):
    p = np.tile(np.array([0.0, 1.0, 0.25, 0.8]), (2000, 1))
    attrs = {} if dtype is None else {"dtype": dtype}
    got = run_kernel("Bernoulli", [p], attrs)[0]
    assert got.dtype == (np.float64 if dtype is None else CAST_TYPES[dtype]) and got.shape == p.shape
    mean = got.astype(np.float64).mean(axis=0)
    np.testing.assert_allclose(mean, [0.0, 1.0, 0.25, 0.8], atol=0.04)
    assert set(np.unique(got.astype(np.float64))) <= {0.0, 1.0}


@pytest.mark.parametrize("dtype", [None, 6, 7])
def test_multinomial(dtype):
    probs = np.array([[0.1, 0.2, 0.7], [0.5, 0.5, 0.0]])
    logits = np.log(np.maximum(probs, 1e-30)).astype(np.float32) + 3.0
    attrs = {"sample_size": 4000} | ({} if dtype is None else {"dtype": dtype})
    got = run_kernel("Multinomial", [logits], attrs)[0]
    assert got.shape == (2, 4000) and got.dtype == (np.int64 if dtype == 7 else np.int32)
    for row, p in zip(got, probs):
        np.testing.assert_allclose(np.bincount(row, minlength=3) / row.size, p, atol=0.04)
    with pytest.raises(ShapeError):
        run_kernel("Multinomial", [np.zeros(3, np.float32)])
