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
                   onnx_dtype, register)

_INT64 = np.dtype(np.int64)
_BIG = 2 ** 31 - 1
"""Slice bounds at or beyond this size mean "to the end" (exporters use INT_MAX or INT64_MAX)."""


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


def _axes_count(ctx: OpContext, inputs: Sequence[TensorInfo | None]) -> int:
    """How many axes the axes input lists when its values are known only at run time."""
    n = _length(inputs[1])
    if n is None:
        raise ShapeError(f"{ctx.name}: {ctx.op_type} needs the number of axes at compile time")
    return n


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
            return [TensorInfo(x.dtype, (None,) * (x.rank - _axes_count(ctx, inputs)))]
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
            return [TensorInfo(x.dtype, (None,) * (x.rank + _axes_count(ctx, inputs)))]
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


@register("Concat", since=4)
@register("Concat", since=1)
class Concat(Kernel):
    """Join along `axis`: each input is written into its slice of the output.

    When all dims before `axis` are 1, input 0 is the output's leading bytes: the planner may
    grow its buffer into the output (`prefix_input`), and `run` then leaves those bytes alone.
    """

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

    @classmethod
    def prefix_input(cls, ctx, inputs, outputs):
        axis = normalize_axis(int(ctx.attrs.get("axis", 1)), outputs[0].rank, ctx.name)
        return 0 if inputs[0] is not None and all(d == 1 for d in outputs[0].shape[:axis]) else None

    def __init__(self, ctx, inputs, outputs):
        super().__init__(ctx, inputs, outputs)
        self.axis = normalize_axis(int(ctx.attrs.get("axis", 1)), outputs[0].rank, ctx.name)

    def run(self, inputs, outputs, workspace):
        out, pos = outputs[0], 0
        lead = (slice(None),) * self.axis
        for i, x in enumerate(inputs):
            if x is None:
                continue
            n = x.shape[self.axis]
            if not (i == 0 and x.size and _same_memory(x, out)):
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
        shape = tuple(dims) if dims is not None else (None,) * n
        return [TensorInfo(cls.fill_value(ctx).dtype, shape)]

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

    The number of parts without sizes comes from `num_outputs` (an attribute from opset 18),
    else from the node's number of outputs.
    """

    @classmethod
    def sizes(cls, ctx: OpContext, inputs: Sequence, dim: Dim) -> list[Dim]:
        """Part sizes along the axis (None entries when not known before run time)."""
        if ctx.opset < 13:
            split = ctx.attrs.get("split")
        elif _present(inputs, 1):
            split = _known(inputs, 1)
            if split is None:
                n = _length(inputs[1])
                if n is None:
                    raise ShapeError(f"{ctx.name}: Split needs the length of its split input at "
                                     f"compile time; it is the number of outputs")
                return [None] * n
        else:
            split = None
        if split is not None:
            split = _ints(split)
            if isinstance(dim, int) and sum(split) != dim:
                raise ShapeError(f"{ctx.name}: Split sizes {split} sum to {sum(split)}, the axis "
                                 f"has {dim}; make them add up")
            return list(split)
        n = int(ctx.attrs.get("num_outputs", ctx.n_outputs))
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


# ----------------------------------------------------------------------------- generators, layout


@register("Trilu", since=14)
class Trilu(Kernel):
    """Keep the upper (j - i >= k) or lower (j - i <= k) triangle of the last two dims; zero the rest."""

    inplace = {0: 0}

    @classmethod
    def infer(cls, ctx, inputs):
        x = inputs[0]
        if x.rank < 2:
            raise ShapeError(f"{ctx.name}: Trilu needs a tensor of rank >= 2, got {x.shape}")
        return [TensorInfo(x.dtype, x.shape)]

    def run(self, inputs, outputs, workspace):
        x, out = inputs[0], outputs[0]
        k = int(inputs[1]) if _present(inputs, 1) else 0
        rows, cols = x.shape[-2:]
        diag = np.arange(cols)[None, :] - np.arange(rows)[:, None]
        drop = diag < k if self.ctx.attrs.get("upper", 1) else diag > k
        if not _same_memory(x, out):
            np.copyto(out, x)
        np.copyto(out, np.zeros((), out.dtype), where=drop)


@register("EyeLike", since=9)
class EyeLike(Kernel):
    """A 2-D tensor of the input's shape with ones on diagonal k, zeros elsewhere."""

    @classmethod
    def infer(cls, ctx, inputs):
        x = inputs[0]
        if x.rank != 2:
            raise ShapeError(f"{ctx.name}: EyeLike needs a 2-D input, got shape {x.shape}")
        code = ctx.attrs.get("dtype")
        return [TensorInfo(x.dtype if code is None else onnx_dtype(code, ctx), x.shape)]

    def run(self, inputs, outputs, workspace):
        out = outputs[0]
        rows, cols = out.shape
        k = int(self.ctx.attrs.get("k", 0))
        out.fill(0)
        # Diagonal k starts at flat offset k (k >= 0) or -k * cols and steps by cols + 1.
        start, count = (k, min(rows, cols - k)) if k >= 0 else (-k * cols, min(cols, rows + k))
        if count > 0:
            out.reshape(-1)[start:start + count * (cols + 1):cols + 1] = 1


