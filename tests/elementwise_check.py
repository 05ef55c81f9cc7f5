"""Shared helpers for the elementwise-family kernel tests (elementwise, activations, randomness):
test data, the dtypes they run over, tolerances, and ONNX's data type numbers."""

from __future__ import annotations

import numpy as np

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


CAST_TYPES = {1: np.float32, 2: np.uint8, 3: np.int8, 4: np.uint16, 5: np.int16, 6: np.int32,
              7: np.int64, 9: np.bool_, 10: np.float16, 11: np.float64, 12: np.uint32, 13: np.uint64}
