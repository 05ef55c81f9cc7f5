"""ai.onnx.ml kernels against onnx.reference (and numpy where the reference lacks a rule)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import numpy_helper

from omrt.errors import KernelError, ShapeError
from tests.kernel_check import reference, run_kernel

ML = "ai.onnx.ml"
rng = np.random.default_rng(0)


def proto_attrs(attrs: dict) -> dict:
    """The attributes as onnx.helper.make_node wants them (TENSOR attributes as TensorProto)."""
    return {k: numpy_helper.from_array(v, k) if isinstance(v, np.ndarray) else v for k, v in attrs.items()}


def check(op: str, inputs: list[np.ndarray], attrs: dict, opset: int, rtol: float = 1e-6) -> np.ndarray:
    got = run_kernel(op, inputs, attrs, opset=opset, domain=ML, const=[])[0]
    want = np.asarray(reference(op, inputs, proto_attrs(attrs), opset=opset, domain=ML)[0])
    assert got.shape == want.shape
    if want.dtype.kind in "OU":
        assert got.dtype == object and got.tolist() == want.astype(object).tolist()
    else:
        assert got.dtype == want.dtype
        np.testing.assert_allclose(got, want, rtol=rtol, atol=1e-6)
    return got


# ----------------------------------------------------------------------------- LabelEncoder

WORDS = np.array([["a", "b", "zz"], ["c", "", "a"]], dtype=object)


@pytest.mark.parametrize("attrs,x", [
    ({"keys_strings": ["a", "b", "c"], "values_int64s": [1, 2, 3], "default_int64": 42}, WORDS),
    ({"keys_strings": ["a", "b", "c"], "values_floats": [0.5, 1.5, 2.5]}, WORDS),
    ({"keys_strings": ["a", "b"], "values_strings": ["x", "y"], "default_string": "?"}, WORDS),
    ({"keys_int64s": [7, -3, 100], "values_strings": ["s", "m", "l"]}, np.array([100, 7, 0, -3], np.int64)),
    ({"keys_int64s": [7, -3, 100], "values_int64s": [1, 2, 3]}, np.array([[100, 7], [5, -3]], np.int64)),
    ({"keys_floats": [0.5, -2.0, 3.25], "values_int64s": [1, 2, 3]}, np.array([3.25, 0.5, 1.0], np.float32)),
])
@pytest.mark.parametrize("opset", [2, 4])
def test_label_encoder_lists(attrs, x, opset):
    check("LabelEncoder", [x], attrs, opset)


def test_label_encoder_tensor_attributes():
    attrs = {"keys_tensor": np.array([1, 5, 9], np.int32), "values_tensor": np.array([10, 50, 90], np.int16),
             "default_tensor": np.array([-7], np.int16)}
    check("LabelEncoder", [np.array([9, 1, 4, 5], np.int32)], attrs, 4)
    strings = {"keys_tensor": np.array(["p", "q"], dtype=object),
               "values_tensor": np.array([0.25, 0.75], np.float64)}
    x = np.array(["q", "r", "p"], dtype=object)
    got = run_kernel("LabelEncoder", [x], strings, opset=4, domain=ML)[0]
    np.testing.assert_array_equal(got, np.array([0.75, -0.0, 0.25]))
    assert got.dtype == np.float64


def test_label_encoder_nan_keys_repeated_keys_and_empty():
    attrs = {"keys_floats": [1.0, float("nan"), 1.0], "values_int64s": [1, 2, 3], "default_int64": 0}
    x = np.array([np.nan, 1.0, 2.0, -np.nan], np.float32)
    got = run_kernel("LabelEncoder", [x], attrs, opset=4, domain=ML)[0]
    np.testing.assert_array_equal(got, [2, 3, 0, 2])
    empty = run_kernel("LabelEncoder", [np.zeros((0, 2), np.int64)],
                       {"keys_int64s": [1], "values_int64s": [2]}, opset=2, domain=ML)[0]
    assert empty.shape == (0, 2)


def test_label_encoder_opset_1_both_directions():
    classes = {"classes_strings": ["cat", "dog", "eel"]}
    x = np.array(["dog", "cow", "cat"], dtype=object)
    got = run_kernel("LabelEncoder", [x], classes, opset=1, domain=ML)
    np.testing.assert_array_equal(got[0], [1, -1, 0])
    back = run_kernel("LabelEncoder", [np.array([2, 0, 7], np.int64)], dict(classes, default_string="none"),
                      opset=1, domain=ML)[0]
    assert back.tolist() == ["eel", "cat", "none"]


def test_label_encoder_rejects_unpaired_attributes():
    with pytest.raises(ShapeError, match="exactly one"):
        run_kernel("LabelEncoder", [WORDS], {"keys_strings": ["a"]}, opset=2, domain=ML)
    with pytest.raises(ShapeError, match="pair up"):
        run_kernel("LabelEncoder", [WORDS], {"keys_strings": ["a"], "values_int64s": [1, 2]}, opset=2,
                   domain=ML)


# ----------------------------------------------------------------------------- TreeEnsemble


def random_forest(n_trees: int, n_features: int, n_targets: int, depth: int, dtype: type,
                  member: bool = False, seed: int = 0) -> dict:
    """Trees in depth-first order (true branch first), as the membership_values order expects."""
    r = np.random.default_rng(seed)
    nodes: dict[str, list] = {k: [] for k in ("modes", "feat", "split", "tid", "fid", "tleaf", "fleaf",
                                              "nan")}
    leaves: dict[str, list] = {"w": [], "t": []}
    members: list[float] = []
    roots = []

    def new_leaf() -> int:
        leaves["w"].append(float(r.normal() * 10))
        leaves["t"].append(int(r.integers(n_targets)))
        return len(leaves["w"]) - 1

    def build(level: int) -> int:
        idx = len(nodes["modes"])
        mode = int(r.integers(7 if member else 6))
        for k, v in (("modes", mode), ("feat", int(r.integers(n_features))), ("split", float(r.normal())),
                     ("tid", 0), ("fid", 0), ("tleaf", 0), ("fleaf", 0), ("nan", int(r.integers(2)))):
            nodes[k].append(v)
        if mode == 6:
            # no 0.0 member: the reference stops reading a set at a falsy value
            members.extend(r.choice([-1.5, -0.7, -0.3, 0.2, 0.4, 1.1], 3).tolist() + [float("nan")])
        for side, leaf_key in (("tid", "tleaf"), ("fid", "fleaf")):
            if level + 1 >= depth or r.random() < 0.25:
                nodes[side][idx], nodes[leaf_key][idx] = new_leaf(), 1
            else:
                nodes[side][idx] = build(level + 1)
        return idx

    for _ in range(n_trees):
        roots.append(build(0))
    attrs = {"n_targets": n_targets, "tree_roots": roots, "nodes_modes": np.array(nodes["modes"], np.uint8),
             "nodes_featureids": nodes["feat"], "nodes_splits": np.array(nodes["split"], dtype),
             "nodes_truenodeids": nodes["tid"], "nodes_falsenodeids": nodes["fid"],
             "nodes_trueleafs": nodes["tleaf"], "nodes_falseleafs": nodes["fleaf"],
             "nodes_missing_value_tracks_true": nodes["nan"],
             "leaf_weights": np.array(leaves["w"], dtype), "leaf_targetids": leaves["t"]}
    if members:
        attrs["membership_values"] = np.array(members, dtype)
    return attrs


def tree_input(n: int, f: int, dtype: type) -> np.ndarray:
    x = np.round(rng.normal(size=(n, f)), 1).astype(dtype)
    x[rng.random(x.shape) < 0.1] = np.nan
    return x


@pytest.mark.parametrize("aggregate", [0, 1, 2, 3])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_tree_ensemble_aggregates(aggregate, dtype):
    attrs = dict(random_forest(5, 4, 3, 5, dtype, seed=aggregate), aggregate_function=aggregate)
    check("TreeEnsemble", [tree_input(40, 4, dtype)], attrs, 5, rtol=1e-5)


@settings(max_examples=15, deadline=None)
@given(st.integers(0, 10_000), st.integers(1, 6), st.integers(1, 6))
def test_tree_ensemble_random_forests_with_membership(seed, n_trees, depth):
    attrs = random_forest(n_trees, 3, 2, depth, np.float32, member=True, seed=seed)
    check("TreeEnsemble", [tree_input(25, 3, np.float32)], attrs, 5, rtol=1e-5)


@pytest.mark.parametrize("transform", [1, 2, 3])
def test_tree_ensemble_post_transforms(transform):
    attrs = random_forest(4, 3, 3, 3, np.float32, seed=7)
    x = tree_input(10, 3, np.float32)
    raw = run_kernel("TreeEnsemble", [x], attrs, opset=5, domain=ML)[0].astype(np.float64)
    got = run_kernel("TreeEnsemble", [x], dict(attrs, post_transform=transform), opset=5, domain=ML)[0]
    if transform == 2:
        want = 1 / (1 + np.exp(-raw))
    else:
        e = np.exp(raw - raw.max(axis=1, keepdims=True))
        if transform == 3:
            e[np.abs(raw) <= 1e-7] = 0
        want = e / e.sum(axis=1, keepdims=True)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)


def test_tree_ensemble_checks():
    attrs = random_forest(2, 3, 2, 3, np.float32)
    with pytest.raises(ShapeError, match="post_transform"):
        run_kernel("TreeEnsemble", [tree_input(2, 3, np.float32)], dict(attrs, post_transform=4), opset=5,
                   domain=ML)
    with pytest.raises(ShapeError, match=r"\[N, F\]"):
        run_kernel("TreeEnsemble", [np.zeros(3, np.float32)], attrs, opset=5, domain=ML)
    loop = dict(attrs, tree_roots=[0], nodes_truenodeids=[0] * len(attrs["nodes_truenodeids"]),
                nodes_trueleafs=[0] * len(attrs["nodes_truenodeids"]),
                nodes_modes=np.zeros(len(attrs["nodes_truenodeids"]), np.uint8),
                nodes_splits=np.full(len(attrs["nodes_truenodeids"]), 10, np.float32))
    with pytest.raises(KernelError, match="cycle"):
        run_kernel("TreeEnsemble", [np.zeros((1, 3), np.float32)], loop, opset=5, domain=ML)


# ----------------------------------------------------------------------------- small ops


@pytest.mark.parametrize("x,idx", [
    (np.arange(12, dtype=np.float32).reshape(3, 4), np.array([0, 3, 1], np.int64)),
    (np.arange(24, dtype=np.int64).reshape(2, 3, 4), np.array([[2], [2]], np.int64)),
    (np.arange(5, dtype=np.int32), np.array([4, 0], np.int64)),
    (np.array([["a", "b"], ["c", "d"]], dtype=object), np.array([1], np.int64)),
    (np.zeros((0, 4), np.float64), np.array([1, 2], np.int64)),
])
def test_array_feature_extractor(x, idx):
    check("ArrayFeatureExtractor", [x, idx], {}, 1)


def test_array_feature_extractor_index_out_of_range():
    with pytest.raises(KernelError, match="out of range"):
        run_kernel("ArrayFeatureExtractor", [np.zeros((2, 3), np.float32), np.array([3], np.int64)],
                   domain=ML)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64, np.int32])
@pytest.mark.parametrize("threshold", [None, 0.5, -1.0])
def test_binarizer(dtype, threshold):
    x = (rng.normal(size=(3, 4, 5)) * 3).astype(dtype)
    if np.dtype(dtype).kind == "f":
        x[0, 0, :2] = [np.nan, np.inf]
    check("Binarizer", [x], {} if threshold is None else {"threshold": threshold}, 1)
