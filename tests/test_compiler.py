"""Compiler passes: import forms, folding of shape sub-graphs, dead code, fusion, aliases."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import omrt
from omrt.report import describe

RNG = np.random.default_rng(1)


def _model(nodes, inputs, outputs, inits=(), opset=17):
    g = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def _run_both(model, feeds, tmp_path, native: bool = True):
    """Compile (without autofuse, which runs after the rewrites these tests look at: see
    test_autofuse.py; with `native` False, without the rewrites for the native kernels either),
    run, and compare with the reference."""
    path = str(tmp_path / "m.om")
    res = omrt.compile(model, path, autofuse=False, native=native)
    got = omrt.load(path).session().run(feeds)
    want = ReferenceEvaluator(model).run(None, feeds)
    for spec, w in zip(model.graph.output, want):
        np.testing.assert_allclose(got[spec.name], w, rtol=1e-4, atol=1e-5)
    return res


def test_shape_subgraph_folds_and_reshape_becomes_an_alias(tmp_path):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4])
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
             helper.make_node("Unsqueeze", ["n", "axes"], ["n1"]),
             helper.make_node("Concat", ["n1", "minus1"], ["shape"], axis=0),
             helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("Reshape", ["r", "shape"], ["y"]),
             helper.make_node("Exp", ["x"], ["dead"])]
    inits = [numpy_helper.from_array(np.array(0, np.int64), "zero"),
             numpy_helper.from_array(np.array([0], np.int64), "axes"),
             numpy_helper.from_array(np.array([-1], np.int64), "minus1")]
    m = _model(nodes, [x], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 12])], inits)
    res = _run_both(m, {"x": RNG.standard_normal((2, 3, 4)).astype(np.float32)}, tmp_path)
    assert [n.op_type for n in res.graph.nodes] == ["Relu", "Reshape"]
    assert [res.graph.nodes[t.node].op_type for t in res.program.tasks] == ["Relu"]
    assert res.program.places["y"].region == "output" and res.program.places["r"].region == "output"


PACKED = {"PackedConv": ("Conv", "Conv", "__panels"), "PackedMatMul": ("MatMul", "FusedMatMul", "__strips")}
"""Packed op -> (op without a bias, op with one, suffix of the packed weight)."""


def _unpacked(node) -> tuple[str, list[str]]:
    """(op type, inputs) of a node as it was before its weights were packed (the compiler packs
    them for omrt's GEMM where it builds the native library: omrt::PackedConv, PackedMatMul)."""
    if node.domain == "omrt" and node.op_type in PACKED:
        plain, biased, suffix = PACKED[node.op_type]
        assert node.inputs[3] == f"{node.inputs[1]}{suffix}"
        return (biased, node.inputs[:3]) if node.inputs[2] else (plain, node.inputs[:2])
    return node.op_type, node.inputs


def test_conv_batchnorm_scale_shift_relu_become_one_conv(tmp_path):
    w = RNG.standard_normal((8, 3, 3, 3)).astype(np.float32)
    stats = [RNG.random(8).astype(np.float32) + 0.5 for _ in range(4)]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "s", "b", "m", "v"], ["bn"], epsilon=1e-3),
             helper.make_node("Mul", ["bn", "k"], ["scaled"]), helper.make_node("Add", ["t", "scaled"], ["sh"]),
             helper.make_node("Relu", ["sh"], ["y"])]
    inits = [numpy_helper.from_array(w, "w"),
             numpy_helper.from_array(RNG.standard_normal((8, 1, 1)).astype(np.float32), "k"),
             numpy_helper.from_array(RNG.standard_normal((1, 8, 1, 1)).astype(np.float32), "t")]
    inits += [numpy_helper.from_array(a, n) for a, n in zip(stats, "sbmv")]
    m = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
               [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 8, 8])], inits)
    res = _run_both(m, {"x": RNG.standard_normal((1, 3, 8, 8)).astype(np.float32)}, tmp_path)
    (conv,) = res.graph.nodes
    op_type, inputs = _unpacked(conv)
    assert op_type == "Conv" and conv.attrs["_act"] == "Relu" and len(inputs) == 3


