"""Reduction kernels against onnx.reference: ReduceXxx, ArgMax/ArgMin, TopK, CumSum/CumProd, Softmax family."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from omrt.errors import ShapeError
from omrt.kernels import OpContext, TensorInfo, lookup
from tests.kernel_check import check, reference, run_kernel

rng = np.random.default_rng(0)

REDUCE_OPS = ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1",
              "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare"]
POSITIVE_ONLY = {"ReduceLogSum"}


def rand(shape, dtype=np.float32, positive=False):
    if np.dtype(dtype).kind in "iu":
        low = 1 if positive or np.dtype(dtype).kind == "u" else -4
        return rng.integers(low, 5, size=shape).astype(dtype)
    x = rng.standard_normal(shape).astype(dtype)
    return np.abs(x) + 0.1 if positive else x


def reduce_check(op, x, axes, keepdims=1, opset=21, noop=None, const=None):
    """Run op with axes given the way `opset` wants them (attribute, or input from 18/13)."""
    attrs = {"keepdims": keepdims}
    if noop is not None:
        attrs["noop_with_empty_axes"] = noop
    input_since = 13 if op == "ReduceSum" else 18
    inputs = [x]
    if opset >= input_since:
        inputs.append(None if axes is None else np.array(axes, np.int64))
    elif axes is not None:
        attrs["axes"] = list(axes)
    tol = 2e-3 if x.dtype == np.float16 else 1e-5
    return check(op, inputs, attrs, opset=opset, rtol=tol * 10, atol=tol, const=const)


# ----------------------------------------------------------------------------- ReduceXxx

@st.composite
def shape_and_axes(draw, min_dim=1):
    shape = tuple(draw(st.lists(st.integers(min_dim, 4), min_size=1, max_size=4)))
    axes = draw(st.none() | st.lists(st.integers(-len(shape), len(shape) - 1), max_size=len(shape),
                                     unique_by=lambda a: a % len(shape)))
    return shape, axes


@settings(max_examples=120, deadline=None)
@given(st.sampled_from(REDUCE_OPS), shape_and_axes(), st.sampled_from([0, 1]),
       st.sampled_from([11, 13, 18, 21]))
def test_reduce_float(op, shape_axes, keepdims, opset):
    shape, axes = shape_axes
    if axes == [] and opset < 18:
        axes = None
    reduce_check(op, rand(shape, positive=op in POSITIVE_ONLY), axes, keepdims, opset)


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd",
                                "ReduceL1", "ReduceSumSquare"])
@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint8, np.float64, np.float16])
def test_reduce_dtypes(op, dtype):
    x = rand((3, 4, 2), dtype)
    if op == "ReduceSumSquare" and dtype in (np.int32, np.uint8):
        # onnx.reference widens these to 64 bits; the spec keeps the input type.
        got = run_kernel(op, [x, np.array([1], np.int64)])[0]
        np.testing.assert_array_equal(got, (x * x).sum(axis=1, keepdims=True, dtype=dtype))
        return
    reduce_check(op, x, [1], 1)
    reduce_check(op, x, [0, -1], 0)


@pytest.mark.parametrize("op", REDUCE_OPS)
@pytest.mark.parametrize("noop", [0, 1])
def test_reduce_empty_axes(op, noop):
    x = rand((2, 3), positive=op in POSITIVE_ONLY)
    reduce_check(op, x, [], 1, noop=noop)
    reduce_check(op, x, None, 0, noop=noop)


@pytest.mark.filterwarnings("ignore:Mean of empty slice")
@pytest.mark.parametrize("op", REDUCE_OPS)
@pytest.mark.parametrize("keepdims", [0, 1])
def test_reduce_empty_set_gives_identity(op, keepdims):
    x = np.zeros((2, 0, 3), np.float32)
    with np.errstate(all="ignore"):
        got = reduce_check(op, x, [1], keepdims)[0]
    assert got.shape == ((2, 1, 3) if keepdims else (2, 3))


def test_reduce_max_min_empty_integers():
    x = np.zeros((0, 3), np.int32)
    got = run_kernel("ReduceMax", [x, np.array([0], np.int64)])[0]
    np.testing.assert_array_equal(got, np.full((1, 3), np.iinfo(np.int32).min))
    got = run_kernel("ReduceMin", [x, np.array([0], np.int64)])[0]
    np.testing.assert_array_equal(got, np.full((1, 3), np.iinfo(np.int32).max))


@pytest.mark.parametrize("op", ["ReduceMax", "ReduceMin"])
def test_reduce_max_min_bool(op):
    x = rng.random((3, 4)) > 0.5
    reduce_check(op, x, [1], 1, opset=20)


def test_reduce_log_sum_exp_is_stable():
    x = np.array([[1000.0, 1000.0], [-np.inf, -np.inf], [np.inf, 0.0]], np.float32)
    got = run_kernel("ReduceLogSumExp", [x, np.array([1], np.int64)])[0]
    np.testing.assert_allclose(got[:, 0], [1000 + np.log(2), -np.inf, np.inf], rtol=1e-6)


def run_unplanned(op, inputs, attrs, opset=21):
    """Plan with the second input's value unknown, then run with outputs of the real shapes."""
    cls = lookup(op, opset)
    ctx = OpContext(attrs, opset, name="test", op_type=op)
    infos = [TensorInfo(x.dtype, x.shape, x if i == 0 else None) for i, x in enumerate(inputs)]
    planned = cls.infer(ctx, infos)
    want = reference(op, inputs, attrs, opset, len(planned))
    outs = [np.empty(w.shape, w.dtype) for w in want]
    assert cls(ctx, infos, planned).run(inputs, outs, None) is None
    return [p.shape for p in planned], outs, want


