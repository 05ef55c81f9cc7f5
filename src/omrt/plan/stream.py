"""Weight streaming: which weights stay resident under a byte budget, and the slot schedule of the
others (seed 001's fixed uniform slots).

Steps, like the arena planner's:

1. Every weight a planned task reads is a candidate; its readers are those tasks. Weights stay
   resident in order of reuse (most readers first), then size (smallest first): small, often-read
   weights cost little budget and would cost a read per reader.
2. The rest stream through K slots of one size, the largest streamed weight's (rounded to a
   page), allocated once: no allocation and no free per swap. A streamed weight occupies a slot
   from the end of the previous occupant's last reader to its own last reader; K must be at least
   the most streamed weights live at one task, and every slot more lets the filler read further
   ahead. Weights leave the resident set, least valuable first, until resident + K * slot fits
   with one slot of read-ahead (K above that need), so that reads overlap the kernels; when the
   budget cannot hold that, until it fits at all (then reads and kernels take turns).
3. Fills are assigned slots in the order of their first reader, each to the slot freed earliest
   (round robin when all are free), so the filler can read a weight as soon as a slot is free.

`verify_stream` proves a schedule: each fill fits its slot, the fills of one slot follow one
another (a fill's first reader comes after the previous occupant's last reader), every reader of
a streamed weight runs inside its fill's interval, and the budget holds.
"""

from __future__ import annotations

import mmap
from dataclasses import dataclass, field

from ..errors import InputError
from ..memory import align
from .program import WEIGHT, Program
from .verify import PlanError

MIN_STREAMED = 64 << 10
"""Weights below this many bytes always stay resident: a read of a few KiB costs more in
handoffs than the memory it saves."""


@dataclass(frozen=True)
class Fill:
    """One streamed weight: the slot it is read into and the tasks that read it."""

    key: str
    nbytes: int
    slot: int
    first: int
    last: int
    previous: int | None
    """The fill the slot held before (its last reader must finish before this fill starts)."""


Unread = frozenset[tuple[int, int]]
"""(task, input position) pairs whose value the task's kernel never reads on the path it takes."""


@dataclass
class StreamPlan:
    """Resident and streamed weights under a budget, and the slots' schedule."""

    budget: int
    resident: dict[str, int] = field(default_factory=dict)
    """key -> bytes of every weight that stays resident (read once, not streamed)."""
    fills: list[Fill] = field(default_factory=list)
    slot_size: int = 0
    slots: int = 0
    unread: Unread = frozenset()
    """(task, input position) pairs left out: the kernel reads another form of that weight."""

    @property
    def resident_bytes(self) -> int:
        return sum(self.resident.values())

    @property
    def streamed_bytes(self) -> int:
        return sum(f.nbytes for f in self.fills)


def weight_readers(program: Program, sizes: dict[str, int], unread: Unread = frozenset()) -> dict[str, list[int]]:
    """weight key -> the tasks that read it (weights of at least one byte only)."""
    readers: dict[str, list[int]] = {}
    for t, task in enumerate(program.tasks):
        for i, v in enumerate(task.inputs):
            place = program.places.get(v) if v and (t, i) not in unread else None
            if place is not None and place.region == WEIGHT and sizes.get(place.key, 0) > 0:
                readers.setdefault(place.key, [])
                if not readers[place.key] or readers[place.key][-1] != t:
                    readers[place.key].append(t)
    return readers


def _live_at_once(streamed: list[str], readers: dict[str, list[int]]) -> int:
    """The most streamed weights whose reader spans overlap at one task."""
    events = sorted([(readers[k][0], 1) for k in streamed] + [(readers[k][-1] + 1, -1) for k in streamed])
    live = peak = 0
    for _, step in events:
        live += step
        peak = max(peak, live)
    return peak


