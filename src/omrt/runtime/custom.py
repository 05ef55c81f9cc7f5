"""A model's own operators: its CUSTOM_OPS partition and KERNELS records made into kernel classes
that only this model sees.

Each entry becomes a kernel class (`omrt.kernels.custom.kernel_class`) in the model's
`Graph.custom`, looked up before omrt's library and never registered process-wide: two models
carrying different versions of one operator each run their own. Code runs only when the caller
trusts the file (the one trust decision `Model` makes): Python source is executed, and a C library
loaded from memory (once per process for the same bytes), only then. Otherwise the model still
loads; declarative output rules still plan it; running the operator raises a KernelError that
names it and the fix.
"""

from __future__ import annotations

import hashlib
import os
import warnings
from dataclasses import dataclass
from typing import Callable, Iterator

from ..errors import FormatError, OmrtError
from ..format.customops import OpEntry
from ..format.kernelstore import NATIVE_OP, PYTHON_OP, Packed
from ..ir import Graph, all_graphs
from ..kernels.base import Kernel
from ..kernels.custom import NATIVE, PYTHON, CustomImpl, kernel_class, python_function, shape_function
from ..native import custom as native_custom
from ..native.loader import open_library

DEBUG_ENV = "OMRT_CHECK_CUSTOM_OPS"
"""Set to 1 to check every custom kernel's writes in every model loaded (`CustomOps.debug`)."""

_LANGUAGE = {PYTHON_OP: PYTHON, NATIVE_OP: NATIVE}


@dataclass
class PackedOp:
    """One custom operator of a model, and whether it can run here."""

    entry: OpEntry
    impl: CustomImpl
    kernel: type[Kernel]

    @property
    def status(self) -> str:
        return "ready" if self.impl.run is not None else f"cannot run: {self.impl.unavailable}"

    def __str__(self) -> str:
        version = f" {self.entry.version}" if self.entry.version else ""
        rules = "output rules" if self.impl.rules is not None else "Python infer"
        return f"{self.entry.qualified}{version} ({self.impl.language} kernel, {rules}): {self.status}"


class CustomOps:
    """The custom operators a model carries (`Model.custom_ops`): iterate it for each one's status.

    `debug = True` (or OMRT_CHECK_CUSTOM_OPS=1 at load) checks every run of their kernels: each
    writes into canary-guarded copies of its outputs and workspace, and an element left unwritten
    or a byte written past them raises a KernelError naming the operator, because its kernel and
    its infer function disagree. It costs a copy per output and, when an output is partly left
    at its fill pattern, a second run."""

    def __init__(self, ops: list[PackedOp]) -> None:
        self.ops = ops
        self.debug = os.environ.get(DEBUG_ENV, "") not in ("", "0")

    @property
    def debug(self) -> bool:
        return self._debug

    @debug.setter
    def debug(self, on: bool) -> None:
        self._debug = bool(on)
        for op in self.ops:
            op.impl.debug = self._debug

    @property
    def kernels(self) -> dict[tuple[str, str], type[Kernel]]:
        """(domain, op_type) -> the kernel class this model runs the operator with."""
        return {(op.entry.domain, op.entry.op_type): op.kernel for op in self.ops}

    def __iter__(self) -> Iterator[PackedOp]:
        return iter(self.ops)

    def __len__(self) -> int:
        return len(self.ops)

    def __repr__(self) -> str:
        return f"<omrt.CustomOps {', '.join(str(op) for op in self.ops) or 'none'}>"


def load_custom_ops(entries: list[OpEntry], records: list[Packed], trusted: bool, where: str) -> CustomOps:
    """The model's operators from its CUSTOM_OPS entries and the records they name (whose status
    is set); code in them runs only when `trusted`."""
    by_name = {r.name: r for r in records if r.kind in _LANGUAGE}
    return CustomOps([_packed(entry, _record(entry, by_name, where), trusted, where) for entry in entries])


def _record(entry: OpEntry, by_name: dict[str, Packed], where: str) -> Packed:
    record = by_name.get(entry.record)
    if record is None or record.kind != entry.kind:
        raise FormatError(f"{where}: custom operator {entry.qualified} names the kernel record {entry.record!r} "
                          f"of kind {entry.kind}, which the KERNELS partition does not hold; the file is "
                          f"damaged: recompile the model")
    if hashlib.sha256(record.data).hexdigest() != entry.digest:
        raise FormatError(f"{where}: the kernel record {entry.record!r} does not match the digest custom operator "
                          f"{entry.qualified} names; the file is damaged: recompile the model")
    return record


def _packed(entry: OpEntry, record: Packed, trusted: bool, where: str) -> PackedOp:
    label = f"custom operator {entry.qualified} of {where}"
    try:
        infer, rules = shape_function(entry.infer, trusted, label)
    except (ValueError, TypeError) as e:
        raise FormatError(f"{where}: custom operator {entry.qualified} has a malformed shape function ({e}); "
                          f"recompile the model") from None
    impl = CustomImpl(entry.domain, entry.op_type, _LANGUAGE[entry.kind], entry.version, infer, rules,
                      workspace=entry.workspace, attrs=dict(entry.attributes))
    impl.run, impl.unavailable = _kernel(entry, record, trusted, label)
    record.status = "loaded" if impl.run is not None else f"not loaded: {impl.unavailable}"
    return PackedOp(entry, impl, kernel_class(impl))


def _kernel(entry: OpEntry, record: Packed, trusted: bool, label: str) -> tuple[Callable[..., None] | None, str]:
    """(the run function, "") or (None, why it cannot run and what to do)."""
    if not trusted:
        code = "Python source" if entry.kind == PYTHON_OP else "machine code"
        return None, (f"its kernel is {code} packed in the file, which is not trusted: load it with "
                      f"trust_kernels=True if you trust the file, or sign it and trust its key")
    if entry.kind == PYTHON_OP:
        return python_function(record.data.decode("utf-8", "replace"), entry.symbol, label), ""
    why = native_custom.mismatch(record)
    if why is None:
        try:
            return native_custom.Entry(open_library(record, entry.symbol), entry.symbol), ""
        except (OSError, AttributeError, OmrtError) as e:
            why = f"the dynamic loader refused its library: {e}"
    warnings.warn(f"omrt: {label} cannot run on this host ({why})", RuntimeWarning, stacklevel=5)
    return None, f"its C library does not load on this host ({why}); recompile the model here"


def use_custom_ops(graph: Graph, ops: CustomOps) -> None:
    """Make the model's graph and every sub-graph in it resolve its operators to `ops` first: one
    mapping, shared, that no other model sees."""
    kernels = ops.kernels
    for g in all_graphs(graph):
        g.custom = kernels
