"""The executor: a prepared program laid over one arena, as a list of instructions to run in order.

Two kinds of instruction (after ExecuTorch's `Method`, whose `execute()` is a loop over explicit
instruction kinds):

- `Call`: a kernel prepared at load with the plan's shapes, run on fixed arguments (views into
  the arena, the weights, or the current buffers of graph inputs and outputs).
- `LateCall`: a node downstream of a data-dependent shape (NonZero, a loop's output, a sequence):
  inferred, prepared and run on the values it finds when it runs; its outputs are kept by name,
  never planned.

The executor also owns address refresh: for each graph input and output it records every argument
slot that refers to it (the seed's `outside_addrs_`), so pointing a tensor at a new buffer touches
only those slots.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from ..errors import KernelError, OmrtError
from ..ir import Node
from ..kernels import OpContext, lookup
from ..kernels.base import Kernel
from ..plan import ARENA, INPUT, OUTPUT, WEIGHT, Task
from ..plan.infer import context, execute, infer_outputs, info_of
from .prepare import Prepared

Slot = tuple[list, int, int, tuple]
"""An argument slot: (argument list, position in it, and where the value lies in its I/O tensor:
the element it starts at and its shape)."""


def part(buffer: np.ndarray, start: int, shape: tuple) -> np.ndarray:
    """The value of `shape` that starts at element `start` of a C-contiguous I/O buffer: a view
    (a graph output a kernel writes in parts, an input read through a view of it)."""
    flat = buffer.reshape(-1)
    return flat[start:start + math.prod(shape)].reshape(shape)


def call_kernel(kernel: Kernel, op_type: str, label: str, inputs: list, outputs: list,
                workspace: np.ndarray | None) -> None:
    """kernel.run, with any failure that is not already an OmrtError made a KernelError naming the node."""
    try:
        kernel.run(inputs, outputs, workspace)
    except OmrtError:
        raise
    except Exception as e:
        raise KernelError(f"kernel {op_type} failed at node {label!r}: {type(e).__name__}: {e}") from e


@dataclass
class Call:
    """A kernel prepared with the plan's shapes, and the arrays it runs on."""

    node: Node
    kernel: Kernel
    inputs: list[np.ndarray | None]
    outputs: list[np.ndarray | None]
    workspace: np.ndarray | None

    def execute(self, values: dict[str, Any], executor: "Executor") -> None:
        call_kernel(self.kernel, self.node.op_type, self.node.label, self.inputs, self.outputs, self.workspace)


@dataclass
class LateCall:
    """A node run on the values it finds: those computed at run time (by name in `values`), else
    its planned arguments."""

    node: Node
    task: Task
    cls: type[Kernel]
    ctx: OpContext
    inputs: list[np.ndarray | None]
    graph_infos: Mapping[str, Any]

    def execute(self, values: dict[str, Any], executor: "Executor") -> None:
        task = self.task
        found = [values.get(v, a) if v else None for v, a in zip(task.inputs, self.inputs)]
        infos = [info_of(a, self.graph_infos.get(v)) if v else None for v, a in zip(task.inputs, found)]
        results = execute(self.cls, self.ctx, found, infos, infer_outputs(self.cls, self.ctx, infos))
        for v, r in zip(task.outputs, results):
            if v:
                values[v] = executor.detach(r)


Instruction = Call | LateCall


