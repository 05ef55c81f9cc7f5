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
from .base import Kernel, OpContext, TensorInfo, broadcast_shapes, numel, register

# ----------------------------------------------------------------------------- dtypes

_ONNX_DTYPES = {
    1: "float32", 2: "uint8", 3: "int8", 4: "uint16", 5: "int16", 6: "int32", 7: "int64",
    8: "object", 9: "bool", 10: "float16", 11: "float64", 12: "uint32", 13: "uint64",
    14: "complex64", 15: "complex128", 16: "bfloat16", 17: "float8_e4m3fn", 18: "float8_e4m3fnuz",
    19: "float8_e5m2", 20: "float8_e5m2fnuz", 21: "uint4", 22: "int4", 23: "float4_e2m1fn",
    24: "float8_e8m0fnu", 25: "uint2", 26: "int2", 27: "float6_e2m3fn", 28: "float6_e3m2fn",
}
"""ONNX TensorProto data types by number; strings are numpy object arrays."""


def onnx_dtype(code: int, ctx: OpContext) -> np.dtype:
    """The numpy dtype of an ONNX data type number, or a ShapeError naming it."""
    name = _ONNX_DTYPES.get(int(code))
    if name is None:
        raise ShapeError(f"{ctx.name}: {ctx.op_type} names data type {code}, which ONNX does not "
                         f"define; use a TensorProto.DataType value")
    try:
        return np.dtype(name)
    except TypeError:
        raise ShapeError(f"{ctx.name}: {ctx.op_type} needs type {name}, which numpy only knows "
                         f"once the ml_dtypes package is imported; import ml_dtypes before "
                         f"loading the model, or cast to float32 instead") from None


def _kind(dtype: np.dtype) -> str:
    """numpy's kind letter, with ml_dtypes' small floats counted as floats and strings as 'S'."""
    if dtype.kind == "V" and dtype.name.startswith(("float", "bfloat")):
        return "f"
    if dtype.kind in "OUS":
        return "S"
    return dtype.kind


_KIND_NAMES = {"f": "float", "i": "signed integer", "u": "unsigned integer", "b": "bool",
               "S": "string"}


def _check_kind(ctx: OpContext, info: TensorInfo, kinds: str, index: int = 0) -> None:
    if _kind(info.dtype) not in kinds:
        allowed = ", ".join(_KIND_NAMES[k] for k in kinds)
        raise ShapeError(f"{ctx.name}: {ctx.op_type} input {index} has dtype {info.dtype}, but the "
                         f"operator takes only {allowed} tensors; insert a Cast")


def _check_same_dtype(ctx: OpContext, infos: Sequence[TensorInfo]) -> None:
    dtypes = {i.dtype for i in infos}
    if len(dtypes) > 1:
        raise ShapeError(f"{ctx.name}: {ctx.op_type} inputs have dtypes {sorted(map(str, dtypes))}, "
                         f"but must all have one dtype; insert a Cast")


FLOAT = "f"
SIGNED = "fi"
NUMERIC = "fiu"
INTEGER = "iu"
BOOL = "b"

# ----------------------------------------------------------------------------- unary


class Unary(Kernel):
    """Same shape and dtype in and out, one ufunc pass or a few in place on the output."""

    inplace = {0: 0}
    kinds: ClassVar[str] = NUMERIC

    @classmethod
    def infer(cls, ctx: OpContext, inputs: Sequence[TensorInfo | None]) -> list[TensorInfo]:
        x = inputs[0]
        _check_kind(ctx, x, cls.kinds)
        return [TensorInfo(x.dtype, x.shape)]

    def run(self, inputs, outputs, workspace):
        self.compute(inputs[0], outputs[0])

    def compute(self, x: np.ndarray, out: np.ndarray) -> None:
        raise NotImplementedError


def unary(op_type: str, fn: Callable[..., object], since: int = 1, kinds: str = NUMERIC) -> type[Kernel]:
    """Register a unary kernel from a ufunc-like `fn(x, out=...)`."""

    def compute(self: Unary, x: np.ndarray, out: np.ndarray) -> None:
        fn(x, out=out)

    cls = type(op_type, (Unary,), {"compute": compute, "kinds": kinds,
                                   "__doc__": f"ONNX {op_type}: one ufunc into the output."})
    return register(op_type, since)(cls)


def _relu(x: np.ndarray, out: np.ndarray) -> None:
    np.maximum(x, x.dtype.type(0), out=out)


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


