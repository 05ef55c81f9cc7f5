"""Repacking: add, replace or remove the libraries packed in a `.om` file without recompiling it.

Typical use: compile a model here, compile it again with a cross compiler (`--cc
aarch64-linux-gnu-gcc`), and add that file's library to the first, so one file runs native
code on both machines. Every partition but KERNELS is copied byte for byte, each checked
against its digest first (a damaged file is refused, not given fresh digests); KERNELS is
rewritten, the digests recomputed and the file written atomically, so the source may be the
destination. A signature covered the code that changed: a SIGNATURE partition is dropped, and
the result says the file must be signed again (`omrt sign`).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Union

from .errors import FormatError, InputError
from .format import MAGIC, VERSION, OmFile, Part, write
from .format.kernelstore import NATIVE, Packed, kinds_flag, pack, unpack
from .native.loader import dedupe_key
from .native.target import label

Source = Union[str, os.PathLike, Packed]
"""Where records to add come from: a `.om` file (all its packed records), a kernel store file
(the bytes of a KERNELS partition, as `omrt.format.kernelstore.pack` writes them), or a record."""

REMOVABLE = {NATIVE, 3}
"""Kinds a model runs without (its numpy kernels, its unfused sub-graph): they may be removed or
replaced. Custom operators (kinds 2 and 4) may be neither: they have no other implementation, and
the CUSTOM_OPS partition names each one's record by name and digest (recompile to change them)."""


@dataclass
class RepackResult:
    """What a repack wrote: the file, the records added and removed, every record it now carries,
    and notes the caller must act on (a dropped signature)."""

    path: str
    added: list[Packed] = field(default_factory=list)
    removed: list[Packed] = field(default_factory=list)
    kernels: list[Packed] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def describe(record: Packed) -> str:
    """A record as repack's messages name it: `omrt-native@aarch64-linux-gnu`."""
    return f"{record.name}@{label(record)}"


def _identity(record: Packed) -> tuple:
    """What no two records of a file share: for omrt's own libraries their dedupe key (name and
    version for one target and CPU baseline: a file may carry libraries of one target for two
    omrt releases, or two CPU levels), for others kind, name and target."""
    return dedupe_key(record) if record.kind == NATIVE else (record.kind, record.name, label(record))


def select(records: list[Packed], selector: str) -> list[Packed]:
    """The records `NAME` (every target) or `NAME@TARGET` names."""
    name, _, where = selector.partition("@")
    return [r for r in records if r.name == name and (not where or label(r) == where)]


def records_from(source: Source) -> list[Packed]:
    """The records a `Source` holds."""
    if isinstance(source, Packed):
        return [source]
    path = os.fspath(source)
    try:
        with open(path, "rb") as f:
            head = f.read(len(MAGIC))
    except OSError as e:
        raise InputError(f"cannot read {path!r}: {e.strerror or e}") from None
    if head == MAGIC:
        model = OmFile(path)
        try:
            return unpack(model.view(Part.KERNELS), path)
        finally:
            _close(model)
    if head.startswith(b"\x7fELF"):
        raise InputError(f"{path!r} is a bare shared library: a packed library needs its target and units; "
                         f"compile the model for that target (omrt compile --cc CC) and add that .om")
    with open(path, "rb") as f:
        return unpack(memoryview(f.read()), path)


def _close(file: OmFile) -> None:
    """Unmap a file read here, unless an error's traceback still holds a view of it (then the
    mapping goes when the error does): the error, not the unmapping, is what the caller must see."""
    try:
        file.close()
    except BufferError:
        pass


def _carried(path: str, records: list[Packed]) -> str:
    return ", ".join(describe(r) for r in records) or "none"


def _remove(records: list[Packed], selector: str, path: str) -> list[Packed]:
    """Take the records `selector` names out of `records`; the ones taken."""
    gone = select(records, selector)
    if not gone:
        raise InputError(f"{path} carries no packed library {selector!r}; it carries: {_carried(path, records)}")
    kept = [r for r in gone if r.kind not in REMOVABLE]
    if kept:
        raise InputError(f"{describe(kept[0])} holds custom operators (kind {kept[0].kind}): the model cannot run "
                         f"without them, and its CUSTOM_OPS partition pins their code by digest; recompile the "
                         f"model with the new operator (omrt compile --custom-op) to change it")
    records[:] = [r for r in records if all(r is not g for g in gone)]
    return gone


