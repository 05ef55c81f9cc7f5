"""Elementwise kernels: unary and broadcasting binary math, logic, comparisons, Where, Clip, casts.

Every kernel writes straight into its output with ufuncs (`out=`). Most are generated from tables
(`unary`, `binary`, `variadic`: one ufunc each), Relu, Sigmoid and Tanh among them; the
activations with attributes or intermediates build on `Unary` and `Binary` in `activations`, and
the random ops are in `randomness`.
"""

from __future__ import annotations

import functools
from typing import Callable, ClassVar, Sequence

import numpy as np

from ..errors import ShapeError
from ..native.bindings import ARITHMETIC, BINARY, SWAPPED, activation_code
from ..native.library import Checked
from ..native.signature import address
from . import parallel
from .base import (FUSED_ACTIVATIONS, Kernel, OpContext, TensorInfo, apply_activation, broadcast_shapes,
                   numel, onnx_dtype, register, relu, run_bound)


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


MIN_RUN = 16
"""Fewest consecutive elements the native loop must find in a row of the broadcast operand's
layout: shorter rows cost more in per-row setup than numpy does."""

MIN_NATIVE_BYTES = 1 << 18
"""Outputs smaller than this stay with numpy when the kernel runs on its own: a checked native
call costs several microseconds before its loop starts, about what numpy takes for 64K floats;
from there on the C loop, split over the native workers and applying the activation in the same
pass, is faster. A call the executor binds (`Kernel.bind`) is checked once and costs next to
nothing in a call list, so it goes to C at any size."""


def _runs(small: tuple[int, ...], out: tuple[int, ...]) -> tuple[int, int, int, int] | None:
    """(rows, inner, b_rows, b_cols) of omrt_binary_f32 reading `small` broadcast to `out`, when
    `small` (right-aligned) repeats the output's dims p..q over the dims before p and is the
    same value along those after q; None otherwise."""
    shape = (1,) * (len(out) - len(small)) + small
    if len(shape) != len(out):
        return None
    dims = [(s == o, o) for s, o in zip(shape, out) if o != 1]
    full = [k for k, (same, _) in enumerate(dims) if same]
    if not full:
        return 1, numel(out), 1, 1
    p, q = full[0], full[-1] + 1
    if len(full) != q - p:
        return None
    sizes = [o for _, o in dims]
    if q == len(dims):
        inner = numel(sizes[p:])
        return numel(sizes[:p]), inner, 1, inner
    return numel(sizes[:q]), numel(sizes[q:]), numel(sizes[p:q]), 1


