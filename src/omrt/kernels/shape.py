"""Shape arithmetic (Shape, Size, ConstantOfShape, Range) and the helpers every shape family shares.

Shape inference here and in the view, indexing and layout kernels carries the compile-time folding
of shape sub-graphs (Shape -> Gather -> Concat -> Reshape), so every `infer` propagates symbolic
dims where a rule can tell them. The helpers (input values known at plan time, arithmetic on
symbolic dims, axis lists) live here, the module the others build on.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Sequence

import numpy as np

from ..errors import ShapeError
from .base import Dim, Kernel, OpContext, TensorInfo, normalize_axis, register

_INT64 = np.dtype(np.int64)


# ----------------------------------------------------------------------------- helpers


def _present(inputs: Sequence[object], i: int) -> bool:
    return i < len(inputs) and inputs[i] is not None


def _known(inputs: Sequence[TensorInfo | np.ndarray | None], i: int) -> np.ndarray | None:
    """Input i's value: the array itself at run time, the plan-time value (or None) in infer."""
    x = inputs[i] if i < len(inputs) else None
    return x.value if isinstance(x, TensorInfo) else x


def _ints(a: np.ndarray | Sequence[int]) -> list[int]:
    return [int(v) for v in np.asarray(a).reshape(-1)]


def _length(info: TensorInfo) -> int | None:
    """The number of elements of a 1-D input (an axes or shape list), if known."""
    n = info.shape[0] if info.rank == 1 else 1 if info.rank == 0 else None
    return n if isinstance(n, int) else None


def _quotient(num: Sequence[Dim], den: Sequence[Dim]) -> Dim:
    """prod(num) / prod(den) over symbolic dims: an int, a lone symbol, or None when no rule tells."""
    if None in num or None in den:
        return None
    syms = Counter(d for d in num if isinstance(d, str))
    syms.subtract(d for d in den if isinstance(d, str))
    if any(c < 0 for c in syms.values()):
        return None
    ni = math.prod(d for d in num if isinstance(d, int))
    di = math.prod(d for d in den if isinstance(d, int))
    if di == 0 or ni % di:
        return None
    q = ni // di
    left = list(syms.elements())
    if not left:
        return q
    return left[0] if len(left) == 1 and q == 1 else None


def _product(dims: Sequence[Dim]) -> Dim:
    return _quotient(dims, ())


def _merge(a: Dim, b: Dim, name: str, what: str) -> Dim:
    """Two dims that must agree: the better known one, or a ShapeError when two sizes differ."""
    if isinstance(a, int) and isinstance(b, int):
        if a != b:
            raise ShapeError(f"{name}: {what} ({a} vs {b}); make the sizes equal")
        return a
    if isinstance(a, int) or isinstance(b, int):
        return a if isinstance(a, int) else b
    return a if a is not None else b


def _normalize_axes(axes: Sequence[int], rank: int, name: str) -> list[int]:
    out = [normalize_axis(a, rank, name) for a in axes]
    if len(set(out)) != len(out):
        raise ShapeError(f"{name}: axes {list(axes)} repeat an axis; list each axis once")
    return out


def _same_memory(a: np.ndarray, b: np.ndarray) -> bool:
    return a.__array_interface__["data"][0] == b.__array_interface__["data"][0]


def _shape_from(info: TensorInfo, name: str, op: str) -> tuple[list[int] | None, int]:
    """(values, length) of a 1-D shape input; values None when not known at plan time."""
    if info.value is not None:
        v = _ints(info.value)
        return v, len(v)
    n = _length(info)
    if n is None:
        raise ShapeError(f"{name}: {op} needs the length of its shape input at compile time")
    return None, n


# ----------------------------------------------------------------------------- shape arithmetic


@register("Shape", since=15)
@register("Shape", since=1)
class ShapeOf(Kernel):
    """The input's shape (a slice of it from opset 15) as int64; known at compile time when static."""

    @classmethod
    def infer(cls, ctx, inputs):
        dims = inputs[0].shape[cls.window(ctx, inputs[0].rank)]
        value = np.array(dims, _INT64) if all(isinstance(d, int) for d in dims) else None
        return [TensorInfo(_INT64, (len(dims),), value)]

    @staticmethod
    def window(ctx: OpContext, rank: int) -> slice:
        if ctx.opset < 15:
            return slice(None)
        start = int(ctx.attrs.get("start", 0))
        end = int(ctx.attrs.get("end", rank))
        return slice(*slice(start, end).indices(rank)[:2])

    def run(self, inputs, outputs, workspace):
        outputs[0][...] = inputs[0].shape[self.window(self.ctx, inputs[0].ndim)]


@register("Size", since=1)
class Size(Kernel):
    """The input's element count as an int64 scalar."""

    @classmethod
    def infer(cls, ctx, inputs):
        x = inputs[0]
        value = np.array(math.prod(x.shape), _INT64) if x.static else None
        return [TensorInfo(_INT64, (), value)]

    def run(self, inputs, outputs, workspace):
        outputs[0][...] = inputs[0].size


@register("ConstantOfShape", since=9)
class ConstantOfShape(Kernel):
    """A tensor of the given shape filled with `value` (a 1-element tensor; default float32 0)."""

    @staticmethod
    def fill_value(ctx: OpContext) -> np.ndarray:
        v = ctx.attrs.get("value")
        return np.zeros(1, np.float32) if v is None else np.asarray(v).reshape(-1)[:1]

    @classmethod
    def infer(cls, ctx, inputs):
        dims, n = _shape_from(inputs[0], ctx.name, "ConstantOfShape")
        if dims is not None and min(dims, default=0) < 0:
            raise ShapeError(f"{ctx.name}: ConstantOfShape shape {dims} has a negative size")
        shape = tuple(dims) if dims is not None else (None,) * n
        return [TensorInfo(cls.fill_value(ctx).dtype, shape)]

    def run(self, inputs, outputs, workspace):
        outputs[0].fill(self.fill_value(self.ctx)[0])


@register("Range", since=27)
@register("Range", since=11)
class Range(Kernel):
    """start + i * delta for i < max(ceil((limit - start) / delta), 0).

    Opset 27 adds `stash_type`, the precision float16/bfloat16 ranges are computed in; omrt
    computes every float range in double, at least as precise, and casts back.
    """

    @classmethod
    def infer(cls, ctx, inputs):
        vals = [i.value for i in inputs[:3]]
        dt = inputs[0].dtype
        if any(v is None for v in vals):
            return [TensorInfo(dt, (None,))]
        return [TensorInfo(dt, (cls.count(*vals, ctx.name),))]

    @staticmethod
    def count(start: np.ndarray, limit: np.ndarray, delta: np.ndarray, name: str) -> int:
        s, l, d = (np.asarray(v).reshape(()).item() for v in (start, limit, delta))
        if d == 0:
            raise ShapeError(f"{name}: Range delta is 0; the range would never end")
        return max(math.ceil((l - s) / d), 0)

    def run(self, inputs, outputs, workspace):
        out = outputs[0]
        seq = np.arange(out.shape[0], dtype=np.float64 if out.dtype.kind == "f" else out.dtype)
        np.multiply(seq, inputs[2].reshape(()), out=seq, casting="unsafe")
        np.add(seq, inputs[0].reshape(()), out=seq, casting="unsafe")
        np.copyto(out, seq, casting="unsafe")
