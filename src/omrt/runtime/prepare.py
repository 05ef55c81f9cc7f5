"""What a loaded model makes of a program before any session runs it: a kernel per task.

Shared by `Model` (which prepares and caches programs) and `Session` (which runs them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import FormatError
from ..ir import Graph, Shape, TensorInfo
from ..kernels import lookup
from ..kernels.base import Kernel
from ..plan import DYNAMIC, Program
from ..plan.infer import context


@dataclass(frozen=True)
class IOSpec:
    """A model input or output: name, dtype and shape (symbolic dims are strings).

    `kind` is "tensor" for arrays; "sequence" values are lists of arrays of `dtype`, "optional"
    ones None or their element (see `omrt.ir.TensorInfo`); their shape is the elements', empty
    when not even its rank is known.
    """

    name: str
    dtype: np.dtype
    shape: Shape
    kind: str = "tensor"


@dataclass
class Prepared:
    """A program with a kernel instance per task (None for tasks prepared at run time)."""

    program: Program
    graph: Graph
    kernels: list[Kernel | None]
    native: Any = None
    """The model's loaded native library, handed to kernels prepared at run time too."""

    def info(self, value: str) -> TensorInfo:
        """The dtype and planned shape of `value`."""
        shape = self.program.shapes[value]
        return TensorInfo(self.graph.infos[value].dtype, None if shape is None else tuple(shape))


def _runs_late(program: Program, outputs: list[str]) -> bool:
    return any(program.places.get(v) is not None and program.places[v].region == DYNAMIC
               for v in outputs if v)


def prepare(graph: Graph, program: Program, native: Any = None) -> Prepared:
    """Instantiate every task's kernel with the program's concrete shapes (and the model's native
    library, when it has a trusted one)."""
    kernels: list[Kernel | None] = []
    for task in program.tasks:
        if _runs_late(program, task.outputs):
            kernels.append(None)
            continue
        node = graph.nodes[task.node]
        cls = lookup(node.op_type, graph.opset(node.domain), node.domain, node.label)
        ins = [None if not v else (graph.infos[v] if v in graph.constants
                                   else TensorInfo(graph.infos[v].dtype, tuple(program.shapes[v])))
               for v in task.inputs]
        outs = [TensorInfo(graph.infos[v].dtype, tuple(program.shapes[v])) if v in program.shapes
                else None for v in task.outputs]
        kernel = cls(context(node, graph, native), ins, outs)
        if not kernel.fit_workspace(task.workspace_size):
            raise FormatError(f"node {node.label!r} ({node.op_type}) needs {kernel.workspace()} bytes of "
                              f"workspace but the plan in the file gives {task.workspace_size}: the model "
                              f"was compiled by an omrt with other kernels; recompile it with this one")
        kernels.append(kernel)
    return Prepared(program, graph, kernels, native)
