"""The plan verifier: proves a Program's memory plan before anything runs on it.

Checked: every arena block is aligned, inside the arena and written before it dies; no two blocks
live at the same task share a byte; no task writes into model-input memory or weights; every
value placed in a graph input or output lies inside that tensor; every arena value lies inside
the block it is placed in, at an aligned offset (a Concat's inputs inside its output's block).
"""

from __future__ import annotations

from ..errors import OmrtError
from ..ir import Graph
from ..memory import ALIGN
from .arena import overlaps
from .program import ARENA, INPUT, OUTPUT, WEIGHT, Program


class PlanError(OmrtError):
    """A memory plan breaks one of the planner's invariants (a bug in omrt, never the user's)."""


def verify(program: Program, graph: Graph) -> None:
    """Raise PlanError naming the first broken invariant of `program` (a plan of `graph`)."""
    _check_blocks(program)
    _check_writes(program, graph)
    _check_places(program, graph)


def _check_blocks(program: Program) -> None:
    for b in program.blocks:
        if b.offset % ALIGN or b.size % ALIGN:
            raise PlanError(f"block {b.label!r} at {b.offset} (+{b.size}) is not {ALIGN}-byte aligned")
        if b.offset < 0 or b.offset + b.size > program.arena_size:
            raise PlanError(f"block {b.label!r} [{b.offset}, {b.offset + b.size}) lies outside the "
                            f"arena of {program.arena_size} bytes")
        if b.first > b.last:
            raise PlanError(f"block {b.label!r} dies (task {b.last}) before it is written ({b.first})")
    bad = overlaps(program.blocks)
    if bad:
        a, b = bad[0]
        raise PlanError(f"blocks {a.label!r} and {b.label!r} are live at once and share bytes")


def _check_writes(program: Program, graph: Graph) -> None:
    for t in program.tasks:
        for v in t.outputs:
            if v and v in program.places and program.places[v].region in (INPUT, WEIGHT):
                raise PlanError(f"task {graph.nodes[t.node].label!r} writes {v!r} into "
                                f"{program.places[v].region} memory")


def _check_places(program: Program, graph: Graph) -> None:
    blocks = {b.label: b for b in program.blocks}
    for v, p in program.places.items():
        if p.region in (INPUT, OUTPUT):
            _check_io_part(program, graph, v, p.key, p.offset - program.io_offsets[p.key])
        if p.region == ARENA:
            info = graph.infos[v]
            blk = blocks.get(p.key)
            inside = p.offset - blk.offset if blk is not None else -1
            if blk is None or inside < 0 or inside % ALIGN or inside + info.nbytes > blk.size:
                raise PlanError(f"{v!r} ({info.nbytes} bytes at {p.offset}) does not fit its block {p.key!r}")


def _check_io_part(program: Program, graph: Graph, value: str, tensor: str, start: int) -> None:
    """A value placed inside graph input or output `tensor` lies within it, on an element boundary."""
    whole, info = graph.infos[tensor], graph.infos[value]
    if start < 0 or start % whole.dtype.itemsize or start + info.nbytes > whole.nbytes:
        raise PlanError(f"{value!r} ({info.nbytes} bytes at {start}) lies outside the I/O block of "
                        f"{tensor!r} ({whole.nbytes} bytes)")
