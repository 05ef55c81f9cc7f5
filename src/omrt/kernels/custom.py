"""Custom operators: kernels a model brings in its own file, and the shape rules they state.

The user defines an operator with `omrt.CustomOp`; the compiler packs it into the `.om` file; at
load each model builds its own kernel class per operator (`kernel_class`) and looks it up before
omrt's library (`omrt.ir.Graph.custom`). The class wraps a `CustomImpl`:

- its shape and type function: Python, `infer(inputs, attrs) -> [(dtype, shape), ...]`, or
  declarative `OutputRule`s, which are data, not code, and so hold in files that are not trusted;
- its run function: Python, `run(inputs, outputs, workspace, attrs)`, or a C entry point
  (`omrt.native.custom.Entry`); both write into the output arrays they are handed;
- the workspace bytes it needs: a number, or an expression of the input shapes.

Shape rules and workspace sizes are written in a small arithmetic language evaluated without
`eval` (`evaluate`): the rules of a file can be used whether or not it is trusted.
"""

from __future__ import annotations

import ast
import json
import math
import re
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Mapping, Sequence

import numpy as np

from ..errors import KernelError, OmrtError, ShapeError
from ..ir import Dim, Shape, TensorInfo
from .base import Kernel, OpContext, fresh_dim, normalize_axis

PYTHON, NATIVE = "python", "native"
"""The languages a custom kernel is written in."""

_MAX_EXPRESSION = 256
_LIMIT = 1 << 62
_INPUT = re.compile(r"in(\d+)")
_FUNCTIONS = ("size", "rank", "min", "max")
_BINARY = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
           ast.FloorDiv: lambda a, b: a // b, ast.Mod: lambda a, b: a % b}


class _Symbolic(Exception):
    """An expression needs a dim that is not known before run time."""


@dataclass(frozen=True)
class _Scope:
    inputs: Sequence[TensorInfo | None]
    attrs: Mapping[str, Any]
    where: str

    def fail(self, text: str, why: str) -> ShapeError:
        return ShapeError(f"{self.where}: {text!r} {why}; shape rules use numbers, the input shapes "
                          f"(in0[-1], size(in1), rank(in0)), integer attributes, + - * // %, min and max")


def evaluate(text: str, inputs: Sequence[TensorInfo | None], attrs: Mapping[str, Any], where: str) -> Dim:
    """The value of a dim or workspace expression such as `in0[-1] // 2` or `4 * size(in0)`.

    A dim that is symbolic (at compile time) passes through when the expression is that dim
    alone; arithmetic on one gives a new symbolic dim. Anything but the documented language is a
    ShapeError naming `where`: the expression may come from a file nobody vetted."""
    scope = _Scope(inputs, attrs, where)
    if not isinstance(text, str) or len(text) > _MAX_EXPRESSION:
        raise scope.fail(str(text)[:_MAX_EXPRESSION], f"is not an expression of at most {_MAX_EXPRESSION} "
                                                      f"characters")
    try:
        tree = ast.parse(text.strip(), mode="eval").body
    except SyntaxError as e:
        raise scope.fail(text, f"does not parse ({e.msg})") from None
    try:
        value = _eval(tree, scope, text)
    except _Symbolic:
        value = None
    if value is None:
        return fresh_dim("custom")
    if not isinstance(value, (int, str)) or isinstance(value, bool):
        raise scope.fail(text, "is not a whole number")
    return value


def _eval(node: ast.AST, scope: _Scope, text: str) -> Any:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.Name):
        return _name(node.id, scope, text)
    if isinstance(node, ast.Subscript):
        shape = _shape(node.value, scope, text)
        axis = _number(node.slice, scope, text)
        if not -len(shape) <= axis < len(shape):
            raise scope.fail(text, f"reads axis {axis} of a rank-{len(shape)} input")
        return shape[axis]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _number(node.operand, scope, text)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        a, b = _number(node.left, scope, text), _number(node.right, scope, text)
        if isinstance(node.op, (ast.FloorDiv, ast.Mod)) and b == 0:
            raise scope.fail(text, "divides by zero")
        value = _BINARY[type(node.op)](a, b)
        if abs(value) > _LIMIT:
            raise scope.fail(text, "is out of range")
        return value
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _FUNCTIONS:
        return _call(node, scope, text)
    raise scope.fail(text, f"uses {type(node).__name__}, which is not allowed")


