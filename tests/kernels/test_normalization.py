"""Normalization kernels against onnx.reference (and small numpy references where it is wrong)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from omrt.errors import ShapeError
from omrt.kernels import lookup
from tests.kernel_check import check, randn, reference, run_kernel


def bn_params(c: int, dtype: type = np.float32) -> list[np.ndarray]:
    return [randn(c, dtype=dtype), randn(c, dtype=dtype), randn(c, dtype=dtype),
            (np.abs(randn(c)) + 0.1).astype(dtype)]


# ----------------------------------------------------------------------------- BatchNormalization

@pytest.mark.parametrize("shape", [(2, 3), (2, 3, 5), (2, 3, 4, 5), (1, 4, 2, 3, 2)])
@pytest.mark.parametrize("opset", [14, 15])
def test_batchnorm_inference(shape, opset):
    check("BatchNormalization", [randn(*shape), *bn_params(shape[1])], {"epsilon": 1e-3}, opset=opset)


@pytest.mark.parametrize("dtype,tol", [(np.float64, 1e-12), (np.float16, 2e-2)])
def test_batchnorm_dtypes(dtype, tol):
    check("BatchNormalization", [randn(2, 3, 4, 4, dtype=dtype), *bn_params(3, dtype)],
          rtol=tol, atol=tol)


def manual_bn(x, s, b, m, v, eps=1e-5):
    shape = (-1,) + (1,) * (x.ndim - 2)
    return ((x - m.reshape(shape)) / np.sqrt(v.reshape(shape) + eps) * s.reshape(shape)
            + b.reshape(shape)).astype(x.dtype)


@pytest.mark.parametrize("opset,attrs", [(1, {"consumed_inputs": [0, 0, 0, 1, 1], "is_test": 0}),
                                         (6, {"is_test": 0, "spatial": 1}), (7, {"spatial": 1}),
                                         (9, {"momentum": 0.5})])
def test_batchnorm_old_opsets_run_inference(opset, attrs):
    x = randn(2, 3, 4, 4)
    params = bn_params(3)
    got = run_kernel("BatchNormalization", [x, *params], attrs, opset=opset)[0]
    np.testing.assert_allclose(got, manual_bn(x, *params), rtol=1e-5, atol=1e-5)
    check("BatchNormalization", [x, *params], {"is_test": 1}, opset=6)


def test_batchnorm_training_mode():
    x = randn(4, 3, 5, 5)
    check("BatchNormalization", [x, *bn_params(3)], {"training_mode": 1, "momentum": 0.8},
          opset=15, n_outputs=3, atol=1e-5)
    x16 = randn(4, 3, 5, dtype=np.float16)
    check("BatchNormalization", [x16, *bn_params(3, np.float16)], {"training_mode": 1},
          opset=15, n_outputs=3, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("attrs,n_outputs", [({}, 1), ({"training_mode": 1}, 3)])
def test_batchnorm_fused_relu(attrs, n_outputs):
    """A Relu fused into the node clamps Y, in inference and in training mode; the running
    statistics stay as they were."""
    inputs = [randn(4, 3, 5, 5), *bn_params(3)]
    want = reference("BatchNormalization", inputs, attrs, opset=15, n_outputs=n_outputs)
    got = run_kernel("BatchNormalization", inputs, {**attrs, "_act": "Relu"}, opset=15)
    np.testing.assert_allclose(got[0], np.maximum(want[0], 0), rtol=1e-5, atol=1e-5)
    assert (got[0] == 0).any()
    for g, w in zip(got[1:], want[1:]):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def test_batchnorm_rejects_training_outputs_in_inference():
    from omrt.kernels import OpContext, TensorInfo, lookup

    cls = lookup("BatchNormalization", 9)
    infos = [TensorInfo(np.dtype(np.float32), (1, 3, 2, 2))] + [TensorInfo(np.dtype(np.float32), (3,))] * 4
    out = TensorInfo(np.dtype(np.float32), (3,))
    with pytest.raises(ShapeError, match="training"):
        cls(OpContext({}, 9, name="bn"), infos, [infos[0], out, out])


def test_batchnorm_rejects_int_input():
    with pytest.raises(ShapeError, match="float"):
        run_kernel("BatchNormalization", [np.ones((1, 3, 2), np.int32)] + bn_params(3))


def test_batchnorm_empty_batch():
    check("BatchNormalization", [randn(0, 3, 4), *bn_params(3)])


# ----------------------------------------------------------------------------- LRN

def manual_lrn(x, size, alpha=1e-4, beta=0.75, bias=1.0):
    c = x.shape[1]
    sq = np.zeros_like(x, dtype=np.float64)
    for i in range(c):
        lo, hi = max(0, i - (size - 1) // 2), min(c - 1, i + -(-(size - 1) // 2))
        sq[:, i] = np.sum(x[:, lo:hi + 1].astype(np.float64) ** 2, axis=1)
    return (x / (bias + alpha / size * sq) ** beta).astype(x.dtype)


@pytest.mark.parametrize("size", [1, 2, 3, 4, 5, 9])
def test_lrn_sizes(size):
    x = randn(3, 7, 4, 5) * 3
    attrs = {"size": size, "alpha": 0.1, "beta": 0.6, "bias": 2.0}
    got = run_kernel("LRN", [x], attrs)[0]
    np.testing.assert_allclose(got, manual_lrn(x, size, 0.1, 0.6, 2.0), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("opset", [1, 13])
def test_lrn_against_reference(opset):
    check("LRN", [randn(5, 5, 3, 3)], {"size": 3}, opset=opset)


@pytest.mark.parametrize("shape", [(2, 6, 7), (1, 4, 2, 3, 3)])
def test_lrn_ranks_and_float16(shape):
    x = randn(*shape, dtype=np.float16)
    got = run_kernel("LRN", [x], {"size": 3, "alpha": 0.5})[0]
    np.testing.assert_allclose(got, manual_lrn(x, 3, 0.5), rtol=2e-3, atol=2e-3)


def test_lrn_needs_size():
    with pytest.raises(ShapeError, match="size"):
        run_kernel("LRN", [randn(1, 3, 2, 2)], {})


# ----------------------------------------------------------------------------- LayerNormalization

@settings(max_examples=25, deadline=None)
@given(shape=st.lists(st.integers(1, 5), min_size=1, max_size=4), data=st.data())
def test_layernorm_shapes_axes(shape, data):
    rank = len(shape)
    axis = data.draw(st.integers(-rank, rank - 1))
    norm_shape = tuple(shape[axis % rank:])
    scale_shape = data.draw(st.sampled_from([norm_shape, norm_shape[-1:], ()]))
    with_bias = data.draw(st.booleans())
    inputs = [randn(*shape), randn(*scale_shape)] + ([randn(*norm_shape)] if with_bias else [])
    check("LayerNormalization", inputs, {"axis": axis, "epsilon": 1e-3}, opset=17, n_outputs=3,
          atol=1e-5)


@pytest.mark.parametrize("dtype,tol", [(np.float64, 1e-6), (np.float16, 2e-2)])
def test_layernorm_dtypes_stash_float(dtype, tol):
    x = randn(3, 4, 8, dtype=dtype)
    y, mean, inv = run_kernel("LayerNormalization", [x, randn(8, dtype=dtype), randn(8, dtype=dtype)],
                              {}, opset=17)
    assert mean.dtype == inv.dtype == np.float32 and mean.shape == (3, 4, 1)
    check("LayerNormalization", [x, randn(8, dtype=dtype), randn(8, dtype=dtype)], opset=17,
          n_outputs=1, rtol=tol, atol=tol)


def test_layernorm_stash_double():
    x = randn(3, 10, dtype=np.float64)
    y, mean, inv = run_kernel("LayerNormalization", [x, randn(10, dtype=np.float64)],
                              {"stash_type": 11}, opset=17)
    assert mean.dtype == np.float64
    np.testing.assert_allclose(mean[:, 0], x.mean(1))
    np.testing.assert_allclose(inv[:, 0], 1 / np.sqrt(x.var(1) + 1e-5))


def test_layernorm_blas_rows():
    # transformer-sized rows, an offset mean, a row of NaN and one of inf; the statistics too
    x = randn(2, 64, 768) * 3 + 5
    x[0, 3] = np.nan
    x[1, 7, 10] = np.inf
    check("LayerNormalization", [x, randn(768), randn(768)], {"epsilon": 1e-12}, opset=17, n_outputs=3,
          rtol=1e-4, atol=1e-5)
    x64, scale = x.astype(np.float64), randn(768, dtype=np.float64)
    y, mean, inv = run_kernel("LayerNormalization", [x64, scale], {"stash_type": 11}, opset=17)
    with np.errstate(invalid="ignore"):
        centered = x64 - x64.mean(-1, keepdims=True)
        want = 1 / np.sqrt((centered ** 2).mean(-1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(inv, want, rtol=1e-12)
    np.testing.assert_allclose(y, centered * want * scale, rtol=1e-12, atol=1e-12)


def test_layernorm_empty_rows():
    check("LayerNormalization", [randn(0, 4), randn(4)], opset=17, n_outputs=1)


def test_layernorm_bad_axis():
    with pytest.raises(ShapeError):
        run_kernel("LayerNormalization", [randn(2, 3), randn(3)], {"axis": 2}, opset=17)


# ----------------------------------------------------------------------------- the other norms

@pytest.mark.parametrize("shape", [(2, 3, 5), (2, 3, 4, 5), (1, 2, 3, 2, 2)])
@pytest.mark.parametrize("opset", [1, 6])
def test_instancenorm(shape, opset):
    check("InstanceNormalization", [randn(*shape), randn(shape[1]), randn(shape[1])],
          {"epsilon": 1e-2}, opset=opset, atol=1e-5)


def test_instancenorm_float16():
    check("InstanceNormalization", [randn(2, 3, 9, dtype=np.float16), randn(3, dtype=np.float16),
                                    randn(3, dtype=np.float16)], rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("groups", [1, 2, 3, 6])
@pytest.mark.parametrize("opset", [18, 21])
def test_groupnorm(groups, opset):
    n = 6 if opset >= 21 else groups
    check("GroupNormalization", [randn(2, 6, 4, 3), randn(n), randn(n)],
          {"num_groups": groups, "epsilon": 1e-3}, opset=opset, atol=1e-5)


def test_groupnorm_rank2_and_float16():
    check("GroupNormalization", [randn(3, 4), randn(4), randn(4)], {"num_groups": 2}, opset=21,
          rtol=1e-4, atol=1e-4)
    check("GroupNormalization", [randn(2, 4, 5, dtype=np.float16), randn(4, dtype=np.float16),
                                 randn(4, dtype=np.float16)], {"num_groups": 2}, opset=21,
          rtol=2e-2, atol=2e-2)


def test_groupnorm_bad_groups():
    with pytest.raises(ShapeError, match="num_groups"):
        run_kernel("GroupNormalization", [randn(1, 6, 2), randn(6), randn(6)], {"num_groups": 4})


@pytest.mark.parametrize("axes", [None, [1], [0, -1], [2, 3], [0, 1, 2, 3]])
@pytest.mark.parametrize("opset", [9, 13])
def test_mvn(axes, opset):
    attrs = {} if axes is None else {"axes": axes}
    # the reference takes E[x^2] - E[x]^2, which cancels; omrt subtracts the mean first
    check("MeanVarianceNormalization", [randn(2, 3, 4, 5) * 2 + 1], attrs, opset=opset,
          rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("opset", [1, 22])
def test_lpnorm_p2(axis, opset):
    x = randn(3, 4, 5)
    x[1, 2] = 0
    check("LpNormalization", [x], {"axis": axis}, opset=opset)


def test_lpnorm_p1_uses_absolute_values():
    x = randn(3, 4)
    x[0] = 0
    got = run_kernel("LpNormalization", [x], {"p": 1, "axis": 1})[0]
    norm = np.abs(x).sum(1, keepdims=True)
    np.testing.assert_allclose(got, np.where(norm == 0, 0, x / np.where(norm == 0, 1, norm)),
                               rtol=1e-6)
    check("LpNormalization", [np.abs(x)], {"p": 1, "axis": 0})


def test_lpnorm_float16_and_bad_p():
    check("LpNormalization", [randn(4, 6, dtype=np.float16)], rtol=2e-3, atol=2e-3)
    with pytest.raises(ShapeError, match="p = 1 or 2"):
        run_kernel("LpNormalization", [randn(2, 2)], {"p": 3})


@pytest.mark.parametrize("axis,scale_shape", [(-1, (5,)), (2, (4, 5)), (0, (5,)), (-3, (3, 4, 5))])
def test_rmsnorm(axis, scale_shape):
    check("RMSNormalization", [randn(2, 3, 4, 5), randn(*scale_shape)], {"axis": axis}, opset=23,
          atol=1e-5)


@pytest.mark.parametrize("op,inputs,attrs", [
    ("BatchNormalization", [randn(2, 3, 4), randn(4), randn(3), randn(3), randn(3)], {}),
    ("InstanceNormalization", [randn(2, 3, 4), randn(3, 1), randn(3)], {}),
    ("GroupNormalization", [randn(2, 6, 4), randn(6), randn(6)], {"num_groups": 3}),
    ("LayerNormalization", [randn(2, 3, 4), randn(3, 4, 1)], {}),
    ("LayerNormalization", [randn(2, 3, 4), randn(5)], {}),
])
def test_parameter_shapes_are_checked(op, inputs, attrs):
    opset = 18 if op == "GroupNormalization" else 17
    with pytest.raises(ShapeError, match="shape"):
        run_kernel(op, inputs, attrs, opset=opset)


@pytest.mark.parametrize("op,opset", [("InstanceNormalization", 6), ("GroupNormalization", 18),
                                      ("GroupNormalization", 21), ("MeanVarianceNormalization", 13),
                                      ("LayerNormalization", 17), ("RMSNormalization", 23)])
def test_standardizing_kernels_are_not_view_aliases(op, opset):
    # the planner aliases output to input (and never runs the kernel) when `view` is truthy
    assert lookup(op, opset).view is False
