"""Control flow end to end: sub-graphs in the IR and the file, captured values, If/Loop/Scan, and
sequences and optionals as model inputs and outputs."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import omrt
from omrt.format import OmFile, Part
from omrt.ir import CAPTURES, Graph
from omrt.plan import ARENA, DYNAMIC, OUTPUT

RNG = np.random.default_rng(3)


def tensor(name: str, dtype: int = T.FLOAT, shape=None) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, dtype, shape)


def build(nodes, inputs, outputs, initializers=(), opset: int = 17) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def compiled(tmp_path, model: onnx.ModelProto, autofuse: bool = True) -> omrt.Model:
    path = str(tmp_path / "m.om")
    omrt.compile(model, path, autofuse=autofuse)
    return omrt.load(path)


def reference(model: onnx.ModelProto, feeds: dict) -> list:
    return ReferenceEvaluator(model).run(None, feeds)


def if_model() -> onnx.ModelProto:
    """y = If(c) then r * w else -r, where r = Relu(x) and w an initializer: both captured."""
    then = helper.make_graph([helper.make_node("Mul", ["r", "w"], ["t"])], "then", [], [tensor("t")])
    other = helper.make_graph([helper.make_node("Neg", ["r"], ["e"])], "else", [], [tensor("e")])
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)]
    w = numpy_helper.from_array(RNG.standard_normal(6).astype(np.float32), "w")
    return build(nodes, [tensor("x", shape=[2, 6]), tensor("c", T.BOOL, [])], [tensor("y", shape=[2, 6])],
                 [w])


@pytest.mark.parametrize("cond", [True, False])
def test_if_runs_the_branch_its_condition_picks(tmp_path, cond):
    model = if_model()
    m = compiled(tmp_path, model)
    feeds = {"x": RNG.standard_normal((2, 6)).astype(np.float32), "c": np.array(cond)}
    np.testing.assert_allclose(m.session().run(feeds)["y"], reference(model, feeds)[0], rtol=1e-6)


def test_captured_values_are_node_inputs_and_branches_are_graphs(tmp_path):
    m = compiled(tmp_path, if_model())
    (node,) = [n for n in m.graph.nodes if n.op_type == "If"]
    assert node.attrs[CAPTURES] == ["r", "w"] and node.inputs == ["c", "r", "w"]
    then = node.attrs["then_branch"]
    assert isinstance(then, Graph) and then.nodes[0].op_type == "Mul"
    assert m.default is not None, "a model with static input shapes keeps its stored plan"
    assert m.default.program.places["y"].region == OUTPUT, "both branches give [2, 6]: planned"


def test_if_with_a_known_condition_becomes_its_branch(tmp_path):
    """The condition Size(x) == 12 is folded, so the If is replaced by the branch it takes."""
    then = helper.make_graph([helper.make_node("Tanh", ["x"], ["t"])], "then", [], [tensor("t")])
    other = helper.make_graph([helper.make_node("Neg", ["x"], ["e"])], "else", [], [tensor("e")])
    nodes = [helper.make_node("Size", ["x"], ["n"]), helper.make_node("Equal", ["n", "twelve"], ["c"]),
             helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)]
    model = build(nodes, [tensor("x", shape=[2, 6])], [tensor("y", shape=[2, 6])],
                  [numpy_helper.from_array(np.array(12, np.int64), "twelve")])
    m = compiled(tmp_path, model)
    assert [n.op_type for n in m.graph.nodes] == ["Tanh"]
    x = RNG.standard_normal((2, 6)).astype(np.float32)
    np.testing.assert_allclose(m.session().run({"x": x})["y"], np.tanh(x), rtol=1e-6)
    assert m.default.program.places["y"].region != DYNAMIC


def test_if_result_outlives_the_arena_block_of_the_value_it_returns(tmp_path):
    """The branches differ in shape, so the If runs late; its then-branch returns captured r
    itself, r's block is reused by z after the If, and y must still hold r."""
    then = helper.make_graph([], "then", [], [tensor("r")])
    other = helper.make_graph([helper.make_node("Concat", ["r", "r"], ["e"], axis=0)], "else", [],
                              [tensor("e")])
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other),
             helper.make_node("Sigmoid", ["x"], ["z"]), helper.make_node("ReduceSum", ["z"], ["u"])]
    model = build(nodes, [tensor("x", shape=[64]), tensor("c", T.BOOL, [])],
                  [tensor("y", shape=[64]), tensor("u", shape=[1])])
    m = compiled(tmp_path, model, autofuse=False)  # z stays a value of its own, in the arena
    places = m.default.program.places
    assert places["y"].region == DYNAMIC
    assert places["r"].region == places["z"].region == ARENA and places["r"].offset == places["z"].offset
    x = RNG.standard_normal(64).astype(np.float32)
    sess = m.session()
    for _ in range(2):
        out = sess.run({"x": x, "c": np.array(True)})
        np.testing.assert_array_equal(out["y"], np.maximum(x, 0))
        np.testing.assert_allclose(out["u"], [np.sum(1 / (1 + np.exp(-x)))], rtol=1e-5)


