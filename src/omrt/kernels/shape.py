"""Shape and indexing kernels: views, shape arithmetic, slicing, gathering, scattering, padding.

Shape inference here carries the compile-time folding of shape sub-graphs (Shape -> Gather ->
Concat -> Reshape), so every `infer` propagates symbolic dims where a rule can tell them.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Sequence

import numpy as np

from ..errors import KernelError, ShapeError
from .base import (Dim, Kernel, OpContext, Shape, TensorInfo, broadcast_shapes, normalize_axis,
                   register)

_INT64 = np.dtype(np.int64)
_BIG = 2 ** 31 - 1
"""Slice bounds at or beyond this size mean "to the end" (exporters use INT_MAX or INT64_MAX)."""


# ----------------------------------------------------------------------------- helpers


def _present(inputs: Sequence[object], i: int) -> bool:
    return i < len(inputs) and inputs[i] is not None


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


def _axes(ctx: OpContext, inputs: Sequence[TensorInfo | None], index: int, input_since: int,
          ) -> tuple[bool, list[int] | None]:
    """(given, axes) of an axes list that is an attribute before `input_since`, input `index` after.

    `axes` is None when given as an input whose value is not known at plan time.
    """
    if ctx.opset < input_since:
        axes = ctx.attrs.get("axes")
        return axes is not None, None if axes is None else _ints(axes)
    if not _present(inputs, index):
        return False, None
    v = inputs[index].value
    return True, None if v is None else _ints(v)


def _normalize_axes(axes: Sequence[int], rank: int, name: str) -> list[int]:
    out = [normalize_axis(a, rank, name) for a in axes]
    if len(set(out)) != len(out):
        raise ShapeError(f"{name}: axes {list(axes)} repeat an axis; list each axis once")
    return out


def _same_memory(a: np.ndarray, b: np.ndarray) -> bool:
    return a.__array_interface__["data"][0] == b.__array_interface__["data"][0]


def _copy_flat(x: np.ndarray, out: np.ndarray) -> None:
    """out = x in C order with out's shape; nothing to do when the planner made out an alias of x."""
    if out.size and not _same_memory(x, out):
        np.copyto(out, x.reshape(out.shape))


class _View(Kernel):
    """Output 0 is input 0 with another shape: the planner aliases it, `run` copies otherwise."""

    view = True

    def run(self, inputs, outputs, workspace):
        _copy_flat(inputs[0], outputs[0])


# ----------------------------------------------------------------------------- views


@register("Reshape", since=14)
@register("Reshape", since=5)
@register("Reshape", since=1)
class Reshape(_View):
    """Numpy reshape with ONNX's 0 (copy the input dim, unless allowzero) and -1 (inferred) entries."""

    @classmethod
    def infer(cls, ctx, inputs):
        x = inputs[0]
        if ctx.opset < 5:
            spec = _ints(ctx.attrs.get("shape", []))
        else:
            v = inputs[1].value
            if v is None:
                n = _length(inputs[1])
                if n is None:
                    raise ShapeError(f"{ctx.name}: Reshape needs the length of its shape input at "
                                     f"compile time; give the shape input a static length")
                return [TensorInfo(x.dtype, (None,) * n)]
            spec = _ints(v)
        allowzero = ctx.opset >= 14 and bool(ctx.attrs.get("allowzero", 0))
        return [TensorInfo(x.dtype, cls.resolve(spec, x.shape, allowzero, ctx.name))]

    @staticmethod
    def resolve(spec: Sequence[int], shape: Shape, allowzero: bool, name: str) -> Shape:
        """The output shape of reshaping `shape` to `spec` (symbolic dims pass through 0 and -1)."""
        if spec.count(-1) > 1:
            raise ShapeError(f"{name}: Reshape shape {list(spec)} has more than one -1; "
                             f"at most one dim may be inferred")
        if allowzero and 0 in spec and -1 in spec:
            raise ShapeError(f"{name}: Reshape with allowzero=1 cannot have both 0 and -1 in "
                             f"{list(spec)}: the -1 dim is then undetermined")
        dims: list[Dim] = []
        for i, s in enumerate(spec):
            if s == 0 and not allowzero:
                if i >= len(shape):
                    raise ShapeError(f"{name}: Reshape shape {list(spec)} copies dim {i} (a 0) "
                                     f"but the input {tuple(shape)} has rank {len(shape)}")
                dims.append(shape[i])
            elif s < -1:
                raise ShapeError(f"{name}: Reshape shape {list(spec)} has a negative size {s}; "
                                 f"only -1 (infer) is allowed")
            else:
                dims.append(s)
        if -1 in spec:
            k = spec.index(-1)
            known = dims[:k] + dims[k + 1:]
            if all(isinstance(d, int) for d in shape) and all(isinstance(d, int) for d in known):
                total, rest = math.prod(shape), math.prod(known)
                if rest == 0 or total % rest:
                    raise ShapeError(f"{name}: cannot reshape {tuple(shape)} to {list(spec)}: "
                                     f"{total} elements do not divide into dims of product {rest}")
                dims[k] = total // rest
            else:
                dims[k] = _quotient(shape, known)
        elif all(isinstance(d, int) for d in (*shape, *dims)) and math.prod(shape) != math.prod(dims):
            raise ShapeError(f"{name}: cannot reshape {tuple(shape)} ({math.prod(shape)} elements) "
                             f"to {tuple(dims)} ({math.prod(dims)} elements); the counts must match")
        return tuple(dims)


