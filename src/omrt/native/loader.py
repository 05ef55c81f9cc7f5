"""Packed native libraries at load: which record runs on this host, loading it from memory once
per process, and counting.

A record runs only when the model is trusted (`omrt.runtime.trust`: `trust_kernels=True`, or a
signature by a trusted key) and the host matches its target (`target.mismatch`). A file may carry
built-in libraries for several targets: `choose` keeps those this host can run, best first, and
says in each other record's status why it was skipped; the fused kernels for the chosen target
join it. The chosen library is loaded from an anonymous in-memory file, never written to
disk, and handed to that model's kernels only.

Loaded libraries are shared by the whole process, under one of two strategies (`dedupe_key`):
built-in libraries (kind 1) by name and version, generated (fused, kind 3) and custom ones by
content. `stats()` counts the loads and reuses of each.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import threading
import warnings

from ..format.kernelstore import FUSED, KINDS, NATIVE, Packed
from .bindings import USE_BLAS
from .library import Library
from .target import label, mismatch

NOT_TRUSTED = "not trusted: load with trust_kernels=True to run it"

_loaded: dict[tuple, ctypes.CDLL] = {}
_counts: dict[str, dict[str, int]] = {"name": {"loads": 0, "reuses": 0}, "content": {"loads": 0, "reuses": 0}}
_lock = threading.Lock()


def dedupe_key(record: Packed) -> tuple[str, tuple]:
    """(strategy, key) under which a record's library is loaded once per process.

    - "name", for omrt's built-in libraries (kind 1): the record's name and vendor and its
      version, which is the kernel ABI (a digest of the C sources) with the units built in, for
      one target (triple) and CPU baseline. Two such records run the same C functions, so the
      second model reuses the first one's library even when their bytes differ in what does not
      matter (a build id, another build of the same sources with the same compiler target).
    - "content", for every other kind (fused kernels, custom operators): the SHA-256 of the bytes,
      since what they hold is generated per model or whatever their authors chose.
    """
    if record.kind == NATIVE:
        target = record.target
        features = tuple((target.get("cpu") or {}).get("features", []))
        return "name", (record.name, record.vendor, target.get("abi"), tuple(record.units), label(record), features)
    return "content", (record.kind, hashlib.sha256(record.data).hexdigest())


def stats() -> dict[str, dict[str, int]]:
    """Libraries this process loaded from model files, per dedupe strategy: {"name": {"loads",
    "reuses"}, "content": {...}}; a reuse is a model that got a library already loaded."""
    with _lock:
        return {strategy: dict(counts) for strategy, counts in _counts.items()}


def _from_memory(data: bytes) -> ctypes.CDLL:
    """dlopen `data` through an anonymous in-memory file.

    The file stays open as long as the process: the dynamic loader knows a library by its path,
    and a closed descriptor's number (hence path) would be reused for the next library."""
    fd = os.memfd_create("omrt-kernels", getattr(os, "MFD_CLOEXEC", 0))
    try:
        with open(fd, "wb", closefd=False) as f:
            f.write(data)
        return ctypes.CDLL(f"/proc/self/fd/{fd}")
    except OSError:
        os.close(fd)
        raise


def open_library(record: Packed, entry: str) -> ctypes.CDLL:
    """The record's library, loaded once per process under its `dedupe_key`. It is kept for
    reuse only when it exports `entry` (the symbol every library of its kind has), so a record
    that is not what it claims to be is never handed to the next model."""
    strategy, key = dedupe_key(record)
    with _lock:
        lib = _loaded.get((strategy, key))
        if lib is not None:
            _counts[strategy]["reuses"] += 1
            return lib
        lib = _from_memory(record.data)
        _counts[strategy]["loads"] += 1
        if hasattr(lib, entry):
            _loaded[(strategy, key)] = lib
        return lib


def choose(records: list[Packed]) -> list[Packed]:
    """The built-in library records this host can run, best first (the one whose code may use
    the most CPU features: a library built for x86-64-v3 before one for x86-64); every other
    record's status says in one line why it is skipped."""
    fits = []
    for r in records:
        why = mismatch(r)
        if why is None:
            fits.append(r)
        else:
            r.status = f"not loaded: {why}"
    return sorted(fits, key=lambda r: -len((r.target.get("cpu") or {}).get("features", [])))


def load(records: list[Packed], trusted: bool, untrusted: str = NOT_TRUSTED) -> Library | None:
    """The model's built-in native library from its records (setting each one's status), or None;
    `untrusted` is the status of every record when the model is not trusted (`Model` gives the
    reason of its trust decision). Records of a kind this omrt does not know get a status saying so
    (or that the model is not trusted); custom operators' records are left to their own loader.

    Of the built-in library records that fit this host the best one that loads is used; with
    none, a trusted file warns once per record with its reason, and the model runs on numpy."""
    native = [r for r in records if r.kind == NATIVE]
    unknown = [r for r in records if r.kind not in KINDS]
    if not trusted:
        for r in native + unknown:
            r.status = f"not loaded: {untrusted}"
        _load_fused([r for r in records if r.kind == FUSED], None, None, untrusted)
        return None
    for r in unknown:
        r.status = f"not loaded: its kind ({r.kind}) is not one this omrt knows (a later omrt's, or damage)"
    library, chosen = None, None
    for r in choose(native):
        if chosen is not None:
            baseline = (chosen.target.get("cpu") or {}).get("baseline")
            r.status = (f"not loaded: {chosen.name} for {label(chosen)}{f' ({baseline})' if baseline else ''} "
                        f"was chosen for this host")
            continue
        try:
            library, chosen = Library(open_library(r, USE_BLAS.symbol), frozenset(r.units)), r
            r.status = "loaded"
        except OSError as e:
            r.status = f"not loaded: the dynamic loader refused it: {e}"
    if library is None:
        for r in native:
            warnings.warn(f"omrt: the native library {r.name!r} for {label(r)} packed in the model does not load "
                          f"({r.status.removeprefix('not loaded: ')}); its kernels run on numpy",
                          RuntimeWarning, stacklevel=4)
    _load_fused([r for r in records if r.kind == FUSED], library, chosen, None)
    return library


def _load_fused(records: list[Packed], library: Library | None, native: Packed | None, untrusted: str | None
                ) -> None:
    """Attach the model's fused kernels (kind 3) to its native library when they may run: the
    record for the chosen native library's target, loaded once per process by content. Where they
    do not run, the chains run unfused (their sub-graphs) and each record's status says why."""
    from .fused import USE_POOL, FusedLibrary

    for r in records:
        meant = native is None or label(r) == label(native)
        why = untrusted or _beside(r, native) or mismatch(r)
        if why is None and library.fused is not None:
            why = "another fused library was chosen for this host"
        if why is None:
            try:
                library.fused = FusedLibrary(open_library(r, USE_POOL.symbol), r, library)
                r.status = "loaded"
                continue
            except OSError as e:
                why = f"the dynamic loader refused it: {e}"
        r.status = f"not loaded: {why}; the fused chains run unfused"
        if meant and untrusted is None:
            warnings.warn(f"omrt: the fused kernels {r.name!r} packed in the model do not load ({why}); "
                          f"their chains run unfused", RuntimeWarning, stacklevel=4)


def _beside(record: Packed, native: Packed | None) -> str | None:
    """Why fused kernels cannot join the chosen native library (none, or for another target)."""
    if native is None:
        return "the model's native library is not loaded, and fused kernels run on its worker pool"
    if label(record) != label(native):
        return f"built for {label(record)}, the native library chosen is for {label(native)}"
    return None
