"""Elementwise kernels: unary and broadcasting binary math, logic, comparisons, casts."""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from .base import Kernel, OpContext, TensorInfo, broadcast_shapes, register


class Unary(Kernel):
    """Same shape and dtype in and out; may run in place."""

    inplace = {0: 0}
    fn: Callable[..., None]

    @classmethod
    def infer(cls, ctx: OpContext, inputs: Sequence[TensorInfo | None]) -> list[TensorInfo]:
        x = inputs[0]
        return [TensorInfo(x.dtype, x.shape)]

    def run(self, inputs, outputs, workspace):
        type(self).fn(inputs[0], out=outputs[0])


def unary(op_type: str, fn: Callable[..., None], since: int = 1) -> type[Kernel]:
    """Register a unary kernel from `fn(x, out=...)`."""
    cls = type(op_type, (Unary,), {"fn": staticmethod(fn)})
    return register(op_type, since)(cls)


def _relu(x: np.ndarray, out: np.ndarray) -> None:
    np.maximum(x, x.dtype.type(0), out=out)


unary("Relu", _relu)
