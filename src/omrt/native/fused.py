"""Generated fused kernels: the KERNELS record of kind 3, built at compile time, loaded at run time.

`omrt compile` finds a model's elementwise chains (omrt.compiler.autofuse), writes one C function
per chain (`fusegen`) and builds them all into one shared library with the same compiler and
flags as the native kernels (`build.build_fused`). The record's target lists each function's guard: the
dtypes, shapes and layout of the arrays it was generated for. At load the record runs under the
model's one trust decision and the native library's host checks, and only beside the native
library, whose worker pool it borrows; each call is checked against its guard first.
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

from ..format.kernelstore import Packed
from .library import Bound, Library, thunk_address
from .signature import Address, Array, Function, Int

UNIT = "fused"
USE_POOL = Function(UNIT, "omrt_fused_use_pool", (Address("pool"),))
"""Hands the library the native library's worker pool (csrc/omrt_fused.h)."""

EXTRA_FLAGS = ("-fno-trapping-math", "-ffp-contract=fast")
"""Beside the native kernels' flags: the chains' comparisons (Clip, Relu, Max) may become vector
selects, so every loop vectorizes (only FP exception flags change), and a product and a sum
may be one fused multiply-add where the CPU has it (one rounding instead of two)."""

LAYOUT = "C-contiguous"
"""The only layout generated kernels read and write: every array dense, row-major."""


def guard(inputs: list[tuple[np.dtype, tuple[int, ...]]], outputs: list[tuple[np.dtype, tuple[int, ...]]]
          ) -> dict:
    """The guard of a fused kernel: what each of its arrays must be for its code to run."""
    return {"inputs": [[np.dtype(d).str, list(s)] for d, s in inputs],
            "outputs": [[np.dtype(d).str, list(s)] for d, s in outputs], "layout": LAYOUT}


def contract(symbol: str, spec: dict) -> Function:
    """The checked C signature of the fused kernel `symbol` with guard `spec`: every array float32,
    C-contiguous and exactly the size its guard gives, then the thread count."""
    def floats(shape: list[int]) -> str:
        return str(int(np.prod(shape, dtype=np.int64)))

    args = [Array(f"in{k}", floats(s)) for k, (_, s) in enumerate(spec["inputs"])]
    args += [Array(f"out{k}", floats(s), write=True) for k, (_, s) in enumerate(spec["outputs"])]
    return Function(UNIT, symbol, (*args, Int("threads", 1)))


class FusedLibrary:
    """A model's loaded fused kernels: each function bound to its guard's contract."""

    def __init__(self, cdll: ctypes.CDLL, record: Packed, native: Library) -> None:
        self._cdll = cdll
        self.guards: dict[str, dict] = dict(record.target.get("kernels", {}))
        missing = [s for s in [USE_POOL.symbol, *self.guards] if not hasattr(cdll, s)]
        if missing:
            raise OSError(f"not omrt's fused kernels: it lacks {', '.join(missing[:3])}")
        use_pool = getattr(cdll, USE_POOL.symbol)
        use_pool.argtypes, use_pool.restype = USE_POOL.argtypes, None
        use_pool(*USE_POOL.check([native.pool_address()]))
        self._bound: dict[str, Bound] = {}

    def get(self, symbol: str, spec: Any) -> Bound | None:
        """The checked function of `symbol` when the library holds it with this very guard."""
        if self.guards.get(symbol) != spec:
            return None
        hit = self._bound.get(symbol)
        if hit is None:
            fn = contract(symbol, spec)
            cfunc = getattr(self._cdll, symbol)
            cfunc.argtypes, cfunc.restype = fn.argtypes, None
            hit = self._bound[symbol] = Bound(fn, cfunc, thunk_address(self._cdll, symbol))
        return hit

    def calls(self) -> dict[str, int]:
        """symbol -> how many times this model ran it."""
        return {symbol: bound.calls for symbol, bound in self._bound.items() if bound.calls}
