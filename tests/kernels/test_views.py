"""View kernels: against onnx.reference, and shape inference with symbolic dims."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernel_check import check, run_kernel  # noqa: E402
from shape_check import F32, I64, const, infer, ints, rand, shapes, sym  # noqa: E402

from omrt.errors import ShapeError  # noqa: E402
from omrt.kernels import OpContext, TensorInfo, lookup  # noqa: E402


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
