"""MODEL_DEF and PLANS encoding: graph, tensor specs, weight table and programs as JSON.

Decoding is defensive: any structural problem raises FormatError naming the field.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import numpy as np

from .errors import FormatError
from .ir import Graph, Node, TensorInfo, dtype_from_name, dtype_name
from .lower import Placement, Program, Task
from .planner import Block, align


def _enc_attr(v: Any) -> Any:
    if isinstance(v, np.ndarray):
        if v.dtype == object:
            return {"@array": ["object", list(v.shape), [str(x) for x in v.ravel()]]}
        data = base64.b64encode(np.ascontiguousarray(v).tobytes()).decode()
        return {"@array": [dtype_name(v.dtype), list(v.shape), data]}
    if isinstance(v, (list, tuple)):
        return [_enc_attr(x) for x in v]
    if isinstance(v, np.generic):
        return v.item()
    return v


def _dec_attr(v: Any) -> Any:
    if isinstance(v, dict) and "@array" in v:
        dt, shape, data = v["@array"]
        if dt == "object":
            return np.array(data, dtype=object).reshape(shape)
        return np.frombuffer(base64.b64decode(data), dtype_from_name(dt)).reshape(shape).copy()
    if isinstance(v, list):
        return [_dec_attr(x) for x in v]
    return v


def weight_layout(constants: dict[str, np.ndarray]) -> dict[str, tuple[int, int]]:
    """name -> (offset, nbytes) inside WEIGHTS, every tensor 64-byte aligned (object arrays excluded)."""
    layout, cursor = {}, 0
    for name, arr in constants.items():
        if arr.dtype == object:
            continue
        layout[name] = (cursor, arr.nbytes)
        cursor = align(cursor + arr.nbytes)
    return layout


def encode_program(p: Program) -> dict:
    return {
        "signature": {k: list(v) for k, v in p.signature.items()},
        "shapes": {k: list(v) for k, v in p.shapes.items()},
        "tasks": [[t.node, t.inputs, t.outputs, t.ws_offset, t.ws_size] for t in p.tasks],
        "places": {k: [pl.region, pl.offset, pl.key] for k, pl in p.places.items()},
        "blocks": [[b.label, b.size, b.first, b.last, b.offset] for b in p.blocks],
        "arena_size": p.arena_size, "lower_bound": p.lower_bound, "naive_size": p.naive_size,
        "io_size": p.io_size, "io_offsets": p.io_offsets, "copy_only": p.copy_only,
    }


def decode_program(d: dict) -> Program:
    return Program(
        signature={k: tuple(v) for k, v in d["signature"].items()},
        shapes={k: tuple(v) for k, v in d["shapes"].items()},
        tasks=[Task(int(n), list(i), list(o), int(wo), int(ws)) for n, i, o, wo, ws in d["tasks"]],
        places={k: Placement(r, int(o), str(key)) for k, (r, o, key) in d["places"].items()},
        blocks=[Block(str(l), int(s), int(f), int(la), int(o)) for l, s, f, la, o in d["blocks"]],
        arena_size=int(d["arena_size"]), lower_bound=int(d["lower_bound"]),
        naive_size=int(d["naive_size"]), io_size=int(d["io_size"]),
        io_offsets={k: int(v) for k, v in d["io_offsets"].items()},
        copy_only=dict(d["copy_only"]))


def encode(graph: Graph, layout: dict[str, tuple[int, int]], program: Program | None,
           metadata: dict[str, str]) -> bytes:
    """The MODEL_DEF partition."""
    def spec(v: str) -> dict:
        i = graph.infos[v]
        return {"name": v, "dtype": dtype_name(i.dtype), "shape": list(i.shape)}

    doc = {
        "name": graph.name,
        "opsets": graph.opsets,
        "inputs": [spec(v) for v in graph.inputs],
        "outputs": [spec(v) for v in graph.outputs],
        "values": {k: [dtype_name(i.dtype), list(i.shape)] for k, i in graph.infos.items()
                   if k not in graph.constants},
        "constants": {k: [dtype_name(a.dtype), list(a.shape), *layout[k]] if k in layout
                      else [None, list(a.shape), [str(x) for x in a.ravel()]]
                      for k, a in graph.constants.items()},
        "nodes": [[n.op_type, n.domain, n.name, n.inputs, n.outputs,
                   {k: _enc_attr(v) for k, v in n.attrs.items()}] for n in graph.nodes],
        "program": encode_program(program) if program else None,
        "metadata": metadata,
    }
    return json.dumps(doc, separators=(",", ":")).encode()


def decode(raw: memoryview | bytes, weights: memoryview | None, where: str
           ) -> tuple[Graph, Program | None, dict[str, str]]:
    """Graph (constants as read-only views into `weights`), default program and metadata."""
    try:
        doc = json.loads(bytes(raw))
        constants: dict[str, np.ndarray] = {}
        wsize = len(weights) if weights is not None else 0
        for name, (dt, shape, *rest) in doc["constants"].items():
            if dt is None:
                constants[name] = np.array(rest[0], dtype=object).reshape(shape)
                continue
            dtype, (off, nbytes) = dtype_from_name(dt), rest
            count = int(np.prod(shape, dtype=np.int64))
            if off < 0 or nbytes != count * dtype.itemsize or off + nbytes > wsize:
                raise FormatError(f"{where}: weight {name!r} ({nbytes} bytes at {off}) does not fit the "
                                  f"WEIGHTS partition of {wsize} bytes; the file is corrupted")
            constants[name] = np.frombuffer(weights, dtype, count, off).reshape(shape)
        infos = {k: TensorInfo(dtype_from_name(dt), tuple(s)) for k, (dt, s) in doc["values"].items()}
        nodes = [Node(op, list(i), list(o), {k: _dec_attr(v) for k, v in attrs.items()}, dom, name)
                 for op, dom, name, i, o, attrs in doc["nodes"]]
        graph = Graph(nodes, [s["name"] for s in doc["inputs"]], [s["name"] for s in doc["outputs"]],
                      infos, constants, {k: int(v) for k, v in doc["opsets"].items()}, doc["name"])
        for c, a in constants.items():
            graph.infos[c] = TensorInfo.of(a)
        program = decode_program(doc["program"]) if doc["program"] else None
        return graph, program, dict(doc.get("metadata", {}))
    except FormatError:
        raise
    except (ValueError, KeyError, TypeError, IndexError) as e:
        raise FormatError(f"{where}: MODEL_DEF is malformed ({type(e).__name__}: {e}); the file is "
                          f"corrupted or was written by an incompatible omrt") from e
