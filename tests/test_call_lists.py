"""Call lists: a run's consecutive native calls, checked once per change of their arrays, made by
one call from Python (omrt_run_calls through each function's thunk); they must compute what the
calls one by one compute, and be checked again whenever an array or the thread count changes."""

from __future__ import annotations

import gc
import weakref

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import omrt
from omrt.errors import KernelError
from omrt.kernels import parallel
from omrt.native import bindings
from omrt.native.signature import address
from omrt.runtime.executor import Batch

RNG = np.random.default_rng(7)
W1 = (RNG.standard_normal((32, 16, 3, 3)) / 12).astype(np.float32)
B1 = RNG.standard_normal(32).astype(np.float32)
WD = (RNG.standard_normal((32, 1, 3, 3)) / 3).astype(np.float32)
W2 = (RNG.standard_normal((24, 32, 1, 1)) / 6).astype(np.float32)


def block_model() -> onnx.ModelProto:
    """Conv+Relu, MaxPool, depthwise Conv, Add, Softmax (numpy: it splits the calls in two
    runs), a 1x1 Conv: x[1, 16, 40, 40] -> y[1, 24, 20, 20]."""
    nodes = [helper.make_node("Conv", ["x", "W1", "B1"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Conv", ["p", "WD"], ["d"], pads=[1, 1, 1, 1], group=32),
             helper.make_node("Add", ["d", "p"], ["a"]),
             helper.make_node("Softmax", ["a"], ["s"], axis=1),
             helper.make_node("Conv", ["s", "W2"], ["y"])]
    g = helper.make_graph(nodes, "block", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 40, 40])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 24, 20, 20])],
                          [numpy_helper.from_array(a, n) for a, n in ((W1, "W1"), (B1, "B1"), (WD, "WD"),
                                                                       (W2, "W2"))])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture(scope="module")
def block_om(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("calls") / "block.om")
    omrt.compile(block_model(), path)
    return path


@pytest.fixture
def one_thread():
    before = parallel.get_num_threads()
    parallel.set_num_threads(1)
    yield
    parallel.set_num_threads(before)


def _session(path: str) -> omrt.Session:
    model = omrt.load(path, trust_kernels=True)
    if model.native is None:
        pytest.skip("the model's native library does not load here")
    return model.session()


def _batches(session: omrt.Session) -> list[Batch]:
    return [s for s in session._executor._steps if isinstance(s, Batch)]


def _x(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((1, 16, 40, 40)).astype(np.float32)


def _close(got: np.ndarray, want: np.ndarray) -> None:
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-5 * float(np.abs(want).max()))


def test_a_run_makes_its_native_calls_in_call_lists_and_matches_numpy(block_om, one_thread):
    session = _session(block_om)
    plain = omrt.load(block_om).session()  # kernels not trusted: every node on numpy
    x = _x()
    got, want = session.run({"x": x})["y"], plain.run({"x": x})["y"]
    _close(got, want)
    batches = _batches(session)
    assert [len(b.calls) for b in batches] == [4, 1]  # conv, pool, depthwise, add | Softmax | 1x1 conv
    before = session.model.native.calls()
    session.run({"x": x})
    after = session.model.native.calls()
    assert after[bindings.RUN_CALLS.symbol] - before.get(bindings.RUN_CALLS.symbol, 0) == 2
    made = sum(after.values()) - sum(before.values()) - 2
    assert made == sum(len(call.bound) for b in batches for call in b.calls) == 5


def test_each_batch_lists_the_thunks_and_vectors_of_its_checked_calls(block_om, one_thread):
    session = _session(block_om)
    session.run({"x": _x()})
    for batch in _batches(session):
        checked = [c for call in batch.calls for c in call.bound]
        assert batch.table.reshape(-1, 2).tolist() == [[c.bound.thunk, address(c.vector)] for c in checked]


