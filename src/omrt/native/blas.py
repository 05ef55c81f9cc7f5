"""The BLAS numpy uses, found in this process: OpenBLAS's thread count setter and getter, the
name of the CPU kernels it chose, and its CBLAS sgemm and sgemv, which the native kernels multiply through (so that they share numpy's
BLAS and its thread setting)."""

from __future__ import annotations

import ctypes
import functools
import glob
import os
from typing import Callable

import numpy as np

_OPENBLAS_SYMBOLS = (("scipy_openblas_set_num_threads64_", "scipy_openblas_get_num_threads64_"),
                     ("scipy_openblas_set_num_threads", "scipy_openblas_get_num_threads"),
                     ("openblas_set_num_threads64_", "openblas_get_num_threads64_"),
                     ("openblas_set_num_threads", "openblas_get_num_threads"))


def _loaded_libraries() -> list[str]:
    """Shared libraries whose name mentions OpenBLAS: mapped in this process, else numpy's own."""
    found: list[str] = []
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.split(maxsplit=5)[-1].strip()
                if "openblas" in os.path.basename(path).lower() and path not in found:
                    found.append(path)
    except OSError:
        pass
    if not found:
        root = os.path.dirname(np.__file__)
        for folder in (os.path.join(root, os.pardir, "numpy.libs"), os.path.join(root, ".libs"),
                       os.path.join(root, ".dylibs")):
            found += sorted(glob.glob(os.path.join(folder, "*openblas*")))
    return found


_CBLAS_PREFIXES = (("scipy_cblas_", "64_", True), ("cblas_", "64_", True), ("scipy_cblas_", "", False),
                   ("cblas_", "", False))
"""How OpenBLAS builds name their CBLAS functions (prefix, suffix), and whether those take 64-bit
sizes."""


class OpenBlas:
    """The thread count setter and getter of the OpenBLAS that numpy uses, and its CBLAS sgemm
    and sgemv, when there is one."""

    def __init__(self) -> None:
        self.set: Callable[[int], None] | None = None
        self.get: Callable[[], int] | None = None
        self.cblas: tuple[int, int, bool] | None = None
        self.core: str | None = None
        """The CPU kernels OpenBLAS chose for this host ("Haswell", "SkylakeX", ...)."""
        mode = getattr(os, "RTLD_NOLOAD", 0) | getattr(os, "RTLD_LAZY", 0) or ctypes.DEFAULT_MODE
        for path in _loaded_libraries():
            try:
                lib = ctypes.CDLL(path, mode=mode)
            except OSError:
                continue
            for setter, getter in _OPENBLAS_SYMBOLS:
                if hasattr(lib, setter) and hasattr(lib, getter):
                    set_fn, get_fn = getattr(lib, setter), getattr(lib, getter)
                    set_fn.argtypes, set_fn.restype = [ctypes.c_int], None
                    get_fn.argtypes, get_fn.restype = [], ctypes.c_int
                    self.set, self.get = set_fn, get_fn
                    self.core = _corename(lib, getter.replace("get_num_threads", "get_corename"))
                    self.cblas = next(((_address(lib, f"{pre}sgemm{post}"), _address(lib, f"{pre}sgemv{post}"), ilp64)
                                       for pre, post, ilp64 in _CBLAS_PREFIXES
                                       if hasattr(lib, f"{pre}sgemm{post}") and hasattr(lib, f"{pre}sgemv{post}")),
                                      None)
                    return


@functools.lru_cache(maxsize=None)
def openblas() -> OpenBlas:
    """numpy's OpenBLAS, found on first use."""
    return OpenBlas()


def blas_threads() -> int | None:
    """The OpenBLAS thread count now, or None when no OpenBLAS is found."""
    blas = openblas()
    return blas.get() if blas.get is not None else None


def _corename(lib: ctypes.CDLL, symbol: str) -> str | None:
    if not hasattr(lib, symbol):
        return None
    fn = getattr(lib, symbol)
    fn.argtypes, fn.restype = [], ctypes.c_char_p
    name = fn()
    return name.decode(errors="replace") if name else None


def _address(lib: ctypes.CDLL, name: str) -> int:
    return ctypes.cast(getattr(lib, name), ctypes.c_void_p).value


def blas_functions() -> tuple[int, int, bool] | None:
    """(sgemm, sgemv, they take 64-bit sizes): the CBLAS functions of numpy's OpenBLAS, or None.
    The native kernels multiply through them, so that they share numpy's BLAS and its thread
    setting."""
    return openblas().cblas
