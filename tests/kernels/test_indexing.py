"""Indexing kernels (gather, slice, scatter, dynamic outputs): against onnx.reference, and shape inference with symbolic dims."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernel_check import check, reference, run_kernel  # noqa: E402
from shape_check import I64, RNG, const, infer, ints, rand, shapes, sym  # noqa: E402

from omrt.errors import KernelError, ShapeError  # noqa: E402
from omrt.kernels import lookup  # noqa: E402


# ----------------------------------------------------------------------------- gather and slice


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_gather(axis):
    x = rand(3, 4, 5)
    n = x.shape[axis]
    check("Gather", [x, ints(0, n - 1, -1, -n)], {"axis": axis})
    check("Gather", [x, np.array([[0, 1], [-1, 2]], np.int32)], {"axis": axis})
    check("Gather", [x, np.array(1, np.int64)], {"axis": axis})
    check("Gather", [x, np.zeros((0,), np.int64)], {"axis": axis})


def test_gather_errors_and_symbolic():
    assert shapes("Gather", [sym("N", 3), sym(2, 2, dtype=I64)], {"axis": 1}) == [("N", 2, 2)]
    assert shapes("Gather", [sym(4, dtype=I64), const(np.int64(0))]) == [()]
    with pytest.raises(KernelError, match="out of range"):
        run_kernel("Gather", [rand(3, 2), ints(3)])
    with pytest.raises(ShapeError):
        infer("Gather", [sym(3), sym(2, dtype=I64)], {"axis": 1})


@pytest.mark.parametrize("starts,ends,axes,steps", [
    ([0, 1], [2, 3], [0, 1], [1, 1]),
    ([1], [1000], [1], None),
    ([-1], [-1000], [2], [-1]),
    ([-2, 0], [2 ** 63 - 1, -1], [0, 2], [1, 2]),
    ([10], [-10], [-1], [-3]),
    ([0], [0], [0], None),
    ([-100], [100], [1], [2]),
    ([3], [1], [1], None),
])
def test_slice(starts, ends, axes, steps):
    x = rand(3, 4, 5)
    inputs = [x, ints(*starts), ints(*ends), ints(*axes)] + ([ints(*steps)] if steps else [])
    check("Slice", inputs)
    if axes == list(range(len(axes))):
        check("Slice", [x, ints(*starts), ints(*ends), None] + ([ints(*steps)] if steps else []))


def test_slice_opset1():
    x = rand(3, 4, 5)
    check("Slice", [x], {"starts": [1, 0], "ends": [3, -1], "axes": [0, 2]}, opset=1)
    check("Slice", [x], {"starts": [1], "ends": [1000]}, opset=1)
    check("Slice", [x, ints(1), ints(3)], opset=10)


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_slice_hypothesis(data):
    shape = data.draw(st.lists(st.integers(0, 5), min_size=1, max_size=4))
    x = np.arange(int(np.prod(shape)), dtype=np.int32).reshape(shape)
    axes = data.draw(st.lists(st.integers(-len(shape), len(shape) - 1), min_size=1,
                              max_size=len(shape), unique_by=lambda a: a % len(shape)))
    bound = st.integers(-8, 8) | st.sampled_from([2 ** 63 - 1, -(2 ** 63)])
    starts = [data.draw(bound) for _ in axes]
    ends = [data.draw(bound) for _ in axes]
    steps = [data.draw(st.sampled_from([1, 2, 3, -1, -2])) for _ in axes]
    check("Slice", [x, ints(*starts), ints(*ends), ints(*axes), ints(*steps)])


def test_slice_symbolic():
    x = sym("N", 8, "T")
    assert shapes("Slice", [x, const(ints(2)), const(ints(5)), const(ints(1))]) == [("N", 3, "T")]
    assert shapes("Slice", [x, const(ints(0)), const(ints(2 ** 63 - 1)), const(ints(2))]) \
        == [("N", 8, "T")]
    assert shapes("Slice", [x, const(ints(-1)), const(ints(-(2 ** 63))), const(ints(0)),
                            const(ints(-1))]) == [("N", 8, "T")]
    assert shapes("Slice", [x, const(ints(1)), const(ints(2 ** 63 - 1)), const(ints(2))]) \
        == [("N", 8, None)]
    unknown = sym(1, dtype=I64)
    assert shapes("Slice", [x, unknown, unknown, const(ints(1))]) == [("N", None, "T")]
    assert shapes("Slice", [x, unknown, unknown]) == [(None, 8, "T")]
    assert shapes("Slice", [x, unknown, unknown, unknown]) == [(None, None, None)]
    with pytest.raises(ShapeError, match="steps"):
        infer("Slice", [sym(3), const(ints(0)), const(ints(1)), const(ints(0)), const(ints(0))])


# ----------------------------------------------------------------------------- gather and scatter


@pytest.mark.parametrize("axis", [0, 1, 2])
def test_gather_elements(axis):
    x = rand(3, 4, 5)
    n = x.shape[axis]
    shape = list(x.shape)
    shape[axis] = 6
    idx = RNG.integers(-n, n, shape)
    check("GatherElements", [x, idx], {"axis": axis}, const=[])
    check("GatherElements", [x, idx.astype(np.int32)], {"axis": axis}, opset=11, const=[])
    np.testing.assert_array_equal(run_kernel("GatherElements", [x, idx], {"axis": axis - 3})[0],
                                  run_kernel("GatherElements", [x, idx], {"axis": axis})[0])
    with pytest.raises(KernelError, match="out of range"):
        run_kernel("GatherElements", [x, np.full(shape, n)], {"axis": axis})
    shape[axis] = 0
    check("GatherElements", [x, np.zeros(shape, np.int64)], {"axis": axis}, const=[])


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_gather_elements_hypothesis(data):
    """Indices may be smaller than data on the other axes too (the reference needs them equal)."""
    shape = data.draw(st.lists(st.integers(1, 4), min_size=1, max_size=4))
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    ishape = [data.draw(st.integers(0, d)) for d in shape]
    ishape[axis] = data.draw(st.integers(0, 5))
    x = np.arange(int(np.prod(shape)), dtype=np.int32).reshape(shape)
    n = shape[axis]
    idx = np.array(data.draw(st.lists(st.integers(-n, n - 1), min_size=int(np.prod(ishape)),
                                      max_size=int(np.prod(ishape)))), np.int64).reshape(ishape)
    (got,) = run_kernel("GatherElements", [x, idx], {"axis": axis}, const=[])
    window = x[tuple(slice(0, d) for d in ishape[:axis % len(shape)])]
    window = window[(Ellipsis,) + tuple(slice(0, d) for d in ishape[axis % len(shape) + 1:])] \
        if axis % len(shape) + 1 < len(shape) else window
    np.testing.assert_array_equal(got, np.take_along_axis(window, idx % n, axis=axis))


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "min", "max"])
@pytest.mark.parametrize("axis", [0, -1])
def test_scatter_elements(reduction, axis):
    x = rand(4, 5)
    idx = np.array([[1, -1, 0], [2, 0, 3]]) if axis == -1 else np.array([[1, 0, 2], [3, -4, 1]])
    if reduction == "none":
        idx = np.array([[1, -1, 0], [2, 0, 3]]) if axis == -1 else np.array([[1, 0, 2], [3, 2, 1]])
    upd = rand(2, 3)
    attrs = {"axis": axis} if reduction == "none" else {"axis": axis, "reduction": reduction}
    check("ScatterElements", [x, idx, upd], attrs, const=[])
    if reduction in ("none", "add", "mul"):
        check("ScatterElements", [x, idx, upd], attrs, opset=16, const=[])
    with pytest.raises(KernelError):
        run_kernel("ScatterElements", [x, np.full((2, 3), 9), upd], attrs, const=[])


def test_scatter_elements_duplicates_and_dtypes():
    x = np.zeros(5, np.int64)
    idx = np.array([1, 1, 3, 1])
    upd = np.array([1, 2, 3, 4], np.int64)
    check("ScatterElements", [x, idx, upd], {"reduction": "add"}, const=[])
    check("ScatterElements", [x.astype(np.float16), idx, upd.astype(np.float16)],
          {"reduction": "max"}, const=[])
    check("ScatterElements", [x, np.zeros(0, np.int64), np.zeros(0, np.int64)], const=[])
    args = [rand(3, 3), np.array([[1, 0, 2]]), rand(1, 3)]
    (got,) = run_kernel("Scatter", args, {"axis": 0}, opset=10, const=[])
    (want,) = reference("ScatterElements", args, {"axis": 0}, opset=11)
    np.testing.assert_array_equal(got, want)
    with pytest.raises(ShapeError, match="one shape"):
        infer("ScatterElements", [sym(3, 3), sym(2, 3, dtype=I64), sym(3, 3)])


@pytest.mark.parametrize("batch_dims", [0, 1])
def test_gather_nd(batch_dims):
    x = rand(2, 3, 4)
    for idx in ([[[0, 1], [1, -1]], [[1, 2], [0, 0]]], [[[1]], [[0]]], [[[0, 2, 3]], [[1, -1, -1]]]):
        idx = np.array(idx, np.int64)
        if batch_dims + idx.shape[-1] > x.ndim:
            continue
        if batch_dims:
            idx = idx % np.array(x.shape[1:1 + idx.shape[-1]])
        check("GatherND", [x, idx], {"batch_dims": batch_dims}, const=[])
    check("GatherND", [x, np.array([[1], [0]])], opset=11, const=[])
    check("GatherND", [x.astype(np.int32), np.zeros((0, 2), np.int64)], const=[])


def test_gather_nd_infer():
    assert shapes("GatherND", [sym("N", 3, 4), sym("N", 5, 1, dtype=I64)], {"batch_dims": 1}) \
        == [("N", 5, 4)]
    assert shapes("GatherND", [sym(2, 3, 4), sym(6, 2, dtype=I64)]) == [(6, 4)]
    with pytest.raises(ShapeError, match="exceed"):
        infer("GatherND", [sym(2, 3), sym(1, 3, dtype=I64)])
    with pytest.raises(ShapeError, match="batch"):
        infer("GatherND", [sym(2, 3), sym(3, 1, dtype=I64)], {"batch_dims": 1})
    with pytest.raises(KernelError):
        run_kernel("GatherND", [rand(2, 3), np.array([[0, 3]])], const=[])


@pytest.mark.parametrize("reduction,opset", [("none", 11), ("none", 21), ("add", 16), ("mul", 16),
                                             ("min", 18), ("max", 18)])
def test_scatter_nd(reduction, opset):
    x = rand(4, 3, 2)
    attrs = {} if reduction == "none" else {"reduction": reduction}
    dup = reduction != "none"
    check("ScatterND", [x, np.array([[1], [-1]] + ([[1]] if dup else [])),
                        rand(3 if dup else 2, 3, 2)], attrs, opset=opset, const=[])
    check("ScatterND", [x, np.array([[0, 1], [3, 2]]), rand(2, 2)], attrs, opset=opset, const=[])
    check("ScatterND", [x, np.array([[0, 1, 1]]), rand(1)], attrs, opset=opset, const=[])


def test_scatter_nd_errors():
    with pytest.raises(ShapeError, match="updates"):
        infer("ScatterND", [sym(4, 3), sym(2, 1, dtype=I64), sym(2, 4)])
    with pytest.raises(KernelError, match="reduction"):
        run_kernel("ScatterND", [rand(4), np.array([[1]]), rand(1)], {"reduction": "sub"}, const=[])


@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_one_hot(axis):
    idx = np.array([[0, 2, -1], [5, -4, 1]])
    for opset in (9, 11):
        check("OneHot", [idx, np.array(4, np.int64), np.array([0, 1], np.float32)],
              {"axis": axis}, opset=opset)
    check("OneHot", [idx.astype(np.float32), np.array(3.0, np.float32), np.array([2, 7], np.int32)],
          {"axis": axis}, const=[1])
    assert shapes("OneHot", [sym("N", 3, dtype=I64), sym(dtype=I64), sym(2)], {"axis": axis}) \
        == [(("N", 3, None), (None, "N", 3), ("N", None, 3))[axis + 1]]


# ----------------------------------------------------------------------------- dynamic outputs


def test_non_zero():
    check("NonZero", [np.array([[1, 0, 3], [0, 0, 2]], np.int32)])
    check("NonZero", [rand(2, 3, 2) > 0])
    check("NonZero", [np.zeros((0, 3), np.float32)])
    check("NonZero", [np.array(5.0, np.float32)])
    assert lookup("NonZero", 13).dynamic
    assert shapes("NonZero", [sym("N", 3)]) == [(2, None)]


@pytest.mark.parametrize("axis", [None, 0, 1, -1])
def test_compress(axis):
    x = rand(3, 4)
    attrs = {} if axis is None else {"axis": axis}
    for cond in ([True, False, True], [False, True], [], [True] * 3):
        check("Compress", [x, np.array(cond, bool)], attrs, const=[])
    info, = infer("Compress", [sym(3, 4), const(np.array([True, False, True]))], attrs)
    assert info.shape == ((2,) if axis is None else (2, 4) if axis == 0 else (3, 2))
    with pytest.raises(ShapeError, match="longer"):
        run_kernel("Compress", [x, np.ones(13, bool)], attrs, const=[])


@pytest.mark.parametrize("sorted_", [0, 1])
def test_unique(sorted_):
    x = np.array([2, 1, 1, 3, 4, 3, 2, 2], np.int64)
    check("Unique", [x], {"sorted": sorted_}, n_outputs=4)
    check("Unique", [np.round(rand(12))], {"sorted": sorted_}, n_outputs=4)
    check("Unique", [np.zeros(0, np.float32)], {"sorted": sorted_}, n_outputs=4)
    m = np.array([[1, 0, 0], [1, 0, 0], [2, 3, 4], [0, 1, 1]], np.float32)
    check("Unique", [m], {"sorted": sorted_, "axis": 0}, n_outputs=4)
    # Without axis the input is flattened (the reference forgets to when unsorted).
    for got, flat in zip(run_kernel("Unique", [m], {"sorted": sorted_}),
                         run_kernel("Unique", [m.reshape(-1)], {"sorted": sorted_})):
        np.testing.assert_array_equal(got, flat)


def test_unique_unsorted_axis1():
    """The reference takes unsorted rows along axis 0 whatever the axis; check numpy-style here."""
    x = np.array([[[1., 1.], [0., 1.], [2., 1.], [0., 1.]]] * 2, np.float32)
    y, first, inverse, counts = run_kernel("Unique", [x], {"sorted": 0, "axis": 1})
    np.testing.assert_array_equal(y, x[:, [0, 1, 2]])
    np.testing.assert_array_equal(first, [0, 1, 2])
    np.testing.assert_array_equal(inverse, [0, 1, 2, 1])
    np.testing.assert_array_equal(counts, [1, 2, 1])
    y, first, inverse, counts = run_kernel("Unique", [x], {"sorted": 1, "axis": -2})
    np.testing.assert_array_equal(y, x[:, [1, 0, 2]])
    np.testing.assert_array_equal(inverse, [1, 0, 2, 0])
    assert shapes("Unique", [sym("N", 4)], {"axis": 1}) == [("N", None), (None,), (4,), (None,)]
    assert shapes("Unique", [sym(3, 4)]) == [(None,), (None,), (12,), (None,)]
