"""MODEL_DEF and PLANS encoding: graph, tensor specs, weight table and programs as JSON.

Decoding is defensive: any structural problem raises FormatError naming the field.
"""

from __future__ import annotations

import base64
import json
from typing import Any, Iterator

import numpy as np

from ..errors import FormatError
from ..ir import TENSOR, Graph, Node, TensorInfo, dtype_from_name, dtype_name, subgraphs
from ..memory import align
from ..plan.arena import Block
from ..plan.program import Placement, Program, Task


WeightKey = str | tuple
"""A constant's key in the weight layout: its name in the main graph, or for a sub-graph's
constant the path (node index, attribute, ..., name) that leads to it."""


def _shape(shape: Any) -> tuple | None:
    return None if shape is None else tuple(shape)


def _enc_info(i: TensorInfo) -> list:
    shape = None if i.shape is None else list(i.shape)
    return [dtype_name(i.dtype), shape] + ([] if i.is_tensor else [i.kind])


def _dec_info(e: list) -> TensorInfo:
    dt, shape, *kind = e
    return TensorInfo(dtype_from_name(dt), _shape(shape), kind=kind[0] if kind else TENSOR)


def _enc_attr(v: Any, layout: dict[WeightKey, tuple[int, int]], path: tuple) -> Any:
    if isinstance(v, Graph):
        return {"@graph": _enc_graph(v, layout, path)}
    if isinstance(v, TensorInfo):
        return {"@type": _enc_info(v)}
    if isinstance(v, np.ndarray):
        if v.dtype == object:
            return {"@array": ["object", list(v.shape), [str(x) for x in v.ravel()]]}
        data = base64.b64encode(np.ascontiguousarray(v).tobytes()).decode()
        return {"@array": [dtype_name(v.dtype), list(v.shape), data]}
    if isinstance(v, (list, tuple)):
        return [_enc_attr(x, layout, path) for x in v]
    if isinstance(v, np.generic):
        return v.item()
    return v


def _dec_attr(v: Any, weights: memoryview | None, where: str, opsets: dict[str, int]) -> Any:
    if isinstance(v, dict) and "@graph" in v:
        return _dec_graph(v["@graph"], weights, where, opsets)
    if isinstance(v, dict) and "@type" in v:
        return _dec_info(v["@type"])
    if isinstance(v, dict) and "@array" in v:
        dt, shape, data = v["@array"]
        if dt == "object":
            return np.array(data, dtype=object).reshape(shape)
        return np.frombuffer(base64.b64decode(data), dtype_from_name(dt)).reshape(shape).copy()
    if isinstance(v, list):
        return [_dec_attr(x, weights, where, opsets) for x in v]
    return v


def _constants(graph: Graph, path: tuple) -> Iterator[tuple[WeightKey, np.ndarray]]:
    for name, arr in graph.constants.items():
        yield (path + (name,) if path else name), arr
    for i, node in enumerate(graph.nodes):
        for key, sub in subgraphs(node).items():
            yield from _constants(sub, path + (i, key))


def weights(graph: Graph) -> dict[WeightKey, np.ndarray]:
    """Every constant of the graph and of its sub-graphs, by weight key."""
    return dict(_constants(graph, ()))


def weight_layout(constants: dict[WeightKey, np.ndarray]) -> dict[WeightKey, tuple[int, int]]:
    """key -> (offset, nbytes) inside WEIGHTS, every tensor 64-byte aligned (object arrays excluded)."""
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
        "shapes": {k: None if v is None else list(v) for k, v in p.shapes.items()},
        "tasks": [[t.node, t.inputs, t.outputs, t.workspace_offset, t.workspace_size] for t in p.tasks],
        "places": {k: [place.region, place.offset, place.key] for k, place in p.places.items()},
        "blocks": [[b.label, b.size, b.first, b.last, b.offset] for b in p.blocks],
        "arena_size": p.arena_size, "lower_bound": p.lower_bound, "naive_size": p.naive_size,
        "io_size": p.io_size, "io_offsets": p.io_offsets, "copy_only": p.copy_only,
    }


