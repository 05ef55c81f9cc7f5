"""Shape and value propagation: every value's dtype and shape, folding what is known ahead of time.

The compiler runs this with the model's (possibly symbolic) input shapes; the runtime runs it again
with concrete shapes when a new input signature arrives, which folds shape sub-graphs that depended
on symbolic dims. Folding executes the library's own kernels, so it needs only numpy.

Sub-graphs (If's branches, Loop's and Scan's bodies) are propagated through their node's kernel,
which knows what their inputs are, and run by `SubgraphRunner`, a small interpreter over the same
kernels. An If whose condition is known is replaced by the nodes of the branch it takes.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from ..errors import KernelError, OmrtError, ShapeError
from ..ir import CAPTURES, OPTIONAL, SEQUENCE, Graph, Node, TensorInfo, subgraphs
from ..kernels import OpContext, kernel_of
from ..kernels.base import Kernel, fresh_dim


@dataclass
class _Step:
    """One node of a sub-graph, with its kernel prepared once when all its infos are concrete."""

    node: Node
    cls: type[Kernel]
    ctx: OpContext
    kernel: Kernel | None = None
    ins: list[TensorInfo | None] | None = None
    outs: list[TensorInfo] | None = None
    workspace: int = 0

    def fits(self, values: Sequence[Any]) -> bool:
        """True when the prepared kernel may run on `values`: they have the planned shapes."""
        if self.kernel is None:
            return False
        return all(a is None if i is None else
                   isinstance(a, np.ndarray) and a.shape == i.shape and a.dtype == i.dtype
                   for a, i in zip(values, self.ins))


class SubgraphRunner:
    """A graph attribute of a node, inferred and run node by node with the library's kernels.

    Nodes whose shapes were all concrete when the sub-graph was propagated (a loop body over
    fixed-size tensors) get their kernel prepared once and reused for every iteration whose
    values have those shapes; the others are inferred and prepared each time they run. A runner
    may be shared by sessions running at once (it belongs to a prepared kernel): it keeps no
    per-run state.
    """

    def __init__(self, graph: Graph, captures: Sequence[str]) -> None:
        self.graph = graph
        self.captures = list(captures)
        self.inferred: Graph | None = None
        """The propagated copy made by the last `infer` (the compiler keeps it in the node)."""
        self._steps: list[_Step] | None = None

    def infer(self, inputs: Sequence[TensorInfo | None],
              captures: Sequence[TensorInfo | None]) -> list[TensorInfo]:
        g = self.graph
        infos = {o: g.infos[o] for o in g.outputs if o in g.infos}
        infos.update((name, info) for name, info in zip(self.captures, captures) if info is not None)
        infos.update((name, g.infos[name] if info is None else info) for name, info in zip(g.inputs, inputs))
        copy = Graph(list(g.nodes), list(g.inputs), list(g.outputs), infos, dict(g.constants), g.opsets,
                     g.name, g.custom)
        propagate(copy)
        self.inferred = copy
        return [copy.infos[o] for o in g.outputs]

    def _step(self, node: Node) -> _Step:
        g = self.graph
        cls = kernel_of(node, g)
        step = _Step(node, cls, context(node, g))
        names = [v for v in node.inputs + node.outputs if v]
        if step.cls.dynamic or not all(v in g.infos and g.infos[v].static for v in names):
            return step
        step.ins = [g.infos[v] if v else None for v in node.inputs]
        step.outs = step.cls.infer(step.ctx, step.ins)
        if all(o.static for o in step.outs):
            step.kernel = step.cls(step.ctx, step.ins, step.outs)
            step.workspace = step.kernel.workspace()
        return step

    def run(self, inputs: Sequence[Any], captures: Sequence[Any]) -> list[Any]:
        g = self.graph
        if self._steps is None:
            self._steps = [self._step(n) for n in g.nodes]
        env: dict[str, Any] = dict(g.constants)
        env.update(zip(self.captures, captures))
        env.update(zip(g.inputs, inputs))
        for step in self._steps:
            node, cls, ctx = step.node, step.cls, step.ctx
            vals = [env[v] if v else None for v in node.inputs]
            try:
                if step.fits(vals):
                    results = [np.empty(o.shape, o.dtype) for o in step.outs]
                    workspace = np.empty(step.workspace, np.uint8) if step.workspace else None
                    step.kernel.run(vals, results, workspace)
                else:
                    infos = [info_of(a, g.infos.get(v)) if v else None for v, a in zip(node.inputs, vals)]
                    results = execute(cls, ctx, vals, infos, infer_outputs(cls, ctx, infos))
            except OmrtError:
                raise
            except Exception as e:
                raise KernelError(f"kernel {node.op_type} failed at node {node.label!r} of sub-graph "
                                  f"{g.name!r}: {type(e).__name__}: {e}") from e
            env.update((v, r) for v, r in zip(node.outputs, results) if v)
        return [env[o] for o in g.outputs]


def context(node: Node, graph: Graph, native: Any = None) -> OpContext:
    """The OpContext a node's kernel sees (`native`: the model's loaded native library, if any)."""
    subs = subgraphs(node)
    captures = node.attrs.get(CAPTURES, [])
    runners = {key: SubgraphRunner(g, captures) for key, g in subs.items()}
    return OpContext(node.attrs, graph.opset(node.domain), node.label, node.op_type, len(node.outputs),
                     runners, len(captures), native)


def _passes_through(cls: type[Kernel], infos: Sequence[TensorInfo | None]) -> bool:
    """View ops (Identity) over a sequence or an optional hand on the value itself."""
    return cls.view and bool(infos) and infos[0] is not None and not infos[0].is_tensor


def infer_outputs(cls: type[Kernel], ctx: OpContext, inputs: Sequence[TensorInfo | None]) -> list[TensorInfo]:
    """The kernel's `infer`, except that view ops pass sequences and optionals through."""
    if _passes_through(cls, inputs):
        return [TensorInfo(inputs[0].dtype, inputs[0].shape, kind=inputs[0].kind)]
    return cls.infer(ctx, inputs)


