"""Activation kernels: HardSigmoid, PRelu, and those that need intermediates: LeakyRelu, Erf and
Gelu, Elu, Selu, Celu, Softsign, HardSwish, Softplus, Mish, Swish, ThresholdedRelu and Shrink.

The latter work through the flattened tensor in cache-sized chunks (`Pointwise`), with scratch
buffers carved from the planned workspace, so no temporary ever has the size of the tensor. Erf is
here for the approximations Gelu shares with it. All build on `elementwise`'s `Unary` and
`Binary`, where Relu, Sigmoid and Tanh (one ufunc each) are generated with the other unary ops.
"""

from __future__ import annotations

import math
from typing import ClassVar, Sequence

import numpy as np

from ..errors import ShapeError
from ..memory import align
from ..native.bindings import GELU
from . import parallel
from .base import OpContext, TensorInfo, numel, register, run_bound
from .elementwise import FLOAT, NUMERIC, Binary, Unary, _check_kind, _check_same_dtype


# ----------------------------------------------------------------------------- single-pass activations


@register("HardSigmoid", since=1)
class HardSigmoid(Unary):
    """max(0, min(1, alpha * x + beta)), alpha 0.2 and beta 0.5 by default."""

    kinds = FLOAT

    def __init__(self, ctx, inputs, outputs):
        super().__init__(ctx, inputs, outputs)
        self.alpha = float(ctx.attr("alpha", 0.2))
        self.beta = float(ctx.attr("beta", 0.5))

    def compute(self, x, out):
        np.multiply(x, self.alpha, out=out)
        np.add(out, self.beta, out=out)
        np.clip(out, 0, 1, out=out)


@register("PRelu", since=7)
class PRelu(Binary):
    """x for x >= 0, slope * x below; "slope should be unidirectional broadcastable to input X".

    Before opset 7 a slope of shape (C,) applied per channel (axis 1). The ONNX version converter
    leaves such a slope as it is, so models upgraded from opset 6 arrive at opset 7 with it: there,
    a (C,) slope that does not broadcast to X but matches its channel count keeps the old meaning.
    """

    @staticmethod
    def _per_channel(ctx: OpContext, x: TensorInfo, slope: TensorInfo) -> bool:
        return (ctx.opset == 7 and slope.rank == 1 and x.rank > 2 and slope.shape[0] == x.shape[1]
                and slope.shape[0] not in (1, x.shape[-1]))

    @classmethod
    def infer(cls, ctx, inputs):
        x, slope = inputs
        if cls._per_channel(ctx, x, slope):
            _check_kind(ctx, x, cls.kinds)
            _check_same_dtype(ctx, [x, slope])
            return [TensorInfo(x.dtype, x.shape)]
        fits = len(slope.shape) <= len(x.shape) and all(
            s == 1 or s == d or not (isinstance(s, int) and isinstance(d, int))
            for s, d in zip(slope.shape[::-1], x.shape[::-1]))
        if not fits:
            raise ShapeError(f"{ctx.name}: PRelu slope of shape {tuple(slope.shape)} does not "
                             f"broadcast to X of shape {tuple(x.shape)}; give slope X's trailing "
                             f"dims or 1s, e.g. (C, 1, 1) for NCHW input")
        return [TensorInfo(super().infer(ctx, inputs)[0].dtype, x.shape)]

    def __init__(self, ctx, inputs, outputs):
        super().__init__(ctx, inputs, outputs)
        x, slope = inputs
        self.slope_shape = ((-1,) + (1,) * (x.rank - 2) if self._per_channel(ctx, x, slope)
                            else None)

    def workspace(self):
        return numel(self.outputs[0].shape)

    def run(self, inputs, outputs, workspace):
        x, slope = inputs
        out = outputs[0]
        if out.size == 0:
            return
        if self.slope_shape is not None:
            slope = slope.reshape(self.slope_shape)
        negative = workspace[:out.size].view(np.bool_).reshape(out.shape)
        np.less(x, 0, out=negative)
        np.copyto(out, x)
        np.multiply(out, slope, out=out, where=negative)


