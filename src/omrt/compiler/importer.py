"""ONNX -> omrt IR: the only place that reads ONNX protobufs."""

from __future__ import annotations

import os
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ..errors import CompileError, UnsupportedOpError
from ..ir import CAPTURES, OPTIONAL, SEQUENCE, TENSOR, Graph, Node, Shape, TensorInfo, subgraphs
from ..kernels import kernel_of

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


def _attr(a: onnx.AttributeProto, graph: Callable[[onnx.GraphProto], Graph]) -> Any:
    if a.type == onnx.AttributeProto.TENSOR:
        return numpy_helper.to_array(a.t)
    if a.type == onnx.AttributeProto.TENSORS:
        return [numpy_helper.to_array(t) for t in a.tensors]
    if a.type == onnx.AttributeProto.GRAPH:
        return graph(a.g)
    if a.type == onnx.AttributeProto.GRAPHS:
        raise UnsupportedOpError(f"attribute {a.name!r} holds a list of graphs, which no ONNX operator "
                                 f"omrt knows takes")
    if a.type == onnx.AttributeProto.TYPE_PROTO:
        return _type_info(a.tp, a.name, None)
    if a.type == onnx.AttributeProto.TYPE_PROTOS:
        return [_type_info(t, a.name, None) for t in a.type_protos]
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


def _shape(name: str, tensor_type: onnx.TypeProto.Tensor, override: Sequence[int] | None) -> Shape:
    dims = tensor_type.shape.dim
    if override is not None:
        if len(override) != len(dims) and len(dims):
            raise CompileError(f"--shape for input {name!r} has rank {len(override)}, the model "
                               f"declares rank {len(dims)}")
        return tuple(int(d) for d in override)
    out: list[int | str | None] = []
    for i, d in enumerate(dims):
        if d.HasField("dim_value") and d.dim_value > 0:
            out.append(int(d.dim_value))
        elif d.HasField("dim_param") and d.dim_param:
            out.append(d.dim_param)
        else:
            out.append(f"{name}_dim{i}")
    return tuple(out)


def _type_info(t: onnx.TypeProto, name: str, override: Sequence[int] | None,
               untyped: np.dtype | None = None) -> TensorInfo:
    """The info an ONNX type declares: tensors, sequences and optionals of them, nested.

    `untyped` is the dtype to assume when the type leaves the element type out (sub-graph inputs,
    whose kernels take the type from the outer value); without it that is an error.
    """
    kinds = []
    while t.HasField("sequence_type") or t.HasField("optional_type"):
        if t.HasField("sequence_type"):
            kinds.append(SEQUENCE)
            t = t.sequence_type.elem_type
        else:
            kinds.append(OPTIONAL)
            t = t.optional_type.elem_type
    kind = ".".join(kinds) or TENSOR
    if t.HasField("tensor_type"):
        unranked = kinds and not t.tensor_type.HasField("shape") and override is None
        shape = None if unranked else _shape(name, t.tensor_type, override)
        if t.tensor_type.elem_type == 0 and untyped is not None:
            return TensorInfo(untyped, shape, kind=kind)
        return TensorInfo(_dtype(t.tensor_type.elem_type, f"value {name!r}"), shape, kind=kind)
    if untyped is not None and t.WhichOneof("value") is None:
        return TensorInfo(untyped, None if kinds else (), kind=kind)
    what = t.WhichOneof("value") or "no type"
    raise CompileError(f"value {name!r} has type {what}; omrt supports tensors and sequences and "
                       f"optionals of tensors")


class _Importer:
    """Turns a GraphProto and its sub-graphs into IR graphs, collecting ops that have no kernel."""

    def __init__(self, opsets: dict[str, int], custom: dict[tuple[str, str], Any]) -> None:
        self.opsets = opsets
        self.custom = custom
        self.missing: dict[tuple[str, str], list[str]] = {}

    def graph(self, g: onnx.GraphProto, shapes: dict[str, Sequence[int]] | None = None,
              top: bool = False) -> Graph:
        """One graph; a sub-graph's free variables become its owner node's trailing inputs."""
        shapes = {} if shapes is None else shapes
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
            inputs.append(vi.name)
            infos[vi.name] = _type_info(vi.type, vi.name, shapes.pop(vi.name, None),
                                        None if top else np.dtype(np.float32))
        nodes: list[Node] = []
        prefix = "" if top else f"{g.name or 'subgraph'}/"
        for i, n in enumerate(g.node):
            if n.op_type == "Constant" and n.domain in ("", "ai.onnx"):
                constants[n.output[0]] = _constant(n)
                continue
            domain = "" if n.domain == "ai.onnx" else n.domain
            node = Node(n.op_type, list(n.input), list(n.output),
                        {a.name: _attr(a, self.graph) for a in n.attribute}, domain,
                        n.name or f"{prefix}{n.op_type}_{i}")
            free: dict[str, None] = {}
            for sub in subgraphs(node).values():
                free.update(dict.fromkeys(sub.free_names()))
            if free:
                node.inputs += list(free)
                node.attrs[CAPTURES] = list(free)
            nodes.append(node)
        outputs = [o.name for o in g.output]
        for vi in g.output:
            if vi.type.WhichOneof("value") is not None and vi.name not in infos:
                try:
                    infos[vi.name] = _type_info(vi.type, vi.name, None)
                except CompileError:
                    pass  # only a fallback for outputs whose rank inference cannot tell
        graph = Graph(nodes, inputs, outputs, infos, constants, self.opsets, g.name or "main", self.custom)
        for node in nodes:
            try:
                kernel_of(node, graph)
            except UnsupportedOpError:
                self.missing.setdefault((node.domain, node.op_type), []).append(node.label)
        return graph


def import_model(proto: onnx.ModelProto, shapes: Mapping[str, Sequence[int]] | None = None,
                 custom: dict[tuple[str, str], Any] | None = None) -> Graph:
    """Translate a ModelProto into omrt's IR; every op must have a kernel (all missing ones are
    named): omrt's, or one of the model's `custom` operators ((domain, op_type) -> kernel class)."""
    shapes = dict(shapes or {})
    opsets = {("" if o.domain == "ai.onnx" else o.domain): o.version for o in proto.opset_import}
    importer = _Importer(opsets, {} if custom is None else custom)
    graph = importer.graph(proto.graph, shapes, top=True)
    if shapes:
        raise CompileError(f"--shape names {sorted(shapes)}, which are not graph inputs; the inputs are "
                           f"{graph.inputs}")
    if importer.missing:
        ops = "; ".join(f"{(d + '::') if d else ''}{op} at opset {opsets.get(d, 1)} "
                        f"(node{'s' if len(ns) > 1 else ''} {', '.join(repr(n) for n in ns[:5])}"
                        f"{', ...' if len(ns) > 5 else ''})" for (d, op), ns in importer.missing.items())
        raise UnsupportedOpError(f"no kernel in omrt for {ops}; see docs/conformance.md for the "
                                 f"supported operators and versions, or define it as a custom operator "
                                 f"(omrt.CustomOp, docs/custom_ops.md)")
    return graph
