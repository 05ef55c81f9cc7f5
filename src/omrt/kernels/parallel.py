"""omrt's own intra-op threads: a small persistent worker pool, and the BLAS library pinned to one thread.

OpenBLAS splits each GEMM across its threads, which pays for big products but not for the many
small ones of a CNN, and its threads spin waiting on each other when another process holds a
core. With `set_num_threads(n)`, n > 1, omrt instead splits its kernels' work into independent
pieces (column chunks of a convolution, row or column blocks of a product, groups) and runs them
on n threads of its own, each piece a single-threaded BLAS call or numpy loop that releases the
GIL. Pieces are taken first come, first served: when a worker is late (its core busy), the caller
takes its share and never waits for a worker that took nothing. (A model's native kernels run
their layers on the native library's own threads, csrc/workers.c, told the same count.)
"""

from __future__ import annotations

import itertools
import os
import queue
import threading
import time
import warnings
from collections import Counter
from typing import Callable

import numpy as np

from ..native.blas import openblas

MAX_SLOTS = 2
"""How many private scratch buffers a kernel plans for (one per thread that runs its pieces).

Plans are made once at compile time, before the thread count is known; a kernel given more
threads still runs its buffer-bound pieces on at most that many of them.
"""

MIN_FLOPS = 1 << 24
"""Products smaller than this (multiply-adds times two) run whole: a split would cost more in
handoff than it saves."""

NATIVE_SPLIT_FLOPS = 1 << 21
"""Native calls with at least this much work (multiply-adds times two) spread it over omrt's
threads: the native workers take a part in microseconds, where a Python handoff takes tens."""

NATIVE_SPLIT_BYTES = 1 << 16
"""Native calls over at least this many bytes of planes (depthwise layers, pools) spread them."""


_blas_before: int | None = None
"""The BLAS thread count omrt found before it pinned BLAS to one thread (None: not pinned)."""


def _pin_blas(pin: bool) -> None:
    """Pin OpenBLAS to one thread (pin) or give it back the count it had (not pin)."""
    global _blas_before
    blas = openblas()
    before = blas.get() if blas.get is not None else None
    if before is None:
        if pin:
            warnings.warn("omrt.set_num_threads: no OpenBLAS library is loaded in this process, so omrt "
                          "cannot pin numpy's BLAS to one thread; omrt's threads will run alongside the "
                          "BLAS library's own. Limit those with its environment variable (for example "
                          "MKL_NUM_THREADS=1) before numpy is imported.", RuntimeWarning, stacklevel=3)
        return
    if pin and _blas_before is None:
        _blas_before = before
        blas.set(1)
    elif not pin and _blas_before is not None:
        blas.set(_blas_before)
        _blas_before = None


class _Job:
    """One parallel_for call: items are handed out by a counter; whoever finishes the last one
    releases `done`."""

    __slots__ = ("fn", "count", "take", "finish", "done", "error")

    def __init__(self, fn: Callable[[int, int], None], count: int) -> None:
        self.fn, self.count = fn, count
        self.take = itertools.count().__next__
        self.finish = itertools.count(1).__next__
        self.done = threading.Lock()
        self.done.acquire()
        self.error: BaseException | None = None

    def work(self, slot: int) -> None:
        """Take items until none is left, adding each one's time to `slot`'s busy time before it
        counts as finished (so the caller, once released, reads every share)."""
        fn, count, take = self.fn, self.count, self.take
        while True:
            i = take()
            if i >= count:
                return
            t0 = time.perf_counter_ns()
            try:
                fn(i, slot)
            except BaseException as e:  # noqa: BLE001 - handed to the caller, raised there
                if self.error is None:
                    self.error = e
            _busy[slot] += time.perf_counter_ns() - t0
            if self.finish() == count:
                self.done.release()


_busy: Counter = Counter()
"""Nanoseconds each thread slot has spent on its shares of split parallel_for calls since the
process started (what csrc/workers.c counts for the native pool; items run alone count for no
slot): they only grow."""


def busy_ns(threads: int) -> list[int]:
    """Nanoseconds each of the first `threads` slots (0: the calling thread) has spent on its
    shares of split parallel_for calls so far; a profile subtracts two readings."""
    return [_busy[slot] for slot in range(threads)]


_local = threading.local()


def _serve(inbox: "queue.SimpleQueue[_Job | None]", slot: int) -> None:
    _local.worker = True
    while True:
        job = inbox.get()
        if job is None:
            return
        job.work(slot)


class _Pool:
    """Worker threads 1..n-1 (the caller is slot 0), each waiting on its own inbox."""

    def __init__(self, workers: int) -> None:
        self.inboxes: list[queue.SimpleQueue] = []
        self.threads: list[threading.Thread] = []
        for slot in range(1, workers + 1):
            inbox: queue.SimpleQueue = queue.SimpleQueue()
            t = threading.Thread(target=_serve, args=(inbox, slot), name=f"omrt-worker-{slot}", daemon=True)
            t.start()
            self.inboxes.append(inbox)
            self.threads.append(t)

    def close(self) -> None:
        for inbox in self.inboxes:
            inbox.put(None)
        for t in self.threads:
            t.join()


