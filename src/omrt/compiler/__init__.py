"""The compiler: ONNX -> IR -> folded, fused graph -> memory plan -> `.om` file. Needs `onnx`."""

from __future__ import annotations

import json
import os
import platform
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import onnx

from ..errors import CompileError, ShapeError
from ..version import __version__
from ..format import Part, write
from ..format.kernelstore import Packed, kinds_flag, pack
from ..format.modeldef import encode, encode_program, weight_layout, weights
from ..ir import Graph
from ..kernels import kernel_of
from ..native.library import kernel_abi
from ..native import build, probe
from ..native.loader import dedupe_key
from ..native.target import label
from ..plan import Program, lower, propagate, specialize
from . import custom
from ..custom import CustomOp
from .autofuse import Fused, autofuse as fuse_chains
from .importer import import_model, load_model
from .passes import (fuse_attention, fuse_residual_adds, optimize, stack_sibling_products, use_packed_filters,
                     use_packed_products, use_packed_recurrences, use_winograd)
from .typecheck import check_types


@dataclass
class CompileResult:
    """What a compile produced: the file, its size, the plan figures, the time it took and the
    plans stored for the `shapes_for` signatures."""

    path: str
    file_size: int
    weights_bytes: int
    program: Program | None
    graph: Graph
    seconds: float
    stored: list[Program] = field(default_factory=list)
    libraries: list[Packed] = field(default_factory=list)
    """The native library records packed, one per compiler (each names its target), and the fused
    kernels' records, one per compiler, after them."""
    fused: list[Fused] = field(default_factory=list)
    """The chains fused into generated kernels (empty with autofuse=False or without a C compiler)."""


def _environment() -> dict[str, str]:
    return {"omrt": __version__, "kernel_abi": kernel_abi(), "python": platform.python_version(),
            "numpy": np.__version__, "onnx": onnx.__version__, "os": platform.system(),
            "machine": platform.machine(), "byteorder": "little"}


def _weights_writer(constants: dict, layout: dict) -> Callable:
    def produce(sink: Callable[[bytes | memoryview], None]) -> None:
        cursor = 0
        for name, (off, nbytes) in layout.items():
            if off > cursor:
                sink(b"\0" * (off - cursor))
            arr = np.ascontiguousarray(constants[name])
            if arr.dtype.byteorder == ">":
                arr = arr.astype(arr.dtype.newbyteorder("<"))
            sink(memoryview(arr.reshape(-1).view(np.uint8)))
            cursor = off + nbytes
    return produce


def native_units(graph: Graph) -> list[str]:
    """The C units the kernels of `graph`'s nodes can use, sorted."""
    units: set[str] = set()
    for node in graph.nodes:
        units.update(kernel_of(node, graph).native_units)
    return sorted(units)


def _native_libraries(graph: Graph, compilers: Sequence[str] | None, say: Callable[[str], None],
                      autofuse: bool) -> tuple[list[Packed], list[Fused]]:
    """The native library records for `graph`, one per compiler (None: the host's own, if there is
    one), after the rewrites that pay only with them; with `autofuse`, its fused kernels' records
    (one per compiler) first, and the chains fused."""
    records, fused = [], []
    if compilers is not None or build.compiler() is not None:
        fuse_attention(graph)
        use_winograd(graph)
        use_packed_filters(graph)
        fuse_residual_adds(graph)
        use_packed_products(graph)
        stack_sibling_products(graph)
        use_packed_recurrences(graph)
        if autofuse:
            records, fused = fuse_chains(graph, say, compilers)
    built = {cc: build.build(native_units(graph), say, cc) for cc in (compilers or [None])}
    _check_distinct(built)
    return [record for record in built.values() if record is not None] + records, fused


def _check_distinct(built: Mapping[str | None, Packed | None]) -> None:
    """Refuse two compilers that build the same library (one target, one CPU baseline): the
    loader would only ever use one of them."""
    seen: dict[tuple, str | None] = {}
    for cc, record in built.items():
        if record is None:
            continue
        first = seen.setdefault(dedupe_key(record), cc)
        if first != cc:
            raise CompileError(f"cc {first!r} and {cc!r} build the same library (omrt-native for {label(record)}, "
                               f"the same CPU features): name one of them")


def _compilers(cc: str | Sequence[str] | None, native: bool) -> list[str] | None:
    """The compilers `cc=` names, as a list (None when it names none)."""
    if cc is None:
        return None
    names = [cc] if isinstance(cc, str) else list(cc)
    if not native or not names or not all(isinstance(n, str) and n.strip() for n in names) or \
            len(set(names)) < len(names):
        raise CompileError(f"cc={cc!r}: name one or more distinct C compilers (e.g. 'gcc' or 'aarch64-linux-gnu-gcc') "
                           f"for the native kernels" + ("; native=False builds none" if not native else ""))
    return names