@register("Flatten", since=1)
class Flatten(_View):
    """To 2-D: dims before `axis` make the rows, the rest the columns."""

    @classmethod
    def infer(cls, ctx, inputs):
        x = inputs[0]
        axis = int(ctx.attrs.get("axis", 1))
        if not -x.rank <= axis <= x.rank:
            raise ShapeError(f"{ctx.name}: Flatten axis {axis} is out of range [-{x.rank}, {x.rank}]")
        axis += x.rank if axis < 0 else 0
        return [TensorInfo(x.dtype, (_product(x.shape[:axis]), _product(x.shape[axis:])))]


@register("Squeeze", since=13)
@register("Squeeze", since=1)
class Squeeze(_View):
    """Drop the listed size-1 axes (all size-1 axes when none are listed)."""

    @classmethod
    def infer(cls, ctx, inputs):
        x = inputs[0]
        given, axes = _axes(ctx, inputs, 1, 13)
        if not given:
            # A symbolic dim is taken to be other than 1, as every exporter assumes.
            return [TensorInfo(x.dtype, tuple(d for d in x.shape if d != 1))]
        if axes is None:
            n = _length(inputs[1])
            if n is None:
                raise ShapeError(f"{ctx.name}: Squeeze needs the number of axes at compile time")
            return [TensorInfo(x.dtype, (None,) * (x.rank - n))]
        axes = _normalize_axes(axes, x.rank, ctx.name)
        for a in axes:
            if isinstance(x.shape[a], int) and x.shape[a] != 1:
                raise ShapeError(f"{ctx.name}: Squeeze axis {a} has size {x.shape[a]}, not 1; "
                                 f"squeeze only size-1 axes")
        return [TensorInfo(x.dtype, tuple(d for i, d in enumerate(x.shape) if i not in axes))]


@register("Unsqueeze", since=13)
@register("Unsqueeze", since=1)
class Unsqueeze(_View):
    """Insert size-1 axes at the listed positions of the output."""

    @classmethod
    def infer(cls, ctx, inputs):
        x = inputs[0]
        given, axes = _axes(ctx, inputs, 1, 13)
        if not given:
            raise ShapeError(f"{ctx.name}: Unsqueeze needs axes; give the axes "
                             f"{'input' if ctx.opset >= 13 else 'attribute'}")
        if axes is None:
            n = _length(inputs[1])
            if n is None:
                raise ShapeError(f"{ctx.name}: Unsqueeze needs the number of axes at compile time")
            return [TensorInfo(x.dtype, (None,) * (x.rank + n))]
        rank = x.rank + len(axes)
        axes = _normalize_axes(axes, rank, ctx.name)
        rest = iter(x.shape)
        return [TensorInfo(x.dtype, tuple(1 if i in axes else next(rest) for i in range(rank)))]


@register("Identity", since=1)
class Identity(_View):
    """The input itself."""

    @classmethod
    def infer(cls, ctx, inputs):
        return [TensorInfo(inputs[0].dtype, inputs[0].shape)]


