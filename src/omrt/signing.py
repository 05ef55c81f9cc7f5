"""Ed25519 keys and signatures of `.om` files: make a key, sign a file, read trusted keys, verify.

- A private key is a PEM file (PKCS#8, unencrypted), as `omrt keygen KEY` or
  `openssl genpkey -algorithm ed25519 -out KEY` writes it; `keygen` gives it mode 0600.
- A public key is its raw 32 bytes; as text, 64 hex digits or the base64 of the 32 bytes; a key
  file holds one per line (after it, on the line, a comment) or a PEM public key
  (`openssl pkey -in KEY -pubout`). `KEY.pub` from `keygen` is one such line, so
  `cat KEY.pub >> ~/.config/omrt/trusted_keys` trusts it.
- A key is named by its fingerprint: the SHA-256 of the raw public key, in hex; messages show the
  first 16 digits.
- The trusted keys file: `$OMRT_TRUSTED_KEYS` when set (empty: none), else
  `$XDG_CONFIG_HOME/omrt/trusted_keys`, else `~/.config/omrt/trusted_keys`.

The `cryptography` package (`pip install omrt[sign]`) is imported only to sign, make a key or
check a signature by a trusted key; reading keys and fingerprints needs only the standard library.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import re
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Union

from .errors import InputError, KernelError
from .format.container import VERSION, Entry, OmFile, Part, Writer, write
from .format.signature import ZERO_RESERVED, Signature, message, part_name, signed_parts

KeySource = Union[bytes, bytearray, str, "os.PathLike[str]"]
"""A trusted key as `omrt.load(trusted_keys=[...])` takes it: the raw 32 bytes, its text (hex or
base64), or the path of a key file."""

SPKI_PREFIX = bytes.fromhex("302a300506032b6570032100")
"""The DER bytes before the raw key in an Ed25519 SubjectPublicKeyInfo (a PEM public key)."""


class MissingCryptography(KernelError):
    """The `cryptography` package is needed (to sign, make a key or check a signature) and absent."""


@dataclass(frozen=True)
class Key:
    """A trusted public key and where it was found (for the reason a model is trusted)."""

    raw: bytes
    source: str

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.raw)


def fingerprint(raw: bytes) -> str:
    """The SHA-256 of a raw public key, in hex: how files and messages name the key."""
    return hashlib.sha256(raw).hexdigest()


def short(fingerprint: str) -> str:
    """The first 16 hex digits of a fingerprint, as messages show it."""
    return fingerprint[:16]


def _cryptography() -> tuple[Any, Any]:
    """The Ed25519 and serialization modules of `cryptography`, or MissingCryptography saying how
    to install it."""
    try:
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ed25519
    except ImportError:
        raise MissingCryptography("signatures need the cryptography package, which is not installed: "
                                  "pip install omrt[sign]") from None
    return ed25519, serialization


def _raw_from_text(text: str) -> bytes | None:
    """The raw key in one key's text (hex or base64), or None when it is neither."""
    if re.fullmatch(r"[0-9a-fA-F]{64}", text):
        return bytes.fromhex(text)
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return None
    return raw if len(raw) == 32 else None


def _raw_from_pem(text: str, where: str) -> bytes:
    """The raw key of a PEM Ed25519 public key."""
    if "PRIVATE KEY" in text:
        raise InputError(f"{where} is a private key; trust its public key (KEY.pub from omrt keygen, or "
                         f"openssl pkey -in KEY -pubout)")
    body = "".join(line for line in text.splitlines() if line and not line.startswith("-----"))
    try:
        der = base64.b64decode(body, validate=True)
    except (binascii.Error, ValueError):
        der = b""
    if len(der) != len(SPKI_PREFIX) + 32 or not der.startswith(SPKI_PREFIX):
        raise InputError(f"{where} is not an Ed25519 public key in PEM; omrt signs with Ed25519 keys "
                         f"(omrt keygen KEY)")
    return der[len(SPKI_PREFIX):]


