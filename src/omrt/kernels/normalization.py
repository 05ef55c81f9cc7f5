"""Normalization kernels: batch, layer, instance, group, RMS, Lp, mean-variance and local response."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..errors import ShapeError
from ..native.bindings import LRN as NATIVE_LRN
from . import parallel
from .base import (FUSED_ACTIVATIONS, Dim, Kernel, OpContext, Shape, TensorInfo, apply_activation,
                   broadcast_shapes, carve, carve_size, normalize_axis, numel, register, run_bound)

_STASH_TYPES = {1: np.dtype(np.float32), 10: np.dtype(np.float16), 11: np.dtype(np.float64)}


def compute_dtype(dtype: np.dtype) -> np.dtype:
    """The float type arithmetic on `dtype` runs in: float16 is widened to float32."""
    return np.dtype(np.float64) if dtype == np.float64 else np.dtype(np.float32)


def _require_float(ctx: OpContext, x: TensorInfo, min_rank: int = 0) -> None:
    if x.dtype.kind != "f":
        raise ShapeError(f"{ctx.name}: {ctx.op_type} needs a float input, got {x.dtype}; "
                         f"insert a Cast to float32 before it")
    if x.rank < min_rank:
        raise ShapeError(f"{ctx.name}: {ctx.op_type} needs an input of rank >= {min_rank} "
                         f"(N x C x ...), got shape {x.shape}")


def _stash(ctx: OpContext) -> np.dtype:
    code = int(ctx.attr("stash_type", 1))
    if code not in _STASH_TYPES:
        raise ShapeError(f"{ctx.name}: stash_type {code} is not supported; use 1 (float32)")
    return _STASH_TYPES[code]


def _sum_squares(a: np.ndarray, axes: tuple[int, ...], dtype: np.dtype | None = None) -> np.ndarray:
    """sum(a * a) over `axes`, keepdims, without a temporary the size of `a`."""
    letters = "abcdefghijklmnopqrstuvwxyz"[:a.ndim]
    kept = "".join(c for i, c in enumerate(letters) if i not in axes)
    res = np.einsum(f"{letters},{letters}->{kept}", a, a, dtype=dtype)
    return np.asarray(res).reshape([1 if i in axes else d for i, d in enumerate(a.shape)])


def standardize(x: np.ndarray, out: np.ndarray, axes: tuple[int, ...], epsilon: float,
                center: bool = True, eps_outside_sqrt: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """out = (x - mean) / sqrt(var + eps) over `axes`; returns (mean, var) with keepdims.

    `x` and `out` share a float dtype and may be the same array. Without `center` it is the RMS
    norm x / sqrt(mean(x^2) + eps) (mean is then 0); with `eps_outside_sqrt` the divisor is
    sqrt(var) + eps.
    """
    count = max(numel(tuple(x.shape[a] for a in axes)), 1)
    if center:
        mean = np.mean(x, axis=axes, keepdims=True)
        np.subtract(x, mean, out=out)
        centered = out
    else:
        mean = np.zeros([1 if i in axes else d for i, d in enumerate(x.shape)], x.dtype)
        centered = x
    var = _sum_squares(centered, axes) / count
    divisor = np.sqrt(var) + epsilon if eps_outside_sqrt else np.sqrt(var + epsilon)
    np.multiply(centered, (1 / divisor).astype(out.dtype, copy=False), out=out)
    return mean, var


class _SameShape(Kernel):
    """A float op whose output has the input's shape and dtype."""

    min_rank = 0

    @classmethod
    def param_length(cls, ctx: OpContext, x: TensorInfo) -> Dim:
        """The length of the 1-D parameter inputs (scale, bias, ...), or None when they are not vectors."""
        return None

    @classmethod
    def infer(cls, ctx: OpContext, inputs: Sequence[TensorInfo | None]) -> list[TensorInfo]:
        x = inputs[0]
        _require_float(ctx, x, cls.min_rank)
        n = cls.param_length(ctx, x)
        for i, p in enumerate(inputs[1:], 1):
            if n is None or p is None:
                continue
            if p.rank != 1 or (isinstance(n, int) and isinstance(p.shape[0], int) and p.shape[0] != n):
                raise ShapeError(f"{ctx.name}: input {i} of {ctx.op_type} must be a vector of {n} values "
                                 f"(for X of shape {x.shape}), got shape {p.shape}")
        return [TensorInfo(x.dtype, x.shape)]


