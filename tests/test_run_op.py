"""omrt.run_op: one kernel of the library straight into the caller's arrays, prepared once per
signature."""

from __future__ import annotations

import numpy as np
import pytest

import omrt
from omrt.runtime import single_op

RNG = np.random.default_rng(5)


def test_conv_matmul_and_add_write_into_the_arrays_given():
    x, w, b = (RNG.standard_normal(s).astype(np.float32) for s in ((1, 3, 8, 8), (4, 3, 3, 3), (4,)))
    y = np.empty((1, 4, 8, 8), np.float32)
    assert omrt.run_op("Conv", [x, w, b], [y], pads=[1, 1, 1, 1])[0] is y
    padded = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    windows = np.lib.stride_tricks.sliding_window_view(padded, (3, 3), axis=(2, 3))  # 1, 3, 8, 8, 3, 3
    want = np.einsum("nchwij,fcij->nfhw", windows, w) + b[:, None, None]
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4)
    a, m = RNG.standard_normal((5, 7)).astype(np.float32), RNG.standard_normal((7, 3)).astype(np.float32)
    out = np.empty((5, 3), np.float32)
    omrt.run_op("MatMul", [a, m], [out])
    np.testing.assert_allclose(out, a @ m, rtol=1e-5, atol=1e-5)
    p, q = RNG.standard_normal((2, 3)), RNG.standard_normal((3,))
    s = np.empty((2, 3))
    omrt.run_op("Add", [p, q], [s])
    np.testing.assert_array_equal(s, p + q)


def test_a_signature_is_prepared_once_and_reused():
    single_op._CACHE.clear()
    a, b = np.ones((4, 4), np.float32), np.ones((4, 4), np.float32)
    out = np.empty((4, 4), np.float32)
    omrt.run_op("Mul", [a, b], [out])
    prepared = single_op._CACHE.copy()
    for _ in range(3):
        omrt.run_op("Mul", [a * 2, b], [out])
    assert single_op._CACHE == prepared and (out == 2).all()
    omrt.run_op("Mul", [np.ones((2, 2), np.float32)] * 2, [np.empty((2, 2), np.float32)])
    assert len(single_op._CACHE) == 2


def test_outputs_must_be_the_results_dtype_and_shape_and_writable():
    a = np.ones((2, 3), np.float32)
    with pytest.raises(omrt.BindError, match=r"Relu output 0 is float32 \(2, 3\), the array given is float64 \(2, 3\)"):
        omrt.run_op("Relu", [a], [np.empty((2, 3))])
    frozen = np.empty((2, 3), np.float32)
    frozen.flags.writeable = False
    with pytest.raises(omrt.BindError, match="must be a writable, aligned, C-contiguous array"):
        omrt.run_op("Relu", [a], [frozen])
    with pytest.raises(omrt.BindError, match="Relu gives 1 outputs here; pass that many"):
        omrt.run_op("Relu", [a], [])
    with pytest.raises(omrt.InputError, match="Relu input 0: pass an aligned, C-contiguous numpy array"):
        omrt.run_op("Relu", [np.ones((3, 4), np.float32)[:, ::2]], [np.empty((3, 2), np.float32)])
    misaligned = np.zeros(4 * 6 + 1, np.uint8)[1:].view(np.float32).reshape(2, 3)
    with pytest.raises(omrt.InputError, match="Relu input 0: pass an aligned"):
        omrt.run_op("Relu", [misaligned], [np.empty((2, 3), np.float32)])
    wide = np.ones((4, 3), np.float32)
    with pytest.raises(omrt.BindError, match="Relu output 0 shares memory with an input"):
        omrt.run_op("Relu", [wide[:2]], [wide[1:3]])
    with pytest.raises(omrt.UnsupportedOpError, match="NoSuchOp"):
        omrt.run_op("NoSuchOp", [a], [a])
    with pytest.raises(omrt.InputError, match="NonZero's output shape depends on its input values"):
        omrt.run_op("NonZero", [a], [np.empty((2, 6), np.int64)])


def test_the_opset_defaults_to_the_newest_kernel():
    from omrt.kernels.base import newest_opset

    assert newest_opset("Add") == max(since for d, op, since in omrt.kernels.registered_ops() if op == "Add")
    with pytest.raises(omrt.UnsupportedOpError, match="NoSuchOp"):
        newest_opset("NoSuchOp")
