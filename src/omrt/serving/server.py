"""`omrt serve`: one model behind a Unix-domain socket, for clients on the same host.

The server loads the model it was started with, and only that one: no request names a path or
a model. Its socket is created owner-only (mode 0600, under a umask, so there is no moment when
it is more open) and peers of another user are refused. A thread accepts clients, a thread per
client reads its messages (`connection.py`), a bounded queue holds RUN requests (a full queue
answers busy at once), and workers, each with a session of its own, run them (`worker.py`).
SIGTERM (or `stop()`) drains: the socket goes, requests already queued run and are answered,
new ones are refused, then clients are dropped.
"""

from __future__ import annotations

import os
import queue
import select
import signal
import socket
import stat
import struct
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any

from ..errors import InputError, ServingError
from ..runtime import Model, load
from ..version import __version__
from .batching import batch_dim
from .connection import Connection
from .protocol import MAX_FDS, MAX_META, VERSION
from .registry import MAX_MEMORIES
from .stats import Counters
from .worker import Worker

SHUTTING_DOWN = ("the server is shutting down: it answers the requests it took before and takes no new ones; "
                 "retry on a server that runs")


@dataclass(frozen=True)
class Options:
    """How a server runs: `workers` sessions, a queue of `queue` requests, batching when
    `batch_window` (seconds) is above 0 (up to `max_batch` rows), and the limits per client."""

    workers: int = 1
    queue: int = 64
    batch_window: float = 0.0
    max_batch: int = 8
    max_clients: int = 64
    max_data: int = 1 << 30
    """The largest data part of a message (tensors sent as bytes)."""
    message_timeout: float = 30.0
    """Seconds a message that has begun may take to arrive, and an answer to be taken."""

    def check(self) -> None:
        for name in ("workers", "queue", "max_batch", "max_clients", "max_data"):
            if getattr(self, name) < 1:
                raise InputError(f"{name}={getattr(self, name)}: it must be at least 1")
        if self.batch_window < 0 or self.message_timeout <= 0:
            raise InputError("batch_window must be 0 (off) or more, and message_timeout above 0 (seconds)")


