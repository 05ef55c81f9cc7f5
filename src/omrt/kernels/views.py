"""View kernels: Reshape, Flatten, Squeeze, Unsqueeze, Identity, Dropout and omrt::Part.

Output 0 is input 0 with another shape (`Kernel.view`): the planner makes it an alias of the
input, so these kernels copy only when it could not. Dropout is an alias too, at inference and
without its mask output. Part is input 0's slice [index] along its first axis, an alias at an
offset.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from ..errors import ShapeError
from .base import Dim, Kernel, OpContext, Shape, TensorInfo, register
from .shape import _ints, _length, _normalize_axes, _present, _product, _quotient, _same_memory


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


@register("Part", since=1, domain="omrt")
class Part(_View):
    """omrt-internal: x[index] along x's first axis, contiguous in x (a stacked product's part,
    omrt.compiler.passes.stack_sibling_products), planned as an alias at its offset in x."""

    @classmethod
    def infer(cls, ctx, inputs):
        x, index = inputs[0], int(ctx.attrs.get("index", 0))
        if x.rank < 1 or not isinstance(x.shape[0], int) or not 0 <= index < x.shape[0]:
            raise ShapeError(f"{ctx.name}: Part index {index} is outside the first axis of {x.shape}")
        return [TensorInfo(x.dtype, x.shape[1:])]

    @classmethod
    def view_offset(cls, ctx, inputs, outputs):
        return int(ctx.attrs.get("index", 0)) * outputs[0].nbytes

    def run(self, inputs, outputs, workspace):
        x, out = inputs[0], outputs[0]
        if out.size and not _same_memory(x[int(self.ctx.attrs.get("index", 0))], out):
            np.copyto(out, x[int(self.ctx.attrs.get("index", 0))])
