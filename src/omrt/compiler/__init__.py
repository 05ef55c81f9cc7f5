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
from ..kernels import lookup
from ..native.library import kernel_abi
from ..native import build
from ..plan import Program, lower, propagate, specialize
from .autofuse import Fused, autofuse as fuse_chains
from .importer import import_model, load_model
from .passes import optimize, use_winograd
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
        units.update(lookup(node.op_type, graph.opset(node.domain), node.domain, node.label).native_units)
    return sorted(units)


def _native_records(graph: Graph, say: Callable[[str], None], autofuse: bool) -> tuple[list[Packed], list[Fused]]:
    """The native library record for `graph` and, with `autofuse`, its fused kernels' record, after
    the rewrites that pay only with them (when a C compiler is there to build them)."""
    records, fused = [], []
    if build.compiler() is not None:
        use_winograd(graph)
        if autofuse:
            record, fused = fuse_chains(graph, say)
            records += [record] if record is not None else []
    library = build.build(native_units(graph), say)
    return ([library] if library is not None else []) + records, fused


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
                  shapes_for: Sequence[Mapping[str, Sequence[int]]] = (), autofuse: bool = True) -> CompileResult:
    """Compile `model` into `output`; on any failure nothing is written.

    `native` packs the C kernels the model's ops can use (built with the host's C compiler; see
    `omrt.native`); without them, or without a compiler, the model runs on numpy kernels.
    `autofuse` (with `native`) also fuses chains of elementwise ops, and elementwise ops with
    reductions over trailing axes, into generated C kernels (omrt.compiler.autofuse).
    `shapes_for` lists input signatures of a model with symbolic dims to plan now, into the
    PLANS partition: loading the model then plans nothing at run time for them.
    """
    t0 = time.perf_counter()
    say = progress or (lambda msg: None)
    say("reading the ONNX model")
    proto = load_model(model)
    say("importing")
    graph = import_model(proto, shapes)
    say("inferring shapes and folding constants")
    propagate(graph, fold=True)
    check_types(graph)
    say("fusing")
    optimize(graph)
    records, fused = _native_records(graph, say, autofuse) if native else ([], [])
    program = None
    if all(graph.infos[v].static for v in graph.inputs if graph.infos[v].is_tensor):
        say("planning memory")
        program = lower(graph)
    stored = [_plan_for(graph, signature, say) for signature in shapes_for]
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
    ], flags=kinds_flag(records), progress=say)
    return CompileResult(os.fspath(output), size, weights_bytes, program, graph, time.perf_counter() - t0, stored,
                         fused)