# ----------------------------------------------------------------------------- chunked activations

CHUNK = 1 << 14
"""Elements per chunk for activations with intermediates: scratch stays in the CPU cache."""


class Pointwise(Unary):
    """A unary op with intermediates, run chunk by chunk over the flattened tensor.

    `chunk` gets a chunk of the input and of the output (which may be the same memory),
    `buffers` scratch arrays of the working dtype and, when `masks` is set, one bool array,
    all of the chunk's length.
    """

    buffers: ClassVar[int] = 1
    masks: ClassVar[int] = 0

    def __init__(self, ctx, inputs, outputs):
        super().__init__(ctx, inputs, outputs)
        self.work = self.work_dtype(outputs[0].dtype)
        shape = outputs[0].shape
        self.step = min(numel(shape), CHUNK) if all(isinstance(d, int) for d in shape) else CHUNK

    def work_dtype(self, dtype: np.dtype) -> np.dtype:
        """The dtype intermediates are computed in: at least float32."""
        return np.promote_types(dtype, np.float32)

    def _stride(self) -> int:
        return align(self.step * self.work.itemsize)

    def workspace(self) -> int:
        return self.buffers * self._stride() + self.masks * self.step

    def run(self, inputs, outputs, workspace):
        x, out = inputs[0].reshape(-1), outputs[0].reshape(-1)
        n, step = x.size, self.step
        if n == 0:
            return
        stride = self._stride()
        bufs = [workspace[i * stride:i * stride + step * self.work.itemsize].view(self.work)
                for i in range(self.buffers)]
        mask = workspace[self.buffers * stride:self.buffers * stride + step].view(np.bool_)
        with np.errstate(all="ignore"):
            for lo in range(0, n, step):
                hi = min(lo + step, n)
                m = hi - lo
                self.chunk(x[lo:hi], out[lo:hi], [b[:m] for b in bufs], mask[:m])

    def chunk(self, x: np.ndarray, out: np.ndarray, bufs: list[np.ndarray], mask: np.ndarray) -> None:
        raise NotImplementedError


@register("LeakyRelu", since=1)
class LeakyRelu(Pointwise):
    """x for x >= 0, alpha * x below (alpha 0.01 by default)."""

    kinds = FLOAT

    def __init__(self, ctx, inputs, outputs):
        super().__init__(ctx, inputs, outputs)
        self.alpha = float(ctx.attr("alpha", 0.01))

    def chunk(self, x, out, bufs, mask):
        (t,) = bufs
        np.multiply(x, self.alpha, out=t)
        # alpha <= 1: alpha * x is the larger of the two below zero, the smaller above; fmax
        # keeps x where alpha * x is NaN (inf * 0), while a NaN x stays NaN
        (np.fmax if self.alpha <= 1 else np.fmin)(x, t, out=out)


# Two erf approximations, both evaluated in float64. For outputs of float32 precision or less:
# x * P(x^2) / Q(x^2) on x clamped to [-4, 4] (erf is +-1 in float32 beyond), a rational fit
# within 1.4e-8 relative, so results are faithful (<= 1 ulp) in float32. For float64: x * A(x^2)
# for |x| < 1.5, else sign(x) * (1 - erfc(|x|)) with erfc(x) = exp(-x^2) * s * B(3 * s - 1),
# s = 1 / x in (0, 2/3]; A and B are Chebyshev interpolants of erf(sqrt t) / sqrt t and of
# x * exp(x^2) * erfc(x) (a smooth function of 1/x, 1/sqrt(pi) at 0) converted to monomials,
# within 1e-15 relative for erf and 1e-13 for erfc.
_ERF_P = (1.1283791693677045, 0.18520512300707326, 0.05431606699216943, 0.003849541916545577,
          0.0003795623237531228, 4.683520902105966e-06, -1.3195994205422924e-08)