def execute(cls: type[Kernel], ctx: OpContext, arrays: Sequence[Any],
            infos: Sequence[TensorInfo | None], outs: Sequence[TensorInfo]) -> list[Any]:
    """Run one kernel on concrete values with freshly allocated outputs (folding, dynamic tasks)."""
    if _passes_through(cls, infos):
        return [arrays[0]]
    kernel = cls(ctx, infos, outs)
    nbytes = kernel.workspace()
    workspace = np.empty(nbytes, np.uint8) if nbytes else None
    if cls.dynamic or not all(o.static for o in outs):
        return list(kernel.run(list(arrays), [None] * len(outs), workspace))
    results = [np.empty(o.shape, o.dtype) for o in outs]
    kernel.run(list(arrays), results, workspace)
    return results


def info_of(value: Any, declared: TensorInfo | None) -> TensorInfo:
    """The info of a run-time value: an array, a list (sequence) or None (empty optional).

    `declared` (the plan's info of the value) says whether it is an optional and gives the type
    of values that carry none (empty optionals and sequences).
    """
    if value is None:
        if declared is not None:
            return TensorInfo(declared.dtype, declared.shape, kind=declared.kind)
        return TensorInfo(np.dtype(np.float32), (), kind=OPTIONAL)
    if isinstance(value, list):
        elems = [info_of(v, None) for v in value]
        if elems:
            ranks = {e.rank for e in elems}
            shape = (tuple(d if all(e.shape[i] == d for e in elems) else None
                           for i, d in enumerate(elems[0].shape)) if len(ranks) == 1 else ())
            info = TensorInfo(elems[0].dtype, shape, value, SEQUENCE)
        elif declared is not None:
            inner = declared.element() if declared.container == OPTIONAL else declared
            info = TensorInfo(inner.dtype, inner.shape, value, SEQUENCE)
        else:
            info = TensorInfo(np.dtype(np.float32), (), value, SEQUENCE)
    else:
        info = TensorInfo(value.dtype, value.shape, value)
    if declared is not None and declared.container == OPTIONAL:
        return TensorInfo(info.dtype, info.shape, value, f"{OPTIONAL}.{info.kind}" if not info.is_tensor
                          else OPTIONAL)
    return info


def _name_unknown(info: TensorInfo, value: str) -> TensorInfo:
    if info.shape is None or all(d is not None for d in info.shape):
        return info
    shape = tuple(fresh_dim(value) if d is None else d for d in info.shape)
    return TensorInfo(info.dtype, shape, kind=info.kind)


def _inline_branch(graph: Graph, node: Node, cond: bool, pending: Sequence[Node]) -> list[Node]:
    """The nodes of the If branch taken, renamed into `graph`; its constants join the graph's."""
    branch = node.attrs["then_branch" if cond else "else_branch"]
    captured = node.attrs.get(CAPTURES, [])
    rename = dict(zip(captured, node.inputs[len(node.inputs) - len(captured):]))
    defined = list(branch.constants) + [o for n in branch.nodes for o in n.outputs if o]
    extra: list[Node] = []
    for inner, outer in zip(branch.outputs, node.outputs):
        if not outer:
            continue
        if inner in defined and inner not in rename:
            rename[inner] = outer
        else:
            source = rename.get(inner, inner)
            extra.append(Node("Identity", [source], [outer], {}, "", f"{node.label}/{outer}"))
    used = set(graph.infos) | {o for n in pending for o in n.outputs}
    for v in defined:
        if v not in rename and v in used:
            rename[v] = f"{v}__{node.label}"
    for name, arr in branch.constants.items():
        graph.add_constant(rename.get(name, name), arr)
    nodes = [Node(n.op_type, [rename.get(v, v) for v in n.inputs], [rename.get(v, v) for v in n.outputs],
                  n.attrs, n.domain, n.name) for n in branch.nodes]
    return nodes + extra