def _add(records: list[Packed], new: Iterable[Packed], path: str, notes: list[str]) -> list[Packed]:
    """Add `new` to `records`; those added. One of omrt's libraries of a version the file already
    carries is not added (the loader would take either; `notes` says so); a custom record of a
    name and target it carries with other bytes is an error (replace it instead)."""
    added = []
    for r in new:
        same = [o for o in records if _identity(o) == _identity(r)]
        if same and r.kind == NATIVE and same[0].data != r.data:
            notes.append(f"{describe(r)}: kept the one {path} carries, of the same version (kernel ABI, units, CPU "
                         f"features): the loader takes either")
        elif same and same[0].data != r.data:
            fix = (f"replace it with --replace {describe(r)}=FILE" if r.kind in REMOVABLE else
                   "custom operators change by recompiling the model")
            raise InputError(f"{path} already carries {describe(r)} (other bytes): {fix}")
        if not same:
            records.append(r)
            added.append(r)
    return added


def _notes(file: OmFile, added: list[Packed]) -> list[str]:
    """What the caller must know: a signature dropped, a library of another kernel ABI than the
    omrt that compiled the graph."""
    notes = []
    if file.has(Part.SIGNATURE):
        notes.append(f"{file.path} was signed; its packed code changed, so the signature was dropped: sign "
                     f"the new file again (omrt sign)")
    try:
        abi = json.loads(bytes(file.view(Part.ENV))).get("kernel_abi")
    except (ValueError, AttributeError, FormatError):
        abi = None
    for r in added:
        if r.kind == NATIVE and abi and r.target.get("abi") != abi:
            notes.append(f"{describe(r)} was built for kernel ABI {r.target.get('abi')}, the graph was compiled "
                         f"with {abi}: it runs only under an omrt with its ABI")
    return notes


def _parts(file: OmFile, kernels: bytes) -> list:
    """The file's partitions in their order, every one checked against its digest, KERNELS
    replaced by `kernels` and SIGNATURE left out."""
    parts = []
    for entry in sorted(file.entries.values(), key=lambda e: e.offset):
        if entry.type not in Part._value2member_map_:
            raise FormatError(f"{file.path}: partition type {entry.type} is unknown to this omrt: repack it with "
                              f"the omrt that wrote it")
        kind = Part(entry.type)
        if kind == Part.SIGNATURE:
            continue
        data = kernels if kind == Part.KERNELS else file.view(kind, verify=True)
        parts.append((kind, lambda sink, data=data: sink(data)))
    return parts


def repack(src: str | os.PathLike, dst: str | os.PathLike, add: Iterable[Source] = (),
           remove: Iterable[str] = (), replace: Mapping[str, Source] | None = None) -> RepackResult:
    """Write `src` to `dst` with its packed libraries changed: `remove` the records each selector
    names (`NAME` or `NAME@TARGET`, e.g. `omrt-native@aarch64-linux-gnu`), `replace` the records a
    selector names with those of a source, and `add` the records of each source. Nothing else in
    the file changes; on any error nothing is written."""
    src = os.fspath(src)
    file = OmFile(src)
    try:
        if file.version > VERSION:
            raise FormatError(f"{src} has format version {file.version[0]}.{file.version[1]}, newer than this "
                              f"omrt's {VERSION[0]}.{VERSION[1]}: repack it with the omrt that wrote it")
        records = unpack(file.view(Part.KERNELS), src)
        result = RepackResult(os.fspath(dst))
        notes: list[str] = []
        for selector in remove:
            result.removed += _remove(records, selector, src)
        for selector, source in (replace or {}).items():
            result.removed += _remove(records, selector, src)
            result.added += _add(records, records_from(source), src, notes)
        for source in add:
            result.added += _add(records, records_from(source), src, notes)
        result.kernels, result.notes = records, _notes(file, result.added) + notes
        flags = (file.flags & ~0xFFFF) | kinds_flag(records)
        write(dst, _parts(file, pack(records)), flags=flags)
        return result
    finally:
        _close(file)
