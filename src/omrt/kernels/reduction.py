"""Reduction kernels: ReduceXxx, ArgMax/ArgMin, TopK, CumSum/CumProd, the Softmax family, NLL losses."""

from __future__ import annotations

from typing import Any, Callable, ClassVar, Sequence

import numpy as np

from ..errors import ShapeError
from .base import Kernel, OpContext, Shape, TensorInfo, normalize_axis, numel, register


def _axes_tuple(values: Any, rank: int, name: str) -> tuple[int, ...]:
    """Axes (a list or an int array) made non-negative, sorted and unique."""
    return tuple(sorted({normalize_axis(int(a), rank, name) for a in np.ravel(values)}))


def _reduce_axes(values: Any, noop: bool, rank: int, name: str) -> tuple[int, ...]:
    """The axes a ReduceXxx op reduces: all of them when none are given, unless `noop`."""
    if np.size(values) == 0:
        return () if noop else tuple(range(rank))
    return _axes_tuple(values, rank, name)


def _scratch(x: np.ndarray, workspace: np.ndarray | None) -> np.ndarray:
    """An array shaped like `x` in a workspace of x.nbytes (absent when `x` is empty)."""
    if workspace is None:
        return np.empty_like(x)
    return workspace[:x.nbytes].view(x.dtype).reshape(x.shape)


def _reduced_shape(shape: Shape, axes: tuple[int, ...], keepdims: bool) -> Shape:
    if keepdims:
        return tuple(1 if i in axes else d for i, d in enumerate(shape))
    return tuple(d for i, d in enumerate(shape) if i not in axes)


# ----------------------------------------------------------------------------- ReduceXxx


class Reduce(Kernel):
    """Base of every ReduceXxx op: axes, keepdims and noop_with_empty_axes handled once.

    Subclasses implement `reduce(x, axes, out, workspace)` with `out` in keepdims shape; the
    spec says "Reduction over an empty set of values yields" the op's identity (0 for sums,
    1 for products, -inf for LogSum/LogSumExp/Max, +inf for Min), which `reduce` must give.
    From `axes_input_since` the axes are the optional second input and, "if
    noop_with_empty_axes is true" and they are empty, no axis is reduced (the op's elementwise
    part, like the square of ReduceSumSquare, still applies).
    """

    axes_input_since: ClassVar[int] = 18
    scratch_for: ClassVar[Callable[[np.dtype], bool]] = staticmethod(lambda dtype: False)
    """True for the input dtypes where `reduce` needs scratch the size of the input."""

    @classmethod
    def _axes(cls, ctx: OpContext, inputs: Sequence[TensorInfo | None],
              rank: int) -> tuple[int, ...] | None:
        """The reduced axes, or None when they are an input whose value is not known yet."""
        if ctx.opset >= cls.axes_input_since:
            given = inputs[1] if len(inputs) > 1 else None
            if given is not None and given.value is None:
                return None
            values = given.value if given is not None else []
            noop = bool(ctx.attr("noop_with_empty_axes", 0))
        else:
            values, noop = ctx.attr("axes", []), False
        return _reduce_axes(values, noop, rank, ctx.name)

    @classmethod
    def infer(cls, ctx: OpContext, inputs: Sequence[TensorInfo | None]) -> list[TensorInfo]:
        x = inputs[0]
        keepdims = bool(ctx.attr("keepdims", 1))
        axes = cls._axes(ctx, inputs, x.rank)
        if axes is not None:
            return [TensorInfo(x.dtype, _reduced_shape(x.shape, axes, keepdims))]
        if keepdims:
            return [TensorInfo(x.dtype, (None,) * x.rank)]
        count = inputs[1].shape[0] if inputs[1].rank == 1 else None
        if not isinstance(count, int) or count == 0:
            raise ShapeError(f"{ctx.name}: {ctx.op_type} with keepdims=0 needs its axes input to have "
                             f"a known length to know the output rank; make axes a constant")
        return [TensorInfo(x.dtype, (None,) * (x.rank - count))]

    def __init__(self, ctx: OpContext, inputs: Sequence[TensorInfo | None],
                 outputs: Sequence[TensorInfo]) -> None:
        super().__init__(ctx, inputs, outputs)
        self.rank = inputs[0].rank
        self.axes = type(self)._axes(ctx, inputs, self.rank)
        self.keep_shape = None if self.axes is None else _reduced_shape(inputs[0].shape, self.axes, True)

    def workspace(self) -> int:
        x = self.inputs[0]
        return x.nbytes if type(self).scratch_for(x.dtype) else 0

    def run(self, inputs, outputs, workspace):
        x = inputs[0]
        axes, keep_shape = self.axes, self.keep_shape
        if axes is None:
            axes = _reduce_axes(inputs[1], bool(self.ctx.attr("noop_with_empty_axes", 0)),
                                self.rank, self.ctx.name)
            keep_shape = _reduced_shape(x.shape, axes, True)
        with np.errstate(divide="ignore", invalid="ignore"):
            self.reduce(x, axes, outputs[0].reshape(keep_shape), workspace)

    def reduce(self, x: np.ndarray, axes: tuple[int, ...], out: np.ndarray,
               workspace: np.ndarray | None) -> None:
        raise NotImplementedError(f"{type(self).__name__}.reduce")


