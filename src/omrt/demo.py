"""`omrt demo`: compile a real network, run it zero-copy, check it against a reference, report.

The network is one of the light models the onnx package ships, with its weights redrawn, seeded
(`omrt.zoo.redrawn`): the shipped weights are constant, which makes the shipped expected output
a softmax over equal logits that no two summation orders agree on. The reference is ONNX Runtime
when it is installed, else onnx's reference evaluator; the verdict compares every output with a
tolerance relative to its magnitude, which holds on any CPU and thread count.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time

import numpy as np

from .report import mib, plan_figures

TOLERANCE = 1e-4
"""The largest difference from the reference, relative to the output's magnitude, called a match
(float32 networks on any summation order stay near 1e-6)."""


def _reference_name() -> str:
    try:
        import onnxruntime  # noqa: F401
    except ImportError:
        return "onnx's reference evaluator (ONNX Runtime is not installed)"
    return "ONNX Runtime"


def main(name: str = "squeezenet", repeat: int = 50, threads: int = 1) -> int:
    """Run the demo on `threads` omrt threads; returns a process exit code (0 when the outputs
    match the reference)."""
    import omrt
    from . import zoo

    omrt.set_num_threads(threads)
    print(f"omrt {omrt.__version__} demo: {name} (the architecture the onnx package ships, weights "
          f"redrawn with seed 0)")
    source = zoo.redrawn(name)
    with tempfile.TemporaryDirectory() as tmp:
        om = os.path.join(tmp, f"{name}.om")
        res = omrt.compile(source, om)
        print(f"compiled in {res.seconds * 1e3:.0f} ms -> {os.path.basename(om)}, {mib(res.file_size)} "
              f"({mib(res.weights_bytes)} of weights)")
        t0 = time.perf_counter()
        model = omrt.load(om, trust_kernels=True)
        sess = model.session(zero_copy="always")
        print(f"loaded (mmap) + first session in {(time.perf_counter() - t0) * 1e3:.1f} ms")
        for packed in model.kernels:
            print(f"native kernels ({', '.join(packed.units)}): {packed.status}")
        feeds = zoo.sample_input(source, seed=1)
        outputs = {s.name: np.empty(s.shape, s.dtype) for s in model.outputs}
        for binding in (feeds, outputs):
            for key, arr in binding.items():
                sess.bind(key, arr)
        sess.run()
        times = []
        for _ in range(repeat):
            t = time.perf_counter()
            sess.run()
            times.append(time.perf_counter() - t)
        want = zoo.reference(source, feeds)
        errors = {key: zoo.scaled_error(outputs[key], want[key]) for key in want}
        ok = max(errors.values()) <= TOLERANCE
        first = model.outputs[0].name
        print(f"latency: median {statistics.median(times) * 1e3:.2f} ms, min {min(times) * 1e3:.2f} ms "
              f"over {repeat} runs (bound input and output, {threads} thread{'s' if threads > 1 else ''})")
        print(f"memory: {plan_figures(model.default.program)}")
        print(f"bytes copied per run: {sess.stats.bytes_copied // max(sess.stats.runs, 1)} "
              f"(outputs written straight into the caller's buffers: "
              f"{all(np.shares_memory(outputs[k], v) for k, v in sess.run().items())})")
        print(f"top-5 classes: {np.argsort(outputs[first].ravel())[::-1][:5].tolist()} "
              f"(reference: {np.argsort(want[first].ravel())[::-1][:5].tolist()})")
        worst = max(errors, key=errors.get)
        print(f"matches the reference ({_reference_name()}): {'yes' if ok else 'NO'} (largest difference "
              f"{errors[worst]:.1e} of the magnitude of {worst!r}; a match is within {TOLERANCE:g})")
    return 0 if ok else 1
