"""One client of a server: its socket, the memory it registered, and the thread that reads its
messages. Every message is answered (a result, an error naming what is wrong, or busy) unless
the byte stream itself is broken, and then the client is dropped; nothing a client sends can end
the server or leak an fd or a mapping."""

from __future__ import annotations

import select
import socket
import threading
import time
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from ..errors import OmrtError, ServingError
from . import protocol
from .protocol import DTYPES, MAX_FDS, Broken, Kind, Message, Ref
from .registry import Registry
from .request import Request, build

if TYPE_CHECKING:
    from .server import Server


class Connection:
    """A client connected to `server` on `sock`; `start()` reads its messages on a thread of
    its own, workers answer its requests with `result` and `fail`."""

    def __init__(self, sock: socket.socket, server: "Server") -> None:
        self.sock = sock
        self.server = server
        self.registry = Registry()
        self.open = True
        self._send_lock = threading.Lock()
        self.thread = threading.Thread(target=self._serve, name="omrt-serve-client", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def _serve(self) -> None:
        """Read and dispatch messages until the client closes, breaks the stream, or the server
        stops; then let go of everything the client registered."""
        idle = select.poll()
        idle.register(self.sock, select.POLLIN)
        try:
            while self.open:
                idle.poll()  # as long as the client likes between messages; SO_RCVTIMEO bounds one message
                try:
                    message = protocol.receive(self.sock, self.server.options.max_data)
                except (Broken, MemoryError) as e:  # the stream is lost (or the data part cannot be held)
                    self.fail_message(0, e)
                    break
                if message is None:
                    break
                self._dispatch(message)
                del message  # its data part (tensors sent as bytes) is not held while the client idles
        finally:
            self.close()
            self.registry.close()
            self.server.forget(self)

    def _dispatch(self, message: Message) -> None:
        """Answer one message; a request that fails its checks is answered with the error."""
        try:
            self._check_fds(message)
            if message.meta is None:
                raise ServingError("the meta part is not JSON: send a JSON object")
            if message.kind == Kind.RUN:
                self._submit(build(message, self, self.server.model, self.registry))
                return
            self.answer(Kind.OK, message.request, self._handle(message))
        except Exception as e:  # every failure is the client's answer, never the end of the server
            protocol.close_all(message.fds)
            message.fds.clear()
            self.fail_message(message.request, e)

    def _check_fds(self, message: Message) -> None:
        """Only REGISTER carries fds: at most MAX_FDS, as many as its header says."""
        count = len(message.fds)
        problem = (f"only REGISTER carries fds; this {_kind_name(message.kind)} carried {count}"
                   if count and message.kind != Kind.REGISTER else
                   f"a message may carry at most {MAX_FDS} fds; this one carried {count}: register memory in "
                   f"several messages" if count > MAX_FDS else
                   f"the header says {message.declared_fds} fds are attached, {count} arrived"
                   if count != message.declared_fds else None)
        if problem:
            protocol.close_all(message.fds)
            message.fds.clear()
            raise ServingError(problem)

    def _handle(self, message: Message) -> dict:
        """The answer to a request that is not RUN."""
        kind, server = message.kind, self.server
        if kind == Kind.REGISTER:
            fds, message.fds = message.fds, []  # the registry closes them, whatever happens
            return self.registry.register(fds, message.meta)
        if kind == Kind.UNREGISTER:
            return self.registry.unregister(message.meta)
        handlers = {Kind.INFO: server.info, Kind.HEALTH: server.health, Kind.STATS: server.snapshot}
        if kind not in handlers:
            raise ServingError(f"message kind {kind} is not a request; requests are "
                               f"{sorted((k.name, int(k)) for k in protocol.REQUESTS)}")
        return handlers[kind]()

    def _submit(self, request: Request) -> None:
        refused = self.server.submit(request)
        if refused == "busy":
            self.server.counters.add(busy=1)
            self.answer(Kind.BUSY, request.id, {"message": self.server.busy_message()})
        elif refused:
            self.fail_message(request.id, ServingError(refused))

    # ------------------------------------------------------------------ answers

    def answer(self, kind: int, request: int, meta: Any, arrays: Sequence[np.ndarray] = ()) -> bool:
        """Send one answer; False when the client is gone (it is then dropped)."""
        with self._send_lock:
            if not self.open:
                return False
            try:
                protocol.send(self.sock, kind, request, meta, arrays)
                return True
            except OSError:
                self._shut()
                return False

    def fail_message(self, request: int, error: BaseException) -> None:
        """Answer a request with its error: the error's class name (an omrt error the client
        raises as such) and message."""
        self.server.counters.add(errors=1)
        if isinstance(error, OmrtError):
            meta = {"error": type(error).__name__, "message": str(error)}
        else:
            meta = {"error": "ServingError", "message": f"the server failed on this request "
                                                        f"({type(error).__name__}: {error})"}
        self.answer(Kind.ERROR, request, meta)

    def result(self, request: Request, returned: dict[str, np.ndarray], copied: int, batch: int) -> None:
        """Answer a request that ran: outputs written into the client's memory are named, the
        others travel as bytes (counted as copied, with `copied`, the bytes copied to run it)."""
        names = list(returned)
        odd = [f"{n!r} ({returned[n].dtype})" for n in names if returned[n].dtype.name not in DTYPES]
        if odd:
            self.fail_message(request.id, ServingError(f"outputs {', '.join(odd)} are not numeric tensors: only "
                                                       f"those travel; serve a model whose outputs are"))
            return
        arrays = [np.ascontiguousarray(returned[n]) for n in names]
        offsets, _ = protocol.layout(arrays)
        copied += request.copied + sum(a.nbytes for a in arrays)
        meta = {"outputs": {n: Ref(a.dtype, a.shape, None, o).encode() for n, a, o in zip(names, arrays, offsets)},
                "written": sorted(request.outputs), "bytes_copied": copied, "batch": batch}
        self.server.counters.answered(time.monotonic() - request.arrived, copied)
        self.answer(Kind.OK, request.id, meta, arrays)

    # ------------------------------------------------------------------ closing

    def _shut(self) -> None:
        """Stop both directions (the reader wakes up and ends the connection)."""
        self.open = False
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def stop(self) -> None:
        """Drop this client (the server stops): its reader ends and lets go of its memory."""
        with self._send_lock:
            self._shut()

    def close(self) -> None:
        with self._send_lock:
            self.open = False
            self.sock.close()


def _kind_name(kind: int) -> str:
    try:
        return Kind(kind).name
    except ValueError:
        return f"message of kind {kind}"
