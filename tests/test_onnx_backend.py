"""The official ONNX backend test suite, run on CPU through omrt.backend (compile, .om, load, run)."""

from __future__ import annotations

import warnings

import onnx.backend.test

import omrt.backend
from omrt.backend import UNSUPPORTED

warnings.filterwarnings("ignore", category=RuntimeWarning)

backend_test = onnx.backend.test.BackendTest(omrt.backend.OmrtBackend, __name__)
backend_test.exclude("_cuda$")
for pattern in UNSUPPORTED:
    backend_test.exclude(pattern)

globals().update(backend_test.test_cases)
