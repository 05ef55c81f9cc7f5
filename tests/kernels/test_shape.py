"""Shape arithmetic kernels (Shape, Size, ConstantOfShape, Range), the folding of shape sub-graphs, and the shape families on string tensors: against onnx.reference."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernel_check import check, reference, run_kernel  # noqa: E402
from shape_check import I64, const, infer, ints, rand, shapes, sym  # noqa: E402
from onnx import numpy_helper  # noqa: E402

from omrt.errors import ShapeError  # noqa: E402


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


# ----------------------------------------------------------------------------- strings


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
