"""The wire format of `omrt serve` (docs/serving.md): over a Unix stream socket, every message is a
fixed header, a JSON meta part and a data part; fds travel beside the header as SCM_RIGHTS.

Both sides use these functions: `send` and `receive` move whole messages, `Ref` is one tensor
of a request or answer (in registered memory, or bytes in the data part), and `parse_refs`
checks every field a peer sent before anything is mapped, viewed or run.
"""

from __future__ import annotations

import array
import json
import math
import os
import socket
import struct
from dataclasses import dataclass
from enum import IntEnum
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from ..errors import ServingError
from ..memory import align, aligned_empty

MAGIC = b"OMRT"
VERSION = 1
HEADER_FORMAT = "<4sHHQIHHQ"
"""magic, version, kind, request id, meta bytes, fds attached, reserved (0), data bytes."""
HEADER_SIZE = 32
MAX_META = 64 << 10
"""The largest JSON meta part a peer may send."""
MAX_FDS = 16
"""The most fds one message may carry (a REGISTER of up to 16 memories); extra ones are closed."""
FD_SLOTS = 253
"""SCM_MAX_FD, the most fds the kernel passes in one message: the receive buffer has room for all
of them, so that fds beyond MAX_FDS are received and closed, never left in flight."""
DATA_ALIGN = 64
"""Each tensor in a data part starts on this boundary (from the part's first byte)."""
MAX_RANK = 16
MAX_BYTES = 1 << 40
"""No tensor, offset or memory of a request may exceed this many bytes."""
DTYPES = frozenset({"bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64",
                    "float16", "float32", "float64"})
"""The dtypes a tensor on the wire may have (numpy names)."""

_header = struct.Struct(HEADER_FORMAT)


class Kind(IntEnum):
    """Message kinds: requests (client to server) and answers (server to client)."""

    INFO = 1
    REGISTER = 2
    UNREGISTER = 3
    RUN = 4
    HEALTH = 5
    STATS = 6
    OK = 64
    ERROR = 65
    BUSY = 66


REQUESTS = frozenset({Kind.INFO, Kind.REGISTER, Kind.UNREGISTER, Kind.RUN, Kind.HEALTH, Kind.STATS})


@dataclass
class Message:
    """One received message; `fds` are the receiver's to close (or to keep)."""

    kind: int
    request: int
    meta: Any
    data: np.ndarray
    """The data part: uint8, its first byte DATA_ALIGN-aligned."""
    fds: list[int]
    declared_fds: int
    """How many fds the header says are attached (checked against `fds` by the receiver)."""


class Broken(ServingError):
    """The byte stream cannot be read further (a bad header, a message cut short): the receiver
    answers if it can, then drops the connection."""


# ------------------------------------------------------------------------------------ sending

def layout(arrays: Iterable[np.ndarray]) -> tuple[list[int], int]:
    """Where each array lies in a data part (DATA_ALIGN-aligned offsets) and the part's size."""
    offsets, cursor = [], 0
    for a in arrays:
        offsets.append(cursor)
        cursor = align(cursor + a.nbytes, DATA_ALIGN)
    return offsets, cursor


def send(sock: socket.socket, kind: int, request: int, meta: Any, arrays: Sequence[np.ndarray] = (),
         fds: Sequence[int] = ()) -> None:
    """Send one message: the header, `meta` as JSON, and `arrays` (C-contiguous) laid out by
    `layout`; `fds` ride on the header's bytes."""
    body = json.dumps(meta, separators=(",", ":")).encode()
    offsets, total = layout(arrays)
    parts: list[memoryview] = [memoryview(_header.pack(MAGIC, VERSION, kind, request, len(body), len(fds), 0,
                                                       total)), memoryview(body)]
    cursor = 0
    for offset, a in zip(offsets, arrays):
        if offset > cursor:
            parts.append(memoryview(bytes(offset - cursor)))
        view = memoryview(np.ascontiguousarray(a)).cast("B")
        parts.append(view)
        cursor = offset + len(view)
    if total > cursor:
        parts.append(memoryview(bytes(total - cursor)))
    ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
    _send_all(sock, [p for p in parts if len(p)], ancillary)


def _send_all(sock: socket.socket, parts: list[memoryview], ancillary: list) -> None:
    """sendmsg until every byte is out (a large data part takes several calls); the ancillary
    data goes with the first."""
    while parts:
        sent = sock.sendmsg(parts, ancillary)
        ancillary = []
        while parts and sent >= len(parts[0]):
            sent -= len(parts[0])
            parts.pop(0)
        if parts and sent:
            parts[0] = parts[0][sent:]


# ------------------------------------------------------------------------------------ receiving

_ANCILLARY = socket.CMSG_SPACE(FD_SLOTS * array.array("i").itemsize)


def _read(sock: socket.socket, buffer: memoryview, fds: list[int]) -> int:
    """Fill `buffer` from the socket, collecting any fds that arrive; the bytes read (fewer only
    when the peer closed)."""
    got = 0
    while got < len(buffer):
        n, ancillary, _, _ = sock.recvmsg_into([buffer[got:]], _ANCILLARY)
        for level, kind, data in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.extend(array.array("i", data[:len(data) - len(data) % 4]))
        if n == 0:
            return got
        got += n
    return got


