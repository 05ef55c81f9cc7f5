"""Indexing kernels: Gather, Slice, the element and N-d gathers and scatters, OneHot, and the ops
whose output size depends on values (NonZero, Compress, Unique).

Each reads or writes the elements that indices, bounds or a condition name; indices are checked
against the axis they address (a KernelError naming the range) before numpy reads through them.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from ..errors import KernelError, ShapeError
from .base import Dim, Kernel, OpContext, Shape, TensorInfo, normalize_axis, register
from .shape import (_INT64, _ints, _known, _length, _merge, _normalize_axes, _present, _product,
                    _same_memory)

_BIG = 2 ** 31 - 1
"""Slice bounds at or beyond this size mean "to the end" (exporters use INT_MAX or INT64_MAX)."""


# ----------------------------------------------------------------------------- gather and slice


def _check_indices(idx: np.ndarray, n: int, name: str, what: str) -> None:
    """Raise KernelError unless every index is in [-n, n)."""
    if idx.size and (idx.min() < -n or idx.max() >= n):
        raise KernelError(f"{name}: {what} index out of range [-{n}, {n}) "
                          f"(got {int(idx.min())}..{int(idx.max())}); fix the indices")


@register("Gather", since=1)
class Gather(Kernel):
    """np.take along `axis`; negative indices count from the end."""

    @classmethod
    def infer(cls, ctx, inputs):
        data, idx = inputs[0], inputs[1]
        axis = normalize_axis(int(ctx.attrs.get("axis", 0)), data.rank, ctx.name)
        shape = data.shape[:axis] + idx.shape + data.shape[axis + 1:]
        return [TensorInfo(data.dtype, shape)]

    def __init__(self, ctx, inputs, outputs):
        super().__init__(ctx, inputs, outputs)
        self.axis = normalize_axis(int(ctx.attrs.get("axis", 0)), inputs[0].rank, ctx.name)

    def run(self, inputs, outputs, workspace):
        data, idx = inputs
        _check_indices(idx, data.shape[self.axis], self.ctx.name, "Gather")
        # mode="wrap" maps valid negative indices and, unlike "raise", does not buffer `out`.
        np.take(data, idx, axis=self.axis, out=outputs[0], mode="wrap")


def _slice_dim(dim: Dim, start: int, end: int, step: int) -> Dim:
    """The length of dim[start:end:step] with ONNX clamping; symbolic when the slice is whole."""
    if isinstance(dim, int):
        return len(range(*slice(start, end, step).indices(dim)))
    forward = step == 1 and (start == 0 or start <= -_BIG) and end >= _BIG
    backward = step == -1 and (start == -1 or start >= _BIG) and end <= -_BIG
    return dim if forward or backward else None


def _slices(shape: Sequence[int], starts: Sequence[int], ends: Sequence[int],
            axes: Sequence[int], steps: Sequence[int]) -> tuple[slice, ...]:
    """Numpy slices of an ONNX Slice on a concrete shape (axes already normalized)."""
    out = [slice(None)] * len(shape)
    for s, e, a, st in zip(starts, ends, axes, steps):
        r = range(*slice(s, e, st).indices(shape[a]))
        # Python's clamped stop -1 (walk back past index 0) means "before the start" to numpy.
        out[a] = slice(r.start, r.stop if r.stop >= 0 else None, st) if r else slice(0, 0)
    return tuple(out)


@register("Slice", since=10)
@register("Slice", since=1)
class Slice(Kernel):
    """Strided slices along chosen axes; starts/ends are clamped, negative steps walk backwards."""

    @classmethod
    def params(cls, ctx: OpContext, inputs: Sequence, rank: int,
               ) -> tuple[list[int], list[int], list[int], list[int]] | None:
        """(starts, ends, axes, steps) with axes normalized, or None when not known yet."""
        if ctx.opset < 10:
            starts, ends = _ints(ctx.attrs["starts"]), _ints(ctx.attrs["ends"])
            axes = ctx.attrs.get("axes")
            steps = None
        else:
            vals = [_known(inputs, i) for i in range(1, 5)]
            if vals[0] is None or vals[1] is None or (_present(inputs, 3) and vals[2] is None) \
                    or (_present(inputs, 4) and vals[3] is None):
                return None
            starts, ends, axes, steps = vals
            starts, ends = _ints(starts), _ints(ends)
        axes = list(range(len(starts))) if axes is None else _ints(axes)
        steps = [1] * len(starts) if steps is None else _ints(steps)
        name = ctx.name
        if not len(starts) == len(ends) == len(axes) == len(steps):
            raise ShapeError(f"{name}: Slice starts, ends, axes and steps must have one entry per "
                             f"sliced axis (got {len(starts)}, {len(ends)}, {len(axes)}, {len(steps)})")
        if 0 in steps:
            raise ShapeError(f"{name}: Slice steps cannot be 0")
        return starts, ends, _normalize_axes(axes, rank, name), steps

    @staticmethod
    def touched(ctx: OpContext, inputs: Sequence[TensorInfo | None], rank: int) -> set[int]:
        """The axes a Slice with unknown bounds may change."""
        if _present(inputs, 3):
            axes = inputs[3].value
            if axes is None:
                return set(range(rank))
            return set(_normalize_axes(_ints(axes), rank, ctx.name))
        n = _length(inputs[1])
        return set(range(rank if n is None else n))

    @classmethod
    def infer(cls, ctx, inputs):
        x = inputs[0]
        p = cls.params(ctx, inputs, x.rank)
        if p is None:
            return [TensorInfo(x.dtype, tuple(None if i in cls.touched(ctx, inputs, x.rank) else d
                                              for i, d in enumerate(x.shape)))]
        dims = list(x.shape)
        for s, e, a, st in zip(*p):
            dims[a] = _slice_dim(dims[a], s, e, st)
        return [TensorInfo(x.dtype, tuple(dims))]

    def __init__(self, ctx, inputs, outputs):
        super().__init__(ctx, inputs, outputs)
        x = inputs[0]
        p = self.params(ctx, inputs, x.rank) if x.static else None
        self.slices = None if p is None else _slices(x.shape, *p)

    def run(self, inputs, outputs, workspace):
        x = inputs[0]
        slices = self.slices
        if slices is None:
            slices = _slices(x.shape, *self.params(self.ctx, inputs, x.ndim))
        np.copyto(outputs[0], x[slices])


# ----------------------------------------------------------------------------- gather and scatter


def _strides(shape: Sequence[int]) -> list[int]:
    """C-order strides in elements."""
    out, step = [], 1
    for d in reversed(shape):
        out.append(step)
        step *= d
    return out[::-1]


def _element_offsets(idx: np.ndarray, shape: Sequence[int], axis: int, lin: np.ndarray,
                     name: str, op: str) -> None:
    """lin = flat C-order offsets into `shape` of the elements idx addresses along `axis`.

    Element i of idx (of any shape with idx.shape[d] <= shape[d]) addresses position i with its
    coordinate on `axis` replaced by idx[i]: offset = sum_d i_d * stride_d, i_axis = idx[i].
    """
    n = shape[axis]
    _check_indices(idx, n, name, op)
    strides = _strides(shape)
    np.copyto(lin, idx, casting="unsafe")
    np.remainder(lin, n, out=lin)
    np.multiply(lin, strides[axis], out=lin)
    for d, size in enumerate(idx.shape):
        if d != axis and size > 1:
            ramp = np.arange(0, size * strides[d], strides[d], dtype=np.int64)
            np.add(lin, ramp.reshape([-1 if e == d else 1 for e in range(idx.ndim)]), out=lin)


def _nd_offsets(idx: np.ndarray, shape: Sequence[int], name: str, op: str) -> np.ndarray:
    """Flat offsets of the index tuples in idx's last axis into the first dims of `shape`."""
    lin = np.zeros(idx.shape[:-1], np.int64)
    if lin.size == 0:
        return lin
    for j, stride in enumerate(_strides(shape[:idx.shape[-1]])):
        col = idx[..., j]
        _check_indices(col, shape[j], name, op)
        lin += (col % shape[j]) * stride
    return lin


