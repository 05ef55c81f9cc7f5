"""omrt's own threads: the worker pool, BLAS pinning, and kernels giving the same results on 1 and 2 threads."""

from __future__ import annotations

import threading

import numpy as np
import onnx
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import omrt
from omrt.kernels import OpContext, TensorInfo, lookup, parallel, window
from omrt.native.blas import OpenBlas, blas_threads

from conftest import steady_state_peak
from kernel_check import reference, run_kernel


@pytest.fixture
def split_everything(monkeypatch):
    """Two threads, and every product split however small, so that small shapes take the threaded paths."""
    monkeypatch.setattr(parallel, "MIN_FLOPS", 0)
    yield
    parallel.set_num_threads(1)


def on_threads(n: int, fn):
    parallel.set_num_threads(n)
    try:
        return fn()
    finally:
        parallel.set_num_threads(1)


# ----------------------------------------------------------------------------- the pool

def test_parallel_for_runs_every_item_once_on_at_most_slots_threads():
    seen, slots, lock = [], set(), threading.Lock()

    def item(i: int, slot: int) -> None:
        with lock:
            seen.append(i)
            slots.add(slot)

    parallel.set_num_threads(3)
    try:
        parallel.parallel_for(100, item)
        assert sorted(seen) == list(range(100)) and slots <= {0, 1, 2}
        seen.clear(), slots.clear()
        parallel.parallel_for(50, item, slots=2)
        assert sorted(seen) == list(range(50)) and slots <= {0, 1}
    finally:
        parallel.set_num_threads(1)
    assert parallel.get_num_threads() == 1


def test_parallel_for_raises_an_items_error_after_all_items_ran():
    done = []

    def item(i: int, slot: int) -> None:
        if i == 3:
            raise KeyError("item three")
        done.append(i)

    with pytest.raises(KeyError, match="item three"):
        on_threads(2, lambda: parallel.parallel_for(8, item))
    assert sorted(done) == [0, 1, 2, 4, 5, 6, 7]


def test_nested_parallel_for_runs_sequentially_inside_a_worker():
    out = np.zeros((4, 4))

    def inner(row: int):
        def cell(j: int, slot: int) -> None:
            out[row, j] = row * 4 + j
        return cell

    on_threads(2, lambda: parallel.parallel_for(4, lambda i, slot: parallel.parallel_for(4, inner(i))))
    np.testing.assert_array_equal(out, np.arange(16).reshape(4, 4))


def test_spans():
    assert parallel.spans(10, 3) == [(0, 3), (3, 6), (6, 10)]
    assert parallel.spans(2, 4) == [(0, 1), (1, 2)]


def test_thread_count_must_be_positive():
    with pytest.raises(ValueError, match="at least 1"):
        omrt.set_num_threads(0)


def test_blas_is_pinned_to_one_thread_and_given_back():
    omrt.set_num_threads(1)
    before = blas_threads()
    if before is None:
        pytest.skip("numpy here does not use OpenBLAS")
    omrt.set_num_threads(2)
    try:
        assert omrt.get_num_threads() == 2
        assert blas_threads() == 1
        omrt.set_num_threads(3)
        assert blas_threads() == 1
    finally:
        omrt.set_num_threads(1)
    assert blas_threads() == before


def test_without_openblas_threads_still_work_with_a_warning(monkeypatch):
    omrt.set_num_threads(1)
    blas = OpenBlas.__new__(OpenBlas)
    blas.set = blas.get = None
    monkeypatch.setattr(parallel, "openblas", lambda: blas)
    with pytest.warns(RuntimeWarning, match="no OpenBLAS library"):
        omrt.set_num_threads(2)
    try:
        a = np.arange(12.0).reshape(3, 4)
        out = np.empty((3, 3))
        parallel.matmul(a, a.T, out)
        np.testing.assert_allclose(out, a @ a.T)
    finally:
        omrt.set_num_threads(1)


# ----------------------------------------------------------------------------- kernels, 1 vs 2 threads

RNG = np.random.default_rng(7)


def same_on_two_threads(op: str, inputs, attrs, rtol=1e-5, atol=1e-5):
    one = on_threads(1, lambda: run_kernel(op, inputs, attrs))[0]
    two = on_threads(2, lambda: run_kernel(op, inputs, attrs))[0]
    np.testing.assert_allclose(two, one, rtol=rtol, atol=atol)
    return two