def decode_program(d: dict) -> Program:
    return Program(
        signature={k: tuple(v) for k, v in d["signature"].items()},
        shapes={k: _shape(v) for k, v in d["shapes"].items()},
        tasks=[Task(int(n), list(i), list(o), int(offset), int(size)) for n, i, o, offset, size in d["tasks"]],
        places={k: Placement(r, int(o), str(key)) for k, (r, o, key) in d["places"].items()},
        blocks=[Block(str(l), int(s), int(f), int(la), int(o)) for l, s, f, la, o in d["blocks"]],
        arena_size=int(d["arena_size"]), lower_bound=int(d["lower_bound"]),
        naive_size=int(d["naive_size"]), io_size=int(d["io_size"]),
        io_offsets={k: int(v) for k, v in d["io_offsets"].items()},
        copy_only=dict(d["copy_only"]))


def _enc_graph(graph: Graph, layout: dict[WeightKey, tuple[int, int]], path: tuple) -> dict:
    """A graph's JSON (the main graph's, or a sub-graph's inside its node's attribute)."""
    def spec(v: str) -> dict:
        dt, shape, *kind = _enc_info(graph.infos[v])
        return {"name": v, "dtype": dt, "shape": shape, **({"kind": kind[0]} if kind else {})}

    def constant(k: str, a: np.ndarray) -> list:
        key = path + (k,) if path else k
        if key in layout:
            return [dtype_name(a.dtype), list(a.shape), *layout[key]]
        return [None, list(a.shape), [str(x) for x in a.ravel()]]

    return {
        "name": graph.name,
        "inputs": [spec(v) for v in graph.inputs],
        "outputs": [spec(v) for v in graph.outputs],
        "values": {k: _enc_info(i) for k, i in graph.infos.items() if k not in graph.constants},
        "constants": {k: constant(k, a) for k, a in graph.constants.items()},
        "nodes": [[n.op_type, n.domain, n.name, n.inputs, n.outputs,
                   {k: _enc_attr(v, layout, path + (i, k)) for k, v in n.attrs.items()}]
                  for i, n in enumerate(graph.nodes)],
    }


def _dec_graph(doc: dict, weights: memoryview | None, where: str, opsets: dict[str, int]) -> Graph:
    """Inverse of `_enc_graph`: constants become read-only views into `weights`."""
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
    infos = {k: _dec_info(e) for k, e in doc["values"].items()}
    for s in doc["inputs"] + doc["outputs"]:
        kind = [s["kind"]] if "kind" in s else []
        infos.setdefault(s["name"], _dec_info([s["dtype"], s["shape"]] + kind))
    nodes = [Node(op, list(i), list(o), {k: _dec_attr(v, weights, where, opsets) for k, v in attrs.items()},
                  dom, name)
             for op, dom, name, i, o, attrs in doc["nodes"]]
    graph = Graph(nodes, [s["name"] for s in doc["inputs"]], [s["name"] for s in doc["outputs"]],
                  infos, constants, opsets, doc["name"])
    for c, a in constants.items():
        graph.infos[c] = TensorInfo.of(a)
    return graph


def encode(graph: Graph, layout: dict[WeightKey, tuple[int, int]], program: Program | None,
           metadata: dict[str, str]) -> bytes:
    """The MODEL_DEF partition."""
    doc = {
        "opsets": graph.opsets,
        **_enc_graph(graph, layout, ()),
        "program": encode_program(program) if program else None,
        "metadata": metadata,
    }
    return json.dumps(doc, separators=(",", ":")).encode()


def decode(raw: memoryview | bytes, weights: memoryview | None, where: str
           ) -> tuple[Graph, Program | None, dict[str, str]]:
    """Graph (constants as read-only views into `weights`), default program and metadata."""
    try:
        doc = json.loads(bytes(raw))
        graph = _dec_graph(doc, weights, where, {k: int(v) for k, v in doc["opsets"].items()})
        program = decode_program(doc["program"]) if doc["program"] else None
        return graph, program, dict(doc.get("metadata", {}))
    except FormatError:
        raise
    except (ValueError, KeyError, TypeError, IndexError) as e:
        raise FormatError(f"{where}: MODEL_DEF is malformed ({type(e).__name__}: {e}); the file is "
                          f"corrupted or was written by an incompatible omrt") from e
