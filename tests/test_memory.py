"""omrt.Memory: allocation with flags, imports without copies, views, sync, ownership, and
caller memory for a session's I/O, its arena and a model's file and weights."""

from __future__ import annotations

import mmap
import os
import shutil
import subprocess
import sys
import threading
from multiprocessing import shared_memory

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import omrt
from omrt import Memory
from omrt.memory import system
from conftest import mlp_model, mlp_reference, steady_state_peak

RNG = np.random.default_rng(11)


def _address(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


def _inside(a: np.ndarray, memory: Memory) -> bool:
    return memory.address <= _address(a) and _address(a) + a.nbytes <= memory.address + memory.nbytes


@pytest.fixture(scope="module")
def mlp_om(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("mem") / "mlp.om")
    omrt.compile(mlp_model(4), path)
    return path


# ----------------------------------------------------------------------------- the object


def test_allocated_memory_is_zeroed_page_aligned_and_viewed_in_place():
    with Memory.allocate(10_000, prefault=True) as m:
        assert m.origin == "allocated" and m.nbytes == 10_000 and m.address % mmap.PAGESIZE == 0
        v = m.view(np.float32, (50, 50))
        assert not v.any()
        v[:] = 3
        assert np.shares_memory(v, m.as_array()) and m.view(np.float32, (2,), 9992).tolist() == [3.0, 3.0]
        with pytest.raises(omrt.BindError, match=r"needs 40 bytes from there; it holds 10000"):
            m.view(np.float32, (10,), 9992)
        with pytest.raises(omrt.BindError, match=r"offset 2 is not aligned to 4 bytes for float32"):
            m.view(np.float32, (1,), 2)
        del v
    assert m.closed
    with pytest.raises(omrt.BindError, match="is closed"):
        m.view(np.uint8, (1,))


def test_close_is_refused_while_views_are_alive_and_leaves_it_usable():
    m = Memory.allocate(4096)
    v = m.view(np.int32, (4,))
    with pytest.raises(omrt.BindError, match="numpy views of it are still alive; drop them"):
        m.close()
    v[:] = 7
    assert m.view(np.int32, (4,)).tolist() == [7] * 4
    del v
    m.close()
    assert m.closed


@pytest.mark.skipif("[never]" in open("/sys/kernel/mm/transparent_hugepage/enabled").read()
                    if os.path.exists("/sys/kernel/mm/transparent_hugepage/enabled") else True,
                    reason="transparent huge pages are disabled on this host")
def test_huge_pages_are_asked_for_and_visible_in_smaps():
    with Memory.allocate(4 << 20, huge_pages=True) as m:
        assert m.address % system.HUGE_PAGE == 0
        assert m.huge_page_bytes >= system.HUGE_PAGE  # what the kernel gave, from /proc/self/smaps
    with Memory.allocate(4 << 20) as plain:
        assert plain.huge_page_bytes < 4 << 20


def test_locked_memory_and_the_error_that_names_the_limit(tmp_path):
    with Memory.allocate(1 << 16, lock=True) as m:
        assert m.locked and repr(m).endswith("locked>")
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("checking the limit needs root to drop to an unprivileged user with setpriv")
    code = ("import omrt\n"
            "try:\n    omrt.Memory.allocate(64 << 20, lock=True)\n"
            "except omrt.AllocationError as e:\n    print(e)\n")
    done = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c", code],
                          capture_output=True, text=True, env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
    if "Permission denied" in done.stderr or "No module named" in done.stderr:
        pytest.skip(f"the unprivileged user cannot run this checkout: {done.stderr.strip()[-200:]}")
    assert "cannot lock 67108864 bytes in RAM" in done.stdout and "RLIMIT_MEMLOCK is" in done.stdout, done.stderr


def test_shared_memory_reaches_another_process_through_its_fd():
    with Memory.allocate(4096, shared=True) as m:
        assert m.kind == "memfd" and m.fd is not None
        code = ("import mmap, os, sys\nfd = int(sys.argv[1])\nm = mmap.mmap(fd, 4096)\n"
                "m[:5] = b'hello'\nm.close()\n")
        subprocess.run([sys.executable, "-c", code, str(m.fd)], pass_fds=[m.fd], check=True)
        assert bytes(m.view(np.uint8, (5,))) == b"hello"


def test_frames_written_by_another_process_are_run_in_place(mlp_om):
    """A producer process writes frames into shared memory through its fd; the session reads
    them where they are: nothing is copied, and each run sees the new frame."""
    sess = omrt.load(mlp_om).session(zero_copy="always")
    frame = sess.alloc_io("x", shared=True)
    producer = ("import mmap, sys, numpy as np\n"
                "m = mmap.mmap(int(sys.argv[1]), 0)\n"
                "x = np.frombuffer(m, np.float32, 256).reshape(4, 64)\n"
                "for line in sys.stdin:\n"
                "    x[:] = np.random.default_rng(int(line)).standard_normal((4, 64))\n"
                "    print('ready', flush=True)\n")
    proc = subprocess.Popen([sys.executable, "-c", producer, str(frame.fd)], pass_fds=[frame.fd], text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        for seed in range(3):
            proc.stdin.write(f"{seed}\n")
            proc.stdin.flush()
            assert proc.stdout.readline() == "ready\n"
            want = mlp_reference(np.random.default_rng(seed).standard_normal((4, 64)).astype(np.float32))
            np.testing.assert_allclose(sess.run()["y"], want, rtol=1e-5, atol=1e-4)
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)
    assert sess.stats.bytes_copied == 0 and sess.stats.runs == 3
    sess.close()
    frame.close()


def test_imports_from_an_fd_check_size_and_offset(tmp_path):
    fd = os.memfd_create("t")
    os.write(fd, bytes(range(256)) * 64)  # 16 KiB
    try:
        with Memory.from_fd(fd, size=100, offset=5000) as m:
            assert m.origin == "fd" and m.kind == "memfd" and m.nbytes == 100
            assert m.view(np.uint8, (3,)).tolist() == [5000 % 256, 5001 % 256, 5002 % 256]
        with pytest.raises(omrt.AllocationError, match=r"cannot map 100 bytes at offset 16300: it holds 16384"):
            Memory.from_fd(fd, size=100, offset=16300)
    finally:
        os.close(fd)
    path = tmp_path / "data.bin"
    path.write_bytes(b"\x01" * 8192)
    ro = os.open(path, os.O_RDONLY)
    try:
        with pytest.raises(omrt.AllocationError, match="cannot map 8192 bytes writable .* opened for reading and writing"):
            Memory.from_fd(ro)
        with Memory.from_fd(ro, writable=False) as m:
            assert not m.writable and m.kind == "file" and m.view(np.uint8, (2,)).tolist() == [1, 1]
    finally:
        os.close(ro)
    r, w = os.pipe()
    try:
        with pytest.raises(omrt.AllocationError, match=r"fd \d+"):
            Memory.from_fd(r, size=10)
    finally:
        os.close(r), os.close(w)


def test_imports_from_buffers_dlpack_and_addresses_copy_nothing():
    raw = bytearray(64)
    with Memory.from_buffer(raw) as m:
        m.view(np.uint8, (4,))[:] = 9
        assert raw[:4] == b"\t\t\t\t" and m.origin == "buffer"
    with pytest.raises(omrt.AllocationError, match="read-only, and writable=True was asked"):
        Memory.from_buffer(b"abc", writable=True)
    with pytest.raises(omrt.AllocationError, match="not contiguous"):
        Memory.from_buffer(np.zeros((4, 4))[:, ::2])
    shm = shared_memory.SharedMemory(create=True, size=128)
    try:
        with Memory.from_buffer(shm.buf) as m:
            assert _address(m.as_array()) == _address(np.frombuffer(shm.buf, np.uint8))
            del m
    finally:
        shm.close(), shm.unlink()
    array = np.arange(8, dtype=np.float32)
    with Memory.from_dlpack(array) as m:
        assert m.origin == "dlpack" and np.shares_memory(m.view(np.float32, (8,)), array)
    import ctypes

    owner = ctypes.create_string_buffer(32)
    with Memory.from_address(ctypes.addressof(owner), 32, owner) as m:
        m.view(np.uint8, (1,))[0] = 65
        assert owner.raw[0:1] == b"A"


def test_a_view_of_memory_at_an_address_keeps_its_owner_alive():
    import ctypes
    import gc
    import weakref

    owner = ctypes.create_string_buffer(b"omrt", 64)
    gone = weakref.ref(owner)
    memory = Memory.from_address(ctypes.addressof(owner), 64, owner)
    view = memory.view(np.uint8, (4,))
    memory.close()
    del owner, memory
    gc.collect()
    assert gone() is not None and bytes(view) == b"omrt"  # read through the view, not freed memory
    del view
    gc.collect()
    assert gone() is None


def test_sync_is_nothing_on_plain_memory_and_msync_on_a_written_file(tmp_path):
    with Memory.allocate(4096) as m:
        assert m.sync("both") == 0 and m.syncs == 0
        with pytest.raises(omrt.BindError, match="sync direction 'sideways'"):
            m.sync("sideways")
    path = tmp_path / "out.bin"
    path.write_bytes(bytes(4096))
    fd = os.open(path, os.O_RDWR)
    try:
        with Memory.from_fd(fd) as m:
            m.view(np.uint8, (3,))[:] = [1, 2, 3]
            assert m.sync("to_device") == 1 and m.sync("from_device") == 0 and m.syncs == 1
    finally:
        os.close(fd)
    assert path.read_bytes()[:3] == b"\x01\x02\x03"


# ----------------------------------------------------------------------------- sessions


def test_memory_bound_as_io_is_used_in_place_and_held(mlp_om):
    model = omrt.load(mlp_om)
    sess = model.session(zero_copy="always")
    x_mem = Memory.allocate(4 * 64 * 4 + 64)
    x = x_mem.view(np.float32, (4, 64), 64)
    x[:] = RNG.standard_normal((4, 64))
    sess.bind("x", x_mem, offset=64)
    y_mem = sess.alloc_io("y")
    assert y_mem.nbytes >= 4 * 10 * 4 and sess.bound_memory("y") is y_mem
    out = sess.run()["y"]
    np.testing.assert_allclose(out, mlp_reference(x), rtol=1e-5, atol=1e-4)
    assert _inside(out, y_mem) and sess.stats.bytes_copied == 0 and sess.stats.syncs == 0
    with pytest.raises(omrt.BindError, match=r"is in use \(input 'x' of a session of"):
        x_mem.close()
    del x, out
    sess.unbind("x")
    x_mem.close()
    sess.close()
    y_mem.close()


def test_a_session_arena_in_caller_memory_shared_by_sessions_run_in_turn(mlp_om, tmp_path):
    from conftest import mlp_model as wider

    other = str(tmp_path / "wide.om")
    omrt.compile(wider(16), other)
    models = [omrt.load(mlp_om), omrt.load(other)]
    size = omrt.arena_size(models)
    assert size == max(m.memory_sizes()["arena"] for m in models)
    with Memory.allocate(size) as arena:
        sessions = [m.session(arena=arena) for m in models]
        for m, s in zip(models, sessions):
            x = RNG.standard_normal(m.inputs[0].shape).astype(np.float32)
            np.testing.assert_allclose(s.run({"x": x})["y"], mlp_reference(x), rtol=1e-5, atol=1e-4)
        assert all(np.shares_memory(s._arena, arena.as_array()) for s in sessions)
        with pytest.raises(omrt.BindError, match="is in use"):
            arena.close()
        for s in sessions:
            s.close()
    with Memory.allocate(64) as small, pytest.raises(omrt.BindError, match=r"is too small for this model's arena"):
        models[1].session(arena=small)


def test_a_run_on_an_arena_another_run_is_using_is_refused(mlp_om):
    model = omrt.load(mlp_om)
    with Memory.allocate(omrt.arena_size([model])) as arena:
        first, second = model.session(arena=arena), model.session(arena=arena)
        x = RNG.standard_normal((4, 64)).astype(np.float32)
        with arena.run_lock:  # a run of `first` holds the arena right now
            with pytest.raises(omrt.BindError, match="is in use by another run right now"):
                second.run({"x": x})
        np.testing.assert_allclose(second.run({"x": x})["y"], mlp_reference(x), rtol=1e-5, atol=1e-4)
        first.close(), second.close()


def test_runs_of_sessions_sharing_an_arena_on_two_threads_never_corrupt_each_other(mlp_om):
    model = omrt.load(mlp_om)
    arena = Memory.allocate(omrt.arena_size([model]))
    sessions = [model.session(arena=arena) for _ in range(2)]
    refused, wrong = [], []

    def work(sess: omrt.Session, seed: int) -> None:
        rng = np.random.default_rng(seed)
        for _ in range(200):
            x = rng.standard_normal((4, 64)).astype(np.float32)
            try:
                y = sess.run({"x": x})["y"]
            except omrt.BindError:
                refused.append(1)
                continue
            if not np.allclose(y, mlp_reference(x), rtol=1e-4, atol=1e-3):
                wrong.append(1)

    threads = [threading.Thread(target=work, args=(s, i)) for i, s in enumerate(sessions)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not wrong
    for s in sessions:
        s.close()
    arena.close()


# ----------------------------------------------------------------------------- models from memory


def test_a_model_loads_from_an_fd_or_memory_in_place_and_writes_no_file(mlp_om, tmp_path, monkeypatch):
    data = open(mlp_om, "rb").read()
    fd = os.memfd_create("model")
    os.write(fd, data)
    monkeypatch.chdir(tmp_path)
    x = RNG.standard_normal((4, 64)).astype(np.float32)
    try:
        by_fd = omrt.load(fd)
        os.close(fd)  # omrt keeps its own duplicate
        fd = None
        np.testing.assert_allclose(by_fd.session().run({"x": x})["y"], mlp_reference(x), rtol=1e-5, atol=1e-4)
        assert by_fd.path.startswith("<fd ")
        memory = by_fd._source
        assert all(_inside(w, memory) for w in by_fd.graph.constants.values())
    finally:
        if fd is not None:
            os.close(fd)
    with Memory.allocate(len(data)) as m:
        m.as_array()[:] = np.frombuffer(data, np.uint8)
        model = omrt.load(m)
        assert all(_inside(w, m) for w in model.graph.constants.values())
        np.testing.assert_allclose(model.session().run({"x": x})["y"], mlp_reference(x), rtol=1e-5, atol=1e-4)
        with pytest.raises(omrt.BindError, match="is in use"):
            m.close()
        del model
    assert os.listdir(tmp_path) == []


def test_weights_placed_in_caller_memory_are_copied_once_and_read_from_there(mlp_om):
    sizes = omrt.load(mlp_om).memory_sizes()
    assert set(sizes) == {"weights", "arena", "workspace", "io_fallback"} and sizes["weights"] > 0
    x = RNG.standard_normal((4, 64)).astype(np.float32)
    with Memory.allocate(sizes["weights"], lock=True) as weights:
        model = omrt.load(mlp_om, weights=weights)
        assert model.weights_copied == sizes["weights"]
        w = model.graph.constants["W1"]
        assert _inside(w, weights) and not w.flags.writeable
        np.testing.assert_allclose(model.session().run({"x": x})["y"], mlp_reference(x), rtol=1e-5, atol=1e-4)
        del model, w
    with Memory.allocate(16) as small, pytest.raises(omrt.AllocationError, match=r"holds 16 bytes: the weights of the model .* needs \d+ writable"):
        omrt.load(mlp_om, weights=small)
    odd = Memory.from_buffer(np.zeros(sizes["weights"] + 1, np.uint8)[1:])  # one byte off any boundary
    with pytest.raises(omrt.AllocationError, match="does not start on a 64-byte boundary: the weights"):
        omrt.load(mlp_om, weights=odd)


def test_no_mapping_leaks(mlp_om):
    """Memory of every kind, bound as arena and I/O, run, closed: the process's maps are as before."""
    import gc

    model = omrt.load(mlp_om)
    x = RNG.standard_normal((4, 64)).astype(np.float32)
    gc.collect()
    before = system.map_count()
    for _ in range(5):
        with Memory.allocate(omrt.arena_size([model]), huge_pages=True) as arena, \
                Memory.allocate(4096, shared=True) as frame:
            sess = model.session(arena=arena)
            frame.view(np.float32, (4, 64))[:] = x
            sess.bind("x", frame)
            sess.alloc_io("y", lock=True)
            sess.run()
            y = sess.bound_memory("y")
            sess.close()
            y.close()
    gc.collect()
    assert system.map_count() == before


# ----------------------------------------------------------------------------- buffer pools


def test_a_pool_hands_out_fixed_sets_and_takes_them_back(mlp_om):
    model = omrt.load(mlp_om)
    pool = omrt.IOPool(model, count=2, shared=True)
    memories = [s.memory for s in pool.sets]
    sess = model.session(zero_copy="always")
    for _ in range(5):
        with pool.acquire(timeout=1) as io:
            assert io.memory in memories and io["x"].shape == (4, 64) and io["y"].shape == (4, 10)
            io["x"][:] = RNG.standard_normal((4, 64))
            io.bind(sess)
            sess.run()
            np.testing.assert_allclose(io["y"], mlp_reference(io["x"]), rtol=1e-5, atol=1e-4)
            assert sess.bound_memory("y") is io.memory
        assert sess.bound_memory("y") is None  # released sets are unbound
    a, b = pool.acquire(), pool.acquire()
    with pytest.raises(omrt.BindError, match=r"no free set in the pool of 2 after 0.01 s"):
        pool.acquire(timeout=0.01)
    a.release(), b.release()
    a.release()  # a second release does not put the set in the queue twice
    c, d = pool.acquire(timeout=1), pool.acquire(timeout=1)
    assert c is not d
    c.release(), d.release()
    assert sess.stats.bytes_copied == 0
    pool.close()
    assert all(m.closed for m in memories)


def test_acquiring_a_set_and_running_on_it_allocate_nothing(mlp_om):
    import tracemalloc

    model = omrt.load(mlp_om)
    pool = omrt.IOPool(model, count=1)
    sess = model.session()
    with pool.acquire() as io:
        io.bind(sess)
        sess.run()
        assert steady_state_peak(sess) < 64 * 1024
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        for _ in range(50):
            with pool.acquire() as io:
                io.bind(sess)
                sess.run()
                assert sess._bound["x"] is io["x"]  # the set's own view: none is made per request
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    assert peak < 32 * 1024, peak  # small objects of a run and a bind, freed each time: no growth
    pool.close()


# ----------------------------------------------------------------------------- ownership, at random

OPS = ("allocate", "shared", "import", "bind_x", "bind_y", "unbind", "run", "close", "close_session")


def _play(model: omrt.Model, steps: list[tuple[str, int]]) -> tuple[list, list]:
    """Carry out the steps on two sessions, checking each rule; returns the sessions and memories."""
    memories: list[Memory] = []
    sessions = [model.session(), model.session()]
    bound: dict[tuple[int, str], Memory] = {}
    for op, k in steps:
        sess_i = k % 2
        sess = sessions[sess_i]
        mem = memories[k % len(memories)] if memories else None
        if op in ("allocate", "shared", "import"):
            memories.append(Memory.allocate(2048, shared=op == "shared") if op != "import"
                            else Memory.from_buffer(bytearray(2048)))
        elif op in ("bind_x", "bind_y") and mem is not None and not mem.closed:
            sess.bind(op[-1], mem)
            bound[(sess_i, op[-1])] = mem
        elif op == "unbind" and (sess_i, "x") in bound:
            sess.unbind("x")
            del bound[(sess_i, "x")]
        elif op == "run" and (sess_i, "x") in bound:
            x = bound[(sess_i, "x")].view(np.float32, (4, 64))
            x[:] = k
            y = sess.run()["y"]  # (one memory bound as both x and y is copied through a fallback)
            np.testing.assert_allclose(y, mlp_reference(np.full((4, 64), k, np.float32)), rtol=1e-5, atol=1e-4)
            if (sess_i, "y") in bound:
                assert np.shares_memory(y, bound[(sess_i, "y")].as_array())
            del x, y  # views: a memory unbound later must close
        elif op == "close" and mem is not None and not mem.closed:
            if any(m is mem for m in bound.values()):
                with pytest.raises(omrt.BindError, match="is in use"):
                    mem.close()
            else:
                mem.close()
        elif op == "close_session":
            sess.close()
            bound = {key: m for key, m in bound.items() if key[0] != sess_i}
    return sessions, memories


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.sampled_from(OPS), st.integers(0, 3)), max_size=25))
def test_ownership_rules_hold_for_any_sequence_and_nothing_leaks(mlp_om, steps):
    """Memory closes exactly when nothing holds it, bound memory is used in place, and after
    closing everything the process has the mappings it had before."""
    import gc

    def play_and_close() -> None:
        sessions, memories = _play(model, steps)
        for sess in sessions:
            sess.close()
        for mem in memories:
            mem.close()
            assert mem.closed
        del sessions, memories
        gc.collect()

    model = omrt.load(mlp_om)
    play_and_close()  # once first: what the process makes once (thread pools, their stacks) is not a leak
    before = system.map_count()
    play_and_close()
    after = system.map_count()
    if after != before:
        # Another thread of the process may have mapped something meanwhile (a thread's stack or
        # malloc arena; seen once in a whole-suite run with no steps at all). A leak grows with
        # every play: two more must end where this one did.
        play_and_close()
        play_and_close()
        assert system.map_count() == after, (before, after)


