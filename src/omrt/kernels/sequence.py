"""Sequences and optionals: building, reading and taking apart lists of tensors and maybe-values.

At run time a sequence is a Python list of arrays and an optional is None or its element. Such
values are never planned in the arena: the kernels that produce them are dynamic and return new
lists (never modifying one they were given), so a sequence can be shared by later readers safely.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import ShapeError
from ..ir import OPTIONAL, SEQUENCE
from .base import Kernel, OpContext, TensorInfo, normalize_axis, onnx_dtype, register
from .control import bare, merge, split_captures

_INT64 = np.dtype(np.int64)
_BOOL = np.dtype(np.bool_)


def _sequence(info: TensorInfo | None, ctx: OpContext, what: str = "input 0") -> TensorInfo:
    if info is None or info.container != SEQUENCE:
        got = "nothing" if info is None else f"a {info.kind}"
        raise ShapeError(f"{ctx.name}: {ctx.op_type} {what} must be a sequence of tensors, it is {got}")
    return info


def _position(pos: Any, n: int, ctx: OpContext, inserting: bool = False) -> int:
    """A position in a sequence of `n` made non-negative: [-n, n-1], or [-n, n] when inserting."""
    p = int(np.asarray(pos).reshape(-1)[0])
    hi = n if inserting else n - 1
    if not -n <= p <= hi:
        raise ShapeError(f"{ctx.name}: {ctx.op_type} position {p} is outside [{-n}, {hi}] for a sequence "
                         f"of {n} tensors")
    return p + n if p < 0 else p


def _element_of(seq: TensorInfo, tensor: TensorInfo, ctx: OpContext) -> TensorInfo:
    """The element info of `seq` after `tensor` joins it."""
    if seq.value is not None and not seq.value:
        return bare(tensor)
    return merge(seq.element(), bare(tensor), ctx, "element")


@register("SequenceEmpty", since=11)
class SequenceEmpty(Kernel):
    """An empty sequence of `dtype` tensors (default float)."""

    dynamic = True

    @classmethod
    def infer(cls, ctx, inputs):
        return [TensorInfo(onnx_dtype(ctx.attr("dtype", 1), ctx), None, kind=SEQUENCE)]

    def run(self, inputs, outputs, workspace):
        return [[]]


@register("SequenceConstruct", since=11)
class SequenceConstruct(Kernel):
    """A sequence of the inputs, which must share one dtype."""

    dynamic = True

    @classmethod
    def infer(cls, ctx, inputs):
        if not inputs or any(i is None for i in inputs):
            raise ShapeError(f"{ctx.name}: SequenceConstruct needs one or more tensors")
        elem = bare(inputs[0])
        for i, x in enumerate(inputs[1:], 1):
            elem = merge(elem, bare(x), ctx, f"input {i}")
        return [elem.wrapped(SEQUENCE)]

    def run(self, inputs, outputs, workspace):
        return [list(inputs)]


@register("SequenceAt", since=11)
class SequenceAt(Kernel):
    """The tensor at `position` ("Negative value means counting positions from the back")."""

    dynamic = True

    @classmethod
    def infer(cls, ctx, inputs):
        seq, pos = _sequence(inputs[0], ctx), inputs[1]
        if seq.value is not None and pos is not None and pos.value is not None:
            return [bare(TensorInfo.of(seq.value[_position(pos.value, len(seq.value), ctx)]))]
        return [seq.element()]

    def run(self, inputs, outputs, workspace):
        seq, pos = inputs
        return [seq[_position(pos, len(seq), self.ctx)]]


@register("SequenceInsert", since=11)
class SequenceInsert(Kernel):
    """A new sequence with `tensor` inserted at `position` (default: at the end)."""

    dynamic = True

    @classmethod
    def infer(cls, ctx, inputs):
        seq, tensor = _sequence(inputs[0], ctx), inputs[1]
        if tensor.dtype != seq.dtype:
            raise ShapeError(f"{ctx.name}: SequenceInsert inserts a {tensor.dtype} tensor into a sequence "
                             f"of {seq.dtype}; insert a Cast")
        return [_element_of(seq, tensor, ctx).wrapped(SEQUENCE)]

    def run(self, inputs, outputs, workspace):
        seq, tensor = list(inputs[0]), inputs[1]
        pos = inputs[2] if len(inputs) > 2 and inputs[2] is not None else None
        seq.insert(len(seq) if pos is None else _position(pos, len(seq), self.ctx, inserting=True), tensor)
        return [seq]


@register("SequenceErase", since=11)
class SequenceErase(Kernel):
    """A new sequence without the tensor at `position` (default: the last one)."""

    dynamic = True

    @classmethod
    def infer(cls, ctx, inputs):
        return [bare(_sequence(inputs[0], ctx))]

    def run(self, inputs, outputs, workspace):
        seq = list(inputs[0])
        pos = inputs[1] if len(inputs) > 1 and inputs[1] is not None else None
        del seq[-1 if pos is None else _position(pos, len(seq), self.ctx)]
        return [seq]


@register("SequenceLength", since=11)
class SequenceLength(Kernel):
    """The number of tensors in a sequence, as an int64 scalar."""

    @classmethod
    def infer(cls, ctx, inputs):
        seq = _sequence(inputs[0], ctx)
        value = None if seq.value is None else np.array(len(seq.value), _INT64)
        return [TensorInfo(_INT64, (), value)]

    def run(self, inputs, outputs, workspace):
        outputs[0][...] = len(inputs[0])


@register("SplitToSequence", since=11)
class SplitToSequence(Kernel):
    """Splits a tensor along `axis` into a sequence.

    Without `split`, into pieces of 1, whose axis is dropped unless `keepdims`; a scalar `split`
    gives pieces of that length ("the last chunk can be smaller"); a 1-D `split` gives the lengths.
    `keepdims` is "ignored when the 'split' input is specified".
    """

    dynamic = True

    @classmethod
    def _lengths(cls, ctx: OpContext, dim: int, split: np.ndarray | None) -> list[int]:
        if split is None:
            return [1] * dim
        split = np.asarray(split)
        if split.ndim == 0:
            step = int(split)
            if step <= 0:
                raise ShapeError(f"{ctx.name}: SplitToSequence split {step} must be positive")
            return [min(step, dim - s) for s in range(0, dim, step)]
        lengths = [int(s) for s in split]
        if sum(lengths) != dim or min(lengths, default=0) < 0:
            raise ShapeError(f"{ctx.name}: SplitToSequence split {lengths} does not add up to the axis "
                             f"length {dim}")
        return lengths

    @classmethod
    def infer(cls, ctx, inputs):
        x, split = inputs[0], inputs[1] if len(inputs) > 1 else None
        axis = normalize_axis(int(ctx.attr("axis", 0)), x.rank, ctx.name)
        shape = list(x.shape)
        if split is None and not ctx.attr("keepdims", 1):
            del shape[axis]
        elif split is None:
            shape[axis] = 1
        elif split.value is not None and isinstance(x.shape[axis], int):
            lengths = cls._lengths(ctx, x.shape[axis], split.value)
            shape[axis] = lengths[0] if len(set(lengths)) == 1 else None
        else:
            shape[axis] = None
        return [TensorInfo(x.dtype, tuple(shape), kind=SEQUENCE)]

    def run(self, inputs, outputs, workspace):
        x, split = inputs[0], inputs[1] if len(inputs) > 1 else None
        axis = normalize_axis(int(self.ctx.attr("axis", 0)), x.ndim, self.ctx.name)
        lengths = self._lengths(self.ctx, x.shape[axis], split)
        bounds = np.cumsum([0] + lengths)
        pieces = [np.ascontiguousarray(x[(slice(None),) * axis + (slice(a, b),)])
                  for a, b in zip(bounds[:-1], bounds[1:])]
        if split is None and not self.ctx.attr("keepdims", 1):
            pieces = [p.reshape(p.shape[:axis] + p.shape[axis + 1:]) for p in pieces]
        return [pieces]


@register("ConcatFromSequence", since=11)
class ConcatFromSequence(Kernel):
    """Concatenates a sequence's tensors along `axis`, or stacks them on a new one (`new_axis`=1)."""

    dynamic = True

    @classmethod
    def _axis(cls, ctx: OpContext, rank: int) -> int:
        stack = bool(ctx.attr("new_axis", 0))
        return normalize_axis(int(ctx.attr("axis")), rank + stack, ctx.name)

    @classmethod
    def infer(cls, ctx, inputs):
        seq = _sequence(inputs[0], ctx)
        if seq.shape is None:
            return [TensorInfo(seq.dtype, None)]
        axis = cls._axis(ctx, seq.rank)
        shape = list(seq.shape)
        if ctx.attr("new_axis", 0):
            shape.insert(axis, None)
        else:
            shape[axis] = None
        return [TensorInfo(seq.dtype, tuple(shape))]

    def run(self, inputs, outputs, workspace):
        seq = inputs[0]
        if not seq:
            raise ShapeError(f"{self.ctx.name}: ConcatFromSequence got an empty sequence; it needs at "
                             f"least one tensor")
        axis = self._axis(self.ctx, seq[0].ndim)
        join = np.stack if self.ctx.attr("new_axis", 0) else np.concatenate
        return [join(seq, axis=axis)]