def read_key_file(path: str | os.PathLike, label: str = "key file") -> list[Key]:
    """The public keys in a file: a PEM public key, or one key per line (64 hex digits or base64,
    then an optional comment; blank lines and lines starting with # are skipped). Each key's
    source is `label`, the path and the key's comment."""
    path = os.fspath(path)
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"cannot read the key file {path!r}: {e}") from None
    if text.lstrip().startswith("-----BEGIN"):
        return [Key(_raw_from_pem(text, repr(path)), f"{label} {path}")]
    keys = []
    for number, line in enumerate(text.splitlines(), 1):
        fields = line.split(None, 1)
        if not fields or fields[0].startswith("#"):
            continue
        raw = _raw_from_text(fields[0])
        if raw is None:
            raise InputError(f"{path}:{number}: {fields[0][:20]!r} is not a public key: expected 64 hex digits "
                             f"or the base64 of 32 bytes, then an optional comment")
        comment = fields[1].strip() if len(fields) > 1 else ""
        keys.append(Key(raw, f"{label} {path}" + (f": {comment}" if comment else "")))
    return keys


def keys_file() -> str | None:
    """The trusted keys file of this user ($OMRT_TRUSTED_KEYS, else the config folder), or None
    when $OMRT_TRUSTED_KEYS is set empty."""
    chosen = os.environ.get("OMRT_TRUSTED_KEYS")
    if chosen is not None:
        return chosen or None
    config = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return os.path.join(config, "omrt", "trusted_keys")


def given_keys(given: KeySource | Iterable[KeySource] | None) -> list[Key]:
    """The keys of `omrt.load(trusted_keys=...)` (a list, or one key); InputError names a value that
    is not a key, or a key file's line that is not one."""
    if isinstance(given, (bytes, bytearray, str, os.PathLike)):
        given = [given]
    keys: list[Key] = []
    for value in given or ():
        raw = _raw_from_text(value.strip()) if isinstance(value, str) else None
        if isinstance(value, (bytes, bytearray)):
            if len(value) != 32:
                raise InputError(f"trusted_keys: a raw Ed25519 public key is 32 bytes, not {len(value)}")
            keys.append(Key(bytes(value), "given in trusted_keys"))
        elif raw is not None:
            keys.append(Key(raw, "given in trusted_keys"))
        elif isinstance(value, (str, os.PathLike)):
            keys += read_key_file(value)
        else:
            raise InputError(f"trusted_keys: {type(value).__name__} is not a key: pass the raw 32 bytes, their hex "
                             f"or base64 text, or the path of a key file")
    return keys


def trusted_keys(given: Iterable[Key] = ()) -> dict[str, Key]:
    """The keys a load trusts, by fingerprint: those `given` (`given_keys`), then those of the
    keys file (read when it exists; InputError names a line that is not a key)."""
    keys = list(given)
    path = keys_file()
    if path is not None and os.path.exists(path):
        keys += read_key_file(path, "trusted keys file")
    found: dict[str, Key] = {}
    for k in keys:
        found.setdefault(k.fingerprint, k)
    return found


def verify(key: Key, data: bytes, signature: bytes) -> bool:
    """Whether `signature` is `key`'s Ed25519 signature of `data`."""
    ed25519, _ = _cryptography()
    from cryptography.exceptions import InvalidSignature

    try:
        ed25519.Ed25519PublicKey.from_public_bytes(key.raw).verify(signature, data)
    except InvalidSignature:
        return False
    return True


def keygen(path: str | os.PathLike, comment: str | None = None) -> str:
    """Make an Ed25519 key: the private key at `path` (PEM, mode 0600) and its public key at
    `path.pub` (one line: hex, then `comment`, by default the file's name). Existing files are
    never overwritten. Returns the key's fingerprint."""
    ed25519, ser = _cryptography()
    private = ed25519.Ed25519PrivateKey.generate()
    path = os.fspath(path)
    pem = private.private_bytes(ser.Encoding.PEM, ser.PrivateFormat.PKCS8, ser.NoEncryption())
    raw = private.public_key().public_bytes(ser.Encoding.Raw, ser.PublicFormat.Raw)
    for target in (path, path + ".pub"):
        if os.path.lexists(target):
            raise InputError(f"{target} exists; omrt keygen never overwrites a key: remove it or choose another name")
    _create(path, pem, 0o600)
    try:
        _create(path + ".pub", f"{raw.hex()} {comment or os.path.basename(path)}\n".encode(), 0o644)
    except BaseException:
        os.unlink(path)
        raise
    return fingerprint(raw)