def conv_kernel(x_shape, w_shape, attrs):
    ctx = OpContext(dict(attrs), 21, name="c", op_type="Conv")
    infos = [TensorInfo(np.dtype(np.float32), x_shape), TensorInfo(np.dtype(np.float32), w_shape)]
    cls = lookup("Conv", 21)
    return cls(ctx, infos, cls.infer(ctx, infos))


def test_conv_threads_get_their_own_buffers_or_split_the_filters(split_everything, monkeypatch):
    monkeypatch.setattr(window, "WORKSPACE_CAP", 8192)
    wide = conv_kernel((1, 4, 20, 20), (8, 4, 3, 3), {"pads": [1, 1, 1, 1]})
    step, buffer = wide._layout(2)
    assert buffer > 0 and wide.workspace() >= 2 * buffer
    assert len(wide._split(2).chunks) % 2 == 0
    deep = conv_kernel((1, 4, 6, 6), (64, 4, 3, 3), {})
    assert deep._layout(2)[1] == 0 and len(deep._split(2).cuts) == 2
    assert deep.workspace() == deep._layout(1)[1]


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 2), group=st.sampled_from([1, 2, 3]), cpg=st.integers(1, 4), mpg=st.integers(1, 24),
       size=st.integers(3, 14), k=st.integers(1, 5), stride=st.integers(1, 3), pad=st.integers(0, 2),
       dilation=st.integers(1, 2), bias=st.booleans(), relu=st.booleans(), cap=st.sampled_from([512, 4096, 1 << 20]))
def test_conv_same_on_one_and_two_threads(n, group, cpg, mpg, size, k, stride, pad, dilation, bias, relu, cap):
    assume((k - 1) * dilation + 1 <= size + 2 * pad)
    saved = parallel.MIN_FLOPS, window.WORKSPACE_CAP
    parallel.MIN_FLOPS, window.WORKSPACE_CAP = 0, cap
    try:
        x = RNG.standard_normal((n, group * cpg, size, size + 1)).astype(np.float32)
        w = RNG.standard_normal((group * mpg, cpg, k, k)).astype(np.float32)
        inputs = [x, w] + ([RNG.standard_normal(group * mpg).astype(np.float32)] if bias else [])
        attrs = {"group": group, "strides": [stride, stride], "pads": [pad] * 4, "dilations": [dilation] * 2}
        if relu:
            attrs["_act"] = "Relu"
        got = same_on_two_threads("Conv", inputs, attrs)
        if not relu:
            np.testing.assert_allclose(got, reference("Conv", inputs, attrs)[0], rtol=1e-4, atol=1e-4)
    finally:
        parallel.MIN_FLOPS, window.WORKSPACE_CAP = saved


