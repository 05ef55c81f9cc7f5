"""`omrt.Client`: a connection to an `omrt serve` server on the same host.

Memory a client registers (`register`, an `omrt.Memory` with an fd) is sent once; from then on
any array that lies inside it travels as a memory id and an offset, so the server reads inputs
from it and writes outputs into it in place, with no copy either way. Other arrays travel as
bytes (the server counts them as copied).
"""

from __future__ import annotations

import os
import socket
import threading
from typing import Any, Mapping, Sequence

import numpy as np

from .. import errors
from ..errors import BusyError, InputError, OmrtError, ServingError
from ..memory import Memory
from ..runtime import IOSpec
from . import protocol
from .protocol import Broken, Kind, Ref

MAX_ANSWER = 1 << 40
"""The client takes answers of any size the server sends (outputs as bytes)."""


class Client:
    """A connection to the server listening on the Unix socket `path`; every request waits at
    most `timeout` seconds for its answer. One request at a time per client (a lock serialises
    threads); use a client per thread for concurrency.

    Errors: a request the server refuses raises the server's error class (`InputError`,
    `BindError`, ...) with its message; a full queue raises `BusyError` at once; no server, a
    server that stops or is killed, or no answer in time raises `ServingError` (the client is then
    closed)."""

    def __init__(self, path: str | os.PathLike, timeout: float = 60.0) -> None:
        self.path = os.fspath(path)
        self.timeout = timeout
        self._sock: socket.socket | None = _connect(self.path, timeout)
        self._lock = threading.Lock()
        self._next = 1
        self._memories: dict[int, tuple[Memory, int]] = {}
        """id() of a registered Memory -> (the Memory, held so that id() stays its own; the server's id)."""
        self.info: dict = self._call(Kind.INFO, {})[0]
        """What the server told of itself: model, protocol, batching, limits."""
        self.inputs = [_spec(d) for d in self.info["inputs"]]
        self.outputs = [_spec(d) for d in self.info["outputs"]]
        self.last: dict = {}
        """Of the last run: "bytes_copied" (by the server, for it) and "batch" (requests in its run)."""

    # ------------------------------------------------------------------ memory

    def register(self, memory: Memory) -> int:
        """Send `memory`'s fd to the server once; arrays inside it then travel by reference.
        Returns the server's id for it (registering again returns the same id)."""
        if id(memory) in self._memories:
            return self._memories[id(memory)][1]
        if memory.fd is None or memory.closed:
            raise InputError(f"{memory!r} has no fd to send: allocate it with omrt.Memory.allocate(n, shared=True) "
                             f"or import one with omrt.Memory.from_fd")
        entry = {"size": memory.nbytes, "offset": memory.fd_offset, "writable": memory.writable}
        meta, _ = self._call(Kind.REGISTER, {"memories": [entry]}, fds=[memory.fd])
        self._memories[id(memory)] = (memory, meta["ids"][0])
        return meta["ids"][0]

    def unregister(self, memory: Memory) -> None:
        """The server unmaps `memory` (and closes its copy of the fd); arrays in it travel as bytes again."""
        entry = self._memories.pop(id(memory), None)
        if entry is None:
            raise InputError(f"{memory!r} is not registered with this client")
        self._call(Kind.UNREGISTER, {"ids": [entry[1]]})

    def _where(self, array: np.ndarray) -> tuple[int, int] | None:
        """(server id, byte offset) of the registered memory `array` lies in, C-contiguous."""
        if not array.flags.c_contiguous:
            return None
        start = array.ctypes.data
        for memory, server_id in self._memories.values():
            if not memory.closed and memory.address <= start and start + array.nbytes <= memory.address + memory.nbytes:
                return server_id, start - memory.address
        return None

    # ------------------------------------------------------------------ requests

    def run(self, inputs: Mapping[str, np.ndarray],
            outputs: Mapping[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        """Run the model on `inputs`; returns every output by name. Arrays in registered memory
        are passed by reference: outputs given there are written in place by the server and
        returned as the very arrays given. Others are sent as bytes; outputs given outside
        registered memory are filled from the answer's bytes."""
        outputs = dict(outputs or {})
        sent: list[np.ndarray] = []
        refs_in = {name: self._ref(np.asarray(a), sent) for name, a in inputs.items()}
        offsets, _ = protocol.layout(sent)
        refs_in = {name: (ref if ref.memory is not None else Ref(ref.dtype, ref.shape, None, offsets[ref.offset]))
                   for name, ref in refs_in.items()}
        in_place = {name: a for name, a in outputs.items() if self._where(a) is not None}
        refs_out = {name: self._ref(a, []) for name, a in in_place.items()}
        meta, data = self._call(Kind.RUN, {"inputs": protocol.encode_refs(refs_in),
                                           "outputs": protocol.encode_refs(refs_out)}, sent)
        results = dict(in_place)
        for name, ref in protocol.parse_refs(meta, "outputs", data.size).items():
            array = data[ref.offset:ref.offset + ref.nbytes].view(ref.dtype).reshape(ref.shape)
            if name in outputs:
                np.copyto(outputs[name], array)
                array = outputs[name]
            results[name] = array
        self.last = {"bytes_copied": meta.get("bytes_copied"), "batch": meta.get("batch")}
        return {s.name: results[s.name] for s in self.outputs if s.name in results}

    def _ref(self, array: np.ndarray, sent: list[np.ndarray]) -> Ref:
        """A reference to registered memory, or (memory None) to the index of `array` in `sent`."""
        where = self._where(array)
        if where is not None:
            return Ref(array.dtype, array.shape, *where)
        sent.append(np.ascontiguousarray(array))
        return Ref(array.dtype, array.shape, None, len(sent) - 1)

    def health(self) -> dict:
        """{"status": "ok" | "draining", "queue_depth", "workers", "clients"}."""
        return self._call(Kind.HEALTH, {})[0]

    def stats(self) -> dict:
        """The server's figures: requests, runs, batches, bytes copied, queue depth, p50/p99
        latency (ms) and more (docs/serving.md)."""
        return self._call(Kind.STATS, {})[0]

    def _call(self, kind: Kind, meta: Any, arrays: Sequence[np.ndarray] = (),
              fds: Sequence[int] = ()) -> tuple[Any, np.ndarray]:
        """Send one request and wait for its answer: (meta, data part)."""
        with self._lock:
            if self._sock is None:
                raise ServingError(f"this client of {self.path} is closed (or its connection broke before): "
                                   f"make a new omrt.Client")
            request, self._next = self._next, self._next + 1
            try:
                protocol.send(self._sock, kind, request, meta, arrays, fds)
                answer = protocol.receive(self._sock, MAX_ANSWER)   # each read within self.timeout
            except (OSError, Broken) as e:
                self._drop()
                raise ServingError(f"{kind.name} request to the server at {self.path} failed: {e}; the server "
                                   f"stopped, was killed or did not answer within {self.timeout} s") from None
            if answer is None:
                self._drop()
                raise ServingError(f"the server at {self.path} closed the connection before answering the "
                                   f"{kind.name} request: it stopped or was killed")
            protocol.close_all(answer.fds)
        return _outcome(answer, request, self), answer.data

    def _drop(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def close(self) -> None:
        """Close the connection: the server unmaps everything this client registered."""
        with self._lock:
            self._drop()
        self._memories.clear()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<omrt.Client {self.path} {self.info.get('model') if hasattr(self, 'info') else ''}>"


def _connect(path: str, timeout: float) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        sock.connect(path)
    except OSError as e:
        sock.close()
        raise ServingError(f"no omrt server listens on {path} ({e.strerror or e}): start one with "
                           f"omrt serve MODEL.om --socket {path}") from None
    return sock


def _outcome(answer: protocol.Message, request: int, client: Client) -> Any:
    """The meta of an OK answer to `request`; BusyError, or the server's error, otherwise."""
    meta = answer.meta if isinstance(answer.meta, dict) else {}
    if answer.kind == Kind.BUSY:
        raise BusyError(f"server: {meta.get('message')}")
    if answer.kind == Kind.ERROR:
        if answer.request != request:  # an error about the connection itself: it is over
            client.close()
        cls = getattr(errors, str(meta.get("error")), None)
        cls = cls if isinstance(cls, type) and issubclass(cls, OmrtError) else ServingError
        raise cls(f"server: {meta.get('message')}")
    if answer.kind != Kind.OK or answer.request != request:
        client.close()
        raise ServingError(f"the server answered request {answer.request} of kind {answer.kind} to request "
                           f"{request}: the exchange is out of step; the client is closed")
    return meta


def _spec(d: dict) -> IOSpec:
    return IOSpec(d["name"], np.dtype(d["dtype"]), tuple(d["shape"]), d["kind"])
