"""The executor: a prepared program laid over one arena, as a list of instructions to run in order.

Two kinds of instruction (after ExecuTorch's `Method`, whose `execute()` is a loop over explicit
instruction kinds):

- `Call`: a kernel prepared at load with the plan's shapes, run on fixed arguments (views into
  the arena, the weights, or the current buffers of graph inputs and outputs).
- `LateCall`: a node downstream of a data-dependent shape (NonZero, a loop's output, a sequence):
  inferred, prepared and run on the values it finds when it runs; its outputs are kept by name,
  never planned.

A Call whose kernel's run is native calls only binds them (`Kernel.bind`): their arguments are
checked once, and again only when one of its arrays or the thread count changes. Consecutive
such Calls run as one `Batch`, a list of calls C walks in one call from Python.

The executor also owns address refresh: for each graph input and output it records every argument
slot that refers to it (the seed's `outside_addrs_`), so pointing a tensor at a new buffer touches
only those slots.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from ..errors import BindError, KernelError, OmrtError
from ..ir import Node
from ..kernels import OpContext, kernel_of
from ..kernels.base import Kernel
from ..kernels.fused import is_fused
from ..kernels.parallel import get_num_threads
from ..native.bindings import RUN_CALLS
from ..native.library import Bound, Checked
from ..native.signature import address
from ..plan import ARENA, INPUT, OUTPUT, WEIGHT, Task
from ..plan.infer import context, execute, infer_outputs, info_of
from .prepare import Prepared, kernel_for
from .profile import Tally
from .stream import WeightStream

Slot = tuple[list, int, int, tuple]
"""An argument slot: (argument list, position in it, and where the value lies in its I/O tensor:
the element it starts at and its shape)."""


def part(buffer: np.ndarray, start: int, shape: tuple) -> np.ndarray:
    """The value of `shape` that starts at element `start` of a C-contiguous I/O buffer: a view
    (a graph output a kernel writes in parts, an input read through a view of it)."""
    flat = buffer.reshape(-1)
    return flat[start:start + math.prod(shape)].reshape(shape)


def call_kernel(kernel: Kernel, op_type: str, label: str, inputs: list, outputs: list,
                workspace: np.ndarray | None, method: str = "run") -> Any:
    """kernel.run (or another method of the same arguments, `bind`), with any failure that is not
    already an OmrtError made a KernelError naming the node."""
    try:
        return getattr(kernel, method)(inputs, outputs, workspace)
    except OmrtError:
        raise
    except Exception as e:
        raise KernelError(f"kernel {op_type} failed at node {label!r}: {type(e).__name__}: {e}") from e


def profile_key(node: Node, by: str = "op") -> str:
    """What a profile adds a node's time to: by op, its op type, or a fused chain's own name (each
    is a generated kernel of its own, e.g. `fused3[HardSigmoid+Mul]`); by node, its name (`Node.label`)."""
    if by == "node":
        return node.label
    return node.name if is_fused(node) else node.op_type


@dataclass
class Call:
    """A kernel prepared with the plan's shapes, and the arrays it runs on."""

    node: Node
    task: Task
    kernel: Kernel
    inputs: list[np.ndarray | None]
    outputs: list[np.ndarray | None]
    workspace: np.ndarray | None
    opaque: frozenset[str] = frozenset()
    """Weights this kernel was prepared without the values of (they may change under it)."""
    bound: list[Checked] | None = None
    """The native calls that make a run of the kernel on these arrays (`Kernel.bind`), checked;
    None: a run goes through `kernel.run`."""

    def execute(self, values: dict[str, Any], executor: "Executor") -> None:
        if self.bound is None:
            call_kernel(self.kernel, self.node.op_type, self.node.label, self.inputs, self.outputs, self.workspace)
            return
        for call in self.bound:
            call()

    def bind(self) -> list[Checked] | None:
        """What `bound` is for the arrays the call holds now."""
        return call_kernel(self.kernel, self.node.op_type, self.node.label, self.inputs, self.outputs,
                           self.workspace, "bind")


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


@dataclass
class Batch:
    """Consecutive Calls made of native calls only, run by one call from Python (omrt_run_calls):
    through ctypes, each call of a layer costs 4-8 us of argument conversion, as much as a small
    layer's work."""

    calls: list[Call]
    table: np.ndarray
    """(thunk, argument vector) address pairs of the calls' checked native calls, in order."""
    runner: Checked
    counts: list[tuple[Bound, int]]
    """How many of the calls each function makes (its `calls` count grows by that each run)."""

    @classmethod
    def of(cls, calls: list[Call], run_calls: Bound) -> "Batch":
        checked = [c for call in calls for c in call.bound]
        table = np.array([(c.bound.thunk, address(c.vector)) for c in checked], np.int64).reshape(-1)
        counts = list(Counter(c.bound for c in checked).items())
        return cls(calls, table, run_calls.bind(table, len(checked)), counts)

    def execute(self, values: dict[str, Any], executor: "Executor") -> None:
        self.runner()
        for bound, n in self.counts:
            bound.calls += n