def test_matmul_add_fuses_and_constant_nodes_import(tmp_path):
    nodes = [helper.make_node("Constant", [], ["w"], value=numpy_helper.from_array(
                 RNG.standard_normal((4, 5)).astype(np.float32))),
             helper.make_node("Constant", [], ["b"], value_floats=[1, 2, 3, 4, 5]),
             helper.make_node("MatMul", ["x", "w"], ["mm"]), helper.make_node("Add", ["mm", "b"], ["y"])]
    m = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4])],
               [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 5])])
    res = _run_both(m, {"x": RNG.standard_normal((3, 4)).astype(np.float32)}, tmp_path)
    (node,) = res.graph.nodes
    assert node.domain == "omrt" and _unpacked(node) == ("FusedMatMul", ["x", "w", "b"])


def test_external_data_and_inputs_that_carry_initializers(tmp_path):
    w = RNG.standard_normal((64, 64)).astype(np.float32)
    m = _model([helper.make_node("MatMul", ["x", "w"], ["y"])],
               [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 64]),
                helper.make_tensor_value_info("w", TensorProto.FLOAT, [64, 64])],
               [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 64])],
               [numpy_helper.from_array(w, "w")])
    src = tmp_path / "ext.onnx"
    onnx.save_model(m, str(src), save_as_external_data=True, location="ext.bin", size_threshold=0)
    assert (tmp_path / "ext.bin").exists()
    omrt.compile(str(src), str(tmp_path / "ext.om"))
    model = omrt.load(str(tmp_path / "ext.om"))
    assert [s.name for s in model.inputs] == ["x"]
    x = RNG.standard_normal((2, 64)).astype(np.float32)
    np.testing.assert_allclose(model.session().run({"x": x})["y"], x @ w, rtol=1e-5, atol=1e-4)


def test_old_opsets_are_converted_and_unknown_ops_named(tmp_path):
    m = _model([helper.make_node("Relu", ["x"], ["y"])],
               [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
               [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])], opset=6)
    _run_both(m, {"x": np.array([-1, 0, 2], np.float32)}, tmp_path)
    bad = _model([helper.make_node("Frobnicate", ["x"], ["y"], name="f1"),
                  helper.make_node("Frobnicate", ["y"], ["z"], name="f2")],
                 [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
                 [helper.make_tensor_value_info("z", TensorProto.FLOAT, [3])])
    with pytest.raises(omrt.UnsupportedOpError,
                       match=r"no kernel in omrt for Frobnicate at opset 17 \(nodes 'f1', 'f2'\)"):
        omrt.compile(bad, str(tmp_path / "bad.om"))
    with pytest.raises(omrt.CompileError, match=r"--shape names \['q'\], which are not graph inputs"):
        omrt.compile(m, str(tmp_path / "x.om"), shapes={"q": (1,)})


def test_symbolic_dims_survive_to_the_runtime(tmp_path):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])
    m = _model([helper.make_node("Softmax", ["x"], ["y"], axis=-1)], [x],
               [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])])
    path = str(tmp_path / "s.om")
    res = omrt.compile(m, path)
    assert res.program is None and res.graph.infos["y"].shape == ("batch", 4)
    model = omrt.load(path)
    assert model.inputs[0].shape == ("batch", 4)
    for n in (1, 5):
        x = RNG.standard_normal((n, 4)).astype(np.float32)
        e = np.exp(x - x.max(-1, keepdims=True))
        np.testing.assert_allclose(model.session().run({"x": x})["y"], e / e.sum(-1, keepdims=True), rtol=1e-5)


def test_batchnorm_takes_a_following_scale_shift_and_relu(tmp_path):
    stats = [RNG.random(4).astype(np.float32) + 0.5 for _ in range(4)]
    nodes = [helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["bn"]),
             helper.make_node("Mul", ["bn", "k"], ["scaled"]), helper.make_node("Add", ["scaled", "t"], ["sh"]),
             helper.make_node("Relu", ["sh"], ["y"])]
    inits = [numpy_helper.from_array(RNG.standard_normal((4, 1, 1)).astype(np.float32), "k"),
             numpy_helper.from_array(RNG.standard_normal((4, 1, 1)).astype(np.float32), "t")]
    inits += [numpy_helper.from_array(a, n) for a, n in zip(stats, "sbmv")]
    m = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4, 3, 3])],
               [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4, 3, 3])], inits)
    res = _run_both(m, {"x": RNG.standard_normal((2, 4, 3, 3)).astype(np.float32)}, tmp_path)
    (bn,) = res.graph.nodes
    assert bn.op_type == "BatchNormalization" and bn.attrs["_act"] == "Relu"


