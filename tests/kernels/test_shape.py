"""Shape and indexing kernels: against onnx.reference, and shape inference with symbolic dims."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernel_check import check, reference, run_kernel  # noqa: E402
from onnx import numpy_helper  # noqa: E402

from omrt.errors import KernelError, ShapeError  # noqa: E402
from omrt.kernels import OpContext, TensorInfo, lookup  # noqa: E402

RNG = np.random.default_rng(0)
I64 = np.dtype(np.int64)
F32 = np.dtype(np.float32)


def rand(*shape: int, dtype=np.float32) -> np.ndarray:
    return RNG.standard_normal(shape).astype(dtype) if np.dtype(dtype).kind == "f" else \
        RNG.integers(-50, 50, shape).astype(dtype)


def ints(*v: int) -> np.ndarray:
    return np.array(v, np.int64)


def sym(*shape, dtype=F32) -> TensorInfo:
    return TensorInfo(np.dtype(dtype), tuple(shape))


def const(a) -> TensorInfo:
    return TensorInfo.of(np.asarray(a))


def infer(op: str, inputs, attrs=None, opset: int = 21) -> list[TensorInfo]:
    ctx = OpContext(dict(attrs or {}), opset, name="n0", op_type=op)
    return lookup(op, opset).infer(ctx, inputs)


def shapes(op: str, inputs, attrs=None, opset: int = 21) -> list[tuple]:
    return [o.shape for o in infer(op, inputs, attrs, opset)]


# ----------------------------------------------------------------------------- views


@pytest.mark.parametrize("opset", [5, 13, 14, 21])
@pytest.mark.parametrize("spec", [(2, 12), (0, -1), (-1,), (4, 0, 2, -1), (24,), (2, 3, 2, 2)])
def test_reshape(opset, spec):
    check("Reshape", [rand(2, 3, 4), ints(*spec)], opset=opset)


def test_reshape_attr_opset1():
    x = rand(2, 3, 4)
    (y,) = run_kernel("Reshape", [x], {"shape": [0, -1]}, opset=1)
    np.testing.assert_array_equal(y, x.reshape(2, 12))


def test_reshape_allowzero():
    check("Reshape", [rand(0, 3), ints(3, 0)], {"allowzero": 1}, opset=14)
    check("Reshape", [rand(2, 3, 4), ints(0, 12)], {"allowzero": 0}, opset=14)
    check("Reshape", [rand(1, 1), ints()], opset=14)
    with pytest.raises(ShapeError, match="allowzero"):
        infer("Reshape", [sym(0, 3), const(ints(0, -1))], {"allowzero": 1}, opset=14)


def test_reshape_dtypes():
    for dt in (np.int8, np.uint16, np.float16, np.float64, np.bool_, np.int64):
        check("Reshape", [rand(2, 6).astype(dt), ints(3, -1)])


def test_reshape_symbolic():
    assert shapes("Reshape", [sym("N", 3, 4), const(ints(0, -1))]) == [("N", 12)]
    assert shapes("Reshape", [sym("N", 3, 4), const(ints(-1, 4))]) == [(None, 4)]
    assert shapes("Reshape", [sym("N", 3, 4), const(ints(-1, 12))]) == [("N", 12)]
    assert shapes("Reshape", [sym("B", "S", 8), const(ints(0, 0, 2, 4))]) == [("B", "S", 2, 4)]
    assert shapes("Reshape", [sym("B", "S", 8), const(ints(0, 0, 2, -1))]) == [("B", "S", 2, 4)]
    assert shapes("Reshape", [sym("B", "S", 8), const(ints(-1, 8))]) == [(None, 8)]
    assert shapes("Reshape", [sym(None, 3), const(ints(-1,))]) == [(None,)]
    assert shapes("Reshape", [sym("N", 3), sym(dtype=I64, *(3,))]) == [(None, None, None)]
    with pytest.raises(ShapeError, match="n0"):
        infer("Reshape", [sym(2, 3), const(ints(4, -1))])
    with pytest.raises(ShapeError, match="more than one"):
        infer("Reshape", [sym(2, 3), const(ints(-1, -1))])
    with pytest.raises(ShapeError, match="counts must match"):
        infer("Reshape", [sym(2, 3), const(ints(5))])


def test_view_run_copies_and_aliases():
    x = rand(2, 3, 4)
    k = lookup("Reshape", 21)
    infos = [TensorInfo.of(x), const(ints(6, 4))]
    ctx = OpContext({}, 21, name="r")
    outs = k.infer(ctx, infos)
    kern = k(ctx, infos, outs)
    assert k.view
    out = np.empty((6, 4), np.float32)
    kern.run([x, ints(6, 4)], [out], None)
    np.testing.assert_array_equal(out, x.reshape(6, 4))
    alias = x.reshape(6, 4)
    kern.run([x, ints(6, 4)], [alias], None)
    np.testing.assert_array_equal(alias, out)


@pytest.mark.parametrize("axis", [0, 1, 2, 3, -1, -3])
def test_flatten(axis):
    check("Flatten", [rand(2, 3, 4)], {"axis": axis})


def test_flatten_opset9_and_symbolic():
    check("Flatten", [rand(2, 3, 4, 5)], opset=9)
    assert shapes("Flatten", [sym("N", 3, 4)]) == [("N", 12)]
    assert shapes("Flatten", [sym("N", 3, 4)], {"axis": 0}) == [(1, None)]
    assert shapes("Flatten", [sym(2, "N", 4)], {"axis": 2}) == [(None, 4)]
    assert shapes("Flatten", [sym(1, "N", 4)], {"axis": 2}) == [("N", 4)]
    with pytest.raises(ShapeError):
        infer("Flatten", [sym(2, 3)], {"axis": 3})


def test_squeeze():
    x = rand(1, 3, 1, 4)
    check("Squeeze", [x, ints(0)])
    check("Squeeze", [x, ints(-2, 0)])
    check("Squeeze", [x])
    check("Squeeze", [x], {"axes": [2]}, opset=11)
    check("Squeeze", [x], {"axes": [0, 2]}, opset=1)
    check("Squeeze", [x], opset=11)
    assert shapes("Squeeze", [sym("N", 1, 4), const(ints(1))]) == [("N", 4)]
    assert shapes("Squeeze", [sym("N", 1, 4)]) == [("N", 4)]
    assert shapes("Squeeze", [sym("N", 1, 4), sym(dtype=I64, *(1,))]) == [(None, None)]
    with pytest.raises(ShapeError, match="not 1"):
        infer("Squeeze", [sym(2, 3), const(ints(0))])


def test_unsqueeze():
    x = rand(3, 4)
    check("Unsqueeze", [x, ints(0)])
    check("Unsqueeze", [x, ints(-1, 0)])
    check("Unsqueeze", [x, ints(1, 3)])
    check("Unsqueeze", [np.float32(3.0).reshape(()), ints(0)])
    check("Unsqueeze", [x], {"axes": [0, -1]}, opset=11)
    check("Unsqueeze", [x], {"axes": [2]}, opset=1)
    assert shapes("Unsqueeze", [sym("N", 4), const(ints(1, -1))]) == [("N", 1, 4, 1)]
    with pytest.raises(ShapeError, match="repeat"):
        infer("Unsqueeze", [sym(3), const(ints(0, 0))])


def test_identity():
    check("Identity", [rand(2, 3)])
    check("Identity", [np.array([], np.int32)])
    assert shapes("Identity", [sym("N", 2)]) == [("N", 2)]


@pytest.mark.parametrize("opset", [7, 10, 12, 13, 22])
def test_dropout_inference(opset):
    x = rand(3, 4)
    check("Dropout", [x], opset=opset, n_outputs=2)
    check("Dropout", [x], {"ratio": 0.3} if opset < 12 else {}, opset=opset, n_outputs=1)


def test_dropout_inputs():
    x = rand(3, 4)
    check("Dropout", [x, np.array(0.3, np.float32), np.array(False)], n_outputs=2, const=[])
    y, mask = run_kernel("Dropout", [x, np.array(0.5, np.float32), np.array(True)], const=[])
    kept = y != 0
    np.testing.assert_allclose(y[mask], x[mask] * 2, rtol=1e-6)
    assert not kept[~mask].any()
    y, mask = run_kernel("Dropout", [x, np.array(0.0, np.float32), np.array(True)], const=[])
    np.testing.assert_array_equal(y, x)
    assert mask.all()
    assert [o.dtype for o in infer("Dropout", [sym("N", 3)])] == [F32, np.dtype(bool)]


# ----------------------------------------------------------------------------- shape arithmetic


@pytest.mark.parametrize("attrs", [{}, {"start": 1}, {"end": -1}, {"start": -2, "end": 10},
                                   {"start": -10}, {"start": 2, "end": 1}])
def test_shape(attrs):
    check("Shape", [rand(2, 3, 4)], attrs)


def test_shape_opset1_and_values():
    check("Shape", [rand(2, 3)], opset=1)
    check("Shape", [np.float32(1).reshape(())], opset=13)
    (info,) = infer("Shape", [sym(2, 3, 4)], {"start": 1})
    assert info.shape == (2,) and info.dtype == I64
    np.testing.assert_array_equal(info.value, [3, 4])
    (info,) = infer("Shape", [sym("N", 3, 4)])
    assert info.shape == (3,) and info.value is None
    (info,) = infer("Shape", [sym("N", 3, 4)], {"start": 1})
    np.testing.assert_array_equal(info.value, [3, 4])


def test_size():
    check("Size", [rand(2, 3, 4)])
    check("Size", [np.zeros((0, 3), np.int8)])
    (info,) = infer("Size", [sym(2, 3)])
    assert info.shape == () and int(info.value) == 6
    (info,) = infer("Size", [sym("N", 3)])
    assert info.value is None


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


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_concat(axis):
    a, b, c = rand(2, 3, 4), rand(2, 3, 4), rand(2, 3, 4)
    shape = list(a.shape)
    shape[axis] = 0
    check("Concat", [a, b, c], {"axis": axis})
    check("Concat", [a, np.zeros(shape, np.float32)], {"axis": axis})
    check("Concat", [a.astype(np.int64)], {"axis": axis})
    check("Concat", [a, b], {"axis": axis}, opset=4)


def test_concat_symbolic():
    assert shapes("Concat", [sym("N", 3), sym("N", 5)], {"axis": 1}) == [("N", 8)]
    assert shapes("Concat", [sym("N", 3), sym(2, 3)], {"axis": 1}) == [(2, 6)]
    assert shapes("Concat", [sym("N", 3), sym("M", 3)], {"axis": 0}) == [(None, 3)]
    assert shapes("Concat", [sym(2, dtype=I64), sym(1, dtype=I64)], {"axis": 0}) == [(3,)]
    with pytest.raises(ShapeError, match="axis 0"):
        infer("Concat", [sym(2, 3), sym(3, 3)], {"axis": 1})
    with pytest.raises(ShapeError, match="rank"):
        infer("Concat", [sym(2, 3), sym(3)], {"axis": 0})


@pytest.mark.parametrize("perm", [None, [0, 1, 2], [2, 0, 1], [1, 0, 2]])
def test_transpose(perm):
    attrs = {} if perm is None else {"perm": perm}
    check("Transpose", [rand(2, 3, 4)], attrs)
    check("Transpose", [rand(2, 3, 4, dtype=np.int16)], attrs, opset=13)


def test_transpose_symbolic():
    assert shapes("Transpose", [sym("N", 3, 4)], {"perm": [2, 0, 1]}) == [(4, "N", 3)]
    assert shapes("Transpose", [sym("N", 3)]) == [(3, "N")]
    with pytest.raises(ShapeError, match="permutation"):
        infer("Transpose", [sym(2, 3)], {"perm": [0, 0]})


def check_value_attr(op: str, inputs, value: np.ndarray, opset: int = 21) -> None:
    """check() for an op whose `value` attribute is a tensor (onnx wants a TensorProto there)."""
    (got,) = run_kernel(op, inputs, {"value": value}, opset)
    (want,) = reference(op, inputs, {"value": numpy_helper.from_array(value)}, opset)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)


def test_constant_of_shape():
    check("ConstantOfShape", [ints(2, 3)])
    check_value_attr("ConstantOfShape", [ints(2, 3)], np.array([7], np.int32))
    check_value_attr("ConstantOfShape", [ints(0)], np.array([1.5], np.float64))
    check_value_attr("ConstantOfShape", [ints()], np.array([True]), opset=9)
    assert shapes("ConstantOfShape", [sym(3, dtype=I64)]) == [(None, None, None)]
    (info,) = infer("ConstantOfShape", [const(ints(4))], {"value": np.array([2], np.int8)})
    assert info.dtype == np.int8 and info.shape == (4,)


def test_expand():
    check("Expand", [rand(3, 1), ints(2, 1, 4)])
    check("Expand", [rand(3, 1), ints(3, 1)])
    check("Expand", [rand(1), ints(1, 2)])
    check("Expand", [rand(2, 1, 1, dtype=np.int32), ints(4)])
    check("Expand", [np.float32(3).reshape(()), ints(2, 2)])
    assert shapes("Expand", [sym("N", 1), const(ints(1, 4))]) == [("N", 4)]
    assert shapes("Expand", [sym("N", 1), sym(3, dtype=I64)]) == [(None, "N", None)]
    with pytest.raises(ShapeError):
        infer("Expand", [sym(3, 2), const(ints(4, 2))])


@pytest.mark.parametrize("start,limit,delta", [(0, 10, 3), (10, 4, -2), (3, 3, 1), (5, 1, 1),
                                               (1.5, 7.25, 0.5), (-3.0, 2.0, 0.7)])
def test_range(start, limit, delta):
    for dt in ((np.int32, np.int64, np.int16) if isinstance(start, int) else
               (np.float32, np.float64)):
        args = [np.array(v, dt) for v in (start, limit, delta)]
        check("Range", args, const=[0, 1, 2], opset=11)
        check("Range", args, const=[0, 1, 2], opset=27)


def test_range_infer():
    assert shapes("Range", [const(np.int64(0)), sym(dtype=I64), const(np.int64(1))]) == [(None,)]
    assert shapes("Range", [const(np.float32(0)), const(np.float32(1)), const(np.float32(.25))]) \
        == [(4,)]
    with pytest.raises(ShapeError, match="delta"):
        infer("Range", [const(np.int64(0)), const(np.int64(3)), const(np.int64(0))])


def test_tile():
    check("Tile", [rand(2, 3), ints(2, 3)])
    check("Tile", [rand(2, 3, dtype=np.int64), ints(1, 0)])
    check("Tile", [rand(2, 1, 3), ints(1, 4, 2)], opset=6)
    assert shapes("Tile", [sym("N", 3), const(ints(1, 2))]) == [("N", 6)]
    assert shapes("Tile", [sym("N", 3), const(ints(2, 2))]) == [(None, 6)]
    assert shapes("Tile", [sym("N", 3), sym(2, dtype=I64)]) == [(None, None)]
    with pytest.raises(ShapeError):
        infer("Tile", [sym(2, 3), const(ints(2))])


def test_split():
    x = rand(6, 4)
    check("Split", [x, ints(2, 4)], n_outputs=2)
    check("Split", [x, ints(1, 1, 2)], {"axis": -1}, n_outputs=3)
    check("Split", [x], {"num_outputs": 3}, opset=18, n_outputs=3)
    check("Split", [rand(7, 2)], {"num_outputs": 3}, opset=18, n_outputs=3)
    check("Split", [x], {"split": [4, 2]}, opset=11, n_outputs=2)
    check("Split", [x, ints(0, 6)], opset=13, n_outputs=2)


def test_split_equal_before_18():
    x = rand(6, 4)
    outs = run_kernel("Split", [x], {"num_outputs": 2, "axis": 1}, opset=13)
    np.testing.assert_array_equal(outs[1], x[:, 2:])
    with pytest.raises(ShapeError, match="num_outputs"):
        infer("Split", [sym(6, 4)], opset=13)
    with pytest.raises(ShapeError, match="4 parts"):
        infer("Split", [sym(6)], {"num_outputs": 4}, opset=13)


def test_split_symbolic():
    assert shapes("Split", [sym("N", 6), const(ints(2, 4))], {"axis": 1}) == [("N", 2), ("N", 4)]
    assert shapes("Split", [sym("N", 6)], {"num_outputs": 2}, opset=18) == [(None, 6)] * 2
    assert shapes("Split", [sym(6), sym(3, dtype=I64)]) == [(None,)] * 3
    with pytest.raises(ShapeError, match="add up"):
        infer("Split", [sym(6), const(ints(2, 2))])


def test_shape_subgraph_folding():
    """Shape -> Gather -> Concat -> Reshape through infer and run, as the compiler folds it."""
    x = sym(2, 3, 4)
    (s,) = infer("Shape", [x])
    g = run_kernel("Gather", [s.value, ints(0)])[0]
    c = run_kernel("Concat", [g, ints(-1)], {"axis": 0})[0]
    assert shapes("Reshape", [x, const(c)]) == [(2, 12)]
    (s,) = infer("Shape", [sym("N", 3, 4)])
    (g,) = infer("Gather", [s, const(ints(0))])
    (c,) = infer("Concat", [g, const(ints(-1))], {"axis": 0})
    assert c.shape == (2,) and c.value is None
    assert shapes("Reshape", [sym("N", 3, 4), c]) == [(None, None)]
