"""`WeightSlots`: fixed uniform slots for weights that take turns (adapters, mixture-of-experts
layers), the expert-streaming pattern of seed 001.

The slots are one `Memory`, allocated once; a swap refills a slot in place, from an array or
straight from a file or memfd (`os.preadv`: the refill by import that the seed found 2.1x cheaper
than allocate + copy), and `Session.set_weight` points a weight at the slot. No allocation and
no free per swap, so a working set far larger than memory cycles through without churn.
"""

from __future__ import annotations

import mmap
import os
from typing import Any, Sequence

import numpy as np

from ..errors import AllocationError, BindError
from ..memory import Memory, align


class WeightSlots:
    """`count` slots of `nbytes` each (rounded to a page), allocated once with the flags of
    `Memory.allocate`."""

    def __init__(self, nbytes: int, count: int = 2, **flags: Any) -> None:
        if nbytes <= 0 or count < 1:
            raise AllocationError(f"WeightSlots({nbytes}, {count}): slots need a positive size and count")
        self.slot_size = align(nbytes, mmap.PAGESIZE)
        self.count = count
        self.memory = Memory.allocate(self.slot_size * count, name="omrt-weight-swap", **flags)

    def view(self, slot: int, dtype: Any, shape: Sequence[int]) -> np.ndarray:
        """The array of `dtype` and `shape` at the start of `slot` (to pass to set_weight)."""
        return self.memory.view(dtype, shape, self._start(slot))

    def fill(self, slot: int, source: np.ndarray | tuple[int, int, int]) -> None:
        """Refill `slot` in place: from an array (its bytes are copied), or from `(fd, offset,
        nbytes)`, read straight from that file or memfd."""
        start = self._start(slot)
        if isinstance(source, tuple):
            fd, offset, nbytes = source
            self._check_size(slot, nbytes)
            into, done = self.memory.view(np.uint8, (nbytes,), start), 0
            while done < nbytes:  # one read returns at most about 2 GiB on Linux
                got = os.preadv(fd, [into[done:]], offset + done)
                if got == 0:
                    raise BindError(f"slot {slot}: fd {fd} ended {done} bytes into the {nbytes} from offset {offset}")
                done += got
            return
        data = np.ascontiguousarray(source).reshape(-1).view(np.uint8)
        self._check_size(slot, data.nbytes)
        self.memory.view(np.uint8, (data.nbytes,), start)[:] = data

    def _start(self, slot: int) -> int:
        if not 0 <= slot < self.count:
            raise BindError(f"slot {slot} does not exist: there are {self.count}")
        return slot * self.slot_size

    def _check_size(self, slot: int, nbytes: int) -> None:
        if nbytes > self.slot_size:
            raise BindError(f"slot {slot} holds {self.slot_size} bytes; the weight has {nbytes}: make the "
                            f"slots bigger")

    def close(self) -> None:
        """Free the slots (refused while a session reads a weight from them)."""
        self.memory.close()
