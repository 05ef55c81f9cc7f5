"""`IOPool`: fixed sets of input and output memory for a model, allocated once.

A server takes a set per request, binds it, runs, and gives it back: no allocation per request
(the buffer pool of seed 003's llama0.c). Each set is one `Memory` (shared, locked or huge-page
if asked) carved into the model's inputs and outputs at aligned offsets.
"""

from __future__ import annotations

import queue
import weakref
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import numpy as np

from ..errors import BindError, InputError
from ..memory import Memory, align

if TYPE_CHECKING:
    from .model import Model
    from .session import Session


class IOSet:
    """One set of a pool: `arrays` (name -> numpy view) over one `memory`; bind it to sessions
    with `bind`, give it back with `release` (or leave the `with` block)."""

    def __init__(self, pool: "IOPool", memory: Memory, layout: Mapping[str, tuple[np.dtype, tuple, int]]) -> None:
        self.pool = pool
        self.memory = memory
        self.layout = dict(layout)
        """name -> (dtype, shape, byte offset in `memory`)."""
        self.arrays = {name: memory.view(dtype, shape, offset) for name, (dtype, shape, offset) in layout.items()}
        self._sessions: weakref.WeakSet = weakref.WeakSet()
        self.free = True
        """In the pool's free queue: a second release must not put it there twice."""

    def __getitem__(self, name: str) -> np.ndarray:
        return self.arrays[name]

    def bind(self, session: "Session") -> None:
        """Bind every tensor of the set to `session` (its memory, in place)."""
        for name, array in self.arrays.items():
            session._bind_view(name, array, self.memory)  # the set's own views: nothing is made per request
        self._sessions.add(session)

    def release(self) -> None:
        """Unbind the set from the sessions it was bound to and give it back to its pool."""
        for session in list(self._sessions):
            for name in self.layout:
                if session.bound_memory(name) is self.memory:
                    session.unbind(name)
        self._sessions.clear()
        if not self.free:
            self.free = True
            self.pool._free.put(self)

    def __enter__(self) -> "IOSet":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()


class IOPool:
    """`count` sets of input and output memory for `model` (at its stored plan, or `shapes`),
    allocated once with the flags of `Memory.allocate` (shared=True to hand them to another
    process)."""

    def __init__(self, model: "Model", count: int = 4, shapes: Mapping[str, Sequence[int]] | None = None,
                 **flags: Any) -> None:
        if count < 1:
            raise InputError(f"IOPool(count={count}): a pool needs at least one set")
        layout, nbytes = self._layout(model, shapes)
        self.sets = [IOSet(self, Memory.allocate(max(nbytes, 1), name="omrt-io", **flags), layout)
                     for _ in range(count)]
        self._free: queue.Queue = queue.Queue()
        for io_set in self.sets:
            self._free.put(io_set)

    @staticmethod
    def _layout(model: "Model", shapes: Mapping[str, Sequence[int]] | None) -> tuple[dict, int]:
        prep = model.default if shapes is None else model.prepared(shapes)
        if prep is None:
            raise InputError(f"{model!r} has symbolic input shapes: pass shapes={{name: shape}} for the pool")
        layout, cursor = {}, 0
        for spec in [s for s in model.inputs + model.outputs if s.kind == "tensor"]:
            if spec.name in layout:
                continue
            shape = tuple(prep.program.shapes[spec.name])
            layout[spec.name] = (spec.dtype, shape, cursor)
            cursor += align(int(np.prod(shape, dtype=np.int64)) * spec.dtype.itemsize)
        return layout, cursor

    def acquire(self, timeout: float | None = None) -> IOSet:
        """A free set (waiting up to `timeout` seconds for one; None waits as long as it takes)."""
        try:
            io_set = self._free.get(timeout=timeout)
        except queue.Empty:
            raise BindError(f"no free set in the pool of {len(self.sets)} after {timeout} s; release sets "
                            f"when their runs are done, or make the pool bigger") from None
        io_set.free = False
        return io_set

    def close(self) -> None:
        """Close every set's memory (refused while one is still bound)."""
        for io_set in self.sets:
            io_set.arrays.clear()  # its own views first: close() refuses while views are alive
            io_set.memory.close()
