"""Shared helpers for the shape-family kernel tests (shape, views, indexing, layout): test data,
infos with symbolic dims, and one op's shape inference."""

from __future__ import annotations

import numpy as np

from omrt.kernels import OpContext, TensorInfo, lookup

RNG = np.random.default_rng(0)
I64 = np.dtype(np.int64)
F32 = np.dtype(np.float32)


def rand(*shape: int, dtype=np.float32) -> np.ndarray:
    return RNG.standard_normal(shape).astype(dtype) if np.dtype(dtype).kind == "f" else \
        RNG.integers(-50, 50, shape).astype(dtype)


def ints(*v: int) -> np.ndarray:
    return np.array(v, np.int64)


def sym(*shape, dtype=F32) -> TensorInfo:
    return TensorInfo(np.dtype(dtype), tuple(shape))


def const(a) -> TensorInfo:
    return TensorInfo.of(np.asarray(a))


def infer(op: str, inputs, attrs=None, opset: int = 21) -> list[TensorInfo]:
    ctx = OpContext(dict(attrs or {}), opset, name="n0", op_type=op)
    return lookup(op, opset).infer(ctx, inputs)


def shapes(op: str, inputs, attrs=None, opset: int = 21) -> list[tuple]:
    return [o.shape for o in infer(op, inputs, attrs, opset)]