def _preactivation(scale, w, case="", **conv_attrs):
    """x -> BatchNormalization(scale, ...) -> Relu -> Conv(w, bias) -> y, with x of shape (2, C, 5, 4).

    `case` "stats_are_inputs" feeds the statistics as graph inputs; "training" sets training_mode.
    """
    c = scale.shape[0]
    stats = {"s": scale, "b": RNG.standard_normal(c), "m": RNG.standard_normal(c), "v": RNG.random(c) + 0.5}
    stats = {k: v.astype(np.float32) for k, v in stats.items()}
    nodes = [helper.make_node("BatchNormalization", ["x", *stats], ["bn"],
                              training_mode=int(case == "training")),
             helper.make_node("Relu", ["bn"], ["r"]),
             helper.make_node("Conv", ["r", "w", "cb"], ["y"], **conv_attrs)]
    inits = [numpy_helper.from_array(w.astype(np.float32), "w"),
             numpy_helper.from_array(RNG.standard_normal(w.shape[0]).astype(np.float32), "cb")]
    feeds = {"x": RNG.standard_normal((2, c, 5, 4)).astype(np.float32)}
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, c, 5, 4])]
    if case == "stats_are_inputs":
        inputs += [helper.make_tensor_value_info(k, TensorProto.FLOAT, [c]) for k in stats]
        feeds.update(stats)
    else:
        inits += [numpy_helper.from_array(v, k) for k, v in stats.items()]
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, w.shape[0], 5, 4])
    return _model(nodes, inputs, [y], inits), feeds


@pytest.mark.parametrize("signs", ["positive", "mixed"])
def test_preactivation_batchnorm_folds_into_the_pointwise_conv(signs, tmp_path):
    scale = RNG.random(6) + 0.5
    if signs == "mixed":
        scale[::2] *= -1
    m, feeds = _preactivation(scale, RNG.standard_normal((4, 6, 1, 1)))
    res = _run_both(m, feeds, tmp_path)
    views = [_unpacked(n) for n in res.graph.nodes]
    assert [op for op, _ in views] == (["Max", "Conv"] if signs == "positive" else ["Max", "Min", "Conv"])
    assert views[-1][1][1:] != ["w", "cb"]
    if signs == "mixed":  # the Min clamps the Max's result in place
        clamp = res.program.tasks[1]
        assert res.program.places[clamp.inputs[0]] == res.program.places[clamp.outputs[0]]


@pytest.mark.parametrize("case", ["padded_conv", "stats_are_inputs", "training"])
def test_batchnorm_that_cannot_fold_into_the_conv_keeps_its_relu(case, tmp_path):
    k, attrs = (3, {"pads": [1, 1, 1, 1]}) if case == "padded_conv" else (1, {})
    m, feeds = _preactivation(RNG.random(6) + 0.5, RNG.standard_normal((4, 6, k, k)), case, **attrs)
    res = _run_both(m, feeds, tmp_path)
    bn, conv = res.graph.nodes
    assert (bn.op_type, bn.attrs["_act"]) == ("BatchNormalization", "Relu")
    op_type, inputs = _unpacked(conv)
    assert (op_type, inputs[1:]) == ("Conv", ["w", "cb"])


def test_residual_sum_takes_the_relu_and_overwrites_a_dying_input(tmp_path):
    nodes = [helper.make_node("Exp", ["a"], ["ea"]), helper.make_node("Neg", ["b"], ["nb"]),
             helper.make_node("Sum", ["ea", "nb"], ["s"]), helper.make_node("Relu", ["s"], ["r"]),
             helper.make_node("Add", ["r", "a"], ["t"]), helper.make_node("Relu", ["t"], ["u"]),
             helper.make_node("Exp", ["u"], ["y"])]
    m = _model(nodes, [helper.make_tensor_value_info(v, TensorProto.FLOAT, [3, 4]) for v in "ab"],
               [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 4])])
    feeds = {v: RNG.standard_normal((3, 4)).astype(np.float32) for v in "ab"}
    res = _run_both(m, feeds, tmp_path)
    assert [(n.op_type, n.attrs.get("_act")) for n in res.graph.nodes] == [
        ("Exp", None), ("Neg", None), ("Sum", "Relu"), ("Add", "Relu"), ("Exp", None)]
    places = res.program.places
    assert places["r"] == places["ea"] and places["u"] == places["r"]


