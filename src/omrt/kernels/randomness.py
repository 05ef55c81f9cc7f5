"""Random kernels: RandomNormal, RandomUniform and their *Like forms, Bernoulli and Multinomial.

They are never folded at compile time (`Kernel.deterministic` is False). The module is not named
`random`, so that it is never taken for the standard library's module of that name.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from ..errors import ShapeError
from .base import Kernel, OpContext, TensorInfo, numel, onnx_dtype, register
from .elementwise import FLOAT, _check_kind, _kind


def _generator(ctx: OpContext) -> np.random.Generator:
    """A generator seeded from the float `seed` attribute (its bits), or from the OS without one.

    Seeded once at load: a session replays the same sequence, successive runs differ.
    """
    seed = ctx.attr("seed")
    if seed is None:
        return np.random.default_rng()
    return np.random.default_rng(int(np.float64(seed).view(np.uint64)))


class RandomFill(Kernel):
    """A tensor of draws scaled and shifted: RandomNormal, RandomUniform and their *Like forms.

    Draws go straight into float32/float64 outputs; other float types go through the workspace.
    """

    deterministic = False
    like: ClassVar[bool] = False

    @classmethod
    def infer(cls, ctx, inputs):
        code = ctx.attr("dtype")
        if cls.like:
            x = inputs[0]
            dtype, shape = (x.dtype if code is None else onnx_dtype(code, ctx)), x.shape
        else:
            dtype = onnx_dtype(1 if code is None else code, ctx)
            shape = ctx.attr("shape")
            if shape is None:
                raise ShapeError(f"{ctx.name}: {ctx.op_type} has no 'shape' attribute; set it")
            shape = tuple(int(d) for d in shape)
        if _kind(dtype) != "f":
            raise ShapeError(f"{ctx.name}: {ctx.op_type} draws floats, not {dtype}; set dtype to "
                             f"a float type and Cast the result")
        return [TensorInfo(dtype, shape)]

    def __init__(self, ctx, inputs, outputs):
        super().__init__(ctx, inputs, outputs)
        self.rng = _generator(ctx)
        self.native = outputs[0].dtype in (np.float32, np.float64)
        self.scale, self.shift = self.params(ctx)

    def params(self, ctx: OpContext) -> tuple[float, float]:
        raise NotImplementedError

    def draw(self, buf: np.ndarray) -> None:
        raise NotImplementedError

    def workspace(self):
        return 0 if self.native else 4 * numel(self.outputs[0].shape)

    def run(self, inputs, outputs, workspace):
        out = outputs[0]
        buf = out if self.native else workspace[:4 * out.size].view(np.float32).reshape(out.shape)
        self.draw(buf)
        buf *= self.scale
        buf += self.shift
        if not self.native:
            np.copyto(out, buf, casting="unsafe")


class _Normal(RandomFill):
    """Normal draws with `mean` (0) and `scale` (1)."""

    def params(self, ctx):
        return float(ctx.attr("scale", 1.0)), float(ctx.attr("mean", 0.0))

    def draw(self, buf):
        self.rng.standard_normal(out=buf, dtype=buf.dtype)


class _Uniform(RandomFill):
    """Uniform draws in [low, high), 0 and 1 by default."""

    def params(self, ctx):
        low, high = float(ctx.attr("low", 0.0)), float(ctx.attr("high", 1.0))
        return high - low, low

    def draw(self, buf):
        self.rng.random(out=buf, dtype=buf.dtype)


@register("RandomNormal", since=1)
class RandomNormal(_Normal):
    """Normal draws of the attribute `shape`."""


@register("RandomUniform", since=1)
class RandomUniform(_Uniform):
    """Uniform draws of the attribute `shape`."""


@register("RandomNormalLike", since=1)
class RandomNormalLike(_Normal):
    """Normal draws of the input's shape."""

    like = True


@register("RandomUniformLike", since=1)
class RandomUniformLike(_Uniform):
    """Uniform draws of the input's shape."""

    like = True


@register("Bernoulli", since=15)
class Bernoulli(Kernel):
    """1 with probability p (the input), else 0, in `dtype` (the input's by default)."""

    deterministic = False

    @classmethod
    def infer(cls, ctx, inputs):
        x = inputs[0]
        _check_kind(ctx, x, FLOAT)
        code = ctx.attr("dtype")
        return [TensorInfo(x.dtype if code is None else onnx_dtype(code, ctx), x.shape)]

    def __init__(self, ctx, inputs, outputs):
        super().__init__(ctx, inputs, outputs)
        self.rng = _generator(ctx)

    def workspace(self):
        return 8 * numel(self.outputs[0].shape)

    def run(self, inputs, outputs, workspace):
        x, out = inputs[0], outputs[0]
        if out.size == 0:
            return
        u = workspace[:8 * out.size].view(np.float64).reshape(out.shape)
        self.rng.random(out=u)
        np.less(u, x, out=out, casting="unsafe")


@register("Multinomial", since=7)
class Multinomial(Kernel):
    """`sample_size` class indices per row of unnormalized log-probabilities [batch, classes]."""

    deterministic = False

    @classmethod
    def infer(cls, ctx, inputs):
        x = inputs[0]
        _check_kind(ctx, x, FLOAT)
        if x.rank != 2:
            raise ShapeError(f"{ctx.name}: Multinomial input has shape {tuple(x.shape)}, but must "
                             f"be [batch_size, class_size]")
        dtype = onnx_dtype(ctx.attr("dtype", 6), ctx)
        if dtype not in (np.int32, np.int64):
            raise ShapeError(f"{ctx.name}: Multinomial dtype is {dtype}; use int32 (6) or int64 (7)")
        return [TensorInfo(dtype, (x.shape[0], int(ctx.attr("sample_size", 1))))]

    def __init__(self, ctx, inputs, outputs):
        super().__init__(ctx, inputs, outputs)
        self.rng = _generator(ctx)

    def run(self, inputs, outputs, workspace):
        x, out = inputs[0].astype(np.float64), outputs[0]
        if out.size == 0:
            return
        x -= x.max(axis=1, keepdims=True)
        np.exp(x, out=x)
        cdf = np.cumsum(x, axis=1)
        cdf /= cdf[:, -1:]
        u = self.rng.random(out.shape)
        for row, c, v in zip(out, cdf, u):
            np.minimum(np.searchsorted(c, v, side="right"), c.size - 1, out=row, casting="unsafe")
