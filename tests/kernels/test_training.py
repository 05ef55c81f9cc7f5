"""Optimizer kernels (ai.onnx.preview.training) against onnx.reference."""

from __future__ import annotations

import numpy as np
import pytest

from omrt.errors import ShapeError
from tests.kernel_check import randn, reference, run_kernel

DOMAIN = "ai.onnx.preview.training"


def check(op: str, inputs: list[np.ndarray], attrs: dict, n_outputs: int) -> None:
    got = run_kernel(op, inputs, attrs, opset=1, domain=DOMAIN, const=[])
    want = reference(op, inputs, attrs, opset=1, n_outputs=n_outputs, domain=DOMAIN)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w.astype(g.dtype), rtol=1e-5, atol=1e-6)


def optimizer_inputs(n: int, states: int, t: int, dtype: type = np.float32,
                     shapes: tuple = ((3,), (2, 4), (1, 2, 2))) -> list[np.ndarray]:
    sh = shapes[:n]
    xs = [randn(*s, dtype=dtype) for s in sh]
    gs = [randn(*s, dtype=dtype) for s in sh]
    st = [np.abs(randn(*s, dtype=dtype)) for _ in range(states) for s in sh]
    return [np.array(0.1, dtype), np.array(t, np.int64)] + xs + gs + st


@pytest.mark.parametrize("mode", ["standard", "nesterov"])
@pytest.mark.parametrize("t", [0, 3])
@pytest.mark.parametrize("n", [1, 3])
def test_momentum(mode, t, n):
    attrs = {"alpha": 0.9, "beta": 0.7, "mode": mode, "norm_coefficient": 0.01}
    check("Momentum", optimizer_inputs(n, 1, t), attrs, 2 * n)


def test_momentum_float64_and_required_attributes():
    attrs = {"alpha": 0.5, "beta": 0.2, "mode": "standard", "norm_coefficient": 0.0}
    check("Momentum", optimizer_inputs(2, 1, 1, np.float64), attrs, 4)
    with pytest.raises(ShapeError, match="alpha"):
        run_kernel("Momentum", optimizer_inputs(1, 1, 1), {"beta": 1.0}, opset=1, domain=DOMAIN)
    with pytest.raises(ShapeError, match="mode"):
        run_kernel("Momentum", optimizer_inputs(1, 1, 1), dict(attrs, mode="heavy"), opset=1,
                   domain=DOMAIN)


@pytest.mark.parametrize("attrs", [{}, {"decay_factor": 0.1, "epsilon": 1e-3, "norm_coefficient": 0.02}])
@pytest.mark.parametrize("n", [1, 2])
def test_adagrad(attrs, n):
    check("Adagrad", optimizer_inputs(n, 1, 4), attrs, 2 * n)


@pytest.mark.parametrize("t", [0, 5])
@pytest.mark.parametrize("attrs", [{}, {"alpha": 0.8, "beta": 0.9, "epsilon": 1e-4,
                                        "norm_coefficient": 0.05, "norm_coefficient_post": 0.1}])
@pytest.mark.parametrize("n", [1, 3])
def test_adam(t, attrs, n):
    check("Adam", optimizer_inputs(n, 2, t), attrs, 3 * n)


def test_empty_tensor_and_bad_input_count():
    check("Adagrad", [np.array(0.1, np.float32), np.array(1, np.int64)] + [np.zeros((0, 3), np.float32)] * 3,
          {}, 2)
    with pytest.raises(ShapeError, match="groups"):
        run_kernel("Adam", optimizer_inputs(1, 1, 1), {}, opset=1, domain=DOMAIN)
    with pytest.raises(ShapeError, match="scalar"):
        bad = optimizer_inputs(1, 1, 1)
        bad[1] = np.array(1.0, np.float32)
        run_kernel("Adagrad", bad, {}, opset=1, domain=DOMAIN)