def _gelu_nodes(form: str, x: str, y: str) -> list:
    """The Erf formula of Gelu in one of the forms exporters write it."""
    scale = (helper.make_node("Mul", ["rsqrt2", x], [f"{y}_s"]) if form == "mul"
             else helper.make_node("Div", [x, "sqrt2"], [f"{y}_s"]))
    nodes = [scale, helper.make_node("Erf", [f"{y}_s"], [f"{y}_e"]),
             helper.make_node("Add", ["one", f"{y}_e"], [f"{y}_p"])]
    if form == "x_half_first":
        return nodes + [helper.make_node("Mul", [x, "half"], [f"{y}_h"]),
                        helper.make_node("Mul", [f"{y}_h", f"{y}_p"], [y])]
    if form == "half_last":
        return nodes + [helper.make_node("Mul", [x, f"{y}_p"], [f"{y}_h"]),
                        helper.make_node("Mul", ["half", f"{y}_h"], [y])]
    return nodes + [helper.make_node("Mul", [f"{y}_p", "half"], [f"{y}_h"]),
                    helper.make_node("Mul", [x, f"{y}_h"], [y])]


@pytest.mark.parametrize("form", ["x_half_first", "half_last", "half_inner", "mul"])
def test_erf_gelu_formula_becomes_one_node(form, tmp_path):
    consts = {"sqrt2": np.sqrt(2), "rsqrt2": np.sqrt(0.5), "one": 1.0, "half": 0.5}
    inits = [numpy_helper.from_array(np.array(v, np.float32), k) for k, v in consts.items()]
    nodes = [helper.make_node("Relu", ["x"], ["r"])] + _gelu_nodes(form, "r", "y")
    m = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 300])],
               [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 300])], inits)
    x = RNG.standard_normal((4, 300)).astype(np.float32) * 3
    res = _run_both(m, {"x": x}, tmp_path)
    assert [(n.domain, n.op_type) for n in res.graph.nodes] == [("", "Relu"), ("omrt", "Gelu")]


def test_erf_gelu_formula_with_a_shared_intermediate_is_left_alone(tmp_path):
    inits = [numpy_helper.from_array(np.array(v, np.float32), k)
             for k, v in {"sqrt2": np.sqrt(2), "one": 1.0, "half": 0.5}.items()]
    nodes = _gelu_nodes("x_half_first", "x", "y")
    m = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 5])],
               [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 5]),
                helper.make_tensor_value_info("y_e", TensorProto.FLOAT, [3, 5])], inits)
    res = _run_both(m, {"x": RNG.standard_normal((3, 5)).astype(np.float32)}, tmp_path)
    assert "Erf" in [n.op_type for n in res.graph.nodes]
    assert "Gelu" not in [n.op_type for n in res.graph.nodes]