def rate_branches_model() -> onnx.ModelProto:
    """The issue's audio front end: y = If(sr == 16000, then Relu(x), else Reshape(x, [-1, 3])) on
    x: [1, n]; the else branch holds only for lengths that divide by 3."""
    then = helper.make_graph([helper.make_node("Relu", ["x"], ["t"])], "then", [], [tensor("t", shape=[1, "n"])])
    other = helper.make_graph([helper.make_node("Reshape", ["x", "frames"], ["e"])], "else", [],
                              [tensor("e", shape=["a", "b"])],
                              [numpy_helper.from_array(np.array([-1, 3], np.int64), "frames")])
    nodes = [helper.make_node("Equal", ["sr", "rate"], ["c"]),
             helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)]
    return build(nodes, [tensor("x", shape=[1, "n"]), tensor("sr", T.INT64, [])], [tensor("y", shape=["a", "b"])],
                 [numpy_helper.from_array(np.array(16000, np.int64), "rate")])


def _ort(model: onnx.ModelProto, feeds: dict) -> list:
    import onnxruntime as ort

    return ort.InferenceSession(model.SerializeToString()).run(None, feeds)


@pytest.mark.parametrize("shapes", [{"x": (1, 4)}, None])
def test_an_if_branch_invalid_for_the_shapes_at_hand_fails_only_if_taken(tmp_path, shapes):
    model = rate_branches_model()
    path = str(tmp_path / "rates.om")
    omrt.compile(model, path, shapes=shapes)
    sess = omrt.load(path).session()
    x = np.array([[-2, -1, 0, 1]], np.float32)
    feeds = {"x": x, "sr": np.array(16000)}
    np.testing.assert_array_equal(sess.run(feeds)["y"], _ort(model, feeds)[0])
    with pytest.raises(omrt.ShapeError, match=r"else/Reshape_0: cannot reshape \(1, 4\) to \[-1, 3\]"):
        sess.run({"x": x, "sr": np.array(8000)})
    if shapes is None:  # a length both branches hold for
        six = {"x": np.arange(6, dtype=np.float32).reshape(1, 6), "sr": np.array(8000)}
        np.testing.assert_array_equal(sess.run(six)["y"], _ort(model, six)[0])


def test_an_if_whose_branches_both_fail_names_both(tmp_path):
    model = rate_branches_model()
    then = next(a.g for a in model.graph.node[1].attribute if a.name == "then_branch")
    then.node[0].op_type = "Squeeze"  # then: Squeeze(x) of [1, n] at an axis out of range
    then.node[0].input.append("axis")
    then.initializer.append(numpy_helper.from_array(np.array([5], np.int64), "axis"))
    with pytest.raises(omrt.ShapeError, match=r"neither branch of the If holds for these shapes: then: .*; "
                                              r"else: .*cannot reshape"):
        omrt.compile(model, str(tmp_path / "bad.om"), shapes={"x": (1, 4)})


