"""A model's loaded native library: the units it was built from, and its functions, checked.

The C sources live in `csrc/`. `omrt compile` builds the units a model's kernels declare
(`Kernel.native_units`) into one shared library and packs it into the `.om` file (`build`);
`omrt.load(..., trust_kernels=True)` loads it (`loader`) and every kernel of that model gets it
as `ctx.native`. Kernels always keep their numpy path: it runs when the model carries no
library, the caller does not trust it, or the host cannot load it.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
from typing import Any, Callable

import numpy as np

from .blas import blas_functions
from .bindings import POOL_BUSY, POOL_ROUND_TRIP, USE_BLAS
from .signature import THUNK_PREFIX, Function

CORE = "workers"
"""The source built into every library: the worker threads the C functions split their work
over, and their BLAS entry (csrc/workers.c)."""

SOURCES = os.path.join(os.path.dirname(__file__), "csrc")

CUSTOM_HEADER = "omrt_custom.h"
"""The header custom operators are written against (`omrt.native.custom`): versioned on its own
(OMRT_CUSTOM_ABI), so it is no part of the built-in kernels' ABI."""


@functools.lru_cache(maxsize=None)
def kernel_abi() -> str:
    """The calling convention between the bindings and the C code: a digest of the C sources,
    so that a library built from any other C code (an older or newer omrt) is never called."""
    digest = hashlib.sha256()
    for name in sorted(set(os.listdir(SOURCES)) - {CUSTOM_HEADER}):
        with open(os.path.join(SOURCES, name), "rb") as f:
            digest.update(name.encode() + b"\0" + f.read())
    return digest.hexdigest()[:16]


def thunk_address(cdll: ctypes.CDLL, symbol: str) -> int | None:
    """The address of C function `symbol`'s thunk in `cdll` (signature.Function.thunk), or None
    when the library has none (its calls then run one at a time)."""
    try:
        return ctypes.cast(getattr(cdll, THUNK_PREFIX + symbol), ctypes.c_void_p).value
    except AttributeError:
        return None


class Bound:
    """A C function of a loaded library: calling it checks every argument first."""

    def __init__(self, function: Function, cfunc: Any, thunk: int | None = None) -> None:
        self.function = function
        self._cfunc = cfunc
        self.thunk = thunk
        """The address of its thunk, through which a call list calls it (None: it has none)."""
        self.calls = 0
        """How many times it ran (omrt.backend's native run reports which models reached C)."""

    def __call__(self, *values: Any) -> None:
        self._cfunc(*self.function.check(values))
        self.calls += 1

    def bind(self, *values: Any) -> Checked:
        """This call on `values`, checked now, to repeat on the same arrays."""
        return Checked(self, self.function.check(values), values)

    def partial(self, *tail: Any) -> Partial:
        """This function with its last arguments bound (a layer's geometry, fixed at load): call
        (or bind) the result with the first ones."""
        return Partial(self, tail)


class Partial:
    """A Bound function with its last arguments given."""

    __slots__ = ("bound", "tail")

    def __init__(self, bound: Bound, tail: tuple) -> None:
        self.bound, self.tail = bound, tail

    def __call__(self, *head: Any) -> None:
        self.bound(*head, *self.tail)

    def bind(self, *head: Any) -> Checked:
        return self.bound.bind(*head, *self.tail)


class Checked:
    """One native call whose arguments were checked once, to repeat on the very same arrays:
    calling it runs the function again, and a call list (omrt_run_calls) holds it as its thunk
    and argument `vector`. It keeps the arrays it was checked with alive; whoever repeats it must
    mean those arrays and no others (the executor checks a call again whenever one of its
    arrays is replaced, and when the thread count changes)."""

    __slots__ = ("bound", "args", "values", "vector")

    def __init__(self, bound: Bound, args: list, values: tuple) -> None:
        self.bound, self.args, self.values = bound, args, values
        self.vector = bound.function.pack(args)

    def __call__(self) -> None:
        self.bound._cfunc(*self.args)
        self.bound.calls += 1

    def take(self, other: Checked) -> None:
        """Become `other`, a call of the same function, in this vector's memory: call lists
        holding its address stay valid."""
        assert other.bound is self.bound, "a Checked takes only a call of its own function"
        self.args, self.values = other.args, other.values
        self.vector[:] = other.vector


class Library:
    """One model's loaded native library: the units it was built from and their functions.

    It is handed the CBLAS sgemm and sgemv of numpy's OpenBLAS; without them (numpy built on
    another BLAS) the functions that multiply are missing, and their kernels keep their numpy
    paths."""

    def __init__(self, cdll: ctypes.CDLL, units: frozenset[str]) -> None:
        self._cdll = cdll
        self.units = units
        self._bound: dict[str, Bound] = {}
        self.fused: Any = None
        """The model's generated fused kernels (`omrt.native.fused.FusedLibrary`) when it packs them
        and they load: they run on this library's worker pool."""
        cblas = blas_functions()
        self.blas = cblas is not None
        if not hasattr(cdll, USE_BLAS.symbol):
            raise OSError(f"not an omrt kernel library of ABI {kernel_abi()}: it has no {USE_BLAS.symbol}")
        if cblas is not None:
            self._cfunc(USE_BLAS)(*USE_BLAS.check(cblas))
        self._pool_busy = self._cfunc(POOL_BUSY)
        self._pool_round_trip = self._cfunc(POOL_ROUND_TRIP)

    def _cfunc(self, fn: Function) -> Callable:
        cfunc = getattr(self._cdll, fn.symbol)
        cfunc.argtypes, cfunc.restype = fn.argtypes, None
        return cfunc

    def pool_address(self) -> int:
        """The address of the worker pool's entry (`omrt_parallel`, csrc/workers.c)."""
        return ctypes.cast(self._cdll.omrt_parallel, ctypes.c_void_p).value

    def pool_busy(self, threads: int) -> np.ndarray:
        """Nanoseconds each of the worker pool's first `threads` threads (0: the calling one) has
        spent on its shares of jobs since the library loaded: they only grow, so a profile
        subtracts two readings. The pool belongs to the library: every model sharing it adds."""
        ns = np.zeros(threads, np.int64)
        self._pool_busy(*POOL_BUSY.check([ns, threads]))
        return ns

    def round_trip_ns(self, rounds: int = 2000) -> float | None:
        """Mean nanoseconds a cache line takes to pass from the calling thread to the worker pool's
        first worker and back (over `rounds` trips), or None when no worker took part within 20 ms
        (the pool busy with another thread's run): for profiles and benchmarks, not runs. Tens of
        nanoseconds between cores that share a cache; hundreds between dies or sockets, where each
        layer's output crosses from one core to the other and two threads gain less. Starts the
        worker if there is none yet."""
        ns = np.zeros(1, np.int64)
        self._pool_round_trip(*POOL_ROUND_TRIP.check([rounds, ns]))
        return float(ns[0]) / rounds if ns[0] >= 0 else None

    def calls(self) -> dict[str, int]:
        """symbol -> how many times this model ran it."""
        return {symbol: bound.calls for symbol, bound in self._bound.items() if bound.calls}

    def get(self, fn: Function) -> Bound | None:
        """The checked callable for `fn`, or None when the library was built without its unit
        (or it multiplies and there is no BLAS to call); the core's are in every library."""
        if (fn.unit not in self.units and fn.unit != CORE) or (fn.blas and not self.blas):
            return None
        hit = self._bound.get(fn.symbol)
        if hit is None:
            hit = self._bound[fn.symbol] = Bound(fn, self._cfunc(fn), thunk_address(self._cdll, fn.symbol))
        return hit