_threads = 1
_pool: _Pool | None = None


def _restart_in_child() -> None:
    """A forked child has none of its parent's threads: give it workers of its own."""
    global _pool
    if _pool is not None:
        _pool = _Pool(_threads - 1)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_restart_in_child)


def set_num_threads(n: int) -> None:
    """Run omrt's kernels on `n` threads (the calling one and n - 1 workers of omrt's own).

    n > 1 pins numpy's OpenBLAS to one thread, since omrt splits the work itself; n == 1 (the
    default) runs everything on the calling thread and gives OpenBLAS back the thread count it had
    before. The setting is process-wide; change it between runs, not during one.
    """
    global _threads, _pool
    n = int(n)
    if n < 1:
        raise ValueError(f"set_num_threads({n}): the thread count must be at least 1")
    if n == _threads:
        return
    if _pool is not None:
        _pool.close()
        _pool = None
    _pin_blas(n > 1)
    if n > 1:
        _pool = _Pool(n - 1)
    _threads = n


def get_num_threads() -> int:
    """The thread count omrt's kernels run on (set by `set_num_threads`)."""
    return _threads


def parallel_for(count: int, fn: Callable[[int, int], None], slots: int = 0) -> None:
    """Call fn(item, slot) for every item in range(count), spread over omrt's threads.

    `slot` (0 for the calling thread) tells which thread runs the item, so that a kernel can give
    each thread its own scratch buffer; `slots` > 0 caps how many threads take part (the buffers
    the kernel has). Items must write disjoint memory. Runs sequentially with one thread, on a
    worker thread (no nesting) or for a single item; the first exception an item raises is raised
    here once all items are done.
    """
    width = min(_threads, count, slots or _threads)
    if width <= 1 or getattr(_local, "worker", False):
        for i in range(count):
            fn(i, 0)
        return
    job = _Job(fn, count)
    for inbox in _pool.inboxes[:width - 1]:
        inbox.put(job)
    job.work(0)
    job.done.acquire()
    if job.error is not None:
        raise job.error


def spans(total: int, parts: int) -> list[tuple[int, int]]:
    """`total` split into `parts` (at most `total`) nearly equal consecutive [start, stop) ranges."""
    parts = max(1, min(parts, total))
    return [(total * p // parts, total * (p + 1) // parts) for p in range(parts)]


def matmul(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
    """np.matmul(a, b, out=out), split into independent products over omrt's threads when it pays.

    The split is along the largest batch dim of `out` when it has enough entries, else along the
    longer of its rows and columns (every thread re-reads the operand of the shorter side, so
    that side is the one to share). Every piece writes a disjoint view of `out`.
    """
    if _threads == 1 or out.ndim == 0 or 2 * out.size * a.shape[-1] < MIN_FLOPS:
        np.matmul(a, b, out=out)
        return
    pieces = matmul_pieces(a, b, out, _threads)
    parallel_for(len(pieces), lambda i, slot: np.matmul(*pieces[i][:2], out=pieces[i][2]))


def matmul_pieces(a: np.ndarray, b: np.ndarray, out: np.ndarray,
                  parts: int) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """(a, b, out) views whose products, taken together, write every element of a @ b once."""
    a2 = a[None, :] if a.ndim == 1 else a
    b2 = b[:, None] if b.ndim == 1 else b
    o2 = out.reshape(out.shape[:-1] + (1, out.shape[-1])) if a.ndim == 1 else out
    o2 = o2[..., None] if b.ndim == 1 else o2
    batch = o2.shape[:-2]
    axis = int(np.argmax(batch)) if batch else -1
    if batch and batch[axis] >= parts:
        lead = (slice(None),) * axis

        def cut(x: np.ndarray, lo: int, hi: int) -> np.ndarray:
            k = axis - (o2.ndim - x.ndim)
            return x if k < 0 or x.shape[k] == 1 else x[(slice(None),) * k + (slice(lo, hi),)]

        return [(cut(a2, lo, hi), cut(b2, lo, hi), o2[lead + (slice(lo, hi),)])
                for lo, hi in spans(batch[axis], parts)]
    rows, cols = o2.shape[-2:]
    if rows >= cols:
        return [(a2[..., lo:hi, :], b2, o2[..., lo:hi, :]) for lo, hi in spans(rows, parts)]
    return [(a2, b2[..., lo:hi], o2[..., lo:hi]) for lo, hi in spans(cols, parts)]


def native_threads(flops: int | None = None, nbytes: int | None = None, slots: int = 0) -> int:
    """The threads a native call with this much work runs on: all of omrt's (at most `slots`,
    the scratch buffers it has, when given) for big work, else one."""
    big = flops >= NATIVE_SPLIT_FLOPS if flops is not None else nbytes >= NATIVE_SPLIT_BYTES
    threads = get_num_threads() if big else 1
    return min(threads, slots) if slots else threads
