"""Weights streamed through fixed slots while a session runs (the plan is omrt.plan.stream's).

Each session of a model loaded with a weight budget owns its slots: one `Memory` of K uniform,
page-aligned slots, allocated once. A background thread reads each streamed weight from the model
file into its slot (`os.preadv`: no page of the file is mapped into the process) as soon as the
slot's previous occupant has been read for the last time, and drops the pages it read from the
page cache (`posix_fadvise(DONTNEED)`) unless asked to keep them. The executor waits for a fill
before its first reader and frees the slot after its last. When a run ends, the fills of the next
one start at once.
"""

from __future__ import annotations

import os
import queue
import threading
from typing import Any

import numpy as np

from ..errors import BindError, FormatError, OmrtError
from ..memory import Memory, align
from ..plan.stream import StreamPlan

FOLIO = 2 << 20
"""The largest block the page cache may hold a file in (a 2 MiB huge-page folio on x86-64 and
most aarch64 kernels). Dropping a range only frees the blocks wholly inside it, so drops are
made on these boundaries (see `WeightFile._drop`)."""
CHUNK = 8 << 20
"""Bytes read between two drops from the page cache (a multiple of FOLIO)."""


class WeightFile:
    """Where streamed weights are read from: the model file, by offset, checked not to change."""

    def __init__(self, fd: int, offsets: dict[str, int], size: int, keep_cache: bool) -> None:
        self.fd = fd
        self.offsets = offsets
        """weight key -> byte offset in the file."""
        self.size = size
        self.keep_cache = keep_cache

    def read(self, key: str, into: np.ndarray) -> None:
        """Read weight `key` into `into` (its exact bytes), or a FormatError naming it. Unless the
        cache is kept, the pages read leave the page cache every CHUNK bytes, so a read holds at
        most about CHUNK bytes of cache at any time, whatever the weight's size."""
        offset = self.offsets[key]
        if os.fstat(self.fd).st_size != self.size:
            raise FormatError(f"weight {key!r}: the model file changed size under the running model "
                              f"({self.size} bytes at load, {os.fstat(self.fd).st_size} now); load it again")
        flat, done = memoryview(into).cast("B"), 0
        while done < into.nbytes:
            at = offset + done
            step = min(into.nbytes - done, CHUNK - at % CHUNK)  # chunks end on the file's CHUNK boundaries
            try:
                got = os.preadv(self.fd, [flat[done:done + step]], at)
            except OSError as e:
                raise FormatError(f"weight {key!r}: reading {into.nbytes} bytes at {offset} of the model file "
                                  f"failed ({e.strerror})") from None
            if got != step:
                raise FormatError(f"weight {key!r}: the model file ended after {done + got} of its {into.nbytes} "
                                  f"bytes; it changed under the running model: load it again")
            if not self.keep_cache:
                self._drop(at, at + step)
            done += step

    def _drop(self, start: int, end: int) -> None:
        """Drop the page-cache blocks that start within [start, end) and that the read filled: a
        block that starts before `start` holds bytes read just now; one that begins before `end`
        but ends after it holds the next weight's first bytes, read ahead by the kernel, which
        the next read uses (and then drops)."""
        first, last = start - start % FOLIO, end - end % FOLIO
        if last > first:
            os.posix_fadvise(self.fd, first, last - first, os.POSIX_FADV_DONTNEED)

    def forget(self) -> None:
        """Unless the cache is kept, drop every page of the file from the page cache: what loading
        and preparing read of it (partitions, read-ahead around them) is not the budget's either."""
        if not self.keep_cache:
            os.posix_fadvise(self.fd, 0, 0, os.POSIX_FADV_DONTNEED)

    def read_resident(self, like: dict[str, np.ndarray]) -> tuple[Memory, dict[str, np.ndarray]]:
        """Read these weights once into one anonymous allocation: (the memory, read-only arrays of
        the dtypes and shapes of `like`, by key)."""
        starts, total = {}, 0
        for key, array in like.items():
            starts[key] = total
            total = align(total + array.nbytes, 64)
        memory = Memory.allocate(max(total, 1), name="omrt-resident-weights")
        arrays = {}
        for key, array in like.items():
            arrays[key] = memory.view(array.dtype, array.shape, starts[key])
            self.read(key, arrays[key])
            arrays[key].flags.writeable = False
        return memory, arrays


