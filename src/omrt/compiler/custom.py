"""Packing custom operators: those a model uses become KERNELS records and CUSTOM_OPS entries.

On demand: an operator given but not used by the model is not packed. The compiler infers and
plans with the packed form of each operator (its infer function run again from the source that
is stored), so what is checked at compile time is what the file ships. C sources are built here,
with the host's compiler; a source that does not build, or a library without its entry point,
is a CompileError before anything is written.
"""

from __future__ import annotations

import hashlib
import os
import platform
import warnings
from typing import Callable, Sequence

from ..custom import CustomOp
from ..errors import CompileError, KernelError
from ..format.customops import OpEntry, encode
from ..format.kernelstore import NATIVE_OP, PYTHON_OP, Packed
from ..ir import Graph, all_graphs
from ..kernels.base import Kernel
from ..kernels.custom import CustomImpl, kernel_class, python_function, shape_function
from ..native import custom as native_custom

Ops = dict[tuple[str, str], CustomOp]


def by_name(ops: Sequence[CustomOp]) -> Ops:
    """The operators by (domain, op_type); CompileError when one is given twice."""
    found: Ops = {}
    for op in ops:
        if not isinstance(op, CustomOp):
            raise CompileError(f"custom_ops holds {op!r}; give omrt.CustomOp definitions")
        if op.key in found:
            raise CompileError(f"custom operator {op.qualified} is given twice; give one definition")
        found[op.key] = op
    return found


def compile_time_kernels(ops: Ops) -> dict[tuple[str, str], type[Kernel]]:
    """Kernel classes the compiler infers and plans with: the packed shape functions, and no run
    function (custom kernels are never folded: they run where the model is loaded)."""
    kernels = {}
    for key, op in ops.items():
        try:
            infer, rules = shape_function(op.packed_infer(), True, f"custom operator {op.qualified}")
        except KernelError as e:
            raise CompileError(str(e)) from e
        impl = CustomImpl(op.domain, op.op_type, op.language, op.version, infer, rules,
                          unavailable="it runs where the model is loaded, not at compile time",
                          workspace=op.workspace, attrs=dict(op.attrs))
        kernels[key] = kernel_class(impl)
    return kernels


def used(graph: Graph, ops: Ops) -> list[CustomOp]:
    """The operators the graph (or a sub-graph of it) has a node of, in the order they were given;
    CompileError when a node sets an attribute its operator does not declare (`CustomOp.attrs`)."""
    keys = set()
    for node in (n for g in all_graphs(graph) for n in g.nodes if (n.domain, n.op_type) in ops):
        op = ops[node.domain, node.op_type]
        unknown = sorted(k for k in node.attrs if not k.startswith("_") and k not in op.attrs)
        if unknown:
            raise CompileError(f"node {node.label!r} sets attribute {unknown[0]!r}, which custom operator "
                               f"{op.qualified} does not declare (it declares {sorted(op.attrs) or 'none'}): "
                               f"add it to attrs= with its default")
        keys.add(op.key)
    return [op for key, op in ops.items() if key in keys]


def pack(graph: Graph, ops: Ops, say: Callable[[str], None], targets: Sequence[str] = ()
         ) -> tuple[list[Packed], bytes | None]:
    """(KERNELS records, CUSTOM_OPS partition) for the operators the graph uses; (no records,
    None) when it uses none. `targets` are the triples of the compilers `cc=` named."""
    chosen = used(graph, ops)
    for op in chosen:
        if graph.opset(op.domain) < op.since:
            raise CompileError(f"custom operator {op.qualified} exists from opset {op.since} of {op.domain!r}; "
                               f"the model imports opset {graph.opset(op.domain)}")
    if not chosen:
        return [], None
    say(f"packing custom operators {', '.join(op.qualified for op in chosen)}")
    records: dict[str, Packed] = {}
    entries = [_entry(op, _record(op, records)) for op in chosen]
    for record in records.values():
        if record.kind == NATIVE_OP:
            symbols = [op.symbol for op, e in zip(chosen, entries) if e.record == record.name]
            record.target = native_custom.library_target(record.data, symbols, record.target["compiler"],
                                                         f"custom operator library {record.name}")
            _warn_other_targets(record, targets)
    return list(records.values()), encode(entries)


def _warn_other_targets(record: Packed, targets: Sequence[str]) -> None:
    """A custom library is built for this host only (one record per operator): say so when the
    compilers `cc=` named build for other machines too."""
    here = record.target.get("machine")
    others = sorted({t for t in targets if t and not t.startswith(f"{here}-")})
    if others:
        warnings.warn(f"omrt compile: custom operator library {record.name} is built for this host ({here}) only; "
                      f"on {', '.join(others)} the model's custom operators will not run (pack a library built "
                      f"there with shared_library=, compiled for that target)", RuntimeWarning, stacklevel=4)


def _record(op: CustomOp, records: dict[str, Packed]) -> Packed:
    """The record implementing `op`, added to `records`; identical libraries share one record."""
    if op.python is not None:
        source, symbol = op.kernel_source()
        try:
            python_function(source, symbol, f"custom operator {op.qualified}: its kernel")
        except KernelError as e:
            raise CompileError(str(e)) from e
        record = Packed(PYTHON_OP, op.qualified, op.domain, {"python": platform.python_version()}, source.encode())
    else:
        data, compiler = _library(op)
        name = f"custom-{hashlib.sha256(data).hexdigest()[:16]}"
        record = records.get(name) or Packed(NATIVE_OP, name, op.domain, {"compiler": compiler}, data)
    records[record.name] = record
    return record


def _library(op: CustomOp) -> tuple[bytes, str]:
    """(the shared library's bytes, what built it) for a C kernel."""
    where = f"custom operator {op.qualified}"
    if op.c_source is not None:
        return native_custom.compile_source(op.c_source, where)
    if isinstance(op.shared_library, (bytes, bytearray)):
        return bytes(op.shared_library), "prebuilt"
    try:
        with open(op.shared_library, "rb") as f:
            return f.read(), "prebuilt"
    except OSError as e:
        raise CompileError(f"{where}: cannot read its shared library {os.fspath(op.shared_library)!r}: "
                           f"{e.strerror}") from None


def _entry(op: CustomOp, record: Packed) -> OpEntry:
    symbol = op.kernel_source()[1] if op.python is not None else op.symbol
    return OpEntry(op.domain, op.op_type, record.kind, record.name, hashlib.sha256(record.data).hexdigest(),
                   symbol, op.packed_infer(), op.since, op.version, op.workspace, dict(op.attrs))