_ERF_Q = (1.0, 0.497467180348835, 0.11395823062466869, 0.015461794953981022,
          0.001307492195293967, 6.309854583868634e-05)
_ERF_SMALL = 1.5
_ERF_A = (
    1.1283791670955123, -0.3761263890318455, 0.11283791671006917, -0.02686617065154504,
    0.00522397766229043, -0.0008548328241391942, 0.00012055358663715973, -1.4926015858138423e-05,
    1.6465727136262964e-06, -1.639082589955567e-07, 1.4926106839252177e-08, -1.265941453673093e-09,
    1.005283633812805e-10, -6.835525513202979e-12, 2.8087451529198067e-13,
)
_ERF_B = (
    0.5370034535441698, -0.04765311347930525, -0.012819205268478934, 0.007247415165453648,
    -0.0012669390354550715, -0.0003977677130752162, 0.00037860069213909494, -0.00013021557689806332,
    2.8785657110801044e-06, 2.457224815032882e-05, -1.6227110947427314e-05, 5.102541064781266e-06,
    3.2341566692842034e-07, -1.339947344316162e-06, 1.0083095622113192e-06, -6.458803409368886e-07,
    9.610646597491868e-08, 2.979966869443092e-07, -1.6611168356168887e-07, -3.478752208506686e-08,
    3.100746692791325e-08,
)


def _horner(coefs: Sequence[float], v: np.ndarray, acc: np.ndarray) -> None:
    np.multiply(v, coefs[-1], out=acc)
    acc += coefs[-2]
    for c in coefs[-3::-1]:
        acc *= v
        acc += c


def _erf_single(x: np.ndarray, out: np.ndarray, t: np.ndarray, u: np.ndarray) -> None:
    """erf of float64 `x` (clobbered) into `out` to float32 accuracy; `t`, `u` are scratch."""
    np.clip(x, -4.0, 4.0, out=x)
    np.multiply(x, x, out=t)
    _horner(_ERF_P, t, out)
    _horner(_ERF_Q, t, u)
    out *= x
    out /= u


def _erf_double(x: np.ndarray, out: np.ndarray, t: np.ndarray, u: np.ndarray, small: np.ndarray,
                plus_one: bool = False) -> None:
    """erf(x), or 1 + erf(x) without cancellation for negative x, of float64 `x` into `out`.

    `out` must not be `x`; `t` and `u` are float64 scratch and `small` bool scratch.
    """
    np.absolute(x, out=t)
    np.less(t, _ERF_SMALL, out=small)
    np.maximum(t, _ERF_SMALL, out=t)
    np.reciprocal(t, out=u)
    np.multiply(t, t, out=t)
    np.negative(t, out=t)
    np.exp(t, out=t)
    t *= u
    u *= 2 * _ERF_SMALL
    u -= 1
    _horner(_ERF_B, u, out)
    out *= t
    # out = erfc(|x|); erf = sgn - sgn * erfc, 1 + erf = (1 + sgn) - sgn * erfc, exact for sgn < 0
    np.copysign(1.0, x, out=t)
    out *= t
    np.negative(out, out=out)
    if plus_one:
        t += 1
    out += t
    np.multiply(x, x, out=t)
    _horner(_ERF_A, t, u)
    u *= x
    if plus_one:
        u += 1
    np.copyto(out, u, where=small)


class ErfBased(Pointwise):
    """Chunks computed in float64 through `_erf_single`, or `_erf_double` for 8-byte outputs."""

    buffers = 4
    masks = 1

    def work_dtype(self, dtype):
        return np.dtype(np.float64)

    def __init__(self, ctx, inputs, outputs):
        super().__init__(ctx, inputs, outputs)
        self.double = outputs[0].dtype.itemsize >= 8

    def erf(self, x: np.ndarray, out: np.ndarray, t: np.ndarray, u: np.ndarray, small: np.ndarray,
            plus_one: bool = False) -> None:
        """erf (or 1 + erf) of the float64 chunk `x`, which it may clobber, into `out`."""
        if self.double:
            _erf_double(x, out, t, u, small, plus_one)
        else:
            _erf_single(x, out, t, u)
            if plus_one:
                out += 1


