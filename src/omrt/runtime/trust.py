"""Whether a model's packed code may run: the one trust decision of a load.

A model is trusted when the caller says so (`trust_kernels=True`), or when its file is signed by
a trusted key (`trusted_keys=`, or the user's trusted keys file: `omrt.signing`) and the
signature verifies over the file as it is. Everything that loads code from the file (the native
library, custom operators, fused kernels) takes this one decision.

A signed file that is not trusted (an unknown key, a signature that does not verify, a signed
partition whose bytes no longer match its digest, a damaged SIGNATURE partition, no
`cryptography` to check it) still loads: its packed code does not run, the numpy kernels and
unfused paths do, and a RuntimeWarning gives the reason. With `require_signature=True` any file
that is not signed by a trusted key is refused with a SignatureError instead.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Iterable

from ..errors import FormatError, InputError, SignatureError
from ..format import OmFile, Part
from ..format.signature import ALGORITHM, MESSAGE, file_message, read, stale_parts
from .. import signing


@dataclass(frozen=True)
class Trust:
    """The trust decision of a load: whether packed code may run, and why (a sentence)."""

    trusted: bool
    reason: str
    signer: str | None = None
    """The fingerprint of the key the file names as its signer (None: not signed)."""

    def __bool__(self) -> bool:
        return self.trusted

    def __str__(self) -> str:
        return self.reason


def decide(file: OmFile, trust_kernels: bool, trusted_keys: Iterable[signing.KeySource] | None,
           require_signature: bool) -> Trust:
    """Trust the file's packed code, or say why not (warning when a signed file is refused;
    raising SignatureError, with `require_signature`, when the file is not signed by a trusted key)."""
    if trust_kernels:
        if require_signature:
            raise InputError("trust_kernels=True trusts the file whoever signed it, and require_signature=True "
                             "trusts only a signature by a trusted key: pass one of the two")
        return Trust(True, "trust_kernels=True")
    trust = by_signature(file, signing.given_keys(trusted_keys))
    if not trust.trusted and require_signature:
        raise SignatureError(f"{file.path}: {trust.reason}; require_signature=True refuses it")
    if not trust.trusted and file.has(Part.SIGNATURE):
        warnings.warn(f"omrt: {file.path}: {trust.reason}; its packed code does not run (numpy kernels do)",
                      RuntimeWarning, stacklevel=4)
    return trust


def by_signature(file: OmFile, given: list[signing.Key]) -> Trust:
    """Whether the file is signed by a trusted key (`given`, or the keys file's) and the signature
    holds over it as it is. The keys file is read, and `cryptography` imported, only for a signed
    file."""
    try:
        record = read(file)
    except FormatError as e:
        return Trust(False, f"the signature cannot be read: {e}")
    if record is None:
        return Trust(False, "not signed")
    who = f"key {signing.short(record.fingerprint)}"
    if (record.algorithm, record.message) != (ALGORITHM, MESSAGE):
        return Trust(False, f"signed by {who} with {record.algorithm!r} over {record.message!r}, which this omrt "
                            f"does not check (it checks {ALGORITHM!r} over {MESSAGE!r})", record.fingerprint)
    key = signing.trusted_keys(given).get(record.fingerprint)
    if key is None:
        where = signing.keys_file() or "(none: OMRT_TRUSTED_KEYS is empty)"
        return Trust(False, f"signed by {who}, which is not a trusted key: pass its public key in trusted_keys= "
                            f"or add it to the trusted keys file {where}", record.fingerprint)
    stale = stale_parts(file)
    if stale:
        return Trust(False, f"signed by {who}, but the {', '.join(stale)} partition no longer matches its digest: "
                            f"the file was changed after it was signed", record.fingerprint)
    try:
        valid = signing.verify(key, file_message(file), record.signature)
    except signing.MissingCryptography as e:
        return Trust(False, f"signed by {who}, which is trusted, but {e}", record.fingerprint)
    if not valid:
        return Trust(False, f"the signature by {who} does not verify: the file (its header, partition table or a "
                            f"signed partition) was changed after it was signed", record.fingerprint)
    return Trust(True, f"signed by {who} ({key.source})", record.fingerprint)
