"""Elementwise kernels: unary and broadcasting binary math, logic, comparisons, activations, casts.

Every kernel writes straight into its output with ufuncs (`out=`). Activations that need an
intermediate value work through the flattened tensor in cache-sized chunks, with scratch
buffers carved from the planned workspace, so no temporary ever has the size of the tensor.
"""

from __future__ import annotations

import math
from typing import Callable, ClassVar, Sequence

import numpy as np

from ..errors import ShapeError
from .base import (FUSED_ACTIVATIONS, Kernel, OpContext, TensorInfo, aligned, apply_activation,
                   broadcast_shapes, numel, onnx_dtype, register, relu)
from .native import I64, PTR, Function, address, threads_for


def _kind(dtype: np.dtype) -> str:
    """numpy's kind letter, with ml_dtypes' small floats counted as floats and strings as 'S'."""
    if dtype.kind == "V" and dtype.name.startswith(("float", "bfloat")):
        return "f"
    if dtype.kind in "OUS":
        return "S"
    return dtype.kind


_KIND_NAMES = {"f": "float", "i": "signed integer", "u": "unsigned integer", "b": "bool",
               "S": "string"}


def _check_kind(ctx: OpContext, info: TensorInfo, kinds: str) -> None:
    if _kind(info.dtype) not in kinds:
        allowed = ", ".join(_KIND_NAMES[k] for k in kinds)
        raise ShapeError(f"{ctx.name}: {ctx.op_type} got a {info.dtype} tensor, but the operator "
                         f"takes only {allowed} tensors there; insert a Cast")


def _check_same_dtype(ctx: OpContext, infos: Sequence[TensorInfo]) -> None:
    dtypes = {i.dtype for i in infos}
    if len(dtypes) > 1:
        raise ShapeError(f"{ctx.name}: {ctx.op_type} inputs have dtypes {sorted(map(str, dtypes))}, "
                         f"but must all have one dtype; insert a Cast")


_BOOL = np.dtype(np.bool_)
FLOAT = "f"
SIGNED = "fi"
NUMERIC = "fiu"
INTEGER = "iu"
BOOL = "b"

# ----------------------------------------------------------------------------- unary


class Unary(Kernel):
    """Same shape in and out, and the same dtype unless `result` says otherwise (predicates)."""

    inplace = {0: 0}
    kinds: ClassVar[str] = NUMERIC
    result: ClassVar[np.dtype | None] = None

    @classmethod
    def infer(cls, ctx: OpContext, inputs: Sequence[TensorInfo | None]) -> list[TensorInfo]:
        x = inputs[0]
        _check_kind(ctx, x, cls.kinds)
        return [TensorInfo(cls.result if cls.result is not None else x.dtype, x.shape)]

    def run(self, inputs, outputs, workspace):
        self.compute(inputs[0], outputs[0])

    def compute(self, x: np.ndarray, out: np.ndarray) -> None:
        raise NotImplementedError


def unary(op_type: str, fn: Callable[..., object], since: int = 1, kinds: str = NUMERIC,
          result: np.dtype | None = None) -> type[Kernel]:
    """Register a unary kernel from a ufunc-like `fn(x, out=...)`."""

    def compute(self: Unary, x: np.ndarray, out: np.ndarray) -> None:
        fn(x, out=out)

    cls = type(op_type, (Unary,), {"compute": compute, "kinds": kinds, "result": result,
                                   "__doc__": f"ONNX {op_type}: one ufunc into the output."})
    return register(op_type, since)(cls)


def _sigmoid(x: np.ndarray, out: np.ndarray) -> None:
    with np.errstate(over="ignore"):
        np.negative(x, out=out)
        np.exp(out, out=out)
    np.add(out, 1, out=out)
    np.reciprocal(out, out=out)


def _quiet(fn: Callable[..., object]) -> Callable[..., None]:
    """`fn` with numpy's floating-point warnings off: domain errors give NaN/inf as ONNX expects."""

    def run(x: np.ndarray, out: np.ndarray) -> None:
        with np.errstate(all="ignore"):
            fn(x, out=out)

    return run


