"""`omrt.CustomOp`: an operator omrt's library lacks, defined by its user and packed into the model.

A definition names the operator (`domain`, `op_type`), its shape and type function (`infer`: a
Python function, or declarative `omrt.OutputRule`s) and one kernel: a Python function
(`python=`), C source that `omrt compile` builds (`c_source=`), or a shared library built
elsewhere against `omrt_custom.h` (`shared_library=`). `omrt.compile(..., custom_ops=[...])`
packs the ones the model uses; `omrt compile --custom-op FILE` reads them from the list `OPS` of a
Python file (`ops_from_file`). docs/custom_ops.md has the contract and examples.
"""

from __future__ import annotations

import inspect
import os
import re
import runpy
import textwrap
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from .errors import CompileError
from .kernels.custom import OutputRule

RESERVED_DOMAINS = ("", "ai.onnx", "ai.onnx.ml", "omrt")
"""Domains a custom operator may not use: ONNX's (the compiler's rewrites and type checks rely on
their meaning) and omrt's own."""

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]*")


@dataclass
class CustomOp:
    """A custom operator: `(domain, op_type)`, its shape function, and exactly one kernel.

    - `infer`: `infer(inputs, attrs) -> [(dtype, shape), ...]`, one pair per output (inputs are
      `TensorInfo`s with `.dtype` and `.shape`; dims may be strings at compile time); or one
      `OutputRule` per output, which needs no code at load (works in untrusted files).
    - `python`: `run(inputs, outputs, workspace, attrs)` writing into the numpy arrays `outputs`
      and returning None; a function (its source is packed: it may use `np`, `math` and what it
      imports itself, not variables around it) or module source text with `symbol=` naming it.
    - `c_source`: C text against omrt_custom.h, built by the compiler; `symbol=` names the entry.
    - `shared_library`: a path to (or the bytes of) a shared library with that entry point.
    - `workspace`: scratch bytes the kernel gets: a number, or an expression of the input shapes
      (`"4 * size(in0)"`, same language as `OutputRule` dims).
    - `attrs`: default attributes and state (numbers, strings, lists, numpy arrays); a node's
      own attributes win. They travel in the file with the operator.
    - `since`: the first opset of `domain` the operator exists in; `version`: a label shown by
      `omrt inspect` and `Model.custom_ops`.
    """

    domain: str
    op_type: str
    infer: Callable[..., Any] | OutputRule | Sequence[OutputRule]
    python: Callable[..., Any] | str | None = None
    c_source: str | None = None
    shared_library: str | os.PathLike | bytes | None = None
    symbol: str | None = None
    workspace: int | str = 0
    attrs: Mapping[str, Any] = field(default_factory=dict)
    since: int = 1
    version: str = ""

    def __post_init__(self) -> None:
        where = f"CustomOp {self.domain}::{self.op_type}"
        if not isinstance(self.domain, str) or self.domain in RESERVED_DOMAINS or not _NAME.fullmatch(self.domain):
            raise CompileError(f"{where}: give it a domain of its own, such as 'com.example' (not one of "
                               f"{list(RESERVED_DOMAINS)})")
        if not isinstance(self.op_type, str) or not _NAME.fullmatch(self.op_type):
            raise CompileError(f"{where}: op_type must be a name such as 'FastGelu'")
        kernels = [k for k in ("python", "c_source", "shared_library") if getattr(self, k) is not None]
        if len(kernels) != 1:
            raise CompileError(f"{where}: give exactly one kernel, python=, c_source= or shared_library= (got "
                               f"{', '.join(kernels) or 'none'})")
        if self.symbol is None and (self.python is None or isinstance(self.python, str)):
            raise CompileError(f"{where}: name the kernel's function with symbol=")
        if isinstance(self.infer, OutputRule):
            self.infer = [self.infer]
        if not callable(self.infer) and not (isinstance(self.infer, (list, tuple)) and self.infer
                                             and all(isinstance(r, OutputRule) for r in self.infer)):
            raise CompileError(f"{where}: infer must be a function or omrt.OutputRule(s), one per output")
        if not ((type(self.workspace) is int and self.workspace >= 0) or isinstance(self.workspace, str)):
            raise CompileError(f"{where}: workspace must be a number of bytes or an expression of the input shapes")
        if type(self.since) is not int or self.since < 1:
            raise CompileError(f"{where}: since must be an opset number >= 1")
        self.attrs = dict(self.attrs)

    @property
    def key(self) -> tuple[str, str]:
        return self.domain, self.op_type

    @property
    def qualified(self) -> str:
        return f"{self.domain}::{self.op_type}"

    @property
    def language(self) -> str:
        return "python" if self.python is not None else "native"

    def kernel_source(self) -> tuple[str, str]:
        """(source text, function name) of a Python kernel, as packed."""
        if isinstance(self.python, str):
            return self.python, self.symbol
        source = function_source(self.python, f"CustomOp {self.qualified}: its kernel")
        return source, self.symbol or self.python.__name__

    def packed_infer(self) -> dict:
        """The shape function as the CUSTOM_OPS partition stores it."""
        if callable(self.infer):
            return {"python": function_source(self.infer, f"CustomOp {self.qualified}: its infer function"),
                    "symbol": self.infer.__name__}
        return {"rules": [r.to_json() for r in self.infer]}


def function_source(function: Callable[..., Any], what: str) -> str:
    """The source text of a function defined with `def`, to be packed and run on its own."""
    if not inspect.isfunction(function) or function.__name__ == "<lambda>":
        raise CompileError(f"{what} must be a function defined with def (its source is packed), not "
                           f"{function!r}")
    if function.__code__.co_freevars:
        raise CompileError(f"{what} {function.__name__} uses variables of the function around it "
                           f"({', '.join(function.__code__.co_freevars)}); packed source runs on its own: "
                           f"pass values as attrs= instead")
    try:
        return textwrap.dedent(inspect.getsource(function))
    except (OSError, TypeError) as e:
        raise CompileError(f"{what} {function.__name__}: its source cannot be read ({e}); pass the source "
                           f"text with symbol=") from None


def ops_from_file(path: str | os.PathLike) -> list[CustomOp]:
    """The custom operators a Python file defines in its list `OPS` (`omrt compile --custom-op FILE`).

    The file is run as a script (it is the compiling user's own code): it may import omrt and
    numpy, read C sources next to it, and define its functions at top level."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise CompileError(f"--custom-op {path}: no such file")
    try:
        namespace = runpy.run_path(path, run_name="omrt_custom_ops")
    except CompileError:
        raise
    except Exception as e:
        raise CompileError(f"--custom-op {path}: running it failed: {type(e).__name__}: {e}") from e
    ops = namespace.get("OPS")
    if not isinstance(ops, (list, tuple)) or not all(isinstance(op, CustomOp) for op in ops):
        raise CompileError(f"--custom-op {path}: define OPS = [omrt.CustomOp(...), ...] at its top level")
    return list(ops)