class _Run:
    """One run's progress: fills read, and fills whose slot is free again."""

    def __init__(self, count: int) -> None:
        self.filled = [threading.Event() for _ in range(count)]
        self.consumed = [threading.Event() for _ in range(count)]
        self.error: tuple[int, BaseException] | None = None
        self.cancelled = False

    def cancel(self) -> None:
        """Let the filler finish this run without reading anything more."""
        self.cancelled = True
        for event in self.consumed:
            event.set()


class WeightStream:
    """A session's slots and the thread that fills them (see the module docstring)."""

    def __init__(self, plan: StreamPlan, source: WeightFile, infos: dict[str, Any]) -> None:
        self.plan = plan
        self.source = source
        self.memory = Memory.allocate(max(plan.slots * plan.slot_size, 1), name="omrt-weight-slots")
        self.views = {f.key: self.memory.view(infos[f.key].dtype, infos[f.key].shape, f.slot * plan.slot_size)
                      for f in plan.fills}
        """weight key -> its array in its slot (valid between its fill and its last reader)."""
        self.first_at: dict[int, list[int]] = {}
        self.last_at: dict[int, list[int]] = {}
        for i, f in enumerate(plan.fills):
            self.first_at.setdefault(f.first, []).append(i)
            self.last_at.setdefault(f.last, []).append(i)
        self.reads = 0
        """Weights read into slots so far."""
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._next: _Run | None = None
        self._thread = threading.Thread(target=self._fill_runs, name="omrt-weight-filler", daemon=True)
        self._thread.start()

    def _fill_runs(self) -> None:
        while True:
            run = self._queue.get()
            if run is None:
                return
            for i, f in enumerate(self.plan.fills):
                if f.previous is not None:
                    run.consumed[f.previous].wait()
                if run.cancelled:
                    break
                try:
                    self.source.read(f.key, self.views[f.key].reshape(-1).view(np.uint8))
                    self.reads += 1
                except BaseException as e:  # noqa: BLE001 - handed to the run, raised there
                    run.error = (i, e)
                    break
                finally:
                    run.filled[i].set()
            for event in run.filled:
                event.set()

    def begin(self) -> _Run:
        """The fills of a run that starts now (already under way when the last run read ahead)."""
        run, self._next = self._next, None
        if run is None:
            run = _Run(len(self.plan.fills))
            self._queue.put(run)
        return run

    def before(self, run: _Run, task: int) -> None:
        """Wait for the weights task `task` is the first to read."""
        for i in self.first_at.get(task, ()):
            run.filled[i].wait()
            if run.error is not None:
                index, error = run.error
                key = self.plan.fills[index].key
                if isinstance(error, OmrtError):
                    raise error
                raise FormatError(f"weight {key!r} could not be read into its slot: {error}") from error

    def after(self, run: _Run, task: int) -> None:
        """Free the slots of the weights task `task` was the last to read."""
        for i in self.last_at.get(task, ()):
            run.consumed[i].set()

    def end(self, run: _Run, completed: bool) -> None:
        """Close a run: start reading ahead for the next one when it completed, else cancel."""
        if not completed:
            run.cancel()
            return
        self._next = _Run(len(self.plan.fills))
        self._queue.put(self._next)

    def close(self) -> None:
        """Stop the filler and free the slots."""
        if self._next is not None:
            self._next.cancel()
        self._queue.put(None)
        self._thread.join()
        self.source.forget()  # what the kernel read ahead for the cancelled run leaves the cache too
        self.views.clear()
        try:
            self.memory.close()
        except BindError:
            pass  # views an exception's traceback still holds: the slots are unmapped when they go
