"""Max pools alone: omrt's vector path, omrt without it, and ONNX Runtime's MaxPool, side by side.

    python benchmarks/pools.py                                  # the pools of the light models, 1 thread
    python benchmarks/pools.py --threads 1,2 --runs 200 --json out.json
    python benchmarks/pools.py --shapes 64:111:2:0,256:27:2:0     # planes:size:stride:pad

Each shape is one MaxPool (planes x size x size, a 3x3 window) built with `onnx.helper` and
compiled once; it is loaded twice, once by the rule omrt runs (`pool.VECTOR_ROW_WIDTH`,
`pool.VECTOR_ROW_WIDTH_STRIDE_1`: the vector path where it pays) and once with both set out of
reach, so that its planes take the path they took before (row by row, in bands, or 16 planes at
a time). The three variants run the same input in interleaved blocks (`omrt.bench.interleave`),
inputs and outputs bound once; the outputs are checked to be equal (a max is exact). The figures
include each run's call from Python, a few microseconds.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import sys
import tempfile
from typing import Iterator

import numpy as np
import onnx
from onnx import TensorProto, helper

from figures import host, write_results

import omrt
from omrt import bench
from omrt.kernels import pool

SHAPES = (
    (64, 111, 2, 0),  # squeezenet, after its stem
    (64, 112, 2, 1),  # resnet50, densenet121, inception_v1/v2, after their stems
    (128, 55, 2, 0),  # squeezenet
    (192, 56, 2, 1),  # inception_v1/v2
    (256, 27, 2, 0),  # squeezenet
    (320, 28, 2, 1),  # inception_v2
    (480, 28, 2, 1),  # inception_v1
    (832, 14, 2, 1),  # inception_v1
    (32, 112, 1, 1),  # stride 1 over wide planes
)
"""(planes, size, stride, pad) of the pools measured: 3x3 windows."""


def pool_model(planes: int, size: int, stride: int, pad: int) -> onnx.ModelProto:
    """One MaxPool of a 3x3 window over a (1, planes, size, size) input."""
    out = (size + 2 * pad - 3) // stride + 1
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, planes, size, size])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, planes, out, out])
    node = helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[3, 3], strides=[stride, stride],
                            pads=[pad] * 4)
    return helper.make_model(helper.make_graph([node], "pool", [x], [y]),
                             opset_imports=[helper.make_opsetid("", 13)])


@contextlib.contextmanager
def without_vector_path() -> Iterator[None]:
    """Pools loaded in the block ask for the paths they took before the vector path."""
    saved = pool.VECTOR_ROW_WIDTH, pool.VECTOR_ROW_WIDTH_STRIDE_1
    pool.VECTOR_ROW_WIDTH = pool.VECTOR_ROW_WIDTH_STRIDE_1 = math.inf
    try:
        yield
    finally:
        pool.VECTOR_ROW_WIDTH, pool.VECTOR_ROW_WIDTH_STRIDE_1 = saved


def bound_session(om: str, x: np.ndarray) -> tuple[omrt.Session, np.ndarray, bool]:
    """A session of `om` with x and a new output bound, that output, and whether its pool asks
    for the vector path."""
    model = bench.load_compiled(om)
    y = np.empty(model.outputs[0].shape, np.float32)
    session = model.session()
    session.bind("x", x)
    session.bind("y", y)
    kernel = next(step.kernel for step in session._executor.instructions if hasattr(step, "kernel"))
    return session, y, bool(kernel.vector_rows)


def measure(om: str, src: str, planes: int, size: int, threads: int, runs: int) -> dict:
    """Median microseconds of the three variants at `threads` threads, and their ratios."""
    ort = bench.import_ort()
    x = np.random.default_rng(0).standard_normal((1, planes, size, size)).astype(np.float32)
    with bench.omrt_threads(threads):
        vector, y_vector, asks = bound_session(om, x)
        with without_vector_path():
            before, y_before, _ = bound_session(om, x)
        fns = {"vector path": vector.run, "without it": before.run}
        if ort is not None:
            osess = bench.ort_session(ort, src, threads)
            fns["ORT"] = lambda: osess.run(None, {"x": x})
        for fn in fns.values():
            for _ in range(5):
                fn()
        if not np.array_equal(y_vector, y_before):
            raise AssertionError("the two omrt paths disagree")
        if ort is not None and not np.array_equal(y_vector, osess.run(None, {"x": x})[0]):
            raise AssertionError("omrt and ORT disagree")
        times = bench.interleave(fns, runs, block=20, budget=math.inf)
    us = {k: float(np.median(v)) * 1e6 for k, v in times.items()}
    rec = {"asks_for_vector_path": asks, "median_us": us,
           "vector_vs_without": us["vector path"] / us["without it"]}
    if "ORT" in us:
        rec["vector_vs_ort"] = us["vector path"] / us["ORT"]
    return rec


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", default="1", help="comma-separated thread counts (default 1)")
    ap.add_argument("--runs", type=int, default=100, help="timed runs per variant (default 100)")
    ap.add_argument("--shapes", help="comma-separated planes:size:stride:pad (default: SHAPES)")
    ap.add_argument("--json", metavar="FILE", help="write every figure here")
    args = ap.parse_args(argv)
    shapes = [tuple(int(v) for v in s.split(":")) for s in args.shapes.split(",")] if args.shapes else SHAPES
    cpu = host()
    print(f"host: {cpu['cpu']}, {cpu['isa']} (the vector path needs AVX-512)")
    print(f"{'planes x size, stride, pad':28s} {'thr':>3s} {'vector?':>7s} {'vector':>9s} {'without':>9s} "
          f"{'ORT':>9s}  {'vec/without':>11s} {'vec/ORT':>7s}")
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for planes, size, stride, pad in shapes:
            src, om = f"{tmp}/pool.onnx", f"{tmp}/pool.om"
            onnx.save(pool_model(planes, size, stride, pad), src)
            omrt.compile(src, om)
            for threads in (int(t) for t in args.threads.split(",")):
                rec = measure(om, src, planes, size, threads, args.runs)
                results.append({"planes": planes, "size": size, "stride": stride, "pad": pad,
                                "threads": threads, **rec})
                us = rec["median_us"]
                print(f"{planes:4d} x {size:3d}x{size:<3d}, s{stride}, p{pad}       {threads:3d} "
                      f"{'yes' if rec['asks_for_vector_path'] else 'no':>7s} {us['vector path']:7.1f}us "
                      f"{us['without it']:7.1f}us {us.get('ORT', math.nan):7.1f}us  "
                      f"{rec['vector_vs_without']:11.2f} {rec.get('vector_vs_ort', math.nan):7.2f}", flush=True)
    write_results(args.json, cpu, args.runs, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
