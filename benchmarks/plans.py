"""Precomputed plans: load time of a model with symbolic input dims, its plans for three input
signatures stored at compile time (`omrt compile --plan-for`) against planned at run time.

    python benchmarks/plans.py                  # both models, 15 fresh processes per variant
    python benchmarks/plans.py --reps 5 --json plans.json

- densenet121 with a symbolic batch: signatures N = 1, 4, 16.
- squeezenet with symbolic height and width: signatures 224x224, 320x320, 640x640.

Each model is compiled twice from the same redrawn ONNX file, with and without `--plan-for` for
its three signatures. A measurement is one fresh worker process that loads the `.om` and makes a
session's plan for each of the three signatures (what a server does before its first request):
the time of `omrt.load` plus the three `Model.prepared(shapes)` calls, and whether each prepared
program is the stored one. The two variants alternate process by process; medians are
printed with the ratio stored/at-run-time. The parent imports neither numpy nor omrt.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

from figures import cpu_name, spawn

MODELS = {
    "densenet121": ({0: "N"}, [(1, 3, 224, 224), (4, 3, 224, 224), (16, 3, 224, 224)]),
    "squeezenet": ({2: "H", 3: "W"}, [(1, 3, 224, 224), (1, 3, 320, 320), (1, 3, 640, 640)]),
}
"""Light model -> (input dims made symbolic, the three signatures of its only input)."""


def symbolic_model(name: str, dims: dict[int, str], path: str) -> str:
    """The redrawn light model with these input dims symbolic (and its output shapes left to
    inference), saved at `path`; returns its input name."""
    import onnx
    from omrt.zoo import redrawn

    model = redrawn(name)
    (inp,) = [i for i in model.graph.input if i.name not in {t.name for t in model.graph.initializer}]
    for axis, param in dims.items():
        inp.type.tensor_type.shape.dim[axis].dim_param = param
    for out in model.graph.output:
        out.type.tensor_type.ClearField("shape")
    del model.graph.value_info[:]
    onnx.save(model, path)
    return inp.name


def worker_compile(folder: str) -> dict:
    import omrt

    inputs = {}
    for name, (dims, signatures) in MODELS.items():
        src = os.path.join(folder, f"{name}.onnx")
        inputs[name] = symbolic_model(name, dims, src)
        omrt.compile(src, os.path.join(folder, f"{name}-runtime.om"))
        omrt.compile(src, os.path.join(folder, f"{name}-stored.om"),
                     shapes_for=[{inputs[name]: s} for s in signatures])
    return inputs


def worker_load(path: str, input_name: str, name: str) -> dict:
    import omrt

    signatures = [{input_name: s} for s in MODELS[name][1]]
    t0 = time.perf_counter()
    model = omrt.load(path)
    prepared = [model.prepared(s) for s in signatures]  # what a session's first run of each does
    seconds = time.perf_counter() - t0
    stored = sum(any(p.program is s for s in model.stored_plans) for p in prepared)
    return {"seconds": seconds, "stored_plans_used": stored}


def run_worker(args: list[str]) -> dict:
    return spawn(__file__, args, dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1"))


def measure(folder: str, name: str, input_name: str, reps: int) -> dict:
    times = {"runtime": [], "stored": []}
    used = {}
    for _ in range(reps):
        for variant in times:
            res = run_worker(["load", os.path.join(folder, f"{name}-{variant}.om"), input_name, name])
            times[variant].append(res["seconds"])
            used[variant] = res["stored_plans_used"]
    med = {v: statistics.median(t) * 1e3 for v, t in times.items()}
    return {"median_ms": med, "ratio_stored_vs_runtime": med["stored"] / med["runtime"],
            "stored_plans_used": used, "reps": reps}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=15, help="fresh processes per variant (default 15)")
    ap.add_argument("--json", metavar="FILE", help="also write the figures here")
    ap.add_argument("--worker", nargs="+", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        kind, *rest = args.worker
        print(json.dumps(worker_compile(*rest) if kind == "compile" else worker_load(*rest)))
        return 0
    print(f"CPU: {cpu_name()}; {args.reps} fresh processes per variant")
    results = {}
    with tempfile.TemporaryDirectory() as folder:
        inputs = run_worker(["compile", folder])
        for name, (_, signatures) in MODELS.items():
            res = results[name] = measure(folder, name, inputs[name], args.reps)
            shapes = ", ".join("x".join(map(str, s)) for s in signatures)
            print(f"{name} ({shapes}): load + 3 signatures prepared {res['median_ms']['runtime']:.1f} ms planned at run "
                  f"time, {res['median_ms']['stored']:.1f} ms with stored plans "
                  f"(x{res['ratio_stored_vs_runtime']:.2f}; stored plans used: "
                  f"{res['stored_plans_used']['stored']}/3 and {res['stored_plans_used']['runtime']}/3)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"cpu": cpu_name(), "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
