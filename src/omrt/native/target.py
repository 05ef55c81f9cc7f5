"""Where a packed native library can run, and whether this host is such a place.

A library's target (recorded by `omrt compile` from the compiler that built it, see `probe`)
names the omrt release and kernel ABI, the compiler and its target triple, the OS, machine and
C library that triple means, and the CPU features its code may use. `mismatch` checks each of
them against this host and process, and explains the first that fails in one line ("built for
aarch64-linux-gnu, this host is x86_64"), so a skipped library always says why.
"""

from __future__ import annotations

import functools
import os
import platform
import sys
from typing import Callable

from ..format.kernelstore import Packed
from ..version import __version__
from . import elf
from .library import kernel_abi

OS_NAMES = {"linux": "Linux", "darwin": "Darwin", "macos": "Darwin", "freebsd": "FreeBSD", "netbsd": "NetBSD",
            "openbsd": "OpenBSD", "windows": "Windows", "mingw32": "Windows", "cygwin": "Windows"}
"""Triple components (`cc -dumpmachine`) and the OS `platform.system()` names for them."""

MACHINE_ALIASES = {"amd64": "x86_64", "arm64": "aarch64", "i486": "i386", "i586": "i386", "i686": "i386"}


def parse_triple(triple: str) -> dict[str, str]:
    """{"machine", "os", "libc"} a target triple means: x86_64-linux-gnu is x86_64, Linux, glibc;
    aarch64-linux-musl is aarch64, Linux, musl. Parts it does not know are ""."""
    parts = triple.lower().split("-")
    machine = MACHINE_ALIASES.get(parts[0], parts[0])
    system = next((OS_NAMES[p.rstrip("0123456789.")] for p in parts[1:] if p.rstrip("0123456789.") in OS_NAMES), "")
    env = parts[-1] if len(parts) > 2 else ""
    libc = ("glibc" if env.startswith("gnu") else "musl" if env.startswith("musl")
            else "bionic" if env.startswith("android") else "")
    return {"machine": machine, "os": system, "libc": libc}


def host() -> dict[str, str]:
    """This host as a library's target must match it: OS, machine and C library with its version."""
    libc, version = platform.libc_ver()
    return {"os": platform.system(), "machine": platform.machine(), "libc": libc, "libc_version": version}


@functools.lru_cache(maxsize=None)
def host_elf() -> tuple[int, int, int] | None:
    """(class, byte order, machine) of the running Python's executable: a library loaded into this
    process must match it."""
    try:
        with open(sys.executable, "rb") as f:
            return elf.identity(f.read(20))
    except OSError:
        return None


@functools.lru_cache(maxsize=None)
def cpu_flags() -> frozenset[str] | None:
    """The CPU features this host has, as /proc/cpuinfo's `flags` (x86) or `Features` (Arm) line
    names them; None where there is no such file (the features cannot be checked)."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                key, sep, value = line.partition(":")
                if sep and key.strip() in ("flags", "Features"):
                    return frozenset(value.split())
    except OSError:
        pass
    return None


def label(record: Packed) -> str:
    """How messages name a record's target: its triple, machine and OS for a record written before
    triples were recorded, or "any target" for one that names none (Python source)."""
    target = record.target
    if target.get("triple"):
        return str(target["triple"])
    named = [str(target[k]).lower() if k == "os" else str(target[k]) for k in ("machine", "os") if target.get(k)]
    return "-".join(named) or "any target"


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in str(text).split(".") if p.isdigit())


def _machine(record: Packed) -> str | None:
    """Why the record's machine code is not for this process (ELF class, byte order, machine)."""
    ident, here = elf.identity(record.data), host_elf()
    if ident is None:
        return "not an ELF shared library"
    declared = record.target.get("elf_machine")
    if isinstance(declared, int) and declared != ident[2]:
        return (f"its target says {elf.machine_name(declared)} but its code is for {elf.machine_name(ident[2])}: "
                f"the record is mislabelled")
    if here is not None and ident != here:
        what = f"built for {label(record)}"
        if ident[2] == here[2]:
            return f"{what} ({ident[0] * 32}-bit, {'little' if ident[1] == 1 else 'big'}-endian), this Python is " \
                   f"{here[0] * 32}-bit {'little' if here[1] == 1 else 'big'}-endian"
        return f"{what}, this host is {platform.machine()}"
    return None


def _libc(target: dict) -> str | None:
    """Why the C library the record was linked against is not this host's (another one, or older)."""
    here, want = host(), target.get("libc")
    if not want:
        return None
    if want != here["libc"] or _version(target.get("libc_version", "")) > _version(here["libc_version"]):
        needs = f"{want} {target.get('libc_version')}".strip()
        return f"needs {needs}, this host has {here['libc'] or 'another C library'} {here['libc_version']}".rstrip()
    return None


def _cpu(target: dict) -> str | None:
    """Why this CPU lacks a feature the record's code needs outside its per-ISA clones."""
    needs, flags = (target.get("cpu") or {}).get("features", []), cpu_flags()
    missing = sorted(set(needs) - flags) if flags is not None else []
    if missing:
        return (f"needs CPU features {', '.join(missing)} (baseline {target['cpu'].get('baseline') or '?'}) "
                f"that this CPU lacks (/proc/cpuinfo flags)")
    return None


def mismatch(record: Packed) -> str | None:
    """Why this host and omrt cannot run a built-in native library record, or None when they can:
    the machine first (a library for another architecture is skipped for that reason alone), then
    the OS, the kernel ABI, the C library and the CPU features."""
    return host_mismatch(record, _abi)


def host_mismatch(record: Packed, abi: Callable[[dict], str | None] = lambda target: None) -> str | None:
    """Why this host cannot load a record's shared library at all (machine, OS, C library, CPU
    features, loading from memory), with `abi` checked after the OS, or None when it can: the
    check of every kind of packed library (custom operators' ones check their own ABI)."""
    target = record.target
    return _machine(record) or _os(target) or abi(target) or _libc(target) or _cpu(target) or _memfd()


def _abi(target: dict) -> str | None:
    if target.get("abi") == kernel_abi():
        return None
    built = f" by omrt {target['omrt']}" if target.get("omrt") else ""
    return (f"built{built} for kernel ABI {target.get('abi')}, this omrt ({__version__}) has {kernel_abi()}: "
            f"recompile the model with this omrt")


def _os(target: dict) -> str | None:
    return None if target.get("os") == host()["os"] else f"built for {target.get('os')}, this host runs {host()['os']}"


def _memfd() -> str | None:
    return None if hasattr(os, "memfd_create") else "this OS cannot load a library from memory"
