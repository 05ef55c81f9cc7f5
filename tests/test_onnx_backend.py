"""The official ONNX backend test suite, run on CPU through omrt.backend (compile, .om, load, run):
once on the numpy kernels, once with every model's native library trusted (two threads, and the
thresholds that keep small layers off the C code lowered)."""

from __future__ import annotations

import warnings

import onnx.backend.test

import omrt.backend
from omrt.backend import UNSUPPORTED

warnings.filterwarnings("ignore", category=RuntimeWarning)

for backend, suffix in ((omrt.backend.OmrtBackend, ""), (omrt.backend.OmrtNativeBackend, "Native")):
    backend_test = onnx.backend.test.BackendTest(backend, __name__)
    backend_test.exclude("_cuda$")
    for pattern in UNSUPPORTED:
        backend_test.exclude(pattern)
    globals().update({name + suffix: case for name, case in backend_test.test_cases.items()})