@pytest.mark.parametrize("op", REDUCE_OPS)
@pytest.mark.parametrize("keepdims", [0, 1])
def test_reduce_axes_known_only_at_run_time(op, keepdims):
    x = rand((2, 3, 4), positive=True)
    planned, got, want = run_unplanned(op, [x, np.array([0, 2], np.int64)], {"keepdims": keepdims})
    assert planned == [(None,) * (3 if keepdims else 1)]
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-6)


def test_reduce_bad_axis():
    with pytest.raises(ShapeError, match="axis"):
        run_kernel("ReduceMean", [rand((2, 3)), np.array([2], np.int64)])
    with pytest.raises(ShapeError, match="axis"):
        run_kernel("ReduceMean", [rand((2, 3))], {"axes": [-3]}, opset=13)


# ----------------------------------------------------------------------------- ArgMax, ArgMin

@settings(max_examples=60, deadline=None)
@given(st.sampled_from(["ArgMax", "ArgMin"]), shape_and_axes(), st.sampled_from([0, 1]),
       st.sampled_from([0, 1]), st.sampled_from([np.float32, np.int32, np.uint8]))
def test_arg_reduce(op, shape_axes, keepdims, last, dtype):
    shape, axes = shape_axes
    axis = axes[0] if axes else 0
    x = rng.integers(0, 3, size=shape).astype(dtype)  # many ties
    check(op, [x], {"axis": axis, "keepdims": keepdims, "select_last_index": last})


@pytest.mark.parametrize("opset", [1, 11])
def test_arg_reduce_old_opsets(opset):
    check("ArgMax", [rand((3, 4))], {"axis": 1, "keepdims": 0}, opset=opset)
    check("ArgMin", [rand((3, 4))], opset=opset)


def test_arg_reduce_empty_axis():
    with pytest.raises(ShapeError, match="empty"):
        run_kernel("ArgMax", [np.zeros((2, 0), np.float32)], {"axis": 1})
    check("ArgMax", [np.zeros((0, 3), np.float32)], {"axis": 1})


# ----------------------------------------------------------------------------- TopK

@settings(max_examples=60, deadline=None)
@given(shape_and_axes(), st.data(), st.sampled_from([0, 1]),
       st.sampled_from([np.float32, np.int64, np.uint8]))
def test_topk(shape_axes, data, largest, dtype):
    shape, axes = shape_axes
    axis = axes[0] if axes else -1
    k = data.draw(st.integers(0, shape[axis]))
    x = rng.integers(0, 4, size=shape).astype(dtype)  # many ties
    check("TopK", [x, np.array([k], np.int64)], {"axis": axis, "largest": largest}, n_outputs=2)


