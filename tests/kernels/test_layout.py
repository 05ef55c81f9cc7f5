"""Layout kernels (joining, cutting, repeating, block moves, padding and cropping): against onnx.reference, and shape inference with symbolic dims."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernel_check import check, run_kernel  # noqa: E402
from shape_check import I64, const, infer, ints, rand, shapes, sym  # noqa: E402

from omrt.errors import KernelError, ShapeError  # noqa: E402
from omrt.kernels import OpContext, TensorInfo, lookup  # noqa: E402


# ----------------------------------------------------------------------------- joining, cutting, repeating


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


def test_concat_input_offsets():
    """Where all dims before the axis are 1, every input may already sit at its slice of the
    output (byte offsets); run then leaves it there, and writes only the inputs that are not."""
    k = lookup("Concat", 21)
    a, b = rand(1, 2, 3), rand(1, 4, 3)
    infos = [TensorInfo.of(a), TensorInfo.of(b)]
    for axis, want in ((1, {0: 0, 1: 24}), (0, {0: 0, 1: 24}), (2, {}), (-2, {0: 0, 1: 24})):
        ctx = OpContext({"axis": axis}, 21, name="c")
        assert k.input_offsets(ctx, infos, [sym(1, 6, 3)]) == want
    assert k.input_offsets(OpContext({"axis": 1}, 21), [None, infos[1]], [sym(1, 4, 3)]) == {1: 0}
    ctx = OpContext({"axis": 1}, 21, name="c")
    outs = k.infer(ctx, infos)
    buf = np.concatenate([a, b], axis=1)
    buf.flags.writeable = False  # nothing may be written: both inputs are in place
    k(ctx, infos, outs).run([buf[:, :2], buf[:, 2:]], [buf], None)
    out = np.zeros((1, 6, 3), np.float32)
    out[:, 2:] = b
    k(ctx, infos, outs).run([a, out[:, 2:]], [out], None)
    np.testing.assert_array_equal(out, np.concatenate([a, b], axis=1))


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
