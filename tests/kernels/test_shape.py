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


def test_concat_prefix_input():
    """Input 0 may already sit at the start of the output; run leaves it there."""
    k = lookup("Concat", 21)
    a, b = rand(1, 2, 3), rand(1, 4, 3)
    infos = [TensorInfo.of(a), TensorInfo.of(b)]
    for axis, want in ((1, 0), (0, 0), (2, None), (-2, 0)):
        ctx = OpContext({"axis": axis}, 21, name="c")
        assert k.prefix_input(ctx, infos, [sym(1, 6, 3)]) == want
    assert k.prefix_input(OpContext({"axis": 1}, 21), [None, infos[1]], [sym(1, 4, 3)]) is None
    ctx = OpContext({"axis": 1}, 21, name="c")
    outs = k.infer(ctx, infos)
    buf = np.empty((1, 6, 3), np.float32)
    grown = buf[:, :2]
    np.copyto(grown, a)
    k(ctx, infos, outs).run([buf[:, :2], b], [buf], None)
    np.testing.assert_array_equal(buf, np.concatenate([a, b], axis=1))


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
    assert [o.shape for o in infer("Split", [sym(6, 4)], opset=13)] == [(6, 4)]  # one declared output
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


# ----------------------------------------------------------------------------- generators, layout


@pytest.mark.parametrize("upper", [0, 1])
@pytest.mark.parametrize("k", [None, 0, 1, -1, 5, -5])
def test_trilu(upper, k):
    for x in (rand(4, 5), rand(2, 5, 3, dtype=np.int32), rand(3, 0)):
        check("Trilu", [x] + ([] if k is None else [np.array(k, np.int64)]), {"upper": upper},
              const=[])


def test_eye_like():
    for shape in ((3, 3), (2, 5), (5, 2), (0, 3)):
        for k in (0, 1, -1, 3, -6):
            check("EyeLike", [np.zeros(shape, np.int32)], {"k": k})
            check("EyeLike", [rand(*shape)], {"k": k, "dtype": 11}, opset=9)
    check("EyeLike", [rand(3, 3)], {"dtype": 9})
    with pytest.raises(ShapeError):
        infer("EyeLike", [sym(3)])


@pytest.mark.parametrize("mode", ["DCR", "CRD"])
def test_depth_to_space(mode):
    x = rand(2, 8, 3, 2)
    check("DepthToSpace", [x], {"blocksize": 2, "mode": mode})
    check("DepthToSpace", [x], {"blocksize": 2, "mode": mode}, opset=11)
    check("DepthToSpace", [x], {"blocksize": 1, "mode": mode})
    assert shapes("DepthToSpace", [sym("N", 8, "H", 2)], {"blocksize": 2}) == [("N", 2, None, 4)]
    with pytest.raises(ShapeError, match="divisible"):
        infer("DepthToSpace", [sym(1, 6, 2, 2)], {"blocksize": 2})


@pytest.mark.parametrize("mode", ["DCR", "CRD"])
def test_space_to_depth(mode):
    x = rand(2, 3, 4, 6)
    check("SpaceToDepth", [x], {"blocksize": 2, "mode": mode}, opset=28)
    check("SpaceToDepth", [x], {"blocksize": 2}, opset=13)
    assert shapes("SpaceToDepth", [sym("N", 3, 4, "W")], {"blocksize": 2}) == [("N", 12, 2, None)]
    with pytest.raises(ShapeError, match="4-D"):
        infer("SpaceToDepth", [sym(3, 4, 4)], {"blocksize": 2})


def test_reverse_sequence():
    x = rand(4, 3, 2)
    check("ReverseSequence", [x, ints(4, 1, 0)], {"time_axis": 0, "batch_axis": 1}, const=[])
    check("ReverseSequence", [x, ints(3, 2, 1, 3)], {"time_axis": 1, "batch_axis": 0}, const=[])
    check("ReverseSequence", [x.astype(np.int8), ints(2, 2, 2)], const=[])
    with pytest.raises(KernelError, match="outside"):
        run_kernel("ReverseSequence", [x, ints(5, 1, 1)], const=[])
    with pytest.raises(ShapeError, match="batch"):
        infer("ReverseSequence", [sym(4, 3), sym(2, dtype=I64)])


# ----------------------------------------------------------------------------- padding and cropping


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge", "wrap"])
def test_pad(mode):
    x = rand(3, 4)
    check("Pad", [x, ints(1, 2, 2, 0)], {"mode": mode}, opset=19)
    check("Pad", [x, ints(0, 3, 0, 3)], {"mode": mode}, opset=19)
    check("Pad", [x, ints(2, 1), None, ints(-1)], {"mode": mode}, opset=19)
    check("Pad", [x.astype(np.int32), ints(1, 1), None, ints(0)], {"mode": mode}, opset=21)
    if mode != "wrap":
        check("Pad", [x, ints(1, 2, 2, 0)], {"mode": mode}, opset=11)
        check("Pad", [x], {"mode": mode, "pads": [1, 2, 2, 0]}, opset=2)
        check("Pad", [x], {"mode": mode, "paddings": [0, 1, 1, 0]}, opset=1)


