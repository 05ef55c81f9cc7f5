"""ONNX -> omrt IR: the only place that reads ONNX protobufs."""

from __future__ import annotations

import os
from typing import Any, Mapping, Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ..errors import CompileError, UnsupportedOpError
from ..ir import Graph, Node, Shape, TensorInfo
from ..kernels import lookup

MIN_OPSET = 7


def load_model(model: str | os.PathLike | bytes | onnx.ModelProto) -> onnx.ModelProto:
    """Read a model from a path, bytes or a ModelProto, with external data, at opset 7 or newer."""
    if isinstance(model, onnx.ModelProto):
        proto = model
    elif isinstance(model, (bytes, bytearray)):
        proto = onnx.load_from_string(bytes(model))
    else:
        path = os.fspath(model)
        if not os.path.exists(path):
            raise CompileError(f"model file {path!r} does not exist")
        try:
            proto = onnx.load(path)
        except Exception as e:
            raise CompileError(f"{path!r} is not a readable ONNX model: {e}") from e
    opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), None)
    if opset is not None and opset < MIN_OPSET:
        try:
            proto = onnx.version_converter.convert_version(proto, MIN_OPSET)
        except Exception as e:
            raise CompileError(f"the model uses opset {opset}; omrt needs {MIN_OPSET} or newer and the "
                               f"ONNX version converter could not upgrade it: {e}") from e
    return proto


def _dtype(elem_type: int, what: str) -> np.dtype:
    try:
        return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type))
    except Exception as e:
        raise CompileError(f"{what}: ONNX element type {elem_type} has no numpy dtype") from e


def _attr(a: onnx.AttributeProto) -> Any:
    if a.type == onnx.AttributeProto.TENSOR:
        return numpy_helper.to_array(a.t)
    if a.type == onnx.AttributeProto.TENSORS:
        return [numpy_helper.to_array(t) for t in a.tensors]
    if a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS):
        graphs = [a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)
        raise UnsupportedOpError(f"attribute {a.name!r} holds a sub-graph; control flow is not supported "
                                 f"yet ({len(graphs)} graph(s))")
    value = helper.get_attribute_value(a)
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, list) and value and isinstance(value[0], bytes):
        return [v.decode("utf-8", "replace") for v in value]
    if isinstance(value, list):
        return list(value)
    return value


def _constant(node: onnx.NodeProto) -> np.ndarray:
    """The value of a Constant node, whichever attribute carries it."""
    a = node.attribute[0]
    if a.name == "value":
        return numpy_helper.to_array(a.t)
    if a.name == "sparse_value":
        sp = a.sparse_tensor
        dense = np.zeros(tuple(sp.dims), _dtype(sp.values.data_type, node.name))
        idx = numpy_helper.to_array(sp.indices)
        vals = numpy_helper.to_array(sp.values)
        if idx.ndim == 1:
            dense.reshape(-1)[idx] = vals
        else:
            dense[tuple(idx.T)] = vals
        return dense
    kinds = {"value_float": np.float32, "value_floats": np.float32, "value_int": np.int64,
             "value_ints": np.int64}
    if a.name in kinds:
        return np.array(helper.get_attribute_value(a), kinds[a.name])
    if a.name in ("value_string", "value_strings"):
        v = helper.get_attribute_value(a)
        return np.array([s.decode() for s in v] if isinstance(v, list) else v.decode(), dtype=object)
    raise CompileError(f"Constant node {node.name!r} has unknown attribute {a.name!r}")


def _input_shape(vi: onnx.ValueInfoProto, override: Sequence[int] | None) -> Shape:
    dims = vi.type.tensor_type.shape.dim
    if override is not None:
        if len(override) != len(dims) and len(dims):
            raise CompileError(f"--shape for input {vi.name!r} has rank {len(override)}, the model "
                               f"declares rank {len(dims)}")
        return tuple(int(d) for d in override)
    out: list[int | str | None] = []
    for i, d in enumerate(dims):
        if d.HasField("dim_value") and d.dim_value > 0:
            out.append(int(d.dim_value))
        elif d.HasField("dim_param") and d.dim_param:
            out.append(d.dim_param)
        else:
            out.append(f"{vi.name}_dim{i}")
    return tuple(out)


def import_model(proto: onnx.ModelProto, shapes: Mapping[str, Sequence[int]] | None = None) -> Graph:
    """Translate a ModelProto into omrt's IR; every op must have a kernel (all missing ones are named)."""
    g = proto.graph
    shapes = dict(shapes or {})
    opsets = {("" if o.domain == "ai.onnx" else o.domain): o.version for o in proto.opset_import}
    constants: dict[str, np.ndarray] = {}
    for init in g.initializer:
        constants[init.name] = numpy_helper.to_array(init)
    for sp in g.sparse_initializer:
        raise CompileError(f"sparse initializer {sp.values.name!r} is not supported; densify it")
    infos: dict[str, TensorInfo] = {}
    inputs: list[str] = []
    for vi in g.input:
        if vi.name in constants:
            continue
        if not vi.type.HasField("tensor_type"):
            raise CompileError(f"graph input {vi.name!r} is not a tensor; only tensor inputs are supported")
        inputs.append(vi.name)
        infos[vi.name] = TensorInfo(_dtype(vi.type.tensor_type.elem_type, f"input {vi.name!r}"),
                                    _input_shape(vi, shapes.pop(vi.name, None)))
    if shapes:
        raise CompileError(f"--shape names {sorted(shapes)}, which are not graph inputs; the inputs are "
                           f"{inputs}")
    nodes: list[Node] = []
    missing: dict[tuple[str, str], list[str]] = {}
    for i, n in enumerate(g.node):
        if n.op_type == "Constant" and n.domain in ("", "ai.onnx"):
            constants[n.output[0]] = _constant(n)
            continue
        domain = "" if n.domain == "ai.onnx" else n.domain
        node = Node(n.op_type, list(n.input), list(n.output), {a.name: _attr(a) for a in n.attribute},
                    domain, n.name or f"{n.op_type}_{i}")
        try:
            lookup(node.op_type, opsets.get(domain, 1), domain, node.label)
        except UnsupportedOpError:
            missing.setdefault((domain, node.op_type), []).append(node.label)
        nodes.append(node)
    if missing:
        ops = "; ".join(f"{(d + '::') if d else ''}{op} at opset {opsets.get(d, 1)} "
                        f"(node{'s' if len(ns) > 1 else ''} {', '.join(repr(n) for n in ns[:5])}"
                        f"{', ...' if len(ns) > 5 else ''})" for (d, op), ns in missing.items())
        raise UnsupportedOpError(f"no kernel in omrt for {ops}; see docs/conformance.md for the "
                                 f"supported operators and versions")
    outputs = [o.name for o in g.output]
    return Graph(nodes, inputs, outputs, infos, constants, opsets, g.name or "main")
