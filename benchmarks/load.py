"""Cold-start benchmark: omrt vs ONNX Runtime, each measurement in its own fresh process.

    python benchmarks/load.py                    # vgg19, 5 repetitions, 1 thread
    python benchmarks/load.py --model resnet50 --reps 7 --threads 2 --json load.json
    python benchmarks/load.py --model big_mlp       # a synthetic model of compare.py, built first

A light model is its architecture with weights redrawn, seeded (`omrt.zoo.redrawn`: real
initializers in the .onnx, and outputs that can be checked); synthetic ones are compare.py's.
The model is compiled to `.om` once, before any measurement (in a worker process of its own),
and the compile time is reported on its own. One unmeasured round per side follows (byte-code
caches, page cache, and an output check against ORT). Then, for every repetition, two fresh
Python processes are spawned (`--worker omrt` and `--worker ort`, alternating which goes
first), and each measures:

- import:  importing the runtime (`omrt` / `onnxruntime`, numpy included);
- load:    omrt `load(.om)` + first `session()`, vs ORT `InferenceSession(.onnx)` creation
           (CPU provider, default graph optimisation level);
- run:     the first run (omrt: input and output bound, zero_copy="auto"; ORT: `run()`);
- first result = load + run (import excluded, it is reported on its own);
- peak RSS: `resource.getrusage(RUSAGE_SELF).ru_maxrss` after the run (absolute, interpreter
  and imports included), and the same figure taken right after the imports.

Threads: both workers get OPENBLAS_NUM_THREADS=OMP_NUM_THREADS=MKL_NUM_THREADS=N in their
environment (so numpy's BLAS, which omrt's kernels use, starts with N threads); ORT gets
`intra_op_num_threads=N`, `inter_op_num_threads=1`.

Medians over the repetitions are compared with the targets: omrt load + first session at least
10x faster than ORT session creation, time to first result below ORT's, peak RSS at most 0.7x.
The `.om` and `.onnx` files are in the page cache for every repetition (both sides alike).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

LIGHT = ["bvlc_alexnet", "densenet121", "inception_v1", "inception_v2", "resnet50", "shufflenet",
         "squeezenet", "vgg19", "zfnet512"]
SYNTHETIC = ["mlp", "preprocess", "preprocess_resize", "transformer", "big_mlp"]
"""Models compare.py builds with onnx.helper; they (and the redrawn light models) are written to a
temporary .onnx by a worker."""

TARGET_LOAD_SPEEDUP = 10.0
TARGET_RSS_RATIO = 0.7


# ---------------------------------------------------------------------------------------- worker

def _maxrss_bytes() -> int:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def _vmhwm_bytes() -> int | None:
    """Peak RSS of this process image from /proc (not inherited from the parent), if available."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _input_for(shape, dtype):
    """The ONNX backend tests' input for light models: arange(n) / n (zeros for non-float types)."""
    import numpy as np

    if any(not isinstance(d, int) for d in shape):
        raise SystemExit(f"input has a symbolic shape {list(shape)}: this benchmark needs fixed shapes")
    n = int(np.prod(shape))
    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        return (np.arange(n).reshape(shape) / max(n, 1)).astype(dtype)
    return np.zeros(shape, dtype)


def worker_omrt(path: str, save: str | None) -> dict:
    t0 = time.perf_counter()
    import numpy as np

    import omrt

    t1 = time.perf_counter()
    rss_imports = _maxrss_bytes()
    model = omrt.load(path, trust_kernels=True)  # the native kernels this benchmark compiled itself
    sess = model.session(zero_copy="auto")
    t2 = time.perf_counter()
    for spec in model.inputs:
        sess.bind(spec.name, _input_for(tuple(spec.shape), spec.dtype))
    outs = {}
    for spec in model.outputs:
        if all(isinstance(d, int) for d in spec.shape):
            outs[spec.name] = np.empty(spec.shape, spec.dtype)
            sess.bind(spec.name, outs[spec.name])
    res = sess.run()
    t3 = time.perf_counter()
    rss = _maxrss_bytes()
    if save:
        np.savez(save, **{k: v for k, v in res.items()})
    return {"import_s": t1 - t0, "load_s": t2 - t1, "run_s": t3 - t2, "first_result_s": t3 - t1,
            "rss_imports": rss_imports, "rss_peak": rss, "vmhwm": _vmhwm_bytes(),
            "bytes_copied": sess.stats.bytes_copied, "version": omrt.__version__}