@register("SequenceMap", since=17)
class SequenceMap(Kernel):
    """Runs `body` once per position of the input sequence; each body output forms a sequence.

    The body's i-th run takes the i-th tensor of `input_sequence` and of every additional input
    that is a sequence (all as long as the first), and every additional tensor input whole.
    """

    dynamic = True

    @classmethod
    def infer(cls, ctx, inputs):
        ins, caps = split_captures(ctx, inputs)
        _sequence(ins[0], ctx)
        body = [i.element() if i.container == SEQUENCE else bare(i) for i in ins]
        return [bare(o).wrapped(SEQUENCE) for o in ctx.subgraphs["body"].infer(body, caps)]

    def run(self, inputs, outputs, workspace):
        ins, caps = split_captures(self.ctx, inputs)
        n = len(ins[0])
        for i, x in enumerate(ins[1:], 1):
            if isinstance(x, list) and len(x) != n:
                raise ShapeError(f"{self.ctx.name}: SequenceMap input {i} holds {len(x)} tensors, input 0 "
                                 f"holds {n}; sequences must be equally long")
        body = self.ctx.subgraphs["body"]
        results: list[list[Any]] = [[] for _ in body.graph.outputs]
        for k in range(n):
            outs = body.run([x[k] if isinstance(x, list) else x for x in ins], caps)
            for seq, v in zip(results, outs):
                seq.append(v)
        return results


