"""Every node's input types against its operator's ONNX schema, before anything runs on them.

An ONNX schema names a type variable per input (Conv's X and W are both `T`) and the types each
variable may take. A node whose inputs break that (float32 data with float16 filters, say) is
what the ONNX checker rejects and ONNX Runtime refuses to load; omrt's kernels would compute
something, or read past an array. `check_types` makes it a CompileError naming the node, the
input, its type and what the operator allows.
"""

from __future__ import annotations

import onnx
from onnx import helper
from onnx.defs import OpSchema

from ..errors import CompileError
from ..ir import Graph, Node, TensorInfo, subgraphs

STANDARD = ("", "ai.onnx", "ai.onnx.ml")
"""Domains whose schemas onnx ships; omrt's own and custom ops are typed by their kernels."""


def type_string(info: TensorInfo) -> str:
    """The ONNX type string of a value: `tensor(float)`, `seq(tensor(int64))`, ..."""
    if info.dtype == object:
        text = "tensor(string)"
    else:
        code = helper.np_dtype_to_tensor_dtype(info.dtype)
        text = f"tensor({onnx.TensorProto.DataType.Name(code).lower()})"
    if info.kind != "tensor":
        for container in reversed(info.kind.split(".")):
            text = f"{'seq' if container == 'sequence' else 'optional'}({text})"
    return text


def _formals(schema: OpSchema, count: int) -> list[OpSchema.FormalParameter]:
    """The schema's formal input for each of `count` actual inputs (a variadic one repeats)."""
    formals = list(schema.inputs)
    if formals and formals[-1].option == OpSchema.FormalParameterOption.Variadic:
        return formals[:-1] + [formals[-1]] * max(0, count - len(formals) + 1)
    return formals[:count]


def _check_node(node: Node, graph: Graph) -> None:
    try:
        schema = onnx.defs.get_schema(node.op_type, graph.opset(node.domain), node.domain)
    except onnx.defs.SchemaError:
        return  # an op the importer already refused, or one of omrt's own
    allowed = {c.type_param_str: set(c.allowed_type_strs) for c in schema.type_constraints}
    bound: dict[str, tuple[str, str]] = {}
    for formal, value in zip(_formals(schema, len(node.inputs)), node.inputs):
        if not value or value not in graph.infos:
            continue
        got = type_string(graph.infos[value])
        variable = formal.type_str
        if variable in allowed and got not in allowed[variable]:
            raise CompileError(f"node {node.label!r} ({node.op_type}): input {value!r} ({formal.name}) is "
                               f"{got}, which {node.op_type} does not take; it allows "
                               f"{', '.join(sorted(allowed[variable]))}: cast the input or fix the exporter")
        if variable not in allowed and got != variable:
            raise CompileError(f"node {node.label!r} ({node.op_type}): input {value!r} ({formal.name}) is "
                               f"{got}, the operator takes {variable}")
        first = bound.setdefault(variable, (value, got))
        homogeneous = formal.option != OpSchema.FormalParameterOption.Variadic or formal.is_homogeneous
        if first[1] != got and homogeneous:
            raise CompileError(f"node {node.label!r} ({node.op_type}): inputs {first[0]!r} ({first[1]}) and "
                               f"{value!r} ({got}) must have one type ({variable}); cast one of them")


def check_types(graph: Graph) -> None:
    """Raise CompileError for the first node (sub-graphs included) whose inputs break its schema."""
    for node in graph.nodes:
        if node.domain in STANDARD:
            _check_node(node, graph)
        for sub in subgraphs(node).values():
            check_types(sub)