def _scatter(flat: np.ndarray, lin: np.ndarray, updates: np.ndarray, reduction: str,
             name: str) -> None:
    """flat[lin] = updates, or combined with the ufunc of `reduction`."""
    if reduction == "none":
        flat[lin] = updates
        return
    fn = _REDUCTIONS.get(reduction)
    if fn is None:
        raise KernelError(f"{name}: unknown reduction {reduction!r}; use none, add, mul, min or max")
    fn.at(flat, lin, updates)


_REDUCTIONS = {"add": np.add, "mul": np.multiply, "min": np.minimum, "max": np.maximum}


class _ElementIndexed(Kernel):
    """Shared by GatherElements and ScatterElements: the axis, and int64 flat offsets in the workspace."""

    def __init__(self, ctx, inputs, outputs):
        super().__init__(ctx, inputs, outputs)
        self.axis = normalize_axis(int(ctx.attrs.get("axis", 0)), inputs[0].rank, ctx.name)

    def workspace(self) -> int:
        return 8 * math.prod(self.inputs[1].shape)


@register("GatherElements", since=11)
class GatherElements(_ElementIndexed):
    """out[i][j][k] = data[idx[i][j][k]][j][k] (for axis 0): np.take_along_axis into `out`."""

    @classmethod
    def infer(cls, ctx, inputs):
        data, idx = inputs[0], inputs[1]
        normalize_axis(int(ctx.attrs.get("axis", 0)), data.rank, ctx.name)
        if idx.rank != data.rank:
            raise ShapeError(f"{ctx.name}: GatherElements indices have rank {idx.rank}, data "
                             f"rank {data.rank}; they must match")
        return [TensorInfo(data.dtype, idx.shape)]

    def run(self, inputs, outputs, workspace):
        data, idx = inputs[0], inputs[1]
        if idx.size == 0:
            return
        lin = workspace[:8 * idx.size].view(np.int64).reshape(idx.shape)
        _element_offsets(idx, data.shape, self.axis, lin, self.ctx.name, "GatherElements")
        np.take(data.reshape(-1), lin, out=outputs[0], mode="wrap")