def _per_rate_frames_model() -> onnx.ModelProto:
    """Frames of 10 ms: 160 samples at 16 kHz, 80 at 8 kHz, one Reshape per rate."""
    branches = {}
    for key, frame in (("then", 160), ("else", 80)):
        shape = numpy_helper.from_array(np.array([-1, frame], np.int64), f"{key}_frame")
        branches[key] = helper.make_graph(
            [helper.make_node("Reshape", ["x", f"{key}_frame"], [f"{key}_f"]),
             helper.make_node("ReduceMean", [f"{key}_f", "last"], [f"{key}_m"], keepdims=0)],
            key, [], [tensor(f"{key}_m", shape=["frames"])], [shape])
    nodes = [helper.make_node("Equal", ["sr", "rate"], ["c"]),
             helper.make_node("If", ["c"], ["energy"], then_branch=branches["then"], else_branch=branches["else"])]
    return build(nodes, [tensor("x", shape=[1, "n"]), tensor("sr", T.INT64, [])], [tensor("energy", shape=["f"])],
                 [numpy_helper.from_array(np.array(16000, np.int64), "rate"),
                  numpy_helper.from_array(np.array([-1], np.int64), "last")], opset=18)


@pytest.mark.parametrize("n, sr", [(400, 8000), (480, 16000), (480, 8000)])
def test_audio_front_end_with_one_branch_per_sample_rate(tmp_path, n, sr):
    model = _per_rate_frames_model()
    feeds = {"x": RNG.standard_normal((1, n)).astype(np.float32), "sr": np.array(sr)}
    for shapes in ({"x": (1, n)}, None):
        path = str(tmp_path / "frames.om")
        omrt.compile(model, path, shapes=shapes)
        got = omrt.load(path).session().run(feeds)["energy"]
        np.testing.assert_allclose(got, _ort(model, feeds)[0], rtol=1e-5, atol=1e-6)


def _gru_stack_model(hidden: int = 8) -> onnx.ModelProto:
    """Two GRUs as PyTorch exports a stack: between them the direction axis is squeezed by an If
    (here on whether the input is non-negative overall); the other branch squeezes axis 0, which
    only holds for a sequence of one step."""
    inits = []
    for k, width in ((0, 4), (1, hidden)):
        for name, shape in ((f"W{k}", (1, 3 * hidden, width)), (f"R{k}", (1, 3 * hidden, hidden)),
                            (f"B{k}", (1, 6 * hidden))):
            inits.append(numpy_helper.from_array((RNG.standard_normal(shape) * 0.3).astype(np.float32), name))
    inits += [numpy_helper.from_array(np.array([1], np.int64), "dir_axis"),
              numpy_helper.from_array(np.array([0], np.int64), "seq_axis")]
    squeeze = {key: helper.make_graph([helper.make_node("Squeeze", ["y0", axes], [f"{key}_s"])], key, [],
                                      [tensor(f"{key}_s", shape=None)])
               for key, axes in (("then", "dir_axis"), ("else", "seq_axis"))}
    nodes = [helper.make_node("GRU", ["x", "W0", "R0", "B0"], ["y0"], hidden_size=hidden),
             helper.make_node("ReduceSum", ["x"], ["total"], keepdims=0),
             helper.make_node("Greater", ["total", "zero"], ["c"]),
             helper.make_node("If", ["c"], ["h0"], then_branch=squeeze["then"], else_branch=squeeze["else"]),
             helper.make_node("GRU", ["h0", "W1", "R1", "B1"], ["y1"], hidden_size=hidden)]
    inits.append(numpy_helper.from_array(np.array(-1e9, np.float32), "zero"))
    return build(nodes, [tensor("x", shape=["seq", 1, 4])], [tensor("y1", shape=None)], inits)