def _name(name: str, scope: _Scope, text: str) -> Any:
    if _INPUT.fullmatch(name):
        raise scope.fail(text, f"uses the shape {name} as a number; take one of its dims ({name}[0])")
    value = scope.attrs.get(name)
    if type(value) is not int:
        raise scope.fail(text, f"names {name!r}, which is neither an input nor an integer attribute")
    return value


def _shape(node: ast.AST, scope: _Scope, text: str) -> Shape:
    match = _INPUT.fullmatch(node.id) if isinstance(node, ast.Name) else None
    if match is None:
        raise scope.fail(text, "takes a dim of something that is not an input (in0, in1, ...)")
    i = int(match.group(1))
    if i >= len(scope.inputs) or scope.inputs[i] is None:
        raise scope.fail(text, f"reads input {i}, which the node does not have")
    shape = scope.inputs[i].shape
    if shape is None:
        raise _Symbolic
    return shape


def _number(node: ast.AST, scope: _Scope, text: str) -> int:
    value = _eval(node, scope, text)
    if isinstance(value, (str, type(None))):
        raise _Symbolic
    return value


def _call(node: ast.Call, scope: _Scope, text: str) -> int:
    name = node.func.id
    if node.keywords or not node.args:
        raise scope.fail(text, f"calls {name} without arguments or with keywords")
    if name in ("min", "max"):
        values = [_number(a, scope, text) for a in node.args]
        return min(values) if name == "min" else max(values)
    if len(node.args) != 1:
        raise scope.fail(text, f"calls {name} with more than one input")
    shape = _shape(node.args[0], scope, text)
    if name == "rank":
        return len(shape)
    if not all(isinstance(d, int) for d in shape):
        raise _Symbolic
    return int(np.prod(shape, dtype=np.int64))