@register("Erf", since=9)
class Erf(ErfBased):
    """The Gauss error function, which numpy lacks: see `_erf_single` and `_erf_double`."""

    kinds = NUMERIC

    def chunk(self, x, out, bufs, mask):
        xw, r, t, u = bufs
        np.copyto(xw, x, casting="unsafe")
        self.erf(xw, r, t, u, mask)
        np.copyto(out, r, casting="unsafe")


# Gelu of float32 and narrower types: x * Phi(x), Phi the normal CDF = (1 + erf(x / sqrt(2))) / 2,
# taken from a table of Phi and its slope at nodes 1/1024 apart over [-7, 6], linear from the
# nearest node: x * Phi is within 2.5e-8 of exact before float32 rounding (max |x * Phi''| / 8
# node steps squared). Beyond the table Phi is 0 or 1 (|Gelu(-7)| < 1e-11; Phi(6) rounds to 1),
# which keeps Gelu(-inf) NaN as x * 0.5 * (1 + erf) has it. Adding 1.5 * 2**23 to x * 1024 rounds
# it to the nearest node and leaves the node's number in the low bits: no float-to-int conversion,
# which numpy does slowly. Eleven float32 passes, two of them gathers, instead of thirty in float64.
_GELU_LO, _GELU_HI, _GELU_STEPS = -7, 6, 1024
_ROUNDER = np.float32(1.5 * 2 ** 23)
_GELU_TABLE: list[np.ndarray] = []


def _gelu_table() -> tuple[np.ndarray, np.ndarray]:
    """(Phi, slope per node step) at the nodes, float32, computed once on first use."""
    if not _GELU_TABLE:
        r = np.arange(_GELU_LO * _GELU_STEPS, _GELU_HI * _GELU_STEPS + 1) / _GELU_STEPS
        cdf, t, u = (np.empty_like(r) for _ in range(3))
        _erf_double(r * math.sqrt(0.5), cdf, t, u, np.empty(r.size, np.bool_), plus_one=True)
        cdf *= 0.5
        slope = np.exp(-0.5 * r * r) / (math.sqrt(2 * math.pi) * _GELU_STEPS)
        cdf[0], slope[0], cdf[-1], slope[-1] = 0, 0, 1, 0
        _GELU_TABLE[:] = [cdf.astype(np.float32), slope.astype(np.float32)]
    return _GELU_TABLE[0], _GELU_TABLE[1]


