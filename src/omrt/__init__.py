"""omrt: compile ONNX models ahead of time into self-contained `.om` files; run them zero-copy.

`omrt.load` and everything it reaches import only numpy and the standard library;
`omrt.compile` additionally needs the `onnx` package.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from .errors import (AllocationError, BindError, BusyError, CompileError, FormatError, InputError, KernelError,
                     OmrtError, ServingError, ShapeError, SignatureError, UnsupportedOpError)
from .custom import CustomOp
from .kernels.custom import OutputRule
from .kernels.parallel import get_num_threads, set_num_threads
from .memory import Memory
from .runtime import (IOPool, IOSet, IOSpec, Model, OpThreads, Session, Stats, ThreadProfile, WeightSlots, arena_size,
                      load, run_op)
from .serving import Client
from .version import __version__

if TYPE_CHECKING:
    from .compiler import CompileResult
    from .repacking import RepackResult


def compile(model: Any, output: str | os.PathLike, shapes: Mapping[str, Sequence[int]] | None = None,
            progress: Any = None, native: bool = True,
            shapes_for: Sequence[Mapping[str, Sequence[int]]] = (),
            custom_ops: Sequence[CustomOp] = (), cc: str | Sequence[str] | None = None,
            autofuse: bool = True) -> "CompileResult":
    """Compile an ONNX model (path, bytes or ModelProto) into the `.om` file `output`; `native`
    packs the C kernels its ops can use (see `omrt.load(..., trust_kernels=True)`), built with
    the host's C compiler or with each compiler `cc` names (one library per target, e.g.
    `cc=["gcc", "aarch64-linux-gnu-gcc"]`); `shapes_for` lists input signatures of a symbolic
    model to plan now rather than at run time; `custom_ops` defines operators omrt lacks
    (`omrt.CustomOp`), and those the model uses travel in the file; `autofuse` (on by default,
    when `native` and a C compiler are there) fuses elementwise chains into generated C kernels
    that run where the native kernels do, with their unfused nodes kept in the file for every
    other case."""
    from .compiler import compile_model

    return compile_model(model, output, shapes=shapes, progress=progress, native=native, shapes_for=shapes_for,
                         custom_ops=custom_ops, cc=cc, autofuse=autofuse)


def repack(src: str | os.PathLike, dst: str | os.PathLike, add: Sequence[Any] = (), remove: Sequence[str] = (),
           replace: Mapping[str, Any] | None = None) -> "RepackResult":
    """Rewrite the `.om` file `src` as `dst` (which may be `src`) with packed libraries added (the
    records of a `.om` or kernel store file, or `Packed` records), replaced (`{"NAME[@TARGET]":
    source}`) or removed (`"NAME[@TARGET]"`), without recompiling; see `omrt.repacking`."""
    from .repacking import repack as rewrite

    return rewrite(src, dst, add=add, remove=remove, replace=replace)


__all__ = ["AllocationError", "BindError", "BusyError", "Client", "CompileError", "CustomOp", "FormatError", "IOSpec",
           "InputError", "KernelError", "IOPool", "IOSet", "Memory", "Model", "OmrtError", "OpThreads", "OutputRule",
           "ServingError", "Session", "ShapeError", "SignatureError", "Stats", "ThreadProfile", "UnsupportedOpError",
           "WeightSlots", "arena_size", "compile", "get_num_threads", "load", "repack", "run_op", "set_num_threads"]