class _BlockMove(Kernel):
    """DepthToSpace / SpaceToDepth: a 6-D reshape and a transpose, copied once into `out`."""

    @classmethod
    def plan(cls, ctx: OpContext, shape: Shape) -> tuple[tuple, tuple[int, ...], Shape]:
        """(6-D view of the input, its permutation, the 4-D output shape)."""
        raise NotImplementedError

    @staticmethod
    def params(ctx: OpContext, shape: Shape) -> tuple[int, bool]:
        """(blocksize, DCR mode?) after checking the input is 4-D."""
        if len(shape) != 4:
            raise ShapeError(f"{ctx.name}: {ctx.op_type} needs a 4-D NCHW input, got {tuple(shape)}")
        bs = int(ctx.attrs["blocksize"])
        mode = ctx.attrs.get("mode", "DCR")
        if bs < 1 or mode not in ("DCR", "CRD"):
            raise ShapeError(f"{ctx.name}: {ctx.op_type} needs blocksize >= 1 and mode DCR or CRD "
                             f"(got {bs}, {mode!r})")
        return bs, mode == "DCR"

    @classmethod
    def infer(cls, ctx, inputs):
        x = inputs[0]
        return [TensorInfo(x.dtype, cls.plan(ctx, x.shape)[2])]

    def run(self, inputs, outputs, workspace):
        x, out = inputs[0], outputs[0]
        six, perm, _ = self.plan(self.ctx, x.shape)
        np.copyto(out.reshape([six[p] for p in perm]), x.reshape(six).transpose(perm))


def _mul(d: Dim, k: int) -> Dim:
    return d * k if isinstance(d, int) else d if k == 1 else None


def _div(d: Dim, k: int, ctx: OpContext, what: str) -> Dim:
    if isinstance(d, int):
        if d % k:
            raise ShapeError(f"{ctx.name}: {ctx.op_type} {what} {d} is not divisible by {k}")
        return d // k
    return d if k == 1 else None


@register("DepthToSpace", since=11)
@register("DepthToSpace", since=1)
class DepthToSpace(_BlockMove):
    """Move channel blocks into blocksize x blocksize spatial blocks (DCR or CRD channel order)."""

    @classmethod
    def plan(cls, ctx, shape):
        bs, dcr = cls.params(ctx, shape)
        b, c, h, w = shape
        c2 = _div(c, bs * bs, ctx, "channels")
        if dcr:
            six, perm = (b, bs, bs, c2, h, w), (0, 3, 4, 1, 5, 2)
        else:
            six, perm = (b, c2, bs, bs, h, w), (0, 1, 4, 2, 5, 3)
        return six, perm, (b, c2, _mul(h, bs), _mul(w, bs))