@pytest.mark.parametrize("shapes", [{"x": (5, 1, 4)}, None])
def test_gru_stack_with_a_conditional_squeeze(tmp_path, shapes):
    model = _gru_stack_model()
    feeds = {"x": RNG.standard_normal((5, 1, 4)).astype(np.float32)}
    path = str(tmp_path / "gru.om")
    omrt.compile(model, path, shapes=shapes)
    got = omrt.load(path).session().run(feeds)["y1"]
    np.testing.assert_allclose(got, _ort(model, feeds)[0], rtol=1e-4, atol=1e-5)


def loop_body(threshold: float) -> onnx.GraphProto:
    """(i, cond, acc) -> (acc + i * x < threshold, acc + i * x, (acc + i * x) * 2): x is captured."""
    nodes = [helper.make_node("Cast", ["i"], ["fi"], to=T.FLOAT),
             helper.make_node("Mul", ["fi", "x"], ["ix"]),
             helper.make_node("Add", ["acc", "ix"], ["acc_out"]),
             helper.make_node("ReduceSum", ["acc_out"], ["total"], keepdims=0),
             helper.make_node("Less", ["total", "limit"], ["cond_out"]),
             helper.make_node("Mul", ["acc_out", "two"], ["doubled"])]
    return helper.make_graph(
        nodes, "body", [tensor("i", T.INT64, []), tensor("cond", T.BOOL, []), tensor("acc", shape=[3])],
        [tensor("cond_out", T.BOOL, []), tensor("acc_out", shape=[3]), tensor("doubled", shape=[3])],
        [numpy_helper.from_array(np.array(threshold, np.float32), "limit"),
         numpy_helper.from_array(np.array(2, np.float32), "two")])


@pytest.mark.parametrize("trips,threshold", [(5, 1e9), (20, 30.0), (0, 1e9)])
def test_loop_carries_values_and_stacks_scan_outputs(tmp_path, trips, threshold):
    nodes = [helper.make_node("Loop", ["m", "", "acc0"], ["acc", "scan"], body=loop_body(threshold))]
    model = build(nodes, [tensor("m", T.INT64, []), tensor("acc0", shape=[3]), tensor("x", shape=[3])],
                  [tensor("acc", shape=[3]), tensor("scan", shape=None)])
    m = compiled(tmp_path, model)
    feeds = {"m": np.array(trips, np.int64), "acc0": np.zeros(3, np.float32),
             "x": np.array([1, 2, 3], np.float32)}
    got = m.session().run(feeds)
    want_acc = np.zeros(3, np.float32)
    want_scan = []
    for i in range(trips):
        want_acc = want_acc + i * feeds["x"]
        want_scan.append(want_acc * 2)
        if want_acc.sum() >= threshold:
            break
    np.testing.assert_allclose(got["acc"], want_acc)
    assert got["scan"].shape == (len(want_scan), 3)
    np.testing.assert_allclose(got["scan"], np.array(want_scan, np.float32).reshape(-1, 3))


@pytest.mark.parametrize("trips", [0, 3])
def test_loop_without_scan_outputs_is_planned(tmp_path, trips):
    body = loop_body(1e9)
    del body.output[2]
    model = build([helper.make_node("Loop", ["m", "", "acc0"], ["acc"], body=body)],
                  [tensor("m", T.INT64, []), tensor("acc0", shape=[3]), tensor("x", shape=[3])],
                  [tensor("acc", shape=[3])])
    m = compiled(tmp_path, model)
    assert m.default.program.places["acc"].region == OUTPUT
    acc = np.empty(3, np.float32)
    sess = m.session(zero_copy="always")
    sess.bind("acc", acc)
    feeds = {"m": np.array(trips, np.int64), "acc0": np.float32([1, 1, 1]), "x": np.float32([1, 2, 3])}
    assert sess.run(feeds)["acc"] is acc
    np.testing.assert_allclose(acc, feeds["acc0"] + sum(range(trips)) * feeds["x"])


