"""Packed native libraries at load: the host check, and loading from memory.

A record is used only when the caller trusts the file (`trust_kernels=True`) and the host matches
its target (ELF class and machine, OS, kernel ABI, C library); it is then loaded from an anonymous
in-memory file, never written to disk, once per process for the same bytes, and handed to that
model's kernels only.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import struct
import sys
import threading
import warnings

from ..format.kernelstore import FUSED, NATIVE, Packed
from .library import Library, kernel_abi


def elf_identity(data: bytes) -> tuple[int, int, int] | None:
    """(class, byte order, machine) from an ELF header, or None when `data` is not ELF."""
    if len(data) < 20 or data[:4] != b"\x7fELF":
        return None
    order = "<" if data[5] == 1 else ">"
    return data[4], data[5], struct.unpack_from(order + "H", data, 18)[0]


def _host_elf() -> tuple[int, int, int] | None:
    try:
        with open(sys.executable, "rb") as f:
            return elf_identity(f.read(20))
    except OSError:
        return None


def host_target() -> dict:
    """The target a library built on this host declares (and that a loading host must match)."""
    libc, version = platform.libc_ver()
    return {"os": platform.system(), "machine": platform.machine(), "abi": kernel_abi(),
            "libc": libc, "libc_version": version}


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split(".") if p.isdigit())


def mismatch(record: Packed) -> str | None:
    """Why this host cannot run the record, or None when it can."""
    if record.kind not in (NATIVE, FUSED):
        return f"kind {record.kind} is not one this omrt runs"
    host, want = host_target(), record.target
    if want.get("abi") != kernel_abi():
        return f"built for kernel ABI {want.get('abi')}, this omrt has {kernel_abi()}"
    if want.get("os") != host["os"]:
        return f"built for {want.get('os')}, this host runs {host['os']}"
    elf, here = elf_identity(record.data), _host_elf()
    if elf is None:
        return "not an ELF shared library"
    if here is None or elf != here:
        return f"ELF class/byte order/machine {elf} differ from this Python's {here}"
    if want.get("libc") and (want["libc"] != host["libc"]
                             or _version(want.get("libc_version", "")) > _version(host["libc_version"])):
        return (f"needs {want['libc']} {want.get('libc_version')}, this host has "
                f"{host['libc'] or 'another C library'} {host['libc_version']}")
    if not hasattr(os, "memfd_create"):
        return "this OS cannot load a library from memory"
    return None


_loaded: dict[bytes, ctypes.CDLL] = {}
_lock = threading.Lock()


def _from_memory(data: bytes) -> ctypes.CDLL:
    """dlopen `data` through an anonymous in-memory file; the same bytes load once per process.

    The file stays open as long as the process: the dynamic loader knows a library by its path,
    and a closed descriptor's number (hence path) would be reused for the next library."""
    key = hashlib.sha256(data).digest()
    with _lock:
        lib = _loaded.get(key)
        if lib is None:
            fd = os.memfd_create("omrt-kernels", getattr(os, "MFD_CLOEXEC", 0))
            try:
                with open(fd, "wb", closefd=False) as f:
                    f.write(data)
                lib = ctypes.CDLL(f"/proc/self/fd/{fd}")
            except OSError:
                os.close(fd)
                raise
            _loaded[key] = lib
        return lib


def load(records: list[Packed], trusted: bool) -> Library | None:
    """The model's native library from its records (setting each one's status), or None; its
    fused kernels, when the file packs them and they load, as `Library.fused`."""
    library = None
    for r in records:
        if r.kind == FUSED:
            continue
        why = "not trusted: load with trust_kernels=True to run it" if not trusted else mismatch(r)
        if why is None and library is not None:
            why = "a second native library is not supported"
        if why is None:
            try:
                library = Library(_from_memory(r.data), frozenset(r.units))
                r.status = "loaded"
                continue
            except OSError as e:
                why = f"the dynamic loader refused it: {e}"
        r.status = f"not loaded: {why}"
        if trusted:
            warnings.warn(f"omrt: the native library {r.name!r} packed in the model does not load ({why}); "
                          f"its kernels run on numpy", RuntimeWarning, stacklevel=4)
    for r in records:
        if r.kind == FUSED:
            _load_fused(r, library, trusted)
    return library


def _load_fused(record: Packed, library: Library | None, trusted: bool) -> None:
    """Attach the fused kernels of `record` to the model's native library when they may run; where
    they do not, the chains run unfused (their sub-graphs), and the status says why."""
    from .fused import FusedLibrary

    why = "not trusted: load with trust_kernels=True to run it" if not trusted else mismatch(record)
    if why is None and library is None:
        why = "the model's native library is not loaded, and fused kernels run on its worker pool"
    if why is None and library.fused is not None:
        why = "a second fused library is not supported"
    if why is None:
        try:
            library.fused = FusedLibrary(_from_memory(record.data), record, library)
            record.status = "loaded"
            return
        except OSError as e:
            why = f"the dynamic loader refused it: {e}"
    record.status = f"not loaded: {why}; the fused chains run unfused"
    if trusted:
        warnings.warn(f"omrt: the fused kernels {record.name!r} packed in the model do not load ({why}); "
                      f"their chains run unfused", RuntimeWarning, stacklevel=4)
