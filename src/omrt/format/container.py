"""The `.om` container: fixed header, partition table with digests, aligned partitions.

Layout (little-endian; see docs/format.md):

    header (64 bytes)   magic, version, flags, partition count, table offset, file size
    table               one 56-byte entry per partition: type, flags, offset, size, sha256
    partitions          each starting on a 4096-byte boundary, so WEIGHTS can be mapped in place

Writing is atomic (temporary file in the target's folder, then rename); reading checks every
offset and size against the file before using it.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import struct
import tempfile
from dataclasses import dataclass
from enum import IntEnum
from typing import BinaryIO, Callable, Iterable, Union

from ..errors import FormatError
from ..memory.memory import byte_view

MAGIC = b"OMRT\x00\r\n\x1a"
VERSION = (1, 11)
HEADER = struct.Struct("<8sHHIIQQ28x")
ENTRY = struct.Struct("<IIQQ32s")
PAGE = 4096


class Part(IntEnum):
    """Partition types."""

    MODEL_DEF = 1
    WEIGHTS = 2
    KERNELS = 3
    PLANS = 4
    ENV = 5
    CUSTOM_OPS = 6
    SIGNATURE = 7


@dataclass(frozen=True)
class Entry:
    """One row of the partition table."""

    type: int
    flags: int
    offset: int
    size: int
    digest: bytes


Writer = Callable[[Callable[[bytes | memoryview], None]], None]
"""A partition's content, produced by calling the given write function with chunks."""


def write(path: str | os.PathLike, parts: Iterable[tuple[Part | int, Writer]], flags: int = 0,
          progress: Callable[[str], None] | None = None, mode: int | None = None) -> int:
    """Write partitions to `path` atomically; returns the file size. Nothing is left on failure.
    A partition's type may be a number this omrt has no name for (a rewrite keeps it); `mode`
    sets the file's permission bits (by default those of a new temporary file: owner only)."""
    path = os.fspath(path)
    parts = list(parts)
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".omrt-", suffix=".tmp", dir=folder)
    try:
        if mode is not None:
            os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as f:
            table_at = HEADER.size
            first = _round(table_at + ENTRY.size * len(parts), PAGE)
            f.write(b"\0" * first)
            entries = []
            for kind, produce in parts:
                if progress:
                    progress(f"writing {getattr(kind, 'name', kind)}")
                start = _pad_to(f, PAGE)
                h = hashlib.sha256()

                def sink(chunk: bytes | memoryview, h=h) -> None:
                    h.update(chunk)
                    f.write(chunk)

                produce(sink)
                entries.append(Entry(int(kind), 0, start, f.tell() - start, h.digest()))
            size = f.tell()
            f.seek(0)
            f.write(HEADER.pack(MAGIC, *VERSION, flags, len(entries), table_at, size))
            for e in entries:
                f.write(ENTRY.pack(e.type, e.flags, e.offset, e.size, e.digest))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        return size
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def _round(n: int, a: int) -> int:
    return (n + a - 1) // a * a


def _pad_to(f: BinaryIO, a: int) -> int:
    pos = f.tell()
    target = _round(pos, a)
    if target > pos:
        f.write(b"\0" * (target - pos))
    return target


Source = Union[str, os.PathLike, bytes, bytearray, memoryview]
"""Where a model comes from: a path, or its bytes (anything with the buffer protocol)."""