def test_loop_without_trip_count_runs_until_the_condition_fails(tmp_path):
    nodes = [helper.make_node("Loop", ["", "go", "acc0"], ["acc", "scan"], body=loop_body(30.0))]
    model = build(nodes, [tensor("go", T.BOOL, []), tensor("acc0", shape=[3]), tensor("x", shape=[3])],
                  [tensor("acc", shape=[3]), tensor("scan", shape=None)])
    feeds = {"go": np.array(True), "acc0": np.zeros(3, np.float32), "x": np.array([1, 2, 3], np.float32)}
    got = compiled(tmp_path, model).session().run(feeds)
    want = reference(model, feeds)
    np.testing.assert_allclose(got["acc"], want[0])
    np.testing.assert_allclose(got["scan"], want[1])
    feeds["go"] = np.array(False)
    np.testing.assert_array_equal(compiled(tmp_path, model).session().run(feeds)["acc"], feeds["acc0"])


def test_loop_carried_value_that_grows_every_iteration(tmp_path):
    """The body declares the carried value as float[3] like its initial value; it still grows (the
    declared rank holds, the sizes are taken as unknown), and Shape inside the body is not folded."""
    body = helper.make_graph(
        [helper.make_node("Concat", ["v", "x"], ["v_out"], axis=0), helper.make_node("Shape", ["v"], ["n"]),
         helper.make_node("Identity", ["cond"], ["cond_out"])],
        "body", [tensor("i", T.INT64, []), tensor("cond", T.BOOL, []), tensor("v", shape=[3])],
        [tensor("cond_out", T.BOOL, []), tensor("v_out", shape=None), tensor("n", T.INT64, [1])])
    model = build([helper.make_node("Loop", ["m", "go", "x"], ["v", "sizes"], body=body)],
                  [tensor("m", T.INT64, []), tensor("go", T.BOOL, []), tensor("x", shape=[3])],
                  [tensor("v", shape=None), tensor("sizes", T.INT64, None)])
    feeds = {"m": np.array(4, np.int64), "go": np.array(True), "x": np.float32([1, 2, 3])}
    got = compiled(tmp_path, model).session().run(feeds)
    want = reference(model, feeds)
    np.testing.assert_array_equal(got["v"], want[0])
    np.testing.assert_array_equal(got["sizes"], want[1])
    assert got["sizes"].ravel().tolist() == [3, 6, 9, 12]


def test_nested_subgraph_reads_a_value_two_scopes_out(tmp_path):
    """An If inside a Loop body reads the main graph's `scale`: both nodes capture it."""
    then = helper.make_graph([helper.make_node("Mul", ["acc", "scale"], ["t"])], "then", [], [tensor("t")])
    other = helper.make_graph([helper.make_node("Add", ["acc", "scale"], ["e"])], "else", [], [tensor("e")])
    body = helper.make_graph(
        [helper.make_node("Mod", ["i", "two"], ["odd_i"]),
         helper.make_node("Cast", ["odd_i"], ["odd"], to=T.BOOL),
         helper.make_node("If", ["odd"], ["acc_out"], then_branch=then, else_branch=other),
         helper.make_node("Identity", ["cond"], ["cond_out"])],
        "body", [tensor("i", T.INT64, []), tensor("cond", T.BOOL, []), tensor("acc", shape=[2])],
        [tensor("cond_out", T.BOOL, []), tensor("acc_out", shape=[2])],
        [numpy_helper.from_array(np.array(2, np.int64), "two")])
    nodes = [helper.make_node("Exp", ["s"], ["scale"]),
             helper.make_node("Loop", ["m", "", "acc0"], ["acc"], body=body)]
    model = build(nodes, [tensor("s", shape=[2]), tensor("acc0", shape=[2])], [tensor("acc", shape=[2])],
                  [numpy_helper.from_array(np.array(5, np.int64), "m")])
    m = compiled(tmp_path, model)
    (loop,) = [n for n in m.graph.nodes if n.op_type == "Loop"]
    assert loop.attrs[CAPTURES] == ["scale"] and loop.inputs[-1] == "scale"
    feeds = {"s": np.float32([0.1, -0.2]), "acc0": np.float32([1, 2])}
    acc, scale = feeds["acc0"], np.exp(feeds["s"])
    for i in range(5):
        acc = acc * scale if i % 2 else acc + scale
    np.testing.assert_allclose(m.session().run(feeds)["acc"], acc, rtol=1e-6)