@register("Gelu", since=1, domain="omrt")
@register("Gelu", since=20)
class Gelu(ErfBased):
    """0.5 * x * (1 + erf(x / sqrt(2))), or with approximate="tanh"
    0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x^3))).

    Also registered as omrt::Gelu: the compiler rewrites the Erf formula that exporters emit for
    models older than opset 20 into it.
    """

    kinds = FLOAT

    @classmethod
    def infer(cls, ctx, inputs):
        approximate = ctx.attr("approximate", "none")
        if approximate not in ("none", "tanh"):
            raise ShapeError(f"{ctx.name}: Gelu approximate={approximate!r} is not defined; use "
                             f"'none' or 'tanh'")
        return super().infer(ctx, inputs)

    native_units = ("elementwise",)

    def __init__(self, ctx, inputs, outputs):
        self.tanh = ctx.attr("approximate", "none") == "tanh"
        super().__init__(ctx, inputs, outputs)
        self.native_gelu = None
        """The same arithmetic in C (csrc/elementwise.c), for float32 on the native workers."""
        if not (self.tanh or self.double):
            self.cdf, self.slope = _gelu_table()
            self.bias = np.int64(_ROUNDER.view(np.int32)) + _GELU_LO * _GELU_STEPS
            if ctx.native is not None and inputs[0].dtype == np.float32:
                self.native_gelu = ctx.native.get(GELU)

    def bind(self, inputs, outputs, workspace):
        x, out = inputs[0], outputs[0]
        if self.native_gelu is None or not (x.flags.c_contiguous and out.flags.c_contiguous):
            return None
        return [self.native_gelu.bind(x, out, self.cdf, self.slope, x.size, parallel.native_threads(nbytes=x.nbytes))]

    def run(self, inputs, outputs, workspace):
        if not run_bound(self.bind(inputs, outputs, workspace)):
            super().run(inputs, outputs, workspace)

    def work_dtype(self, dtype):
        return Pointwise.work_dtype(self, dtype) if self.tanh else super().work_dtype(dtype)

    def chunk(self, x, out, bufs, mask):
        xw, r, t, u = bufs
        if self.tanh:
            np.multiply(x, x, out=r)
            r *= 0.044715
            r += 1
            r *= x
            r *= math.sqrt(2 / math.pi)
            np.tanh(r, out=r)
            r *= 0.5
            r += 0.5
        elif self.double:
            np.multiply(x, np.float64(math.sqrt(0.5)), out=xw)
            self.erf(xw, r, t, u, mask, plus_one=True)
            r *= 0.5
        else:
            self.from_table(x, out, bufs)
            return
        np.multiply(r, x, out=out, casting="unsafe")

    def from_table(self, x: np.ndarray, out: np.ndarray, bufs: list[np.ndarray]) -> None:
        """x * Phi(x) into `out` from the table (see `_gelu_table`); the float64 scratch buffers
        serve as float32 ones and as node numbers (intp has float64's item size)."""
        node = bufs[0].view(np.intp)
        pos, v = (b.view(np.float32)[:x.size] for b in bufs[1:3])
        np.multiply(x, np.float32(_GELU_STEPS), out=pos)
        np.clip(pos, np.float32(_GELU_LO * _GELU_STEPS), np.float32(_GELU_HI * _GELU_STEPS), out=pos)
        np.add(pos, _ROUNDER, out=v)
        np.subtract(v.view(np.int32), self.bias, out=node)
        v -= _ROUNDER
        pos -= v
        np.take(self.slope, node, out=v, mode="wrap")
        pos *= v
        np.take(self.cdf, node, out=v, mode="wrap")
        pos += v
        np.multiply(pos, x, out=out, casting="unsafe")


class ExpLinear(Pointwise):
    """gamma * (max(x, 0) + alpha * expm1(min(x, 0) / scale)): Elu, Selu and Celu."""

    kinds = FLOAT

    def __init__(self, ctx, inputs, outputs):
        super().__init__(ctx, inputs, outputs)
        self.alpha, self.gamma, self.scale = self.params(ctx)

    def params(self, ctx: OpContext) -> tuple[float, float, float]:
        raise NotImplementedError

    def chunk(self, x, out, bufs, mask):
        (t,) = bufs
        np.minimum(x, 0, out=t)
        if self.scale != 1:
            t /= self.scale
        np.expm1(t, out=t)
        t *= self.alpha
        np.maximum(x, 0, out=out)
        np.add(out, t, out=out, casting="unsafe")
        if self.gamma != 1:
            out *= self.gamma


@register("Elu", since=1)
class Elu(ExpLinear):
    """alpha * (exp(x) - 1) below zero, x above; alpha 1 by default."""

    def params(self, ctx):
        return float(ctx.attr("alpha", 1.0)), 1.0, 1.0


@register("Selu", since=1)
class Selu(ExpLinear):
    """gamma * (alpha * exp(x) - alpha) below zero, gamma * x above."""

    def params(self, ctx):
        return (float(ctx.attr("alpha", 1.67326319217681884765625)),
                float(ctx.attr("gamma", 1.05070102214813232421875)), 1.0)


@register("Celu", since=12)
class Celu(ExpLinear):
    """max(0, x) + min(0, alpha * (exp(x / alpha) - 1)); alpha 1 by default."""

    def params(self, ctx):
        alpha = float(ctx.attr("alpha", 1.0))
        return alpha, 1.0, alpha