@pytest.mark.parametrize("x_shape, w_shape, attrs", [
    ((2, 3, 40), (8, 3, 17), {"strides": [3], "pads": [4, 2]}),
    ((1, 2, 9, 10, 11), (4, 2, 3, 3, 2), {"strides": [2, 1, 2], "pads": [1, 0, 1, 1, 1, 0], "dilations": [1, 2, 1]}),
    ((1, 3, 31, 29), (16, 3, 7, 7), {"strides": [2, 2], "pads": [3, 3, 3, 3]}),
    ((1, 3, 30, 30), (8, 3, 11, 11), {"strides": [4, 4]}),
])
def test_conv_strided_gather_matches_the_reference(split_everything, x_shape, w_shape, attrs):
    conv_layer = conv_kernel(x_shape, w_shape, attrs)
    assert conv_layer.padded is not None
    x = RNG.standard_normal(x_shape).astype(np.float32)
    w = RNG.standard_normal(w_shape).astype(np.float32)
    got = same_on_two_threads("Conv", [x, w], attrs)
    np.testing.assert_allclose(got, reference("Conv", [x, w], attrs)[0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("x_shape, w_shape, group", [
    ((1, 8, 9, 9), (16, 8, 1, 1), 1),      # pointwise, positions split
    ((1, 8, 3, 3), (64, 8, 1, 1), 1),      # pointwise, filters split
    ((2, 8, 5, 5), (12, 2, 1, 1), 4),      # pointwise, groups split, two images
    ((1, 12, 10, 10), (12, 1, 3, 3), 12),  # depthwise
    ((1, 6, 7, 7), (32, 6, 3, 3), 1),      # filters split over a shared buffer
])
def test_conv_paths_same_on_one_and_two_threads(split_everything, x_shape, w_shape, group):
    x = RNG.standard_normal(x_shape).astype(np.float32)
    w = RNG.standard_normal(w_shape).astype(np.float32)
    b = RNG.standard_normal(w_shape[0]).astype(np.float32)
    attrs = {"group": group, "pads": [w_shape[2] // 2] * 4}
    got = same_on_two_threads("Conv", [x, w, b], attrs)
    np.testing.assert_allclose(got, reference("Conv", [x, w, b], attrs)[0], rtol=1e-4, atol=1e-4)


@settings(max_examples=40, deadline=None)
@given(batch=st.lists(st.integers(1, 3), max_size=2), m=st.integers(1, 9), k=st.integers(1, 9),
       n=st.integers(1, 9), a_vec=st.booleans(), b_vec=st.booleans(), b_batched=st.booleans())
def test_matmul_same_on_one_and_two_threads(batch, m, k, n, a_vec, b_vec, b_batched):
    saved = parallel.MIN_FLOPS
    parallel.MIN_FLOPS = 0
    try:
        a = RNG.standard_normal((k,) if a_vec else (*batch, m, k)).astype(np.float32)
        b = RNG.standard_normal((k,) if b_vec else ((*batch, k, n) if b_batched else (k, n))).astype(np.float32)
        got = same_on_two_threads("MatMul", [a, b], {})
        np.testing.assert_allclose(got, np.matmul(a, b), rtol=1e-5, atol=1e-5)
    finally:
        parallel.MIN_FLOPS = saved


@settings(max_examples=30, deadline=None)
@given(m=st.integers(1, 12), k=st.integers(1, 12), n=st.integers(1, 12), trans_a=st.booleans(),
       trans_b=st.booleans(), alpha=st.sampled_from([1.0, 0.5]), beta=st.sampled_from([1.0, 2.0]),
       c_shape=st.sampled_from(["none", "row", "full"]))
def test_gemm_same_on_one_and_two_threads(m, k, n, trans_a, trans_b, alpha, beta, c_shape):
    saved = parallel.MIN_FLOPS
    parallel.MIN_FLOPS = 0
    try:
        a = RNG.standard_normal((k, m) if trans_a else (m, k)).astype(np.float32)
        b = RNG.standard_normal((n, k) if trans_b else (k, n)).astype(np.float32)
        inputs = [a, b]
        if c_shape != "none":
            inputs.append(RNG.standard_normal((n,) if c_shape == "row" else (m, n)).astype(np.float32))
        attrs = {"transA": int(trans_a), "transB": int(trans_b), "alpha": alpha, "beta": beta}
        got = same_on_two_threads("Gemm", inputs, attrs)
        np.testing.assert_allclose(got, reference("Gemm", inputs, attrs)[0], rtol=1e-4, atol=1e-4)
    finally:
        parallel.MIN_FLOPS = saved


@pytest.mark.parametrize("op, shape, attrs", [
    ("MaxPool", (2, 6, 17, 17), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ("AveragePool", (1, 9, 12, 12), {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}),
    ("AveragePool", (1, 5, 9, 9), {"kernel_shape": [2, 2], "strides": [2, 2], "ceil_mode": 1}),
    ("LpPool", (1, 7, 8, 8), {"kernel_shape": [2, 2], "p": 3}),
])
@pytest.mark.parametrize("cap", [256, 1 << 20])
def test_pools_same_on_one_and_two_threads(monkeypatch, op, shape, attrs, cap):
    from omrt.kernels import pool

    monkeypatch.setattr(pool, "SPLIT_BYTES", 0)
    monkeypatch.setattr(window, "WORKSPACE_CAP", cap)
    x = RNG.standard_normal(shape).astype(np.float32)
    got = same_on_two_threads(op, [x], attrs, rtol=0, atol=0)
    np.testing.assert_allclose(got, reference(op, [x], attrs)[0], rtol=1e-5, atol=1e-5)


def test_matmul_pieces_write_disjoint_views_of_the_output():
    a = np.ones((3, 5, 4), np.float32)
    b = np.ones((4, 7), np.float32)
    out = np.empty((3, 5, 7), np.float32)
    pieces = parallel.matmul_pieces(a, b, out, 2)
    assert len(pieces) == 2 and all(np.shares_memory(p[2], out) for p in pieces)
    assert sum(p[2].size for p in pieces) == out.size
    wide = parallel.matmul_pieces(a[0], np.ones((4, 70), np.float32), np.empty((5, 70), np.float32), 2)
    assert [p[2].shape for p in wide] == [(5, 35), (5, 35)]


# ----------------------------------------------------------------------------- a whole model

def conv_model() -> onnx.ModelProto:
    """x[1,16,32,32] -> Conv 3x3 (+Relu) -> Conv 1x1 -> y[1,32,32,32]."""
    rng = np.random.default_rng(3)
    w1 = rng.standard_normal((32, 16, 3, 3)).astype(np.float32) * 0.1
    w2 = rng.standard_normal((32, 32, 1, 1)).astype(np.float32) * 0.1
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]), helper.make_node("Conv", ["r", "w2"], ["y"])]
    g = helper.make_graph(nodes, "convs", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 32, 32])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 32, 32, 32])],
                          [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_steady_state_run_on_two_threads_allocates_no_tensor_memory(tmp_path, split_everything):
    path = str(tmp_path / "convs.om")
    omrt.compile(conv_model(), path)
    sess = omrt.load(path).session(zero_copy="always")
    x = np.random.default_rng(1).standard_normal((1, 16, 32, 32)).astype(np.float32)
    y = np.empty((1, 32, 32, 32), np.float32)
    sess.bind("x", x)
    sess.bind("y", y)
    sess.run()
    expected = y.copy()
    omrt.set_num_threads(2)
    sess.run()
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-5)
    peak = steady_state_peak(sess)
    assert peak < 64 * 1024, f"a steady-state run allocated {peak} bytes"


