"""Sequence and optional kernels, run through compile -> .om -> session against onnx.reference."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper
from onnx.reference import ReferenceEvaluator

import omrt

RNG = np.random.default_rng(7)


def _value_info(name: str, value) -> onnx.ValueInfoProto:
    if isinstance(value, list):
        elem = helper.np_dtype_to_tensor_dtype(value[0].dtype)
        return helper.make_value_info(name, helper.make_sequence_type_proto(
            helper.make_tensor_type_proto(elem, None)))
    return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(value.dtype), value.shape)


def model(nodes, feeds: dict, outputs: list[str], opset: int = 18) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", [_value_info(k, v) for k, v in feeds.items()],
                              [helper.make_value_info(o, onnx.TypeProto()) for o in outputs])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def run(tmp_path, nodes, feeds: dict, outputs: list[str], opset: int = 18) -> list:
    """omrt's outputs for a graph of `nodes` over tensor or sequence feeds (compile, load, run)."""
    path = str(tmp_path / "m.om")
    omrt.compile(model(nodes, feeds, outputs, opset), path)
    got = omrt.load(path).session().run(feeds)
    return [got[o] for o in outputs]


def assert_same(got, want) -> None:
    if isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want)
        for g, w in zip(got, want):
            assert_same(g, w)
        return
    want = np.asarray(want)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)


def check(tmp_path, nodes, feeds, outputs, opset: int = 18) -> list:
    """Assert omrt agrees with onnx.reference."""
    got = run(tmp_path, nodes, feeds, outputs, opset)
    want = ReferenceEvaluator(model(nodes, feeds, outputs, opset)).run(None, feeds)
    for g, w in zip(got, want):
        assert_same(g, w)
    return got


def abc(dtype=np.float32) -> dict:
    return {n: RNG.standard_normal(s).astype(dtype) for n, s in (("a", (2, 3)), ("b", (4, 3)), ("c", (1, 3)))}


def test_construct_at_and_length(tmp_path):
    nodes = [helper.make_node("SequenceConstruct", ["a", "b", "c"], ["s"]),
             helper.make_node("SequenceAt", ["s", "i"], ["first"]),
             helper.make_node("SequenceAt", ["s", "j"], ["last"]),
             helper.make_node("SequenceLength", ["s"], ["n"])]
    feeds = {**abc(), "i": np.array(0, np.int64), "j": np.array(-1, np.int32)}
    check(tmp_path, nodes, feeds, ["s", "first", "last", "n"])


@pytest.mark.parametrize("position", [None, 0, 1, -1])
def test_insert(tmp_path, position):
    inputs = ["s", "x"] + ([] if position is None else ["p"])
    nodes = [helper.make_node("SequenceConstruct", ["a", "b", "c"], ["s"]),
             helper.make_node("SequenceInsert", inputs, ["t"])]
    feeds = {**abc(), "x": np.ones((5, 3), np.float32)}
    if position is not None:
        feeds["p"] = np.array(position, np.int64)
    check(tmp_path, nodes, feeds, ["t", "s"])


def test_insert_at_the_length_appends(tmp_path):
    """Position n is "the back of the sequence" (the reference wraps it to the front)."""
    nodes = [helper.make_node("SequenceConstruct", ["a", "b"], ["s"]),
             helper.make_node("SequenceInsert", ["s", "x", "p"], ["t"])]
    feeds = {**abc(), "x": np.ones((5, 3), np.float32), "p": np.array(2, np.int64)}
    del feeds["c"]
    (got,) = run(tmp_path, nodes, feeds, ["t"])
    assert_same(got, [feeds["a"], feeds["b"], feeds["x"]])


@pytest.mark.parametrize("position", [None, 0, -2])
def test_erase(tmp_path, position):
    inputs = ["s"] + ([] if position is None else ["p"])
    nodes = [helper.make_node("SequenceConstruct", ["a", "b", "c"], ["s"]),
             helper.make_node("SequenceErase", inputs, ["t"])]
    feeds = abc()
    if position is not None:
        feeds["p"] = np.array(position, np.int64)
    check(tmp_path, nodes, feeds, ["t"])


def test_empty_then_insert_keeps_dtype(tmp_path):
    nodes = [helper.make_node("SequenceEmpty", [], ["e"], dtype=T.INT32),
             helper.make_node("SequenceInsert", ["e", "x"], ["s"]),
             helper.make_node("SequenceLength", ["e"], ["n"])]
    check(tmp_path, nodes, {"x": np.arange(4, dtype=np.int32)}, ["s", "n"])


def test_position_out_of_range_fails_at_run(tmp_path):
    nodes = [helper.make_node("SequenceConstruct", ["a", "b"], ["s"]),
             helper.make_node("SequenceAt", ["s", "p"], ["y"])]
    graph = helper.make_graph(nodes, "g", [_value_info(k, v) for k, v in abc().items() if k != "c"]
                              + [helper.make_tensor_value_info("p", T.INT64, [])],
                              [helper.make_tensor_value_info("y", T.FLOAT, None)])
    path = str(tmp_path / "m.om")
    omrt.compile(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), path)
    with pytest.raises(omrt.OmrtError, match=r"position 2 is outside \[-2, 1\]"):
        omrt.load(path).session().run({**{k: v for k, v in abc().items() if k != "c"},
                                       "p": np.array(2, np.int64)})