def worker_ort(path: str, threads: int, save: str | None) -> dict:
    t0 = time.perf_counter()
    import numpy as np
    import onnxruntime as ort

    t1 = time.perf_counter()
    rss_imports = _maxrss_bytes()
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    t2 = time.perf_counter()
    types = {"tensor(float)": np.float32, "tensor(double)": np.float64, "tensor(float16)": np.float16,
             "tensor(int64)": np.int64, "tensor(int32)": np.int32, "tensor(uint8)": np.uint8,
             "tensor(int8)": np.int8, "tensor(bool)": np.bool_}
    feeds = {i.name: _input_for(tuple(i.shape), types[i.type]) for i in sess.get_inputs()}
    names = [o.name for o in sess.get_outputs()]
    res = sess.run(names, feeds)
    t3 = time.perf_counter()
    rss = _maxrss_bytes()
    if save:
        np.savez(save, **dict(zip(names, res)))
    return {"import_s": t1 - t0, "load_s": t2 - t1, "run_s": t3 - t2, "first_result_s": t3 - t1,
            "rss_imports": rss_imports, "rss_peak": rss, "vmhwm": _vmhwm_bytes(), "version": ort.__version__,
            "numpy": np.__version__}


def worker_compile(src: str, out: str) -> dict:
    import omrt

    res = omrt.compile(src, out)
    return {"compile_s": res.seconds, "om_bytes": os.path.getsize(out), "weights_bytes": res.weights_bytes}


def worker_build(name: str, folder: str) -> dict:
    """Write compare.py's model `name` (synthetic, or a redrawn light model) into `folder`;
    returns its path."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from compare import build

    return {"path": build(name, folder)}


def worker_check(omrt_npz: str, ort_npz: str) -> dict:
    """Compare omrt's first-run outputs with ORT's."""
    import numpy as np

    from omrt.bench import check_outputs

    a, b = np.load(omrt_npz), np.load(ort_npz)
    report: dict = check_outputs(dict(a), dict(b))
    report.update({name: "missing from omrt's outputs" for name in b.files if name not in a.files})
    return report


# ---------------------------------------------------------------------------------------- parent
# The parent stays small (no numpy, onnx or omrt imported here): on Linux a child's ru_maxrss starts
# from the high-water mark of the process image it was exec'd from, so a parent that had compiled a
# large model would inflate every worker's figure. Compiling and checking run in workers too.

def resolve_model(name: str) -> str:
    """The model's .onnx path, or its name when a worker has to build it."""
    if os.path.isfile(name) or name in SYNTHETIC or name in LIGHT:
        return name
    raise SystemExit(f"--model {name!r}: neither a file nor a light model ({', '.join(LIGHT)}) "
                     f"nor a synthetic one ({', '.join(SYNTHETIC)})")


