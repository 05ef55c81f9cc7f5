"""`omrt demo`: compile a real network the onnx package ships, run it zero-copy, check it, report."""

from __future__ import annotations

import os
import statistics
import tempfile
import time

import numpy as np

from .report import mib, plan_figures


def light_model(name: str) -> tuple[str, str]:
    """Paths of a light model shipped by the onnx package and of its expected output."""
    import onnx

    base = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")
    return os.path.join(base, f"light_{name}.onnx"), os.path.join(base, f"light_{name}_output_0.pb")


def backend_input(shape: tuple[int, ...]) -> np.ndarray:
    """The input the ONNX backend test feeds light models: arange(n) / n in float32."""
    n = int(np.prod(shape))
    return (np.arange(n).reshape(shape) / n).astype(np.float32)


def read_tensor(path: str) -> np.ndarray:
    import onnx
    from onnx import numpy_helper

    t = onnx.TensorProto()
    with open(path, "rb") as f:
        t.ParseFromString(f.read())
    return numpy_helper.to_array(t)


def main(name: str = "squeezenet", repeat: int = 50, threads: int = 1) -> int:
    """Run the demo on `threads` omrt threads; returns a process exit code (0 when the output
    matches the reference)."""
    import omrt

    omrt.set_num_threads(threads)
    src, expected_path = light_model(name)
    print(f"omrt {omrt.__version__} demo: {os.path.basename(src)} (shipped with the onnx package)")
    with tempfile.TemporaryDirectory() as tmp:
        om = os.path.join(tmp, f"{name}.om")
        res = omrt.compile(src, om)
        print(f"compiled in {res.seconds * 1e3:.0f} ms -> {os.path.basename(om)}, {mib(res.file_size)} "
              f"({mib(res.weights_bytes)} of weights)")
        t0 = time.perf_counter()
        model = omrt.load(om, trust_kernels=True)
        sess = model.session(zero_copy="always")
        load_ms = (time.perf_counter() - t0) * 1e3
        print(f"loaded (mmap) + first session in {load_ms:.1f} ms")
        for packed in model.kernels:
            print(f"native kernels ({', '.join(packed.units)}): {packed.status}")
        spec_in, spec_out = model.inputs[0], model.outputs[0]
        x = backend_input(tuple(spec_in.shape))
        y = np.empty(spec_out.shape, spec_out.dtype)
        sess.bind(spec_in.name, x)
        sess.bind(spec_out.name, y)
        sess.run()
        times = []
        for _ in range(repeat):
            t = time.perf_counter()
            sess.run()
            times.append(time.perf_counter() - t)
        expected = read_tensor(expected_path)
        ok = np.allclose(y, expected, rtol=1e-3, atol=1e-7)
        err = float(np.max(np.abs(y - expected)))
        print(f"latency: median {statistics.median(times) * 1e3:.2f} ms, min {min(times) * 1e3:.2f} ms "
              f"over {repeat} runs (bound input and output, {threads} thread{'s' if threads > 1 else ''})")
        print(f"memory: {plan_figures(model.default.program)}")
        print(f"bytes copied per run: {sess.stats.bytes_copied // max(sess.stats.runs, 1)} "
              f"(output written straight into the caller's buffer: {np.shares_memory(y, sess.run()[spec_out.name])})")
        print(f"top-5 classes: {np.argsort(y.ravel())[::-1][:5].tolist()}")
        print(f"matches the expected output: {'yes' if ok else 'NO'} (max abs error {err:.2e})")
    return 0 if ok else 1