@register("Optional", since=15)
class Optional(Kernel):
    """An optional holding the input, or an empty optional of the attribute `type`."""

    dynamic = True

    @classmethod
    def infer(cls, ctx, inputs):
        if inputs and inputs[0] is not None:
            return [bare(inputs[0]).wrapped(OPTIONAL)]
        declared = ctx.attr("type")
        if not isinstance(declared, TensorInfo):
            raise ShapeError(f"{ctx.name}: Optional without input needs the attribute 'type'")
        return [declared.wrapped(OPTIONAL)]

    def run(self, inputs, outputs, workspace):
        return [inputs[0] if inputs else None]


@register("OptionalHasElement", since=15)
class OptionalHasElement(Kernel):
    """True unless the input is an empty optional or absent (from opset 18, tensors and sequences
    are accepted too, and always have an element)."""

    @classmethod
    def infer(cls, ctx, inputs):
        x = inputs[0] if inputs else None
        value = np.array(False) if x is None else None if x.container == OPTIONAL else np.array(True)
        return [TensorInfo(_BOOL, (), value)]

    def run(self, inputs, outputs, workspace):
        outputs[0][...] = bool(inputs) and inputs[0] is not None


@register("OptionalGetElement", since=15)
class OptionalGetElement(Kernel):
    """The element of a non-empty optional (from opset 18, a tensor or sequence is its own element)."""

    dynamic = True

    @classmethod
    def infer(cls, ctx, inputs):
        x = inputs[0]
        return [x.element() if x.container == OPTIONAL else bare(x)]

    def run(self, inputs, outputs, workspace):
        if inputs[0] is None:
            raise ShapeError(f"{self.ctx.name}: OptionalGetElement got an empty optional; check it with "
                             f"OptionalHasElement first")
        return [inputs[0]]
