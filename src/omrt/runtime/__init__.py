"""The runtime layer: needs only numpy and the standard library.

`model` maps a `.om` file and prepares its programs (`prepare`); a `session` holds an arena and
the caller's buffers and applies the zero-copy rules; the `executor` runs a prepared program's
instructions over that arena.
"""

from .io import Stats
from .model import Model, arena_size, load
from .pool import IOPool, IOSet
from .prepare import IOSpec
from .profile import OpThreads, ThreadProfile
from .session import Session
from .single_op import run_op
from .slots import WeightSlots

__all__ = ["IOPool", "IOSet", "IOSpec", "Model", "OpThreads", "Session", "Stats", "ThreadProfile", "WeightSlots",
           "arena_size", "load", "run_op"]