def _slots(streamed: list[str], sizes: dict[str, int], readers: dict[str, list[int]],
           room: int) -> tuple[int, int]:
    """(slot size, slot count) for these streamed weights in `room` bytes; count 0 if they do not fit."""
    if not streamed:
        return 0, 0
    size = align(max(sizes[k] for k in streamed), mmap.PAGESIZE)
    needed = _live_at_once(streamed, readers)
    count = min(room // size, len(streamed))
    return size, count if count >= needed else 0


def plan_stream(program: Program, sizes: dict[str, int], budget: int, unread: Unread = frozenset()) -> StreamPlan:
    """Resident weights and the slot schedule of the others, for `budget` bytes of weights."""
    readers = weight_readers(program, sizes, unread)
    keep = sorted(readers, key=lambda k: (-len(readers[k]), sizes[k], k))
    movable = [k for k in reversed(keep) if sizes[k] >= MIN_STREAMED]
    fitted = _fit(keep, movable, sizes, readers, budget, read_ahead=False)
    if fitted is None:
        raise InputError(_too_small(budget, sizes, readers))
    ahead = _fit(keep, movable, sizes, readers, budget, read_ahead=True)
    streamed, slot_size, count = ahead or fitted
    resident = {k: sizes[k] for k in keep if k not in streamed}
    return StreamPlan(budget, resident, _schedule(streamed, sizes, readers, count), slot_size, count, unread)


def _fit(keep: list[str], movable: list[str], sizes: dict[str, int], readers: dict[str, list[int]],
         budget: int, read_ahead: bool) -> tuple[list[str], int, int] | None:
    """(streamed weights, slot size, slot count) moving the fewest weights out of the resident set
    (least valuable first) so that resident + slots fit `budget`; with `read_ahead`, also a slot
    more than the weights live at one task need, so the filler reads the next weight while the
    kernels compute (when every streamed weight has a slot of its own, all are read ahead).
    None when no such plan exists."""
    resident_bytes = sum(sizes[k] for k in keep)
    streamed: list[str] = []
    for key in [None, *movable]:
        if key is not None:
            streamed.append(key)
            resident_bytes -= sizes[key]
        room = budget - resident_bytes
        slot_size, count = _slots(streamed, sizes, readers, room)
        if room < 0 or (streamed and not count):
            continue
        needed = _live_at_once(streamed, readers)
        if not read_ahead or not streamed or count > needed or count == len(streamed) > 1:
            return list(streamed), slot_size, count
    return None


def _too_small(budget: int, sizes: dict[str, int], readers: dict[str, list[int]]) -> str:
    """The error for a budget nothing fits in, with the minimum budget."""
    pinned = sum(sizes[k] for k in readers if sizes[k] < MIN_STREAMED)
    streamable = [k for k in readers if sizes[k] >= MIN_STREAMED]
    largest = max(streamable, key=lambda k: sizes[k]) if streamable else None
    size, _ = _slots(streamable, sizes, readers, 1 << 62)
    minimum = pinned + size * _live_at_once(streamable, readers)
    return (f"weight_budget={budget} bytes is below this model's minimum of {minimum} bytes: its largest "
            f"weight {largest!r} takes {sizes[largest] if largest else 0} bytes (one slot of {size}), and "
            f"{pinned} bytes of small weights stay resident; pass weight_budget={minimum} or more")


def _schedule(streamed: list[str], sizes: dict[str, int], readers: dict[str, list[int]],
              count: int) -> list[Fill]:
    """Fills in order of first reader, each in the slot freed earliest."""
    free_after = [-1] * count   # the last reader of each slot's current occupant
    last_fill: list[int | None] = [None] * count
    fills: list[Fill] = []
    for key in sorted(streamed, key=lambda k: (readers[k][0], k)):
        slot = min(range(count), key=lambda s: (free_after[s], s))
        fills.append(Fill(key, sizes[key], slot, readers[key][0], readers[key][-1], last_fill[slot]))
        free_after[slot] = readers[key][-1]
        last_fill[slot] = len(fills) - 1
    return fills


def verify_stream(plan: StreamPlan, program: Program, sizes: dict[str, int]) -> None:
    """Raise PlanError naming the first broken rule of a slot schedule."""
    readers = weight_readers(program, sizes, plan.unread)
    if plan.resident_bytes + plan.slots * plan.slot_size > plan.budget:
        raise PlanError(f"resident weights ({plan.resident_bytes} bytes) and {plan.slots} slots of "
                        f"{plan.slot_size} exceed the budget of {plan.budget}")
    if set(plan.resident) | {f.key for f in plan.fills} != set(readers):
        raise PlanError("the plan neither keeps nor streams every weight the tasks read")
    for i, f in enumerate(plan.fills):
        if f.nbytes != sizes[f.key] or f.nbytes > plan.slot_size or not 0 <= f.slot < plan.slots:
            raise PlanError(f"weight {f.key!r} ({sizes[f.key]} bytes) does not fit slot {f.slot} as planned "
                            f"({f.nbytes} bytes in {plan.slot_size})")
        if not all(f.first <= t <= f.last for t in readers[f.key]):
            raise PlanError(f"a reader of {f.key!r} runs outside its time in slot {f.slot}")
        before = plan.fills[f.previous] if f.previous is not None else None
        if before is not None and (before.slot != f.slot or before.last >= f.first):
            raise PlanError(f"{f.key!r} would overwrite {before.key!r} in slot {f.slot} before its last "
                            f"reader (task {before.last}) is done")
        later = [g for g in plan.fills[i + 1:] if g.slot == f.slot]
        if later and later[0].previous != i:
            raise PlanError(f"slot {f.slot} is refilled after {f.key!r} without waiting for its readers")
