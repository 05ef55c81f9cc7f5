"""Sessions: zero-copy binding, address refresh, copy accounting, errors before any work."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import omrt
from conftest import RNG, mlp_model, mlp_reference, steady_state_peak


def test_run_with_feeds_matches_reference(mlp_om):
    sess = omrt.load(mlp_om).session()
    x = RNG.standard_normal((4, 64)).astype(np.float32)
    y = sess.run({"x": x})["y"]
    np.testing.assert_allclose(y, mlp_reference(x), rtol=1e-5, atol=1e-4)
    assert sess.stats.bytes_copied == 0


def test_bound_io_is_zero_copy(mlp_om):
    sess = omrt.load(mlp_om).session(zero_copy="always")
    x = RNG.standard_normal((4, 64)).astype(np.float32)
    y = np.empty((4, 10), np.float32)
    sess.bind("x", x)
    sess.bind("y", y)
    out = sess.run()["y"]
    assert out is y
    np.testing.assert_allclose(y, mlp_reference(x), rtol=1e-5, atol=1e-4)
    # the first task reads the caller's input buffer and the last writes the caller's output buffer
    steps = sess._executor.instructions
    assert np.shares_memory(steps[0].inputs[0], x)
    assert any(np.shares_memory(o, y) for step in steps for o in step.outputs if o is not None)
    x[:] = RNG.standard_normal((4, 64))
    sess.run()
    np.testing.assert_allclose(y, mlp_reference(x), rtol=1e-5, atol=1e-4)
    assert sess.stats.bytes_copied == 0 and sess.stats.runs == 2


def test_rebinding_refreshes_only_that_tensors_uses(mlp_om):
    sess = omrt.load(mlp_om).session()
    a = RNG.standard_normal((4, 64)).astype(np.float32)
    b = RNG.standard_normal((4, 64)).astype(np.float32)
    sess.bind("x", a)
    ya = sess.run()["y"].copy()
    before = [list(step.inputs) for step in sess._executor.instructions]
    sess.bind("x", b)
    yb = sess.run()["y"]
    np.testing.assert_allclose(ya, mlp_reference(a), rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(yb, mlp_reference(b), rtol=1e-5, atol=1e-4)
    changed = [(t, i) for t, step in enumerate(sess._executor.instructions) for i, v in enumerate(step.inputs)
               if v is not before[t][i]]
    assert changed == [(t, i) for t, i in changed if sess._prep.program.places[
        sess._prep.program.tasks[t].inputs[i]].key == "x"]
    assert len(changed) == len(sess._executor.slots["x"])


def test_fresh_outputs_are_owned_by_the_caller(mlp_om):
    sess = omrt.load(mlp_om).session()
    x = RNG.standard_normal((4, 64)).astype(np.float32)
    y1 = sess.run({"x": x})["y"]
    y2 = sess.run({"x": x * 2})["y"]
    assert not np.shares_memory(y1, y2)
    np.testing.assert_allclose(y1, mlp_reference(x), rtol=1e-5, atol=1e-4)


def test_misfit_buffers_are_copied_and_counted_in_auto_mode(mlp_om):
    sess = omrt.load(mlp_om).session()
    x = np.asfortranarray(RNG.standard_normal((4, 64)).astype(np.float32))
    ybig = np.empty((4, 20), np.float32)
    y = ybig[:, ::2]
    sess.bind("y", y)
    sess.run({"x": x})
    np.testing.assert_allclose(y, mlp_reference(x), rtol=1e-5, atol=1e-4)
    assert sess.stats.bytes_copied == x.nbytes + y.nbytes
    assert sess.stats.copies == {"input x: it is not C-contiguous": 1, "output y: it is not C-contiguous": 1}


def test_always_mode_refuses_misfits_before_running(mlp_om):
    sess = omrt.load(mlp_om).session(zero_copy="always")
    with pytest.raises(omrt.BindError, match=r"tensor 'x' cannot be used without a copy: it is not C-contiguous"):
        sess.run({"x": np.asfortranarray(np.zeros((4, 64), np.float32))})
    with pytest.raises(omrt.BindError, match=r"tensor 'y' cannot be used without a copy: it is not C-contiguous"):
        sess.bind("y", np.empty((10, 4), np.float32).T)
    assert sess.stats.runs == 0


def test_overlapping_output_buffers_are_refused(tmp_path):
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Neg", ["x"], ["b"])]
    g = helper.make_graph(nodes, "two", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8])],
                          [helper.make_tensor_value_info("a", TensorProto.FLOAT, [8]),
                           helper.make_tensor_value_info("b", TensorProto.FLOAT, [8])])
    path = str(tmp_path / "two.om")
    omrt.compile(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    sess = omrt.load(path).session(zero_copy="always")
    buf = np.empty(12, np.float32)
    sess.bind("a", buf[:8])
    with pytest.raises(omrt.BindError, match=r"tensor 'b' cannot be used without a copy: it overlaps the "
                                             r"buffer bound to 'a'"):
        sess.bind("b", buf[4:12])
    auto = omrt.load(path).session()
    auto.bind("a", buf[:8])
    auto.bind("b", buf[4:12])
    x = np.arange(-4, 4, dtype=np.float32)
    auto.run({"x": x})
    np.testing.assert_array_equal(buf[4:12], -x)
    assert auto.stats.copies == {"output a: it overlaps the buffer bound to 'b'": 1,
                                 "output b: it overlaps the buffer bound to 'a'": 1}


@pytest.mark.parametrize("feeds, error, message", [
    ({"nope": np.zeros((4, 64), np.float32)}, omrt.InputError, r"'nope' is not an input of the model; the inputs are \['x'\]"),
    ({}, omrt.InputError, r"input 'x' is missing: pass it in feeds or bind it \(dtype float32, shape \(4, 64\)\)"),
    ({"x": np.zeros((4, 64), np.float64)}, omrt.InputError, r"tensor 'x' has dtype float64, the model needs float32; convert it with .astype\(np.float32\)"),
    ({"x": np.zeros((5, 64), np.float32)}, omrt.InputError, r"input 'x' has shape \(5, 64\), the model expects \(4, 64\)"),
    ({"x": [1, 2]}, omrt.InputError, r"tensor 'x': expected a numpy array or a DLPack tensor, got list"),
])
def test_bad_feeds_raise_before_any_work(mlp_om, feeds, error, message):
    sess = omrt.load(mlp_om).session()
    with pytest.raises(error, match=message):
        sess.run(feeds)
    assert sess.stats.runs == 0


@pytest.mark.parametrize("array, message", [
    (np.empty((4, 5), np.float32), r"output 'y': the bound buffer has shape \(4, 5\), the result has shape \(4, 10\)"),
    (np.broadcast_to(np.empty(10, np.float32), (4, 10)), r"output 'y': the bound buffer is read-only"),
])
def test_bad_output_buffers_are_refused(mlp_om, array, message):
    sess = omrt.load(mlp_om).session()
    with pytest.raises(omrt.BindError, match=message):
        sess.bind("y", array)


def test_bind_unknown_name_and_unbind(mlp_om):
    sess = omrt.load(mlp_om).session()
    with pytest.raises(omrt.InputError, match=r"'q' is not an input or output of the model"):
        sess.bind("q", np.zeros(1))
    with pytest.raises(omrt.InputError, match=r"nothing is bound to 'x'"):
        sess.unbind("x")
    with pytest.raises(omrt.InputError, match=r"zero_copy='sometimes': choose one of"):
        omrt.load(mlp_om).session(zero_copy="sometimes")


def test_steady_state_run_allocates_no_tensor_memory(tmp_path):
    """Bound I/O, second run on: numpy allocates nothing tensor-sized (tensors here are 1 MiB)."""
    path = str(tmp_path / "big.om")
    omrt.compile(mlp_model(2048), path)
    sess = omrt.load(path).session(zero_copy="always")
    x = RNG.standard_normal((2048, 64)).astype(np.float32)
    y = np.empty((2048, 10), np.float32)
    sess.bind("x", x)
    sess.bind("y", y)
    sess.run()
    peak = steady_state_peak(sess)
    assert peak < 64 * 1024, f"a steady-state run allocated {peak} bytes"
    np.testing.assert_allclose(y, mlp_reference(x), rtol=1e-4, atol=1e-3)


def test_sessions_share_weights(mlp_om):
    model = omrt.load(mlp_om)
    s1, s2 = model.session(), model.session()
    w1 = [a for step in s1._executor.instructions for a in step.inputs
          if a is not None and a.flags.writeable is False]
    w2 = [a for step in s2._executor.instructions for a in step.inputs
          if a is not None and a.flags.writeable is False]
    assert w1 and all(np.shares_memory(a, b) for a, b in zip(w1, w2))
    assert not np.shares_memory(s1._arena, s2._arena)


def test_dynamic_batch_plans_are_cached_per_signature(dynamic_om):
    model = omrt.load(dynamic_om)
    assert model.default is None
    sess = model.session()
    for n in (1, 3, 3, 7):
        x = RNG.standard_normal((n, 64)).astype(np.float32)
        np.testing.assert_allclose(sess.run({"x": x})["y"], mlp_reference(x), rtol=1e-5, atol=1e-4)
    assert len(model._prepared) == 3
    with pytest.raises(omrt.InputError, match=r"input 'x' has shape \(3, 65\), the model expects \('N', 64\)"):
        sess.run({"x": np.zeros((3, 65), np.float32)})


def test_prepare_switches_plans_so_outputs_of_a_new_signature_bind_before_the_run(dynamic_om):
    sess = omrt.load(dynamic_om).session(zero_copy="always")
    sess.run({"x": np.ones((2, 64), np.float32)})
    x, y = RNG.standard_normal((3, 64)).astype(np.float32), np.empty((3, 10), np.float32)
    with pytest.raises(omrt.BindError, match=r"output 'y': the bound buffer has shape \(3, 10\), the result has "
                                             r"shape \(2, 10\)"):
        sess.bind("y", y)
    sess.prepare({"x": x.shape})
    sess.bind("x", x)
    sess.bind("y", y)
    sess.run()
    np.testing.assert_allclose(y, mlp_reference(x), rtol=1e-5, atol=1e-4 * np.abs(y).max())
    assert sess.stats.bytes_copied == 0


def test_profile_times_every_op_type_and_restores_the_plain_loop(mlp_om):
    sess = omrt.load(mlp_om).session()
    plain = list(sess._executor.instructions)
    x = RNG.standard_normal((4, 64)).astype(np.float32)
    per_op = sess.profile({"x": x}, repeat=3)
    # the products (the Reshapes are views, not run): PackedMatMuls where the compiler built C kernels
    ops = {n.op_type for n in sess.model.graph.nodes} & {"FusedMatMul", "MatMul", "PackedMatMul"}
    assert ops and set(per_op) == ops and all(v > 0 for v in per_op.values())
    assert sess._executor.instructions == plain and sess.stats.runs == 3
