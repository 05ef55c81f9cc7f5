"""What call lists save: one model's steady-state run made three ways, interleaved in one process.

    python benchmarks/call_lists.py                                   # mobilenetv3, squeezenet, shufflenet, densenet121
    python benchmarks/call_lists.py --models squeezenet --threads 1,2 --runs 40 --json out.json

- `per node`: every node through its kernel's `run`, as before call lists (each native call
  checked and made through ctypes, the kernel's Python around it);
- `per call`: the calls bound once, each still made by its own ctypes call;
- `call lists`: the calls bound once, each run of them made by one `omrt_run_calls`.

The first two are the third with parts of it turned off inside the executor (`Call.bind`, the
batching), so the three run the same kernels on the same arrays; their outputs are checked to
agree. Inputs are bound once, as a caller that cares about latency does. Medians of interleaved
runs after warm-up (the order alternates run to run), so that a noisy host slows all three alike.
Model names are those of compare.py (or .onnx paths).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time

import numpy as np

from compare import build
from figures import host, write_results

import omrt

WAYS = ("per node", "per call", "call lists")
DEFAULT_MODELS = ("mobilenetv3", "squeezenet", "shufflenet", "densenet121")


def session(model: omrt.Model, way: str, feeds: dict[str, np.ndarray]) -> omrt.Session:
    """A session of `model` that runs `way`, its inputs bound to `feeds`."""
    s = model.session()
    for name, array in feeds.items():
        s.bind(name, array)
    executor = s._executor
    if way == "per node":
        for step in executor.instructions:
            if hasattr(step, "kernel"):
                step.bind = lambda: None  # every Call runs through kernel.run
    elif way == "per call":
        executor._run_calls = None  # no batches: each bound call is its own ctypes call
    return s


def measure(path: str, threads: int, runs: int, warmup: int) -> dict:
    """Median milliseconds of each way at `threads` threads, and the largest output difference."""
    model = omrt.load(path, trust_kernels=True)
    omrt.set_num_threads(threads)
    rng = np.random.default_rng(0)
    feeds = {i.name: rng.standard_normal(i.shape).astype(i.dtype) for i in model.inputs}
    sessions = {way: session(model, way, feeds) for way in WAYS}
    outputs = {way: s.run() for way, s in sessions.items()}
    error = 0.0
    for name, want in outputs["per node"].items():
        scale = float(np.abs(want).max()) or 1.0
        error = max(error, *(float(np.abs(outputs[w][name] - want).max()) / scale for w in WAYS[1:]))
    for _ in range(warmup):
        for s in sessions.values():
            s.run()
    times: dict[str, list[float]] = {way: [] for way in WAYS}
    for r in range(runs):
        for way in WAYS if r % 2 else WAYS[::-1]:
            start = time.perf_counter()
            sessions[way].run()
            times[way].append(time.perf_counter() - start)
    median = {way: float(np.median(t)) * 1e3 for way, t in times.items()}
    return {"median_ms": median, "ratio_vs_per_node": {w: median[w] / median["per node"] for w in WAYS},
            "max_relative_difference": error}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default=",".join(DEFAULT_MODELS), help="comma-separated names or .onnx paths")
    ap.add_argument("--threads", default="1,2", help="comma-separated thread counts (default 1,2)")
    ap.add_argument("--runs", type=int, default=40, help="timed runs per way and thread count (default 40)")
    ap.add_argument("--warmup", type=int, default=5, help="warm-up runs per way (default 5)")
    ap.add_argument("--json", metavar="FILE", help="write every figure here")
    args = ap.parse_args(argv)
    cpu = host()
    print(f"host: {cpu['cpu']}, {cpu['isa']}; numpy's OpenBLAS runs its {cpu['blas_core']} kernels")
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            path = f"{tmp}/{name.rsplit('/', 1)[-1]}.om"
            omrt.compile(build(name, tmp), path)
            for threads in (int(t) for t in args.threads.split(",")):
                res = measure(path, threads, args.runs, args.warmup)
                results.setdefault(name, {})[str(threads)] = res
                ms, ratio = res["median_ms"], res["ratio_vs_per_node"]
                print(f"{name:14s} {threads}t  " + "  ".join(f"{w} {ms[w]:7.2f} ms" for w in WAYS)
                      + f"   call lists / per node {ratio['call lists']:.2f}"
                      + f"   (outputs agree to {res['max_relative_difference']:.1e})")
    write_results(args.json, cpu, args.runs, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
