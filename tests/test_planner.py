"""The planner and its verifier: invariants on random lifetimes, and plans of real graphs."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from onnx import TensorProto, helper, numpy_helper

import omrt
from omrt.memory import ALIGN
from omrt.plan import INPUT, OUTPUT, PlanError, verify
from omrt.plan.arena import Block, lower_bound, naive_size, overlaps, picture, place

blocks_strategy = st.lists(
    st.tuples(st.integers(1, 5000), st.integers(0, 30), st.integers(0, 10)), min_size=1, max_size=40)


@settings(max_examples=200, deadline=None)
@given(blocks_strategy)
def test_placement_never_overlaps_and_respects_bounds(spec):
    blocks = [Block(f"b{i}", size, first, first + span) for i, (size, first, span) in enumerate(spec)]
    arena = place(blocks)
    assert not overlaps(blocks)
    assert all(b.offset % ALIGN == 0 and b.size % ALIGN == 0 for b in blocks)
    assert all(0 <= b.offset and b.offset + b.size <= arena for b in blocks)
    assert lower_bound(blocks) <= arena <= naive_size(blocks)


def test_disjoint_lifetimes_share_memory():
    blocks = [Block("a", 1000, 0, 1), Block("b", 1000, 2, 3), Block("c", 500, 1, 2)]
    arena = place(blocks)
    assert arena == lower_bound(blocks) == 1024 + 512
    assert blocks[0].offset == blocks[1].offset
    assert "A" in picture(blocks, arena, 4)


def _graph(nodes, inputs, outputs, inits=()):
    g = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _vi(name, shape=(2, 3)):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape))


def test_copy_only_outputs_carry_their_reason(tmp_path):
    c = numpy_helper.from_array(np.ones((2, 3), np.float32), "c")
    m = _graph([helper.make_node("Identity", ["x"], ["same"]),
                helper.make_node("Relu", ["x"], ["r"]),
                helper.make_node("Reshape", ["r", "shape"], ["r2"]),
                helper.make_node("Identity", ["c"], ["const"])],
               [_vi("x")], [_vi("same"), _vi("r"), _vi("r2"), _vi("const")],
               [c, numpy_helper.from_array(np.array([2, 3], np.int64), "shape")])
    path = str(tmp_path / "c.om")
    omrt.compile(m, path)
    model = omrt.load(path)
    p = model.default.program
    assert p.copy_only == {"same": "it is a view of graph input 'x'",
                           "r2": "it shares memory with output 'r'",
                           "const": "it is a constant folded at compile time"}
    sess = model.session()
    x = np.arange(-3, 3, dtype=np.float32).reshape(2, 3)
    out = sess.run({"x": x})
    np.testing.assert_array_equal(out["same"], x)
    assert not np.shares_memory(out["same"], x)
    np.testing.assert_array_equal(out["r2"], np.maximum(x, 0))
    np.testing.assert_array_equal(out["const"], 1)
    assert sess.stats.bytes_copied == 3 * x.nbytes
    strict = model.session(zero_copy="always")
    with pytest.raises(omrt.BindError, match=r"tensor 'same' cannot be used without a copy: the output must "
                                             r"be copied: it is a view of graph input 'x'"):
        strict.bind("same", np.empty((2, 3), np.float32))
    with pytest.raises(omrt.BindError, match=r"output 'same' cannot be returned without a copy: the output "
                                             r"must be copied: it is a view of graph input 'x' \(zero_copy='always'\)"):
        strict.run({"x": x})
    assert strict.stats.runs == 0 and strict.stats.bytes_copied == 0


def test_outputs_are_planned_into_the_callers_buffer_and_inputs_never_written(tmp_path):
    m = _graph([helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Neg", ["a"], ["b"]),
                helper.make_node("Abs", ["b"], ["y"])], [_vi("x")], [_vi("y")])
    path = str(tmp_path / "chain.om")
    omrt.compile(m, path, autofuse=False)  # the chain's own values, planned in place
    model = omrt.load(path)
    p = model.default.program
    assert p.places["y"].region == OUTPUT and p.places["x"].region == INPUT
    # the in-place chain a -> b -> y runs in the output buffer; x is read-only for the plan
    assert {p.places[v].region for v in ("a", "b")} == {OUTPUT}
    verify(p, model.default.graph)
    x = np.arange(-3, 3, dtype=np.float32).reshape(2, 3)
    x.flags.writeable = False
    y = np.empty((2, 3), np.float32)
    sess = model.session(zero_copy="always")
    sess.bind("x", x)
    sess.bind("y", y)
    sess.run()
    np.testing.assert_array_equal(y, np.maximum(x, 0))


def test_verifier_catches_broken_plans(tmp_path):
    m = _graph([helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Exp", ["x"], ["b"]),
                helper.make_node("Add", ["a", "b"], ["s"]), helper.make_node("Transpose", ["s"], ["y"])],
               [_vi("x")], [_vi("y", (3, 2))])
    path = str(tmp_path / "v.om")
    omrt.compile(m, path, autofuse=False)  # a and b stay values of their own
    prep = omrt.load(path).default
    p, g = prep.program, prep.graph
    verify(p, g)
    a, b = (next(bl for bl in p.blocks if bl.label == v) for v in ("a", "b"))
    b.offset = a.offset
    with pytest.raises(PlanError, match=r"blocks '.' and '.' are live at once and share bytes"):
        verify(p, g)
    b.offset = p.arena_size
    with pytest.raises(PlanError, match=r"lies outside the arena"):
        verify(p, g)
    b.offset = 8
    with pytest.raises(PlanError, match=r"is not 64-byte aligned"):
        verify(p, g)
    b.offset = a.offset + a.size  # mend it; now move a value off its block's aligned offsets
    verify(p, g)
    start = p.places["a"].offset
    for moved, why in ((start + 4, "at 4 bytes into it"), (start + a.size, "past its end")):
        p.places["a"].offset = moved
        with pytest.raises(PlanError, match=rf"'a' \(24 bytes at {moved}\) does not fit its block 'a'"):
            verify(p, g)
    p.places["a"].offset = start  # and push the last value past the end of its output block
    verify(p, g)
    p.places["y"].offset += 4
    with pytest.raises(PlanError, match=r"'y' \(24 bytes at 4\) lies outside the I/O block of 'y' \(24 bytes\)"):
        verify(p, g)


def test_string_tensors_between_nodes_live_outside_the_arena(tmp_path):
    nodes = [helper.make_node("StringConcat", ["a", "b"], ["c"]),
             helper.make_node("RegexFullMatch", ["c"], ["y"], pattern="x.*")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, TensorProto.STRING, [2]) for n in "ab"],
                          [helper.make_tensor_value_info("y", TensorProto.BOOL, [2])])
    path = str(tmp_path / "s.om")
    omrt.compile(helper.make_model(g, opset_imports=[helper.make_opsetid("", 20)]), path)
    model = omrt.load(path)
    assert model.default.program.places["c"].region == "dynamic"
    out = model.session().run({"a": np.array(["xa", "b"], dtype=object), "b": np.array(["1", "2"], dtype=object)})
    np.testing.assert_array_equal(out["y"], [True, False])


def _concat_model(concat_is_output: bool):
    """x -> three branches (3x3 conv + Relu, 1x1 conv, max pool) joined by a Concat; the 1x1
    conv's output is also read after the Concat. The Concat is the graph output, or feeds a
    1x1 conv that is."""
    rng = np.random.default_rng(0)
    w3, w1, wo = (numpy_helper.from_array(rng.standard_normal(s).astype(np.float32) / 4, n)
                  for n, s in (("w3", (16, 16, 3, 3)), ("w1", (32, 16, 1, 1)), ("wo", (8, 64, 1, 1))))
    nodes = [helper.make_node("Conv", ["x", "w3"], ["a0"], pads=[1] * 4),
             helper.make_node("Relu", ["a0"], ["a"]),
             helper.make_node("Conv", ["x", "w1"], ["b"]),
             helper.make_node("MaxPool", ["x"], ["c"], kernel_shape=[3, 3], pads=[1] * 4),
             helper.make_node("Concat", ["a", "b", "c"], ["y"], axis=1),
             helper.make_node("ReduceSum", ["b"], ["later"], keepdims=0)]
    outputs = [_vi("later", ())]
    if concat_is_output:
        outputs.append(_vi("y", (1, 64, 6, 6)))
    else:
        nodes.append(helper.make_node("Conv", ["y", "wo"], ["z"]))
        outputs.append(_vi("z", (1, 8, 6, 6)))
    return _graph(nodes, [_vi("x", (1, 16, 6, 6))], outputs, [w3, w1, wo])


@pytest.mark.parametrize("concat_is_output", [False, True])
def test_a_concats_inputs_are_planned_inside_its_output(tmp_path, concat_is_output):
    """Inputs that die at a Concat are written by their producers straight into their slices of
    its output (the caller's output memory when it is a graph output), so the Concat copies only
    the input still read after it; the plan verifies and the values match the reference."""
    from onnx.reference import ReferenceEvaluator

    model = _concat_model(concat_is_output)
    path = str(tmp_path / "c.om")
    omrt.compile(model, path)
    loaded = omrt.load(path)
    p = loaded.default.program
    verify(p, loaded.default.graph)
    y = p.places["y"]
    for name, channels_before in (("a", 0), ("c", 16 + 32)):
        assert (p.places[name].region, p.places[name].key) == (y.region, y.key)
        assert p.places[name].offset == y.offset + channels_before * 36 * 4
    assert p.places["b"].key != y.key  # read after the Concat: it keeps a buffer of its own
    sess = loaded.session()
    mine = np.empty((1, 64, 6, 6), np.float32)
    if concat_is_output:
        sess.bind("y", mine)
    x = np.random.default_rng(1).standard_normal((1, 16, 6, 6)).astype(np.float32)
    out = sess.run({"x": x})
    want = dict(zip([o.name for o in model.graph.output], ReferenceEvaluator(model).run(None, {"x": x})))
    for name, value in want.items():
        np.testing.assert_allclose(out[name], value, rtol=1e-4, atol=1e-4 * max(1.0, float(np.abs(value).max())))
    concat = next(step for step in sess._executor.instructions if step.node.op_type == "Concat")
    a, b, c = concat.inputs
    assert all(np.shares_memory(v, concat.outputs[0]) for v in (a, c)) and not np.shares_memory(b, concat.outputs[0])
    assert np.shares_memory(concat.outputs[0], mine) == concat_is_output
    calls = concat.kernel.bind(concat.inputs, concat.outputs, None)
    assert calls is None or len(calls) == 1  # natively: one copy, of b
    assert sess.stats.bytes_copied == 0


def test_a_concat_inside_a_concat_places_its_inputs_at_their_offsets_in_the_outer_one(tmp_path):
    """y = Concat(p, Concat(q, r)): q and r are planned inside the inner Concat's output, which is
    planned inside y, so their offsets add up; the plan verifies and the values match."""
    from onnx.reference import ReferenceEvaluator

    rng = np.random.default_rng(2)
    ws = [numpy_helper.from_array(rng.standard_normal((16, 8, 1, 1)).astype(np.float32), f"w{i}") for i in range(3)]
    wo = numpy_helper.from_array(rng.standard_normal((4, 48, 1, 1)).astype(np.float32) / 8, "wo")
    nodes = [helper.make_node("Conv", ["x", f"w{i}"], [v]) for i, v in enumerate("pqr")]
    nodes += [helper.make_node("Concat", ["q", "r"], ["inner"], axis=1),
              helper.make_node("Concat", ["p", "inner"], ["y"], axis=1),
              helper.make_node("Conv", ["y", "wo"], ["z"])]
    model = _graph(nodes, [_vi("x", (1, 8, 5, 5))], [_vi("z", (1, 4, 5, 5))], [*ws, wo])
    path = str(tmp_path / "nested.om")
    omrt.compile(model, path)
    loaded = omrt.load(path)
    p = loaded.default.program
    verify(p, loaded.default.graph)
    slice_bytes = 16 * 25 * 4
    y = p.places["y"]
    for name, slices_before in (("p", 0), ("inner", 1), ("q", 1), ("r", 2)):
        assert (p.places[name].region, p.places[name].key) == (y.region, y.key)
        assert p.places[name].offset == y.offset + slices_before * slice_bytes
    x = rng.standard_normal((1, 8, 5, 5)).astype(np.float32)
    want = ReferenceEvaluator(model).run(None, {"x": x})[0]
    got = loaded.session().run({"x": x})["z"]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * max(1.0, float(np.abs(want).max())))