unary("Relu", relu, kinds=SIGNED)
unary("Sigmoid", _sigmoid, kinds=FLOAT)
unary("Tanh", np.tanh, kinds=FLOAT)
unary("Neg", np.negative, kinds=SIGNED)
unary("Abs", np.absolute)
unary("Exp", _quiet(np.exp), kinds=FLOAT)
unary("Log", _quiet(np.log), kinds=FLOAT)
unary("Sqrt", _quiet(np.sqrt), kinds=FLOAT)
unary("Reciprocal", _quiet(np.reciprocal), kinds=FLOAT)
unary("Floor", np.floor, kinds=FLOAT)
unary("Ceil", np.ceil, kinds=FLOAT)
unary("Not", np.logical_not, kinds=BOOL)
unary("Sign", np.sign, since=9)
unary("Round", np.rint, since=11, kinds=FLOAT)
unary("IsNaN", np.isnan, since=9, kinds=FLOAT, result=_BOOL)
unary("BitwiseNot", np.invert, since=18, kinds=INTEGER)
for _name, _fn, _since in (("Sin", np.sin, 7), ("Cos", np.cos, 7), ("Tan", np.tan, 7),
                           ("Asin", np.arcsin, 7), ("Acos", np.arccos, 7), ("Atan", np.arctan, 7),
                           ("Sinh", np.sinh, 9), ("Cosh", np.cosh, 9), ("Asinh", np.arcsinh, 9),
                           ("Acosh", np.arccosh, 9), ("Atanh", np.arctanh, 9)):
    unary(_name, _quiet(_fn), since=_since, kinds=FLOAT)


@register("IsInf", since=10)
class IsInf(Unary):
    """True at +inf and/or -inf, as `detect_positive` and `detect_negative` (both 1 by default) ask."""

    kinds = FLOAT
    result = _BOOL

    def __init__(self, ctx, inputs, outputs):
        super().__init__(ctx, inputs, outputs)
        self.positive = bool(ctx.attr("detect_positive", 1))
        self.negative = bool(ctx.attr("detect_negative", 1))

    def compute(self, x, out):
        if self.positive and self.negative:
            np.isinf(x, out=out)
        elif self.positive or self.negative:
            np.equal(x, np.inf if self.positive else -np.inf, out=out)
        else:
            out.fill(False)


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
        return aligned(self.step * self.work.itemsize)

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
GELU = Function("elementwise", "omrt_gelu_f32", (PTR,) * 4 + (I64,) * 2)
"""The same arithmetic in C (csrc/elementwise.c), for float32 on the native workers."""
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
        self.c_gelu = None
        if not (self.tanh or self.double):
            self.cdf, self.slope = _gelu_table()
            self.bias = np.int64(_ROUNDER.view(np.int32)) + _GELU_LO * _GELU_STEPS
            if ctx.native is not None and inputs[0].dtype == np.float32:
                self.c_gelu = ctx.native.get(GELU)

    def run(self, inputs, outputs, workspace):
        x, out = inputs[0], outputs[0]
        if self.c_gelu is None or not (x.flags.c_contiguous and out.flags.c_contiguous):
            super().run(inputs, outputs, workspace)
            return
        self.c_gelu(address(x), address(out), address(self.cdf), address(self.slope), x.size,
                    threads_for(nbytes=x.nbytes))

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


# ----------------------------------------------------------------------------- binary


TILE_RUN = 4096
"""Elements an input that repeats a short pattern along the output's last dims is tiled to."""


def _tile_plan(a: TensorInfo, b: TensorInfo, out: TensorInfo) -> tuple[int, int] | None:
    """(which input, run length) when one input has the output's shape and the other repeats a
    block of the output's last dims, of a few elements, over the dims before it; None otherwise.

    numpy runs such a broadcast with an inner loop as long as the block (3 for x - mean over an
    HWC image: 10 ms for a 1080p frame). Tiled in the workspace to `run` >= TILE_RUN elements,
    and the output viewed as rows of `run`, the same op takes 2 ms.
    """
    if not (a.static and b.static and out.static):
        return None
    for k, (small, full) in enumerate(((a, b), (b, a))):
        shape = (1,) * (out.rank - small.rank) + tuple(small.shape)
        if tuple(full.shape) != tuple(out.shape) or len(shape) != out.rank:
            continue
        i = out.rank
        while i > 0 and shape[i - 1] == out.shape[i - 1]:
            i -= 1
        block = numel(out.shape[i:])
        if any(d != 1 for d in shape[:i]) or not 1 < block < TILE_RUN:
            continue
        run, j = block, i
        while j > 0 and run < TILE_RUN:
            j -= 1
            run *= out.shape[j]
        if run > block:
            return k, run
    return None


