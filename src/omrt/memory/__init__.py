"""Memory: the alignment rule every planned byte follows, and `Memory`, the one object for every
piece of memory omrt allocates or is handed (see docs/memory.md)."""

from .alignment import ALIGN, align, aligned_empty
from .memory import Memory

__all__ = ["ALIGN", "Memory", "align", "aligned_empty"]
