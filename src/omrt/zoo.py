"""Real architectures to demo, test and benchmark with: the nine light models the onnx package
ships, and seeded variants of them whose outputs mean something.

The shipped models have degenerate weights (constant tensors), so their outputs are the same
number everywhere: squeezenet's logits are all about 9.5e9, and whether its softmax comes out
uniform depends on the last ulps of each sum, i.e. on the summation order of the BLAS build and
the thread split. `redrawn` keeps each graph and draws its weights afresh, seeded: He-normal
filters and matrices, batch-norm statistics near identity, small biases, and the last layer
scaled so that the logits spread over a few units. Their outputs then differ from class to class
and can be compared across runtimes with tolerances relative to their magnitude
(`scaled_error`), on any CPU and thread count.

Needs `onnx` (not part of the runtime).
"""

from __future__ import annotations

import os
from typing import Any, Mapping

import numpy as np

NAMES = ("bvlc_alexnet", "densenet121", "inception_v1", "inception_v2", "resnet50", "shufflenet",
         "squeezenet", "vgg19", "zfnet512")
"""The light models shipped under onnx/backend/test/data/light."""

LOGITS = "logits"
"""The extra graph output `with_logits` adds: the input of the final Softmax."""

LOGIT_SPREAD = 3.0
"""Standard deviation the redrawn models' logits are scaled to."""


def shipped(name: str) -> tuple[str, str]:
    """Paths of a light model shipped by the onnx package and of its expected output."""
    import onnx

    if name not in NAMES:
        raise ValueError(f"unknown light model {name!r}; choose one of {', '.join(NAMES)}")
    base = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")
    return os.path.join(base, f"light_{name}.onnx"), os.path.join(base, f"light_{name}_output_0.pb")


def backend_input(shape: tuple[int, ...]) -> np.ndarray:
    """The input the ONNX backend test feeds light models: arange(n) / n in float32."""
    n = int(np.prod(shape))
    return (np.arange(n).reshape(shape) / n).astype(np.float32)


def read_tensor(path: str) -> np.ndarray:
    """A TensorProto file (the shipped expected outputs) as an array."""
    import onnx
    from onnx import numpy_helper

    t = onnx.TensorProto()
    with open(path, "rb") as f:
        t.ParseFromString(f.read())
    return numpy_helper.to_array(t)


def scaled_error(got: np.ndarray, want: np.ndarray) -> float:
    """max |got - want| relative to the largest |want|: a tolerance that holds whatever order the
    sums were taken in, as long as the outputs are not cancellations of much larger terms."""
    if got.shape != want.shape:
        return float("inf")
    want64 = want.astype(np.float64)
    scale = max(float(np.max(np.abs(want64), initial=0.0)), np.finfo(np.float32).tiny)
    return float(np.max(np.abs(got.astype(np.float64) - want64), initial=0.0)) / scale


def with_logits(model: Any) -> Any:
    """A copy of `model` that also outputs the input of its final Softmax as LOGITS (the model
    itself when it does not end in one)."""
    from onnx import helper

    last = model.graph.node[-1]
    if last.op_type != "Softmax":
        return model
    copy = type(model)()
    copy.CopyFrom(model)
    probabilities = next(o for o in copy.graph.output if o.name == last.output[0])
    logits = copy.graph.output.add()
    logits.CopyFrom(probabilities)  # Softmax keeps its input's type and shape
    logits.name = LOGITS
    copy.graph.node.append(helper.make_node("Identity", [last.input[0]], [LOGITS], name=LOGITS))
    return copy


def reference(model: Any, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Outputs by name from ONNX Runtime, or from onnx's reference evaluator without it."""
    try:
        import onnxruntime as ort
    except ImportError:
        from onnx.reference import ReferenceEvaluator

        names = [o.name for o in model.graph.output]
        return dict(zip(names, ReferenceEvaluator(model).run(None, dict(feeds))))
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, dict(feeds))))


