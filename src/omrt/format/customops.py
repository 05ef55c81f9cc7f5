"""The CUSTOM_OPS partition: the custom operators a model carries, each with what implements it.

UTF-8 JSON `{"ops": [entry, ...]}`, one entry per operator the model uses (see docs/format.md):
its name, the KERNELS record that implements it (by name, and the SHA-256 of the record's bytes),
the function in it, its shape and type function (declarative rules, or Python source), its
workspace and its default attributes and state. Decoding checks every field; what the entries
mean at load is `omrt.runtime.custom`'s business.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from ..errors import FormatError
from .modeldef import _dec_attr, _enc_attr


@dataclass(frozen=True)
class OpEntry:
    """One packed custom operator."""

    domain: str
    op_type: str
    kind: int
    """Kind of the KERNELS record implementing it: 2 (Python source) or 4 (a C library)."""
    record: str
    """Name of that record."""
    digest: str
    """SHA-256 (hex) of the record's bytes: the entry names exactly the code it was compiled with."""
    symbol: str
    """The kernel function in the source, or the entry point in the library."""
    infer: dict
    """{"rules": [output rule, ...]} or {"python": source, "symbol": function name}."""
    since: int = 1
    version: str = ""
    workspace: int | str = 0
    attributes: dict[str, Any] = field(default_factory=dict)
    """Default attributes and state (arrays) of the operator; a node's own attributes win."""

    @property
    def qualified(self) -> str:
        return f"{self.domain}::{self.op_type}"


_TYPES = {"domain": str, "op_type": str, "kind": int, "record": str, "digest": str, "symbol": str, "infer": dict,
          "since": int, "version": str, "workspace": (int, str), "attributes": dict}


def encode(entries: list[OpEntry]) -> bytes:
    """The partition's bytes."""
    ops = [{**asdict(e), "attributes": {k: _enc_attr(v, {}, ()) for k, v in e.attributes.items()}}
           for e in entries]
    return json.dumps({"ops": ops}, sort_keys=True, separators=(",", ":")).encode()


def decode(raw: memoryview | bytes, where: str) -> list[OpEntry]:
    """The entries of a CUSTOM_OPS partition, every field checked; FormatError naming the field."""
    try:
        ops = json.loads(bytes(raw))["ops"]
    except (ValueError, KeyError, TypeError):
        raise FormatError(f"{where}: the CUSTOM_OPS partition is not a JSON object with an \"ops\" list; "
                          f"the file is damaged: recompile the model") from None
    if not isinstance(ops, list):
        raise FormatError(f"{where}: CUSTOM_OPS \"ops\" is not a list; the file is damaged: recompile the model")
    return [_entry(doc, i, where) for i, doc in enumerate(ops)]


def _entry(doc: Any, i: int, where: str) -> OpEntry:
    if not isinstance(doc, dict) or set(doc) != set(_TYPES):
        raise FormatError(f"{where}: CUSTOM_OPS entry {i} does not have the fields {sorted(_TYPES)}; the "
                          f"file is damaged or written by another omrt: recompile the model")
    for key, kind in _TYPES.items():
        if not isinstance(doc[key], kind) or isinstance(doc[key], bool):
            raise FormatError(f"{where}: CUSTOM_OPS entry {i} ({doc.get('domain')}::{doc.get('op_type')}) has a "
                              f"{key!r} of type {type(doc[key]).__name__}; the file is damaged: recompile the model")
    try:
        attributes = {k: _dec_attr(v, None, where, {}) for k, v in doc["attributes"].items()}
    except (ValueError, TypeError, KeyError) as e:
        raise FormatError(f"{where}: CUSTOM_OPS entry {i} has a malformed attribute ({e}); recompile the "
                          f"model") from None
    return OpEntry(**{**doc, "attributes": attributes})
