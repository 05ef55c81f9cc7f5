"""Shared fixtures: small models built with onnx.helper, compiled to .om in a temp folder."""

from __future__ import annotations

import os
import subprocess
import sys
import tracemalloc
from typing import Iterator

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import omrt
from tests.kernel_check import RNG as KERNEL_TEST_RNG

RNG = np.random.default_rng(0)
W1 = RNG.standard_normal((64, 128)).astype(np.float32)
B1 = RNG.standard_normal(128).astype(np.float32)
W2 = RNG.standard_normal((128, 10)).astype(np.float32)


def mlp_model(batch: int | str = 4) -> onnx.ModelProto:
    """x[N,64] -> MatMul+Add+Relu -> MatMul -> Reshape(Shape) -> y[N,10]; also z = Identity(x)."""
    nodes = [helper.make_node("MatMul", ["x", "W1"], ["h"]), helper.make_node("Add", ["h", "b1"], ["hb"]),
             helper.make_node("Relu", ["hb"], ["r"]), helper.make_node("MatMul", ["r", "W2"], ["o"]),
             helper.make_node("Shape", ["o"], ["s"]), helper.make_node("Reshape", ["o", "s"], ["y"])]
    g = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 64])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 10])],
                          [numpy_helper.from_array(W1, "W1"), numpy_helper.from_array(B1, "b1"),
                           numpy_helper.from_array(W2, "W2")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def mlp_reference(x: np.ndarray) -> np.ndarray:
    return np.maximum(x @ W1 + B1, 0) @ W2


@pytest.fixture
def mlp_om(tmp_path) -> str:
    path = str(tmp_path / "mlp.om")
    omrt.compile(mlp_model(4), path)
    return path


@pytest.fixture
def dynamic_om(tmp_path) -> str:
    path = str(tmp_path / "mlp_dyn.om")
    omrt.compile(mlp_model("N"), path)
    return path


BLOCK_ONNX = ("import sys\n"
              "class Block:\n"
              "    def find_spec(self, name, path=None, target=None):\n"
              "        if name.split('.')[0] in ('onnx', 'onnxruntime'):\n"
              "            raise ImportError('blocked: ' + name)\n"
              "sys.meta_path.insert(0, Block())\n")


def run_without_onnx(code: str) -> subprocess.CompletedProcess:
    """Run Python `code` in a fresh interpreter where onnx and onnxruntime cannot be imported."""
    return subprocess.run([sys.executable, "-c", BLOCK_ONNX + code], capture_output=True, text=True)


def steady_state_peak(sess: omrt.Session, runs: int = 3) -> int:
    """Peak bytes numpy and Python allocate over `runs` runs of an already-run session."""
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        for _ in range(runs):
            sess.run()
        return tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()


@pytest.fixture(autouse=True)
def rewind_kernel_test_rng() -> None:
    """Every test draws the same kernel-test data whatever ran before it."""
    KERNEL_TEST_RNG.bit_generator.state = np.random.default_rng(0).bit_generator.state


TEST_THREADS = int(os.environ.get("OMRT_TEST_THREADS", "1"))
"""Threads every test starts with (OMRT_TEST_THREADS=2 runs the whole suite split over two
threads, to show that no tolerance depends on the thread split)."""


@pytest.fixture(autouse=True)
def default_threads() -> Iterator[None]:
    """Each test starts on TEST_THREADS omrt threads and leaves the setting as it found it."""
    omrt.set_num_threads(TEST_THREADS)
    yield
    omrt.set_num_threads(TEST_THREADS)


@pytest.fixture(scope="session")
def native():
    """A native library of every C unit, built once and loaded (trusted) for the whole run."""
    from omrt.native.bindings import UNITS
    from omrt.native.build import build
    from omrt.native.loader import load

    record = build(list(UNITS), lambda msg: None)
    if record is None:
        pytest.skip("no C compiler on this host")
    library = load([record], trusted=True)
    assert record.status == "loaded", record.status
    return library