def sample_input(model: Any, seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded standard-normal float32 inputs for every graph input that is not an initializer."""
    rng = np.random.default_rng(seed)
    inits = {i.name for i in model.graph.initializer}
    feeds = {}
    for vi in model.graph.input:
        if vi.name not in inits:
            shape = [d.dim_value for d in vi.type.tensor_type.shape.dim]
            feeds[vi.name] = rng.standard_normal(shape).astype(np.float32)
    return feeds


# ----------------------------------------------------------------------------- redrawing weights


def _constants(model: Any) -> dict[str, np.ndarray]:
    """Every float constant of the graph by name: initializers, and the outputs of the
    ConstantOfShape nodes the light models build their weights with."""
    from onnx import numpy_helper

    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    read = {v for n in model.graph.node for v in n.input}
    found = {k: v for k, v in inits.items() if v.dtype.kind == "f" and k in read}
    for node in model.graph.node:
        if node.op_type == "ConstantOfShape" and node.input[0] in inits:
            found[node.output[0]] = np.zeros(inits[node.input[0]].astype(np.int64), np.float32)
    return found


def _roles(model: Any) -> dict[str, tuple[str, Any]]:
    """constant name -> (role, the node reading it) for weights, biases and normalisation stats."""
    roles: dict[str, tuple[str, Any]] = {}
    for node in model.graph.node:
        slots = {"Conv": ("filter", "bias"), "Gemm": ("", "matrix", "bias"),
                 "BatchNormalization": ("", "scale", "shift", "mean", "variance"),
                 "Mul": ("factor", "factor"), "Add": ("shift", "shift")}
        for i, role in enumerate(slots.get(node.op_type, ())):
            if role and i < len(node.input):
                roles.setdefault(node.input[i], (role, node))
    for node in reversed(model.graph.node):  # a constant reaching its reader through a view
        if node.op_type in VIEWS and node.output[0] in roles:
            roles.setdefault(node.input[0], roles[node.output[0]])
    return roles


VIEWS = ("Reshape", "Unsqueeze", "Flatten", "Identity")
"""Ops through which a constant may reach the layer that reads it."""


def _source(model: Any, value: str) -> str:
    """The constant `value` is a view of (itself when it is one)."""
    producers = {o: n for n in model.graph.node for o in n.output}
    while value in producers and producers[value].op_type in VIEWS:
        value = producers[value].input[0]
    return value


def _draw(role: str, node: Any, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """Fresh float32 values for a constant of this role and shape."""
    if role == "filter":
        fan_in = int(np.prod(shape[1:]))
    elif role == "matrix":
        trans_b = any(a.name == "transB" and a.i for a in node.attribute)
        fan_in = shape[1] if trans_b else shape[0]
    else:
        fan_in = 0
    if fan_in:
        return rng.standard_normal(shape, np.float32) * np.float32(np.sqrt(2.0 / fan_in))
    if role in ("scale", "factor", "variance"):
        return rng.uniform(0.5, 1.5, shape).astype(np.float32)
    return rng.normal(0.0, 0.1, shape).astype(np.float32)


def _last_layer(model: Any) -> Any:
    """The Conv or Gemm that produces the logits (the Softmax input, or the final output)."""
    target = model.graph.node[-1].input[0] if model.graph.node[-1].op_type == "Softmax" \
        else model.graph.output[0].name
    producers = {o: n for n in model.graph.node for o in n.output}
    node = producers[target]
    while node.op_type not in ("Conv", "Gemm"):
        node = producers[node.input[0]]
    return node


def _set_initializer(tensor: Any, name: str, value: np.ndarray) -> None:
    """Fill TensorProto `tensor` with float32 `value` in place (no intermediate message)."""
    from onnx import TensorProto

    tensor.Clear()
    tensor.name = name
    tensor.data_type = TensorProto.FLOAT
    tensor.dims.extend(value.shape)
    tensor.raw_data = np.ascontiguousarray(value, "<f4").tobytes()


def _replace_constants(model: Any, values: Mapping[str, np.ndarray]) -> Any:
    """`model` with its constants set to `values`, as initializers (ConstantOfShape dropped), and
    the initializers and inputs nothing reads any more removed."""
    from onnx import TensorProto, helper

    graph = model.graph
    kept = [n for n in graph.node if not (n.op_type == "ConstantOfShape" and n.output[0] in values)]
    del graph.node[:]
    graph.node.extend(kept)
    read = {v for n in graph.node for v in n.input}
    dropped = {i.name for i in graph.initializer if i.name in values or i.name not in read}
    inputs = [i for i in graph.input if i.name not in dropped]
    del graph.input[:]
    graph.input.extend(inputs)
    others = [i for i in graph.initializer if i.name not in dropped]
    del graph.initializer[:]
    graph.initializer.extend(others)
    for name, value in values.items():
        _set_initializer(graph.initializer.add(), name, value)
        if model.ir_version < 4:  # initializers were graph inputs too before IR 4
            graph.input.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, value.shape))
    return model


def redrawn(name: str, seed: int = 0) -> Any:
    """Light model `name` with seeded, well-conditioned weights and its logits as a second output
    (see the module docstring); the same seed gives the same model."""
    import onnx

    model = onnx.load(shipped(name)[0])
    rng = np.random.default_rng(seed)
    roles = _roles(model)
    values = {k: _draw(*roles.get(k, ("shift", None)), v.shape, rng) for k, v in _constants(model).items()}
    model = with_logits(_replace_constants(model, values))
    outputs = reference(model, sample_input(model, seed))
    spread = float(np.std(outputs.get(LOGITS, next(iter(outputs.values())))))
    factor = np.float32(LOGIT_SPREAD / spread if spread > 0 else 1.0)
    tensors = {t.name: t for t in model.graph.initializer}
    for k in _last_layer(model).input[1:]:
        source = _source(model, k)
        _set_initializer(tensors[source], source, values[source] * factor)
    return model