def test_pad_constant_value():
    x = rand(2, 3)
    check("Pad", [x, ints(1, 1, 1, 1), np.array(2.5, np.float32)])
    (y,) = run_kernel("Pad", [x, ints(1, 1, 1, 1), np.array([], np.float32)], const=[1])
    np.testing.assert_array_equal(y, np.pad(x, 1))
    check("Pad", [x], {"pads": [1, 0, 0, 1], "value": -1.0}, opset=2)
    check("Pad", [x > 0, ints(0, 2, 0, 1), np.array(True)])
    check("Pad", [np.zeros((0, 2), np.float32), ints(1, 0, 1, 0)])


def test_pad_negative():
    x = rand(4, 5)
    for mode in ("constant", "edge", "reflect", "wrap"):
        (y,) = run_kernel("Pad", [x, ints(-1, 2, 1, -2)], {"mode": mode})
        want = np.pad(x[1:, :3], [(0, 1), (2, 0)], mode=mode)
        np.testing.assert_array_equal(y, want)


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_pad_hypothesis(data):
    shape = data.draw(st.lists(st.integers(1, 4), min_size=1, max_size=3))
    mode = data.draw(st.sampled_from(["constant", "reflect", "edge", "wrap"]))
    pads = [data.draw(st.integers(0, 9)) for _ in range(2 * len(shape))]
    x = np.arange(int(np.prod(shape)), dtype=np.float64).reshape(shape)
    (y,) = run_kernel("Pad", [x, ints(*pads)], {"mode": mode})
    width = list(zip(pads[:len(shape)], pads[len(shape):]))
    np.testing.assert_array_equal(y, np.pad(x, width, mode=mode))


def test_pad_infer():
    assert shapes("Pad", [sym("N", 3), const(ints(0, 1, 0, 1))]) == [("N", 5)]
    assert shapes("Pad", [sym("N", 3), const(ints(1, 1, 0, 1))]) == [(None, 5)]
    assert shapes("Pad", [sym("N", 3), const(ints(2, 2)), None, const(ints(1))], opset=18) \
        == [("N", 7)]
    assert shapes("Pad", [sym("N", 3), sym(4, dtype=I64)]) == [(None, None)]
    with pytest.raises(ShapeError, match="2 pads"):
        infer("Pad", [sym(2, 3), const(ints(1, 1))])
    with pytest.raises(ShapeError, match="crops"):
        infer("Pad", [sym(2, 3), const(ints(-2, 0, -1, 0))])
    with pytest.raises(KernelError, match="reflect"):
        run_kernel("Pad", [rand(2, 3), ints(-2, 0, 1, 0)], {"mode": "reflect"})


@pytest.mark.parametrize("shape,axes", [((3, 6), None), ((5, 2), None), ((4,), [1]),
                                        ((7,), [-2]), ((2, 7), [0, 1]), ((3, 4), [1, 0])])
def test_center_crop_pad(shape, axes):
    x = rand(4, 5)
    attrs = {} if axes is None else {"axes": axes}
    check("CenterCropPad", [x, ints(*shape)], attrs, opset=18)
    check("CenterCropPad", [x.astype(np.int32), ints(*shape)], attrs, opset=18)


def test_center_crop_pad_infer():
    assert shapes("CenterCropPad", [sym("N", 5, 5), const(ints(3, 3))], {"axes": [1, 2]}) \
        == [("N", 3, 3)]
    assert shapes("CenterCropPad", [sym("N", 5), sym(2, dtype=I64)]) == [(None, None)]
    with pytest.raises(ShapeError, match="one non-negative"):
        infer("CenterCropPad", [sym(5, 5), const(ints(3))])


STRINGS = np.array([["a", "b", "c"], ["d", "e", "f"]], dtype=object)


@pytest.mark.parametrize("op,inputs,attrs", [
    ("Reshape", [STRINGS, ints(3, 2)], {}),
    ("Gather", [STRINGS, ints(1, 0)], {"axis": 1}),
    ("Concat", [STRINGS, STRINGS], {"axis": 0}),
    ("Transpose", [STRINGS], {}),
    ("Slice", [STRINGS, ints(1), ints(3), ints(1)], {}),
    ("Tile", [STRINGS, ints(1, 2)], {}),
    ("Expand", [STRINGS[:, :1], ints(2, 3)], {}),
    ("Compress", [STRINGS, np.array([True, False])], {"axis": 0}),
    ("Unique", [STRINGS.reshape(-1)], {}),
    ("ScatterND", [STRINGS, ints(0, 1).reshape(1, 2), np.array(["z"], dtype=object)], {}),
    ("GatherElements", [STRINGS, np.array([[0, 0], [1, 0]])], {"axis": 1}),
    ("ReverseSequence", [STRINGS, ints(2, 1, 0)], {}),
    ("Pad", [STRINGS, ints(1, 0, 0, 1)], {"mode": "edge"}),
])
def test_strings(op, inputs, attrs):
    for got, want in zip(run_kernel(op, inputs, attrs), reference(op, inputs, attrs)):
        assert got.shape == want.shape and got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)


def test_pad_strings_default_to_empty():
    """"constant_value ... defaults to 0, empty string, or False" (the reference pads with 0)."""
    (y,) = run_kernel("Pad", [STRINGS, ints(1, 0, 0, 0)])
    assert list(y[0]) == ["", "", ""] and y[1, 0] == "a"
