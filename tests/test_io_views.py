"""Graph inputs and outputs that the plan reaches through views, in parts and in place: random graphs
of Split, Concat, Slice, Reshape and elementwise ops whose values are graph I/O, run bound and
unbound, in both zero-copy modes, against ONNX Runtime."""

from __future__ import annotations

import math

import numpy as np
import onnxruntime as ort
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from onnx import TensorProto, helper, numpy_helper

import omrt

UNARY = ("Relu", "Neg", "Sigmoid", "Abs", "Identity")
BINARY = ("Add", "Mul", "Sub")


class _Builder:
    """Draws a random graph over values of known shapes."""

    def __init__(self, data: st.DataObject) -> None:
        self.data = data
        self.nodes: list = []
        self.inits: list = []
        self.shapes: dict[str, tuple[int, ...]] = {}

    def new(self, shape: tuple[int, ...]) -> str:
        name = f"v{len(self.shapes)}"
        self.shapes[name] = shape
        return name

    def pick(self, where=lambda s: True) -> str | None:
        names = [n for n, s in self.shapes.items() if where(s)]
        return self.data.draw(st.sampled_from(names)) if names else None

    def const(self, values: list[int]) -> str:
        name = f"c{len(self.inits)}"
        self.inits.append(numpy_helper.from_array(np.array(values, np.int64), name))
        return name

    def unary(self) -> None:
        v = self.pick()
        op = self.data.draw(st.sampled_from(UNARY))
        self.nodes.append(helper.make_node(op, [v], [self.new(self.shapes[v])]))

    def binary(self) -> None:
        a = self.pick()
        b = self.pick(lambda s: s == self.shapes[a])
        op = self.data.draw(st.sampled_from(BINARY))
        self.nodes.append(helper.make_node(op, [a, b], [self.new(self.shapes[a])]))

    def split(self) -> None:
        v = self.pick(lambda s: max(s) >= 2)
        if v is None:
            return
        shape = self.shapes[v]
        axis = self.data.draw(st.sampled_from([i for i, d in enumerate(shape) if d >= 2]))
        cut = self.data.draw(st.integers(1, shape[axis] - 1))
        parts = [shape[:axis] + (n,) + shape[axis + 1:] for n in (cut, shape[axis] - cut)]
        self.nodes.append(helper.make_node("Split", [v, self.const([cut, shape[axis] - cut])],
                                           [self.new(p) for p in parts], axis=axis))

    def concat(self) -> None:
        a = self.pick()
        shape = self.shapes[a]
        axis = self.data.draw(st.integers(0, len(shape) - 1))
        b = self.pick(lambda s: len(s) == len(shape) and all(x == y for i, (x, y) in enumerate(zip(s, shape))
                                                             if i != axis))
        out = shape[:axis] + (shape[axis] + self.shapes[b][axis],) + shape[axis + 1:]
        self.nodes.append(helper.make_node("Concat", [a, b], [self.new(out)], axis=axis))

    def slice(self) -> None:
        v = self.pick()
        shape = self.shapes[v]
        axis = self.data.draw(st.integers(0, len(shape) - 1))
        start = self.data.draw(st.integers(0, shape[axis] - 1))
        end = self.data.draw(st.integers(start + 1, shape[axis]))
        out = shape[:axis] + (end - start,) + shape[axis + 1:]
        self.nodes.append(helper.make_node("Slice", [v, self.const([start]), self.const([end]),
                                                     self.const([axis])], [self.new(out)]))

    def reshape(self) -> None:
        v = self.pick()
        shape = self.shapes[v]
        n = math.prod(shape)
        options = [(n,), (1, n)] + [(1, d, n // d) for d in range(1, n + 1) if n % d == 0]
        out = self.data.draw(st.sampled_from(options))
        self.nodes.append(helper.make_node("Reshape", [v, self.const(list(out))], [self.new(out)]))


def _random_model(data: st.DataObject):
    b = _Builder(data)
    inputs = [b.new((1, data.draw(st.integers(1, 5)), data.draw(st.integers(1, 6))))
              for _ in range(data.draw(st.integers(1, 2)))]
    for _ in range(data.draw(st.integers(1, 7))):
        data.draw(st.sampled_from([b.unary, b.binary, b.split, b.concat, b.slice, b.reshape]))()
    names = list(b.shapes)
    outputs = data.draw(st.lists(st.sampled_from(names), min_size=1, max_size=3, unique=True))
    vi = lambda n: helper.make_tensor_value_info(n, TensorProto.FLOAT, list(b.shapes[n]))  # noqa: E731
    graph = helper.make_graph(b.nodes, "io_views", [vi(n) for n in inputs], [vi(n) for n in outputs], b.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return model, inputs, outputs, b.shapes


def _check(got: np.ndarray, want: np.ndarray, name: str) -> None:
    scale = max(1.0, float(np.abs(want).max(initial=0.0)))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6 * scale, err_msg=name)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_views_of_graph_io_run_like_onnxruntime(tmp_path_factory, data):
    model, inputs, outputs, shapes = _random_model(data)
    path = str(tmp_path_factory.mktemp("io") / "m.om")
    omrt.compile(model, path, native=False)
    loaded = omrt.load(path)
    rng = np.random.default_rng(data.draw(st.integers(0, 1000)))
    feeds = {n: rng.standard_normal(shapes[n]).astype(np.float32) for n in inputs}
    want = dict(zip(outputs, ort.InferenceSession(model.SerializeToString()).run(outputs, feeds)))

    for name, value in loaded.session().run(feeds).items():
        _check(value, want[name], name)

    bound = loaded.session()
    buffers = {n: np.full(shapes[n], np.nan, np.float32) for n in outputs if n not in inputs}
    for name, arr in {**feeds, **buffers}.items():
        bound.bind(name, arr)
    results = bound.run()
    for name in outputs:
        _check(results[name], want[name], name)
        if name in buffers:
            assert results[name] is buffers[name]

    strict = loaded.session(zero_copy="always")
    copy_only = loaded.default.program.copy_only
    try:
        for name, arr in {**feeds, **buffers}.items():
            strict.bind(name, arr)
        results = strict.run()
    except omrt.BindError as e:
        assert any(repr(o) in str(e) for o in copy_only), e
        return
    assert not copy_only and strict.stats.bytes_copied == 0
    for name in outputs:
        _check(results[name], want[name], name)


def test_a_concatenated_output_is_written_in_place_in_parts(tmp_path):
    """A detection head's shape: two branches concatenated into the graph output."""
    vi = lambda n, s: helper.make_tensor_value_info(n, TensorProto.FLOAT, s)  # noqa: E731
    nodes = [helper.make_node("Split", ["x", "sizes"], ["s0", "s1"], axis=1),
             helper.make_node("Relu", ["s0"], ["boxes"]),
             helper.make_node("Sigmoid", ["s1"], ["g"]),
             helper.make_node("Mul", ["g", "g"], ["scores"]),
             helper.make_node("Concat", ["boxes", "scores"], ["y"], axis=1)]
    graph = helper.make_graph(nodes, "head", [vi("x", [1, 6, 50])], [vi("y", [1, 6, 50])],
                              [numpy_helper.from_array(np.array([4, 2], np.int64), "sizes")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    path = str(tmp_path / "head.om")
    omrt.compile(model, path)
    x = np.random.default_rng(0).standard_normal((1, 6, 50)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
    loaded = omrt.load(path)
    assert loaded.default.program.places["boxes"].key == "y"  # written straight into the output
    _check(loaded.session().run({"x": x})["y"], want, "y")
    sess = loaded.session(zero_copy="always")
    y = np.empty((1, 6, 50), np.float32)
    sess.bind("x", x)
    sess.bind("y", y)
    sess.run()
    _check(y, want, "y")
    assert sess.stats.bytes_copied == 0
    assert np.shares_memory(sess._executor.instructions[0].outputs[0], y)