def reduction(axes_input_since: int = 18, scratch_for: Callable[[np.dtype], bool] | None = None
              ) -> Callable[[Callable[..., None]], type[Reduce]]:
    """Register a Reduce subclass named like its `reduce` function, for both forms of axes."""

    def deco(fn: Callable[..., None]) -> type[Reduce]:
        op_type = fn.__name__
        body = {"reduce": fn, "axes_input_since": axes_input_since, "__doc__": fn.__doc__,
                "__module__": __name__}
        if scratch_for is not None:
            body["scratch_for"] = staticmethod(scratch_for)
        cls = type(op_type, (Reduce,), body)
        register(op_type, since=1)(cls)
        return register(op_type, since=axes_input_since)(cls)

    return deco


def _lowest(dtype: np.dtype) -> Any:
    if dtype.kind == "b":
        return False
    return np.iinfo(dtype).min if dtype.kind in "iu" else -np.inf


def _highest(dtype: np.dtype) -> Any:
    if dtype.kind == "b":
        return True
    return np.iinfo(dtype).max if dtype.kind in "iu" else np.inf


def _signed(dtype: np.dtype) -> bool:
    return dtype.kind != "u"


def _always(dtype: np.dtype) -> bool:
    return True


def _einsum_lacks(dtype: np.dtype) -> bool:
    """True for dtypes outside numpy's own (bfloat16), which numpy.einsum rejects."""
    return dtype.kind not in "biuf"


def _sum_squares(x: np.ndarray, axes: tuple[int, ...], out: np.ndarray,
                 workspace: np.ndarray | None) -> None:
    """Sum of x*x over `axes` into `out` (keepdims shape), by einsum without a squared copy of x."""
    if _einsum_lacks(x.dtype):
        np.sum(np.square(x, out=_scratch(x, workspace)), axis=axes, out=out, keepdims=True)
        return
    letters = "".join(chr(ord("a") + i) for i in range(x.ndim))
    kept = "".join(c for i, c in enumerate(letters) if i not in axes)
    flat = out.reshape([d for i, d in enumerate(x.shape) if i not in axes])
    np.einsum(f"{letters},{letters}->{kept}", x, x, out=flat)


@reduction(axes_input_since=13)
def ReduceSum(self, x, axes, out, workspace):
    """Sum over the axes."""
    np.sum(x, axis=axes, out=out, keepdims=True)


@reduction()
def ReduceMean(self, x, axes, out, workspace):
    """Arithmetic mean over the axes (integers truncate, an empty set gives NaN)."""
    np.sum(x, axis=axes, out=out, keepdims=True)
    np.divide(out, numel([x.shape[a] for a in axes]), out=out, casting="unsafe")


@reduction()
def ReduceMax(self, x, axes, out, workspace):
    """Maximum over the axes; the lowest value of the dtype for an empty set."""
    np.maximum.reduce(x, axis=axes, out=out, keepdims=True, initial=_lowest(x.dtype))


@reduction()
def ReduceMin(self, x, axes, out, workspace):
    """Minimum over the axes; the highest value of the dtype for an empty set."""
    np.minimum.reduce(x, axis=axes, out=out, keepdims=True, initial=_highest(x.dtype))


@reduction()
def ReduceProd(self, x, axes, out, workspace):
    """Product over the axes."""
    np.prod(x, axis=axes, out=out, keepdims=True)