class Binary(Kernel):
    """Two inputs with numpy (multidirectional) broadcasting; output dtype is input 0's or `result`.

    Kernels that list activations in `fuses` apply the one fused into them to their output. An
    input that repeats a short pattern is tiled first (see `_tile_plan`).
    """

    inplace = {0: 0}
    kinds: ClassVar[str] = NUMERIC
    result: ClassVar[np.dtype | None] = None
    same_dtype: ClassVar[bool] = True

    def __init__(self, ctx: OpContext, inputs: Sequence[TensorInfo | None],
                 outputs: Sequence[TensorInfo]) -> None:
        super().__init__(ctx, inputs, outputs)
        self.tile = _tile_plan(inputs[0], inputs[1], outputs[0])

    def workspace(self) -> int:
        if self.tile is None:
            return 0
        k, run = self.tile
        return run * self.inputs[k].dtype.itemsize

    def fit_workspace(self, nbytes: int) -> bool:
        if self.workspace() > nbytes:
            self.tile = None
        return super().fit_workspace(nbytes)

    @classmethod
    def infer(cls, ctx: OpContext, inputs: Sequence[TensorInfo | None]) -> list[TensorInfo]:
        a, b = inputs[0], inputs[1]
        _check_kind(ctx, a, cls.kinds)
        if cls.same_dtype:
            _check_same_dtype(ctx, [a, b])
        shape = broadcast_shapes(a.shape, b.shape, name=ctx.name)
        return [TensorInfo(cls.result if cls.result is not None else a.dtype, shape)]

    def run(self, inputs, outputs, workspace):
        a, b, out = inputs[0], inputs[1], outputs[0]
        if self.tile is not None and out.flags.c_contiguous and inputs[1 - self.tile[0]].flags.c_contiguous:
            k, run = self.tile
            small = inputs[k]
            tiled = workspace[:run * small.dtype.itemsize].view(small.dtype)
            np.copyto(tiled.reshape(-1, small.size), small.reshape(small.size))
            full = inputs[1 - k].reshape(-1, run)
            a, b = (tiled, full) if k == 0 else (full, tiled)
            out = out.reshape(-1, run)
        self.compute(a, b, out)
        apply_activation(outputs[0], self.ctx)

    def compute(self, a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
        raise NotImplementedError


def binary(op_type: str, fn: Callable[..., object], since: int = 7, kinds: str = NUMERIC,
           result: np.dtype | None = None, fuses: frozenset[str] = frozenset()) -> type[Kernel]:
    """Register a broadcasting binary kernel from a ufunc-like `fn(a, b, out=...)`."""

    def compute(self: Binary, a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
        fn(a, b, out=out)

    cls = type(op_type, (Binary,), {"compute": compute, "kinds": kinds, "result": result, "fuses": fuses,
                                    "__doc__": f"ONNX {op_type}: one broadcasting ufunc."})
    return register(op_type, since)(cls)


binary("Add", np.add, fuses=frozenset(FUSED_ACTIVATIONS))
binary("Sub", np.subtract)
binary("Mul", np.multiply)
binary("Equal", np.equal, kinds=NUMERIC + BOOL + "S", result=_BOOL)
binary("Greater", np.greater, result=_BOOL)
binary("Less", np.less, result=_BOOL)
binary("GreaterOrEqual", np.greater_equal, since=12, result=_BOOL)
binary("LessOrEqual", np.less_equal, since=12, result=_BOOL)
binary("And", np.logical_and, kinds=BOOL)
binary("Or", np.logical_or, kinds=BOOL)
binary("Xor", np.logical_xor, kinds=BOOL)
binary("BitwiseAnd", np.bitwise_and, since=18, kinds=INTEGER)
binary("BitwiseOr", np.bitwise_or, since=18, kinds=INTEGER)
binary("BitwiseXor", np.bitwise_xor, since=18, kinds=INTEGER)


@register("Mod", since=10)
class Mod(Binary):
    """Remainder: with fmod=0 "A - floor(A / B) * B" (sign of B), with fmod=1 "A - trunc(A / B) * B"
    (sign of A), as Python's % and C's fmod."""

    def __init__(self, ctx, inputs, outputs):
        super().__init__(ctx, inputs, outputs)
        self.fn = np.fmod if ctx.attr("fmod", 0) else np.mod

    def compute(self, a, b, out):
        with np.errstate(all="ignore"):
            self.fn(a, b, out=out)


@register("BitShift", since=11)
class BitShift(Binary):
    """X shifted by Y bits LEFT or RIGHT (arithmetic for signed types); shifts of the type's
    width or more, or negative, give 0 (-1 for a negative X shifted right), as numpy does."""

    kinds = INTEGER

    @classmethod
    def infer(cls, ctx, inputs):
        direction = ctx.attr("direction")
        if direction not in ("LEFT", "RIGHT"):
            raise ShapeError(f"{ctx.name}: BitShift direction is {direction!r}; set it to "
                             f"'LEFT' or 'RIGHT'")
        return super().infer(ctx, inputs)

    def __init__(self, ctx, inputs, outputs):
        super().__init__(ctx, inputs, outputs)
        self.fn = np.left_shift if ctx.attr("direction") == "LEFT" else np.right_shift

    def compute(self, a, b, out):
        self.fn(a, b, out=out)


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


@register("Div", since=7)
class Div(Binary):
    """a / b; integer division truncates toward zero as in C ("the result is truncated")."""

    def compute(self, a, b, out):
        kind = out.dtype.kind
        with np.errstate(all="ignore"):
            if kind == "u":
                np.floor_divide(a, b, out=out)
            elif kind == "i":
                # a - fmod(a, b) is an exact multiple of b, so flooring it divides exactly
                r = np.fmod(a, b)
                np.subtract(a, r, out=out)
                np.floor_divide(out, b, out=out)
            else:
                np.divide(a, b, out=out)


@register("Pow", since=7)
class Pow(Binary):
    """a ** b with the base's dtype ("the output type is the type of X"), whatever the exponent's."""

    same_dtype = False
    kinds = NUMERIC

    def compute(self, a, b, out):
        with np.errstate(all="ignore"):
            if b.size == 1 and b.reshape(-1)[0] == 2:
                np.square(a, out=out)
            else:
                np.power(a, b, out=out, casting="unsafe")


# ----------------------------------------------------------------------------- variadic


class Variadic(Kernel):
    """Any number of same-dtype inputs folded pairwise with broadcasting (Sum, Max, ...), then the
    activation fused into the node, if its kernel lists it in `fuses`."""

    inplace = {0: 0}
    kinds: ClassVar[str] = NUMERIC
    fold: ClassVar[np.ufunc]

    @classmethod
    def infer(cls, ctx: OpContext, inputs: Sequence[TensorInfo | None]) -> list[TensorInfo]:
        xs = [x for x in inputs if x is not None]
        if not xs:
            raise ShapeError(f"{ctx.name}: {ctx.op_type} needs at least one input")
        _check_kind(ctx, xs[0], cls.kinds)
        _check_same_dtype(ctx, xs)
        return [TensorInfo(xs[0].dtype, broadcast_shapes(*(x.shape for x in xs), name=ctx.name))]

    def run(self, inputs, outputs, workspace):
        xs = [x for x in inputs if x is not None]
        out = outputs[0]
        if len(xs) == 1:
            np.copyto(out, xs[0])
        else:
            type(self).fold(xs[0], xs[1], out=out)
            for x in xs[2:]:
                type(self).fold(out, x, out=out)
        self.finish(out, len(xs))
        apply_activation(out, self.ctx)

    def finish(self, out: np.ndarray, n: int) -> None:
        """Post-processing of the folded result (Mean divides)."""


def variadic(op_type: str, fold: np.ufunc, kinds: str = NUMERIC,
             fuses: frozenset[str] = frozenset()) -> type[Kernel]:
    """Register a variadic kernel folding its inputs with the binary ufunc `fold`."""
    cls = type(op_type, (Variadic,), {"fold": fold, "kinds": kinds, "fuses": fuses,
                                      "__doc__": f"ONNX {op_type}: inputs folded with {fold.__name__}."})
    return register(op_type, since=1)(cls)


variadic("Sum", np.add, kinds=FLOAT, fuses=frozenset(FUSED_ACTIVATIONS))
variadic("Max", np.maximum)
variadic("Min", np.minimum)


@register("Mean", since=1)
class Mean(Variadic):
    """The sum of the inputs divided by their count."""

    kinds = FLOAT
    fold = np.add

    def finish(self, out, n):
        if n > 1:
            np.divide(out, n, out=out)


# ----------------------------------------------------------------------------- selection and clipping


@register("Where", since=9)
class Where(Kernel):
    """X where condition is true, else Y, all three broadcast; the output may overwrite Y."""

    inplace = {0: 2}

    @classmethod
    def infer(cls, ctx, inputs):
        cond, x, y = inputs
        _check_kind(ctx, cond, BOOL)
        _check_same_dtype(ctx, [x, y])
        return [TensorInfo(x.dtype, broadcast_shapes(cond.shape, x.shape, y.shape, name=ctx.name))]

    def run(self, inputs, outputs, workspace):
        cond, x, y = inputs
        out = outputs[0]
        np.copyto(out, y)
        np.copyto(out, x, where=cond)


@register("Clip", since=6)
class Clip(Unary):
    """Clip to [min, max]: attributes up to opset 10, optional scalar inputs from opset 11.

    From opset 11: "When 'min' is greater than 'max', the clip operator sets all the 'input'
    values to the value of 'max'", i.e. Min(max, Max(input, min)).
    """

    def __init__(self, ctx, inputs, outputs):
        super().__init__(ctx, inputs, outputs)
        if ctx.opset < 11:
            lo, hi = ctx.attr("min", -3.4028234663852886e38), ctx.attr("max", 3.4028234663852886e38)
            with np.errstate(over="ignore"):  # the float32 limits are +-inf in float16
                self.bounds = (outputs[0].dtype.type(lo), outputs[0].dtype.type(hi))

    def run(self, inputs, outputs, workspace):
        x, out = inputs[0], outputs[0]
        if self.ctx.opset < 11:
            lo, hi = self.bounds
        else:
            lo = inputs[1] if len(inputs) > 1 else None
            hi = inputs[2] if len(inputs) > 2 else None
        if lo is not None:
            np.maximum(x, lo, out=out)
        else:
            np.copyto(out, x)
        if hi is not None:
            np.minimum(out, hi, out=out)


# ----------------------------------------------------------------------------- casts


_FLOAT8_MAX = {"float8_e4m3fn": 448.0, "float8_e4m3fnuz": 240.0, "float8_e5m2": 57344.0,
               "float8_e5m2fnuz": 57344.0}


@register("Cast", since=6)
class Cast(Kernel):
    """Conversion to the dtype `to` names, numpy casting rules plus ONNX's string and float8 rules.

    "Casting from floating point to bool: +/- 0.0 to False; all else to True"; integers wrap
    ("200 (int16) -> -56 (int8)"); float8 casts saturate by default ("Inf -> FLT_MAX").
    """

    inplace = {0: 0}

    @classmethod
    def target(cls, ctx: OpContext, inputs: Sequence[TensorInfo | None]) -> np.dtype:
        to = ctx.attr("to")
        if to is None:
            raise ShapeError(f"{ctx.name}: Cast has no 'to' attribute; set it to a TensorProto "
                             f"data type")
        return onnx_dtype(to, ctx)

    @classmethod
    def infer(cls, ctx, inputs):
        x = inputs[0]
        dtype = cls.target(ctx, inputs)
        if dtype.name.startswith("float8_e8m0") or "c" in (x.dtype.kind, dtype.kind):
            raise ShapeError(f"{ctx.name}: {ctx.op_type} from {x.dtype} to {dtype} is not "
                             f"supported by omrt; cast through float32 in the model instead")
        return [TensorInfo(dtype, x.shape)]

    def __init__(self, ctx, inputs, outputs):
        super().__init__(ctx, inputs, outputs)
        dtype = outputs[0].dtype
        self.saturate = None
        fmax = _FLOAT8_MAX.get(dtype.name)
        if fmax is not None and ctx.attr("saturate", 1):
            self.saturate = (-fmax, fmax)

    def run(self, inputs, outputs, workspace):
        x, out = inputs[0], outputs[0]
        if out.dtype.kind == "O":
            out[...] = x.astype(np.str_)
        elif _kind(x.dtype) == "S":
            self._from_strings(x, out)
        elif self.saturate is not None:
            np.copyto(out, np.clip(x, *self.saturate), casting="unsafe")
        else:
            np.copyto(out, x, casting="unsafe")

    @staticmethod
    def _from_strings(x: np.ndarray, out: np.ndarray) -> None:
        try:
            np.copyto(out, x.astype(out.dtype))
        except (ValueError, TypeError):
            # "100.5" to an integer type: through float64, then truncated
            np.copyto(out, x.astype(np.float64), casting="unsafe")


@register("CastLike", since=15)
class CastLike(Cast):
    """Cast to the dtype of the second input."""

    @classmethod
    def target(cls, ctx, inputs):
        return inputs[1].dtype


# ----------------------------------------------------------------------------- random


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
