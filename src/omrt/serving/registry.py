"""The memory one client registered with a server: fds mapped once, referred to by id.

A client sends an fd once (REGISTER); the server maps it (`Memory.from_fd`, which keeps its own
duplicate of the fd), closes the fd it received, and answers an id. Requests then name the id
and an offset. UNREGISTER, or the client's disconnect, drops the mapping: it is unmapped then,
or, when a request still runs on it, as soon as that request's views are gone.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from ..errors import AllocationError, BindError, ServingError
from ..memory import Memory
from .protocol import MAX_BYTES, Ref, close_all, whole

MAX_MEMORIES = 64
"""The most memories one connection may have registered at once."""


class Registry:
    """A connection's registered memories by id; used by its reader thread only."""

    def __init__(self) -> None:
        self._memories: dict[int, Memory] = {}
        self._next = 1

    def __len__(self) -> int:
        return len(self._memories)

    def register(self, fds: list[int], meta: Any) -> dict:
        """Map each fd as the entry of `meta["memories"]` at its index describes it ({"size",
        "offset", "writable"}); all or none. The fds received are closed in every case."""
        try:
            entries = meta.get("memories") if isinstance(meta, dict) else None
            if not isinstance(entries, list) or len(entries) != len(fds) or not fds:
                raise ServingError(f"REGISTER carries {len(fds)} fds and must describe each in 'memories' "
                                   f"(a list of {{size, offset, writable}}, one per fd, in order)")
            if len(self._memories) + len(fds) > MAX_MEMORIES:
                raise ServingError(f"a connection may register at most {MAX_MEMORIES} memories; "
                                   f"{len(self._memories)} are registered: unregister some first")
            mapped = [_map(fd, entry, f"memories[{i}]") for i, (fd, entry) in enumerate(zip(fds, entries))]
        finally:
            close_all(fds)
        ids = list(range(self._next, self._next + len(mapped)))
        self._next += len(mapped)
        self._memories.update(zip(ids, mapped))
        return {"ids": ids, "writable": [m.writable for m in mapped]}

    def unregister(self, meta: Any) -> dict:
        """Drop the memories whose ids `meta["ids"]` lists."""
        ids = meta.get("ids") if isinstance(meta, dict) else None
        if not isinstance(ids, list):
            raise ServingError("UNREGISTER must list the memory ids to drop in 'ids'")
        unknown = [i for i in ids if i not in self._memories]
        if unknown:
            raise ServingError(f"memories {unknown} are not registered on this connection; registered: "
                               f"{sorted(self._memories)}")
        for i in ids:
            _drop(self._memories.pop(i))
        return {"ids": ids}

    def view(self, ref: Ref, field: str, output: bool) -> np.ndarray:
        """The array `ref` names in registered memory, checked: the memory exists, holds the
        bytes (still: its fd may have shrunk since), and, for an output, is writable."""
        memory = self._memories.get(ref.memory)
        if memory is None:
            raise ServingError(f"{field}: memory {ref.memory} is not registered on this connection; register it "
                               f"first (Client.register) and use the id it answers")
        if output and not memory.writable:
            raise BindError(f"{field}: memory {ref.memory} is mapped read-only (its fd was opened or sealed "
                            f"read-only, or registered so): register writable memory for outputs, e.g. "
                            f"omrt.Memory.allocate(n, shared=True)")
        end = ref.offset + ref.nbytes
        if end > memory.nbytes or os.fstat(memory.fd).st_size < memory.fd_offset + end:
            raise BindError(f"{field} ({ref.dtype} {list(ref.shape)}) needs {ref.nbytes} bytes at offset "
                            f"{ref.offset}; memory {ref.memory} holds {min(memory.nbytes, _fd_bytes(memory))}: "
                            f"register larger memory or pass a smaller offset")
        return memory.view(ref.dtype, ref.shape, ref.offset)

    def close(self) -> None:
        """Drop every memory (the client is gone)."""
        for memory in self._memories.values():
            _drop(memory)
        self._memories.clear()


def _map(fd: int, entry: Any, field: str) -> Memory:
    """Map one fd as `entry` describes it; read-only when the fd allows no more (an output then
    refuses it by name)."""
    if not isinstance(entry, dict):
        raise ServingError(f"{field} must be an object {{size, offset, writable}}")
    size = whole(entry.get("size"), f"{field}.size", 1, MAX_BYTES)
    offset = whole(entry.get("offset", 0), f"{field}.offset")
    writable = entry.get("writable", True) is True
    try:
        return Memory.from_fd(fd, size, offset, writable=writable)
    except AllocationError as e:
        if not writable:
            raise AllocationError(f"{field}: {e}") from None
    try:
        return Memory.from_fd(fd, size, offset, writable=False)
    except AllocationError as e:
        raise AllocationError(f"{field}: {e}") from None


def _fd_bytes(memory: Memory) -> int:
    return max(os.fstat(memory.fd).st_size - memory.fd_offset, 0)


def _drop(memory: Memory) -> None:
    """Unmap now, or, while a running request still views it, when its last view goes (the
    mapping cannot be closed under an exported buffer; the fd closes with the Memory)."""
    try:
        memory.close()
    except BindError:
        pass