@reduction(scratch_for=_signed)
def ReduceL1(self, x, axes, out, workspace):
    """Sum of absolute values over the axes."""
    if _signed(x.dtype):
        x = np.abs(x, out=_scratch(x, workspace))
    np.sum(x, axis=axes, out=out, keepdims=True)


@reduction(scratch_for=_einsum_lacks)
def ReduceL2(self, x, axes, out, workspace):
    """Euclidean norm over the axes."""
    _sum_squares(x, axes, out, workspace)
    np.sqrt(out, out=out, casting="unsafe")


@reduction(scratch_for=_einsum_lacks)
def ReduceSumSquare(self, x, axes, out, workspace):
    """Sum of squares over the axes."""
    _sum_squares(x, axes, out, workspace)


@reduction()
def ReduceLogSum(self, x, axes, out, workspace):
    """Natural log of the sum over the axes."""
    np.sum(x, axis=axes, out=out, keepdims=True)
    np.log(out, out=out, casting="unsafe")


@reduction(scratch_for=_always)
def ReduceLogSumExp(self, x, axes, out, workspace):
    """log(sum(exp(x))) over the axes, shifted by the maximum so that exp cannot overflow."""
    np.maximum.reduce(x, axis=axes, out=out, keepdims=True, initial=-np.inf)
    out[~np.isfinite(out)] = 0
    shifted = np.subtract(x, out, out=_scratch(x, workspace))
    np.exp(shifted, out=shifted)
    total = np.sum(shifted, axis=axes, keepdims=True)
    np.log(total, out=total)
    np.add(out, total, out=out)


# ----------------------------------------------------------------------------- ArgMax, ArgMin


class ArgReduce(Kernel):
    """Index of the extreme value along `axis` (int64), first occurrence unless select_last_index."""

    pick: ClassVar[Callable[..., np.ndarray]]

    @classmethod
    def infer(cls, ctx: OpContext, inputs: Sequence[TensorInfo | None]) -> list[TensorInfo]:
        x = inputs[0]
        axis = normalize_axis(ctx.attr("axis", 0), x.rank, ctx.name)
        if x.shape[axis] == 0:
            raise ShapeError(f"{ctx.name}: {ctx.op_type} over axis {axis} of size 0 has no answer; "
                             f"the input {x.shape} must not be empty along it")
        return [TensorInfo(np.dtype(np.int64),
                           _reduced_shape(x.shape, (axis,), bool(ctx.attr("keepdims", 1))))]

    def __init__(self, ctx: OpContext, inputs: Sequence[TensorInfo | None],
                 outputs: Sequence[TensorInfo]) -> None:
        super().__init__(ctx, inputs, outputs)
        x = inputs[0]
        self.axis = normalize_axis(ctx.attr("axis", 0), x.rank, ctx.name)
        self.last = bool(ctx.attr("select_last_index", 0))
        self.keep_shape = _reduced_shape(x.shape, (self.axis,), True)

    def run(self, inputs, outputs, workspace):
        x, out = inputs[0], outputs[0].reshape(self.keep_shape)
        if out.size == 0:
            return
        if self.last:
            x = np.flip(x, self.axis)
        type(self).pick(x, axis=self.axis, out=out, keepdims=True)
        if self.last:
            np.subtract(x.shape[self.axis] - 1, out, out=out)


@register("ArgMax", since=1)
class ArgMax(ArgReduce):
    """Index of the maximum along `axis`."""

    pick = staticmethod(np.argmax)


@register("ArgMin", since=1)
class ArgMin(ArgReduce):
    """Index of the minimum along `axis`."""

    pick = staticmethod(np.argmin)


# ----------------------------------------------------------------------------- TopK


