"""Arena placement: offsets for buffers with known lifetimes, and the figures that judge a plan.

Placement algorithms are registered by name in ALGORITHMS; `place` runs one. The default,
"greedy", is greedy by size with best-fit gaps (as TFLite Micro's greedy planner and
Pisarchyk & Lee 2020, "Efficient Memory Management for Deep Neural Net Inference"):

1. Sort buffers by size, largest first (ties: earliest first use, then id, so plans are stable).
   (The same best-fit placement is also tried in a few other orders -- see ORDERS -- and the
   smallest arena wins; greedy by size alone is a few percent off the bound on DenseNet.)
2. For each buffer, collect the already placed buffers whose lifetimes intersect its own.
3. Walk those by offset and find the gaps between them; take the smallest gap that holds the
   buffer (best fit), or else the first offset past all of them.
4. The arena is the highest end of any buffer.

"naive" gives every buffer bytes of its own (no sharing): the reference the others are judged
against, and a plan to fall back to when debugging one.

Lifetimes are closed intervals of task indices: a buffer is live from the task that writes it to
the last task that reads it (or any of its aliases). Every offset and size is a multiple of
`omrt.memory.ALIGN`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable

from ..memory import align


@dataclass
class Block:
    """One feature-map buffer: a tensor (with its aliases and in-place successors) or a workspace."""

    label: str
    size: int
    first: int
    last: int
    offset: int = -1

    def overlaps_in_time(self, other: "Block") -> bool:
        return self.first <= other.last and other.first <= self.last

    def overlaps_in_space(self, other: "Block") -> bool:
        return self.offset < other.offset + other.size and other.offset < self.offset + self.size


ORDERS = {
    "size": lambda b: (-b.size, b.first),
    "size x lifetime": lambda b: (-b.size * (b.last - b.first + 1), -b.size),
    "lifetime": lambda b: (-(b.last - b.first), -b.size),
    "first use": lambda b: (b.first, -b.size),
}
"""Orders tried by the greedy algorithm; "size" is the classic greedy-by-size, the others break
its bad cases."""


def place_in_order(blocks: list[Block], order: list[int]) -> list[int]:
    """Best-fit offsets for blocks taken in `order`; returns the offsets (index-aligned with blocks)."""
    offsets = [0] * len(blocks)
    placed: list[int] = []
    for i in order:
        b = blocks[i]
        live = sorted((j for j in placed if blocks[j].overlaps_in_time(b)), key=lambda j: offsets[j])
        best_off, best_gap, cursor = None, None, 0
        for j in live:
            gap = offsets[j] - cursor
            if gap >= b.size and (best_gap is None or gap < best_gap):
                best_off, best_gap = cursor, gap
            cursor = max(cursor, offsets[j] + blocks[j].size)
        offsets[i] = cursor if best_off is None else best_off
        placed.append(i)
    return offsets


def greedy(blocks: list[Block]) -> list[int]:
    """Best-fit offsets in each of ORDERS; the offsets of the smallest arena."""
    best: tuple[int, list[int]] | None = None
    for key in ORDERS.values():
        order = sorted(range(len(blocks)), key=lambda i: (*key(blocks[i]), i))
        offsets = place_in_order(blocks, order)
        arena = max((o + b.size for o, b in zip(offsets, blocks)), default=0)
        if best is None or arena < best[0]:
            best = (arena, offsets)
    return best[1] if best else []


def naive(blocks: list[Block]) -> list[int]:
    """Every block after the one before: no two share a byte."""
    offsets, cursor = [], 0
    for b in blocks:
        offsets.append(cursor)
        cursor += b.size
    return offsets


ALGORITHMS: dict[str, Callable[[list[Block]], list[int]]] = {"greedy": greedy, "naive": naive}
"""Placement algorithms by name: each takes blocks with aligned sizes and returns their offsets."""


def place(blocks: list[Block], algorithm: str = "greedy") -> int:
    """Align every block's size, give it an offset by `algorithm`; returns the arena size."""
    if algorithm not in ALGORITHMS:
        raise ValueError(f"unknown placement algorithm {algorithm!r}; choose one of {sorted(ALGORITHMS)}")
    for b in blocks:
        b.size = align(b.size)
    for b, offset in zip(blocks, ALGORITHMS[algorithm](blocks)):
        b.offset = offset
    return max((b.offset + b.size for b in blocks), default=0)


def lower_bound(blocks: Iterable[Block]) -> int:
    """The most bytes live at any one task: no plan can use less."""
    events: dict[int, int] = {}
    for b in blocks:
        events[b.first] = events.get(b.first, 0) + align(b.size)
        events[b.last + 1] = events.get(b.last + 1, 0) - align(b.size)
    peak = live = 0
    for t in sorted(events):
        live += events[t]
        peak = max(peak, live)
    return peak


def naive_size(blocks: Iterable[Block]) -> int:
    """Bytes needed with no sharing at all."""
    return sum(align(b.size) for b in blocks)


def overlaps(blocks: list[Block]) -> list[tuple[Block, Block]]:
    """Pairs of blocks live at the same time whose bytes intersect (must be empty)."""
    by_start = sorted(blocks, key=lambda b: b.offset)
    bad = []
    for i, a in enumerate(by_start):
        for b in by_start[i + 1:]:
            if b.offset >= a.offset + a.size:
                break
            if a.overlaps_in_time(b):
                bad.append((a, b))
    return bad


def picture(blocks: list[Block], arena: int, tasks: int, width: int = 72, height: int = 32) -> str:
    """ASCII picture: rows are tasks (time), columns are arena bytes; a letter per live block."""
    if not blocks or arena == 0:
        return "(empty arena)"
    glyphs = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
    step = max(1, -(-max(tasks, 1) // height))
    lines = []
    for t0 in range(0, max(tasks, 1), step):
        row = ["."] * width
        for k, b in enumerate(blocks):
            if b.first <= t0 + step - 1 and t0 <= b.last:
                lo = b.offset * width // arena
                hi = max(lo + 1, (b.offset + b.size) * width // arena)
                for c in range(lo, min(hi, width)):
                    row[c] = glyphs[k % len(glyphs)]
        lines.append(f"{t0:5d} |{''.join(row)}|")
    return "\n".join(lines)
