"""The runtime layer: needs only numpy and the standard library."""

from .model import IOSpec, Model, load
from .session import Session, Stats

__all__ = ["IOSpec", "Model", "Session", "Stats", "load"]