@functools.lru_cache(maxsize=256)
def binary_layout(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[bool, int, int, int, int] | None:
    """(swap, rows, inner, b_rows, b_cols) for a op b in one native call: one operand has the
    output's shape (the other when `swap`), the other one `_runs` reads in rows of at least
    MIN_RUN; None when there is no such layout or nothing to compute."""
    out = np.broadcast_shapes(a, b)
    if numel(out) == 0:
        return None
    for swap, (full, small) in enumerate(((a, b), (b, a))):
        runs = _runs(small, out) if full == out else None
        if runs is not None and (runs[1] >= MIN_RUN or runs[0] == 1):
            return bool(swap), *runs
    return None


def _partly_overlap(x: np.ndarray, out: np.ndarray) -> bool:
    """Whether x and out share memory without being the same elements: C, unlike numpy, would
    then read elements it has already written."""
    return np.may_share_memory(x, out) and not (x.nbytes == out.nbytes and address(x) == address(out))


class NativeArith:
    """A float32 Add, Sub, Mul, Div, Max or Min (and the node's fused activation) as one call of
    omrt_binary_f32, spread over the native workers when the arrays are big enough."""

    def __init__(self, fn: Callable[..., None], op: int, act: tuple[int, float, float]) -> None:
        self.fn, self.op, self.act = fn, op, act

    @classmethod
    def of(cls, ctx: OpContext, op: str | None, dtype: np.dtype) -> NativeArith | None:
        """The native op for a node computing `op` in `dtype`; None when the library is not
        loaded, the dtype is not float32 or the loop does not apply the node's activation."""
        act = activation_code(ctx.attrs)
        if op is None or ctx.native is None or dtype != np.float32 or act is None:
            return None
        fn = ctx.native.get(BINARY)
        return None if fn is None else cls(fn, ARITHMETIC[op], act)

    def bind(self, a: np.ndarray, b: np.ndarray, out: np.ndarray, least: int = 0) -> list[Checked] | None:
        """The call out = act(a op b), checked; None when out has fewer than `least` bytes, an
        array is not C-contiguous float32, out overlaps an input other than by being it, or the
        shapes have no layout the loop reads (`binary_layout`)."""
        if out.nbytes < least or not all(x.dtype == np.float32 and x.flags.c_contiguous
                                                    for x in (a, b, out)):
            return None
        if _partly_overlap(a, out) or _partly_overlap(b, out):
            return None
        layout = binary_layout(a.shape, b.shape)
        if layout is None:
            return None
        swap, rows, inner, b_rows, b_cols = layout
        op = SWAPPED[self.op] if swap else self.op
        a, b = (b, a) if swap else (a, b)
        threads = parallel.native_threads(nbytes=out.nbytes)
        return [self.fn.bind(a, b, out, op, rows, inner, b_rows, b_cols, threads, *self.act)]


class Binary(Kernel):
    """Two inputs with numpy (multidirectional) broadcasting; output dtype is input 0's or `result`.

    Kernels that list activations in `fuses` apply the one fused into them to their output.
    Those naming a `native_op` (a key of bindings.ARITHMETIC) run float32 in C when the layout
    allows (`NativeArith`); otherwise an input that repeats a short pattern is tiled first (see
    `_tile_plan`).
    """

    inplace = {0: 0}
    kinds: ClassVar[str] = NUMERIC
    result: ClassVar[np.dtype | None] = None
    same_dtype: ClassVar[bool] = True
    native_op: ClassVar[str | None] = None

    def __init__(self, ctx: OpContext, inputs: Sequence[TensorInfo | None],
                 outputs: Sequence[TensorInfo]) -> None:
        super().__init__(ctx, inputs, outputs)
        self.tile = _tile_plan(inputs[0], inputs[1], outputs[0])
        self.native = NativeArith.of(ctx, self.native_op, outputs[0].dtype)

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

    def bind(self, inputs, outputs, workspace):
        return None if self.native is None else self.native.bind(inputs[0], inputs[1], outputs[0])

    def run(self, inputs, outputs, workspace):
        a, b, out = inputs[0], inputs[1], outputs[0]
        if self.native is not None and run_bound(self.native.bind(a, b, out, MIN_NATIVE_BYTES)):
            return
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


def _native(op: str | None) -> dict:
    """The class attributes of a kernel computing the arithmetic `op` natively (None: never)."""
    return {"native_op": op, "native_units": ("elementwise",) if op is not None else ()}


def binary(op_type: str, fn: Callable[..., object], since: int = 7, kinds: str = NUMERIC,
           result: np.dtype | None = None, fuses: frozenset[str] = frozenset(),
           native_op: str | None = None) -> type[Kernel]:
    """Register a broadcasting binary kernel from a ufunc-like `fn(a, b, out=...)`, computed in C
    for float32 when it is the arithmetic `native_op`."""

    def compute(self: Binary, a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
        fn(a, b, out=out)

    cls = type(op_type, (Binary,), {"compute": compute, "kinds": kinds, "result": result, "fuses": fuses,
                                    **_native(native_op), "__doc__": f"ONNX {op_type}: one broadcasting ufunc."})
    return register(op_type, since)(cls)


binary("Add", np.add, fuses=frozenset(FUSED_ACTIVATIONS), native_op="Add")
binary("Sub", np.subtract, native_op="Sub")
binary("Mul", np.multiply, native_op="Mul")
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


@register("Div", since=7)
class Div(Binary):
    """a / b; integer division truncates toward zero as in C ("the result is truncated")."""

    native_op = "Div"
    native_units = ("elementwise",)

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
    activation fused into the node, if its kernel lists it in `fuses`. Two inputs of a kernel
    naming a `native_op` go to C as in `Binary`."""

    inplace = {0: 0}
    kinds: ClassVar[str] = NUMERIC
    fold: ClassVar[np.ufunc]
    native_op: ClassVar[str | None] = None

    def __init__(self, ctx: OpContext, inputs: Sequence[TensorInfo | None],
                 outputs: Sequence[TensorInfo]) -> None:
        super().__init__(ctx, inputs, outputs)
        self.native = NativeArith.of(ctx, self.native_op, outputs[0].dtype)

    @classmethod
    def infer(cls, ctx: OpContext, inputs: Sequence[TensorInfo | None]) -> list[TensorInfo]:
        xs = [x for x in inputs if x is not None]
        if not xs:
            raise ShapeError(f"{ctx.name}: {ctx.op_type} needs at least one input")
        _check_kind(ctx, xs[0], cls.kinds)
        _check_same_dtype(ctx, xs)
        return [TensorInfo(xs[0].dtype, broadcast_shapes(*(x.shape for x in xs), name=ctx.name))]

    def bind(self, inputs, outputs, workspace):
        return self._bind_pair(inputs, outputs[0], 0)

    def _bind_pair(self, inputs, out: np.ndarray, least: int) -> list[Checked] | None:
        """The native call of a node of two inputs (NativeArith.bind), else None."""
        xs = [x for x in inputs if x is not None]
        return self.native.bind(xs[0], xs[1], out, least) if len(xs) == 2 and self.native is not None else None

    def run(self, inputs, outputs, workspace):
        if run_bound(self._bind_pair(inputs, outputs[0], MIN_NATIVE_BYTES)):
            return
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


def variadic(op_type: str, fold: np.ufunc, kinds: str = NUMERIC, fuses: frozenset[str] = frozenset(),
             native_op: str | None = None) -> type[Kernel]:
    """Register a variadic kernel folding its inputs with the binary ufunc `fold`, two of them in C
    for float32 when `fold` is the arithmetic `native_op`."""
    cls = type(op_type, (Variadic,), {"fold": fold, "kinds": kinds, "fuses": fuses, **_native(native_op),
                                      "__doc__": f"ONNX {op_type}: inputs folded with {fold.__name__}."})
    return register(op_type, since=1)(cls)


variadic("Sum", np.add, kinds=FLOAT, fuses=frozenset(FUSED_ACTIVATIONS), native_op="Add")
variadic("Max", np.maximum, native_op="Max")
variadic("Min", np.minimum, native_op="Min")


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

_E8M0_RANGE = (2.0 ** -127, 2.0 ** 127)
"""float8e8m0's smallest and largest values: it holds the powers of two between them and NaN."""

_E8M0_ROUND = {"up": np.nextafter(0.5, 1.0), "down": 1.0, "nearest": 0.75}
"""Cast to float8e8m0 writes |x| = m * 2**e (m in [0.5, 1)) as 2**(e-1) when m is below the
round_mode's threshold, else as 2**e: "up" only keeps a power of two (m = 0.5), "nearest" goes
down below the midpoint 1.5 * 2**(e-1) ("ties round up"), "down" always goes down."""


def _round_mode(ctx: OpContext) -> str:
    """The node's round_mode (opset 24, "up" by default), or a ShapeError naming the choices."""
    mode = ctx.attr("round_mode", "up")
    if mode not in _E8M0_ROUND:
        raise ShapeError(f"{ctx.name}: {ctx.op_type} round_mode {mode!r} is not one of "
                         f"{', '.join(_E8M0_ROUND)}; set one of them or leave it out (up)")
    return mode


def _to_e8m0(x: np.ndarray, round_mode: str, saturate: bool) -> np.ndarray:
    """The float64 powers of two (or NaN) a cast of `x` to float8e8m0 stores.

    |x| is rounded by `round_mode`; a result outside the type's range, 0 and Inf included, is
    clipped to its nearer end under `saturate` and NaN without ("saturate + up: 0 -> 0 [the
    smallest value], Inf -> E8M0_MAX"; "non-saturate + nearest: 0, Inf, x > E8M0_MAX,
    x < E8M0_MIN -> NaN"). Negative inputs, whose cast the spec leaves undefined, are cast as their
    magnitude, as in the onnx reference implementation.
    """
    a = np.clip(np.abs(x.astype(np.float64)), 2.0 ** -128, 2.0 ** 128)  # 0, Inf: just outside
    m, e = np.frexp(a)
    p = np.ldexp(np.sign(a), e - (m < _E8M0_ROUND[round_mode]))  # sign(a): 1, or NaN for NaN
    lo, hi = _E8M0_RANGE
    return np.clip(p, lo, hi) if saturate else np.where((p < lo) | (p > hi), np.nan, p)


@register("Cast", since=6)
class Cast(Kernel):
    """Conversion to the dtype `to` names, numpy casting rules plus ONNX's string and float8 rules.

    "Casting from floating point to bool: +/- 0.0 to False; all else to True"; integers wrap
    ("200 (int16) -> -56 (int8)"); float8 casts saturate by default ("Inf -> FLT_MAX"). Casts to
    float8e8m0 round to a power of two "using the `round_mode` and `saturate` attributes"
    (`_to_e8m0`).
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
        _round_mode(ctx)
        if "c" in (x.dtype.kind, dtype.kind):
            raise ShapeError(f"{ctx.name}: {ctx.op_type} from {x.dtype} to {dtype} is not "
                             f"supported by omrt; cast through float32 in the model instead")
        return [TensorInfo(dtype, x.shape)]

    def __init__(self, ctx, inputs, outputs):
        super().__init__(ctx, inputs, outputs)
        dtype = outputs[0].dtype
        saturate = bool(ctx.attr("saturate", 1))
        self.e8m0 = (_round_mode(ctx), saturate) if dtype.name == "float8_e8m0fnu" else None
        fmax = _FLOAT8_MAX.get(dtype.name)
        self.saturate = (-fmax, fmax) if fmax is not None and saturate else None

    def run(self, inputs, outputs, workspace):
        x, out = inputs[0], outputs[0]
        if out.dtype.kind == "O":
            out[...] = x.astype(np.str_)
        elif _kind(x.dtype) == "S":
            self._from_strings(x, out)
        else:
            self._from_numbers(x, out)

    def _from_numbers(self, x: np.ndarray, out: np.ndarray) -> None:
        if self.e8m0 is not None:
            x = _to_e8m0(x, *self.e8m0)
        elif self.saturate is not None:
            x = np.clip(x, *self.saturate)
        np.copyto(out, x, casting="unsafe")

    def _from_strings(self, x: np.ndarray, out: np.ndarray) -> None:
        try:
            np.copyto(out, x.astype(out.dtype))
        except (ValueError, TypeError):
            # "100.5" to an integer type, strings to ml_dtypes' types: through float64
            self._from_numbers(x.astype(np.float64), out)


@register("CastLike", since=15)
class CastLike(Cast):
    """Cast to the dtype of the second input."""

    @classmethod
    def target(cls, ctx, inputs):
        return inputs[1].dtype
