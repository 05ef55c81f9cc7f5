"""`omrt serve` and `omrt.Client`: real server processes on real Unix sockets, real fds.

Every server here is an `omrt serve` subprocess on a socket in tmp_path, stopped (SIGTERM, then
SIGKILL) when its test ends, whatever happened. Leaks are counted in the server's own
/proc/PID/fd and /proc/PID/maps, after a first round has warmed up its threads and plans.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import signal
import socket
import stat
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import omrt
from omrt.serving import Options, Server
from omrt.serving import protocol
from omrt.serving.protocol import HEADER_FORMAT, MAGIC, VERSION, Kind

SRC = str(Path(omrt.__file__).parent.parent)
FEATURES, SLOW_FEATURES, SLOW_LAYERS = 64, 256, 32
W = (np.arange(FEATURES * FEATURES, dtype=np.float32).reshape(FEATURES, FEATURES) % 7 - 3) / 8
SLOW_W = np.random.default_rng(1).standard_normal((SLOW_FEATURES, SLOW_FEATURES)).astype(np.float32) / 16


def dense_model(weights: np.ndarray, layers: int, batch: str | int = "N"):
    """x[batch, F] -> (MatMul W, Relu) x layers -> y[batch, F]."""
    nodes, value = [], "x"
    for i in range(layers):
        nodes += [helper.make_node("MatMul", [value, "W"], [f"h{i}"]), helper.make_node("Relu", [f"h{i}"], [f"r{i}"])]
        value = f"r{i}"
    nodes.append(helper.make_node("Identity", [value], ["y"]))
    features = weights.shape[0]
    x, y = (helper.make_tensor_value_info(n, TensorProto.FLOAT, [batch, features]) for n in "xy")
    graph = helper.make_graph(nodes, "dense", [x], [y], [numpy_helper.from_array(weights, "W")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def reference(x: np.ndarray) -> np.ndarray:
    return np.maximum(x @ W, 0)


def close_to(got: np.ndarray, want: np.ndarray) -> bool:
    """Equal within float32 rounding of a 64-term dot product, in any summation order."""
    return got.shape == want.shape and np.allclose(got, want, rtol=0, atol=1e-5 * max(float(np.abs(want).max()), 1))


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, str]:
    folder = tmp_path_factory.mktemp("served")
    paths = {"tiny": str(folder / "tiny.om"), "slow": str(folder / "slow.om"), "fixed": str(folder / "fixed.om")}
    omrt.compile(dense_model(W, 1), paths["tiny"], native=False)
    omrt.compile(dense_model(SLOW_W, SLOW_LAYERS), paths["slow"], native=False)
    omrt.compile(dense_model(W, 1, batch=2), paths["fixed"], native=False)
    return paths


@pytest.fixture(scope="module")
def slow_rows(models) -> int:
    """Rows of the slow model that take about a second to run here (at least 0.5 s)."""
    session = omrt.load(models["slow"]).session()
    x = np.ones((1024, SLOW_FEATURES), np.float32)
    session.run({"x": x})
    t = time.perf_counter()
    session.run({"x": x})
    return int(np.clip(1024 / (time.perf_counter() - t), 2048, 1 << 16))


@contextlib.contextmanager
def serving(model: str, sock: Path, *args: str) -> Iterator[subprocess.Popen]:
    """An `omrt serve` process on `sock`, ready; stopped and reaped when the block ends."""
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.Popen([sys.executable, "-m", "omrt.cli", "serve", model, "--socket", str(sock), *args],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, proc.communicate()[1]
            with contextlib.suppress(omrt.ServingError):
                omrt.Client(sock, timeout=5).close()
                break
            assert time.monotonic() < deadline, "the server did not start listening within 60 s"
            time.sleep(0.05)
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        proc.communicate()


ALLOCATOR_SLACK = 2
"""Anonymous mappings the server may hold beyond its baseline without a leak: Python's 1 MiB
object arenas and glibc's cached thread stacks come and go with the interpreter's own
allocations (the executor of the last input signature run, say). Client memory (memfd
mappings) and fds must come back exactly."""


def held(pid: int) -> tuple[int, int, int]:
    """(open fds, mappings of client memory (memfds), all mappings) of process `pid`."""
    with open(f"/proc/{pid}/maps") as f:
        maps = f.read().splitlines()
    return len(os.listdir(f"/proc/{pid}/fd")), sum("/memfd:" in m for m in maps), len(maps)


def warmed_up(sock: Path, pid: int, rows: int = 4) -> tuple[int, int, int]:
    """The server's steady (fds, mappings) after 8 clients at once sent it requests by fds and
    as bytes, of up to `rows` rows: what it keeps from then on (reader threads' stacks and
    malloc arenas, plans, session arenas) is there, and only leaks add to it."""
    in_threads(mixed_round, 8, sock, 30, [])   # long enough to overlap: glibc then caches all the stacks it keeps
    with omrt.Client(sock) as client:
        client.run({"x": np.zeros((rows, FEATURES), np.float32)})
    return steady(pid)


def steady(pid: int) -> tuple[int, int, int]:
    """The server's `held` figures once two readings 0.2 s apart agree: clients that just left
    are let go of, the baseline a test compares with at its end."""
    before, now = None, held(pid)
    while now != before:
        time.sleep(0.2)
        before, now = now, held(pid)
    return now


def leaks(pid: int, baseline: tuple[int, int, int], seconds: float = 10.0) -> tuple[int, int, int]:
    """What the server holds beyond `baseline` once it has let go of clients that left (waiting
    up to `seconds`): extra fds, extra client memory mappings, and anonymous mappings beyond
    ALLOCATOR_SLACK; (0, 0, 0) when nothing leaked."""
    deadline = time.monotonic() + seconds
    while True:
        fds, client_maps, maps = held(pid)
        extra = (fds - baseline[0], client_maps - baseline[1], max(maps - baseline[2] - ALLOCATOR_SLACK, 0))
        if extra == (0, 0, 0) or time.monotonic() > deadline:
            return extra
        time.sleep(0.05)


def shared(rows: int, features: int = FEATURES) -> tuple[omrt.Memory, np.ndarray]:
    memory = omrt.Memory.allocate(rows * features * 4, shared=True)
    return memory, memory.view(np.float32, (rows, features))


def rows_of(seed: int, rows: int, features: int = FEATURES) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((rows, features)).astype(np.float32)


def fd_round(sock: Path, seed: int, requests: int, wrong: list) -> None:
    """A client that registers its memory and runs `requests` requests by reference."""
    with omrt.Client(sock) as client:
        (mi, x), (mo, y) = shared(4), shared(4)
        client.register(mi)
        client.register(mo)
        for i in range(requests):
            x[:] = rows_of(seed * 100_003 + i, 4)
            got = client.run({"x": x}, {"y": y})["y"]
            if got is not y or not close_to(y, reference(x)) or client.last["bytes_copied"] != 0:
                wrong.append((seed, i, client.last))
        del x, y, got


def bytes_round(sock: Path, seed: int, requests: int, wrong: list) -> None:
    """A client that sends its tensors as bytes."""
    with omrt.Client(sock) as client:
        for i in range(requests):
            x = rows_of(seed * 100_003 + i, 1 + i % 5)
            if not close_to(client.run({"x": x})["y"], reference(x)):
                wrong.append((seed, i))


def mixed_round(sock: Path, seed: int, requests: int, wrong: list) -> None:
    """Odd seeds send by fds, even ones as bytes."""
    (fd_round if seed % 2 else bytes_round)(sock, seed, requests, wrong)


def in_threads(target, count: int, *args) -> None:
    threads = [threading.Thread(target=target, args=(args[0], seed, *args[1:])) for seed in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


# ------------------------------------------------------------------------------------ values


def test_results_match_an_in_process_run_with_fds_in_place_and_bytes_counted(models, tmp_path):
    sock = tmp_path / "s.sock"
    x = rows_of(0, 3)
    want = omrt.load(models["tiny"]).session().run({"x": x})["y"]
    with serving(models["tiny"], sock), omrt.Client(sock) as client:
        assert stat.S_IMODE(os.stat(sock).st_mode) == 0o600 and stat.S_ISSOCK(os.stat(sock).st_mode)
        assert [(s.name, s.dtype, s.shape) for s in client.inputs] == [("x", np.dtype(np.float32), ("N", FEATURES))]
        got = client.run({"x": x})["y"]
        assert np.array_equal(got, want) and client.last == {"bytes_copied": x.nbytes + got.nbytes, "batch": 1}
        filled = np.empty_like(want)
        assert client.run({"x": x}, {"y": filled})["y"] is filled and np.array_equal(filled, want)

        (mi, xi), (mo, yo) = shared(3), shared(3)
        xi[:] = x
        assert client.register(mi) != client.register(mo) and client.register(mi) == client.register(mi)
        result = client.run({"x": xi}, {"y": yo})["y"]
        assert result is yo and np.shares_memory(result, mo.as_array()) and np.array_equal(yo, want)
        assert client.last == {"bytes_copied": 0, "batch": 1}
        xi[:] = rows_of(1, 3)                        # the same memory, new values: no fd is sent again
        client.run({"x": xi}, {"y": yo})
        assert close_to(yo, reference(xi))
        part = client.run({"x": xi[1:]})["y"]        # an input at an offset in registered memory
        assert close_to(part, reference(xi[1:])) and client.last["bytes_copied"] == part.nbytes
        stats = client.stats()
        assert stats["requests"] == stats["runs"] == 5 and stats["copied_requests"] == 3
        assert stats["bytes_copied"] == 2 * (x.nbytes + want.nbytes) + part.nbytes
        assert stats["errors"] == stats["busy"] == 0 and stats["latency_ms"]["p99"] >= stats["latency_ms"]["p50"] > 0
        assert client.health() == {"status": "ok", "queue_depth": 0, "workers": 1, "clients": 1}
        client.unregister(mo)
        copied = client.run({"x": xi}, {"y": yo})    # no longer registered: filled from bytes
        assert copied["y"] is yo and client.last["bytes_copied"] == 0 + yo.nbytes
        del xi, yo, result, part, copied
    for memory in (mi, mo):
        memory.close()


# ------------------------------------------------------------------------------------ soak


def test_soak_8_clients_1000_requests_each_leak_nothing(models, tmp_path):
    sock, wrong = tmp_path / "s.sock", []
    with serving(models["tiny"], sock, "--workers", "2") as proc:
        baseline = warmed_up(sock, proc.pid)
        in_threads(mixed_round, 8, sock, 1000, wrong)
        assert not wrong, wrong[:5]
        assert leaks(proc.pid, baseline) == (0, 0, 0)
        with omrt.Client(sock) as client:
            stats = client.stats()
        assert stats["requests"] == stats["runs"] == 8 * 1030 + 1 and stats["errors"] == 0
        assert stats["copied_requests"] == 4 * 1030 + 1


# ------------------------------------------------------------------------------------ misbehaving clients


def raw(sock: Path) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(10)
    s.connect(str(sock))
    return s


def ask(s: socket.socket, kind: int, meta, arrays=(), fds=()) -> protocol.Message | None:
    protocol.send(s, kind, 7, meta, arrays, fds)
    return protocol.receive(s, 1 << 30)


def error_of(answer: protocol.Message | None) -> tuple[str, str]:
    assert answer is not None and answer.kind == Kind.ERROR, answer
    return answer.meta["error"], answer.meta["message"]


def header(meta_len: int = 0, data_len: int = 0, magic: bytes = MAGIC, version: int = VERSION,
           kind: int = Kind.RUN, reserved: int = 0) -> bytes:
    return struct.pack(HEADER_FORMAT, magic, version, kind, 7, meta_len, 0, reserved, data_len)


def x_ref(**fields) -> dict:
    return {"inputs": {"x": {"dtype": "float32", "shape": [4, FEATURES], **fields}}}


DIES_MID_REQUEST = """
import os, sys, numpy as np, omrt
from omrt.serving import protocol
client = omrt.Client(sys.argv[1])
memory = omrt.Memory.allocate(4 * 20_000 * 64, shared=True)
mid = client.register(memory)
ref = {"dtype": "float32", "shape": [20_000, 64], "memory": mid, "offset": 0}
protocol.send(client._sock, protocol.Kind.RUN, 99, {"inputs": {"x": ref}, "outputs": {"y": ref}})
os._exit(0)
"""


def test_misbehaving_clients_get_an_error_or_are_dropped_and_nothing_leaks(models, tmp_path):
    sock = tmp_path / "s.sock"
    with serving(models["tiny"], sock) as proc:
        baseline = warmed_up(sock, proc.pid, rows=20_000)   # the rows of the request of a client that dies
        good = omrt.Client(sock)

        def still_serving() -> None:
            x = rows_of(5, 2)
            assert close_to(good.run({"x": x})["y"], reference(x))

        # a client process that dies mid-request (its request still runs, on memory it sent)
        env = {**os.environ, "PYTHONPATH": SRC}
        subprocess.run([sys.executable, "-c", DIES_MID_REQUEST, str(sock)], env=env, check=True, timeout=60)
        still_serving()
        # a header cut short, a message cut short, then gone; and one that stays silent mid-header
        for cut in (header()[:10], header(data_len=4096) + b"\0" * 100):
            with raw(sock) as s:
                s.sendall(cut)
        silent = raw(sock)
        silent.sendall(header()[:10])
        still_serving()
        # a header that is not omrt's, or of another version, or too large: answered, then dropped
        for bad, words in ((header(magic=b"HTTP"), "not omrt's protocol"), (header(version=9), "version 9"),
                           (header(reserved=1), "reserved field is 1"),
                           (header(meta_len=1 << 20), "exceeds the limit of 65536"),
                           (header(data_len=1 << 31), "exceeds the limit of 1073741824")):
            with raw(sock) as s:
                s.sendall(bad)
                assert words in error_of(protocol.receive(s, 1 << 20))[1]
                assert protocol.receive(s, 1 << 20) is None
        with raw(sock) as s:   # wrong sizes, types and names: answered, and the connection goes on
            cases = [
                (x_ref(data=0), "ServingError", "needs bytes 0..1024 of the data part, which holds 64"),
                (x_ref(data=0, dtype="float64", shape=[2, 4]), "InputError",
                 "input 'x' is float64, the model needs float32"),
                (x_ref(data=0, shape=[4, -1]), "ServingError", "shape[1] is -1"),
                ({"inputs": {"x": {"dtype": "float32", "shape": [4, 3], "data": 0}}}, "InputError",
                 "has shape (4, 3), the model expects ('N', 64)"),
                (x_ref(data=2, shape=[1, 1]), "ServingError", "offset 2 is not aligned to 4 bytes"),
                (x_ref(memory=5, offset=0), "ServingError", "memory 5 is not registered on this connection"),
                ({"inputs": {"z": {"dtype": "float32", "shape": [1], "data": 0}}}, "InputError", "['z']"),
                ({"inputs": []}, "ServingError", "'inputs' must be an object"),
            ]
            for meta, cls, words in cases:
                answer = ask(s, Kind.RUN, meta, [np.zeros(2, np.float32)])
                assert error_of(answer)[0] == cls and words in answer.meta["message"], answer.meta
            protocol.send(s, 42, 1, {})
            assert "kind 42 is not a request" in error_of(protocol.receive(s, 1 << 20))[1]
            s.sendall(header(meta_len=3, kind=Kind.HEALTH) + b"{x]")
            assert "not JSON" in error_of(protocol.receive(s, 1 << 20))[1]
        still_serving()

        still_serving()
        assert good.stats()["errors"] > 10
        silent.close()
        good.close()
        assert leaks(proc.pid, baseline) == (0, 0, 0)


def test_output_memory_too_small_or_read_only_is_refused_by_name(models, tmp_path):
    sock = tmp_path / "s.sock"
    with serving(models["tiny"], sock) as proc, omrt.Client(sock) as client:
        baseline = warmed_up(sock, proc.pid)
        x = rows_of(3, 4)
        with raw(sock) as s:
            small = omrt.Memory.allocate(100, shared=True)
            mid = ask(s, Kind.REGISTER, {"memories": [{"size": 100, "offset": 0}]}, fds=[small.fd]).meta["ids"][0]
            out = {"y": {"dtype": "float32", "shape": [4, FEATURES], "memory": mid, "offset": 0}}
            cls, message = error_of(ask(s, Kind.RUN, {"inputs": {"x": {"dtype": "float32", "shape": [4, FEATURES],
                                                                      "data": 0}}, "outputs": out}, [x]))
            assert cls == "BindError" and message.startswith(f"output 'y' (float32 [4, 64]) needs 1024 bytes "
                                                               f"at offset 0; memory {mid} holds 100: register larger")
            read_only = os.open(f"/proc/self/fd/{small.fd}", os.O_RDONLY)   # the same memfd, opened read-only
            answer = ask(s, Kind.REGISTER, {"memories": [{"size": 100, "offset": 0, "writable": True}]},
                         fds=[read_only])
            os.close(read_only)
            assert answer.kind == Kind.OK and answer.meta["writable"] == [False]
            out["y"]["memory"] = answer.meta["ids"][0]
            cls, message = error_of(ask(s, Kind.RUN, {"inputs": {"x": {"dtype": "float32", "shape": [4, FEATURES],
                                                                      "data": 0}}, "outputs": out}, [x]))
            assert cls == "BindError" and f"output 'y': memory {out['y']['memory']} is mapped read-only" in message
        sealed = os.memfd_create("sealed", os.MFD_ALLOW_SEALING)
        os.ftruncate(sealed, 1024)
        fcntl.fcntl(sealed, fcntl.F_ADD_SEALS, fcntl.F_SEAL_WRITE)
        memory = omrt.Memory.from_fd(sealed, writable=False)
        os.close(sealed)
        client.register(memory)
        with pytest.raises(omrt.BindError, match="output 'y': memory .* is mapped read-only"):
            client.run({"x": x}, {"y": memory.view(np.float32, (4, FEATURES))})
        assert close_to(client.run({"x": x})["y"], reference(x))
        client.unregister(memory)
        small.close()
        memory.close()
        assert leaks(proc.pid, baseline) == (0, 0, 0)


def test_ten_thousand_fds_are_closed_and_the_server_goes_on(models, tmp_path):
    sock = tmp_path / "s.sock"
    with serving(models["tiny"], sock) as proc:
        baseline = warmed_up(sock, proc.pid)
        memory = omrt.Memory.allocate(4096, shared=True)
        with raw(sock) as s:
            for i in range(40):                      # 40 x 250 = 10,000 fds, 250 per message (at most 253)
                fds = [os.dup(memory.fd) for _ in range(250)]
                kind = Kind.REGISTER if i % 2 else Kind.RUN
                try:
                    protocol.send(s, kind, i, {"memories": [{"size": 4096}] * 250} if i % 2 else x_ref(data=0), (), fds)
                finally:
                    protocol.close_all(fds)
                cls, message = error_of(protocol.receive(s, 1 << 20))
                assert cls == "ServingError"
                assert ("at most 16 fds; this one carried 250" if i % 2 else "only REGISTER carries fds") in message
            fds = [os.dup(memory.fd) for _ in range(16)]  # 4 x 16 registered: the limit of 64 per connection
            ids = [ask(s, Kind.REGISTER, {"memories": [{"size": 4096}] * 16}, fds=fds).meta["ids"] for _ in range(4)]
            open_fds, client_maps, _ = held(proc.pid)
            assert len({i for batch in ids for i in batch}) == 64 and open_fds >= baseline[0] + 64
            assert client_maps == baseline[1] + 64          # each registration is one mapping of the memfd
            assert "at most 64 memories; 64 are registered" in error_of(
                ask(s, Kind.REGISTER, {"memories": [{"size": 4096}] * 16}, fds=fds))[1]
            protocol.close_all(fds)
            assert ask(s, Kind.UNREGISTER, {"ids": ids[0]}).meta == {"ids": ids[0]}
        x = rows_of(4, 2)
        with omrt.Client(sock) as client:
            assert close_to(client.run({"x": x})["y"], reference(x))
        memory.close()
        assert leaks(proc.pid, baseline) == (0, 0, 0)


# ------------------------------------------------------------------------------------ the server failing


def test_a_server_killed_mid_request_raises_in_the_client_within_a_timeout(models, tmp_path, slow_rows):
    sock = tmp_path / "s.sock"
    with serving(models["slow"], sock) as proc, omrt.Client(sock, timeout=60) as client:
        with omrt.Client(sock, timeout=1) as impatient:   # a server that does not answer in time
            proc.send_signal(signal.SIGSTOP)
            while open(f"/proc/{proc.pid}/stat").read().rpartition(")")[2].split()[0] != "T":
                time.sleep(0.01)
            t = time.monotonic()
            try:
                with pytest.raises(omrt.ServingError, match="did not answer within 1 s"):
                    impatient.health()
            finally:
                proc.send_signal(signal.SIGCONT)
            assert time.monotonic() - t < 5
        (mi, x), (mo, y) = shared(slow_rows * 4, SLOW_FEATURES), shared(slow_rows * 4, SLOW_FEATURES)
        client.register(mi)
        client.register(mo)
        killer = threading.Timer(0.3, proc.kill)
        killer.start()
        t = time.monotonic()
        with pytest.raises(omrt.ServingError, match="closed the connection before answering the RUN request: "
                                                     "it stopped or was killed"):
            client.run({"x": x}, {"y": y})
        assert time.monotonic() - t < 10
        killer.join()
        del x, y
        with pytest.raises(omrt.ServingError, match="is closed"):
            client.health()


def test_a_full_queue_answers_busy_and_sigterm_drains_what_it_took(models, tmp_path, slow_rows):
    sock = tmp_path / "s.sock"
    x = rows_of(7, slow_rows, SLOW_FEATURES)
    want = omrt.load(models["slow"]).session().run({"x": x})["y"]
    results: dict[str, np.ndarray] = {}
    with serving(models["slow"], sock, "--workers", "1", "--queue", "1") as proc:
        clients = {name: omrt.Client(sock) for name in "ABCD"}

        def run(name: str) -> None:
            results[name] = clients[name].run({"x": x})["y"]

        def wait_for(key: str, value: int) -> None:
            while clients["D"].health()[key] != value if key != "running" else clients["D"].stats()[key] != value:
                time.sleep(0.01)

        threads = {name: threading.Thread(target=run, args=(name,)) for name in "AB"}
        threads["A"].start()
        wait_for("running", 1)
        threads["B"].start()
        wait_for("queue_depth", 1)
        t = time.monotonic()
        with pytest.raises(omrt.BusyError, match="the server is busy: its queue of 1 requests is full"):
            clients["C"].run({"x": x[:1]})
        assert time.monotonic() - t < 1.0
        proc.send_signal(signal.SIGTERM)
        while clients["D"].health()["status"] != "draining":
            time.sleep(0.01)
        with pytest.raises(omrt.ServingError, match="shutting down: it answers the requests it took before"):
            clients["D"].run({"x": x[:1]})
        with pytest.raises(omrt.ServingError, match="no omrt server listens"):
            omrt.Client(sock)
        for thread in threads.values():
            thread.join()
        assert proc.wait(timeout=30) == 0 and not sock.exists()
        assert close_to(results["A"], want) and close_to(results["B"], want)
        assert "stopped after 2 requests" in proc.stdout.read()


# ------------------------------------------------------------------------------------ batching


def test_dynamic_batching_gives_each_client_its_own_rows(models, tmp_path):
    sock = tmp_path / "s.sock"
    with serving(models["tiny"], sock, "--batch-window", "300", "--max-batch", "16") as proc:
        clients = [omrt.Client(sock) for _ in range(4)]
        memories = [(shared(rows + 1), shared(rows + 1)) for rows in range(4)]
        for client, ((mi, xi), (mo, yo)) in zip(clients, memories):
            client.register(mi)
            client.register(mo)
        for round_ in range(2):                  # the second round uses the batch buffers the first made
            barrier, wrong = threading.Barrier(4), []

            def one(k: int) -> None:
                """Even clients pass fds, odd ones bytes; copies: the gather and scatter of a batch,
                and bytes over the socket."""
                (mi, xi), (mo, yo) = memories[k]
                xi[:] = rows_of(round_ * 10 + k, k + 1)
                barrier.wait()
                got = clients[k].run({"x": xi}, {"y": yo})["y"] if k % 2 == 0 else clients[k].run({"x": xi.copy()})["y"]
                batched = clients[k].last["batch"] > 1
                copied = (xi.nbytes if batched else 0) + (xi.nbytes + yo.nbytes if k % 2 else yo.nbytes * batched)
                mine = got is yo if k % 2 == 0 else not np.shares_memory(got, yo)
                if not mine or not close_to(got, reference(xi)) or clients[k].last["bytes_copied"] != copied:
                    wrong.append((k, clients[k].last))

            in_threads(lambda _, k: one(k), 4, None)
            assert not wrong
        stats = clients[0].stats()
        assert stats["requests"] == 8 and stats["batches"] >= 2 and stats["runs"] < 8
        assert stats["batched_requests"] + (stats["runs"] - stats["batches"]) == 8
        for client in clients:
            client.close()
        assert clients[0].info["batching"] == {"dim": "N", "window_ms": 300.0, "max_batch": 16}
        assert proc.poll() is None


def test_batching_needs_a_free_first_dim_and_a_socket_path_is_never_taken_over(models, tmp_path):
    with pytest.raises(omrt.InputError, match="input 'x' has dim 0 = 2: serve it without --batch-window"):
        Server(models["fixed"], tmp_path / "a.sock", Options(batch_window=0.005))
    taken = tmp_path / "file"
    taken.write_text("mine")
    with pytest.raises(omrt.InputError, match="the path exists and is not a socket"):
        Server(models["tiny"], taken)
    assert taken.read_text() == "mine"
    with Server(models["tiny"], tmp_path / "b.sock").start() as server:
        with pytest.raises(omrt.ServingError, match="a server already listens there"):
            Server(models["tiny"], tmp_path / "b.sock")
        with omrt.Client(tmp_path / "b.sock") as client:
            assert client.info["model"] == "tiny.om" and server.snapshot()["status"] == "ok"
    assert not (tmp_path / "b.sock").exists()


ANOTHER_USER = """
import sys, omrt
try:
    omrt.Client(sys.argv[1], timeout=10)
except omrt.ServingError as e:
    print(e)
"""


def test_a_peer_of_another_user_is_refused_even_when_the_socket_mode_lets_it_in(models, tmp_path):
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("connecting as another user needs root to drop to an unprivileged user with setpriv")
    folder = tempfile.mkdtemp()        # not tmp_path: its parents are closed to other users
    try:
        os.chmod(folder, 0o711)
        sock = os.path.join(folder, "s.sock")
        with Server(models["tiny"], sock).start():
            os.chmod(sock, 0o666)
            done = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable,
                                   "-c", ANOTHER_USER, sock], capture_output=True, text=True, timeout=60,
                                  env={**os.environ, "PYTHONPATH": SRC, "PYTHONDONTWRITEBYTECODE": "1"})
            if "Permission denied" in done.stderr or "No module named" in done.stderr:
                pytest.skip(f"the unprivileged user cannot run this checkout: {done.stderr.strip()[-200:]}")
            assert done.stdout.startswith(("INFO request to the server at", "the server at")), done.stderr
            assert "stopped" in done.stdout and "killed" in done.stdout   # dropped at once, never answered
            with omrt.Client(sock) as client:
                assert client.health()["clients"] == 1
    finally:
        shutil.rmtree(folder)