def _attention_model(scale_op: str = "Div", shared_query: bool = False, mask: bool = False,
                     projected: bool = True, probs_out: bool = False):
    """One attention head pair as exporters write it: projections, heads split with Reshape and
    Transpose, scaled scores (plus a mask input `m`), Softmax, context merged back with
    Transpose and Reshape. Without `projected`, the query and key are x itself (the scale stays);
    `probs_out` makes the probabilities a graph output too."""
    seq, heads, size = 6, 2, 4
    hidden = heads * size
    w = {n: RNG.standard_normal((hidden, hidden)).astype(np.float32) for n in "qkv"}
    b = {n: RNG.standard_normal(hidden).astype(np.float32) for n in "qkv"}
    inits = [numpy_helper.from_array(a, f"W{n}") for n, a in w.items()]
    inits += [numpy_helper.from_array(a, f"b{n}") for n, a in b.items()]
    inits += [numpy_helper.from_array(np.array([1, seq, heads, size], np.int64), "split"),
              numpy_helper.from_array(np.array([1, seq, hidden], np.int64), "merge"),
              numpy_helper.from_array(np.array(np.sqrt(size) if scale_op == "Div" else 1 / np.sqrt(size),
                                               np.float32), "scale")]
    nodes = []
    for n, perm in (("q", [0, 2, 1, 3]), ("k", [0, 2, 3, 1]), ("v", [0, 2, 1, 3])):
        if n == "v" or projected:
            nodes += [helper.make_node("MatMul", ["x", f"W{n}"], [f"{n}_mm"]),
                      helper.make_node("Add", [f"{n}_mm", f"b{n}"], [f"{n}_p"])]
        nodes += [helper.make_node("Reshape", [f"{n}_p" if n == "v" or projected else "x", "split"], [f"{n}_r"]),
                  helper.make_node("Transpose", [f"{n}_r"], [f"{n}_t"], perm=perm)]
    nodes += [helper.make_node("MatMul", ["q_t", "k_t"], ["scores"]),
              helper.make_node(scale_op, ["scores", "scale"], ["scaled" if not mask else "unmasked"])]
    if mask:
        nodes.append(helper.make_node("Add", ["unmasked", "m"], ["scaled"]))
    nodes += [helper.make_node("Softmax", ["scaled"], ["probs"], axis=-1),
              helper.make_node("MatMul", ["probs", "v_t"], ["ctx"]),
              helper.make_node("Transpose", ["ctx"], ["ctx_t"], perm=[0, 2, 1, 3]),
              helper.make_node("Reshape", ["ctx_t", "merge"], ["y"])]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, seq, hidden])]
    if shared_query:
        outputs.append(helper.make_tensor_value_info("q_p", TensorProto.FLOAT, [1, seq, hidden]))
    if probs_out:
        outputs.append(helper.make_tensor_value_info("probs", TensorProto.FLOAT, [1, heads, seq, seq]))
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, seq, hidden])]
    feeds = {"x": RNG.standard_normal((1, seq, hidden)).astype(np.float32)}
    if mask:
        inputs.append(helper.make_tensor_value_info("m", TensorProto.FLOAT, [1, 1, 1, seq]))
        feeds["m"] = np.where(RNG.random((1, 1, 1, seq)) < 0.3, -1e4, 0).astype(np.float32)
    return _model(nodes, inputs, outputs, inits), feeds


@pytest.mark.parametrize("scale_op", ["Div", "Mul"])
def test_attention_scale_folds_into_the_query_and_transposes_into_matmuls(scale_op, tmp_path):
    m, feeds = _attention_model(scale_op)
    res = _run_both(m, feeds, tmp_path, native=False)
    ops = [n.op_type for n in res.graph.nodes]
    assert scale_op not in ops and "Transpose" not in ops
    scores, ctx = [n for n in res.graph.nodes if n.op_type == "MatMul"]
    assert scores.attrs["_perm_a"] == [0, 2, 1, 3] and scores.attrs["_perm_b"] == [0, 2, 3, 1]
    assert ctx.attrs["_perm_b"] == [0, 2, 1, 3] and ctx.attrs["_perm_y"] == [0, 2, 1, 3]


@pytest.mark.parametrize("projected", [True, False])
@pytest.mark.parametrize("mask", [True, False])
def test_attention_becomes_one_node_that_runs_natively_when_trusted(tmp_path, projected, mask):
    """Scores, scale (folded into the query, or kept when the query is no projection), mask,
    Softmax and value product -> one omrt::Attention over the 3-D projections; trusted, it is one
    native call; untrusted, the numpy kernel; both as the reference computes."""
    m, feeds = _attention_model(mask=mask, projected=projected)
    res = omrt.compile(m, str(tmp_path / "m.om"), autofuse=False)
    if not res.libraries:
        pytest.skip("no C compiler: the native rewrites do not run")
    (att,) = [n for n in res.graph.nodes if n.op_type == "Attention"]
    assert att.domain == "omrt" and "Softmax" not in [n.op_type for n in res.graph.nodes]
    assert att.attrs["scale"] == (1.0 if projected else pytest.approx(0.5)) and len(att.inputs) == 3 + mask
    want = ReferenceEvaluator(m).run(None, feeds)[0]
    for trusted in (True, False):
        loaded = omrt.load(str(tmp_path / "m.om"), trust_kernels=trusted)
        got = loaded.session().run(feeds)["y"]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * max(1.0, float(np.abs(want).max())))
        assert (loaded.native is not None and loaded.native.calls().get("omrt_attention_f32", 0) == 1) == trusted


def test_attention_whose_probabilities_are_read_elsewhere_stays_unfused(tmp_path):
    m, feeds = _attention_model(probs_out=True)
    res = _run_both(m, feeds, tmp_path)
    assert "Attention" not in [n.op_type for n in res.graph.nodes]