@register("TopK", since=1)
class TopK(Kernel):
    """The k largest (or smallest) values along `axis` and their int64 indices, sorted.

    "Given two equivalent values, this operator uses the indices along the axis as a tiebreaker.
    That is, the element with the lower index will appear first." (also when choosing which of
    equal values at the k-th place make it in). Before opset 10 k is an attribute, then input K.
    """

    @classmethod
    def _k(cls, ctx: OpContext, inputs: Sequence[TensorInfo | None]) -> int | None:
        if ctx.opset < 10:
            return int(ctx.attr("k"))
        value = inputs[1].value
        return None if value is None else int(np.ravel(value)[0])

    @classmethod
    def infer(cls, ctx: OpContext, inputs: Sequence[TensorInfo | None]) -> list[TensorInfo]:
        x = inputs[0]
        axis = normalize_axis(ctx.attr("axis", -1), x.rank, ctx.name)
        k = cls._k(ctx, inputs)
        n = x.shape[axis]
        if k is not None and (k < 0 or (isinstance(n, int) and k > n)):
            raise ShapeError(f"{ctx.name}: TopK k={k} is outside [0, {n}] for axis {axis} of "
                             f"input {x.shape}; lower k")
        shape = tuple(k if i == axis else d for i, d in enumerate(x.shape))
        return [TensorInfo(x.dtype, shape), TensorInfo(np.dtype(np.int64), shape)]

    def __init__(self, ctx: OpContext, inputs: Sequence[TensorInfo | None],
                 outputs: Sequence[TensorInfo]) -> None:
        super().__init__(ctx, inputs, outputs)
        self.axis = normalize_axis(ctx.attr("axis", -1), inputs[0].rank, ctx.name)
        self.largest = bool(ctx.attr("largest", 1))

    def run(self, inputs, outputs, workspace):
        x = inputs[0]
        k = outputs[0].shape[self.axis]
        if outputs[0].size == 0:
            return
        n = x.shape[self.axis]
        rows = np.moveaxis(x, self.axis, -1).reshape(-1, n)
        index = self._top(rows, k)
        moved = np.moveaxis(outputs[1], self.axis, -1)
        moved[...] = index.reshape(moved.shape)
        values = np.moveaxis(outputs[0], self.axis, -1)
        values[...] = np.take_along_axis(rows, index, axis=1).reshape(values.shape)

    def _top(self, rows: np.ndarray, k: int) -> np.ndarray:
        """Indices of the top k of each row, in output order."""
        n = rows.shape[1]
        if k < n:
            kth = n - k if self.largest else k - 1
            part = np.argpartition(rows, kth, axis=1)
            cand = part[:, n - k:] if self.largest else part[:, :k]
            vals = np.take_along_axis(rows, cand, axis=1)
            edge = (vals.min if self.largest else vals.max)(axis=1, keepdims=True)
            if ((rows == edge).sum(axis=1) == (vals == edge).sum(axis=1)).all():
                return self._order(vals, cand)
        return self._order(rows, np.broadcast_to(np.arange(n), rows.shape))[:, :k]

    def _order(self, vals: np.ndarray, index: np.ndarray) -> np.ndarray:
        """`index` sorted by value (descending when largest), equal values by ascending index."""
        if self.largest:
            perm = np.lexsort((-index, vals), axis=1)[:, ::-1]
        else:
            perm = np.lexsort((index, vals), axis=1)
        return np.take_along_axis(index, perm, axis=1)


# ----------------------------------------------------------------------------- CumSum, CumProd


class Cumulative(Kernel):
    """Running sum or product along the axis given as input 1, optionally exclusive and/or reversed."""

    accumulate: ClassVar[Callable[..., np.ndarray]]
    identity: ClassVar[int]

    @classmethod
    def infer(cls, ctx: OpContext, inputs: Sequence[TensorInfo | None]) -> list[TensorInfo]:
        x = inputs[0]
        return [TensorInfo(x.dtype, x.shape)]

    def run(self, inputs, outputs, workspace):
        x, out = inputs[0], outputs[0]
        axis = normalize_axis(int(np.ravel(inputs[1])[0]), x.ndim, self.ctx.name)
        if self.ctx.attr("reverse", 0):
            x, out = np.flip(x, axis), np.flip(out, axis)
        if self.ctx.attr("exclusive", 0):
            if x.shape[axis] == 0:
                return
            lead = (slice(None),) * axis
            out[lead + (0,)] = type(self).identity
            x, out = x[lead + (slice(0, -1),)], out[lead + (slice(1, None),)]
        type(self).accumulate(x, axis=axis, out=out, dtype=x.dtype)


@register("CumSum", since=11)
class CumSum(Cumulative):
    """Cumulative sum along an axis."""

    accumulate = staticmethod(np.cumsum)
    identity = 0


@register("CumProd", since=26)
class CumProd(Cumulative):
    """Cumulative product along an axis."""

    accumulate = staticmethod(np.cumprod)
    identity = 1


# ----------------------------------------------------------------------------- Softmax family