@register("Dropout", since=12)
@register("Dropout", since=1)
class Dropout(_View):
    """Identity at inference, with an all-True mask as optional second output.

    From opset 12 the `training_mode` input may ask for real dropout: "If training_mode is true
    ... the output is computed as output = scale * data * mask, scale = 1. / (1. - ratio)". `run`
    honours it when it is handed a True training_mode; infer returns both the output and the mask
    (the node's second output, when it has one). The node is an alias only without mask output
    and training mode.
    """

    @classmethod
    def infer(cls, ctx, inputs):
        x = inputs[0]
        return [TensorInfo(x.dtype, x.shape), TensorInfo(np.dtype(bool), x.shape)]

    def run(self, inputs, outputs, workspace):
        x, out = inputs[0], outputs[0]
        mask = outputs[1] if len(outputs) > 1 else None
        training = self.ctx.opset >= 12 and _present(inputs, 2) and bool(inputs[2])
        ratio = float(inputs[1]) if self.ctx.opset >= 12 and _present(inputs, 1) else 0.5
        if not training or ratio == 0:
            _copy_flat(x, out)
            if mask is not None:
                mask.fill(True)
            return
        keep = np.random.default_rng(self.ctx.attrs.get("seed")).random(x.shape) >= ratio
        np.multiply(x, keep, out=out)
        np.multiply(out, out.dtype.type(1.0 / (1.0 - ratio)), out=out)
        if mask is not None:
            np.copyto(mask, keep)


# ----------------------------------------------------------------------------- shape arithmetic


@register("Shape", since=15)
@register("Shape", since=1)
class ShapeOf(Kernel):
    """The input's shape (a slice of it from opset 15) as int64; known at compile time when static."""

    op_type = "Shape"

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
            vals = [i.value if isinstance(i, TensorInfo) else i for i in inputs[1:5]]
            vals += [None] * (4 - len(vals))
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
            return set(range(rank)) if axes is None else set(_normalize_axes(_ints(axes), rank, ctx.name))
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

    def run(self, inputs, outputs, workspace):
        x = inputs[0]
        np.copyto(outputs[0], x[_slices(x.shape, *self.params(self.ctx, inputs, x.ndim))])


@register("Concat", since=4)
@register("Concat", since=1)
class Concat(Kernel):
    """Join along `axis`: each input is written into its slice of the output."""

    @classmethod
    def infer(cls, ctx, inputs):
        xs = [x for x in inputs if x is not None]
        first = xs[0]
        axis = normalize_axis(int(ctx.attrs.get("axis", 1)), first.rank, ctx.name)
        dims = list(first.shape)
        for x in xs[1:]:
            if x.rank != first.rank:
                raise ShapeError(f"{ctx.name}: Concat inputs have ranks {first.rank} and {x.rank}; "
                                 f"all inputs need the same rank")
            for i, d in enumerate(x.shape):
                if i != axis:
                    dims[i] = _merge(dims[i], d, ctx.name, f"Concat inputs differ on axis {i}")
        along = [x.shape[axis] for x in xs]
        dims[axis] = sum(along) if all(isinstance(d, int) for d in along) else None
        return [TensorInfo(first.dtype, tuple(dims))]

    def __init__(self, ctx, inputs, outputs):
        super().__init__(ctx, inputs, outputs)
        self.axis = normalize_axis(int(ctx.attrs.get("axis", 1)), outputs[0].rank, ctx.name)

    def run(self, inputs, outputs, workspace):
        out, pos = outputs[0], 0
        lead = (slice(None),) * self.axis
        for x in inputs:
            if x is None:
                continue
            n = x.shape[self.axis]
            out[lead + (slice(pos, pos + n),)] = x
            pos += n


@register("Transpose", since=1)
class Transpose(Kernel):
    """Permute axes (default: reverse them)."""

    @staticmethod
    def perm(ctx: OpContext, rank: int) -> list[int]:
        perm = ctx.attrs.get("perm")
        if perm is None:
            return list(range(rank))[::-1]
        perm = _ints(perm)
        if sorted(perm) != list(range(rank)):
            raise ShapeError(f"{ctx.name}: Transpose perm {perm} is not a permutation of "
                             f"0..{rank - 1}; list each axis once")
        return perm

    @classmethod
    def infer(cls, ctx, inputs):
        x = inputs[0]
        return [TensorInfo(x.dtype, tuple(x.shape[p] for p in cls.perm(ctx, x.rank)))]

    def __init__(self, ctx, inputs, outputs):
        super().__init__(ctx, inputs, outputs)
        self.axes = self.perm(ctx, inputs[0].rank)

    def run(self, inputs, outputs, workspace):
        np.copyto(outputs[0], inputs[0].transpose(self.axes))


def _shape_from(info: TensorInfo, name: str, op: str) -> tuple[list[int] | None, int]:
    """(values, length) of a 1-D shape input; values None when not known at plan time."""
    if info.value is not None:
        v = _ints(info.value)
        return v, len(v)
    n = _length(info)
    if n is None:
        raise ShapeError(f"{name}: {op} needs the length of its shape input at compile time")
    return None, n


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
        return [TensorInfo(cls.fill_value(ctx).dtype, tuple(dims) if dims is not None else (None,) * n)]

    def run(self, inputs, outputs, workspace):
        outputs[0].fill(self.fill_value(self.ctx)[0])