def _create(path: str, data: bytes, mode: int) -> None:
    """Write a new file with exactly `mode` (never an existing one)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), mode)
    with os.fdopen(fd, "wb") as f:
        os.fchmod(fd, mode)
        f.write(data)


def _private_key(path: str | os.PathLike) -> Any:
    """The Ed25519 private key in a PEM file, or InputError saying what the file is instead."""
    ed25519, ser = _cryptography()
    try:
        with open(path, "rb") as f:
            key = ser.load_pem_private_key(f.read(), password=None)
    except OSError as e:
        raise InputError(f"cannot read the private key {os.fspath(path)!r}: {e}") from None
    except (ValueError, TypeError) as e:
        raise InputError(f"{os.fspath(path)!r} is not an unencrypted PEM private key ({e}); make one with "
                         f"omrt keygen KEY") from None
    if not isinstance(key, ed25519.Ed25519PrivateKey):
        raise InputError(f"{os.fspath(path)!r} holds a private key of another kind than Ed25519; omrt signs with "
                         f"Ed25519 keys: make one with omrt keygen KEY")
    return key


def sign(model: str | os.PathLike, key: str | os.PathLike) -> tuple[str, list[str]]:
    """Sign the `.om` file `model` with the private key in the file `key`, in place and atomically
    (a signature already there is replaced; the file keeps its permissions). Every partition's
    digest, WEIGHTS' too, is checked first: a signature vouches for the bytes. Returns the key's
    fingerprint and the names of the signed partitions."""
    _, ser = _cryptography()
    private = _private_key(key)
    raw = private.public_key().public_bytes(ser.Encoding.Raw, ser.PublicFormat.Raw)
    file = OmFile(model)
    try:
        if file.version > VERSION:
            raise InputError(f"{file.path!r} has format version {file.version[0]}.{file.version[1]}, newer than "
                             f"this omrt writes ({VERSION[0]}.{VERSION[1]}): sign it with the omrt that wrote it")
        kept = _checked(file)
        # as the writer writes the file: this omrt's version, zero reserved bytes and partition flags
        written = [Entry(e.type, 0, 0, e.size, e.digest) for e in kept]
        record = Signature(fingerprint(raw), private.sign(message(VERSION, file.flags, ZERO_RESERVED, written)))
        parts = [(e.type, _copier(file, e)) for e in kept]
        write(model, parts + [(Part.SIGNATURE, lambda sink: sink(record.encode()))], flags=file.flags,
              mode=os.stat(model).st_mode & 0o7777)
    finally:
        file.close()
    return record.fingerprint, [part_name(t) for t in signed_parts(e.type for e in kept)]


def _checked(file: OmFile) -> list[Entry]:
    """The file's partitions but SIGNATURE, in file order, each checked against its digest."""
    kept = sorted((e for e in file.entries.values() if e.type != Part.SIGNATURE), key=lambda e: e.offset)
    for e in kept:
        if hashlib.sha256(memoryview(file.map)[e.offset:e.offset + e.size]).digest() != e.digest:
            raise InputError(f"{file.path!r}: the {part_name(e.type)} partition does not match its digest: the "
                             f"file is corrupted and was not signed; compile or copy it again")
    return kept


def _copier(file: OmFile, entry: Entry) -> Writer:
    """A partition writer that copies a partition of the mapped file, in chunks of 16 MiB."""
    def produce(sink: Callable[[memoryview], None]) -> None:
        view, end = memoryview(file.map), entry.offset + entry.size
        for start in range(entry.offset, end, 1 << 24):
            sink(view[start:min(start + (1 << 24), end)])
    return produce