def propagate(graph: Graph, fold: bool = True, fold_limit: int = 1 << 31) -> Graph:
    """Infer every value's info in place; with `fold`, replace nodes whose inputs are all known.

    `graph.infos` must hold the graph inputs' infos. Folded outputs become constants unless they
    exceed `fold_limit` bytes. Nodes with sub-graphs are never folded, except an If whose condition
    is known, which becomes its branch. A node with sub-graphs is replaced by a copy holding the
    propagated sub-graphs (the originals stay as they are: the runtime propagates again for every
    input signature). Returns the graph for chaining.
    """
    infos = graph.infos
    for name, arr in graph.constants.items():
        infos[name] = TensorInfo.of(arr)
    kept: list[Node] = []
    queue = deque(graph.nodes)
    while queue:
        node = queue.popleft()
        ins = _input_infos(node, infos)
        if (fold and node.op_type == "If" and not node.domain and ins[0] is not None
                and ins[0].value is not None and ins[0].value.size == 1):
            queue.extendleft(reversed(_inline_branch(graph, node, bool(ins[0].value.reshape(-1)[0]), queue)))
            continue
        cls = kernel_of(node, graph)
        ctx = context(node, graph)
        outs = _infer_node(node, cls, ctx, ins)
        inferred = {k: s.inferred for k, s in ctx.subgraphs.items() if s.inferred is not None}
        if inferred:
            node = Node(node.op_type, list(node.inputs), list(node.outputs), {**node.attrs, **inferred},
                        node.domain, node.name)
        if _fold_node(graph, node, cls, ctx, ins, outs, fold, fold_limit):
            continue
        for name, info in zip(node.outputs, outs):
            if name and (info.shape is not None or name not in infos):
                infos[name] = _name_unknown(info, name)
        kept.append(node)
    graph.nodes = kept
    return graph


def _input_infos(node: Node, infos: dict[str, TensorInfo]) -> list[TensorInfo | None]:
    """The infos of a node's inputs (None for absent optional ones)."""
    ins: list[TensorInfo | None] = []
    for v in node.inputs:
        if not v:
            ins.append(None)
        elif v not in infos:
            raise ShapeError(f"node {node.label!r} reads {v!r}, which no earlier node or graph "
                             f"input defines; the graph must be topologically sorted")
        else:
            ins.append(infos[v])
    return ins


def _infer_node(node: Node, cls: type[Kernel], ctx: OpContext,
                ins: list[TensorInfo | None]) -> list[TensorInfo]:
    """The node's output infos; unknown (shape None) when an input's rank is unknown and the
    kernel's rule cannot do without it."""
    try:
        return infer_outputs(cls, ctx, ins)
    except Exception as e:
        if any(i is not None and i.shape is None for i in ins):
            dtype = next(i.dtype for i in ins if i is not None)
            return [TensorInfo(dtype, None)] * len(node.outputs)
        if isinstance(e, OmrtError):
            raise
        # a kernel's shape rule tripped on input it does not accept
        got = [(i.dtype.name, i.shape) if i else None for i in ins]
        raise ShapeError(f"node {node.label!r} ({node.op_type}): shape inference failed for "
                         f"inputs {got}: {e}") from e


def _fold_node(graph: Graph, node: Node, cls: type[Kernel], ctx: OpContext, ins: list[TensorInfo | None],
               outs: list[TensorInfo], fold: bool, fold_limit: int) -> bool:
    """Make the node's outputs constants when they are known (True), else leave it (False)."""
    known = all(i is None or i.value is not None for i in ins)
    foldable = (fold and known and cls.deterministic and not ctx.subgraphs
                and all(o.is_tensor for o in outs))
    if foldable and all(o.static for o in outs) and sum(o.nbytes for o in outs) > fold_limit:
        foldable = False
    if not foldable and not all(o.value is not None and o.is_tensor for o in outs):
        return False
    values = ([o.value for o in outs] if not foldable
              else execute(cls, ctx, [None if i is None else i.value for i in ins], ins, outs))
    for name, val in zip(node.outputs, values):
        if name:
            graph.add_constant(name, val)
    return True


def specialize(graph: Graph, shapes: Mapping[str, Sequence[int]]) -> Graph:
    """A copy of `graph` with these concrete input shapes, propagated and folded again: what
    the shape sub-graphs that depended on symbolic dims become for one input signature."""
    infos = {v: graph.infos[v] for v in graph.outputs}
    infos.update((v, TensorInfo(graph.infos[v].dtype, tuple(int(d) for d in shapes[v])) if v in shapes
                  else graph.infos[v]) for v in graph.inputs)
    copy = Graph(list(graph.nodes), list(graph.inputs), list(graph.outputs), infos, dict(graph.constants),
                 dict(graph.opsets), graph.name, graph.custom)
    return propagate(copy, fold=True)
