"""The SIGNATURE partition, and the message a signature covers (docs/format.md, since 1.3).

A signature vouches for everything that decides what code a model runs: the header's version,
flags and reserved bytes, and the type, flags, size and digest of every partition but SIGNATURE
itself, in type order. Partitions are covered by their table digests, so a partition type added
later (or one this omrt has no name for) is covered without a change here, and signing reads no
partition twice. The signature is over digests: a covered partition's bytes are authentic only
once they are checked against its digest (`stale_parts` does it for all but WEIGHTS, whose
digest is checked with `omrt.load(..., verify=True)`).

This module only encodes and decodes; keys and the Ed25519 arithmetic are `omrt.signing`'s.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Iterable

from ..errors import FormatError
from .container import HEADER, Entry, OmFile, Part

MESSAGE = "omrt signed model 1"
"""The first line of the signed message, naming its structure and version."""
ALGORITHM = "ed25519"
RESERVED = slice(36, HEADER.size)
"""The header's reserved bytes, which are signed (the rest of the header is covered field by field,
or changes with the signature: partition count, table offset, file size)."""
ZERO_RESERVED = bytes(RESERVED.stop - RESERVED.start)
"""The reserved bytes as omrt writes them."""
UNCHECKED_AT_LOAD = frozenset({int(Part.WEIGHTS)})
"""Signed partitions whose bytes a load checks against their digest only with verify=True."""


def signed_parts(types: Iterable[int]) -> list[int]:
    """The partition types, of those given, that a signature covers, in signing order: every one
    but SIGNATURE. A tool that rewrites a signed file keeps its SIGNATURE partition only when
    these partitions keep their bytes (then `message` is unchanged), and drops it otherwise."""
    return sorted({int(t) for t in types} - {int(Part.SIGNATURE)})


def part_name(kind: int) -> str:
    """A partition type's name, or "type N" for one this omrt does not know."""
    return Part(kind).name if kind in Part._value2member_map_ else f"type {kind}"


def message(version: tuple[int, int], flags: int, reserved: bytes, entries: Iterable[Entry]) -> bytes:
    """The bytes a signature signs: ASCII lines naming the header fields and the signed partitions.

        omrt signed model 1
        version 1.3
        flags 1
        reserved 0000...            (the header's 28 reserved bytes, hex)
        part 1 0 5120 3f2a...       (type, flags, size, sha256 hex: one line per signed partition)
    """
    by_type = {e.type: e for e in entries}
    lines = [MESSAGE, f"version {version[0]}.{version[1]}", f"flags {flags}", f"reserved {reserved.hex()}"]
    lines += [f"part {t} {by_type[t].flags} {by_type[t].size} {by_type[t].digest.hex()}"
              for t in signed_parts(by_type)]
    return ("\n".join(lines) + "\n").encode("ascii")


def file_message(file: OmFile) -> bytes:
    """The message a signature of this file must sign, from its header and partition table."""
    return message(file.version, file.flags, bytes(file.map[RESERVED]), file.entries.values())


def stale_parts(file: OmFile) -> list[str]:
    """Signed partitions whose bytes no longer match their digest (WEIGHTS is left to verify=True,
    because hashing it reads every weight)."""
    return [part_name(t) for t in signed_parts(file.entries) if t not in UNCHECKED_AT_LOAD
            and hashlib.sha256(_bytes(file, t)).digest() != file.entries[t].digest]


def _bytes(file: OmFile, kind: int) -> memoryview:
    e = file.entries[kind]
    return memoryview(file.map)[e.offset:e.offset + e.size]


@dataclass(frozen=True)
class Signature:
    """A SIGNATURE partition: who signed (the SHA-256 of the raw public key), how, and the bytes."""

    fingerprint: str
    signature: bytes
    algorithm: str = ALGORITHM
    message: str = MESSAGE

    def encode(self) -> bytes:
        """The partition's bytes: UTF-8 JSON."""
        return json.dumps({"message": self.message, "algorithm": self.algorithm, "fingerprint": self.fingerprint,
                           "signature": self.signature.hex()}, sort_keys=True).encode()


def read(file: OmFile) -> Signature | None:
    """The file's signature, None when it is not signed; FormatError when the partition is damaged:
    its digest, its JSON, a field missing or of the wrong type, or bytes other than `encode`'s (one
    signature has one encoding, so no byte of the partition or of its table entry can change
    unnoticed)."""
    if not file.has(Part.SIGNATURE):
        return None
    data = bytes(file.view(Part.SIGNATURE))
    if file.entry(Part.SIGNATURE).flags:
        raise FormatError(f"{file.path!r}: the SIGNATURE partition is damaged (its table entry has flags "
                          f"{file.entry(Part.SIGNATURE).flags:#x}; omrt writes 0)")
    try:
        fields = json.loads(data)
        record = Signature(fields["fingerprint"], bytes.fromhex(fields["signature"]), fields["algorithm"],
                           fields["message"])
        if not all(isinstance(v, str) for v in (record.fingerprint, record.algorithm, record.message)):
            raise TypeError("a field is not text")
    except (ValueError, KeyError, TypeError) as e:
        raise FormatError(f"{file.path!r}: the SIGNATURE partition is damaged ({type(e).__name__}: {e})") from None
    if record.encode() != data:
        raise FormatError(f"{file.path!r}: the SIGNATURE partition is damaged (not as omrt encodes it)")
    return record