def test_subgraph_constants_are_stored_in_weights(tmp_path):
    table = RNG.standard_normal((64, 3)).astype(np.float32)
    body = helper.make_graph(
        [helper.make_node("Constant", [], ["table"], value=numpy_helper.from_array(table)),
         helper.make_node("Gather", ["table", "i"], ["row"]),
         helper.make_node("Add", ["acc", "row"], ["acc_out"]),
         helper.make_node("Identity", ["cond"], ["cond_out"])],
        "body", [tensor("i", T.INT64, []), tensor("cond", T.BOOL, []), tensor("acc", shape=[3])],
        [tensor("cond_out", T.BOOL, []), tensor("acc_out", shape=[3])])
    model = build([helper.make_node("Loop", ["m", "", "acc0"], ["acc"], body=body)],
                  [tensor("m", T.INT64, []), tensor("acc0", shape=[3])], [tensor("acc", shape=[3])])
    m = compiled(tmp_path, model)
    doc = json.loads(bytes(OmFile(m.path).view(Part.MODEL_DEF)))
    body_doc = doc["nodes"][0][5]["body"]["@graph"]
    assert body_doc["constants"]["table"][:2] == ["<f4", [64, 3]] and len(body_doc["constants"]["table"]) == 4
    stored = m.graph.nodes[0].attrs["body"].constants["table"]
    assert not stored.flags.writeable and not stored.flags.owndata
    got = m.session().run({"m": np.array(10, np.int64), "acc0": np.zeros(3, np.float32)})["acc"]
    np.testing.assert_allclose(got, table[:10].sum(axis=0), rtol=1e-5)


def test_scan_with_axes_and_directions(tmp_path):
    """Sum of columns scanned backwards along axis 1; outputs stacked along the last axis, reversed."""
    body = helper.make_graph(
        [helper.make_node("Add", ["s", "col"], ["s_out"]), helper.make_node("Mul", ["col", "s_out"], ["y"])],
        "body", [tensor("s", shape=[3]), tensor("col", shape=[3])],
        [tensor("s_out", shape=[3]), tensor("y", shape=[3])])
    nodes = [helper.make_node("Scan", ["s0", "x"], ["s", "ys"], body=body, num_scan_inputs=1,
                              scan_input_axes=[1], scan_input_directions=[1], scan_output_axes=[-1],
                              scan_output_directions=[1])]
    model = build(nodes, [tensor("s0", shape=[3]), tensor("x", shape=[3, 4])],
                  [tensor("s", shape=[3]), tensor("ys", shape=[3, 4])], opset=16)
    s0, x = RNG.standard_normal(3).astype(np.float32), RNG.standard_normal((3, 4)).astype(np.float32)
    m = compiled(tmp_path, model)
    assert m.default.program.places["ys"].region == OUTPUT, "shapes known ahead: planned, not late"
    got = m.session().run({"s0": s0, "x": x})
    s, ys = s0.copy(), []
    for t in reversed(range(4)):
        s = s + x[:, t]
        ys.append(x[:, t] * s)
    np.testing.assert_allclose(got["s"], s, rtol=1e-6)
    np.testing.assert_allclose(got["ys"], np.stack(ys[::-1], axis=-1), rtol=1e-6)


