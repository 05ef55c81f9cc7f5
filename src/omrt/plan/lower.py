"""Lowering: a graph with concrete shapes -> a Program (task list + memory plan).

`lower` runs these steps in order, each a function of its own (after ExecuTorch's
`exir/memory_planning.py`):

1. `make_tasks`        one task per node; view ops become aliases of their input (no task, no
                       memory); values whose size is known only at run time are marked so.
2. `find_lifetimes`    the first task writing and the last task reading each buffer; graph
                       outputs live to the end.
3. `share_in_place`    a kernel that may overwrite an input dying at its task writes its output
                       into that input's buffer; Concat grows its first input's buffer.
   `place_in_outputs`  an input dying at a Concat is planned inside the Concat's output, at
                       its slice, so that nothing is copied.
4. `claim_outputs`     each graph output's buffer becomes the caller's output memory, unless it
                       cannot (then the output is copy-only, with the reason).
5. `arena_blocks`      a block per remaining buffer and per kernel workspace, placed in the arena
                       by a registered algorithm (`omrt.plan.arena.ALGORITHMS`).
6. `io_layout`         fallback blocks for graph inputs (together, by size) and claimed outputs,
                       after the feature map.
7. `placements`        where every value lives: region, offset and the buffer it belongs to.

The result is proved by `omrt.plan.verify.verify` before it is returned.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import ShapeError
from ..ir import Graph
from ..kernels import kernel_of
from ..kernels.base import Kernel
from ..memory import ALIGN, align
from .arena import Block, lower_bound, naive_size, place
from .infer import context
from .program import ARENA, DYNAMIC, INPUT, OUTPUT, WEIGHT, Placement, Program, Task
from .verify import verify


@dataclass
class Lowering:
    """What the steps know about one graph as they go: its tasks and the buffers values live in."""

    graph: Graph
    tasks: list[Task] = field(default_factory=list)
    kernels: list[type[Kernel]] = field(default_factory=list)
    base: dict[str, str] = field(default_factory=dict)
    """value -> the value whose buffer it lives in (a view's input, an in-place input); follow
    it to the root with `root`."""
    delta: dict[str, int] = field(default_factory=dict)
    """value -> byte offset of its buffer inside its base's buffer (0 when absent): a Concat's
    input placed at its slice of the output."""
    runtime: set[str] = field(default_factory=set)
    """Values allocated at run time: sequences and optionals, data-dependent shapes, strings."""
    input_roots: set[str] = field(default_factory=set)
    """The graph inputs (never a node's output, so each is its own root)."""
    first: dict[str, int] = field(default_factory=dict)
    last: dict[str, int] = field(default_factory=dict)
    """Lifetimes of root buffers: first task writing, last task reading (len(tasks): an output)."""

    def place_of(self, value: str) -> tuple[str, int]:
        """(the value that owns the buffer `value` lives in, `value`'s byte offset inside it)."""
        at = 0
        while self.base.get(value, value) != value:
            at += self.delta.get(value, 0)
            value = self.base[value]
        return value, at

    def root(self, value: str) -> str:
        """The value that owns the buffer `value` lives in."""
        return self.place_of(value)[0]

    def buffer_bytes(self) -> dict[str, int]:
        """Root -> bytes of its buffer: the end of the furthest value planned in it (at least 1)."""
        ends: dict[str, int] = {}
        for v, info in self.graph.infos.items():
            if v not in self.graph.constants and info.static:
                root, at = self.place_of(v)
                ends[root] = max(ends.get(root, 1), at + info.nbytes)
        return ends

    def runs_late(self, t: int) -> bool:
        """True when task `t` is prepared at run time (it writes a run-time value)."""
        return any(v in self.runtime for v in self.tasks[t].outputs)

    def in_arena(self, root: str) -> bool:
        """True when the buffer of `root` is planned memory (not an input, weight or run-time value)."""
        return root not in self.input_roots and root not in self.graph.constants and root not in self.runtime


def lower(graph: Graph, algorithm: str = "greedy") -> Program:
    """Plan a graph whose input shapes are all concrete (see the module docstring for the steps)."""
    _check_concrete_inputs(graph)
    state = make_tasks(graph)
    find_lifetimes(state)
    share_in_place(state)
    place_in_outputs(state)
    claimed, copy_only = claim_outputs(state)
    blocks, block_of = arena_blocks(state, claimed)
    arena = place(blocks, algorithm)
    for t, task in enumerate(state.tasks):
        if task.workspace_size:
            task.workspace_offset = block_of[_workspace_key(t)].offset
    io_offsets, io_size = io_layout(state, claimed)
    places = placements(state, claimed, block_of, io_offsets)
    infos = graph.infos
    program = Program(
        signature={v: infos[v].shape for v in graph.inputs if infos[v].is_tensor},
        shapes={v: infos[v].shape for v in places},
        tasks=state.tasks, places=places, blocks=blocks, arena_size=arena,
        lower_bound=lower_bound(blocks), naive_size=naive_size(blocks),
        io_size=io_size, io_offsets=io_offsets, copy_only=copy_only)
    verify(program, graph)
    return program


def _check_concrete_inputs(graph: Graph) -> None:
    for v in graph.inputs:
        info = graph.infos[v]
        if info.is_tensor and not info.static:
            raise ShapeError(f"input {v!r} has shape {info.shape}; plans need concrete shapes: give "
                             f"them at compile time (--shape {v}=...) or bind an array")


def make_tasks(graph: Graph) -> Lowering:
    """Step 1: a task per node, except views (aliases of their input); run-time values marked."""
    infos = graph.infos
    needed = set(graph.consumers()) | set(graph.outputs)
    state = Lowering(graph, runtime={v for v in graph.inputs if not infos[v].is_tensor},
                     input_roots=set(graph.inputs))
    for idx, node in enumerate(graph.nodes):
        cls = kernel_of(node, graph)
        live_outs = [o for o in node.outputs if o and o in needed]
        src = node.inputs[0] if node.inputs else ""
        # sizes known only at run time, and object (string) tensors, never live in the arena
        unknown = any(o and (not infos[o].static or infos[o].dtype == object) for o in node.outputs)
        if (cls.view and len(live_outs) == 1 and live_outs[0] == node.outputs[0] and src
                and src not in state.runtime and not unknown):
            at = cls.view_offset(context(node, graph), [infos[v] if v else None for v in node.inputs],
                                 [infos[node.outputs[0]]])
            if not at or state.in_arena(state.root(src)):  # weights and inputs are viewed whole
                state.base[node.outputs[0]] = src
                if at:
                    state.delta[node.outputs[0]] = at
                continue
        if cls.dynamic or unknown or any(v in state.runtime for v in node.inputs if v):
            state.runtime.update(o for o in node.outputs if o)
        state.tasks.append(Task(idx, list(node.inputs), list(node.outputs)))
        state.kernels.append(cls)
    return state


def find_lifetimes(state: Lowering) -> None:
    """Step 2: first write and last read of every root buffer; graph outputs live to the end."""
    for t, task in enumerate(state.tasks):
        for v in task.outputs:
            if v:
                root = state.root(v)
                state.first.setdefault(root, t)
                state.last[root] = max(state.last.get(root, t), t)
        for v in task.inputs:
            if v:
                state.last[state.root(v)] = t
    for v in state.graph.outputs:
        state.last[state.root(v)] = len(state.tasks)


def share_in_place(state: Lowering) -> None:
    """Step 3: outputs take over the buffer of an input that dies at their task, when the kernel
    allows it (`Kernel.inplace`) or the input may already sit at the output's start (Concat)."""
    output_roots = {state.root(v) for v in state.graph.outputs}
    for t, (task, cls) in enumerate(zip(state.tasks, state.kernels)):
        for o, i, grows in _in_place_candidates(state, t, cls):
            if o >= len(task.outputs) or i >= len(task.inputs):
                continue
            out, src = task.outputs[o], task.inputs[i]
            if out and src and out not in state.runtime and _may_share(state, t, out, src, grows,
                                                                        output_roots):
                root = state.root(src)
                state.base[out] = root
                state.last[root] = state.last.pop(out, t)
                state.first.pop(out, None)
                break


def _in_place_candidates(state: Lowering, t: int, cls: type[Kernel]) -> list[tuple[int, int, bool]]:
    """(output index, input index, grows) pairs task `t` may share, in the kernel's preference."""
    pairs = [(o, i, False) for o, i in cls.inplace.items()]
    pairs += [(0, i, True) for i, at in _input_offsets(state, t, cls).items() if at == 0]
    return pairs


def _input_offsets(state: Lowering, t: int, cls: type[Kernel]) -> dict[int, int]:
    """Kernel.input_offsets of task `t` (none for a task prepared at run time)."""
    task = state.tasks[t]
    if state.runs_late(t) or not task.outputs or not task.outputs[0]:
        return {}
    graph, infos = state.graph, state.graph.infos
    ins = [infos[v] if v else None for v in task.inputs]
    return cls.input_offsets(context(graph.nodes[task.node], graph), ins, [infos[task.outputs[0]]])


def _may_share(state: Lowering, t: int, out: str, src: str, grows: bool, output_roots: set[str]) -> bool:
    """True when `out` may be written over `src`'s buffer at task `t`."""
    infos = state.graph.infos
    root = state.root(src)
    same_root_reads = sum(1 for v in state.tasks[t].inputs if v and state.root(v) == root)
    fits = grows or infos[out].shape == infos[src].shape
    # a view at an offset (a stacked product's part) is not at its buffer's start, where `out` would go
    return (state.in_arena(root) and state.last.get(root) == t and same_root_reads == 1
            and state.place_of(src)[1] == 0
            and root not in output_roots and state.root(out) == out
            and infos[out].dtype == infos[src].dtype and fits)


def place_in_outputs(state: Lowering) -> None:
    """Step 3, second part: an input that dies at its task is planned inside output 0 at the byte
    offset the kernel names (`Kernel.input_offsets`), when nothing else would share those bytes:
    its whole buffer (its producers' in-place chain) fits the slice, the slice is aligned, and
    output 0 is planned memory. The input's buffer then lives as long as the output's. (Moving a
    buffer into an output never makes the output's buffer bigger, so the sizes are read once.)"""
    sizes = state.buffer_bytes()
    output_roots = {state.root(v) for v in state.graph.outputs}
    for t, cls in enumerate(state.kernels):
        task = state.tasks[t]
        offsets = _input_offsets(state, t, cls)
        if not offsets:
            continue
        out = state.root(task.outputs[0])  # at its start: only a later task moves it into another
        if not state.in_arena(out):
            continue
        roots = [state.root(v) for v in task.inputs if v]
        for i, at in offsets.items():
            src = task.inputs[i]
            root = state.root(src)
            if (root == out or roots.count(root) != 1 or at % ALIGN or not state.in_arena(root)
                    or state.last.get(root) != t or sizes[root] != state.graph.infos[src].nbytes
                    or root in output_roots):
                continue
            state.base[root], state.delta[root] = out, at
            state.first[out] = min(state.first[out], state.first.pop(root))
            state.last.pop(root)


def claim_outputs(state: Lowering) -> tuple[dict[str, str], dict[str, str]]:
    """Step 4: root buffer -> the graph output whose memory it becomes; and the copy-only outputs
    with the reason their producer cannot write into the caller's buffer."""
    claimed: dict[str, str] = {}
    copy_only: dict[str, str] = {}
    constants = state.graph.constants
    sizes = state.buffer_bytes()
    for o in state.graph.outputs:
        root, at = state.place_of(o)
        if root in state.input_roots:
            copy_only[o] = (f"it is graph input {root!r}" if root == o
                            else f"it is a view of graph input {root!r}")
        elif root in constants:
            copy_only[o] = "it is a constant folded at compile time"
        elif root in state.runtime:
            copy_only[o] = "its shape depends on input values (allocated at run time)"
        elif root in claimed:
            copy_only[o] = f"it shares memory with output {claimed[root]!r}"
        elif at or sizes.get(root, 1) > max(state.graph.infos[o].nbytes, 1):
            copy_only[o] = f"it is a part of {root!r}'s buffer, which other values share"
        else:
            claimed[root] = o
    return claimed, copy_only


def _workspace_key(t: int) -> str:
    return f"#workspace{t}"


def arena_blocks(state: Lowering, claimed: dict[str, str]) -> tuple[list[Block], dict[str, Block]]:
    """Step 5: a block per arena buffer (sized to hold every value in it) and per workspace;
    returns them and a map from root (or workspace key) to its block."""
    group_bytes = state.buffer_bytes()
    block_of: dict[str, Block] = {}
    for root in sorted(state.first, key=lambda r: state.first[r]):
        if root not in claimed and root not in state.runtime:
            block_of[root] = Block(root, group_bytes[root], state.first[root],
                                   state.last.get(root, state.first[root]))
    for t, size in _workspaces(state):
        state.tasks[t].workspace_size = size
        label = f"workspace of {state.graph.nodes[state.tasks[t].node].label}"
        block_of[_workspace_key(t)] = Block(label, size, t, t)
    return list(block_of.values()), block_of


def _workspaces(state: Lowering) -> list[tuple[int, int]]:
    """(task, bytes) for every planned task whose kernel asks for scratch."""
    graph, infos = state.graph, state.graph.infos
    found = []
    for t, (task, cls) in enumerate(zip(state.tasks, state.kernels)):
        if state.runs_late(t):
            continue
        ins = [infos[v] if v else None for v in task.inputs]
        outs = [infos[v] if v else None for v in task.outputs]
        size = cls(context(graph.nodes[task.node], graph), ins, outs).workspace()
        if size:
            found.append((t, size))
    return found


def io_layout(state: Lowering, claimed: dict[str, str]) -> tuple[dict[str, int], int]:
    """Step 6: offsets of the fallback blocks (graph inputs together, largest first, then the
    claimed outputs) and their total size."""
    infos = state.graph.infos
    tensors_in = [v for v in state.graph.inputs if infos[v].is_tensor]
    ins_by_size = sorted(tensors_in, key=lambda v: (-infos[v].nbytes, v))
    offsets: dict[str, int] = {}
    cursor = 0
    for v in ins_by_size + [o for o in state.graph.outputs if o in claimed.values()]:
        if v not in offsets:
            offsets[v] = cursor
            cursor += align(max(infos[v].nbytes, 1))
    return offsets, cursor


def placements(state: Lowering, claimed: dict[str, str], block_of: dict[str, Block],
               io_offsets: dict[str, int]) -> dict[str, Placement]:
    """Step 7: the region and offset of every value a task or the caller touches."""
    graph = state.graph
    needed = set(graph.consumers()) | set(graph.outputs) | set(graph.inputs)
    written = {o for t in state.tasks for o in t.outputs if o}
    places: dict[str, Placement] = {}
    for v in set(graph.infos) & (needed | written):
        root, at = state.place_of(v)
        if root in graph.constants:
            places[v] = Placement(WEIGHT, 0, root)
        elif root in state.runtime:
            places[v] = Placement(DYNAMIC)
        elif root in state.input_roots:
            places[v] = Placement(INPUT, io_offsets[root], root)
        elif root in claimed:
            places[v] = Placement(OUTPUT, io_offsets[claimed[root]] + at, claimed[root])
        elif root in block_of:
            places[v] = Placement(ARENA, block_of[root].offset + at, root)
    for v in graph.outputs:
        places.setdefault(v, Placement(WEIGHT, 0, v) if v in graph.constants else Placement(DYNAMIC))
    return places