def test_a_new_output_buffer_is_checked_again(block_om, one_thread):
    session = _session(block_om)
    first, second = np.full((1, 24, 20, 20), 7.0, np.float32), np.zeros((1, 24, 20, 20), np.float32)
    session.bind("y", first)
    session.run({"x": _x(1)})
    kept = first.copy()
    session.bind("y", second)
    result = session.run({"x": _x(2)})["y"]
    assert np.shares_memory(result, second)
    np.testing.assert_array_equal(first, kept)  # the old buffer is no longer written
    _close(second, omrt.load(block_om).session().run({"x": _x(2)})["y"])


def test_outputs_returned_fresh_each_run_are_taken_in_place(block_om, one_thread):
    """Each run returns a new output array: the call writing it is checked again, its vector
    takes the new address and the batches stay as they are."""
    session = _session(block_om)
    a = session.run({"x": _x(3)})["y"]
    kept = a.copy()
    steps, tables = session._executor._steps, [b.table.copy() for b in _batches(session)]
    b = session.run({"x": _x(4)})["y"]
    assert not np.shares_memory(a, b)
    np.testing.assert_array_equal(a, kept)
    _close(b, omrt.load(block_om).session().run({"x": _x(4)})["y"])
    assert session._executor._steps is steps
    assert [t.table.tolist() for t in _batches(session)] == [t.tolist() for t in tables]


def test_an_output_written_by_numpy_groups_nothing_again(tmp_path, one_thread):
    """A kernel that binds nothing (Softmax) writing a fresh output each run is checked again
    each run, and still binds nothing: the batches before it stay as they are."""
    w = (RNG.standard_normal((8, 16, 1, 1)) / 4).astype(np.float32)
    g = helper.make_graph([helper.make_node("Conv", ["x", "W"], ["c"]), helper.make_node("Softmax", ["c"], ["y"])],
                          "head", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 40, 40])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 40, 40])],
                          [numpy_helper.from_array(w, "W")])
    path = str(tmp_path / "head.om")
    omrt.compile(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    session = _session(path)
    session.run({"x": _x()})
    steps = session._executor._steps
    assert len(_batches(session)) == 1
    y = session.run({"x": _x(1)})["y"]
    assert session._executor._steps is steps
    _close(y, omrt.load(path).session().run({"x": _x(1)})["y"])


def test_a_new_thread_count_binds_every_call_again(block_om, one_thread):
    session = _session(block_om)
    x = _x(5)
    one = session.run({"x": x})["y"].copy()

    def threads() -> list[int]:
        return [c.args[[a.name for a in c.bound.function.args].index("threads")]
                for b in _batches(session) for call in b.calls for c in call.bound]

    assert set(threads()) == {1}
    parallel.set_num_threads(2)
    two = session.run({"x": x})["y"]
    assert 2 in threads()
    _close(two, one)


def test_unbinding_an_output_lets_go_of_its_buffer(block_om, one_thread):
    session = _session(block_om)
    buffer = np.zeros((1, 24, 20, 20), np.float32)
    session.bind("y", buffer)
    session.run({"x": _x(6)})
    gone = weakref.ref(buffer)
    session.unbind("y")
    del buffer
    gc.collect()
    assert gone() is None
    _close(session.run({"x": _x(6)})["y"], omrt.load(block_om).session().run({"x": _x(6)})["y"])


def test_profiled_runs_time_each_call_of_a_batch(block_om, one_thread):
    """A profile makes the calls of a call list one by one, each timed under its node's op type."""
    session = _session(block_om)
    session.run({"x": _x()})
    batched = {call.node.op_type for b in _batches(session) for call in b.calls}
    assert len(batched) >= 4
    lists = session.model.native.calls()[bindings.RUN_CALLS.symbol]
    profile = session.profile({"x": _x()}, repeat=2)
    assert batched <= set(profile) and all(profile[op] > 0 for op in batched)
    assert session.model.native.calls()[bindings.RUN_CALLS.symbol] == lists  # no call list ran


def concat_model(axis: int) -> onnx.ModelProto:
    """Three convs of x[2, 4, 6, 6] joined on `axis`: y's every input is a block copy in C."""
    ws = [(RNG.standard_normal((m, 4, 1, 1)) / 2).astype(np.float32) for m in ((3, 5, 2) if axis == 1 else (4, 4, 4))]
    convs = [helper.make_node("Conv", ["x", f"W{i}"], [f"c{i}"]) for i in range(3)]
    join = helper.make_node("Concat", ["c0", "c1", "c2"], ["y"], axis=axis)
    g = helper.make_graph(convs + [join], "join", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4, 6, 6])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(w, f"W{i}") for i, w in enumerate(ws)])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("axis", [0, 1, 3])