def _channel_view(v: np.ndarray, rank: int) -> np.ndarray:
    """A per-channel vector shaped to broadcast over axis 1 of an (N, C, ...) tensor."""
    return v.reshape((-1,) + (1,) * (rank - 2))


@register("BatchNormalization", since=1)
class BatchNormalization(_SameShape):
    """Y = (X - mean) / sqrt(var + eps) * scale + B per channel (axis 1).

    Inference folds the statistics into one multiply-add. Opsets 1-9 always run in inference form
    whatever `is_test`/`spatial` say, and their training outputs are rejected. From opset 14,
    `training_mode` normalizes by the batch statistics and emits the running statistics:
    "running_mean = input_mean * momentum + current_mean * (1 - momentum)", and likewise for the
    variance, where current_var is the population variance over every axis but the channel axis.
    """

    inplace = {0: 0}
    min_rank = 2
    fuses = frozenset(FUSED_ACTIVATIONS)

    @classmethod
    def param_length(cls, ctx: OpContext, x: TensorInfo) -> Dim:
        return x.shape[1]

    @classmethod
    def infer(cls, ctx: OpContext, inputs: Sequence[TensorInfo | None]) -> list[TensorInfo]:
        y = super().infer(ctx, inputs)
        if not ctx.attr("training_mode", 0):
            return y
        c = inputs[0].shape[1]
        return y + [TensorInfo(inputs[3].dtype, (c,)), TensorInfo(inputs[4].dtype, (c,))]

    def __init__(self, ctx: OpContext, inputs: Sequence[TensorInfo | None],
                 outputs: Sequence[TensorInfo | None]) -> None:
        super().__init__(ctx, inputs, outputs)
        self.training = bool(ctx.attr("training_mode", 0))
        if not self.training and any(o is not None for o in outputs[1:]):
            raise ShapeError(f"{ctx.name}: BatchNormalization training outputs (running or saved "
                             f"statistics) are only supported with training_mode=1 from opset 14; "
                             f"export the model in inference mode (only output Y)")
        self.epsilon = float(ctx.attr("epsilon", 1e-5))
        self.momentum = float(ctx.attr("momentum", 0.9))
        x = inputs[0]
        self.ct = compute_dtype(x.dtype)
        self.buffered = self.training and self.ct != x.dtype
        stats = [i.value if i is not None else None for i in inputs[1:5]]
        self.affine = (None if self.training or any(v is None for v in stats)
                       else self._affine(*stats, x.rank))

    def _affine(self, scale, bias, mean, var, rank: int) -> tuple[np.ndarray, np.ndarray]:
        """The per-channel multiply and add that inference BatchNorm reduces to."""
        ct = self.ct
        a = scale.astype(ct) / np.sqrt(var.astype(ct) + ct.type(self.epsilon))
        b = bias.astype(ct) - mean.astype(ct) * a
        return _channel_view(a, rank), _channel_view(b, rank)

    def workspace(self) -> int:
        return carve_size((self.inputs[0].shape, self.ct)) if self.buffered else 0

    def run(self, inputs, outputs, workspace):
        x, scale, bias, mean, var = inputs[:5]
        y = outputs[0]
        if self.training:
            self._train(inputs, outputs, workspace)
        else:
            a, b = self.affine or self._affine(scale, bias, mean, var, x.ndim)
            np.multiply(x, a, out=y, casting="same_kind")
            np.add(y, b, out=y, casting="same_kind")
        apply_activation(y, self.ctx)

    def _train(self, inputs, outputs, workspace) -> None:
        """Normalize by the batch statistics into output 0 and emit the running statistics."""
        x, scale, bias, mean, var = inputs[:5]
        y = outputs[0]
        ct = self.ct
        buf = carve(workspace, (x.shape, ct))[0] if self.buffered else y
        if self.buffered:
            np.copyto(buf, x)
        axes = (0,) + tuple(range(2, x.ndim))
        cur_mean, cur_var = standardize(buf if self.buffered else x, buf, axes, self.epsilon)
        np.multiply(buf, _channel_view(scale, x.ndim), out=buf, casting="same_kind")
        np.add(buf, _channel_view(bias, x.ndim), out=buf, casting="same_kind")
        if self.buffered:
            np.copyto(y, buf, casting="same_kind")
        m = self.momentum
        for out, running, current in zip(outputs[1:3], (mean, var), (cur_mean, cur_var)):
            if out is not None:
                np.copyto(out, running * m + current.reshape(-1) * (1 - m), casting="same_kind")


