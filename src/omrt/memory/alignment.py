"""Alignment: the one rule every planned byte follows.

Arena blocks, I/O fallback blocks, weights in the file and workspace arrays all start on a
64-byte boundary (a cache line, and the widest vector load of AVX-512), and their sizes are
rounded up to it, so that any two of them can sit side by side without sharing a line.
"""

from __future__ import annotations

import numpy as np

ALIGN = 64


def align(nbytes: int, alignment: int = ALIGN) -> int:
    """`nbytes` rounded up to a multiple of `alignment`."""
    return -(-nbytes // alignment) * alignment


def aligned_empty(nbytes: int) -> np.ndarray:
    """A new uint8 array of `nbytes` whose first byte is ALIGN-aligned."""
    raw = np.empty(nbytes + ALIGN, np.uint8)
    start = (-raw.ctypes.data) % ALIGN
    return raw[start:start + nbytes]