@register("SpaceToDepth", since=28)
@register("SpaceToDepth", since=1)
class SpaceToDepth(_BlockMove):
    """Move blocksize x blocksize spatial blocks into channels (DCR; CRD from opset 28)."""

    @classmethod
    def plan(cls, ctx, shape):
        bs, dcr = cls.params(ctx, shape)
        b, c, h, w = shape
        h2, w2 = _div(h, bs, ctx, "height"), _div(w, bs, ctx, "width")
        perm = (0, 3, 5, 1, 2, 4) if dcr else (0, 1, 3, 5, 2, 4)
        return (b, c, h2, bs, w2, bs), perm, (b, _mul(c, bs * bs), h2, w2)


@register("ReverseSequence", since=10)
class ReverseSequence(Kernel):
    """Reverse the first sequence_lens[b] steps along `time_axis` of each batch entry b."""

    inplace = {0: 0}

    @classmethod
    def infer(cls, ctx, inputs):
        x, lens = inputs[0], inputs[1]
        t, b = int(ctx.attrs.get("time_axis", 0)), int(ctx.attrs.get("batch_axis", 1))
        if x.rank < 2 or {t, b} != {0, 1}:
            raise ShapeError(f"{ctx.name}: ReverseSequence needs rank >= 2 and time/batch axes 0 "
                             f"and 1 in some order (got rank {x.rank}, time {t}, batch {b})")
        _merge(x.shape[b], lens.shape[0] if lens.rank == 1 else None, ctx.name,
               "sequence_lens needs one length per batch entry")
        return [TensorInfo(x.dtype, x.shape)]

    def run(self, inputs, outputs, workspace):
        x, lens = inputs[0], inputs[1]
        out = outputs[0]
        t = int(self.ctx.attrs.get("time_axis", 0))
        if not _same_memory(x, out):
            np.copyto(out, x)
        steps = x.shape[t]
        for i, n in enumerate(lens.tolist()):
            if not 0 <= n <= steps:
                raise KernelError(f"{self.ctx.name}: sequence length {n} of batch entry {i} is "
                                  f"outside [0, {steps}]")
            where = (slice(n), i) if t == 0 else (i, slice(n))
            out[where] = x[where][::-1]


# ----------------------------------------------------------------------------- padding and cropping


def _pad_source(mode: str, pos: np.ndarray, n: int, name: str) -> np.ndarray:
    """For positions outside [0, n) along an axis, the index in [0, n) whose value they copy."""
    if mode == "edge":
        return np.clip(pos, 0, n - 1)
    if mode == "wrap":
        return pos % n
    if mode == "reflect":
        if n == 1:
            return np.zeros_like(pos)
        period = 2 * (n - 1)
        m = pos % period
        return np.where(m < n, m, period - m)
    raise KernelError(f"{name}: Pad mode {mode!r} is unknown; use constant, reflect, edge or wrap")


