"""Linear-algebra kernels against onnx.reference: MatMul, Gemm, FusedMatMul, Einsum, Det."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.kernel_check import check, reference, run_kernel
from omrt.errors import ShapeError

rng = np.random.default_rng(0)


def rand(shape, dtype=np.float32):
    if np.dtype(dtype).kind in "iu":
        return rng.integers(-5 if np.dtype(dtype).kind == "i" else 0, 6, size=shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


# ----------------------------------------------------------------------------- MatMul

@st.composite
def matmul_shapes(draw):
    m, k, n = (draw(st.integers(1, 5)) for _ in range(3))
    batch = draw(st.lists(st.integers(1, 3), max_size=2))
    a_batch = [draw(st.sampled_from([d, 1])) for d in batch][draw(st.integers(0, len(batch))):]
    b_batch = [draw(st.sampled_from([d, 1])) for d in batch][draw(st.integers(0, len(batch))):]
    a = [k] if draw(st.booleans()) and not a_batch else [*a_batch, m, k]
    b = [k] if draw(st.booleans()) and not b_batch else [*b_batch, k, n]
    return tuple(a), tuple(b)


@settings(max_examples=60, deadline=None)
@given(matmul_shapes(), st.sampled_from([np.float32, np.float64, np.int32, np.int64]))
def test_matmul_shapes(shapes, dtype):
    check("MatMul", [rand(shapes[0], dtype), rand(shapes[1], dtype)], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("opset", [1, 9, 13])
def test_matmul_opsets(opset):
    check("MatMul", [rand((2, 3, 4)), rand((4, 5))], opset=opset, rtol=1e-5, atol=1e-5)


def test_matmul_batch_folded_into_one_gemm():
    a, b = rand((3, 7, 8)), rand((8, 5))
    check("MatMul", [a, b], rtol=1e-5, atol=1e-5)
    check("MatMul", [rand((2, 3, 1, 8)), b], rtol=1e-5, atol=1e-5)
    check("MatMul", [a, rand((8,))], rtol=1e-5, atol=1e-5)
    check("MatMul", [a[:, :, ::2], rand((4, 3))], rtol=1e-5, atol=1e-5)


def test_matmul_float16_widened():
    a, b = rand((2, 16, 32), np.float16), rand((2, 32, 8), np.float16)
    got = run_kernel("MatMul", [a, b])[0]
    assert got.dtype == np.float16
    want = np.matmul(a.astype(np.float32), b.astype(np.float32))
    np.testing.assert_allclose(got.astype(np.float32), want, rtol=2e-3, atol=2e-3)


def test_matmul_empty():
    check("MatMul", [rand((0, 4)), rand((4, 3))])
    got = run_kernel("MatMul", [rand((2, 0)), rand((0, 3))])[0]
    np.testing.assert_array_equal(got, np.zeros((2, 3), np.float32))


@pytest.mark.parametrize("act, alpha, beta, fn", [
    ("Relu", None, None, lambda y: np.maximum(y, 0)),
    ("LeakyRelu", 0.1, None, lambda y: np.where(y < 0, 0.1 * y, y)),
    ("Clip", -0.5, 0.5, lambda y: np.clip(y, -0.5, 0.5)),
    ("Sigmoid", None, None, lambda y: 1 / (1 + np.exp(-y))),
    ("Tanh", None, None, np.tanh),
    ("HardSigmoid", 0.2, 0.5, lambda y: np.clip(0.2 * y + 0.5, 0, 1)),
])
def test_matmul_fused_activation(act, alpha, beta, fn):
    a, b = rand((3, 4)), rand((4, 5))
    got = run_kernel("MatMul", [a, b], {"_act": act, "_act_alpha": alpha, "_act_beta": beta})[0]
    np.testing.assert_allclose(got, fn(a @ b), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("a, b", [((2, 3), (4, 5)), ((3,), (4,)), ((2, 2, 3), (3, 3, 4))])
def test_matmul_bad_shapes(a, b):
    with pytest.raises(ShapeError, match="test"):
        run_kernel("MatMul", [rand(a), rand(b)])


@pytest.mark.parametrize("op, attrs", [("MatMul", {}), ("Gemm", {}), ("Einsum", {"equation": "ij,jk"})])
def test_mixed_dtypes_rejected(op, attrs):
    with pytest.raises(ShapeError, match="Cast"):
        run_kernel(op, [rand((2, 3)), rand((3, 4), np.float64)], attrs)


# ----------------------------------------------------------------------------- FusedMatMul

@pytest.mark.parametrize("a, b, bias", [((3, 4), (4, 5), (5,)), ((2, 3, 4), (4, 5), (5,)),
                                        ((2, 3, 4), (2, 4, 5), (1, 5)), ((4,), (4, 5), (5,))])
def test_fused_matmul(a, b, bias):
    x, w, c = rand(a), rand(b), rand(bias)
    got = run_kernel("FusedMatMul", [x, w, c], domain="omrt")[0]
    np.testing.assert_allclose(got, x @ w + c, rtol=1e-5, atol=1e-6)
    got = run_kernel("FusedMatMul", [x, w, c], {"_act": "Relu"}, domain="omrt")[0]
    np.testing.assert_allclose(got, np.maximum(x @ w + c, 0), rtol=1e-5, atol=1e-6)


def test_fused_matmul_bias_must_not_grow_output():
    with pytest.raises(ShapeError, match="bias"):
        run_kernel("FusedMatMul", [rand((3, 4)), rand((4, 5)), rand((2, 3, 5))], domain="omrt")


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_folded_transposes_read_and_write_strided_views(dtype):
    # attention's layout: heads split from (batch, seq, heads, size); scores, then context back
    q, k, v = (rand((2, 16, 3, 8), dtype) for _ in range(3))
    heads = (0, 2, 1, 3)
    tol = {"rtol": 1e-5, "atol": 1e-5} if dtype == np.float32 else {"rtol": 1e-2, "atol": 1e-2}
    want = q.transpose(heads) @ k.transpose(0, 2, 3, 1)
    got = run_kernel("MatMul", [q, k], {"_perm_a": list(heads), "_perm_b": [0, 2, 3, 1]})[0]
    np.testing.assert_allclose(got, want, **tol)
    p, bias = rand((2, 3, 16, 16), dtype), rand((8,), dtype)
    want = (p @ v.transpose(heads) + bias).transpose(heads)
    got = run_kernel("FusedMatMul", [p, v, bias], {"_perm_b": list(heads), "_perm_y": list(heads)},
                     domain="omrt")[0]
    assert got.shape == (2, 16, 3, 8)
    np.testing.assert_allclose(got, want, **tol)
    with pytest.raises(ShapeError, match="permutation"):
        run_kernel("MatMul", [q, k], {"_perm_a": [0, 1, 2]})


# ----------------------------------------------------------------------------- Gemm

@pytest.mark.parametrize("trans_a", [0, 1])
@pytest.mark.parametrize("trans_b", [0, 1])
@pytest.mark.parametrize("c_shape", [None, (), (5,), (1, 5), (3, 1), (3, 5)])
def test_gemm(trans_a, trans_b, c_shape):
    a = rand((4, 3) if trans_a else (3, 4))
    b = rand((5, 4) if trans_b else (4, 5))
    c = None if c_shape is None else rand(c_shape)
    attrs = {"transA": trans_a, "transB": trans_b}
    check("Gemm", [a, b, c], attrs, rtol=1e-5, atol=1e-5)
    check("Gemm", [a, b, c], {**attrs, "alpha": 0.5, "beta": 2.0}, rtol=1e-5, atol=1e-5)
    check("Gemm", [a, b, c], {**attrs, "alpha": 3.0, "beta": 0.0}, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("opset", [6, 7, 9, 11, 13])
def test_gemm_opsets(opset):
    # onnx.reference drops beta when opset < 7 and broadcast=0, so beta is only varied later.
    attrs = {"alpha": 2.0} if opset < 7 else {"beta": 0.5}
    check("Gemm", [rand((3, 4)), rand((4, 5)), rand((3, 5))], attrs, opset=opset,
          rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [np.float64, np.int32, np.int64])
def test_gemm_dtypes(dtype):
    check("Gemm", [rand((3, 4), dtype), rand((4, 5), dtype), rand((5,), dtype)])


def test_gemm_float16():
    a, b, c = rand((8, 16), np.float16), rand((16, 4), np.float16), rand((4,), np.float16)
    got = run_kernel("Gemm", [a, b, c], {"alpha": 0.5})[0]
    want = 0.5 * (a.astype(np.float32) @ b.astype(np.float32)) + c
    np.testing.assert_allclose(got.astype(np.float32), want, rtol=3e-3, atol=3e-3)


def test_gemm_fused_activation():
    a, b, c = rand((3, 4)), rand((4, 5)), rand((5,))
    got = run_kernel("Gemm", [a, b, c], {"_act": "Clip", "_act_alpha": 0.0, "_act_beta": 1.0})[0]
    np.testing.assert_allclose(got, np.clip(a @ b + c, 0, 1), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("a, b, c, attrs", [
    ((3, 4), (5, 6), None, {}),
    ((3, 4), (5, 4), None, {}),
    ((3, 4), (4, 5), (2, 5), {}),
    ((3, 4, 1), (4, 5), None, {}),
])
def test_gemm_bad_shapes(a, b, c, attrs):
    with pytest.raises(ShapeError, match="test"):
        run_kernel("Gemm", [rand(a), rand(b), None if c is None else rand(c)], attrs)


# ----------------------------------------------------------------------------- Einsum

@pytest.mark.parametrize("equation, shapes", [
    ("ij,jk->ik", [(3, 4), (4, 5)]),
    ("ij,jk", [(3, 4), (4, 5)]),
    ("bij, bjk -> bik", [(2, 3, 4), (2, 4, 5)]),
    ("...ij,...jk->...ik", [(2, 3, 4), (4, 5)]),
    ("...ij,...jk", [(1, 3, 4), (2, 4, 5)]),
    ("ii->i", [(4, 4)]),
    ("ii", [(4, 4)]),
    ("ij->ji", [(3, 4)]),
    ("ij->", [(3, 4)]),
    ("i,i", [(5,), (5,)]),
    ("i,j->ij", [(3,), (4,)]),
    ("ij,jk,kl->il", [(3, 4), (4, 5), (5, 2)]),
    ("bhqd,bhkd->bhqk", [(2, 2, 3, 4), (2, 2, 5, 4)]),
    ("Ab,bC->AC", [(2, 3), (3, 4)]),
    ("...", [(2, 3)]),
])
def test_einsum(equation, shapes):
    check("Einsum", [rand(s) for s in shapes], {"equation": equation}, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [np.float64, np.int32, np.int64])
def test_einsum_dtypes(dtype):
    check("Einsum", [rand((3, 4), dtype), rand((4, 5), dtype)], {"equation": "ij,jk->ik"})


def test_einsum_float16_widened():
    a, b = rand((3, 8), np.float16), rand((8, 5), np.float16)
    got = run_kernel("Einsum", [a, b], {"equation": "ij,jk->ik"})[0]
    np.testing.assert_allclose(got.astype(np.float32), a.astype(np.float32) @ b.astype(np.float32),
                               rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("equation, shapes", [("ij,jk->ik", [(3, 4), (5, 6)]),
                                              ("ijk->i", [(3, 4)]), ("ij->iz", [(3, 4)])])
def test_einsum_bad(equation, shapes):
    with pytest.raises(ShapeError, match="test"):
        run_kernel("Einsum", [rand(s) for s in shapes], {"equation": equation})


# ----------------------------------------------------------------------------- Det

@pytest.mark.parametrize("shape", [(3, 3), (2, 4, 4), (2, 1, 2, 2), (0, 3, 3)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_det(shape, dtype):
    check("Det", [rand(shape, dtype)], rtol=1e-4, atol=1e-5)


def test_det_not_square():
    with pytest.raises(ShapeError, match="square"):
        run_kernel("Det", [rand((3, 4))])


@pytest.mark.parametrize("op, shapes, attrs", [
    ("MatMul", [(2, 3, 8), (8, 4)], {}),
    ("Gemm", [(3, 8), (4, 8), (4,)], {"transB": 1}),
    ("Einsum", [(3, 8), (8, 4)], {"equation": "ij,jk->ik"}),
])
def test_bfloat16_widened(op, shapes, attrs):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    inputs = [rand(s).astype(ml_dtypes.bfloat16) for s in shapes]
    got = run_kernel(op, inputs, attrs)[0]
    want = reference(op, inputs, attrs)[0]
    assert got.dtype == want.dtype
    np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=2e-2, atol=5e-2)
