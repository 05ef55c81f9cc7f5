"""What a profiled run measures: wall time per op type, and how busy omrt's threads were meanwhile.

omrt's kernels spread work over its own threads (the native library's worker pool,
csrc/workers.c, and `kernels.parallel` for kernels without a native path). Both count, per
thread, the time it spends on its share of each split call; a `Tally` reads those counters
before and after every task, so each op type gets its wall time and each thread's busy time
during it. What runs anywhere else (numpy, OpenBLAS's own threads, a kernel that does not split
its work, Python between kernels) keeps only the calling thread busy: the other threads show it
as idle, which is what the figure is for: where the second core idles.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, TypeVar

import numpy as np

from ..kernels.parallel import busy_ns

T = TypeVar("T")

Mark = tuple[float, float, np.ndarray | None]
"""A reading: the clock, the time spent reading counters so far, and each thread's busy
nanoseconds so far (None: threads not read)."""


@dataclass(frozen=True)
class OpThreads:
    """One op type (or fused chain, node, or a whole run): mean seconds per run, and per thread
    (0: the calling one) the mean seconds it spent on omrt's split work meanwhile."""

    seconds: float
    busy: tuple[float, ...]

    @property
    def idle(self) -> float | None:
        """The share of the other threads' time (the second and later cores) spent idle:
        1 - their busy time / (their count x wall time); None with one thread."""
        others = self.busy[1:]
        if not others or self.seconds <= 0:
            return None
        return max(0.0, 1.0 - sum(others) / (len(others) * self.seconds))


@dataclass(frozen=True)
class ThreadProfile:
    """`Session.profile_threads`: each op type's figures, slowest first, and the whole run's
    (its wall time counts everything between the run's start and end, not only kernels)."""

    threads: int
    ops: dict[str, OpThreads]
    run: OpThreads
    round_trip_ns: tuple[float | None, float | None] | None = None
    """How far apart the first two threads' cores were, before and after the runs: the mean
    round trip of a cache line between them, in ns (`omrt.native.library.Library.round_trip_ns`,
    which says how to read it; None for a side no worker answered). None with one thread or no
    native library."""


def around_round_trips(native: Any, threads: int, work: Callable[[], T]) -> tuple[T, tuple | None]:
    """work()'s result, and the cores' round trips before and after it (`ThreadProfile.round_trip_ns`);
    None with one thread or no native library."""
    if native is None or threads < 2:
        return work(), None
    before = native.round_trip_ns()
    done = work()
    return done, (before, native.round_trip_ns())


def round_trip_text(pair: tuple[float | None, float | None] | list) -> str:
    """A before-and-after pair of round trips as '62 / 70 ns' ('-' for a side no worker answered)."""
    return " / ".join("-" if ns is None else f"{ns:.0f}" for ns in pair) + " ns"


def pool_reader(native: Any, threads: int) -> Callable[[], np.ndarray] | None:
    """Each of the first `threads` threads' busy nanoseconds so far, over omrt's Python threads
    and (when the model has one) its native library's pool; None with one thread (nothing to read)."""
    if threads == 1:
        return None

    def read() -> np.ndarray:
        busy = np.array(busy_ns(threads), np.int64)
        return busy + native.pool_busy(threads) if native is not None else busy
    return read


RUN = ""
"""The key of whole runs (no op type is named so)."""


PROFILE_BY = ("op", "node")
"""What a profile adds each task's time to: its op type (each fused chain by its name), or its
node (by name; the compiler names an unnamed ONNX node `<op type>_<index>`)."""


class Tally:
    """Wall seconds per op type (or per node, `by`); with a reader of the threads' busy time,
    their busy time too.

    Reading the counters takes microseconds; that time is measured and left out of every figure
    (the counters do not move while it passes: no split work runs between tasks)."""

    def __init__(self, read: Callable[[], np.ndarray] | None = None, by: str = "op") -> None:
        if by not in PROFILE_BY:
            raise ValueError(f"profile by={by!r}: use one of {', '.join(map(repr, PROFILE_BY))}")
        self.read = read
        self.by = by
        self.wall: Counter = Counter()
        self.busy: dict[str, np.ndarray] = {}
        self.reading = 0.0
        """Seconds spent reading the counters so far."""

    def _busy(self) -> np.ndarray | None:
        if self.read is None:
            return None
        t0 = time.perf_counter()
        busy = self.read()
        self.reading += time.perf_counter() - t0
        return busy

    def start(self) -> Mark:
        busy = self._busy()
        return time.perf_counter(), self.reading, busy

    def stop(self, key: str, mark: Mark) -> None:
        """Add what passed since `mark` to `key`, less the reading done meanwhile."""
        t0, reading0, busy0 = mark
        self.wall[key] += time.perf_counter() - t0 - (self.reading - reading0)
        if busy0 is not None:
            self.busy[key] = self.busy.get(key, 0) + (self._busy() - busy0)

    def figures(self, key: str, runs: int) -> OpThreads:
        """`key`'s means over `runs` runs."""
        return OpThreads(self.wall[key] / runs, tuple(float(b) * 1e-9 / runs for b in self.busy.get(key, ())))

    def profile(self, threads: int, runs: int, round_trip_ns: tuple | None = None) -> ThreadProfile:
        """The figures of every op type, slowest first, and of the whole run."""
        ops = {key: self.figures(key, runs) for key, _ in self.wall.most_common() if key != RUN}
        return ThreadProfile(threads, ops, self.figures(RUN, runs), round_trip_ns)
