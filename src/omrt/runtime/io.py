"""The caller's side of I/O: what they pass in (arrays, DLPack tensors, sequences, optionals),
what they get back when a value must be copied, and the count of every copy (`Stats`)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import InputError
from .prepare import IOSpec


@dataclass
class Stats:
    """What a session has done: runs, copies by reason and bytes copied, syncs, memory figures."""

    runs: int = 0
    copies: Counter = field(default_factory=Counter)
    bytes_copied: int = 0
    arena_bytes: int = 0
    lower_bound: int = 0
    io_fallback_bytes: int = 0
    syncs: int = 0
    """Device syncs of bound memory around runs (dma-buf brackets, msync): none on plain memory."""

    def count(self, reason: str, nbytes: int) -> None:
        self.copies[reason] += 1
        self.bytes_copied += nbytes


def as_array(obj: Any, name: str) -> np.ndarray:
    if isinstance(obj, np.ndarray):
        return obj
    if hasattr(obj, "__dlpack__"):
        return np.from_dlpack(obj)
    raise InputError(f"tensor {name!r}: expected a numpy array or a DLPack tensor, got "
                     f"{type(obj).__name__}; wrap buffers with np.frombuffer(...).reshape(...)")


def span(a: np.ndarray) -> tuple[int, int]:
    start = a.ctypes.data
    return start, start + a.nbytes


def as_value(obj: Any, spec: IOSpec) -> Any:
    """A sequence (list of C-contiguous arrays) or optional (None or element) fed for `spec`."""
    if obj is None:
        if not spec.kind.startswith("optional"):
            raise InputError(f"input {spec.name!r} is a {spec.kind} and cannot be None")
        return None
    holds_list = "sequence" in spec.kind
    if holds_list != isinstance(obj, (list, tuple)):
        raise InputError(f"input {spec.name!r} is a {spec.kind} of {spec.dtype} tensors; pass "
                         f"{'a list of arrays' if holds_list else 'an array'}"
                         f"{' or None' if spec.kind.startswith('optional') else ''}")
    items = [np.require(as_array(x, spec.name), requirements="C")
             for x in (obj if holds_list else [obj])]
    for x in items:
        if x.dtype != spec.dtype:
            raise InputError(f"input {spec.name!r} holds a {x.dtype} tensor, the model needs {spec.dtype}; "
                             f"convert it with .astype(np.{spec.dtype.name})")
    return items if holds_list else items[0]


def owned(value: Any) -> tuple[Any, int]:
    """A copy of a run-time value the caller may keep, and how many bytes were copied."""
    if value is None:
        return None, 0
    if isinstance(value, list):
        items = [np.array(x, copy=True) for x in value]
        return items, sum(x.nbytes for x in items)
    arr = np.array(value, copy=True)
    return arr, arr.nbytes