def test_attention_scale_leaves_a_projection_read_elsewhere_unscaled(tmp_path):
    m, feeds = _attention_model(shared_query=True)
    res = _run_both(m, feeds, tmp_path, native=False)
    (query,) = [n for n in res.graph.nodes if "q_p" in n.outputs]
    (key,) = [n for n in res.graph.nodes if "k_p" in n.outputs]
    assert _unpacked(query)[1][1:] == ["Wq", "bq"] and key.inputs[1] != "Wk"


def test_scale_after_a_product_with_bias_is_not_folded(tmp_path):
    inits = [numpy_helper.from_array(RNG.standard_normal((4, 5)).astype(np.float32), "W"),
             numpy_helper.from_array(RNG.standard_normal(5).astype(np.float32), "b"),
             numpy_helper.from_array(RNG.standard_normal(3).astype(np.float32), "c"),
             numpy_helper.from_array(np.array(4.0, np.float32), "four")]
    nodes = [helper.make_node("MatMul", ["x", "W"], ["p"]), helper.make_node("Add", ["p", "b"], ["q"]),
             helper.make_node("MatMul", ["q", "z"], ["s"]), helper.make_node("Add", ["s", "c"], ["t"]),
             helper.make_node("Div", ["t", "four"], ["y"])]
    m = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4]),
                       helper.make_tensor_value_info("z", TensorProto.FLOAT, [5, 3])],
               [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])], inits)
    feeds = {"x": RNG.standard_normal((2, 4)).astype(np.float32),
             "z": RNG.standard_normal((5, 3)).astype(np.float32)}
    res = _run_both(m, feeds, tmp_path)
    assert [_unpacked(n)[0] for n in res.graph.nodes] == ["FusedMatMul", "FusedMatMul", "Div"]


def test_an_input_type_the_operator_does_not_take_is_a_compile_error(tmp_path):
    """Conv's X and W share one type T: float32 data with float16 filters (which the onnx checker
    rejects) used to compile, and the native loop then read twice the filter bytes there were."""
    w = numpy_helper.from_array(np.ones((4, 2, 3, 3), np.float16), "w")
    node = helper.make_node("Conv", ["x", "w"], ["y"], name="conv1")
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 5, 5])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 3, 3])], [w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(omrt.CompileError, match=r"node 'conv1' \(Conv\): inputs 'x' \(tensor\(float\)\) and 'w' "
                                                r"\(tensor\(float16\)\) must have one type \(T\); cast one of them"):
        omrt.compile(m, str(tmp_path / "bad.om"))
    mask = helper.make_node("MatMul", ["a", "b"], ["p"], name="mask_product")
    g = helper.make_graph([mask], "g", [helper.make_tensor_value_info(n, TensorProto.BOOL, [2, 2]) for n in "ab"],
                          [helper.make_tensor_value_info("p", TensorProto.BOOL, [2, 2])])
    with pytest.raises(omrt.CompileError, match=r"node 'mask_product' \(MatMul\): input 'a' \(A\) is tensor\(bool\), "
                                                r"which MatMul does not take; it allows tensor\(bfloat16\), "):
        omrt.compile(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(tmp_path / "m.om"))
    assert not list(tmp_path.iterdir())


def _flatten_conv(batch="N", side="S"):
    """Conv then a Reshape whose target comes from Shape: the shape sub-graph folds only once
    the input signature is known."""
    w = numpy_helper.from_array(RNG.standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Shape", ["c"], ["s"]),
             helper.make_node("Slice", ["s", "zero", "one"], ["n"]),
             helper.make_node("Concat", ["n", "minus1"], ["target"], axis=0),
             helper.make_node("Reshape", ["c", "target"], ["y"])]
    consts = [numpy_helper.from_array(np.array([0], np.int64), "zero"),
              numpy_helper.from_array(np.array([1], np.int64), "one"),
              numpy_helper.from_array(np.array([-1], np.int64), "minus1")]
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3, side, side])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, None])], [w] + consts)