def test_a_concat_copies_its_inputs_in_the_call_list(tmp_path, axis, one_thread):
    """On axes 1 and 3 (after the batch of 2) every input is a block copy in the call list; on
    axis 0 the inputs are planned inside y, so the Concat has nothing to copy."""
    path = str(tmp_path / "join.om")
    omrt.compile(concat_model(axis), path)
    session = _session(path)
    x = np.random.default_rng(axis).standard_normal((2, 4, 6, 6)).astype(np.float32)
    got = session.run({"x": x})["y"]
    np.testing.assert_array_equal(got, omrt.load(path).session().run({"x": x})["y"])
    joined = [call for b in _batches(session) for call in b.calls if call.node.op_type == "Concat"]
    if axis == 0:
        concat = next(step for step in session._executor.instructions if step.node.op_type == "Concat")
        assert all(not call.bound for call in joined)
        assert all(np.shares_memory(v, concat.outputs[0]) for v in concat.inputs)
    else:
        assert len(joined) == 1 and {c.bound.function.symbol for c in joined[0].bound} == {"omrt_copy_blocks_f32"}


def _f32(*shape: int) -> np.ndarray:
    return np.random.default_rng(1).standard_normal(shape).astype(np.float32)


def test_a_call_list_computes_what_the_calls_compute_one_by_one(native):
    """Integers, NULL, addresses and floats (LeakyRelu's alpha) reach C the same through a thunk."""
    x, s = _f32(8, 64), _f32(8, 1)
    image, w = _f32(1, 4, 20, 20), _f32(4, 1, 3, 3)
    window = (3, 3, 1, 1, 1, 1, 1, 1)

    def calls(out_mul: np.ndarray, out_dw: np.ndarray, scratch: np.ndarray) -> list:
        mul = native.get(bindings.BINARY).bind(x, s, out_mul, 2, 8, 64, 8, 1, 1, 2, 0.25, 0.0)
        dw = native.get(bindings.DWCONV2D).bind(image, w, None, out_dw, scratch, 2864, 3, 1, 1, 1, 4, 1, 20, 20, 20,
                                                20, *window, 2, 0.125, 0.0)
        return [mul, dw]

    direct = [np.zeros((8, 64), np.float32), np.zeros((1, 4, 20, 20), np.float32), np.zeros(2864, np.float32)]
    for c in calls(*direct):
        c()
    listed = [np.zeros_like(a) for a in direct]
    checked = calls(*listed)
    table = np.array([(c.bound.thunk, address(c.vector)) for c in checked], np.int64).reshape(-1)
    native.get(bindings.RUN_CALLS)(table, len(checked))
    np.testing.assert_array_equal(listed[0], direct[0])
    np.testing.assert_array_equal(listed[1], direct[1])
    assert (direct[0] < 0).any()  # the slope was applied, not lost


@pytest.mark.parametrize("table, calls, why", [
    (np.zeros(3, np.int64), 2, r"table must hold 2 \* calls = 4 int64 values"),
    (np.zeros(4, np.float64), 2, r"table must be an int64 array"),
    (np.zeros(4, np.int64), 0, r"calls must be an integer >= 1"),
])
def test_a_misfit_call_table_is_refused(native, table, calls, why):
    with pytest.raises(KernelError, match=rf"native omrt_run_calls: {why}"):
        native.get(bindings.RUN_CALLS)(table, calls)