@register("Softsign", since=1)
class Softsign(Pointwise):
    """x / (1 + |x|)."""

    kinds = FLOAT

    def chunk(self, x, out, bufs, mask):
        (t,) = bufs
        np.absolute(x, out=t)
        t += 1
        np.divide(x, t, out=out, casting="unsafe")


@register("HardSwish", since=14)
class HardSwish(Pointwise):
    """x * max(0, min(1, x / 6 + 0.5))."""

    kinds = FLOAT

    def chunk(self, x, out, bufs, mask):
        (t,) = bufs
        np.multiply(x, 1 / 6, out=t)
        t += 0.5
        np.clip(t, 0, 1, out=t)
        np.multiply(x, t, out=out, casting="unsafe")


@register("Softplus", since=1)
class Softplus(Pointwise):
    """log(1 + exp(x)), computed as max(x, 0) + log1p(exp(-|x|)) so it neither overflows nor
    loses the small values of large negative x."""

    kinds = FLOAT

    def chunk(self, x, out, bufs, mask):
        (t,) = bufs
        np.absolute(x, out=t)
        np.negative(t, out=t)
        np.exp(t, out=t)
        np.log1p(t, out=t)
        np.maximum(x, 0, out=out)
        np.add(out, t, out=out, casting="unsafe")


@register("Mish", since=18)
class Mish(Pointwise):
    """x * tanh(softplus(x)), with tanh(log(1 + e)) = n / (n + 2), n = e * (e + 2), e = exp(x).

    x is capped at 20 first, where the factor is 1 even in float64.
    """

    kinds = FLOAT
    buffers = 2

    def chunk(self, x, out, bufs, mask):
        t, u = bufs
        np.minimum(x, 20, out=t)
        np.exp(t, out=t)
        np.add(t, 2, out=u)
        t *= u
        np.add(t, 2, out=u)
        t /= u
        np.multiply(x, t, out=out, casting="unsafe")


@register("Swish", since=24)
class Swish(Pointwise):
    """x * sigmoid(alpha * x); alpha 1 by default."""

    kinds = FLOAT

    def __init__(self, ctx, inputs, outputs):
        super().__init__(ctx, inputs, outputs)
        self.alpha = float(ctx.attr("alpha", 1.0))

    def chunk(self, x, out, bufs, mask):
        (t,) = bufs
        np.multiply(x, -self.alpha, out=t)
        np.exp(t, out=t)
        t += 1
        np.divide(x, t, out=out, casting="unsafe")


@register("ThresholdedRelu", since=10)
class ThresholdedRelu(Pointwise):
    """x where x > alpha, else 0 (NaN included); alpha 1 by default."""

    kinds = FLOAT
    buffers = 0
    masks = 1

    def __init__(self, ctx, inputs, outputs):
        super().__init__(ctx, inputs, outputs)
        self.alpha = float(ctx.attr("alpha", 1.0))

    def chunk(self, x, out, bufs, mask):
        np.greater(x, self.alpha, out=mask)
        np.logical_not(mask, out=mask)
        np.copyto(out, x)
        np.copyto(out, 0, where=mask)


@register("Shrink", since=9)
class Shrink(Pointwise):
    """x - bias for x > lambd, x + bias for x < -lambd, else 0 (bias 0, lambd 0.5 by default)."""

    masks = 1

    def __init__(self, ctx, inputs, outputs):
        super().__init__(ctx, inputs, outputs)
        self.bias = float(ctx.attr("bias", 0.0))
        self.lambd = float(ctx.attr("lambd", 0.5))

    def chunk(self, x, out, bufs, mask):
        (t,) = bufs
        np.absolute(x, out=t)
        np.greater(t, self.lambd, out=mask)
        np.logical_not(mask, out=mask)
        np.sign(x, out=t)
        t *= self.bias
        np.subtract(x, t, out=out, casting="unsafe")
        np.copyto(out, 0, where=mask)