def test_scan8_batches_with_sequence_lengths(tmp_path):
    body = helper.make_graph([helper.make_node("Add", ["s", "v"], ["s_out"]),
                              helper.make_node("Identity", ["s_out"], ["y"])],
                             "body", [tensor("s", shape=[2]), tensor("v", shape=[2])],
                             [tensor("s_out", shape=[2]), tensor("y", shape=[2])])
    nodes = [helper.make_node("Scan", ["lens", "s0", "x"], ["s", "ys"], body=body, num_scan_inputs=1,
                              directions=[1])]
    model = build(nodes, [tensor("lens", T.INT64, [2]), tensor("s0", shape=[2, 2]),
                          tensor("x", shape=[2, 3, 2])],
                  [tensor("s", shape=[2, 2]), tensor("ys", shape=[2, 3, 2])], opset=8)
    x = RNG.standard_normal((2, 3, 2)).astype(np.float32)
    feeds = {"lens": np.int64([3, 2]), "s0": np.zeros((2, 2), np.float32), "x": x}
    got = compiled(tmp_path, model).session().run(feeds)
    np.testing.assert_allclose(got["s"], [x[0].sum(0), x[1, :2].sum(0)], rtol=1e-6)
    np.testing.assert_allclose(got["ys"][0], np.cumsum(x[0, ::-1], axis=0), rtol=1e-6)
    np.testing.assert_allclose(got["ys"][1, :2], np.cumsum(x[1, 1::-1], axis=0), rtol=1e-6)
    np.testing.assert_array_equal(got["ys"][1, 2], 0)


def sequence_model() -> onnx.ModelProto:
    """(seq, optional extra) -> (seq with extra or with a zero row appended, its length)."""
    seq_t = helper.make_sequence_type_proto(helper.make_tensor_type_proto(T.FLOAT, None))
    opt_t = helper.make_optional_type_proto(helper.make_tensor_type_proto(T.FLOAT, [2]))
    then = helper.make_graph([helper.make_node("OptionalGetElement", ["extra"], ["got"])], "then", [],
                             [tensor("got", shape=[2])])
    other = helper.make_graph([helper.make_node("Constant", [], ["zero"], value=numpy_helper.from_array(
        np.zeros(2, np.float32)))], "else", [], [tensor("zero", shape=[2])])
    nodes = [helper.make_node("OptionalHasElement", ["extra"], ["has"]),
             helper.make_node("If", ["has"], ["row"], then_branch=then, else_branch=other),
             helper.make_node("SequenceInsert", ["seq", "row"], ["out"]),
             helper.make_node("SequenceLength", ["out"], ["n"])]
    graph = helper.make_graph(nodes, "g",
                              [helper.make_value_info("seq", seq_t), helper.make_value_info("extra", opt_t)],
                              [helper.make_value_info("out", seq_t), tensor("n", T.INT64, [])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def test_sequences_and_optionals_as_model_io(tmp_path):
    m = compiled(tmp_path, sequence_model())
    assert [(s.name, s.kind) for s in m.inputs] == [("seq", "sequence"), ("extra", "optional")]
    assert m.outputs[0].kind == "sequence"
    seq = [np.float32([1, 2]), np.float32([3, 4])]
    sess = m.session()
    out = sess.run({"seq": seq, "extra": np.float32([5, 6])})
    assert int(out["n"]) == 3 and [o.tolist() for o in out["out"]] == [[1, 2], [3, 4], [5, 6]]
    assert all(not np.shares_memory(o, s) for o, s in zip(out["out"], seq))
    sess.bind("seq", seq)
    out = sess.run({"extra": None})
    assert [o.tolist() for o in out["out"]] == [[1, 2], [3, 4], [0, 0]]


def test_sequence_io_errors_name_the_rule(tmp_path):
    sess = compiled(tmp_path, sequence_model()).session()
    with pytest.raises(omrt.InputError, match="'seq' is a sequence of float32 tensors; pass a list"):
        sess.run({"seq": np.zeros(2, np.float32), "extra": None})
    with pytest.raises(omrt.InputError, match="holds a float64 tensor"):
        sess.run({"seq": [np.zeros(2)], "extra": None})
    with pytest.raises(omrt.InputError, match="'seq' is missing"):
        sess.run({"extra": None})
    with pytest.raises(omrt.BindError, match="run\\(\\) returns it"):
        sess.bind("out", [])
