"""What a loaded model makes of a program before any session runs it: a kernel per task.

Shared by `Model` (which prepares and caches programs) and `Session` (which runs them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable

import numpy as np

from ..errors import FormatError
from ..ir import Graph, Shape, TensorInfo
from ..kernels import kernel_of
from ..kernels.base import Kernel
from ..plan import DYNAMIC, Program, Task
from ..plan.infer import context
from ..plan.stream import MIN_STREAMED, StreamPlan, plan_stream, verify_stream


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
    stream: StreamPlan | None = None
    """Under a weight budget: the weights that stay resident and the slot schedule of the others."""

    @property
    def streamed(self) -> frozenset[str]:
        """The weights that stream through slots (their kernels were prepared without values)."""
        return frozenset(f.key for f in self.stream.fills) if self.stream else frozenset()

    def info(self, value: str) -> TensorInfo:
        """The dtype and planned shape of `value`."""
        shape = self.program.shapes[value]
        return TensorInfo(self.graph.infos[value].dtype, None if shape is None else tuple(shape))


def _runs_late(program: Program, outputs: list[str]) -> bool:
    return any(program.places.get(v) is not None and program.places[v].region == DYNAMIC
               for v in outputs if v)


def kernel_for(graph: Graph, program: Program, task: Task, native: Any = None,
               opaque: frozenset[str] = frozenset()) -> Kernel:
    """The task's kernel with the program's concrete shapes. Weights in `opaque` are handed over
    without their values: they may change under the kernel (streamed, or swapped by the caller),
    so it must not precompute from them, nor read their mapped pages."""
    node = graph.nodes[task.node]
    cls = kernel_of(node, graph)
    ins = []
    for v in task.inputs:
        if not v:
            ins.append(None)
        elif v in graph.constants:
            info = graph.infos[v]
            ins.append(TensorInfo(info.dtype, info.shape) if v in opaque else info)
        else:
            ins.append(TensorInfo(graph.infos[v].dtype, tuple(program.shapes[v])))
    outs = [TensorInfo(graph.infos[v].dtype, tuple(program.shapes[v])) if v in program.shapes else None
            for v in task.outputs]
    return cls(context(node, graph, native), ins, outs)


def _unread(graph: Graph, program: Program, native: Any, movable: frozenset[str]) -> frozenset[tuple[int, int]]:
    """(task, input position) pairs the tasks' kernels never read: of a weight and what the
    compiler derived from it, a kernel reads one (see Kernel.unread_inputs). The weights that may
    stream are handed over without their values, so that asking pages none of them in."""
    return frozenset((t, i) for t, task in enumerate(program.tasks) if not _runs_late(program, task.outputs)
                     for i in kernel_for(graph, program, task, native, movable).unread_inputs())


def prepare(graph: Graph, program: Program, native: Any = None, weight_budget: int | None = None,
            hold_resident: Callable[[Graph, Iterable[str]], None] | None = None) -> Prepared:
    """Instantiate every task's kernel with the program's concrete shapes (and the model's native
    library, when it has a trusted one); under a weight budget, plan which weights stream, and let
    `hold_resident` place the ones that stay before any kernel reads them."""
    stream = None
    if weight_budget is not None:
        sizes = {k: a.nbytes for k, a in graph.constants.items() if a.dtype != object}
        unread = _unread(graph, program, native, frozenset(k for k, n in sizes.items() if n >= MIN_STREAMED))
        stream = plan_stream(program, sizes, weight_budget, unread)
        verify_stream(stream, program, sizes)
        if hold_resident is not None:
            hold_resident(graph, stream.resident)
    prep = Prepared(program, graph, [], native, stream)
    for task in program.tasks:
        if _runs_late(program, task.outputs):
            prep.kernels.append(None)
            continue
        kernel = kernel_for(graph, program, task, native, prep.streamed)
        if not kernel.fit_workspace(task.workspace_size):
            node = graph.nodes[task.node]
            raise FormatError(f"node {node.label!r} ({node.op_type}) needs {kernel.workspace()} bytes of "
                              f"workspace but the plan in the file gives {task.workspace_size}: the model "
                              f"was compiled by an omrt with other kernels; recompile it with this one")
        prep.kernels.append(kernel)
    return prep