def receive(sock: socket.socket, max_data: int) -> Message | None:
    """The next whole message, or None when the peer closed between messages. Each read waits
    as long as the socket's own timeout lets it (`settimeout`, or SO_RCVTIMEO on a blocking
    socket: the server's, so that a thread sending an answer on the same socket never sees its
    blocking mode change). Raises Broken when the header is not omrt's, a size exceeds its
    limit, or the peer stops mid-message (every fd received is closed first)."""
    fds: list[int] = []
    try:
        header = bytearray(HEADER_SIZE)
        got = _read(sock, memoryview(header), fds)
        if got == 0 and not fds:
            return None
        if got < HEADER_SIZE:
            raise Broken(f"the message ended after {got} of the header's {HEADER_SIZE} bytes")
        magic, version, kind, request, meta_len, nfds, reserved, data_len = _header.unpack(header)
        _check_header(magic, version, reserved, meta_len, data_len, max_data)
        meta_bytes = bytearray(meta_len)
        data = aligned_empty(data_len)
        for part in (memoryview(meta_bytes), memoryview(data)):
            if _read(sock, part, fds) < len(part):
                raise Broken(f"the message ended before its {meta_len} bytes of meta and {data_len} bytes of data")
    except (OSError, Broken) as e:
        close_all(fds)
        if isinstance(e, Broken):
            raise
        raise Broken(f"reading the message failed ({e.strerror or type(e).__name__})") from None
    return Message(kind, request, _json(meta_bytes), data, fds, nfds)


def _check_header(magic: bytes, version: int, reserved: int, meta_len: int, data_len: int, max_data: int) -> None:
    if magic != MAGIC:
        raise Broken(f"the message does not start with {MAGIC!r} (got {bytes(magic)!r}): not omrt's protocol")
    if version != VERSION:
        raise Broken(f"protocol version {version} is not spoken here (this side speaks {VERSION}): use a client "
                     f"and server of the same omrt release")
    if reserved:
        raise Broken(f"the header's reserved field is {reserved}; version {VERSION} sends 0 there")
    if meta_len > MAX_META:
        raise Broken(f"the header's meta size {meta_len} exceeds the limit of {MAX_META} bytes")
    if data_len > max_data:
        raise Broken(f"the header's data size {data_len} exceeds the limit of {max_data} bytes: send large "
                     f"tensors in registered memory instead")


def _json(raw: bytearray) -> Any:
    """The meta part decoded, or None when it is not JSON (the receiver answers with an error)."""
    try:
        return json.loads(raw) if raw else {}
    except (ValueError, RecursionError):
        return None


def close_all(fds: Iterable[int]) -> None:
    """Close fds received and not kept (an fd the peer already closed is no error)."""
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


# ------------------------------------------------------------------------------------ tensors

@dataclass(frozen=True)
class Ref:
    """One tensor of a request or answer: in registered memory (`memory` is its id) at `offset`,
    or (`memory` None) at `offset` in the message's data part."""

    dtype: np.dtype
    shape: tuple[int, ...]
    memory: int | None
    offset: int

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize

    def encode(self) -> dict:
        where = {"data": self.offset} if self.memory is None else {"memory": self.memory, "offset": self.offset}
        return {"dtype": self.dtype.name, "shape": list(self.shape), **where}


def whole(value: Any, field: str, low: int = 0, high: int = MAX_BYTES) -> int:
    """`value` as an int in [low, high], or a ServingError naming `field`."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ServingError(f"{field} is {value!r}: it must be a whole number from {low} to {high}")
    return value


def _ref(value: Any, field: str, data_len: int) -> Ref:
    if not isinstance(value, dict):
        raise ServingError(f"{field} must be an object with dtype, shape and data or memory and offset")
    dtype_name = value.get("dtype")
    if dtype_name not in DTYPES:
        raise ServingError(f"{field}.dtype is {dtype_name!r}: it must be one of {sorted(DTYPES)}")
    shape = value.get("shape")
    if not isinstance(shape, list) or len(shape) > MAX_RANK:
        raise ServingError(f"{field}.shape must be a list of at most {MAX_RANK} dims")
    ref = Ref(np.dtype(dtype_name), tuple(whole(d, f"{field}.shape[{i}]", 0, 1 << 31) for i, d in enumerate(shape)),
              None if "data" in value else whole(value.get("memory"), f"{field}.memory", 0, 1 << 31),
              whole(value.get("data", value.get("offset")), f"{field}.{'data' if 'data' in value else 'offset'}"))
    if ref.nbytes > MAX_BYTES:
        raise ServingError(f"{field} is {ref.nbytes} bytes: more than the limit of {MAX_BYTES}")
    if ref.memory is None and ref.offset + ref.nbytes > data_len:
        raise ServingError(f"{field} needs bytes {ref.offset}..{ref.offset + ref.nbytes} of the data part, which "
                           f"holds {data_len}: the message is cut short or its offsets are wrong")
    if ref.offset % ref.dtype.alignment:
        raise ServingError(f"{field}: offset {ref.offset} is not aligned to {ref.dtype.alignment} bytes for "
                           f"{ref.dtype}: place the tensor on an aligned offset")
    return ref


def parse_refs(meta: Any, key: str, data_len: int) -> dict[str, Ref]:
    """The tensors of `meta[key]` ("inputs" or "outputs"): name -> Ref, every field checked."""
    refs = meta.get(key, {}) if isinstance(meta, dict) else None
    if not isinstance(refs, dict):
        raise ServingError(f"the request's {key!r} must be an object of tensors by name")
    return {name: _ref(value, f"{key}[{name!r}]", data_len) for name, value in refs.items()}


def encode_refs(refs: Mapping[str, Ref]) -> dict:
    return {name: ref.encode() for name, ref in refs.items()}
