"""What the figure-by-figure benchmarks (memory.py, streaming.py, plans.py) share: workers in
fresh processes that answer in JSON, the host's description, and the driver that compiles the
models, measures each figure and reports it against its targets."""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from typing import Callable

from load import worker_env

Measure = Callable[[str, dict, dict], dict]
"""(folder of the compiled models, worker environment, the compile worker's model records) -> figure."""
Report = Callable[[dict, list], list]
"""(figure, failures to append to) -> lines to print."""


def spawn(script: str, args: list[str], env: dict | None = None) -> dict:
    """Run `script --worker args...` in a fresh process; its JSON answer (the last line it prints)."""
    proc = subprocess.run([sys.executable, os.path.abspath(script), "--worker", *args], env=env,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"worker {args[0]} failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def cpu_name(cpuinfo: str | None = None) -> str:
    """The host CPU as /proc/cpuinfo (or the text `cpuinfo`) names its first processor, with the
    x86 family and model numbers when it gives them: a virtual machine's name often says only
    "AMD EPYC", and the numbers tell one core generation from another (family 25 model 17 is a
    Zen 4, family 26 a Zen 5)."""
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo") as f:
                cpuinfo = f.read()
        except OSError:
            cpuinfo = ""
    first: dict[str, str] = {}
    for line in cpuinfo.split("\n\n")[0].splitlines():
        key, _, value = line.partition(":")
        first.setdefault(key.strip(), value.strip())
    name = first.get("model name") or platform.processor() or "unknown CPU"
    if first.get("cpu family") and first.get("model"):
        return f"{name} (family {first['cpu family']}, model {first['model']})"
    return name


def cpu_isa() -> str:
    """The widest vector instruction set the CPU offers, as /proc/cpuinfo's flags tell it:
    "AVX-512", "AVX2", "AVX", "SSE4.2", "NEON" (aarch64), or "unknown"."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = set(next((line.split(":", 1)[1].split() for line in f
                              if line.startswith(("flags", "Features"))), []))
    except OSError:
        flags = set()
    for flag, name in (("avx512f", "AVX-512"), ("avx2", "AVX2"), ("avx", "AVX"), ("sse4_2", "SSE4.2"),
                       ("asimd", "NEON")):
        if flag in flags:
            return name
    return "unknown"


def l2_size() -> str:
    """One core's L2 as the C library tells it ("2 MiB"), which omrt's GEMM sizes its passes by
    (csrc/omrt_gemm.h, omrt_b_in_l2), or "unknown"."""
    try:  # Python's os.sysconf does not know the name; getconf asks the C library's sysconf
        out = subprocess.run(["getconf", "LEVEL2_CACHE_SIZE"], capture_output=True, text=True, timeout=10)
        size = int(out.stdout.strip() or 0)
    except (OSError, ValueError, subprocess.SubprocessError):
        size = 0
    if size <= 0:
        return "unknown"
    return f"{size >> 20} MiB" if size % (1 << 20) == 0 else f"{size >> 10} KiB"


def host() -> dict[str, str]:
    """The CPU, its vector ISA, one core's L2, and the kernels numpy's OpenBLAS chose for it: what
    decides the BLAS's summation order and both runtimes' blocking on this host."""
    from omrt.native.blas import openblas

    return {"cpu": cpu_name(), "isa": cpu_isa(), "l2": l2_size(), "blas_core": openblas().core or "not OpenBLAS"}


def write_results(path: str | None, cpu: dict, runs: int, results: object) -> None:
    """A side-by-side benchmark's figures as JSON in `path` (when given): the host, the timed runs
    per variant, the results."""
    if path:
        with open(path, "w") as out:
            json.dump({"host": cpu, "runs": runs, "results": results}, out, indent=1)


def parse(description: str, figures: tuple[str, ...], hidden: tuple[str, ...], argv) -> argparse.Namespace:
    """`--only FIGURE` and `--json FILE`; `hidden` are the workers' own options (and `--fd`)."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--only", choices=figures, help="measure this figure only (default: all)")
    ap.add_argument("--json", metavar="FILE", help="write every figure here")
    for option in ("--worker", "--dir", "--models", *hidden):
        ap.add_argument(option, help=argparse.SUPPRESS)
    ap.add_argument("--fd", type=int, help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def run(script: str, title: str, args: argparse.Namespace, models: dict[str, tuple[str, ...]],
        measures: dict[str, Measure], reports: dict[str, Report], workers: dict) -> int:
    """A worker's answer when `--worker` is given; else compile the models the chosen figures need
    (worker "compile"), measure and report each figure, and write the JSON; 1 if a target failed."""
    if args.worker:
        print(json.dumps(workers[args.worker](args)))
        return 0
    figures = [args.only] if args.only else list(measures)
    needed = sorted({m for f in figures for m in models[f]})
    print(f"omrt {title}: {cpu_name()}, {os.cpu_count()} CPUs, load average (1 min) "
          f"{os.getloadavg()[0]:.2f}; workers on 1 BLAS thread (OPENBLAS_NUM_THREADS=1)", flush=True)
    doc: dict = {"cpu": cpu_name(), "cpus": os.cpu_count(), "loadavg_before": os.getloadavg(), "figures": {},
                 "models": {}}
    failures: list[str] = []
    with tempfile.TemporaryDirectory() as folder:
        env = worker_env(1, os.path.join(folder, "pycache"))
        if needed:
            doc.update(spawn(script, ["compile", "--dir", folder, "--models", ",".join(needed)], env))
            print(f"{', '.join(f'{k} {v}' for k, v in doc['versions'].items())}; compiled {', '.join(needed)} "
                  f"({sum(m['compile_s'] for m in doc['models'].values()):.1f} s)", flush=True)
        for figure in figures:
            t = time.perf_counter()
            doc["figures"][figure] = measures[figure](folder, env, doc["models"])
            print(f"\n== {figure} ({time.perf_counter() - t:.0f} s)")
            print("\n".join(reports[figure](doc["figures"][figure], failures)), flush=True)
    doc["loadavg_after"], doc["failures"] = os.getloadavg(), failures
    print(f"\nload average (1 min) after: {doc['loadavg_after'][0]:.2f}; targets missed: {len(failures)}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
        print(f"wrote {args.json}")
    return 1 if failures else 0