@pytest.mark.parametrize("axis,keepdims", [(0, 1), (1, 0), (-1, 1)])
def test_split_to_sequence_without_split(tmp_path, axis, keepdims):
    nodes = [helper.make_node("SplitToSequence", ["x"], ["s"], axis=axis, keepdims=keepdims)]
    check(tmp_path, nodes, {"x": RNG.standard_normal((3, 4, 2)).astype(np.float32)}, ["s"])


@pytest.mark.parametrize("split", [np.array(3, np.int64), np.array([1, 4, 2], np.int32)])
def test_split_to_sequence_with_split(tmp_path, split):
    nodes = [helper.make_node("SplitToSequence", ["x", "split"], ["s"], axis=1)]
    check(tmp_path, nodes, {"x": RNG.standard_normal((2, 7)).astype(np.float64), "split": split}, ["s"])


@pytest.mark.parametrize("axis,new_axis", [(0, 0), (-1, 0), (0, 1), (-1, 1), (2, 1)])
def test_concat_from_sequence(tmp_path, axis, new_axis):
    nodes = [helper.make_node("SplitToSequence", ["x"], ["s"], axis=0),
             helper.make_node("ConcatFromSequence", ["s"], ["y"], axis=axis, new_axis=new_axis)]
    check(tmp_path, nodes, {"x": RNG.integers(0, 9, (3, 2, 4)).astype(np.int64)}, ["y"])


def test_sequence_io_and_split_round_trip(tmp_path):
    seq = [RNG.standard_normal((2, k)).astype(np.float32) for k in (1, 3, 2)]
    nodes = [helper.make_node("ConcatFromSequence", ["s"], ["y"], axis=1),
             helper.make_node("SplitToSequence", ["y", "lens"], ["back"], axis=1)]
    check(tmp_path, nodes, {"s": seq, "lens": np.array([1, 3, 2], np.int64)}, ["y", "back"])


def test_sequence_map_over_two_sequences_and_a_tensor(tmp_path):
    body = helper.make_graph(
        [helper.make_node("Add", ["p", "q"], ["pq"]), helper.make_node("Mul", ["pq", "t"], ["out"]),
         helper.make_node("Shape", ["p"], ["shape"])],
        "body", [helper.make_tensor_value_info(n, T.FLOAT, None) for n in ("p", "q", "t")],
        [helper.make_tensor_value_info("out", T.FLOAT, None),
         helper.make_tensor_value_info("shape", T.INT64, None)])
    xs = [RNG.standard_normal((k, 2)).astype(np.float32) for k in (1, 3)]
    ys = [RNG.standard_normal((k, 2)).astype(np.float32) for k in (1, 3)]
    t = np.float32([2, 3])
    nodes = [helper.make_node("SequenceMap", ["xs", "ys", "t"], ["outs", "shapes"], body=body)]
    outs, shapes = run(tmp_path, nodes, {"xs": xs, "ys": ys, "t": t}, ["outs", "shapes"])
    assert_same(outs, [(x + y) * t for x, y in zip(xs, ys)])
    assert_same(shapes, [np.array(x.shape, np.int64) for x in xs])


def test_sequence_map_over_one_sequence(tmp_path):
    body = helper.make_graph([helper.make_node("ReduceSum", ["p"], ["out"], keepdims=0)], "body",
                             [helper.make_tensor_value_info("p", T.INT32, None)],
                             [helper.make_tensor_value_info("out", T.INT32, None)])
    xs = [RNG.integers(0, 9, (k,)).astype(np.int32) for k in (4, 0, 2)]
    check(tmp_path, [helper.make_node("SequenceMap", ["xs"], ["sums"], body=body)], {"xs": xs}, ["sums"])


def test_optional_of_a_tensor(tmp_path):
    nodes = [helper.make_node("Optional", ["x"], ["o"]),
             helper.make_node("OptionalHasElement", ["o"], ["has"]),
             helper.make_node("OptionalGetElement", ["o"], ["y"])]
    x = RNG.standard_normal((2, 2)).astype(np.float32)
    has, y = run(tmp_path, nodes, {"x": x}, ["has", "y"])
    assert has.dtype == np.bool_ and has.shape == () and bool(has)
    assert_same(y, x)


def test_empty_optional_and_absent_input(tmp_path):
    empty = helper.make_node("Optional", [], ["o"], type=helper.make_sequence_type_proto(
        helper.make_tensor_type_proto(T.FLOAT, [2])))
    nodes = [empty, helper.make_node("OptionalHasElement", ["o"], ["has"]),
             helper.make_node("OptionalHasElement", [""], ["absent"]),
             helper.make_node("OptionalHasElement", ["x"], ["tensor"])]
    got = run(tmp_path, nodes, {"x": np.zeros(1, np.float32)}, ["has", "absent", "tensor"])
    assert [bool(g) for g in got] == [False, False, True]


def test_get_element_of_an_empty_optional_fails(tmp_path):
    nodes = [helper.make_node("Optional", [], ["o"], type=helper.make_tensor_type_proto(T.FLOAT, [1])),
             helper.make_node("OptionalGetElement", ["o"], ["y"])]
    graph = helper.make_graph(nodes, "g", [], [helper.make_tensor_value_info("y", T.FLOAT, [1])])
    path = str(tmp_path / "m.om")
    omrt.compile(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), path)
    with pytest.raises(omrt.OmrtError, match="empty optional"):
        omrt.load(path).session().run()