@pytest.mark.parametrize("largest", [0, 1])
def test_topk_long_rows_few_k(largest):
    x = rand((3, 1000))
    check("TopK", [x, np.array([7], np.int64)], {"largest": largest}, n_outputs=2)
    ties = rng.integers(0, 50, size=(3, 1000)).astype(np.float32)
    check("TopK", [ties, np.array([7], np.int64)], {"largest": largest}, n_outputs=2)


@pytest.mark.parametrize("opset", [1, 10, 11])
def test_topk_old_opsets(opset):
    x = rand((3, 5))
    if opset < 10:
        check("TopK", [x], {"k": 2, "axis": 0}, opset=opset, n_outputs=2)
    else:
        check("TopK", [x, np.array([2], np.int64)], {"axis": 0}, opset=opset, n_outputs=2)


def test_topk_k_too_large():
    with pytest.raises(ShapeError, match="k=6"):
        run_kernel("TopK", [rand((3, 5)), np.array([6], np.int64)])


def test_topk_k_known_only_at_run_time():
    x = rand((5, 3))
    planned, got, want = run_unplanned("TopK", [x, np.array([2], np.int64)], {"axis": 0})
    assert planned == [(None, 3), (None, 3)]
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


# ----------------------------------------------------------------------------- CumSum, CumProd

@pytest.mark.parametrize("op, opset", [("CumSum", 11), ("CumSum", 14), ("CumProd", 26)])
@pytest.mark.parametrize("exclusive", [0, 1])
@pytest.mark.parametrize("reverse", [0, 1])
@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.int64])
def test_cumulative(op, opset, exclusive, reverse, axis, dtype):
    x = rand((3, 4, 2), dtype)
    attrs = {"exclusive": exclusive, "reverse": reverse}
    check(op, [x, np.array(axis, np.int32)], attrs, opset=opset, rtol=1e-5, atol=1e-5)


def test_cumulative_edge_cases():
    check("CumSum", [rand((3, 0)), np.array(1, np.int64)], {"exclusive": 1})
    check("CumSum", [rand((4,)), np.array(0, np.int64)], {"exclusive": 1, "reverse": 1})
    with pytest.raises(ShapeError, match="axis"):
        run_kernel("CumSum", [rand((3, 4)), np.array(2, np.int64)])


# ----------------------------------------------------------------------------- Softmax family

SOFTMAX_OPS = ["Softmax", "LogSoftmax", "Hardmax"]


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(SOFTMAX_OPS), shape_and_axes(), st.sampled_from([np.float32, np.float64]))
def test_softmax_family(op, shape_axes, dtype):
    shape, axes = shape_axes
    attrs = {"axis": axes[0]} if axes else {}
    check(op, [rand(shape, dtype) * 5], attrs, rtol=1e-5, atol=1e-6)


def _old_softmax(op, x, axis):
    """Opset 1..12: coerce to 2-D at `axis`, apply over the flattened trailing dims."""
    rows = x.reshape(int(np.prod(x.shape[:axis])), -1)
    if op == "Hardmax":
        y = np.zeros_like(rows)
        y[np.arange(len(rows)), rows.argmax(axis=1)] = 1
    else:
        e = np.exp(rows - rows.max(axis=1, keepdims=True))
        y = e / e.sum(axis=1, keepdims=True)
        if op == "LogSoftmax":
            y = np.log(y)
    return y.reshape(x.shape)


@pytest.mark.parametrize("op", SOFTMAX_OPS)
@pytest.mark.parametrize("opset", [1, 11])
@pytest.mark.parametrize("axis", [None, 0, 2, -1])
def test_softmax_family_coerced_to_2d(op, opset, axis):
    x = rand((2, 3, 4))
    attrs = {} if axis is None else {"axis": axis}
    got = run_kernel(op, [x], attrs, opset=opset)[0]
    want = _old_softmax(op, x, 1 if axis is None else axis % 3)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("op", SOFTMAX_OPS)
def test_softmax_family_edge_cases(op):
    check(op, [np.zeros((0, 3), np.float32)])
    check(op, [np.zeros((3, 0), np.float32)], {"axis": 0})
    check(op, [rand((2, 3), np.float16)], rtol=2e-3, atol=2e-3)
    check(op, [np.array([[1000.0, 1000.0, 990.0]], np.float32)])