Instruction = Call | LateCall


def _take(old: list[Checked] | None, new: list[Checked] | None) -> bool:
    """Whether `old` stands for `new` as it is (both None: the call still runs through its
    kernel) or after taking its arguments in place (calls of the same functions)."""
    if old is None and new is None:
        return True
    if old is None or new is None or len(old) != len(new) or any(o.bound is not n.bound for o, n in zip(old, new)):
        return False
    for o, n in zip(old, new):
        o.take(n)
    return True


class Executor:
    """A prepared program over an arena: its instructions, and the slots of its graph I/O."""

    def __init__(self, prep: Prepared, arena: np.ndarray, stream: WeightStream | None = None) -> None:
        self.prep = prep
        self.arena = arena
        self.stream = stream
        self.arrays = self._lay_out(prep, arena, stream)
        self.slots: dict[str, list[Slot]] = {}
        """Argument slots of each graph input and output, and of each weight (for swaps)."""
        self.targets: dict[str, np.ndarray] = {}
        """The buffer each graph input and output currently points at."""
        self.instructions: list[Instruction] = [self._instruction(t, task)
                                                for t, task in enumerate(prep.program.tasks)]
        self._holders = self._slot_holders()
        self._stale: set[int] = set()
        """Calls to bind again before the next run: one of their arrays changed."""
        self._threads = 0
        """The thread count the calls were bound for (each call's split depends on it); 0 binds
        every Call at the first run."""
        self._run_calls = prep.native.get(RUN_CALLS) if prep.native is not None else None
        self._steps: list[Instruction | Batch] | None = None
        """The instructions with each run of consecutive batchable Calls as one Batch."""

    @staticmethod
    def _lay_out(prep: Prepared, arena: np.ndarray, stream: WeightStream | None) -> dict[str, np.ndarray]:
        """Arrays over the arena, the weights and the weight slots for every planned value."""
        graph, arrays = prep.graph, {}
        streamed = stream.views if stream is not None else {}
        for v, place in prep.program.places.items():
            info = prep.info(v) if v not in graph.constants else graph.infos[v]
            if place.region == ARENA:
                arrays[v] = arena[place.offset:place.offset + info.nbytes].view(info.dtype).reshape(info.shape)
            elif place.region == WEIGHT:
                weight = streamed.get(place.key, graph.constants[place.key])
                arrays[v] = weight.reshape(info.shape)
        return arrays

    def _arguments(self, names: list[str]) -> list[np.ndarray | None]:
        """The planned arrays for `names`, recording the slots of graph inputs and outputs."""
        args = [self.arrays.get(v) if v else None for v in names]
        for pos, v in enumerate(names):
            where = self._slot_of(v) if v else None
            if where is not None:
                key, start, shape = where
                self.slots.setdefault(key, []).append((args, pos, start, shape))
        return args

    def _slot_of(self, value: str) -> tuple[str, int, tuple] | None:
        """(I/O tensor or weight, first element, shape) of a value planned inside a graph input,
        output or weight: the slots that re-pointing that tensor updates."""
        program = self.prep.program
        place = program.places.get(value)
        if place is None or place.region not in (INPUT, OUTPUT, WEIGHT):
            return None
        if place.region == WEIGHT:
            return place.key, 0, tuple(program.shapes[value])
        start = (place.offset - program.io_offsets[place.key]) // self.prep.graph.infos[place.key].dtype.itemsize
        return place.key, start, tuple(program.shapes[value])

    def _instruction(self, t: int, task: Task) -> Instruction:
        prep = self.prep
        node = prep.graph.nodes[task.node]
        inputs = self._arguments(task.inputs)
        kernel = prep.kernels[t]
        if kernel is None:
            graph = prep.graph
            cls = kernel_of(node, graph)
            return LateCall(node, task, cls, context(node, graph, prep.native), inputs, graph.infos)
        outputs = self._arguments(task.outputs)
        start = task.workspace_offset
        workspace = self.arena[start:start + task.workspace_size] if task.workspace_size else None
        return Call(node, task, kernel, inputs, outputs, workspace, prep.streamed)

    def _slot_holders(self) -> dict[str, list[int]]:
        """For each graph input, output and weight with slots: the Calls holding one."""
        holders: dict[str, list[int]] = {}
        for t, step in enumerate(self.instructions):
            if isinstance(step, Call):
                for v in {*step.task.inputs, *step.task.outputs} - {""}:
                    where = self._slot_of(v)
                    if where is not None:
                        holders.setdefault(where[0], []).append(t)
        return holders

    def point(self, name: str, buffer: np.ndarray) -> None:
        """Address refresh: re-point every argument slot that refers to graph I/O tensor `name`."""
        if self.targets.get(name) is buffer:
            return
        for args, pos, start, shape in self.slots.get(name, ()):
            args[pos] = part(buffer, start, shape)
        self.targets[name] = buffer
        self._stale.update(self._holders.get(name, ()))

    def _bind(self) -> None:
        """Bind the stale Calls (all of them when the thread count changed) and group the
        instructions again when a call's kind changed; a call that binds to calls of the same
        functions again takes their arguments in place, so the batches stay as they are."""
        threads = get_num_threads()
        if threads != self._threads:
            self._stale.update(t for t, step in enumerate(self.instructions) if isinstance(step, Call))
            self._threads = threads
        regroup = self._steps is None
        for t in sorted(self._stale):
            step = self.instructions[t]
            bound = step.bind()
            if not _take(step.bound, bound):
                step.bound = bound
                regroup = True
            self._stale.discard(t)
        if regroup:
            self._steps = self._group()

    def _group(self) -> list[Instruction | Batch]:
        """The instructions, each run of Calls that are native calls with thunks one Batch."""
        steps: list[Instruction | Batch] = []
        run: list[Call] = []
        for step in self.instructions:
            if self._run_calls is not None and isinstance(step, Call) and step.bound is not None and all(
                    c.bound.thunk is not None for c in step.bound):
                run.append(step)
                continue
            steps += self._batch(run)
            run = []
            steps.append(step)
        return steps + self._batch(run)

    def _batch(self, run: list[Call]) -> list[Batch]:
        """`run` as one Batch; none when it makes no call (Calls bound to nothing to do)."""
        return [Batch.of(run, self._run_calls)] if any(call.bound for call in run) else []

    def swap_weight(self, key: str, array: np.ndarray) -> None:
        """Point every reader of weight `key` at `array` from the next run on; readers prepared
        with its value are prepared again without it (they must not use the old one), and stop
        reading what the compiler derived from it."""
        prep = self.prep
        for step in self.instructions:
            if not isinstance(step, Call) or key in step.opaque or not self._reads(step.task, key):
                continue
            opaque = step.opaque | {key}
            kernel = kernel_for(prep.graph, prep.program, step.task, prep.native, opaque)
            if any(self._weight_key(step.task.inputs[source]) == key for _, source in kernel.derived):
                kernel.drop_derived()
            if not kernel.fit_workspace(step.task.workspace_size):
                raise BindError(f"weight {key!r} cannot be swapped: node {step.node.label!r} needs "
                                f"{kernel.workspace()} bytes of workspace without its value, the plan "
                                f"gives {step.task.workspace_size}")
            step.kernel, step.opaque = kernel, opaque
            self._stale.add(self.instructions.index(step))
        self.point(key, array)

    def _reads(self, task: Task, key: str) -> bool:
        return any(self._weight_key(v) == key for v in task.inputs)

    def _weight_key(self, value: str) -> str | None:
        """The weight a task input reads (None: it is no weight)."""
        place = self.prep.program.places.get(value) if value else None
        return place.key if place is not None and place.region == WEIGHT else None

    def forget(self, name: str) -> None:
        """Let go of the buffer `name` points at: its slots hold nothing until the next run
        re-points them (an unbound buffer is no longer referenced, and its memory can close)."""
        self.targets.pop(name, None)
        for args, pos, _, _ in self.slots.get(name, ()):
            args[pos] = None
        for t in self._holders.get(name, ()):
            self.instructions[t].bound = None  # lets go of the buffer too
            self._stale.add(t)
        self._steps = None

    def value(self, name: str) -> np.ndarray:
        """The array holding planned value `name` now (arena, weights, or an I/O tensor's buffer)."""
        where = self._slot_of(name)
        if where is not None and where[0] in self.targets:
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

    def run(self, values: Mapping[str, Any], tally: Tally | None = None) -> dict[str, Any]:
        """Run every instruction in order; returns the run-time values by name (`values`, the
        sequence and optional inputs, included). `tally` adds each op type's (each fused chain's,
        or each node's) wall time, and its threads' busy time when it reads them."""
        found: dict[str, Any] = dict(values)
        self._bind()
        if self.stream is not None:
            return self._run_streamed(found, tally)
        if tally is None:
            for step in self._steps:
                step.execute(found, self)
            return found
        for step in self.instructions:
            self._timed(step, found, tally)
        return found

    def _timed(self, step: Instruction, found: dict[str, Any], tally: Tally | None) -> None:
        if tally is None:
            step.execute(found, self)
            return
        mark = tally.start()
        try:
            step.execute(found, self)
        finally:
            tally.stop(profile_key(step.node, tally.by), mark)

    def _run_streamed(self, found: dict[str, Any], tally: Tally | None) -> dict[str, Any]:
        """The loop with streamed weights: each task waits for the weights it reads first, and
        frees the slots of those it reads last."""
        stream = self.stream
        run = stream.begin()
        completed = False
        try:
            for t, step in enumerate(self.instructions):
                stream.before(run, t)
                self._timed(step, found, tally)
                stream.after(run, t)
            completed = True
        finally:
            stream.end(run, completed)
        return found