def spawn(args: list[str], env: dict) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), *args]
    t = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t
    if proc.returncode != 0:
        raise SystemExit(f"worker {' '.join(args[:2])} failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    if isinstance(out, dict):
        out["process_s"] = wall
    return out


def worker_env(threads: int, pycache: str) -> dict:
    env = dict(os.environ)
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        env[var] = str(threads)
    # Byte-code is cached (in a private folder) for both sides alike, as an installed package would be.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = pycache
    return env


def mib(n: float) -> str:
    return f"{n / 2**20:.1f} MiB"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="vgg19",
                    help="a light model name, a synthetic model of compare.py or an .onnx path (default vgg19)")
    ap.add_argument("--reps", type=int, default=5, help="fresh-process repetitions per side (default 5)")
    ap.add_argument("--threads", type=int, default=1,
                    help="BLAS threads for omrt, intra-op threads for ORT (default 1)")
    ap.add_argument("--json", metavar="FILE", help="write every measurement and the medians here")
    ap.add_argument("--worker", choices=["omrt", "ort", "compile", "check", "build"], help=argparse.SUPPRESS)
    ap.add_argument("--path", help=argparse.SUPPRESS)
    ap.add_argument("--save", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.worker:
        workers = {
            "omrt": lambda: worker_omrt(args.path, args.save),
            "ort": lambda: worker_ort(args.path, args.threads, args.save),
            "compile": lambda: worker_compile(args.path, args.save),
            "check": lambda: worker_check(args.path, args.save),
            "build": lambda: worker_build(args.path, args.save),
        }
        print(json.dumps(workers[args.worker]()))
        return 0

    src = resolve_model(args.model)
    with tempfile.TemporaryDirectory() as tmp:
        env = worker_env(args.threads, os.path.join(tmp, "pycache"))
        if not os.path.isfile(src):
            src = spawn(["--worker", "build", "--path", src, "--save", tmp], env)["path"]
        om = os.path.join(tmp, "model.om")
        comp = spawn(["--worker", "compile", "--path", src, "--save", om], env)
        compile_s, om_size, onnx_size = comp["compile_s"], comp["om_bytes"], os.path.getsize(src)
        print(f"model {args.model}: .onnx {mib(onnx_size)}, .om {mib(om_size)} "
              f"({mib(comp['weights_bytes'])} of weights); compiled once in {compile_s:.2f} s")
        print(f"{args.reps} repetitions, each side in a fresh process; threads={args.threads} "
              f"(OPENBLAS/OMP/MKL_NUM_THREADS for both; ORT intra_op={args.threads}, inter_op=1)")
        common = ["--threads", str(args.threads)]
        saves = {k: os.path.join(tmp, f"{k}.npz") for k in ("omrt", "ort")}
        # One unmeasured round: writes byte-code caches, warms the page cache, saves outputs to check.
        for kind in ("omrt", "ort"):
            spawn(["--worker", kind, "--path", om if kind == "omrt" else src, "--save", saves[kind], *common], env)
        checks = spawn(["--worker", "check", "--path", saves["omrt"], "--save", saves["ort"]], env)
        checks.pop("process_s", None)
        runs: dict[str, list[dict]] = {"omrt": [], "ort": []}
        for rep in range(args.reps):
            order = ("omrt", "ort") if rep % 2 == 0 else ("ort", "omrt")
            for kind in order:
                runs[kind].append(spawn(["--worker", kind, "--path", om if kind == "omrt" else src, *common], env))
            print(f"  rep {rep + 1}: load omrt {runs['omrt'][-1]['load_s'] * 1e3:.1f} ms, "
                  f"ort {runs['ort'][-1]['load_s'] * 1e3:.1f} ms; first result omrt "
                  f"{runs['omrt'][-1]['first_result_s'] * 1e3:.1f} ms, ort "
                  f"{runs['ort'][-1]['first_result_s'] * 1e3:.1f} ms", flush=True)

    keys = ["import_s", "load_s", "run_s", "first_result_s", "process_s", "rss_imports", "rss_peak", "vmhwm"]
    med = {k: {kind: statistics.median(r[k] or 0 for r in runs[kind]) for kind in runs} for k in keys}

    def row(label: str, key: str, fmt, ratio_label: str = "omrt/ort") -> str:
        o, r = med[key]["omrt"], med[key]["ort"]
        return f"{label:<34}{fmt(o):>14}{fmt(r):>14}{o / r if r else float('nan'):>10.3f}  ({ratio_label})"

    ms = lambda s: f"{s * 1e3:.1f} ms"  # noqa: E731
    print()
    print(f"{'median of ' + str(args.reps):<34}{'omrt':>14}{'ort':>14}{'ratio':>10}")
    print(row("import runtime", "import_s", ms))
    print(row("load + first session", "load_s", ms))
    print(row("first run", "run_s", ms))
    print(row("first result (load + run)", "first_result_s", ms))
    print(row("whole process (spawn to exit)", "process_s", ms))
    print(row("RSS after imports", "rss_imports", mib))
    print(row("peak RSS (ru_maxrss)", "rss_peak", mib))
    print(row("peak RSS (VmHWM, cross-check)", "vmhwm", mib))
    delta = {k: med["rss_peak"][k] - med["rss_imports"][k] for k in runs}
    print(f"{'peak RSS minus after-imports':<34}{mib(delta['omrt']):>14}{mib(delta['ort']):>14}"
          f"{delta['omrt'] / max(delta['ort'], 1):>10.3f}  (omrt/ort)")
    print(f"compile (once, before the repetitions): {compile_s:.2f} s")
    print(f"omrt bytes copied on the first run: {runs['omrt'][0].get('bytes_copied')}")
    print(f"outputs: {json.dumps(checks)}")

    speedup = med["load_s"]["ort"] / med["load_s"]["omrt"]
    ttfr = med["first_result_s"]["omrt"] / med["first_result_s"]["ort"]
    rss = med["rss_peak"]["omrt"] / med["rss_peak"]["ort"]
    targets = {
        "load_speedup": {"value": speedup, "target": f">= {TARGET_LOAD_SPEEDUP}",
                         "pass": speedup >= TARGET_LOAD_SPEEDUP},
        "first_result_ratio": {"value": ttfr, "target": "< 1", "pass": ttfr < 1.0},
        "peak_rss_ratio": {"value": rss, "target": f"<= {TARGET_RSS_RATIO}", "pass": rss <= TARGET_RSS_RATIO},
    }
    print()
    print(f"{'PASS' if targets['load_speedup']['pass'] else 'FAIL'}  load + first session: ORT/omrt = "
          f"{speedup:.1f}x faster (target >= {TARGET_LOAD_SPEEDUP:g}x)")
    print(f"{'PASS' if targets['first_result_ratio']['pass'] else 'FAIL'}  time to first result: "
          f"omrt/ORT = {ttfr:.3f} (target < 1)")
    print(f"{'PASS' if targets['peak_rss_ratio']['pass'] else 'FAIL'}  peak RSS: omrt/ORT = {rss:.3f} "
          f"(target <= {TARGET_RSS_RATIO:g})")

    if args.json:
        import platform

        doc = {"model": args.model, "reps": args.reps, "threads": args.threads,
               "versions": {"omrt": runs["omrt"][0]["version"], "onnxruntime": runs["ort"][0]["version"],
                            "numpy": runs["ort"][0]["numpy"], "python": platform.python_version()},
               "compile_s": compile_s, "om_bytes": om_size, "onnx_bytes": onnx_size,
               "runs": runs, "median": med, "targets": targets, "outputs": checks}
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
        print(f"wrote {args.json}")
    return 0 if all(t["pass"] for t in targets.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