class Executor:
    """A prepared program over an arena: its instructions, and the slots of its graph I/O."""

    def __init__(self, prep: Prepared, arena: np.ndarray) -> None:
        self.prep = prep
        self.arena = arena
        self.arrays = self._lay_out(prep, arena)
        self.slots: dict[str, list[Slot]] = {}
        self.targets: dict[str, np.ndarray] = {}
        """The buffer each graph input and output currently points at."""
        self.instructions: list[Instruction] = [self._instruction(t, task)
                                                for t, task in enumerate(prep.program.tasks)]

    @staticmethod
    def _lay_out(prep: Prepared, arena: np.ndarray) -> dict[str, np.ndarray]:
        """Arrays over the arena and the weights for every planned value that lives there."""
        graph, arrays = prep.graph, {}
        for v, place in prep.program.places.items():
            info = prep.info(v) if v not in graph.constants else graph.infos[v]
            if place.region == ARENA:
                arrays[v] = arena[place.offset:place.offset + info.nbytes].view(info.dtype).reshape(info.shape)
            elif place.region == WEIGHT:
                arrays[v] = graph.constants[place.key].reshape(info.shape)
        return arrays

    def _arguments(self, names: list[str]) -> list[np.ndarray | None]:
        """The planned arrays for `names`, recording the slots of graph inputs and outputs."""
        args = [self.arrays.get(v) if v else None for v in names]
        for pos, v in enumerate(names):
            where = self._io_part(v) if v else None
            if where is not None:
                key, start, shape = where
                self.slots.setdefault(key, []).append((args, pos, start, shape))
        return args

    def _io_part(self, value: str) -> tuple[str, int, tuple] | None:
        """(I/O tensor, first element, shape) of a value planned inside a graph input or output."""
        program = self.prep.program
        place = program.places.get(value)
        if place is None or place.region not in (INPUT, OUTPUT):
            return None
        start = (place.offset - program.io_offsets[place.key]) // self.prep.graph.infos[place.key].dtype.itemsize
        return place.key, start, tuple(program.shapes[value])

    def _instruction(self, t: int, task: Task) -> Instruction:
        prep = self.prep
        node = prep.graph.nodes[task.node]
        inputs = self._arguments(task.inputs)
        kernel = prep.kernels[t]
        if kernel is None:
            graph = prep.graph
            cls = lookup(node.op_type, graph.opset(node.domain), node.domain, node.label)
            return LateCall(node, task, cls, context(node, graph, prep.native), inputs, graph.infos)
        outputs = self._arguments(task.outputs)
        start = task.workspace_offset
        workspace = self.arena[start:start + task.workspace_size] if task.workspace_size else None
        return Call(node, kernel, inputs, outputs, workspace)

    def point(self, name: str, buffer: np.ndarray) -> None:
        """Address refresh: re-point every argument slot that refers to graph I/O tensor `name`."""
        if self.targets.get(name) is buffer:
            return
        for args, pos, start, shape in self.slots.get(name, ()):
            args[pos] = part(buffer, start, shape)
        self.targets[name] = buffer

    def forget(self, name: str) -> None:
        """Let go of the buffer `name` points at: its slots hold nothing until the next run
        re-points them (an unbound buffer is no longer referenced, and its memory can close)."""
        self.targets.pop(name, None)
        for args, pos, _, _ in self.slots.get(name, ()):
            args[pos] = None

    def value(self, name: str) -> np.ndarray:
        """The array holding planned value `name` now (arena, weights, or an I/O tensor's buffer)."""
        where = self._io_part(name)
        if where is not None:
            key, start, shape = where
            return part(self.targets[key], start, shape)
        return self.arrays[name]

    def detach(self, value: Any) -> Any:
        """`value` with every array that lies in the arena copied out: a run-time value may outlive
        the arena block of the input it came from (an If returning a captured tensor, a sequence
        holding one)."""
        if isinstance(value, list):
            return [self.detach(v) for v in value]
        if isinstance(value, np.ndarray) and value.nbytes and self.arena.nbytes:
            lo = self.arena.ctypes.data
            if lo <= value.ctypes.data < lo + self.arena.nbytes:
                return value.copy()
        return value

    def run(self, values: Mapping[str, Any], timings: Counter | None = None) -> dict[str, Any]:
        """Run every instruction in order; returns the run-time values by name (`values`, the
        sequence and optional inputs, included). `timings` adds each op type's wall time."""
        found: dict[str, Any] = dict(values)
        if timings is None:
            for step in self.instructions:
                step.execute(found, self)
            return found
        for step in self.instructions:
            t0 = time.perf_counter()
            try:
                step.execute(found, self)
            finally:
                timings[step.node.op_type] += time.perf_counter() - t0
        return found