class OmFile:
    """A `.om` file, mapped from a path or read in place from a buffer, whose header and table
    have been checked."""

    def __init__(self, source: Source, name: str | None = None) -> None:
        if isinstance(source, (str, os.PathLike)):
            self.path = os.fspath(source)
            self.map, size = self._map(self.path)
        else:
            self.path = name or f"<{type(source).__name__} of the model>"
            self.map, size = self._buffer(source)
        if size < HEADER.size:
            raise FormatError(f"{self.path!r} is {size} bytes, too short for an omrt model "
                              f"(header is {HEADER.size}); the file is truncated or not a .om")
        self.size = size
        self._check(size)

    @staticmethod
    def _map(path: str) -> tuple[mmap.mmap | bytes, int]:
        try:
            with open(path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                return (mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size else b""), size
        except FileNotFoundError:
            raise FormatError(f"model file {path!r} does not exist") from None
        except IsADirectoryError:
            raise FormatError(f"{path!r} is a directory, not a .om file") from None
        except (ValueError, OSError) as e:
            raise FormatError(f"cannot open model file {path!r}: {e}") from None

    @staticmethod
    def _buffer(source: object) -> tuple[memoryview, int]:
        view = byte_view(source, FormatError, f"a model is a path or the bytes of a .om file, not a "
                         f"{type(source).__name__}", "the buffer holding the model is not contiguous; pass bytes(buffer)")
        return view, len(view)

    def _check(self, size: int) -> None:
        magic, major, minor, self.flags, count, table_at, declared = HEADER.unpack_from(self.map, 0)
        if magic != MAGIC:
            raise FormatError(f"{self.path!r} is not an omrt model (bad magic {magic!r}); compile the "
                              f"ONNX model with `omrt compile`")
        if major != VERSION[0]:
            raise FormatError(f"{self.path!r} has format version {major}.{minor}; this omrt reads "
                              f"{VERSION[0]}.x: recompile the model with this omrt")
        self.version = (major, minor)
        if declared != size:
            raise FormatError(f"{self.path!r} is {size} bytes but its header says {declared}: the file "
                              f"is truncated or was appended to")
        if count > 64 or table_at + count * ENTRY.size > size:
            raise FormatError(f"{self.path!r}: partition table ({count} entries at {table_at}) does not "
                              f"fit in the file; it is corrupted")
        self.entries: dict[int, Entry] = {}
        spans = []
        for i in range(count):
            e = Entry(*ENTRY.unpack_from(self.map, table_at + i * ENTRY.size))
            if e.offset + e.size > size or e.offset < table_at + count * ENTRY.size:
                raise FormatError(f"{self.path!r}: partition {i} (type {e.type}) spans "
                                  f"[{e.offset}, {e.offset + e.size}), outside the file's data")
            if e.type in self.entries:
                raise FormatError(f"{self.path!r}: partition type {e.type} appears twice")
            self.entries[e.type] = e
            spans.append((e.offset, e.offset + e.size))
        spans.sort()
        for (a0, a1), (b0, _) in zip(spans, spans[1:]):
            if b0 < a1:
                raise FormatError(f"{self.path!r}: partitions overlap at byte {b0}; it is corrupted")

    def has(self, kind: Part) -> bool:
        return int(kind) in self.entries

    def entry(self, kind: Part) -> Entry:
        if int(kind) not in self.entries:
            raise FormatError(f"{self.path!r} has no {kind.name} partition; it is damaged or foreign")
        return self.entries[int(kind)]

    def view(self, kind: Part, verify: bool = True) -> memoryview:
        """The bytes of a partition (zero-copy), checked against its digest when `verify`."""
        e = self.entry(kind)
        mv = memoryview(self.map)[e.offset:e.offset + e.size]
        if verify:
            self._match(kind, mv)
        return mv

    def read(self, kind: Part) -> bytes:
        """A copy of a partition's bytes, checked against its digest after copying: what the caller
        uses is what was checked, even if the file is changed on disk while it is mapped."""
        data = bytes(self.view(kind, verify=False))
        self._match(kind, data)
        return data

    def _match(self, kind: Part, data: bytes | memoryview) -> None:
        if hashlib.sha256(data).digest() != self.entry(kind).digest:
            raise FormatError(f"{self.path!r}: the {kind.name} partition does not match its digest; "
                              f"the file is corrupted: recompile or copy it again")

    def close(self) -> None:
        """Unmap the file (a buffer the model was read from is the caller's to release)."""
        if isinstance(self.map, mmap.mmap):
            self.map.close()
