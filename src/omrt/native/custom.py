"""Custom operators' C kernels: the ABI of `csrc/omrt_custom.h`, building a source with the host's
compiler, finding an entry point in a shared library, and calling an entry point with every tensor checked first.

A library is a KERNELS record of kind 4. Its target states the custom ABI (`CUSTOM_ABI`), the
OS, machine and C library it was built for, and the entry points the model's operators call; at
load it is checked like omrt's own library (`target.host_mismatch`) and its entry points are
looked up in its ELF symbol table before it is ever loaded.
"""

from __future__ import annotations

import ctypes
import platform
from typing import Iterable, Sequence

import numpy as np

from ..errors import CompileError, KernelError
from ..format.kernelstore import NATIVE_OP, Packed
from . import build, elf
from .library import SOURCES
from .elf import exported_functions
from .target import host, host_mismatch

INCLUDE = SOURCES
"""The folder holding `omrt_custom.h`: `-I` it to build a custom operator's library yourself."""

CUSTOM_ABI = 1
"""OMRT_CUSTOM_ABI of csrc/omrt_custom.h: the layout of `omrt_tensor` and the entry point's
signature. A library written against another is never called."""

ERROR_BYTES = 1024
"""Bytes of the buffer a kernel writes its error message into."""


class Tensor(ctypes.Structure):
    """`omrt_tensor` of omrt_custom.h."""

    _fields_ = [("data", ctypes.c_void_p), ("dtype", ctypes.c_int32), ("rank", ctypes.c_int32),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("size", ctypes.c_int64), ("nbytes", ctypes.c_int64)]


PROTOTYPE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(Tensor), ctypes.c_int, ctypes.POINTER(Tensor),
                             ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_char_p,
                             ctypes.c_size_t)
"""`omrt_custom_fn`: inputs, n_inputs, outputs, n_outputs, workspace, workspace_bytes, attrs_json,
error, error_bytes; returns 0 on success. ctypes releases the GIL around the call."""

DTYPE_CODES = {np.dtype(t): code for t, code in (
    (np.float32, 1), (np.uint8, 2), (np.int8, 3), (np.uint16, 4), (np.int16, 5), (np.int32, 6), (np.int64, 7),
    (np.bool_, 9), (np.float16, 10), (np.float64, 11), (np.uint32, 12), (np.uint64, 13))}
"""numpy dtype -> the OMRT_* code (ONNX's TensorProto.DataType number) a C kernel sees."""


class Entry:
    """A custom operator's C entry point; each call checks every tensor before C sees it."""

    def __init__(self, library: ctypes.CDLL, symbol: str) -> None:
        self.symbol = symbol
        self._fn = PROTOTYPE((symbol, library))

    def __call__(self, inputs: Sequence[np.ndarray | None], outputs: Sequence[np.ndarray],
                 workspace: np.ndarray | None, attrs_json: bytes, where: str) -> None:
        """Run the kernel; `where` names the operator and node in every error."""
        keep: list = []
        ins = (Tensor * max(len(inputs), 1))(*(_tensor(a, f"input {i}", False, keep, where)
                                               for i, a in enumerate(inputs)))
        outs = (Tensor * max(len(outputs), 1))(*(_tensor(a, f"output {i}", True, keep, where)
                                                 for i, a in enumerate(outputs)))
        _check_overlap(inputs, outputs, workspace, where)
        ws, ws_bytes = _workspace(workspace, where)
        error = ctypes.create_string_buffer(ERROR_BYTES)
        code = self._fn(ins, len(inputs), outs, len(outputs), ws, ws_bytes, attrs_json, error, ERROR_BYTES)
        if code != 0:
            message = error.value.decode("utf-8", "replace") or "no message"
            raise KernelError(f"{where}: its C kernel {self.symbol} failed (returned {code}): {message}")