@register("ScatterElements", since=18)
@register("ScatterElements", since=16)
@register("ScatterElements", since=11)
class ScatterElements(_ElementIndexed):
    """out = data; out[idx[i][j][k]][j][k] = updates[i][j][k] (axis 0), or combined by `reduction`.

    "reduction: Type of reduction to apply: none (default), add, mul, max, min" (add/mul from
    opset 16, max/min from 18); with `none`, duplicate indices leave an unspecified one of them.
    """

    inplace = {0: 0}

    @classmethod
    def infer(cls, ctx, inputs):
        data, idx, upd = inputs[:3]
        normalize_axis(int(ctx.attrs.get("axis", 0)), data.rank, ctx.name)
        if idx.rank != data.rank or (idx.shape != upd.shape and idx.static and upd.static):
            raise ShapeError(f"{ctx.name}: {ctx.op_type} indices {idx.shape} and updates "
                             f"{upd.shape} must have one shape, of the rank of data {data.shape}")
        return [TensorInfo(data.dtype, data.shape)]


    def run(self, inputs, outputs, workspace):
        data, idx, upd = inputs[:3]
        out = outputs[0]
        if not _same_memory(data, out):
            np.copyto(out, data)
        if idx.size == 0:
            return
        lin = workspace[:8 * idx.size].view(np.int64).reshape(idx.shape)
        _element_offsets(idx, data.shape, self.axis, lin, self.ctx.name, self.ctx.op_type)
        _scatter(out.reshape(-1), lin, upd, self.ctx.attrs.get("reduction", "none"), self.ctx.name)


@register("Scatter", since=9)
class Scatter(ScatterElements):
    """The deprecated name of ScatterElements (opsets 9 and 10), without reduction."""

    op_type = "Scatter"