@dataclass(frozen=True)
class OutputRule:
    """A declarative shape and type rule for one output of a custom operator.

    The output starts from input `like` (its dtype and shape); `dtype` replaces the dtype (a numpy
    name such as "float32"); `shape` replaces the whole shape (a list of dims); `dims` replaces
    some axes ({-1: "in0[-1] // 2"}). A dim is a number or an expression: input dims (`in0[-1]`,
    `size(in1)`, `rank(in0)`), the node's integer attributes, `+ - * // %`, `min()` and `max()`.
    Rules are data, not code: a model whose operators state them can be planned from a file that
    is not trusted.
    """

    like: int | None = 0
    dtype: str | None = None
    shape: tuple[int | str, ...] | None = None
    dims: Mapping[int, int | str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.like is None and (self.dtype is None or self.shape is None):
            raise ValueError("an OutputRule without like= needs both dtype= and shape=")
        if self.like is not None and (type(self.like) is not int or self.like < 0):
            raise ValueError(f"OutputRule like={self.like!r}: give the index of an input (0, 1, ...)")
        if self.dtype is not None:
            np.dtype(self.dtype)  # raises TypeError naming a dtype numpy does not know
        if self.shape is not None:
            object.__setattr__(self, "shape", tuple(self.shape))
        object.__setattr__(self, "dims", {int(k): v for k, v in dict(self.dims).items()})
        for d in (self.shape or ()) + tuple(self.dims.values()):
            if not (isinstance(d, str) or (type(d) is int and d >= 0)):
                raise ValueError(f"OutputRule dim {d!r}: give a whole number >= 0 or an expression string")

    def to_json(self) -> dict:
        """The rule as the CUSTOM_OPS partition stores it."""
        return {"like": self.like, "dtype": self.dtype, "shape": None if self.shape is None else list(self.shape),
                "dims": {str(k): v for k, v in self.dims.items()}}

    @staticmethod
    def from_json(doc: Any) -> "OutputRule":
        """The rule stored by `to_json`; ValueError or TypeError when `doc` is not one."""
        if not isinstance(doc, dict) or set(doc) != {"like", "dtype", "shape", "dims"}:
            raise ValueError(f"{doc!r} is not an output rule")
        return OutputRule(doc["like"], doc["dtype"], doc["shape"], doc["dims"])

    def apply(self, inputs: Sequence[TensorInfo | None], attrs: Mapping[str, Any], where: str) -> TensorInfo:
        """The output's info for a node with these inputs and attributes."""
        base = None
        if self.like is not None:
            if self.like >= len(inputs) or inputs[self.like] is None:
                raise ShapeError(f"{where}: its output rule starts from input {self.like}, which the node "
                                 f"does not have")
            base = inputs[self.like]
        dtype = np.dtype(self.dtype) if self.dtype is not None else base.dtype

        def dim(d: int | str) -> Dim:
            value = d if isinstance(d, int) else evaluate(d, inputs, attrs, where)
            if isinstance(value, int) and value < 0:
                raise ShapeError(f"{where}: its output rule gives dim {d!r} = {value}, a negative size")
            return value

        if self.shape is not None:
            return TensorInfo(dtype, tuple(dim(d) for d in self.shape))
        if base.shape is None:
            return TensorInfo(dtype, None)
        shape = list(base.shape)
        for axis, d in self.dims.items():
            shape[normalize_axis(axis, len(shape), where)] = dim(d)
        return TensorInfo(dtype, tuple(shape))


def python_function(source: str, symbol: str, where: str) -> Callable[..., Any]:
    """The function `symbol` that Python `source` defines, run in a namespace of its own that
    holds numpy (as `np` and `numpy`) and `math`: what a packed kernel or infer function may use
    besides what it imports itself. Run only trusted source (the caller decides)."""
    namespace: dict[str, Any] = {"__name__": "omrt.custom", "np": np, "numpy": np, "math": math}
    try:
        exec(compile(source, f"<{where}>", "exec"), namespace)
    except Exception as e:
        raise KernelError(f"{where}: its Python source does not run: {type(e).__name__}: {e}") from e
    function = namespace.get(symbol)
    if not callable(function):
        raise KernelError(f"{where}: its Python source defines no function {symbol!r}")
    return function


def shape_function(doc: Mapping[str, Any], trusted: bool, where: str
                   ) -> tuple[Callable[..., Any] | None, tuple[OutputRule, ...] | None]:
    """(Python infer function, output rules) of a stored shape function ({"rules": [...]} or
    {"python": source, "symbol": name}): rules always; Python only when `trusted`, else neither.
    ValueError or TypeError when `doc` is neither form."""
    if set(doc) == {"rules"} and isinstance(doc["rules"], list):
        return None, tuple(OutputRule.from_json(r) for r in doc["rules"])
    if set(doc) != {"python", "symbol"} or not all(isinstance(v, str) for v in doc.values()):
        raise ValueError(f"{where}: its shape function is neither rules nor Python source")
    return (python_function(doc["python"], doc["symbol"], where) if trusted else None), None


@dataclass
class CustomImpl:
    """One custom operator of one model: what its kernel class infers and runs with.

    `infer` is None when the shape function is Python the model may not run (the file is not
    trusted) and `rules` are None too; `run` is None when the kernel cannot run here, and
    `unavailable` says why and what to do."""

    domain: str
    op_type: str
    language: str
    version: str = ""
    infer: Callable[[list, dict], Sequence[Any]] | None = None
    rules: tuple[OutputRule, ...] | None = None
    run: Callable[..., Any] | None = None
    unavailable: str = ""
    workspace: int | str = 0
    attrs: dict[str, Any] = field(default_factory=dict)
    """Default attributes and state (arrays) of the operator; a node's own attributes win."""
    debug: bool = False
    """Check every run: outputs written in full and nothing past them (see `CustomKernel`)."""

    @property
    def qualified(self) -> str:
        return f"{self.domain}::{self.op_type}"


GUARD = 64
"""Bytes of canary before and after each output and the workspace in a checked run."""
FILLS = (0xA5, 0x5A)
"""Byte patterns a checked run fills outputs with: an element left holding the pattern after
both runs was never written."""


class CustomKernel(Kernel):
    """Base of every custom operator's kernel class (one subclass per operator per model)."""

    impl: ClassVar[CustomImpl]
    deterministic = False
    """Never folded at compile time: a custom kernel runs only where the model runs."""

    def __init__(self, ctx: OpContext, inputs: Sequence[TensorInfo | None],
                 outputs: Sequence[TensorInfo]) -> None:
        super().__init__(ctx, inputs, outputs)
        self.attrs = _attributes(self.impl, ctx)
        self.where = _where(self.impl, ctx)
        self._json = _attrs_json(self.attrs).encode() if self.impl.language == NATIVE else b""

    @classmethod
    def infer(cls, ctx: OpContext, inputs: Sequence[TensorInfo | None]) -> list[TensorInfo]:
        impl, where = cls.impl, _where(cls.impl, ctx)
        attrs = _attributes(impl, ctx)
        if impl.rules is not None:
            outs = [rule.apply(inputs, attrs, where) for rule in impl.rules]
        elif impl.infer is None:
            raise KernelError(f"{where}: its shape function is Python code packed in the file, which runs "
                              f"only when the file is trusted: load it with trust_kernels=True (or state "
                              f"the shapes with omrt.OutputRule, which needs no trust)")
        else:
            try:
                got = impl.infer(list(inputs), attrs)
            except OmrtError:
                raise
            except Exception as e:
                raise ShapeError(f"{where}: its infer function failed: {type(e).__name__}: {e}") from e
            outs = _infos(got, where)
        if len(outs) != ctx.n_outputs:
            raise ShapeError(f"{where}: its infer function gives {len(outs)} outputs, the node has "
                             f"{ctx.n_outputs}")
        return outs

    def workspace(self) -> int:
        size = self.impl.workspace
        if isinstance(size, str):
            size = evaluate(size, self.inputs, self.attrs, self.where)
            if not isinstance(size, int) or size < 0:
                raise ShapeError(f"{self.where}: its workspace {self.impl.workspace!r} is {size!r}, not a "
                                 f"number of bytes for these input shapes")
        return size

    def run(self, inputs: Sequence[np.ndarray | None], outputs: Sequence[np.ndarray],
            workspace: np.ndarray | None) -> None:
        if self.impl.run is None:
            raise KernelError(f"{self.where} cannot run: {self.impl.unavailable}")
        if self.impl.debug:
            self._checked(inputs, outputs, workspace)
        else:
            self._call(inputs, outputs, workspace)

    def _call(self, inputs: Sequence[np.ndarray | None], outputs: Sequence[np.ndarray],
              workspace: np.ndarray | None) -> None:
        if self.impl.language == NATIVE:
            self.impl.run(inputs, outputs, workspace, self._json, self.where)
            return
        given = list(outputs)
        result = self.impl.run([None if a is None else _read_only(a) for a in inputs], given, workspace,
                               self.attrs)
        if result is not None:
            raise KernelError(f"{self.where}: its kernel returned a value; a kernel writes into the outputs it "
                              f"is handed (outputs[0][...] = result) and returns None")
        if len(given) != len(outputs):
            raise KernelError(f"{self.where}: its kernel changed the list of outputs ({len(outputs)} given, "
                              f"{len(given)} left); write into each with outputs[i][...] = result")
        for i, (a, b) in enumerate(zip(given, outputs)):
            if a is not b:
                raise KernelError(f"{self.where}: its kernel replaced outputs[{i}] instead of writing into it; "
                                  f"write with outputs[{i}][...] = result")

    def _checked(self, inputs: Sequence[np.ndarray | None], outputs: Sequence[np.ndarray],
                 workspace: np.ndarray | None) -> None:
        """Run into canary-guarded copies of the outputs and workspace, twice with two fills if
        need be: a write past an output, or an element never written, means the kernel and its
        infer function disagree, and is an error naming the operator."""
        missed: list[np.ndarray] | None = None
        for fill in FILLS:
            guarded = [_guarded(o.shape, o.dtype, fill) for o in outputs]
            scratch = None if workspace is None else _guarded((workspace.nbytes,), np.dtype(np.uint8), fill)
            try:
                self._call(inputs, [view for _, view in guarded], None if scratch is None else scratch[1])
            except ValueError as e:
                raise KernelError(f"{self.where}: in a checked run its kernel wrote a value that does not fit "
                                  f"its outputs {_described(outputs)} (as its infer function gives them): {e}; "
                                  f"make infer and the kernel agree") from e
            for i, (raw, _) in enumerate(guarded):
                _check_guard(raw, fill, f"output {i} ({_described([outputs[i]])}, as its infer function gives "
                                        f"it); make infer and the kernel agree", self.where)
            if scratch is not None:
                _check_guard(scratch[0], fill, f"its workspace of {workspace.nbytes} bytes; declare the "
                                               f"workspace it needs", self.where)
            now = [_unwritten(view, fill) for _, view in guarded]
            missed = now if missed is None else [a & b for a, b in zip(missed, now)]
            if not any(m.any() for m in missed):
                break
        for i, m in enumerate(missed):
            if m.any():
                raise KernelError(f"{self.where}: its kernel left {int(m.sum())} of {m.size} elements of output "
                                  f"{i} unwritten ({_described([outputs[i]])}, as its infer function gives it); "
                                  f"make infer and the kernel agree")
        for out, (_, view) in zip(outputs, guarded):
            out[...] = view


def kernel_class(impl: CustomImpl) -> type[Kernel]:
    """A kernel class of its own for one operator of one model."""
    return type(f"Custom{impl.op_type}", (CustomKernel,),
                {"impl": impl, "op_type": impl.op_type, "domain": impl.domain, "__module__": __name__})


def _where(impl: CustomImpl, ctx: OpContext) -> str:
    return f"custom operator {impl.qualified} (node {ctx.name!r})"


def _attributes(impl: CustomImpl, ctx: OpContext) -> dict[str, Any]:
    """The operator's defaults overridden by the node's attributes (omrt's own, `_`-prefixed, left out)."""
    return {**impl.attrs, **{k: v for k, v in ctx.attrs.items() if not k.startswith("_")}}


def _attrs_json(attrs: Mapping[str, Any]) -> str:
    """Attributes as the JSON text a C kernel reads: arrays become nested lists."""
    def plain(v: Any) -> Any:
        if isinstance(v, (np.ndarray, np.generic)):
            return v.tolist()
        raise KernelError(f"attribute value {v!r} cannot be handed to a C kernel as JSON")

    return json.dumps(attrs, sort_keys=True, separators=(",", ":"), default=plain)


def _infos(got: Any, where: str) -> list[TensorInfo]:
    """An infer function's result as infos: each a TensorInfo or a (dtype, shape) pair."""
    infos = []
    try:
        for item in got:
            if isinstance(item, TensorInfo):
                infos.append(TensorInfo(item.dtype, item.shape))
                continue
            dtype, shape = item
            dims = tuple(d if isinstance(d, str) else int(d) for d in shape)
            if any(isinstance(d, int) and d < 0 for d in dims):
                raise ValueError(f"negative dim in {dims}")
            infos.append(TensorInfo(np.dtype(dtype), dims))
    except (TypeError, ValueError) as e:
        raise ShapeError(f"{where}: its infer function returned {got!r}; return a list of (dtype, shape) "
                         f"pairs, one per output ({e})") from None
    return infos


def _read_only(a: np.ndarray) -> np.ndarray:
    view = a.view()
    view.flags.writeable = False
    return view


def _guarded(shape: Shape, dtype: np.dtype, fill: int) -> tuple[np.ndarray, np.ndarray]:
    """A buffer filled with `fill`, and a view of `shape` inside it between two canaries."""
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    raw = np.full(nbytes + 2 * GUARD, fill, np.uint8)
    return raw, raw[GUARD:GUARD + nbytes].view(dtype).reshape(shape)


def _check_guard(raw: np.ndarray, fill: int, what: str, where: str) -> None:
    if not ((raw[:GUARD] == fill).all() and (raw[-GUARD:] == fill).all()):
        side = "before the start of" if not (raw[:GUARD] == fill).all() else "past the end of"
        raise KernelError(f"{where}: its kernel wrote {side} {what}")


def _unwritten(view: np.ndarray, fill: int) -> np.ndarray:
    """Per element: True where every byte still holds `fill`."""
    raw = view.reshape(-1).view(np.uint8).reshape(view.size, view.dtype.itemsize)
    return (raw == fill).all(axis=1)


def _described(arrays: Sequence[np.ndarray]) -> str:
    return ", ".join(f"{a.dtype} {tuple(a.shape)}" for a in arrays)
