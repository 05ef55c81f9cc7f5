"""Lowering: a graph with concrete shapes -> a Program (task list + memory plan), and its verifier.

Every value gets a Placement. View ops become aliases (same bytes, another shape, no task);
an elementwise kernel may take over the buffer of an input that dies at its task; graph outputs
are planned back to their producers so kernels write straight into the caller's buffer, unless
that cannot be, in which case the output is copy-only with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .errors import OmrtError, ShapeError
from .infer import context
from .ir import Graph, Shape
from .kernels import lookup
from .planner import Block, align, lower_bound, naive_size, overlaps, place

ARENA, INPUT, OUTPUT, WEIGHT, DYNAMIC = "arena", "input", "output", "weight", "dynamic"


class PlanError(OmrtError):
    """A memory plan breaks one of the planner's invariants (a bug in omrt, never the user's)."""


@dataclass
class Placement:
    """Where a value's bytes live: a region, a byte offset in it, and for I/O or weights the key."""

    region: str
    offset: int = 0
    key: str = ""


@dataclass
class Task:
    """One kernel call: the node it runs, its value names and its workspace in the arena."""

    node: int
    inputs: list[str]
    outputs: list[str]
    ws_offset: int = 0
    ws_size: int = 0


@dataclass
class Program:
    """Everything needed to run a graph for one input-shape signature."""

    signature: dict[str, Shape]
    shapes: dict[str, Shape]
    tasks: list[Task]
    places: dict[str, Placement]
    blocks: list[Block]
    arena_size: int
    lower_bound: int
    naive_size: int
    io_size: int
    io_offsets: dict[str, int]
    copy_only: dict[str, str] = field(default_factory=dict)


class _Buffers:
    """Union-find-free bookkeeping: every value maps to the root buffer (base) it lives in."""

    def __init__(self) -> None:
        self.base: dict[str, str] = {}

    def root(self, v: str) -> str:
        while self.base.get(v, v) != v:
            v = self.base[v]
        return v