@register("GatherND", since=12)
@register("GatherND", since=11)
class GatherND(Kernel):
    """Gather slices of data addressed by index tuples (the last axis of indices).

    With `batch_dims` b (opset 12), the first b dims of data and indices are batch dims that
    index each other one-to-one; the output shape is indices.shape[:-1] + data.shape[b + k:].
    """

    @classmethod
    def infer(cls, ctx, inputs):
        data, idx = inputs[0], inputs[1]
        b = int(ctx.attrs.get("batch_dims", 0))
        k = idx.shape[-1] if idx.rank else None
        if idx.rank < 1 or b >= min(idx.rank, data.rank):
            raise ShapeError(f"{ctx.name}: GatherND needs indices of rank >= 1 and batch_dims "
                             f"{b} below the ranks of data {data.shape} and indices {idx.shape}")
        if not isinstance(k, int):
            raise ShapeError(f"{ctx.name}: GatherND needs the last dim of indices (the tuple "
                             f"length) at compile time; it fixes the output rank")
        if b + k > data.rank:
            raise ShapeError(f"{ctx.name}: GatherND index tuples of length {k} after {b} batch "
                             f"dims exceed the rank of data {data.shape}")
        for i in range(b):
            _merge(data.shape[i], idx.shape[i], ctx.name, f"GatherND batch dim {i} differs")
        return [TensorInfo(data.dtype, idx.shape[:-1] + data.shape[b + k:])]

    def run(self, inputs, outputs, workspace):
        data, idx = inputs[0], inputs[1]
        b = int(self.ctx.attrs.get("batch_dims", 0))
        k = idx.shape[-1]
        batch = math.prod(data.shape[:b])
        block = math.prod(data.shape[b:b + k])
        rest = math.prod(data.shape[b + k:])
        lin = _nd_offsets(idx, data.shape[b:], self.ctx.name, "GatherND").reshape(batch, -1)
        lin += (np.arange(batch, dtype=np.int64) * block)[:, None]
        np.take(data.reshape(batch * block, rest), lin.reshape(-1), axis=0,
                out=outputs[0].reshape(lin.size, rest), mode="wrap")


@register("ScatterND", since=18)
@register("ScatterND", since=16)
@register("ScatterND", since=11)
class ScatterND(Kernel):
    """out = data; out[idx[i]] = updates[i] for each index tuple, or combined by `reduction`."""

    inplace = {0: 0}

    @classmethod
    def infer(cls, ctx, inputs):
        data, idx, upd = inputs[:3]
        k = idx.shape[-1] if idx.rank else None
        if isinstance(k, int):
            want = idx.shape[:-1] + data.shape[k:]
            clash = any(isinstance(u, int) and isinstance(w, int) and u != w
                        for u, w in zip(upd.shape, want))
            if k > data.rank or upd.rank != len(want) or clash:
                raise ShapeError(f"{ctx.name}: ScatterND updates {upd.shape} must have shape "
                                 f"indices.shape[:-1] + data.shape[k:] = {want}")
        return [TensorInfo(data.dtype, data.shape)]

    def run(self, inputs, outputs, workspace):
        data, idx, upd = inputs[:3]
        out = outputs[0]
        if not _same_memory(data, out):
            np.copyto(out, data)
        k = idx.shape[-1]
        lin = _nd_offsets(idx, data.shape, self.ctx.name, "ScatterND").reshape(-1)
        rest = math.prod(data.shape[k:])
        rows = out.reshape(math.prod(data.shape[:k]), rest)
        _scatter(rows, lin, upd.reshape(lin.size, rest),
                 self.ctx.attrs.get("reduction", "none"), self.ctx.name)


@register("OneHot", since=11)
@register("OneHot", since=9)
class OneHot(Kernel):
    """values[1] where the new `axis` coordinate equals the index, values[0] elsewhere.

    "Any entries in the 'indices' input tensor with values outside the range [-depth, depth-1]
    will result in one-hot representation with all 'off_value' values" (opset 11; opset 9 says
    [0, depth), but runtimes wrap negative indices there too, and so does omrt).
    """

    @classmethod
    def infer(cls, ctx, inputs):
        idx, depth, values = inputs[:3]
        axis = normalize_axis(int(ctx.attrs.get("axis", -1)), idx.rank + 1, ctx.name)
        n = None if depth.value is None else int(np.asarray(depth.value).reshape(-1)[0])
        if n is not None and n < 1:
            raise ShapeError(f"{ctx.name}: OneHot depth {n} must be positive")
        return [TensorInfo(values.dtype, idx.shape[:axis] + (n,) + idx.shape[axis:])]

    def run(self, inputs, outputs, workspace):
        idx, _, values = inputs[:3]
        out = outputs[0]
        axis = normalize_axis(int(self.ctx.attrs.get("axis", -1)), out.ndim, self.ctx.name)
        depth = out.shape[axis]
        off, on = values.reshape(-1)[:2]
        out.fill(off)
        pos = idx.astype(np.int64)
        pos[pos < 0] += depth
        hit = (pos >= 0) & (pos < depth)
        where = np.nonzero(hit)
        np.moveaxis(out, axis, -1)[where + (pos[where],)] = on