@register("Expand", since=8)
class Expand(Kernel):
    """Broadcast the input to a shape (numpy rules: either side's 1s stretch)."""

    @classmethod
    def infer(cls, ctx, inputs):
        x = inputs[0]
        dims, n = _shape_from(inputs[1], ctx.name, "Expand")
        if dims is not None:
            return [TensorInfo(x.dtype, broadcast_shapes(x.shape, tuple(dims), name=ctx.name))]
        rank = max(n, x.rank)
        padded = (1,) * (rank - x.rank) + x.shape
        return [TensorInfo(x.dtype, tuple(None if d == 1 else d for d in padded))]

    def run(self, inputs, outputs, workspace):
        np.copyto(outputs[0], np.broadcast_to(inputs[0], outputs[0].shape))


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


@register("Tile", since=6)
class Tile(Kernel):
    """Repeat the input `repeats[i]` times along each axis i."""

    @classmethod
    def infer(cls, ctx, inputs):
        x = inputs[0]
        reps = inputs[1].value
        if reps is None:
            return [TensorInfo(x.dtype, (None,) * x.rank)]
        reps = _ints(reps)
        if len(reps) != x.rank or min(reps, default=0) < 0:
            raise ShapeError(f"{ctx.name}: Tile repeats {reps} need one non-negative count per "
                             f"axis of the rank-{x.rank} input")
        return [TensorInfo(x.dtype, tuple(d if r == 1 else d * r if isinstance(d, int) else None
                                          for d, r in zip(x.shape, reps)))]

    def run(self, inputs, outputs, workspace):
        x, out = inputs[0], outputs[0]
        reps = _ints(inputs[1])
        # out seen as (r0, d0, r1, d1, ...) receives x seen as (1, d0, 1, d1, ...) by broadcasting.
        tiled = [v for r, d in zip(reps, x.shape) for v in (r, d)]
        spread = [v for d in x.shape for v in (1, d)]
        np.copyto(out.reshape(tiled), x.reshape(spread))


@register("Split", since=18)
@register("Split", since=13)
@register("Split", since=2)
class Split(Kernel):
    """Cut along `axis` into parts of the given sizes, or into equal parts (the last one smaller).

    The number of parts without sizes comes from `num_outputs` (an attribute from opset 18; the
    compiler sets it from the node's outputs before).
    """

    @classmethod
    def sizes(cls, ctx: OpContext, inputs: Sequence, dim: Dim) -> list[Dim]:
        """Part sizes along the axis (None entries when not known before run time)."""
        if ctx.opset < 13:
            split = ctx.attrs.get("split")
        elif _present(inputs, 1):
            split = inputs[1].value if isinstance(inputs[1], TensorInfo) else inputs[1]
            if split is None:
                return [None] * _length(inputs[1])
        else:
            split = None
        if split is not None:
            split = _ints(split)
            if isinstance(dim, int) and sum(split) != dim:
                raise ShapeError(f"{ctx.name}: Split sizes {split} sum to {sum(split)}, the axis "
                                 f"has {dim}; make them add up")
            return list(split)
        n = ctx.attrs.get("num_outputs")
        if n is None:
            raise ShapeError(f"{ctx.name}: Split without sizes needs the number of outputs "
                             f"(attribute num_outputs)")
        n = int(n)
        if not isinstance(dim, int):
            return [None] * n
        part = -(-dim // n)
        last = dim - part * (n - 1)
        if last < 0 or (ctx.opset < 18 and dim % n):
            raise ShapeError(f"{ctx.name}: Split cannot cut an axis of {dim} into {n} parts")
        return [part] * (n - 1) + [last]

    @classmethod
    def infer(cls, ctx, inputs):
        x = inputs[0]
        axis = normalize_axis(int(ctx.attrs.get("axis", 0)), x.rank, ctx.name)
        return [TensorInfo(x.dtype, x.shape[:axis] + (s,) + x.shape[axis + 1:])
                for s in cls.sizes(ctx, inputs, x.shape[axis])]

    def __init__(self, ctx, inputs, outputs):
        super().__init__(ctx, inputs, outputs)
        self.axis = normalize_axis(int(ctx.attrs.get("axis", 0)), inputs[0].rank, ctx.name)

    def run(self, inputs, outputs, workspace):
        x, pos = inputs[0], 0
        lead = (slice(None),) * self.axis
        for out in outputs:
            n = out.shape[self.axis]
            np.copyto(out, x[lead + (slice(pos, pos + n),)])
            pos += n
