"""The KERNELS partition: a count, then records of packed kernels with their kind, name, vendor,
target and bytes.

A record is a native shared library (kind 1) that `omrt compile` built from omrt's C units, the
Python source of a custom operator's kernel (kind 2), the library of fused kernels it generated
for the model's elementwise chains (kind 3), or a custom operators' shared library (kind 4, see
the CUSTOM_OPS partition, `omrt.format.customops`). Whether and how a record runs on this host is
`omrt.native.loader`'s and `omrt.runtime.custom`'s business.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field

from ..errors import FormatError

RECORD = struct.Struct("<IHHHHIQ")
RECORD_MAGIC = 0x4B4D524F
NATIVE = 1
"""Record kind of omrt's own native shared library."""
PYTHON_OP = 2
"""Record kind of a custom operator's kernel written in Python: its source text, UTF-8."""
FUSED = 3
"""Record kind of the generated fused kernels (autofuse): a shared library whose target lists
each kernel's guard."""
NATIVE_OP = 4
"""Record kind of a shared library of custom operators' C kernels (`omrt_custom.h`)."""
KINDS = (NATIVE, PYTHON_OP, FUSED, NATIVE_OP)
"""The record kinds this omrt knows; a record of another kind (a later omrt's) is kept, never run."""


@dataclass
class Packed:
    """One record of the store, and what became of it at load."""

    kind: int
    name: str
    vendor: str
    target: dict
    data: bytes = field(repr=False)
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
        try:
            name = bytes(data[pos:pos + n_name]).decode()
            vendor = bytes(data[pos + n_name:pos + n_name + n_vendor]).decode()
        except UnicodeDecodeError:
            raise fail(f"record {i}'s name or vendor is not UTF-8") from None
        try:
            target = json.loads(bytes(data[pos + n_name + n_vendor:end - n_bin]))
        except ValueError:
            raise fail(f"record {i}'s target is not JSON") from None
        records.append(Packed(kind, name, vendor, target, bytes(data[end - n_bin:end])))
        pos = end
    return records