@register("LRN", since=1)
class LRN(_SameShape):
    """Local response normalization across channels.

    "square_sum[n, c, d1, ..., dk] = sum(X[n, i, d1, ..., dk] ^ 2), where
    max(0, c - floor((size - 1) / 2)) <= i <= min(C - 1, c + ceil((size - 1) / 2))";
    Y = X / (bias + alpha / size * square_sum) ^ beta. The window sum is `size` shifted slice adds.
    For float32 with beta 0.75 (AlexNet's, GoogLeNet's and ZFNet's), the native loop does the
    same sums per block of pixels, while they are in L1, and the power as 1/sqrt(t) times its
    square root: numpy's five passes and its power took 13% of GoogLeNet's run.
    """

    min_rank = 3
    native_units = ("elementwise",)

    def __init__(self, ctx: OpContext, inputs: Sequence[TensorInfo | None],
                 outputs: Sequence[TensorInfo]) -> None:
        super().__init__(ctx, inputs, outputs)
        self.size = int(ctx.attrs["size"]) if "size" in ctx.attrs else 0
        if self.size < 1:
            raise ShapeError(f"{ctx.name}: LRN needs a positive 'size' attribute")
        self.alpha = float(ctx.attr("alpha", 1e-4))
        self.beta = float(ctx.attr("beta", 0.75))
        self.bias = float(ctx.attr("bias", 1.0))
        x = inputs[0]
        self.ct = compute_dtype(x.dtype)
        self.shapes = [x.shape] * (1 if self.ct == x.dtype else 2)
        self.native_lrn = None
        if ctx.native is not None and x.dtype == np.float32 and self.beta == 0.75:
            self.native_lrn = ctx.native.get(NATIVE_LRN)

    def workspace(self) -> int:
        return carve_size(*((s, self.ct) for s in self.shapes))

    def bind(self, inputs, outputs, workspace):
        x, y = inputs[0], outputs[0]
        if self.native_lrn is None or x.size == 0 or not (x.flags.c_contiguous and y.flags.c_contiguous):
            return None
        below, above = (self.size - 1) // 2, -(-(self.size - 1) // 2)
        return [self.native_lrn.bind(x, y, x.shape[0], x.shape[1], numel(x.shape[2:]), below, above,
                                     self.alpha / self.size, self.bias, parallel.native_threads(nbytes=x.nbytes))]

    def run(self, inputs, outputs, workspace):
        if run_bound(self.bind(inputs, outputs, workspace)):
            return
        x = inputs[0]
        y = outputs[0]
        bufs = carve(workspace, *((s, self.ct) for s in self.shapes))
        acc = bufs[0]
        sq = y if len(bufs) == 1 else bufs[1]
        np.multiply(x, x, out=sq, casting="same_kind")
        channels = x.shape[1]
        lo_off = -((self.size - 1) // 2)
        hi_off = -(-(self.size - 1) // 2)
        acc.fill(0)
        for off in range(lo_off, hi_off + 1):
            lo, hi = max(0, -off), min(channels, channels - off)
            if lo < hi:
                np.add(acc[:, lo:hi], sq[:, lo + off:hi + off], out=acc[:, lo:hi])
        np.multiply(acc, self.alpha / self.size, out=acc)
        np.add(acc, self.bias, out=acc)
        np.power(acc, -self.beta, out=acc)
        np.multiply(x, acc, out=y, casting="same_kind")


class _Standardizing(_SameShape):
    """Normalize over some axes in a stash precision, then scale and shift: the base of the norm ops.

    Subclasses set `axes` (of the array `reduction_view` returns) in __init__ and may override
    `affine`. (Not named `view`: that is the contract's alias flag, and a method there is truthy.)
    """

    inplace = {0: 0}
    center = True
    eps_outside_sqrt = False

    def __init__(self, ctx: OpContext, inputs: Sequence[TensorInfo | None],
                 outputs: Sequence[TensorInfo]) -> None:
        super().__init__(ctx, inputs, outputs)
        x = inputs[0]
        self.epsilon = float(ctx.attr("epsilon", 1e-5))
        self.stash = self.stash_dtype(ctx, x.dtype)
        self.axes: tuple[int, ...] = ()

    @staticmethod
    def stash_dtype(ctx: OpContext, dtype: np.dtype) -> np.dtype:
        return compute_dtype(dtype)

    def reduction_view(self, a: np.ndarray) -> np.ndarray:
        """The shape the reduction runs on (a reshape of the input)."""
        return a

    def workspace(self) -> int:
        x = self.inputs[0]
        return 0 if self.stash == x.dtype else carve_size((x.shape, self.stash))

    def affine(self, y: np.ndarray, inputs: Sequence[np.ndarray | None]) -> None:
        """Apply the scale and bias inputs to the normalized `y` (input-shaped), in place."""

    def run(self, inputs, outputs, workspace):
        x = inputs[0]
        y = outputs[0]
        buffered = self.stash != x.dtype
        buf = carve(workspace, (x.shape, self.stash))[0] if buffered else y
        if buffered:
            np.copyto(buf, x)
        with np.errstate(invalid="ignore", divide="ignore"):
            mean, var = standardize(self.reduction_view(buf if buffered else x),
                                    self.reduction_view(buf), self.axes, self.epsilon, self.center,
                                    self.eps_outside_sqrt)
            stats = (mean, 1 / np.sqrt(var + self.epsilon))
        self.affine(buf, inputs)
        if buffered:
            np.copyto(y, buf, casting="same_kind")
        for out, stat in zip(outputs[1:], stats):
            if out is not None:
                np.copyto(out, stat.reshape(out.shape), casting="same_kind")


class _LastAxes(_Standardizing):
    """Normalization over axes [axis, rank) with a unidirectionally broadcast Scale (and B)."""

    @classmethod
    def infer(cls, ctx: OpContext, inputs: Sequence[TensorInfo | None]) -> list[TensorInfo]:
        x = inputs[0]
        _require_float(ctx, x, 1)
        axis = normalize_axis(int(ctx.attr("axis", -1)), x.rank, ctx.name)
        for p in inputs[1:]:
            if p is not None and (p.rank > x.rank or broadcast_shapes(x.shape, p.shape, name=ctx.name)
                                  != tuple(x.shape)):
                raise ShapeError(f"{ctx.name}: {ctx.op_type} Scale/B of shape {p.shape} must broadcast "
                                 f"to X of shape {x.shape} without growing it")
        stat_shape: Shape = x.shape[:axis] + (1,) * (x.rank - axis)
        stash = _stash(ctx)
        return [TensorInfo(x.dtype, x.shape), TensorInfo(stash, stat_shape), TensorInfo(stash, stat_shape)]

    @staticmethod
    def stash_dtype(ctx: OpContext, dtype: np.dtype) -> np.dtype:
        return _stash(ctx)

    def __init__(self, ctx: OpContext, inputs: Sequence[TensorInfo | None],
                 outputs: Sequence[TensorInfo]) -> None:
        super().__init__(ctx, inputs, outputs)
        x = inputs[0]
        axis = normalize_axis(int(ctx.attr("axis", -1)), x.rank, ctx.name)
        self.shape2d = (numel(x.shape[:axis]), numel(x.shape[axis:]))
        self.axes = (1,)

    def reduction_view(self, a: np.ndarray) -> np.ndarray:
        return a.reshape(self.shape2d)

    def affine(self, y: np.ndarray, inputs: Sequence[np.ndarray | None]) -> None:
        np.multiply(y, inputs[1], out=y, casting="same_kind")
        if len(inputs) > 2 and inputs[2] is not None:
            np.add(y, inputs[2], out=y, casting="same_kind")


@register("LayerNormalization", since=17)
class LayerNormalization(_LastAxes):
    """Y = (X - Mean) * InvStdDev * Scale + B over axes [axis, rank); Mean and InvStdDev in stash_type.

    When X is already in the stash type (float32 X, the default stash) the rows are reduced by BLAS
    and a row-wise dot product instead of numpy's reductions, which are slow over short rows:
    about twice as fast on transformer activations (128 x 768).
    """

    def __init__(self, ctx: OpContext, inputs: Sequence[TensorInfo | None],
                 outputs: Sequence[TensorInfo]) -> None:
        super().__init__(ctx, inputs, outputs)
        x = inputs[0]
        blas = self.stash == x.dtype and x.dtype in (np.float32, np.float64) and numel(x.shape) > 0
        self.ones = np.ones(self.shape2d[1], x.dtype) if blas else None

    @staticmethod
    def _row_dots(a: np.ndarray) -> np.ndarray:
        """sum(a * a, axis=1) of a 2-D array, without a temporary its size."""
        vecdot = getattr(np, "vecdot", None)  # numpy >= 2.0
        return vecdot(a, a) if vecdot is not None else np.einsum("ij,ij->i", a, a)

    def run(self, inputs, outputs, workspace):
        if self.ones is None:
            super().run(inputs, outputs, workspace)
            return
        x, y = inputs[0].reshape(self.shape2d), outputs[0].reshape(self.shape2d)
        cols = self.shape2d[1]
        with np.errstate(invalid="ignore", divide="ignore"):
            mean = x @ self.ones
            mean /= cols
            np.subtract(x, mean[:, None], out=y)
            inv = self._row_dots(y)
            inv /= cols
            inv += self.epsilon
            np.sqrt(inv, out=inv)
            np.reciprocal(inv, out=inv)
            np.multiply(y, inv[:, None], out=y)
            self.affine(outputs[0], inputs)
        for out, stat in zip(outputs[1:], (mean, inv)):
            if out is not None:
                np.copyto(out, stat.reshape(out.shape), casting="same_kind")


@register("RMSNormalization", since=23)
class RMSNormalization(_LastAxes):
    """Y = X / sqrt(mean(X^2) + epsilon) * Scale over axes [axis, rank)."""

    center = False

    @classmethod
    def infer(cls, ctx: OpContext, inputs: Sequence[TensorInfo | None]) -> list[TensorInfo]:
        return super().infer(ctx, inputs)[:1]


@register("InstanceNormalization", since=1)
class InstanceNormalization(_Standardizing):
    """Y = scale[c] * (X - mean) / sqrt(var + epsilon) + B[c], statistics per (n, c) over spatial axes."""

    min_rank = 2

    @classmethod
    def param_length(cls, ctx: OpContext, x: TensorInfo) -> Dim:
        return x.shape[1]

    def __init__(self, ctx: OpContext, inputs: Sequence[TensorInfo | None],
                 outputs: Sequence[TensorInfo]) -> None:
        super().__init__(ctx, inputs, outputs)
        self.axes = tuple(range(2, inputs[0].rank))

    def affine(self, y: np.ndarray, inputs: Sequence[np.ndarray | None]) -> None:
        np.multiply(y, _channel_view(inputs[1], y.ndim), out=y, casting="same_kind")
        np.add(y, _channel_view(inputs[2], y.ndim), out=y, casting="same_kind")


@register("GroupNormalization", since=18)
class GroupNormalization(_Standardizing):
    """Statistics per instance per group of C / num_groups channels; opset 18 scale and bias per group."""

    min_rank = 2
    per_channel = False

    @classmethod
    def param_length(cls, ctx: OpContext, x: TensorInfo) -> Dim:
        return x.shape[1] if cls.per_channel else int(ctx.attr("num_groups", 0))

    @staticmethod
    def stash_dtype(ctx: OpContext, dtype: np.dtype) -> np.dtype:
        return _stash(ctx) if ctx.opset >= 21 else compute_dtype(dtype)

    def __init__(self, ctx: OpContext, inputs: Sequence[TensorInfo | None],
                 outputs: Sequence[TensorInfo]) -> None:
        super().__init__(ctx, inputs, outputs)
        x = inputs[0]
        self.groups = int(ctx.attr("num_groups", 0))
        if self.groups < 1 or x.shape[1] % self.groups:
            raise ShapeError(f"{ctx.name}: num_groups {self.groups} must be a positive divisor of the "
                             f"channel count {x.shape[1]}")
        self.grouped = (x.shape[0], self.groups, x.shape[1] // self.groups, numel(x.shape[2:]))
        self.axes = (2, 3)

    def reduction_view(self, a: np.ndarray) -> np.ndarray:
        return a.reshape(self.grouped)

    def affine(self, y: np.ndarray, inputs: Sequence[np.ndarray | None]) -> None:
        g = self.reduction_view(y)
        shape = (self.groups, -1, 1) if self.per_channel else (self.groups, 1, 1)
        np.multiply(g, inputs[1].reshape(shape), out=g, casting="same_kind")
        np.add(g, inputs[2].reshape(shape), out=g, casting="same_kind")


@register("GroupNormalization", since=21)
class GroupNormalizationPerChannel(GroupNormalization):
    """GroupNormalization from opset 21: scale and bias per channel, stage one in stash_type."""

    per_channel = True


@register("MeanVarianceNormalization", since=9)
class MeanVarianceNormalization(_Standardizing):
    """Y = (X - E[X]) / (sqrt(E[(X - E[X])^2]) + 1e-9) over `axes` (default [0, 2, 3])."""

    eps_outside_sqrt = True

    def __init__(self, ctx: OpContext, inputs: Sequence[TensorInfo | None],
                 outputs: Sequence[TensorInfo]) -> None:
        super().__init__(ctx, inputs, outputs)
        rank = inputs[0].rank
        self.axes = tuple(sorted({normalize_axis(int(a), rank, ctx.name)
                                  for a in ctx.attr("axes", [0, 2, 3])}))
        self.epsilon = 1e-9


@register("LpNormalization", since=1)
class LpNormalization(_SameShape):
    """Y = X / ||X||_p along `axis` (p is 1 or 2).

    "When the Lp norm is zero (i.e., all elements along the axis are zero), the output is defined
    to be zero."
    """

    inplace = {0: 0}

    def __init__(self, ctx: OpContext, inputs: Sequence[TensorInfo | None],
                 outputs: Sequence[TensorInfo]) -> None:
        super().__init__(ctx, inputs, outputs)
        self.p = int(ctx.attr("p", 2))
        if self.p not in (1, 2):
            raise ShapeError(f"{ctx.name}: LpNormalization supports p = 1 or 2, got {self.p}")
        x = inputs[0]
        self.axis = normalize_axis(int(ctx.attr("axis", -1)), x.rank, ctx.name)
        self.ct = compute_dtype(x.dtype)

    def workspace(self) -> int:
        return carve_size((self.inputs[0].shape, self.inputs[0].dtype)) if self.p == 1 else 0

    def run(self, inputs, outputs, workspace):
        x = inputs[0]
        if self.p == 2:
            norm = np.sqrt(_sum_squares(x, (self.axis,), self.ct))
        else:
            absolute = np.abs(x, out=carve(workspace, (x.shape, x.dtype))[0])
            norm = np.sum(absolute, axis=self.axis, keepdims=True, dtype=self.ct)
        with np.errstate(divide="ignore"):
            inv = np.where(norm == 0, 0, 1 / norm).astype(self.ct)
        np.multiply(x, inv, out=outputs[0], casting="same_kind")
