"""Shape and value propagation: every value's dtype and shape, folding what is known ahead of time.

The compiler runs this with the model's (possibly symbolic) input shapes; the runtime runs it again
with concrete shapes when a new input signature arrives, which folds shape sub-graphs that depended
on symbolic dims. Folding executes the library's own kernels, so it needs only numpy.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from .errors import OmrtError, ShapeError
from .ir import Graph, Node, TensorInfo
from .kernels import OpContext, lookup
from .kernels.base import Kernel, fresh_dim


def context(node: Node, graph: Graph) -> OpContext:
    """The OpContext a node's kernel sees."""
    return OpContext(node.attrs, graph.opset(node.domain), node.label, node.op_type, len(node.outputs))


def execute(cls: type[Kernel], ctx: OpContext, arrays: Sequence[np.ndarray | None],
            infos: Sequence[TensorInfo | None], outs: Sequence[TensorInfo]) -> list[np.ndarray]:
    """Run one kernel on concrete arrays with freshly allocated outputs (folding, dynamic tasks)."""
    kernel = cls(ctx, infos, outs)
    nws = kernel.workspace()
    ws = np.empty(nws, np.uint8) if nws else None
    if cls.dynamic:
        return list(kernel.run(list(arrays), [None] * len(outs), ws))
    results = [np.empty(o.shape, o.dtype) for o in outs]
    kernel.run(list(arrays), results, ws)
    return results


def _name_unknown(info: TensorInfo, value: str) -> TensorInfo:
    if all(d is not None for d in info.shape):
        return info
    shape = tuple(fresh_dim(value) if d is None else d for d in info.shape)
    return TensorInfo(info.dtype, shape)


def propagate(graph: Graph, fold: bool = True, fold_limit: int = 1 << 31) -> Graph:
    """Infer every value's info in place; with `fold`, replace nodes whose inputs are all known.

    `graph.infos` must hold the graph inputs' infos. Folded outputs become constants unless they
    exceed `fold_limit` bytes. Returns the graph for chaining.
    """
    infos = graph.infos
    for name, arr in graph.constants.items():
        infos[name] = TensorInfo.of(arr)
    kept: list[Node] = []
    for node in graph.nodes:
        cls = lookup(node.op_type, graph.opset(node.domain), node.domain, node.label)
        ctx = context(node, graph)
        ins: list[TensorInfo | None] = []
        for v in node.inputs:
            if not v:
                ins.append(None)
            elif v not in infos:
                raise ShapeError(f"node {node.label!r} reads {v!r}, which no earlier node or graph "
                                 f"input defines; the graph must be topologically sorted")
            else:
                ins.append(infos[v])
        try:
            outs = cls.infer(ctx, ins)
        except OmrtError:
            raise
        except Exception as e:  # a kernel's shape rule tripped on input it does not accept
            raise ShapeError(f"node {node.label!r} ({node.op_type}): shape inference failed for inputs "
                             f"{[(i.dtype.name, i.shape) if i else None for i in ins]}: {e}") from e
        known = all(i is None or i.value is not None for i in ins)
        foldable = fold and known and cls.deterministic and node.op_type not in ("If", "Loop", "Scan")
        if foldable and all(o.static for o in outs) and sum(o.nbytes for o in outs) > fold_limit:
            foldable = False
        if foldable or all(o.value is not None for o in outs):
            values = ([o.value for o in outs] if not foldable
                      else execute(cls, ctx, [None if i is None else i.value for i in ins], ins, outs))
            for name, val in zip(node.outputs, values):
                if name:
                    graph.add_constant(name, val)
            continue
        for name, info in zip(node.outputs, outs):
            if name:
                infos[name] = _name_unknown(info, name)
        kept.append(node)
    graph.nodes = kept
    return graph
