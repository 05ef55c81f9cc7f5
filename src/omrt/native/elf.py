"""What an ELF shared library's own bytes say about where it can run: its class, byte order and
machine (the header), and the C library versions it needs (its version references).

Read from the bytes of a packed library, so the answer holds for a library built by a cross
compiler as much as for one built here. Every offset is checked against the data: a damaged or
foreign file yields None or nothing, never an exception.
"""

from __future__ import annotations

import re
import struct

MACHINES = {3: "i386", 8: "mips", 20: "ppc", 21: "ppc64", 22: "s390x", 40: "arm", 62: "x86_64",
            183: "aarch64", 243: "riscv64", 258: "loongarch64"}
"""ELF e_machine numbers and the names `platform.machine()` gives such a host (the usual ones)."""

GLIBC = re.compile(r"GLIBC_(\d+(?:\.\d+)*)")
SHT_GNU_VERNEED = 0x6FFFFFFE
ENTRY = 16
"""Bytes of an Elf_Verneed (version, count, file, aux, next) and of an Elf_Vernaux (hash, flags,
other, name, next), in ELF32 and ELF64 alike."""


def identity(data: bytes) -> tuple[int, int, int] | None:
    """(class, byte order, machine) from an ELF header, or None when `data` is not ELF."""
    if len(data) < 20 or data[:4] != b"\x7fELF":
        return None
    order = "<" if data[5] == 1 else ">"
    return data[4], data[5], struct.unpack_from(order + "H", data, 18)[0]


def machine_name(number: int) -> str:
    """The usual name of an ELF machine number: "aarch64", or "ELF machine 999"."""
    return MACHINES.get(number, f"ELF machine {number}")


def _sections(data: bytes, order: str, wide: bool) -> list[tuple[int, int, int, int, int]]:
    """(type, offset, size, link, info) of every section header, [] when the table does not fit."""
    if wide:
        (at,), (size, count) = struct.unpack_from(order + "Q", data, 40), struct.unpack_from(order + "HH", data, 58)
    else:
        (at,), (size, count) = struct.unpack_from(order + "I", data, 32), struct.unpack_from(order + "HH", data, 46)
    header = struct.Struct(order + ("IIQQQQII" if wide else "IIIIIIII"))
    if size < header.size or at + size * count > len(data):
        return []
    out = []
    for i in range(count):
        _, kind, _, _, offset, length, link, info = header.unpack_from(data, at + i * size)
        out.append((kind, offset, length if offset + length <= len(data) else 0, link, info))
    return out


def _string(data: bytes, table: tuple[int, int], at: int) -> str:
    start, length = table
    end = data.find(b"\0", start + at, start + length)
    return data[start + at:end].decode("ascii", "replace") if at < length and end >= 0 else ""


def needed_versions(data: bytes) -> list[str]:
    """The symbol versions the library needs from other libraries (GLIBC_2.34, ...), from its
    .gnu.version_r section; [] when it needs none or the bytes do not say."""
    ident = identity(data)
    if ident is None or len(data) < 64:
        return []
    order, wide = "<" if ident[1] == 1 else ">", ident[0] == 2
    sections = _sections(data, order, wide)
    names: list[str] = []
    for kind, offset, length, link, count in sections:
        if kind != SHT_GNU_VERNEED or link >= len(sections):
            continue
        strings = sections[link][1:3]
        entry = offset
        for _ in range(count):
            if entry + ENTRY > offset + length:
                break
            _, aux_count, _, aux, step = struct.unpack_from(order + "HHIII", data, entry)
            names += _aux_names(data, order, strings, entry + aux, aux_count, offset + length)
            if not step:
                break
            entry += step
    return names


def _aux_names(data: bytes, order: str, strings: tuple[int, int], at: int, count: int, end: int) -> list[str]:
    names = []
    for _ in range(count):
        if at + ENTRY > end:
            break
        _, _, _, name, step = struct.unpack_from(order + "IHHII", data, at)
        names.append(_string(data, strings, name))
        if not step:
            break
        at += step
    return names


def glibc_needed(data: bytes) -> str:
    """The newest glibc version the library's symbols need ("2.34"), or "" when it needs none."""
    versions = [tuple(int(p) for p in m.group(1).split("."))
                for m in map(GLIBC.fullmatch, needed_versions(data)) if m]
    return ".".join(map(str, max(versions))) if versions else ""


SHT_DYNSYM = 11
STT_FUNC = 2
EXPORTED = (1, 2)
"""Symbol bindings of an exported function: global and weak."""


def exported_functions(data: bytes) -> set[str]:
    """The names of the functions an ELF shared library exports (its dynamic symbol table), read
    without loading it; ValueError when `data` is not ELF or its tables are cut short."""
    ident = identity(data)
    if ident is None:
        raise ValueError("no ELF header")
    wide, order = ident[0] == 2, "<" if ident[1] == 1 else ">"
    symbol = struct.Struct(order + ("IBBHQQ" if wide else "IIIBBH"))
    try:
        sections = _sections(data, order, wide)
    except struct.error:
        sections = []
    if not sections:
        raise ValueError("its section table is cut short")
    names: set[str] = set()
    for kind, offset, size, link, _ in sections:
        if kind != SHT_DYNSYM:
            continue
        if link >= len(sections):
            raise ValueError("its symbol table names no string table")
        strings = sections[link][1:3]
        for at in range(offset, offset + size - symbol.size + 1, symbol.size):
            fields = symbol.unpack_from(data, at)
            name, info, index = fields[0], fields[1 if wide else 3], fields[3 if wide else 5]
            if index and info & 0xF == STT_FUNC and info >> 4 in EXPORTED:
                names.add(_string(data, strings, name))
    return names
