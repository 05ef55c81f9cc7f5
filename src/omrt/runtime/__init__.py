"""The runtime layer: needs only numpy and the standard library.

`model` maps a `.om` file and prepares its programs (`prepare`); a `session` holds an arena and
the caller's buffers and applies the zero-copy rules; the `executor` runs a prepared program's
instructions over that arena.
"""

from .model import Model, load
from .prepare import IOSpec
from .session import Session, Stats

__all__ = ["IOSpec", "Model", "Session", "Stats", "load"]
