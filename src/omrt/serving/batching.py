"""Dynamic batching: requests that arrive within a window run as one batch along a free first
dimension, and each client gets its own rows back.

The batch's inputs are gathered (copied) into a worker's batch buffers, the model runs once on
them, writing its outputs into the worker's output buffers, and each request's rows are copied
into its client's memory (or sent as bytes). Both copies are counted: batching trades them for
one run instead of many.
"""

from __future__ import annotations

import collections
import queue
import time
import numpy as np

from ..errors import InputError
from ..runtime import Model, Session
from .request import Request

BUFFER_SETS = 8
"""Batch buffer sets a worker keeps (one per batch signature, the least recently used dropped)."""


def batch_dim(model: Model) -> str:
    """The model's free batch dimension: dim 0 of every tensor input and output, one symbol; an
    InputError says why the model has none."""
    tensors = [s for s in model.inputs + model.outputs if s.kind == "tensor"]
    first = {s.name: (s.shape[0] if len(s.shape) else None) for s in tensors}
    symbol = first[model.inputs[0].name] if model.inputs else None
    if not isinstance(symbol, str):
        raise InputError(f"dynamic batching needs a free first dim on every input and output; input "
                         f"{model.inputs[0].name!r} has dim 0 = {symbol!r}: serve it without --batch-window, or "
                         f"compile it with a symbolic batch dim")
    fixed = sorted(name for name, dim in first.items() if dim != symbol)
    if fixed:
        raise InputError(f"dynamic batching splits rows along dim 0 ({symbol!r}); {fixed} do not have it as "
                         f"their first dim: serve this model without --batch-window")
    return symbol


class Collector:
    """Takes the next batch of a worker off the queue: the first request, then compatible ones
    that arrive until `window` seconds after it arrived, up to `max_rows` rows. A request that
    does not fit starts the next batch."""

    def __init__(self, requests: queue.Queue, window: float, max_rows: int) -> None:
        self._queue = requests
        self._window = window
        self._max_rows = max_rows
        self._carried: list[Request | None] = []

    def next(self) -> list[Request] | None:
        """The next batch (one request when batching is off or it cannot batch); None at the
        end (a None on the queue)."""
        first = self._carried.pop() if self._carried else self._queue.get()
        if first is None or not self._window:
            return None if first is None else [first]
        key, batch, rows = first.batch_key(), [first], first.rows
        deadline = first.arrived + self._window
        while key is not None and rows < self._max_rows:
            wait = deadline - time.monotonic()
            try:
                nxt = self._queue.get(timeout=wait) if wait > 0 else self._queue.get_nowait()
            except queue.Empty:
                break
            if nxt is None or nxt.batch_key() != key or rows + nxt.rows > self._max_rows:
                self._carried.append(nxt)
                break
            batch.append(nxt)
            rows += nxt.rows
        return batch

    @property
    def carried(self) -> int:
        """Requests taken off the queue and not yet run (0 or 1)."""
        return sum(r is not None for r in self._carried)


class BatchBuffers:
    """A worker's input and output buffers per batch signature, allocated once each."""

    def __init__(self, model: Model) -> None:
        self._model = model
        self._sets: collections.OrderedDict[tuple, tuple[dict, dict]] = collections.OrderedDict()

    def get(self, shapes: dict[str, tuple[int, ...]]) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        key = tuple(sorted(shapes.items()))
        if key not in self._sets:
            program = self._model.prepared(shapes).program
            ins = {s.name: np.empty(shapes[s.name], s.dtype) for s in self._model.inputs}
            outs = {s.name: np.empty(program.shapes[s.name], s.dtype) for s in self._model.outputs
                    if s.name not in ins}
            self._sets[key] = (ins, outs)
            if len(self._sets) > BUFFER_SETS:
                self._sets.popitem(last=False)
        self._sets.move_to_end(key)
        return self._sets[key]


Answer = tuple[Request, dict[str, np.ndarray], int]
"""A request that ran, the outputs its answer carries as bytes, and the bytes copied for it."""


def run_batch(session: Session, buffers: BatchBuffers, batch: list[Request]) -> tuple[list[Answer], int]:
    """Run `batch` as one: gather its inputs, run once into the batch's output buffers, scatter
    each request's rows into its memory. Returns the answers (their returned outputs are views
    of the batch buffers, valid until the worker's next batch) and the bytes the session
    copied."""
    first = batch[0]
    total = sum(r.rows for r in batch)
    shapes = {name: (total, *a.shape[1:]) for name, a in first.inputs.items()}
    ins, outs = buffers.get(shapes)
    gathered = {id(r): 0 for r in batch}
    for name, buf in ins.items():
        np.concatenate([r.inputs[name] for r in batch], out=buf)
        for r in batch:
            gathered[id(r)] += r.inputs[name].nbytes
    session.prepare(shapes)
    before = session.stats.bytes_copied
    for name, buf in outs.items():
        session.bind(name, buf)
    try:
        session.run(ins)
    finally:
        for name in outs:
            session.unbind(name)
    answers, start = [], 0
    for r in batch:
        rows = {name: buf[start:start + r.rows] for name, buf in {**ins, **outs}.items()}
        for name, target in r.outputs.items():
            np.copyto(target, rows[name])
            gathered[id(r)] += target.nbytes
        answers.append((r, {name: rows[name] for name in r.returned}, gathered[id(r)]))
        start += r.rows
    return answers, session.stats.bytes_copied - before
