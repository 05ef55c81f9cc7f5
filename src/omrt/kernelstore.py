"""The KERNELS partition: packed kernels, their target, the host check, and loading from memory.

A record is a native shared library (kind 1) that `omrt compile` built from omrt's C units. At
load a record is used only when the caller trusts the file (`trust_kernels=True`) and the host
matches its target (ELF class and machine, OS, kernel ABI, C library); it is then loaded from an
anonymous in-memory file, never written to disk, once per process for the same bytes, and handed
to that model's kernels only.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import platform
import struct
import sys
import threading
from dataclasses import dataclass

from .errors import FormatError
from .kernels.native import KERNEL_ABI, Library

RECORD = struct.Struct("<IHHHHIQ")
RECORD_MAGIC = 0x4B4D524F
NATIVE = 1
"""Record kind of a native shared library (2 Python source and 3 generated fused kernels are
reserved, not written yet)."""


@dataclass
class Packed:
    """One record of the store, and what became of it at load."""

    kind: int
    name: str
    vendor: str
    target: dict
    data: bytes
    status: str = "not loaded"

    @property
    def units(self) -> list[str]:
        return list(self.target.get("units", []))


def kinds_flag(records: list[Packed]) -> int:
    """Header flag bits 0-15: bit k-1 set when a record of kind k is present."""
    flag = 0
    for r in records:
        flag |= 1 << (r.kind - 1)
    return flag


def pack(records: list[Packed]) -> bytes:
    """The partition's bytes: a count, then each record's header, strings and binary."""
    out = [struct.pack("<I", len(records))]
    for r in records:
        name, vendor = r.name.encode(), r.vendor.encode()
        target = json.dumps(r.target, sort_keys=True).encode()
        out.append(RECORD.pack(RECORD_MAGIC, r.kind, 0, len(name), len(vendor), len(target), len(r.data)))
        out += [name, vendor, target, r.data]
    return b"".join(out)


def unpack(data: memoryview, where: str) -> list[Packed]:
    """The records of a KERNELS partition, every length checked against the partition's size."""
    def fail(why: str) -> FormatError:
        return FormatError(f"{where}: the KERNELS partition is damaged ({why}); recompile the model")

    if len(data) < 4:
        raise fail("no record count")
    (count,), pos, records = struct.unpack_from("<I", data, 0), 4, []
    for i in range(count):
        if pos + RECORD.size > len(data):
            raise fail(f"record {i} is cut short")
        magic, kind, _, n_name, n_vendor, n_target, n_bin = RECORD.unpack_from(data, pos)
        pos += RECORD.size
        if magic != RECORD_MAGIC:
            raise fail(f"record {i} has a bad magic")
        end = pos + n_name + n_vendor + n_target + n_bin
        if end > len(data):
            raise fail(f"record {i} runs past the partition's end")
        name = bytes(data[pos:pos + n_name]).decode()
        vendor = bytes(data[pos + n_name:pos + n_name + n_vendor]).decode()
        try:
            target = json.loads(bytes(data[pos + n_name + n_vendor:end - n_bin]))
        except ValueError:
            raise fail(f"record {i}'s target is not JSON") from None
        records.append(Packed(kind, name, vendor, target, bytes(data[end - n_bin:end])))
        pos = end
    return records


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
    return {"os": platform.system(), "machine": platform.machine(), "abi": KERNEL_ABI,
            "libc": libc, "libc_version": version}


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split(".") if p.isdigit())


def mismatch(record: Packed) -> str | None:
    """Why this host cannot run the record, or None when it can."""
    if record.kind != NATIVE:
        return f"kind {record.kind} is not one this omrt runs"
    host, want = host_target(), record.target
    if want.get("abi") != KERNEL_ABI:
        return f"built for kernel ABI {want.get('abi')}, this omrt has {KERNEL_ABI}"
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
    """The model's native library from its records (setting each one's status), or None."""
    library = None
    for r in records:
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
    return library