def _log_softmax(x: np.ndarray, out: np.ndarray) -> None:
    """LogSoftmax along axis 1 of `x` into `out` (not in place: x is read twice)."""
    top = x.max(axis=1, keepdims=True)
    np.subtract(x, top, out=out)
    np.exp(out, out=out)
    total = out.sum(axis=1, keepdims=True)
    np.log(total, out=total)
    np.add(total, top, out=total)
    np.subtract(x, total, out=out)


class SoftmaxBase(Kernel):
    """Softmax-like ops, computed on a (outer, n, inner) view with only reduced-size temporaries.

    Opset 1..12: "The input does not need to explicitly be a 2D vector; rather, it will be
    coerced into one" at `axis` (default 1) and the op runs over the flattened trailing dims.
    Opset 13+: the op runs along `axis` alone (default -1).
    """

    @classmethod
    def infer(cls, ctx: OpContext, inputs: Sequence[TensorInfo | None]) -> list[TensorInfo]:
        x = inputs[0]
        return [TensorInfo(x.dtype, x.shape)]

    def __init__(self, ctx: OpContext, inputs: Sequence[TensorInfo | None],
                 outputs: Sequence[TensorInfo]) -> None:
        super().__init__(ctx, inputs, outputs)
        shape = inputs[0].shape
        rank = len(shape)
        coerce = ctx.opset < 13
        axis = normalize_axis(ctx.attr("axis", 1 if coerce else -1), rank, ctx.name)
        if coerce:
            self.plan = (numel(shape[:axis]), numel(shape[axis:]), 1)
        else:
            self.plan = (numel(shape[:axis]), shape[axis], numel(shape[axis + 1:]))

    def run(self, inputs, outputs, workspace):
        if outputs[0].size == 0:
            return
        self.compute(inputs[0].reshape(self.plan), outputs[0].reshape(self.plan))

    def compute(self, x: np.ndarray, out: np.ndarray) -> None:
        raise NotImplementedError(f"{type(self).__name__}.compute")


@register("Softmax", since=1)
@register("Softmax", since=13)
class Softmax(SoftmaxBase):
    """exp(x - max) / sum(exp(x - max)) along the axis.

    Along the last axis of float32 and float64 data the shift is the tensor's maximum rather than
    each row's: any shift gives the same ratios, and numpy reduces short contiguous rows slowly
    (the row maxima cost as much as all the rest). The exponentials go to the workspace and the
    row sums are BLAS matrix-vector products. Rows whose sum falls below 2**-20 (their maximum
    lies some 14 below the tensor's, where the shift would cost accuracy or underflow) are
    redone with their own maximum; a NaN or infinite maximum takes the row-wise path.
    """

    inplace = {0: 0}
    LOW = 2.0 ** -20

    def __init__(self, ctx: OpContext, inputs: Sequence[TensorInfo | None],
                 outputs: Sequence[TensorInfo]) -> None:
        super().__init__(ctx, inputs, outputs)
        outer, n, inner = self.plan
        dtype = inputs[0].dtype
        fast = inner == 1 and dtype in (np.float32, np.float64) and outer * n > 0
        self.ones = np.ones(n, dtype) if fast else None

    def workspace(self) -> int:
        return 0 if self.ones is None else numel(self.plan) * self.ones.itemsize

    def run(self, inputs, outputs, workspace):
        if self.ones is None:
            super().run(inputs, outputs, workspace)
            return
        rows = self.plan[:2]
        x, out = inputs[0].reshape(rows), outputs[0].reshape(rows)
        top = x.max()
        if not np.isfinite(top):
            self.compute(x, out)
            return
        e = workspace[:x.nbytes].view(x.dtype).reshape(rows)
        np.subtract(x, top, out=e)
        np.exp(e, out=e)
        total = e @ self.ones
        low = np.flatnonzero(total < self.LOW)
        if low.size:
            redo = x[low]
            with np.errstate(invalid="ignore"):
                redo -= redo.max(axis=1, keepdims=True)
            np.exp(redo, out=redo)
            e[low] = redo
            total[low] = redo.sum(axis=1)
        np.divide(e, total[:, None], out=out)

    def compute(self, x: np.ndarray, out: np.ndarray) -> None:
        top = x.max(axis=1, keepdims=True)
        np.subtract(x, top, out=out)
        np.exp(out, out=out)
        total = out.sum(axis=1, keepdims=True)
        np.divide(out, total, out=out)


@register("LogSoftmax", since=1)
@register("LogSoftmax", since=13)
class LogSoftmax(SoftmaxBase):
    """x - max - log(sum(exp(x - max))) along the axis."""

    def compute(self, x: np.ndarray, out: np.ndarray) -> None:
        _log_softmax(x, out)