def _tensor(a: np.ndarray | None, what: str, write: bool, keep: list, where: str) -> Tensor:
    """The descriptor of one array, after checking what the C side relies on."""
    if a is None:
        if write:
            raise KernelError(f"{where}: {what} is missing; C kernels write every output")
        return Tensor(None, 0, 0, None, 0, 0)
    if not isinstance(a, np.ndarray):
        raise KernelError(f"{where}: {what} is a {type(a).__name__}, not an array; C kernels take tensors")
    code = DTYPE_CODES.get(a.dtype)
    if code is None:
        raise KernelError(f"{where}: {what} has dtype {a.dtype}, which omrt_custom.h has no code for; use a "
                          f"kernel written in Python for it")
    if not (a.flags.c_contiguous and a.flags.aligned) or (write and not a.flags.writeable):
        raise KernelError(f"{where}: {what} is not a{' writable,' if write else 'n'} aligned, C-contiguous array")
    shape = (ctypes.c_int64 * max(a.ndim, 1))(*a.shape)
    keep.append(shape)
    return Tensor(a.ctypes.data if a.size else None, code, a.ndim, shape, a.size, a.nbytes)


def _check_overlap(inputs: Sequence[np.ndarray | None], outputs: Sequence[np.ndarray],
                   workspace: np.ndarray | None, where: str) -> None:
    """No output may share bytes with another output, an input or the workspace: C writes them."""
    others = [a for a in inputs if a is not None] + ([workspace] if workspace is not None else [])
    for i, out in enumerate(outputs):
        for other in others + list(outputs[i + 1:]):
            if out.size and np.may_share_memory(out, other):
                raise KernelError(f"{where}: output {i} overlaps another tensor it is called with")


def _workspace(workspace: np.ndarray | None, where: str) -> tuple[int | None, int]:
    if workspace is None or not workspace.nbytes:
        return None, 0
    if workspace.dtype != np.uint8 or not workspace.flags.c_contiguous or not workspace.flags.writeable:
        raise KernelError(f"{where}: its workspace is not a writable, C-contiguous byte array")
    return workspace.ctypes.data, workspace.nbytes


def compile_source(source: str, where: str) -> tuple[bytes, str]:
    """(the shared library, the compiler's version) built from a custom operator's C source with
    the host's compiler and omrt's flags (`build.shared_library`); a CompileError carrying the
    compiler's message when it does not build. The same source builds once per process, and
    always to the same bytes."""
    cc = build.compiler()
    if cc is None:
        raise CompileError(f"{where} is C source and no C compiler is found: set CC or install cc, or pack a "
                           f"library built elsewhere (shared_library=)")

    def make() -> tuple[bytes, str]:
        data = build.shared_library(cc, [], f"the C source of {where}", "", True, texts={"op.c": source})
        return data, build.compiler_version(cc)
    return build.once(repr((cc, build.FLAGS, source)), make)


def library_target(data: bytes, symbols: Iterable[str], compiler: str, where: str) -> dict:
    """The KERNELS target of a custom operators' library for this host, after checking that it is
    an ELF shared library of this host's kind that exports every entry point (else CompileError)."""
    try:
        exported = exported_functions(data)
    except ValueError as e:
        raise CompileError(f"{where}: the library is not an ELF shared library omrt can read ({e})") from None
    missing = sorted(set(symbols) - exported)
    if missing:
        raise CompileError(f"{where}: the library has no entry point {missing[0]!r} (it exports "
                           f"{', '.join(sorted(exported)) or 'no function'}); export it with OMRT_EXPORT, or "
                           f"name the function it has with symbol=")
    target = dict(host())  # its libc_version: the newest glibc its symbols need, not the build host's
    ident = elf.identity(data)
    target.update(custom_abi=CUSTOM_ABI, symbols=sorted(set(symbols)), compiler=compiler,
                  python=platform.python_version(), elf_machine=ident[2] if ident else 0,
                  libc_version=elf.glibc_needed(data) if target.get("libc") == "glibc" else target.get("libc_version"))
    why = host_mismatch(Packed(NATIVE_OP, "", "", target, data))
    if why is not None:
        raise CompileError(f"{where}: the library does not load on this host ({why}); build it for this host")
    return target


def mismatch(record: Packed) -> str | None:
    """Why this host cannot run a custom operators' library record, or None when it can: its ABI,
    OS, machine and C library, and every entry point it declares, found in its symbol table
    before anything of it is loaded."""
    if record.target.get("custom_abi") != CUSTOM_ABI:
        return f"written against custom ABI {record.target.get('custom_abi')}, this omrt has {CUSTOM_ABI}"
    why = host_mismatch(record)
    if why is not None:
        return why
    try:
        exported = exported_functions(record.data)
    except ValueError as e:
        return f"not a readable ELF shared library ({e})"
    missing = sorted(set(record.target.get("symbols", [])) - exported)
    return f"it has no entry point {missing[0]!r}" if missing else None