def _plan_for(graph: Graph, signature: Mapping[str, Sequence[int]], say: Callable[[str], None]) -> Program:
    """The program of one input signature, planned now for the PLANS partition."""
    free = {v for v in graph.inputs if graph.infos[v].is_tensor and not graph.infos[v].static}
    if set(signature) != free:
        raise CompileError(f"shapes_for {dict(signature)} must give a shape to exactly the inputs with symbolic "
                           f"dims: {sorted(free) or 'none (the model has one plan already)'}")
    for name, shape in signature.items():
        declared = graph.infos[name].shape
        if len(shape) != len(declared) or any(isinstance(d, int) and d != s for d, s in zip(declared, shape)):
            raise CompileError(f"shapes_for gives input {name!r} shape {tuple(shape)}; it is declared "
                               f"{tuple(declared)} (strings are free dims)")
    say(f"planning memory for {dict(signature)}")
    try:
        return lower(specialize(graph, signature))
    except ShapeError as e:
        raise CompileError(f"shapes_for {dict(signature)}: the model cannot run at these shapes: {e}") from e


def compile_model(model: Any, output: str | os.PathLike, shapes: Mapping[str, Sequence[int]] | None = None,
                  progress: Callable[[str], None] | None = None, native: bool = True,
                  shapes_for: Sequence[Mapping[str, Sequence[int]]] = (),
                  custom_ops: Sequence[CustomOp] = (), cc: str | Sequence[str] | None = None,
                  autofuse: bool = True) -> CompileResult:
    """Compile `model` into `output`; on any failure nothing is written.

    `native` packs the C kernels the model's ops can use (built with the host's C compiler; see
    `omrt.native`); without them, or without a compiler, the model runs on numpy kernels. `cc`
    names the compiler(s) to build them with instead, one library per compiler, each for that
    compiler's target (a cross compiler such as aarch64-linux-gnu-gcc builds for aarch64); a
    named compiler that is missing or fails is a CompileError. `autofuse` (with `native`) also
    fuses chains of elementwise ops, and elementwise ops with reductions over trailing axes, into
    generated C kernels (omrt.compiler.autofuse), built by the same compilers.
    `shapes_for` lists input signatures of a model with symbolic dims to plan now, into the
    PLANS partition: loading the model then plans nothing at run time for them. `custom_ops`
    defines operators omrt lacks (`omrt.CustomOp`); those the model uses are packed into the file.
    """
    t0 = time.perf_counter()
    compilers = _compilers(cc, native)
    say = progress or (lambda msg: None)
    ops = custom.by_name(custom_ops)
    say("reading the ONNX model")
    proto = load_model(model)
    say("importing")
    graph = import_model(proto, shapes, custom.compile_time_kernels(ops))
    say("inferring shapes and folding constants")
    propagate(graph, fold=True)
    check_types(graph)
    say("fusing")
    optimize(graph)
    libraries, fused = _native_libraries(graph, compilers, say, autofuse) if native else ([], [])
    program = None
    if all(graph.infos[v].static for v in graph.inputs if graph.infos[v].is_tensor):
        say("planning memory")
        program = lower(graph)
    stored = [_plan_for(graph, signature, say) for signature in shapes_for]
    custom_records, custom_part = custom.pack(graph, ops, say, [probe.triple(cc.split()) for cc in compilers or []])
    records = libraries + custom_records
    constants = weights(graph)
    layout = weight_layout(constants)
    weights_bytes = sum(n for _, n in layout.values())
    metadata = {"producer": f"{proto.producer_name} {proto.producer_version}".strip(),
                "doc": proto.doc_string, "graph": proto.graph.name}
    modeldef = encode(graph, layout, program, metadata)
    env = json.dumps(_environment()).encode()
    plans = json.dumps({"programs": [encode_program(p) for p in stored]}).encode()
    say(f"writing {weights_bytes / 1e6:.1f} MB of weights")
    size = write(output, [
        (Part.MODEL_DEF, lambda sink: sink(modeldef)),
        (Part.WEIGHTS, _weights_writer(constants, layout)),
        (Part.KERNELS, lambda sink: sink(pack(records))),
        (Part.PLANS, lambda sink: sink(plans)),
        (Part.ENV, lambda sink: sink(env)),
        *([(Part.CUSTOM_OPS, lambda sink: sink(custom_part))] if custom_part is not None else []),
    ], flags=kinds_flag(records), progress=say)
    return CompileResult(os.fspath(output), size, weights_bytes, program, graph, time.perf_counter() - t0, stored,
                         libraries, fused)
