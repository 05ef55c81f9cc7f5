"""Autofuse: chains of elementwise operators, and elementwise chains with reductions over trailing
axes, become one generated C function each (omrt::AutoFused nodes).

Runs after the other passes (omrt.compiler.passes): what they fused (activations into their
producer, FusedMatMul, Gelu) is left as it is, and an omrt::Gelu joins a chain like any other
elementwise op. What it finds in mobile CNNs and transformers: HardSwish written as
x * HardSigmoid(x) or as Add/Clip/Div/Mul, squeeze-excite scaling, residual Add + Relu,
LayerNormalization written out as ReduceMean/Sub/Pow/Sqrt/Div/Mul/Add, Softmax after the
attention mask's Add.

How a chain grows: nodes are visited in order; a fusible node joins the chain that produces one of
its inputs when every other input it reads is a constant, a graph input or produced before the
chain starts (so the fused node can stand where the chain began), and its shape fits the chain's
frame: full values have the frame's shape, row values one element per row of the trailing axes a
reduction reduces. A value read outside the chain, or a graph output, is an output of the fused
node; the others (the intermediates) leave the graph and the arena. Chains of one node stay,
except a Softmax, LayerNormalization or Sigmoid alone: numpy runs those in several passes, each
a call from Python, and one that follows a native layer finds Python's own code and data out of
the caches (squeezenet's last Softmax took 60-160 us so, against 10 us in a loop of its own).

The fused node keeps its original nodes as its sub-graph `body` (run on a guard miss, an untrusted
file or a host that cannot load the library), the name of its C function and its guard.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from ..format.kernelstore import Packed
from ..ir import Graph, Node, TensorInfo
from ..kernels import lookup
from ..kernels.fused import BODY, intermediate_bytes
from ..native import build
from ..native import fused as native_fused
from ..native.fusegen import Chain, Operand, Step, last_written
from ..plan.infer import context
from .passes import remove_dead_code

F32 = np.dtype(np.float32)
ACT = "_act"

_BINARY = {"Add": "add", "Sub": "sub", "Mul": "mul", "Div": "div", "Max": "max", "Min": "min"}
_UNARY = {"Relu": "relu", "Neg": "neg", "Abs": "abs", "Sqrt": "sqrt", "Exp": "exp", "Erf": "erf",
          "Tanh": "tanh", "Sigmoid": "sigmoid", "Reciprocal": "recip"}
_POWERS = {1.0: ["copy"], 2.0: ["square"], 3.0: ["square", "cube"], 0.5: ["sqrt"], -1.0: ["recip"],
           -0.5: ["sqrt", "recip"]}
_REDUCE = {"ReduceSum": "sum", "ReduceMean": "mean", "ReduceMax": "rmax"}


@dataclass
class Lowered:
    """A node in primitives: its steps, and the first reduced axis when it reduces (the split)."""

    steps: list[Step]
    split: int | None = None
    row_output: bool = False
    """True when the output has one value per row (a reduction's)."""


def _arg(graph: Graph, v: str) -> str | float:
    """A scalar float constant becomes a literal; every other value stays a name."""
    c = graph.constants.get(v)
    if c is not None and c.size == 1 and c.dtype.kind == "f":
        return float(c.reshape(-1)[0])
    return v


def _scalar(graph: Graph, v: str) -> float | None:
    c = graph.constants.get(v) if v else None
    return float(c.reshape(-1)[0]) if c is not None and c.size == 1 else None


def _elementwise(node: Node, graph: Graph, args: list) -> Lowered | None:
    op, out, a = node.op_type, node.outputs[0], node.attrs
    if op in _BINARY and len(args) == 2:
        return Lowered([Step(out, _BINARY[op], tuple(args))])
    if op in _UNARY and len(args) == 1:
        return Lowered([Step(out, _UNARY[op], tuple(args))])
    if op == "LeakyRelu":
        return Lowered([Step(out, "leaky", (args[0],), (float(a.get("alpha", 0.01)),))])
    if op == "HardSigmoid":
        return Lowered([Step(out, "hardsigmoid", (args[0],), (float(a.get("alpha", 0.2)), float(a.get("beta", 0.5))))])
    if op == "HardSwish":
        return Lowered([Step(out, "hardswish", (args[0],), (1 / 6, 0.5))])
    if op == "Clip":
        if graph.opset("") < 11:
            lo, hi = float(a.get("min", -np.inf)), float(a.get("max", np.inf))
        else:
            bounds = (list(node.inputs[1:3]) + ["", ""])[:2]
            if any(v and _scalar(graph, v) is None for v in bounds):
                return None
            lo, hi = (_scalar(graph, v) if v else d for v, d in zip(bounds, (-np.inf, np.inf)))
        return Lowered([Step(out, "clip", (args[0],), (lo, hi))])
    if op == "Pow":
        return _power(node, graph, args)
    return None


def _power(node: Node, graph: Graph, args: list) -> Lowered | None:
    """x ** c for the exponents written as products, roots and reciprocals."""
    c = _scalar(graph, node.inputs[1])
    ops = _POWERS.get(c) if c is not None else None
    if ops is None:
        return None
    x, out, steps = args[0], node.outputs[0], []
    for k, op in enumerate(ops):
        name = out if k == len(ops) - 1 else f"{out}~{k}"
        prev = steps[-1].out if steps else x
        if op == "square":
            steps.append(Step(name, "mul", (x, x)))
        elif op == "cube":
            steps.append(Step(name, "mul", (prev, x)))
        else:
            steps.append(Step(name, op, (prev,)))
    return Lowered(steps)


_ACTIVATIONS = {"Relu": ("relu", ()), "Sigmoid": ("sigmoid", ()), "Tanh": ("tanh", ()),
                "LeakyRelu": ("leaky", ("_act_alpha",)), "Clip": ("clip", ("_act_alpha", "_act_beta")),
                "HardSigmoid": ("hardsigmoid", ("_act_alpha", "_act_beta"))}
"""The activations an earlier pass may have fused into a node (`_act`), as primitives."""


def _activate(node: Node, lowered: Lowered) -> bool:
    """Append the node's fused activation to its steps; False for one autofuse does not know."""
    act = _ACTIVATIONS.get(node.attrs[ACT])
    if act is None or lowered.row_output:
        return False
    op, keys = act
    last = lowered.steps[-1]
    pre = f"{last.out}~pre"
    lowered.steps[-1] = Step(pre, last.op, last.args, last.params)
    lowered.steps.append(Step(last.out, op, (pre,), tuple(float(node.attrs[k]) for k in keys)))
    return True


def _trailing(axes: list[int], rank: int) -> int | None:
    """The first axis when `axes` are exactly the trailing axes [k, rank), else None."""
    axes = sorted(a % rank for a in axes) if rank else []
    k = rank - len(axes)
    return k if axes == list(range(k, rank)) and k < rank else None


def _mean(x: str | float, out: str, cols: int, tag: str) -> list[Step]:
    return [Step(f"{out}~{tag}", "sum", (x,)), Step(out, "mul", (f"{out}~{tag}", 1.0 / cols))]


def _reduction(node: Node, graph: Graph, args: list) -> Lowered | None:
    op, out = node.op_type, node.outputs[0]
    shape = graph.infos[node.inputs[0]].shape
    rank = len(shape)
    if op == "GlobalAveragePool":
        k = 2 if rank >= 3 else None
    elif op in _REDUCE:
        cls = lookup(op, graph.opset(""), "", node.label)
        infos = [graph.infos[v] if v else None for v in node.inputs]
        axes = cls._axes(context(node, graph), infos, rank)
        k = _trailing(list(axes), rank) if axes is not None else None
    else:
        return None
    if k is None:
        return None
    cols = int(np.prod(shape[k:]))
    kind = "mean" if op == "GlobalAveragePool" else _REDUCE[op]
    steps = _mean(args[0], out, cols, "sum") if kind == "mean" else [Step(out, kind, (args[0],))]
    return Lowered(steps, k, row_output=True)


def _row_ops(node: Node, graph: Graph, args: list) -> Lowered | None:
    """Softmax and LayerNormalization over trailing axes, written in primitives."""
    op, out, shape = node.op_type, node.outputs[0], graph.infos[node.inputs[0]].shape
    rank = len(shape)
    if op == "Softmax":
        coerce = graph.opset("") < 13
        axis = int(node.attrs.get("axis", 1 if coerce else -1)) % rank
        if not coerce and axis != rank - 1:
            return None
        x = args[0]
        return Lowered([Step(f"{out}~max", "rmax", (x,)), Step(f"{out}~d", "sub", (x, f"{out}~max")),
                        Step(f"{out}~e", "exp", (f"{out}~d",)), Step(f"{out}~sum", "sum", (f"{out}~e",)),
                        Step(out, "div", (f"{out}~e", f"{out}~sum"))], axis)
    if op == "LayerNormalization" and len([o for o in node.outputs if o]) == 1 and node.outputs[0]:
        k = int(node.attrs.get("axis", -1)) % rank
        cols, eps = int(np.prod(shape[k:])), float(node.attrs.get("epsilon", 1e-5))
        x, scale = args[0], args[1]
        steps = _mean(x, f"{out}~m", cols, "s1")
        steps += [Step(f"{out}~d", "sub", (x, f"{out}~m")), Step(f"{out}~d2", "mul", (f"{out}~d", f"{out}~d"))]
        steps += _mean(f"{out}~d2", f"{out}~v", cols, "s2")
        steps += [Step(f"{out}~ve", "add", (f"{out}~v", eps)), Step(f"{out}~sd", "sqrt", (f"{out}~ve",)),
                  Step(f"{out}~r", "recip", (f"{out}~sd",)), Step(f"{out}~y", "mul", (f"{out}~d", f"{out}~r"))]
        bias = args[2] if len(args) > 2 and args[2] != "" else None
        steps.append(Step(out if bias is None else f"{out}~ys", "mul", (f"{out}~y", scale)))
        if bias is not None:
            steps.append(Step(out, "add", (f"{out}~ys", bias)))
        return Lowered(steps, k)
    return None


def lower_node(node: Node, graph: Graph) -> Lowered | None:
    """The node in primitives, or None when autofuse does not take it: float32 tensors of known
    shape only, one output."""
    if node.domain not in ("", "omrt") or len(node.outputs) < 1 or not node.outputs[0]:
        return None
    if len([o for o in node.outputs if o]) != 1 or node.outputs[0] not in graph.infos:
        return None
    values = [v for v in node.inputs if v]
    infos = [graph.infos.get(v) for v in values + [node.outputs[0]]]
    if any(i is None or not i.static or i.dtype != F32 for i in infos[:1] + infos[-1:]):
        return None
    args = [_arg(graph, v) if v else "" for v in node.inputs]
    if node.op_type == "Gelu":  # ONNX's or omrt's (from the Erf arithmetic): the erf form only
        exact = node.attrs.get("approximate", "none") == "none"
        lowered = Lowered([Step(node.outputs[0], "gelu", (args[0],))]) if exact else None
    elif node.domain == "omrt":
        return None
    else:
        lowered = _elementwise(node, graph, args) or _reduction(node, graph, args) or _row_ops(node, graph, args)
    if lowered is None or (ACT in node.attrs and not _activate(node, lowered)):
        return None
    operands = {a for s in lowered.steps for a in s.args if isinstance(a, str) and a and "~" not in a}
    produced = {s.out for s in lowered.steps}
    for v in operands - produced:
        info = graph.infos.get(v)
        if info is None or not info.static or info.dtype != F32:
            return None
    return lowered


def operand(name: str, shape: tuple[int, ...], frame: tuple[int, ...], k: int) -> Operand | None:
    """How an array of `shape` is read in `frame` split at axis k (rows: axes before k), or None
    when it varies along part of a row only (it must vary along all of it, or none)."""
    r = len(frame)
    if len(shape) > r:
        return None
    full_shape = (1,) * (r - len(shape)) + tuple(shape)
    strides, step = [0] * r, 1
    for d in range(r - 1, -1, -1):
        strides[d] = step if full_shape[d] != 1 else 0
        step *= full_shape[d]
    if any(s not in (1, f) for s, f in zip(full_shape, frame)):
        return None
    inner = [(s, f) for s, f in zip(full_shape[k:], frame[k:]) if f != 1]
    full = any(s != 1 for s, _ in inner)
    if full and any(s != f for s, f in inner):
        return None
    axes: list[list[int]] = []
    for d in range(k):
        if frame[d] == 1:
            continue
        if axes and axes[-1][1] == strides[d] * frame[d]:
            axes[-1] = [axes[-1][0] * frame[d], strides[d]]
        else:
            axes.append([frame[d], strides[d]])
    terms, div = [], 1
    for size, stride in reversed(axes):
        if stride:
            terms.append((div, size, stride))
        div *= size
    return Operand(name, tuple(reversed(terms)), full)


@dataclass
class _Group:
    """A chain being grown: its nodes, frame, split and what each node became."""

    nodes: list[int]
    frame: tuple[int, ...]
    split: int | None
    steps: list[Step] = field(default_factory=list)
    produced: set[str] = field(default_factory=set)

    def operands(self) -> list[str]:
        """Names the steps read that no step writes, in first-use order."""
        seen: dict[str, None] = {}
        for s in self.steps:
            for a in s.args:
                if isinstance(a, str) and a not in self.produced and a not in seen:
                    seen[a] = None
        return list(seen)


def _broadcasts(small: tuple[int, ...], big: tuple[int, ...]) -> bool:
    """True when `small` broadcasts to `big` (numpy's rule, trailing axes aligned)."""
    return len(small) <= len(big) and all(s in (1, b) for s, b in zip(reversed(small), reversed(big)))


def _fits(graph: Graph, group: _Group, node: Node, lowered: Lowered) -> tuple[int | None, tuple[int, ...]] | None:
    """The group's split and frame if `node` may join it (split None: none yet), else None.

    A chain without reductions takes the shape of a node's output that its frame broadcasts to
    (a squeeze-excite scale times the feature map): what it computed so far is then read once
    per row of the larger frame."""
    split, frame = group.split, group.frame
    out_shape = graph.infos[node.outputs[0]].shape
    if lowered.split is not None:
        if (split is not None and split != lowered.split) or graph.infos[node.inputs[0]].shape != frame:
            return None
        split = lowered.split
    elif split is None and out_shape != frame and _broadcasts(frame, out_shape):
        frame = out_shape
    row = frame[:split] + (1,) * (len(frame) - split) if split is not None else frame
    allowed = {row, frame[:split]} if lowered.row_output else {row, frame}
    if out_shape not in allowed:
        return None
    names = _names(lowered)
    if split is not None and any(v in group.produced and graph.infos[v].shape not in (frame, row) for v in names):
        return None
    if split is not None and any(operand(v, graph.infos[v].shape, frame, split) is None
                                 for v in group.operands() + names if v not in group.produced):
        return None
    return split, frame


def _names(lowered: Lowered) -> list[str]:
    produced = {s.out for s in lowered.steps}
    return [a for s in lowered.steps for a in s.args if isinstance(a, str) and a not in produced]


def _readable(graph: Graph, group: _Group, k: int, outputs: list[str]) -> bool:
    """True when every array of the chain can be read and written at split k: each operand and
    intermediate full along the row or constant along it, each output full or one per row."""
    frame = group.frame
    row = frame[:k] + (1,) * (len(frame) - k)
    made = {s.out for s in group.steps if "~" not in s.out and graph.infos[s.out].shape != frame[:k]}
    return (all(operand(v, graph.infos[v].shape, frame, k) for v in group.operands() + sorted(made))
            and all(graph.infos[v].shape in (frame, row, frame[:k]) for v in outputs))


def _first_split(graph: Graph, group: _Group) -> int | None:
    """The smallest split every array of a chain without reductions can be read with."""
    outputs = _outputs(graph, group)
    return next((k for k in range(len(group.frame) + 1) if _readable(graph, group, k, outputs)), None)


def _ops(graph: Graph, group: _Group) -> int:
    """Operators in the chain, counting an activation an earlier pass fused into a node."""
    return sum(1 + (ACT in graph.nodes[i].attrs) for i in group.nodes)


ALONE = ("Softmax", "LayerNormalization", "Sigmoid")
"""Operators fused even alone: numpy takes several passes over their rows (Softmax, LayerNorm) or
elements (Sigmoid: negate, exp, add, reciprocal; dbnet's output map of 320 x 320 took 130-240 us
so in profiles at one and two threads, where ONNX Runtime takes about 30)."""


def find_chains(graph: Graph) -> list[_Group]:
    """The chains of two operators or more in `graph`, and the operators of ALONE on their own, each
    with its split settled."""
    producers = graph.producers()
    owner: dict[int, _Group] = {}
    groups: list[_Group] = []
    for i, node in enumerate(graph.nodes):
        lowered = lower_node(node, graph)
        if lowered is None:
            continue
        joined = None
        for v in node.inputs:
            group = owner.get(producers.get(v, -1))
            if group is None:
                continue
            outside = [u for u in node.inputs if u and u not in group.produced and u not in graph.constants]
            if any(producers.get(u, -1) >= group.nodes[0] for u in outside):
                continue
            fit = _fits(graph, group, node, lowered)
            if fit is not None:
                (group.split, group.frame), joined = fit, group
                break
        if joined is None:
            info = graph.infos[node.inputs[0] if lowered.split is not None else node.outputs[0]]
            joined = _Group([], tuple(info.shape), lowered.split)
            if _fits(graph, joined, node, lowered) is None:
                continue
            groups.append(joined)
        joined.nodes.append(i)
        joined.steps += lowered.steps
        joined.produced |= {s.out for s in lowered.steps}
        owner[i] = joined
    chains = [g for g in groups if _ops(graph, g) >= 2 or graph.nodes[g.nodes[0]].op_type in ALONE]
    for g in chains:
        if g.split is None:
            g.split = _first_split(graph, g)
        elif not _readable(graph, g, g.split, _outputs(graph, g)):
            g.split = None
    return [g for g in chains if g.split is not None]


def _outputs(graph: Graph, group: _Group) -> list[str]:
    """The values of the chain read after it (by other nodes, or as graph outputs)."""
    inside = set(group.nodes)
    read = {v for j, n in enumerate(graph.nodes) if j not in inside for v in n.inputs if v}
    made = [v for i in group.nodes for v in graph.nodes[i].outputs if v]
    return [v for v in made if v in read or v in graph.outputs]


def _label(graph: Graph, group: _Group) -> str:
    """The chain's ops in order, e.g. Add+Clip+Div+Mul (activations fused before included)."""
    nodes = [graph.nodes[i] for i in group.nodes]
    return "+".join(n.op_type + (f"+{n.attrs[ACT]}" if ACT in n.attrs else "") for n in nodes)


def _body(graph: Graph, group: _Group, inputs: list[str], outputs: list[str]) -> Graph:
    """The chain's original nodes as a sub-graph, with the constants they read that are not inputs."""
    nodes = [Node(n.op_type, list(n.inputs), list(n.outputs), dict(n.attrs), n.domain, n.name)
             for n in (graph.nodes[i] for i in group.nodes)]
    names = {v for n in nodes for v in n.inputs + n.outputs if v}
    infos = {v: TensorInfo(graph.infos[v].dtype, graph.infos[v].shape) for v in names if v in graph.infos}
    body = Graph(nodes, list(inputs), list(outputs), infos, {}, dict(graph.opsets), BODY)
    for v in sorted(names - set(inputs)):
        if v in graph.constants:
            body.add_constant(v, graph.constants[v])
    return body


@dataclass
class Fused:
    """One chain, ready to build and to put in the graph."""

    group: _Group
    chain: Chain
    node: Node

    @property
    def intermediate_bytes(self) -> int:
        """Bytes of the chain's values that no longer have a place in the plan."""
        return intermediate_bytes(self.node)


def _in_place_order(graph: Graph, chain: Chain) -> Chain:
    """The chain with output 0 one that an operand of its shape may share (the AutoFused kernel
    lets output 0 take input 0's buffer): a full output of the last loop, else a row output
    (written once per row, after its row's operands are read); that operand first."""
    late = last_written(chain)
    first = late[0] if late else next(n for n, full in chain.outputs if not full)
    outputs = sorted(chain.outputs, key=lambda o: o[0] != first)
    shape = graph.infos[first].shape
    inputs = sorted(chain.inputs, key=lambda op: graph.infos[op.name].shape != shape)
    return Chain(chain.symbol, chain.rows, chain.cols, tuple(inputs), chain.steps, tuple(outputs))


def _fused(graph: Graph, group: _Group, n: int) -> Fused:
    symbol = f"omrt_fused_{n}"
    frame, k = group.frame, group.split
    rows, cols = int(np.prod(frame[:k])), int(np.prod(frame[k:]))
    ops = tuple(operand(v, graph.infos[v].shape, frame, k) for v in group.operands())
    outs = tuple((v, graph.infos[v].shape == frame) for v in _outputs(graph, group))
    chain = _in_place_order(graph, Chain(symbol, rows, cols, ops, tuple(group.steps), outs))
    inputs, outputs = [op.name for op in chain.inputs], [name for name, _ in chain.outputs]
    spec = native_fused.guard([(graph.infos[v].dtype, graph.infos[v].shape) for v in inputs],
                              [(graph.infos[v].dtype, graph.infos[v].shape) for v in outputs])
    label = _label(graph, group)
    node = Node("AutoFused", inputs, outputs,
                {BODY: _body(graph, group, inputs, outputs), "kernel": symbol, "chain": label, "guard": spec},
                "omrt", f"fused{n}[{label}]")
    return Fused(group, chain, node)


def _rewrite(graph: Graph, fused: list[Fused]) -> None:
    """Each chain's nodes -> its fused node, standing where the chain began."""
    at = {f.group.nodes[0]: f.node for f in fused}
    drop = {i for f in fused for i in f.group.nodes[1:]}
    graph.nodes = [at.get(i, n) for i, n in enumerate(graph.nodes) if i not in drop]
    graph.opsets.setdefault("omrt", 1)
    remove_dead_code(graph)


def autofuse(graph: Graph, say: Callable[[str], None], compilers: Sequence[str] | None = None
             ) -> tuple[list[Packed], list[Fused]]:
    """Fuse the chains of `graph` in place and return the records of their kernels (kind 3), one
    per compiler (None: the host's), and the chains; when there are none, or the kernels cannot be
    built, the graph stays as it was."""
    fused = [_fused(graph, g, n) for n, g in enumerate(find_chains(graph))]
    if not fused:
        return [], []
    say(f"fusing {len(fused)} chains")
    chains, guards = [f.chain for f in fused], {f.chain.symbol: f.node.attrs["guard"] for f in fused}
    records = [build.build_fused(chains, guards, say, cc) for cc in compilers or [None]]
    if any(r is None for r in records):
        return [], []
    _rewrite(graph, fused)
    return records, fused