@register("Pad", since=19)
@register("Pad", since=18)
@register("Pad", since=11)
@register("Pad", since=2)
@register("Pad", since=1)
class Pad(Kernel):
    """Pad (or, with negative pads, crop) each axis: constant, reflect, edge or wrap (opset 19).

    pads are [x1_begin, x2_begin, ..., x1_end, x2_end, ...] over `axes` (opset 18; all axes
    otherwise): an attribute before opset 11, an input after. Negative pads remove elements
    first; reflect, edge and wrap then read the remaining elements.
    """

    @staticmethod
    def widths(ctx: OpContext, inputs: Sequence, rank: int) -> tuple[list[int], list[int]] | None:
        """(before, after) per axis, or None when pads or axes are not known yet."""
        if ctx.opset < 11:
            pads, axes = ctx.attrs.get("pads" if ctx.opset >= 2 else "paddings"), None
        else:
            pads = _known(inputs, 1)
            axes = _known(inputs, 3) if ctx.opset >= 18 else None
            if pads is None or (axes is None and ctx.opset >= 18 and _present(inputs, 3)):
                return None
        pads = _ints(pads)
        axes = list(range(rank)) if axes is None else _normalize_axes(_ints(axes), rank, ctx.name)
        if len(pads) != 2 * len(axes):
            raise ShapeError(f"{ctx.name}: Pad needs 2 pads per padded axis ({len(axes)} axes), "
                             f"got {len(pads)}")
        before, after = [0] * rank, [0] * rank
        for i, a in enumerate(axes):
            before[a], after[a] = pads[i], pads[len(axes) + i]
        return before, after

    @classmethod
    def infer(cls, ctx, inputs):
        x = inputs[0]
        w = cls.widths(ctx, inputs, x.rank)
        if w is None:
            return [TensorInfo(x.dtype, (None,) * x.rank)]
        dims: list[Dim] = []
        for d, b, a in zip(x.shape, *w):
            if isinstance(d, int) and d + b + a < 0:
                raise ShapeError(f"{ctx.name}: Pad crops {-(b + a)} from an axis of size {d}")
            dims.append(d + b + a if isinstance(d, int) else d if b + a == 0 else None)
        return [TensorInfo(x.dtype, tuple(dims))]

    def fill_value(self, inputs: Sequence[np.ndarray | None]) -> object:
        if self.ctx.opset < 11:
            return self.ctx.attrs.get("value", 0.0)
        if _present(inputs, 2) and inputs[2].size:
            return inputs[2].reshape(-1)[0]
        return "" if inputs[0].dtype.kind == "O" else 0

    def run(self, inputs, outputs, workspace):
        x, out = inputs[0], outputs[0]
        before, after = self.widths(self.ctx, inputs, x.ndim)
        src = tuple(slice(max(-b, 0), d - max(-a, 0)) for d, b, a in zip(x.shape, before, after))
        core = tuple(slice(max(b, 0), max(b, 0) + s.stop - s.start) for b, s in zip(before, src))
        out[core] = x[src]
        mode = self.ctx.attrs.get("mode", "constant")
        for i, c in enumerate(core):
            size, lead = out.shape[i], (slice(None),) * i
            if c.start == 0 and c.stop == size:
                continue
            if mode == "constant":
                value = self.fill_value(inputs)
                out[lead + (slice(0, c.start),)] = value
                out[lead + (slice(c.stop, size),)] = value
                continue
            n = c.stop - c.start
            if n == 0:
                raise KernelError(f"{self.ctx.name}: Pad cannot {mode}-pad axis {i}: no elements "
                                  f"are left to copy from")
            # Axes before i are padded already (whole extent); axes after i only in their core.
            pads = np.r_[np.arange(c.start), np.arange(c.stop, size)]
            src_idx = _pad_source(mode, pads - c.start, n, self.ctx.name)
            band = out[lead + (c,) + core[i + 1:]]
            out[lead + (pads,) + core[i + 1:]] = np.take(band, src_idx, axis=i)


@register("CenterCropPad", since=18)
class CenterCropPad(Kernel):
    """Crop or zero-pad the listed axes to the given sizes, keeping the content centred.

    Odd differences put the extra element at the end: a crop starts at (dim - size) // 2 and a
    pad puts (size - dim) // 2 zeros first.
    """

    @staticmethod
    def axes(ctx: OpContext, rank: int) -> list[int]:
        axes = ctx.attrs.get("axes")
        return list(range(rank)) if axes is None else _normalize_axes(_ints(axes), rank, ctx.name)

    @classmethod
    def infer(cls, ctx, inputs):
        x, target = inputs[0], inputs[1]
        axes = cls.axes(ctx, x.rank)
        dims = list(x.shape)
        sizes = [None] * len(axes) if target.value is None else _ints(target.value)
        if len(sizes) != len(axes) or any(s is not None and s < 0 for s in sizes):
            raise ShapeError(f"{ctx.name}: CenterCropPad needs one non-negative size per axis "
                             f"{axes}, got {sizes}")
        for a, s in zip(axes, sizes):
            dims[a] = s
        return [TensorInfo(x.dtype, tuple(dims))]

    def run(self, inputs, outputs, workspace):
        x, out = inputs[0], outputs[0]
        src, dst = [slice(None)] * x.ndim, [slice(None)] * x.ndim
        for a in self.axes(self.ctx, x.ndim):
            d, t = x.shape[a], out.shape[a]
            if t < d:
                src[a] = slice((d - t) // 2, (d - t) // 2 + t)
            elif t > d:
                dst[a] = slice((t - d) // 2, (t - d) // 2 + d)
        if any(s != slice(None) for s in dst):
            out.fill(0)
        out[tuple(dst)] = x[tuple(src)]