def test_cli_run_and_demo_take_a_thread_count(tmp_path):
    import subprocess
    import sys

    path = str(tmp_path / "convs.om")
    omrt.compile(conv_model(), path)
    res = subprocess.run([sys.executable, "-m", "omrt.cli", "run", path, "--repeat", "2", "--threads", "2"],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert "latency over 2 runs" in res.stdout
    res = subprocess.run([sys.executable, "-m", "omrt.cli", "run", path, "--threads", "0"],
                         capture_output=True, text=True)
    assert res.returncode != 0 and "expected a whole number >= 1" in res.stderr


STEAL_CHILD = """
import os, sys
import numpy as np
os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # before the pool: its worker shares the core
import omrt
model = omrt.load(sys.argv[1], trust_kernels=True)
if model.native is None:
    print("no native library"); sys.exit(0)
x = np.random.default_rng(1).standard_normal((1, 64, 48, 48)).astype(np.float32)
omrt.set_num_threads(2)
two = [model.session().run({"x": x})["y"] for _ in range(3)]  # fresh arenas: nothing left from another run
omrt.set_num_threads(1)
one = model.session().run({"x": x})["y"]
print(max(float(np.abs(t - one).max()) for t in two) / float(np.abs(one).max()))
"""


@pytest.mark.skipif(not hasattr(__import__("os"), "sched_setaffinity"), reason="needs sched_setaffinity")
def test_items_a_worker_does_not_reach_are_taken_by_the_caller(tmp_path):
    """On one core the worker runs only when the caller yields it the core: the caller finishes its
    own range of each call, then takes the worker's items from the back. Every item runs once."""
    import subprocess
    import sys

    rng = np.random.default_rng(4)
    nodes = [helper.make_node("Conv", ["x", "w"], ["y"], group=64, pads=[1, 1, 1, 1])]  # items: channels x bands
    g = helper.make_graph(nodes, "dw", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64, 48, 48])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64, 48, 48])],
                          [numpy_helper.from_array(rng.standard_normal((64, 1, 3, 3)).astype(np.float32), "w")])
    path = str(tmp_path / "dw.om")
    omrt.compile(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    out = subprocess.run([sys.executable, "-c", STEAL_CHILD, path], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    if out.stdout.strip() == "no native library":
        pytest.skip("no native library for this host")
    assert float(out.stdout) < 1e-5  # relative to the output's magnitude: sums in other orders only


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="needs fork")
def test_a_forked_child_gets_workers_of_its_own():
    import os

    omrt.set_num_threads(2)
    try:
        pid = os.fork()
        if pid == 0:
            seen = set()
            parallel.parallel_for(64, lambda i, slot: seen.add(i))
            os._exit(0 if seen == set(range(64)) and parallel._pool.threads[0].is_alive() else 1)
        _, status = os.waitpid(pid, 0)
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    finally:
        omrt.set_num_threads(1)