# ----------------------------------------------------------------------------- dynamic outputs


@register("NonZero", since=9)
class NonZero(Kernel):
    """Coordinates of the non-zero elements, one column each (shape [rank, count])."""

    dynamic = True

    @classmethod
    def infer(cls, ctx, inputs):
        return [TensorInfo(_INT64, (inputs[0].rank, None))]

    def run(self, inputs, outputs, workspace):
        x = inputs[0]
        if x.ndim == 0:
            return [np.zeros((0, int(x != 0)), np.int64)]
        return [np.array(np.nonzero(x), dtype=np.int64).reshape(x.ndim, -1)]


@register("Compress", since=11)
@register("Compress", since=9)
class Compress(Kernel):
    """numpy.compress: keep the slices along `axis` (elements of the flattened input without an
    axis) whose condition entry is True.

    "Its length can be less than the input length along the axis ... In such cases data slices
    or elements exceeding the condition length are discarded." The output size depends on the
    condition's values, so the kernel is dynamic (infer still tells it when the condition is
    known at compile time).
    """

    dynamic = True

    @classmethod
    def infer(cls, ctx, inputs):
        x, cond = inputs[0], inputs[1]
        axis = ctx.attrs.get("axis")
        n = None if cond.value is None else cls.count(cond.value, x.shape, axis, ctx.name)
        if axis is None:
            return [TensorInfo(x.dtype, (n,))]
        axis = normalize_axis(int(axis), x.rank, ctx.name)
        return [TensorInfo(x.dtype, x.shape[:axis] + (n,) + x.shape[axis + 1:])]

    @staticmethod
    def count(cond: np.ndarray, shape: Shape, axis: int | None, name: str) -> Dim:
        """How many slices a condition selects, or a ShapeError when it is too long."""
        size = (_product(shape) if axis is None
                else shape[normalize_axis(int(axis), len(shape), name)])
        cond = np.asarray(cond).reshape(-1)
        if isinstance(size, int) and cond.size > size:
            raise ShapeError(f"{name}: Compress condition has {cond.size} entries for {size} "
                             f"slices; it may be shorter, never longer")
        return int(np.count_nonzero(cond[:size] if isinstance(size, int) else cond))

    def run(self, inputs, outputs, workspace):
        x, cond = inputs[0], inputs[1]
        axis = self.ctx.attrs.get("axis")
        self.count(cond, x.shape, axis, self.ctx.name)
        return [np.compress(cond.reshape(-1), x, axis=None if axis is None else int(axis))]


@register("Unique", since=11)
class Unique(Kernel):
    """Unique values (or slices along `axis`), sorted or in order of first occurrence.

    Outputs: Y, the index of each Y entry's first occurrence in X, the Y index of each X entry
    (inverse_indices), and counts; the sizes depend on values, so the kernel is dynamic.
    """

    dynamic = True

    @classmethod
    def infer(cls, ctx, inputs):
        x = inputs[0]
        axis = ctx.attrs.get("axis")
        if axis is None:
            y, n = (None,), _product(x.shape)
        else:
            a = normalize_axis(int(axis), x.rank, ctx.name)
            y, n = x.shape[:a] + (None,) + x.shape[a + 1:], x.shape[a]
        return [TensorInfo(x.dtype, y), TensorInfo(_INT64, (None,)), TensorInfo(_INT64, (n,)),
                TensorInfo(_INT64, (None,))]

    def run(self, inputs, outputs, workspace):
        x = inputs[0]
        axis = self.ctx.attrs.get("axis")
        if axis is not None:
            axis = normalize_axis(int(axis), x.ndim, self.ctx.name)
        y, first, inverse, counts = np.unique(x if axis is not None else x.reshape(-1),
                                              return_index=True, return_inverse=True,
                                              return_counts=True, axis=axis)
        inverse = inverse.reshape(-1)
        if not self.ctx.attrs.get("sorted", 1):
            order = np.argsort(first, kind="stable")
            rank = np.empty_like(order)
            rank[order] = np.arange(order.size)
            y = np.take(y, order, axis=0 if axis is None else axis)
            first, counts, inverse = first[order], counts[order], rank[inverse]
        return [y, first.astype(np.int64), inverse.astype(np.int64), counts.astype(np.int64)]
