"""What lowering produces and the file stores: a Program (tasks + memory plan) for one input signature."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..ir import Shape
from .arena import Block

ARENA, INPUT, OUTPUT, WEIGHT, DYNAMIC = "arena", "input", "output", "weight", "dynamic"
"""Memory regions a value can live in: the session's arena (feature map), a graph input's or
output's buffer (the caller's when bound, else a fallback block), the mapped weights, or memory
allocated at run time (data-dependent shapes, strings, sequences)."""


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
    workspace_offset: int = 0
    workspace_size: int = 0


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