class Server:
    """Serves `model` (a `.om` file, loaded with `trust_kernels`, or a loaded `Model`: signed
    files, weight budgets) on the Unix socket `path` (see the module's docstring);
    `serve_forever()` in the main thread (SIGTERM and SIGINT stop it), or `start()` on a thread
    of its own and `stop()`."""

    def __init__(self, model: str | os.PathLike | Model, path: str | os.PathLike, options: Options = Options(),
                 trust_kernels: bool = False) -> None:
        options.check()
        self.options = options
        self.model: Model = model if isinstance(model, Model) else load(model, trust_kernels=trust_kernels)
        self.batch_dim = batch_dim(self.model) if options.batch_window else None
        self.path = os.fspath(path)
        self.queue: queue.Queue = queue.Queue(options.queue)
        self.counters = Counters()
        self.draining = False
        self._connections: set[Connection] = set()
        self._lock = threading.Lock()
        self.workers = [Worker(self, i) for i in range(options.workers)]
        self._listener, self._identity = _listen(self.path)
        self._wake_r, self._wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ running

    def serve_forever(self) -> None:
        """Accept clients until `stop()` or, in the main thread, SIGTERM or SIGINT; then drain."""
        for worker in self.workers:
            worker.start()
        previous = self._catch_signals()
        events = select.poll()
        for fd in (self._listener.fileno(), self._wake_r):
            events.register(fd, select.POLLIN)
        try:
            while not any(fd == self._wake_r for fd, _ in events.poll()):
                self._accept()
        finally:
            self._drain()
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    def _catch_signals(self) -> dict:
        if threading.current_thread() is not threading.main_thread():
            return {}
        previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
        for signum in previous:
            signal.signal(signum, lambda *_: self.shutdown())
        return previous

    def _accept(self) -> None:
        """Take one client and read it on a thread of its own; one of another user, or beyond
        the limit of clients, is turned away."""
        try:
            sock, _ = self._listener.accept()
        except OSError:  # out of fds, say: the client waits in the backlog a moment
            time.sleep(0.05)
            return
        if not _same_user(sock):
            sock.close()
            return
        timeval = struct.pack("ll", int(self.options.message_timeout), int(self.options.message_timeout % 1 * 1e6))
        for option in (socket.SO_SNDTIMEO, socket.SO_RCVTIMEO):  # a blocking socket, bounded in the kernel
            sock.setsockopt(socket.SOL_SOCKET, option, timeval)
        connection = Connection(sock, self)
        with self._lock:
            full = len(self._connections) >= self.options.max_clients
            if not full:
                self._connections.add(connection)
        if full:
            connection.fail_message(0, ServingError(f"the server has {self.options.max_clients} clients, its limit: "
                                                    f"retry when one has left"))
            connection.close()
            return
        try:
            connection.start()
        except RuntimeError:  # no thread to be had: this client is dropped, the server goes on
            self.forget(connection)
            connection.close()

    def shutdown(self) -> None:
        """Ask the server to stop (safe from a signal handler and from any thread)."""
        if self.draining:  # stopping already; its wake-up pipe may be closed
            return
        try:
            os.write(self._wake_w, b"x")
        except OSError:
            pass

    def _drain(self) -> None:
        """Refuse new requests, remove the socket, answer every request taken, then drop the
        clients and end the workers (once)."""
        with self._lock:
            if self.draining:
                return
            self.draining = True
        self._listener.close()
        _unlink(self.path, self._identity)
        self.queue.join()
        started = [w for w in self.workers if w.thread.ident is not None]
        for _ in started:
            self.queue.put(None)
        for worker in started:
            worker.thread.join()
        with self._lock:
            connections = list(self._connections)
        for connection in connections:
            connection.stop()
        for connection in connections:
            connection.thread.join(timeout=self.options.message_timeout)
        os.close(self._wake_r)
        os.close(self._wake_w)

    def start(self) -> "Server":
        """Serve on a thread of this process (signals stay with the caller); returns self."""
        self._thread = threading.Thread(target=self.serve_forever, name="omrt-serve", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop a server `start()`ed, draining as SIGTERM does, and wait until it has; a server
        never started lets go of its socket."""
        if self._thread is None:
            self._drain()
            return
        self.shutdown()
        self._thread.join()

    def __enter__(self) -> "Server":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # ------------------------------------------------------------------ what connections ask

    def submit(self, request: Any) -> str | None:
        """Queue a request; "busy" when the queue is full, the reason when it is refused."""
        with self._lock:
            if self.draining:
                return SHUTTING_DOWN
            try:
                self.queue.put_nowait(request)
            except queue.Full:
                return "busy"
        return None

    def busy_message(self) -> str:
        return (f"the server is busy: its queue of {self.options.queue} requests is full ({len(self.workers)} "
                f"workers): retry later, or start it with more --workers or a longer --queue")

    def forget(self, connection: Connection) -> None:
        with self._lock:
            self._connections.discard(connection)

    def info(self) -> dict:
        """The model's inputs and outputs, the batching and the limits: what a client needs."""
        def specs(items: list) -> list[dict]:
            return [{"name": s.name, "dtype": s.dtype.name, "shape": list(s.shape), "kind": s.kind} for s in items]

        o = self.options
        batching = {"dim": self.batch_dim, "window_ms": o.batch_window * 1e3, "max_batch": o.max_batch} \
            if self.batch_dim else None
        return {"protocol": VERSION, "omrt": __version__, "model": os.path.basename(self.model.path),
                "inputs": specs(self.model.inputs), "outputs": specs(self.model.outputs), "batching": batching,
                "limits": {"fds_per_message": MAX_FDS, "memories": MAX_MEMORIES, "meta": MAX_META,
                           "data": o.max_data}}

    def queue_depth(self) -> int:
        return self.queue.qsize() + sum(w.carried for w in self.workers)

    def health(self) -> dict:
        with self._lock:
            clients = len(self._connections)
        return {"status": "draining" if self.draining else "ok", "queue_depth": self.queue_depth(),
                "workers": len(self.workers), "clients": clients}

    def snapshot(self) -> dict:
        """Every figure of the stats request."""
        return self.counters.snapshot(**self.health(), options=asdict(self.options))


def _same_user(sock: socket.socket) -> bool:
    """Whether the peer runs as the server's user (the socket's mode keeps others out already;
    this holds even if the mode is changed)."""
    _, uid, _ = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
    return uid == os.getuid()


def _listen(path: str) -> tuple[socket.socket, tuple[int, int]]:
    """A listening socket at `path`, mode 0600 from its creation; a stale socket file is replaced,
    a live server's or any other file is not. Returns it and the file's (device, inode)."""
    if os.path.lexists(path):
        if not stat.S_ISSOCK(os.lstat(path).st_mode):
            raise InputError(f"--socket {path}: the path exists and is not a socket; pick another path")
        if _alive(path):
            raise ServingError(f"--socket {path}: a server already listens there; stop it or pick another path")
        os.unlink(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        sock.bind(path)
    except OSError as e:
        sock.close()
        raise InputError(f"--socket {path}: cannot create the socket ({e.strerror or e}); pick a path in a "
                         f"directory you can write, shorter than 108 bytes") from None
    finally:
        os.umask(old)
    sock.listen(128)
    st = os.stat(path)
    return sock, (st.st_dev, st.st_ino)


def _alive(path: str) -> bool:
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
        return True
    except OSError:
        return False
    finally:
        probe.close()


def _unlink(path: str, identity: tuple[int, int]) -> None:
    """Remove the socket file if it is still this server's."""
    try:
        st = os.stat(path)
        if (st.st_dev, st.st_ino) == identity:
            os.unlink(path)
    except OSError:
        pass


def serve_in_background(model: str | os.PathLike | Model, path: str | os.PathLike, trust_kernels: bool = False,
                        **options: Any) -> Server:
    """A server of `model` on socket `path`, serving on a thread of this process: `stop()` it (or
    use it as a context manager) when done. `options` are those of `Options`."""
    return Server(model, path, Options(**options), trust_kernels).start()