def test_memory_a_session_uses_in_two_roles_stays_held_until_both_end(mlp_om):
    from conftest import W1

    sess = omrt.load(mlp_om).session()
    with Memory.allocate(1 << 16) as shared:
        shared.view(np.float32, W1.shape)[:] = W1
        sess.set_weight("W1", shared)
        sess.bind("x", shared, offset=1 << 15)
        sess.unbind("x")  # the weight still reads it
        with pytest.raises(omrt.BindError, match=r"is in use \(weight 'W1' of a session"):
            shared.close()
        sess.set_weight("W1", None)


def test_memory_rebound_away_from_can_be_closed(mlp_om):
    sess = omrt.load(mlp_om).session()
    first, second = Memory.allocate(2048), Memory.allocate(2048)
    sess.bind("x", first)
    sess.run()
    sess.bind("x", second)  # the kernels no longer point at `first`
    first.close()
    assert first.closed
    second.view(np.float32, (4, 64))[:] = 1
    np.testing.assert_allclose(sess.run()["y"], mlp_reference(np.ones((4, 64), np.float32)), rtol=1e-5, atol=1e-4)
    sess.close()
    second.close()


def test_read_only_memory_is_refused_where_the_model_writes(mlp_om):
    model = omrt.load(mlp_om)
    sess = model.session()
    frozen = Memory.from_buffer(bytes(4096))
    with pytest.raises(omrt.BindError, match="output 'y': the bound buffer is read-only"):
        sess.bind("y", frozen)
    sess.bind("x", frozen)  # an input is only read
    np.testing.assert_array_equal(sess.run()["y"], mlp_reference(np.zeros((4, 64), np.float32)))
    with pytest.raises(omrt.BindError, match="is read-only: the arena of a session of .* needs 4096 writable bytes"):
        model.session(arena=frozen)
    sess.close()
    frozen.close()