def test_plans_for_given_signatures_are_made_at_compile_time_and_used_at_load(tmp_path):
    m = _flatten_conv()
    path = str(tmp_path / "p.om")
    signatures = [{"x": (1, 3, 8, 8)}, {"x": (2, 3, 16, 16)}]
    res = omrt.compile(m, path, shapes_for=signatures)
    assert res.program is None and [p.signature for p in res.stored] == signatures
    model = omrt.load(path)
    assert [p.signature for p in model.stored_plans] == signatures
    ref = ReferenceEvaluator(m)
    for sig, stored in zip(signatures, model.stored_plans):
        prep = model.prepared(sig)
        assert prep.program is stored  # the plan from the file, proved by the verifier, not planned again
        x = RNG.standard_normal(sig["x"]).astype(np.float32)
        (want,) = ref.run(None, {"x": x})
        got = model.session().run({"x": x})["y"]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    other = model.prepared({"x": (3, 3, 8, 8)})  # any other signature is still planned on demand
    assert all(other.program is not p for p in model.stored_plans)
    assert "plans: 2 stored for input signatures" in describe(model)


def test_plans_for_must_name_the_symbolic_inputs_with_their_declared_rank(tmp_path):
    m = _flatten_conv()
    with pytest.raises(omrt.CompileError, match=r"must give a shape to exactly the inputs with symbolic dims: \['x'\]"):
        omrt.compile(m, str(tmp_path / "a.om"), shapes_for=[{"q": (1, 3, 8, 8)}])
    with pytest.raises(omrt.CompileError, match=r"gives input 'x' shape \(1, 4, 8, 8\); it is declared "
                                                r"\('N', 3, 'S', 'S'\)"):
        omrt.compile(m, str(tmp_path / "b.om"), shapes_for=[{"x": (1, 4, 8, 8)}])
    with pytest.raises(omrt.CompileError, match=r"gives input 'x' shape \(1, 3, 8\)"):
        omrt.compile(m, str(tmp_path / "c.om"), shapes_for=[{"x": (1, 3, 8)}])
    assert not (tmp_path / "a.om").exists()
    fixed = _model([helper.make_node("Reshape", ["x", "t"], ["y"])],
                   [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
                   [numpy_helper.from_array(np.array([1, 4], np.int64), "t")])
    with pytest.raises(omrt.CompileError, match=r"shapes_for \{'x': \(2, 4\)\}: the model cannot run at these "
                                                r"shapes: .*cannot reshape \(2, 4\)"):
        omrt.compile(fixed, str(tmp_path / "d.om"), shapes_for=[{"x": (2, 4)}])


def shuffle_model(conv_groups: int, shuffle_groups: int, perm: list[int], channels: int = 12) -> onnx.ModelProto:
    """A grouped 1x1 Conv with Relu (`channels` -> `channels`, 5x5), then ShuffleNet's channel
    shuffle across `shuffle_groups` groups (with Transpose `perm`), then Exp."""
    c = channels
    w = numpy_helper.from_array(RNG.standard_normal((c, c // conv_groups, 1, 1)).astype(np.float32) / c, "w")
    split = numpy_helper.from_array(np.array([1, shuffle_groups, c // shuffle_groups, 5, 5], np.int64), "split")
    back = numpy_helper.from_array(np.array([1, c, 5, 5], np.int64), "back")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], group=conv_groups), helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("Reshape", ["r", "split"], ["s"]), helper.make_node("Transpose", ["s"], ["t"], perm=perm),
             helper.make_node("Reshape", ["t", "back"], ["u"]), helper.make_node("Exp", ["u"], ["y"])]
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, 5, 5])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, c, 5, 5])], [w, split, back])


@pytest.mark.parametrize("conv_groups, shuffle_groups, perm, folds", [
    (3, 3, [0, 2, 1, 3, 4], True), (4, 4, [0, 2, 1, 3, 4], True),
    (3, 4, [0, 2, 1, 3, 4], False),   # a shuffle across other groups than the conv's
    (3, 3, [0, 1, 2, 4, 3], False),   # another transpose
    (1, 3, [0, 2, 1, 3, 4], False)])  # no groups to shuffle
def test_a_channel_shuffle_after_its_grouped_conv_folds_into_it(tmp_path, conv_groups, shuffle_groups, perm, folds):
    x = RNG.standard_normal((1, 12, 5, 5)).astype(np.float32)
    res = _run_both(shuffle_model(conv_groups, shuffle_groups, perm), {"x": x}, tmp_path)
    ops = [n.op_type for n in res.graph.nodes]
    assert (ops == ["ShuffledConv", "Exp"]) == folds, ops
    assert ("Transpose" in ops) != folds