@pytest.mark.filterwarnings("ignore:invalid value encountered")
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_softmax_rows_far_below_the_maximum_and_non_finite(dtype):
    x = rand((2, 12, 16, 128), dtype) * 4
    x[0, 0, 0] -= 50       # far below the tensor's maximum: redone with its own
    x[0, 1, :, 100:] = -10000   # an additive mask
    x[0, 2, 3] = -np.inf   # every entry masked: NaN, as x - max(x) is
    x[1, 5, 5, 7] = 1e4    # one huge entry: every other row underflows against it
    check("Softmax", [x], {"axis": -1}, opset=13, rtol=1e-5, atol=1e-6)
    for special in (np.nan, np.inf):
        y = x.copy()
        y[1, 0, 0, 0] = special
        check("Softmax", [y], {"axis": -1}, opset=13, rtol=1e-5, atol=1e-6)


def test_hardmax_picks_first_maximum():
    got = run_kernel("Hardmax", [np.array([[1, 3, 3, 0]], np.float32)])[0]
    np.testing.assert_array_equal(got, [[0, 1, 0, 0]])


# ----------------------------------------------------------------------------- losses

@pytest.mark.filterwarnings("ignore:invalid value encountered")
@pytest.mark.parametrize("op", ["NegativeLogLikelihoodLoss", "SoftmaxCrossEntropyLoss"])
@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize("shape", [(4, 3), (2, 3, 5), (2, 3, 2, 2)])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("ignore_index", [None, 1, -1])
def test_losses(op, reduction, shape, weighted, ignore_index):
    x = rand(shape)
    target = rng.integers(0, shape[1], size=(shape[0], *shape[2:])).astype(np.int64)
    if ignore_index is not None:
        target.flat[::3] = ignore_index
    attrs = {"reduction": reduction}
    if ignore_index is not None:
        attrs["ignore_index"] = ignore_index
    weight = rand((shape[1],), positive=True) if weighted else None
    if op == "NegativeLogLikelihoodLoss" and ignore_index == -1 and reduction == "mean" \
            and not weighted:
        # onnx.reference then averages over the ignored targets too; the spec does not.
        got = run_kernel(op, [x, target], attrs)[0]
        keep = target != -1
        picked = np.take_along_axis(x, np.where(keep, target, 0)[:, None], axis=1)[:, 0]
        np.testing.assert_allclose(got, -picked[keep].mean(), rtol=1e-5)
        return
    outputs = 2 if op == "SoftmaxCrossEntropyLoss" else 1
    check(op, [x, target, weight], attrs, n_outputs=outputs, const=[], rtol=1e-5, atol=1e-6)


def test_softmax_cross_entropy_without_log_prob_uses_workspace():
    x, target = rand((4, 5)), np.array([0, 4, 2, 1], np.int64)
    cls = lookup("SoftmaxCrossEntropyLoss", 13)
    ctx = OpContext({"reduction": "sum"}, 13, name="test")
    infos = [TensorInfo.of(x), TensorInfo.of(target)]
    kernel = cls(ctx, infos, cls.infer(ctx, infos)[:1])
    assert kernel.workspace() == x.nbytes
    out = np.empty((), np.float32)
    kernel.run([x, target], [out], np.zeros(x.nbytes, np.uint8))
    want = -np.log(np.exp(x) / np.exp(x).sum(1, keepdims=True))[np.arange(4), target].sum()
    np.testing.assert_allclose(out, want, rtol=1e-5)


def test_loss_bad_shapes():
    with pytest.raises(ShapeError, match="one rank lower"):
        run_kernel("NegativeLogLikelihoodLoss", [rand((4, 3)), np.zeros((4, 1), np.int64)])


@pytest.mark.parametrize("op", [*REDUCE_OPS, *SOFTMAX_OPS, "ArgMax", "TopK", "CumSum"])
def test_bfloat16(op):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    x = rand((3, 4, 5), positive=op in POSITIVE_ONLY).astype(ml_dtypes.bfloat16)
    second = {"TopK": np.array([2], np.int64), "CumSum": np.array(1, np.int64)}.get(
        op, np.array([1], np.int64) if op.startswith("Reduce") else None)
    inputs = [x] if second is None else [x, second]
    got = run_kernel(op, inputs)[0]
    want = reference(op, inputs)[0]
    assert got.dtype == want.dtype
    np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=2e-2, atol=2e-2)