unary("Relu", _relu, kinds=SIGNED)
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
        return -(-self.step * self.work.itemsize // 64) * 64

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


# erf(x) = x * A(x^2) for |x| < a; else sign(x) * (1 - exp(-x^2) * s * B(s * alpha + beta)) with
# s = 1 / min(|x|, hi). A and B are Chebyshev interpolants of erf(sqrt t)/sqrt t and of
# x * exp(x^2) * erfc(x) in the variable 1/x, converted to monomials; evaluated in float64 the
# "single" set is faithful (<= 1 ulp) in float32, the "double" set within 1e-15 relative.
_ERF_SINGLE = (1.5, 4.0, 4.800000000000001, -2.2, (
    1.1283791663354452, -0.376126334232965, 0.11283726278326812, -0.0268631475215238,
    0.00521691926845622, -0.0008454627415486682, 0.00011309676190128002, -1.1328873788965468e-05,
    6.205873148565223e-07,
), (
    0.517685940192101, -0.034063866858605005, -0.0022858100596366182, 0.0012456050410386886,
    -0.00021901786855947096, 1.1047107555663843e-05, 6.367912265977047e-06,
    -2.6381291931921233e-06, 4.975012184143168e-07,
))
_ERF_DOUBLE = (1.5, 6.0, 4.0, -1.6666666666666665, (
    1.1283791670955123, -0.3761263890318455, 0.11283791671006917, -0.02686617065154504,
    0.00522397766229043, -0.0008548328241391942, 0.00012055358663715973, -1.4926015858138423e-05,
    1.6465727136262964e-06, -1.639082589955567e-07, 1.4926106839252177e-08, -1.265941453673093e-09,
    1.005283633812805e-10, -6.835525513202979e-12, 2.8087451529198067e-13,
), (
    0.5243969628888799, -0.039591583739162134, -0.004444492750393925, 0.002460770062360431,
    -0.0004674399394925371, 2.4716565662878067e-06, 3.1496690482858876e-05, -1.243700982764975e-05,
    2.5190382348638003e-06, 1.7666412217643865e-08, -2.500278586464665e-07, 1.1793168386643716e-07,
    -3.262181112641384e-08, 4.1659083742015234e-09, 1.969906736667297e-09, -1.7948181863321106e-09,
    4.944056782063023e-10,
))


def _horner(coefs: Sequence[float], v: np.ndarray, acc: np.ndarray) -> None:
    np.multiply(v, coefs[-1], out=acc)
    acc += coefs[-2]
    for c in coefs[-3::-1]:
        acc *= v
        acc += c


def _erf(x: np.ndarray, out: np.ndarray, t: np.ndarray, u: np.ndarray, small: np.ndarray,
         coefs: tuple) -> None:
    """erf of float64 `x` into `out` (distinct from `x`), with scratch `t`, `u` and bool `small`."""
    a, hi, alpha, beta, poly_a, poly_b = coefs
    np.absolute(x, out=t)
    np.less(t, a, out=small)
    np.clip(t, a, hi, out=t)
    np.reciprocal(t, out=u)
    np.multiply(t, t, out=t)
    np.negative(t, out=t)
    np.exp(t, out=t)
    t *= u
    u *= alpha
    u += beta
    _horner(poly_b, u, out)
    out *= t
    np.subtract(1.0, out, out=out)
    np.copysign(out, x, out=out)
    np.multiply(x, x, out=t)
    _horner(poly_a, t, u)
    u *= x
    np.copyto(out, u, where=small)


class ErfBased(Pointwise):
    """Chunks computed in float64 through `_erf`, accurate to the output's precision."""

    buffers = 4
    masks = 1

    def work_dtype(self, dtype):
        return np.dtype(np.float64)

    def __init__(self, ctx, inputs, outputs):
        super().__init__(ctx, inputs, outputs)
        self.coefs = _ERF_DOUBLE if outputs[0].dtype.itemsize >= 8 else _ERF_SINGLE


@register("Erf", since=9)
class Erf(ErfBased):
    """The Gauss error function (numpy has none): see `_erf`."""

    kinds = NUMERIC

    def chunk(self, x, out, bufs, mask):
        xw, r, t, u = bufs
        np.copyto(xw, x, casting="unsafe")
        _erf(xw, r, t, u, mask, self.coefs)
        np.copyto(out, r, casting="unsafe")


# ----------------------------------------------------------------------------- binary


class Binary(Kernel):
    """Two inputs with numpy (multidirectional) broadcasting; output dtype is input 0's or `result`."""

    inplace = {0: 0}
    kinds: ClassVar[str] = NUMERIC
    result: ClassVar[np.dtype | None] = None
    same_dtype: ClassVar[bool] = True

    @classmethod
    def infer(cls, ctx: OpContext, inputs: Sequence[TensorInfo | None]) -> list[TensorInfo]:
        a, b = inputs[0], inputs[1]
        _check_kind(ctx, a, cls.kinds)
        if cls.same_dtype:
            _check_same_dtype(ctx, [a, b])
        shape = broadcast_shapes(a.shape, b.shape, name=ctx.name)
        return [TensorInfo(cls.result if cls.result is not None else a.dtype, shape)]

    def run(self, inputs, outputs, workspace):
        self.compute(inputs[0], inputs[1], outputs[0])

    def compute(self, a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
        raise NotImplementedError


def binary(op_type: str, fn: Callable[..., object], since: int = 7, kinds: str = NUMERIC,
           result: np.dtype | None = None) -> type[Kernel]:
    """Register a broadcasting binary kernel from a ufunc-like `fn(a, b, out=...)`."""

    def compute(self: Binary, a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
        fn(a, b, out=out)

    cls = type(op_type, (Binary,), {"compute": compute, "kinds": kinds, "result": result,
                                    "__doc__": f"ONNX {op_type}: one broadcasting ufunc."})
    return register(op_type, since)(cls)


_BOOL = np.dtype(np.bool_)

binary("Add", np.add)
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
    """Any number of same-dtype inputs folded pairwise with broadcasting (Sum, Max, ...)."""

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

    def finish(self, out: np.ndarray, n: int) -> None:
        """Post-processing of the folded result (Mean divides)."""


def variadic(op_type: str, fold: np.ufunc, kinds: str = NUMERIC) -> type[Kernel]:
    """Register a variadic kernel folding its inputs with the binary ufunc `fold`."""
    cls = type(op_type, (Variadic,), {"fold": fold, "kinds": kinds,
                                      "__doc__": f"ONNX {op_type}: inputs folded with {fold.__name__}."})
    return register(op_type, since=1)(cls)


variadic("Sum", np.add, kinds=FLOAT)
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