def lower(graph: Graph) -> Program:
    """Plan a graph whose input shapes are all concrete."""
    infos = graph.infos
    tensors_in = [v for v in graph.inputs if infos[v].is_tensor]
    for v in tensors_in:
        if not infos[v].static:
            raise ShapeError(f"input {v!r} has shape {infos[v].shape}; plans need concrete shapes: give "
                             f"them at compile time (--shape {v}=...) or bind an array")
    uses = graph.consumers()
    needed = set(uses) | set(graph.outputs)
    buffers = _Buffers()
    tasks: list[Task] = []
    dynamic = {v for v in graph.inputs if not infos[v].is_tensor}
    kernels = []
    for idx, node in enumerate(graph.nodes):
        cls = lookup(node.op_type, graph.opset(node.domain), node.domain, node.label)
        live_outs = [o for o in node.outputs if o and o in needed]
        src = node.inputs[0] if node.inputs else ""
        # sizes known only at run time, and object (string) tensors, never live in the arena
        unknown = any(o and (not infos[o].static or infos[o].dtype == object) for o in node.outputs)
        if (cls.view and len(live_outs) == 1 and live_outs[0] == node.outputs[0] and src
                and src not in dynamic and not unknown):
            buffers.base[node.outputs[0]] = src
            continue
        if cls.dynamic or unknown or any(v in dynamic for v in node.inputs if v):
            dynamic.update(o for o in node.outputs if o)
        tasks.append(Task(idx, list(node.inputs), list(node.outputs)))
        kernels.append(cls)
    runs_late = [any(o in dynamic for o in t.outputs) for t in tasks]

    # lifetimes of root buffers, before in-place merging
    last: dict[str, int] = {}
    for t, task in enumerate(tasks):
        for v in task.inputs:
            if v:
                last[buffers.root(v)] = t
    for v in graph.outputs:
        last[buffers.root(v)] = len(tasks)

    roots_input = {buffers.root(v) for v in graph.inputs}
    roots_const = set(graph.constants)

    def is_arena(root: str) -> bool:
        return root not in roots_input and root not in roots_const and root not in dynamic

    output_roots = {buffers.root(g) for g in graph.outputs}
    for t, (task, cls) in enumerate(zip(tasks, kernels)):
        node = graph.nodes[task.node]
        pairs = [(o, i, False) for o, i in cls.inplace.items()]
        if not runs_late[t] and task.outputs and task.outputs[0]:
            ins = [infos[v] if v else None for v in task.inputs]
            prefix = cls.prefix_input(context(node, graph), ins, [infos[task.outputs[0]]])
            if prefix is not None:
                pairs.append((0, prefix, True))
        for o, i, grows in pairs:
            if o >= len(task.outputs) or i >= len(task.inputs):
                continue
            out, src = task.outputs[o], task.inputs[i]
            if not out or not src or out in dynamic:
                continue
            root = buffers.root(src)
            same_root_reads = sum(1 for v in task.inputs if v and buffers.root(v) == root)
            fits = grows or infos[out].shape == infos[src].shape
            if (is_arena(root) and last.get(root) == t and same_root_reads == 1
                    and root not in output_roots and buffers.root(out) == out
                    and infos[out].dtype == infos[src].dtype and fits):
                buffers.base[out] = root
                last[root] = last.get(out, t)
                last.pop(out, None)
                break

    # re-derive lifetimes now that in-place outputs joined their inputs' buffers
    first: dict[str, int] = {}
    last = {}
    for t, task in enumerate(tasks):
        for v in task.outputs:
            if v:
                first.setdefault(buffers.root(v), t)
                last[buffers.root(v)] = max(last.get(buffers.root(v), t), t)
        for v in task.inputs:
            if v:
                last[buffers.root(v)] = t

    places: dict[str, Placement] = {}
    copy_only: dict[str, str] = {}
    claimed: dict[str, str] = {}
    for o in graph.outputs:
        root = buffers.root(o)
        if root in roots_input:
            copy_only[o] = (f"it is graph input {root!r}" if root == o
                            else f"it is a view of graph input {root!r}")
        elif root in roots_const:
            copy_only[o] = "it is a constant folded at compile time"
        elif root in dynamic:
            copy_only[o] = "its shape depends on input values (allocated at run time)"
        elif root in claimed:
            copy_only[o] = f"it shares memory with output {claimed[root]!r}"
        else:
            claimed[root] = o
    for o in copy_only:
        last[buffers.root(o)] = len(tasks)

    group_bytes: dict[str, int] = {}
    for v in infos:
        if v not in graph.constants and infos[v].static:
            r = buffers.root(v)
            group_bytes[r] = max(group_bytes.get(r, 1), infos[v].nbytes)
    blocks: list[Block] = []
    block_of: dict[str, Block] = {}
    for root in sorted(first, key=lambda r: first[r]):
        if root in claimed or root in dynamic:
            continue
        b = Block(root, group_bytes[root], first[root], last.get(root, first[root]))
        blocks.append(b)
        block_of[root] = b
    for t, (task, cls) in enumerate(zip(tasks, kernels)):
        if runs_late[t]:
            continue
        node = graph.nodes[task.node]
        ins = [infos[v] if v else None for v in task.inputs]
        ctx = context(node, graph)
        ws = cls(ctx, ins, [infos[v] if v else None for v in task.outputs]).workspace()
        if ws:
            task.ws_size = ws
            b = Block(f"workspace of {node.label}", ws, t, t)
            blocks.append(b)
            block_of[f"#ws{t}"] = b
    arena = place(blocks)
    for t, task in enumerate(tasks):
        if task.ws_size:
            task.ws_offset = block_of[f"#ws{t}"].offset

    io_offsets: dict[str, int] = {}
    cursor = 0
    ins_by_size = sorted(tensors_in, key=lambda v: (-infos[v].nbytes, v))
    for v in ins_by_size + [o for o in graph.outputs if o in claimed.values()]:
        if v not in io_offsets:
            io_offsets[v] = cursor
            cursor += align(max(infos[v].nbytes, 1))

    all_values = set(infos) & (needed | set(graph.inputs) | {o for t in tasks for o in t.outputs if o})
    for v in all_values:
        root = buffers.root(v)
        if root in roots_const:
            places[v] = Placement(WEIGHT, 0, root)
        elif root in dynamic:
            places[v] = Placement(DYNAMIC)
        elif root in roots_input:
            places[v] = Placement(INPUT, io_offsets[root], root)
        elif root in claimed:
            places[v] = Placement(OUTPUT, io_offsets[claimed[root]], claimed[root])
        elif root in block_of:
            places[v] = Placement(ARENA, block_of[root].offset, root)
    for v in graph.outputs:
        places.setdefault(v, Placement(WEIGHT, 0, v) if v in roots_const else Placement(DYNAMIC))

    program = Program(
        signature={v: infos[v].shape for v in tensors_in},
        shapes={v: infos[v].shape for v in places},
        tasks=tasks, places=places, blocks=blocks, arena_size=arena,
        lower_bound=lower_bound(blocks), naive_size=naive_size(blocks),
        io_size=cursor, io_offsets=io_offsets, copy_only=copy_only)
    verify(program, graph)
    return program


def verify(program: Program, graph: Graph) -> None:
    """Prove the plan: blocks aligned and in the arena, no live overlap, no write to inputs or weights."""
    for b in program.blocks:
        if b.offset % 64 or b.size % 64:
            raise PlanError(f"block {b.label!r} at {b.offset} (+{b.size}) is not 64-byte aligned")
        if b.offset < 0 or b.offset + b.size > program.arena_size:
            raise PlanError(f"block {b.label!r} [{b.offset}, {b.offset + b.size}) lies outside the "
                            f"arena of {program.arena_size} bytes")
        if b.first > b.last:
            raise PlanError(f"block {b.label!r} dies (task {b.last}) before it is written ({b.first})")
    bad = overlaps(program.blocks)
    if bad:
        a, b = bad[0]
        raise PlanError(f"blocks {a.label!r} and {b.label!r} are live at once and share bytes")
    for t in program.tasks:
        for v in t.outputs:
            if v and v in program.places and program.places[v].region in (INPUT, WEIGHT):
                raise PlanError(f"task {graph.nodes[t.node].label!r} writes {v!r} into "
                                f"{program.places[v].region} memory")
    for v, p in program.places.items():
        if p.region in (INPUT, OUTPUT) and p.offset != program.io_offsets[p.key]:
            raise PlanError(f"{v!r} is placed in the I/O block of {p.key!r} at a wrong offset")
        if p.region == ARENA:
            info = graph.infos[v]
            blk = next((b for b in program.blocks if b.label == p.key), None)
            if blk is None or info.nbytes > blk.size or p.offset != blk.offset:
                raise PlanError(f"{v!r} ({info.nbytes} bytes) does not fit its block {p.key!r}")
