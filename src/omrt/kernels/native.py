"""Native kernels: C loops that some built-in kernels hand their work to, when the model has them.

The C sources live beside this module (`csrc/<unit>.c`). `omrt compile` builds the units a model's
kernels declare (`Kernel.native_units`) into one shared library and packs it into the `.om` file;
`omrt.load(..., trust_kernels=True)` loads it and every kernel of that model gets it as
`ctx.native`. Kernels always keep their numpy path: it runs when the model carries no library,
the caller does not trust it, or the host cannot load it.
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass
from typing import Callable

import numpy as np

from . import parallel

KERNEL_ABI = 3
"""Version of the calling convention between kernels and the C functions: bumped when a
function's arguments change, so that a library built for another ABI is never called."""

CORE = "workers"
"""The source built into every library: the worker threads the C functions split their work
over, and their BLAS entry (csrc/workers.c)."""

SOURCES = os.path.join(os.path.dirname(__file__), "csrc")

PTR = ctypes.c_void_p
I64 = ctypes.c_int64
F32 = ctypes.c_float


@dataclass(frozen=True)
class Function:
    """A C function of a unit, with the ctypes argument types of its signature; `blas` when it
    multiplies through BLAS."""

    unit: str
    symbol: str
    argtypes: tuple
    blas: bool = False


class Library:
    """One model's loaded native library: the units it was built from and their functions.

    It is handed the CBLAS sgemm and sgemv of numpy's OpenBLAS; without them (numpy built on
    another BLAS) the functions that multiply are missing, and their kernels keep their numpy
    paths."""

    def __init__(self, cdll: ctypes.CDLL, units: frozenset[str]) -> None:
        self._cdll = cdll
        self.units = units
        self._functions: dict[str, Callable] = {}
        cblas = parallel.blas_functions()
        self.blas = cblas is not None
        try:
            use = cdll.omrt_use_blas
        except AttributeError as e:
            raise OSError(f"not an omrt kernel library of ABI {KERNEL_ABI}: {e}") from None
        if cblas is not None:
            use.argtypes, use.restype = [PTR, PTR, I64], None
            use(*cblas)

    def get(self, fn: Function) -> Callable | None:
        """The callable for `fn`, or None when the library was built without its unit (or it
        multiplies and there is no BLAS to call)."""
        if fn.unit not in self.units or (fn.blas and not self.blas):
            return None
        hit = self._functions.get(fn.symbol)
        if hit is None:
            hit = getattr(self._cdll, fn.symbol)
            hit.argtypes, hit.restype = list(fn.argtypes), None
            self._functions[fn.symbol] = hit
        return hit


SPLIT_FLOPS = 1 << 21
"""Native calls with at least this much work (multiply-adds times two) spread it over omrt's
threads: the native workers take a part in microseconds, where a Python handoff takes tens."""

SPLIT_BYTES = 1 << 16
"""Native calls over at least this many bytes of planes (depthwise layers, pools) spread them."""


def threads_for(flops: int | None = None, nbytes: int | None = None, slots: int = 0) -> int:
    """The threads a native call with this much work runs on: all of omrt's (at most `slots`,
    the scratch buffers it has, when given) for big work, else one."""
    big = flops >= SPLIT_FLOPS if flops is not None else nbytes >= SPLIT_BYTES
    threads = parallel.get_num_threads() if big else 1
    return min(threads, slots) if slots else threads


def address(a: np.ndarray) -> int:
    """The data pointer a C function receives for a C-contiguous array."""
    return a.__array_interface__["data"][0]


def activation_code(ctx_attrs: dict) -> tuple[int, float, float] | None:
    """(code, alpha, beta) of a fused activation the C loops apply themselves, or None when they
    do not (the kernel then applies it with numpy afterwards): 0 none, 1 Relu, 2 LeakyRelu,
    3 Clip."""
    act = ctx_attrs.get("_act")
    alpha = float(ctx_attrs.get("_act_alpha", 0.0) or 0.0)
    beta = float(ctx_attrs.get("_act_beta", 0.0) or 0.0)
    codes = {None: 0, "Relu": 1, "LeakyRelu": 2, "Clip": 3}
    return (codes[act], alpha, beta) if act in codes else None
