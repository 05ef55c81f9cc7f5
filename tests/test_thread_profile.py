"""Session.profile_threads and `omrt run --profile --threads N`: each op type's wall time and how
busy each of omrt's threads was during it. Only facts that hold on any host are asserted
(presence, zero against non-zero, monotonic counters), never timing ratios."""

from __future__ import annotations

import contextlib
import io
import os
import re
import subprocess
import sys

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import omrt
from omrt.cli import main as cli
from omrt.runtime.profile import OpThreads

RNG = np.random.default_rng(0)


def conv_then_transpose():
    """A 5x5 Conv big enough to split over two threads (its filters packed for omrt's GEMM:
    profiles name it PackedConv), then a Transpose, which runs in numpy on the calling thread."""
    w = numpy_helper.from_array(RNG.standard_normal((32, 16, 5, 5)).astype(np.float32) * 0.1, "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[2, 2, 2, 2]),
             helper.make_node("Transpose", ["c"], ["y"], perm=[0, 2, 3, 1])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 32, 32])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 32, 32, 32])], [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture
def conv_om(tmp_path) -> str:
    path = str(tmp_path / "conv.om")
    omrt.compile(conv_then_transpose(), path, autofuse=False)
    return path


def _feeds() -> dict:
    return {"x": RNG.standard_normal((1, 16, 32, 32)).astype(np.float32)}


TRIES = 30
"""Runs to wait for thread 1 to take part: on a loaded host the OS may not wake it before the
calling thread has taken every item of a short call, which is right, and not what these tests
look at."""


def _profile(path: str, trust: bool) -> omrt.ThreadProfile:
    """A profile in which thread 1 took part in the Conv (see TRIES)."""
    model = omrt.load(path, trust_kernels=trust)
    if trust and model.native is None:
        pytest.skip("no native library for this host")
    omrt.set_num_threads(2)
    sess = model.session()
    for _ in range(TRIES):
        prof = sess.profile_threads(_feeds(), repeat=3)
        if prof.ops["PackedConv"].busy[1] > 0:
            break
    return prof


@pytest.mark.parametrize("trust", [True, False], ids=["native pool", "python threads"])
def test_a_split_conv_keeps_both_threads_busy_and_a_numpy_op_idles_the_second(conv_om, trust):
    prof = _profile(conv_om, trust)
    assert prof.threads == 2 and list(prof.ops) == sorted(prof.ops, key=lambda k: -prof.ops[k].seconds)
    conv, transpose = prof.ops["PackedConv"], prof.ops["Transpose"]
    assert conv.seconds > 0 and len(conv.busy) == 2
    assert conv.busy[0] > 0 and conv.busy[1] > 0 and 0 <= conv.idle < 1
    assert transpose.busy == (0.0, 0.0) and transpose.idle == 1.0
    assert prof.run.seconds >= conv.seconds + transpose.seconds
    assert prof.run.busy[1] == pytest.approx(conv.busy[1] + transpose.busy[1])  # nothing splits between tasks


def _native_session(path: str) -> tuple[omrt.Model, omrt.Session]:
    """The model at `path` with its native library, and a session of it, on omrt's 2 threads."""
    model = omrt.load(path, trust_kernels=True)
    if model.native is None:
        pytest.skip("no native library for this host")
    omrt.set_num_threads(2)
    return model, model.session()


def test_the_pool_counters_only_grow_and_stay_still_between_runs(conv_om):
    model, sess = _native_session(conv_om)
    before = model.native.pool_busy(2)
    assert before.dtype == np.int64 and (model.native.pool_busy(2) == before).all()
    for _ in range(TRIES):  # until thread 1 takes part in a run
        sess.run(_feeds())
        after = model.native.pool_busy(2)
        assert (after >= before).all()
        if after[1] > before[1]:
            break
    assert after[1] > before[1]
    assert (model.native.pool_busy(2) == after).all()


def test_one_thread_reads_no_counters_and_profile_keeps_its_result(conv_om):
    omrt.set_num_threads(1)
    sess = omrt.load(conv_om, trust_kernels=True).session()
    prof = sess.profile_threads(_feeds(), repeat=2)
    assert prof.threads == 1 and set(prof.ops) == {"PackedConv", "Transpose"}
    assert all(op.busy == () and op.idle is None for op in prof.ops.values())
    per_op = sess.profile(_feeds(), repeat=2)
    assert set(per_op) == {"PackedConv", "Transpose"} and all(isinstance(v, float) and v > 0 for v in per_op.values())


def test_profile_by_node_gives_each_node_its_own_entry(tmp_path):
    """Two Convs of one op type: by op they add up under PackedConv, by node each has its own
    entry (its name; an unnamed node `<op type>_<index>`)."""
    model = conv_then_transpose()
    model.graph.node[1].name = ""
    second = helper.make_node("Conv", ["x", "w"], ["c2"], name="second", pads=[2, 2, 2, 2])
    model.graph.node.insert(1, second)
    model.graph.node[2].input[0] = "c"
    model.graph.output.append(helper.make_tensor_value_info("c2", TensorProto.FLOAT, [1, 32, 32, 32]))
    model.graph.node[0].name = "first"
    path = str(tmp_path / "two.om")
    omrt.compile(model, path, autofuse=False)
    omrt.set_num_threads(1)
    sess = omrt.load(path, trust_kernels=True).session()
    by_node = sess.profile(_feeds(), repeat=2, by="node")
    assert set(by_node) == {"first", "second", "Transpose_2"} and all(v > 0 for v in by_node.values())
    assert set(sess.profile(_feeds(), repeat=2)) == {"PackedConv", "Transpose"}
    assert list(by_node) == sorted(by_node, key=lambda k: -by_node[k])
    prof = sess.profile_threads(_feeds(), repeat=2, by="node")
    assert set(prof.ops) == set(by_node) and prof.run.seconds >= sum(op.seconds for op in prof.ops.values())
    with pytest.raises(ValueError, match="profile by='task': use one of 'op', 'node'"):
        sess.profile(_feeds(), by="task")


def test_cli_profile_by_node_prints_a_line_per_node(conv_om):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli(["run", conv_om, "--trust-kernels", "--profile", "--profile-by", "node", "--repeat", "2"]) == 0
    text = out.getvalue()
    assert "time per node (mean of 2 runs" in text
    assert re.search(r"\n  Conv_0 +[0-9.]+ ms +[0-9.]+%", text) and re.search(r"\n  Transpose_1 +[0-9.]+ ms", text)


def test_idle_is_the_other_threads_unused_share():
    assert OpThreads(2.0, (2.0, 0.5)).idle == pytest.approx(0.75)
    assert OpThreads(1.0, (1.0, 1.0, 0.0)).idle == pytest.approx(0.5)
    assert OpThreads(1.0, (1.0,)).idle is None and OpThreads(0.0, (0.0, 0.0)).idle is None


def test_cli_profile_prints_each_threads_busy_time_and_the_idle_share(conv_om):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli(["run", conv_om, "--trust-kernels", "--profile", "--threads", "2", "--repeat", "2"]) == 0
    text = out.getvalue()
    assert all(column in text for column in ("ms/run", "share", "busy t0", "busy t1", "idle t1+"))
    assert re.search(r"\n  Transpose +[0-9.]+ ms +[0-9.]+% +0\.000 +0\.000 +100\.0%", text)
    assert "whole run:" in text and "idle" in text.split("whole run:")[1]
    assert "leaves threads t1+ idle" in text
    assert re.search(r"\ncores: a cache line from t0 to t1 and back took ([0-9]+|-) / ([0-9]+|-) ns before and after", text)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores")
def test_two_threads_time_how_far_apart_their_cores_are(conv_om):
    _, sess = _native_session(conv_om)
    before, after = sess.profile_threads(_feeds(), repeat=2).round_trip_ns
    # between runs the pool is free, so the worker answers both times
    assert before is not None and after is not None and before > 0 and after > 0
    omrt.set_num_threads(1)
    assert sess.profile_threads(_feeds(), repeat=1).round_trip_ns is None


def test_a_worker_made_for_a_job_takes_part_in_it(conv_om):
    """The first split call of a process makes the pool's worker, which must join that call, not
    only the next one: a fresh process's first round trip is answered."""
    code = ("import sys, omrt; m = omrt.load(sys.argv[1], trust_kernels=True); "
            "print('no native library' if m.native is None else m.native.round_trip_ns())")
    out = subprocess.run([sys.executable, "-c", code, conv_om], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    if out.stdout.strip() == "no native library":
        pytest.skip("no native library for this host")
    assert float(out.stdout) > 0


def _workers() -> list[int]:
    """The thread ids of omrt's native workers in this process (named omrt-worker)."""
    tids = []
    for tid in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError), open(f"/proc/self/task/{tid}/comm") as f:
            if f.read().strip() == "omrt-worker":
                tids.append(int(tid))
    return tids


@pytest.mark.skipif(not sys.platform.startswith("linux") or len(os.sched_getaffinity(0)) < 2,
                    reason="needs Linux and two cores")
def test_a_worker_on_its_callers_core_moves_off_it(conv_om):
    _, sess = _native_session(conv_om)
    feeds = _feeds()
    want = sess.run(feeds)["y"].copy()
    workers = _workers()
    assert workers, "the native pool's threads are named omrt-worker"
    allowed = os.sched_getaffinity(0)
    core = min(allowed)
    try:
        os.sched_setaffinity(0, {core})
        for tid in workers:
            os.sched_setaffinity(tid, {core})
        for _ in range(TRIES):
            np.testing.assert_array_equal(sess.run(feeds)["y"], want)
            moved = [tid for tid in workers if core not in os.sched_getaffinity(tid)]
            if moved:
                break
        assert moved, "a worker woken on its caller's core stays there"
        assert all(os.sched_getaffinity(tid) == allowed - {core} for tid in moved)
    finally:
        for tid in [0, *workers]:  # the other libraries' workers were pinned too, and never woke
            with contextlib.suppress(OSError):
                os.sched_setaffinity(tid, allowed)


def test_a_row_times_a_big_matrix_splits_though_its_flops_are_few(tmp_path):
    """1x1024 @ 1024x1000: 2.05 million flops, under parallel.NATIVE_SPLIT_FLOPS, but 4 MB of
    matrix to read (linalg.SPLIT_OPERAND_BYTES): thread 1 takes a part."""
    w = numpy_helper.from_array(RNG.standard_normal((1024, 1000)).astype(np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1024])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1000])], [w])
    path = str(tmp_path / "row.om")
    omrt.compile(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    _, sess = _native_session(path)
    x = RNG.standard_normal((1, 1024)).astype(np.float32)
    for _ in range(TRIES):
        (product,) = sess.profile_threads({"x": x}, repeat=3).ops.values()  # the model's one node
        if product.busy[1] > 0:
            break
    assert product.busy[1] > 0
    matrix = numpy_helper.to_array(w).astype(np.float64)
    bound = 1024 * np.finfo(np.float32).eps * float((np.abs(x) @ np.abs(matrix)).max())  # any summation order
    np.testing.assert_allclose(sess.run({"x": x})["y"], x @ matrix, rtol=0, atol=bound)