@register("Hardmax", since=1)
@register("Hardmax", since=13)
class Hardmax(SoftmaxBase):
    """1 at the first maximum along the axis, 0 elsewhere."""

    inplace = {0: 0}

    def compute(self, x: np.ndarray, out: np.ndarray) -> None:
        first = np.argmax(x, axis=1, keepdims=True)
        out.fill(0)
        np.put_along_axis(out, first, 1, axis=1)


# ----------------------------------------------------------------------------- losses


class Loss(Kernel):
    """Negative log-likelihood of the targets' log-probabilities, weighted, then reduced.

    "loss[n][d_1]...[d_k] = -input[n][c][d_1]...[d_k] * weight[c]" with c = target[n][d_1]...;
    targets equal to `ignore_index` add nothing, and "mean" divides by the sum of the weights
    of the targets not ignored. The scores are (N, C, d1, ..., dk), the targets (N, d1, ..., dk).
    """

    @classmethod
    def infer(cls, ctx: OpContext, inputs: Sequence[TensorInfo | None]) -> list[TensorInfo]:
        x, target = inputs[0], inputs[1]
        if x.rank < 2 or target.rank != x.rank - 1:
            raise ShapeError(f"{ctx.name}: {ctx.op_type} needs scores (N, C, ...) and targets "
                             f"(N, ...) one rank lower, got {x.shape} and {target.shape}")
        reduction = ctx.attr("reduction", "mean")
        if reduction not in ("none", "sum", "mean"):
            raise ShapeError(f"{ctx.name}: {ctx.op_type} reduction {reduction!r} is not one of "
                             f"'none', 'sum', 'mean'")
        return [TensorInfo(x.dtype, target.shape if reduction == "none" else ())]

    def nll(self, logp: np.ndarray, target: np.ndarray, weight: np.ndarray | None,
            out: np.ndarray) -> None:
        """The loss of log-probabilities `logp` into `out`."""
        n, c = logp.shape[:2]
        logp = logp.reshape(n, c, -1)
        target = target.reshape(n, 1, -1)
        ignore = self.ctx.attr("ignore_index")
        keep = None if ignore is None else target != ignore
        if keep is not None:
            target = np.where(keep, target, 0)
        picked = np.take_along_axis(logp, target, axis=1)
        scale = np.ones_like(picked) if weight is None else weight[target].astype(logp.dtype)
        if keep is not None:
            np.multiply(scale, keep, out=scale)
        loss = np.multiply(picked, scale, out=picked)
        np.negative(loss, out=loss)
        reduction = self.ctx.attr("reduction", "mean")
        if reduction == "none":
            out[...] = loss.reshape(out.shape)
        elif reduction == "sum":
            out[...] = loss.sum()
        else:
            with np.errstate(divide="ignore", invalid="ignore"):
                out[...] = loss.sum() / scale.sum()


@register("NegativeLogLikelihoodLoss", since=12)
class NegativeLogLikelihoodLoss(Loss):
    """NLL loss of given log-probabilities."""

    def run(self, inputs, outputs, workspace):
        self.nll(inputs[0], inputs[1], inputs[2] if len(inputs) > 2 else None, outputs[0])


@register("SoftmaxCrossEntropyLoss", since=12)
class SoftmaxCrossEntropyLoss(Loss):
    """NLL loss of LogSoftmax(scores, axis=1); the log-probabilities are the optional output 1.

    Without that output they are computed in the workspace.
    """

    @classmethod
    def infer(cls, ctx: OpContext, inputs: Sequence[TensorInfo | None]) -> list[TensorInfo]:
        x = inputs[0]
        return [*super().infer(ctx, inputs), TensorInfo(x.dtype, x.shape)]

    def workspace(self) -> int:
        return self.inputs[0].nbytes if len(self.outputs) < 2 or self.outputs[1] is None else 0

    def run(self, inputs, outputs, workspace):
        x = inputs[0]
        logp = outputs[1] if len(outputs) > 1 and outputs[1] is not None else _scratch(x, workspace)
        if x.size:
            shape3 = (x.shape[0], x.shape[1], -1)
            _log_softmax(x.reshape(shape3), logp.reshape(shape3))
        self.nll(logp, inputs[1], inputs[2] if len(inputs) > 2 else None, outputs[0])
