"""`omrt bench`: one model's steady-state latency beside ONNX Runtime's, measured the way
`benchmarks/compare.py` measures its suite (this module is that script's measurement core).

Not part of the runtime: onnxruntime is imported only inside functions (and onnx only by
`omrt.compile`). Without onnxruntime, omrt's own figures are still measured and ONNX Runtime is
reported as not measured.

Per thread count n:

- omrt: one session, `zero_copy="auto"`, every input and fixed-shape output bound once, `run()`;
  `omrt.set_num_threads(n)`, with numpy's OpenBLAS pinned to one thread, so that n = 1 is one core;
- ORT `run()`: `InferenceSession` with `intra_op_num_threads=n`, `inter_op_num_threads=1`, the CPU
  provider, the default optimisation level; `run(names, feeds)` (ORT allocates the outputs);
- ORT IOBinding: the same session, inputs bound with `bind_cpu_input`, outputs bound to
  preallocated numpy buffers, `run_with_iobinding`.

All three get the same input arrays, and omrt's outputs are checked against ORT's once: the largest
difference relative to the output's largest magnitude (`omrt.zoo.scaled_error`) must stay within
TOLERANCE, which holds whatever order either runtime sums in. Warm-up runs come first, then the
timed runs go in interleaved blocks (omrt, ORT run, ORT IOBinding, omrt, ...) so that drift in
machine load falls on all three alike, each block after a pause of SETTLE_S (ORT's threads spin on
after its runs, and would slow the block after its); medians and 90th percentiles are reported, and
the ratio omrt/ORT of medians.

Inputs are drawn from one numpy generator seeded with `seed`, in the model's input order: floats
uniform in [0, 1), uint8 uniform over 0..255, bool true with probability 1/2, other integers
uniform over 0..9.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import statistics
import tempfile
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np

from .errors import InputError, OmrtError
from .runtime import IOSpec, Model, Session
from .runtime.profile import around_round_trips
from .zoo import scaled_error

TOLERANCE = 1e-3
"""Largest difference from ORT's output, relative to that output's largest magnitude, that the
check calls a match."""
ORT_MISSING = "onnxruntime is not installed (pip install onnxruntime)"
STARTUP_REPS = 5
"""How many times load + first session and ORT session creation are each timed."""
SETTLE_S = 0.1
"""Pause before each timed block: ORT's intra-op threads spin for about 45 ms after its last
run, and would otherwise take a core from the block after theirs (omrt's workers spin 0.3 ms)."""


def import_ort() -> Any | None:
    """The onnxruntime module, or None when it is not installed."""
    try:
        import onnxruntime
    except ImportError:
        return None
    return onnxruntime


def load_compiled(path: str) -> Model:
    """Load the `.om` bench compiled (the one place bench loads a model); its native kernels are
    trusted, since bench built them itself."""
    import omrt

    return omrt.load(path, trust_kernels=True)


def require_static(specs: Sequence[IOSpec]) -> None:
    """Raise InputError naming the first input with a symbolic dim: bench feeds one fixed shape."""
    for spec in specs:
        if any(not isinstance(d, int) for d in spec.shape):
            example = "x".join(str(d) if isinstance(d, int) else "1" for d in spec.shape)
            raise InputError(f"input {spec.name!r} has symbolic dims {list(spec.shape)}; give it a fixed "
                             f"shape, e.g. --shape {spec.name}={example}")


def random_inputs(specs: Sequence[IOSpec], seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded inputs of the given fixed shapes, drawn as the module docstring says."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for spec in specs:
        if spec.kind != "tensor":
            raise InputError(f"input {spec.name!r} is a {spec.kind} of tensors; omrt bench feeds tensors only")
        shape = tuple(int(d) for d in spec.shape)
        if spec.dtype.kind == "f":
            feeds[spec.name] = rng.random(shape).astype(spec.dtype)
        elif spec.dtype == np.uint8:
            feeds[spec.name] = rng.integers(0, 256, shape, dtype=np.uint8)
        elif spec.dtype == np.bool_:
            feeds[spec.name] = rng.random(shape) < 0.5
        elif spec.dtype.kind in "iu":
            feeds[spec.name] = rng.integers(0, 10, shape).astype(spec.dtype)
        else:
            raise InputError(f"input {spec.name!r} has dtype {spec.dtype}; omrt bench draws numbers and "
                             f"booleans only")
    return feeds


@dataclass
class Target:
    """A compiled model ready to time: its ONNX source, the omrt session with I/O bound once, the inputs."""

    src: str
    om: str
    compile_s: float
    model: Model
    session: Session
    feeds: dict[str, np.ndarray]
    outputs: dict[str, np.ndarray]
    """The bound output buffers (outputs of a fixed shape; others come back from each run)."""


def prepare(src: str, om: str, shapes: Mapping[str, Sequence[int]] | None = None, seed: int = 0,
            progress: Callable[[str], None] | None = None) -> Target:
    """Compile `src` into `om`, load it, draw the inputs, bind them and the fixed-shape outputs."""
    import omrt

    compiled = omrt.compile(src, om, shapes=shapes, progress=progress)
    model = load_compiled(om)
    require_static(model.inputs)
    feeds = random_inputs(model.inputs, seed)
    outs = {s.name: np.empty(tuple(s.shape), s.dtype) for s in model.outputs
            if s.kind == "tensor" and all(isinstance(d, int) for d in s.shape)}
    sess = model.session(zero_copy="auto")
    for name, arr in {**feeds, **outs}.items():
        sess.bind(name, arr)
    return Target(src, om, compiled.seconds, model, sess, feeds, outs)


def describe(target: Target) -> dict:
    """The model's figures both reports share: compile time, file size, I/O, arena."""
    return {"compile_s": target.compile_s, "om_bytes": os.path.getsize(target.om),
            "inputs": {k: [str(v.dtype), list(v.shape)] for k, v in target.feeds.items()},
            "outputs": {s.name: [str(s.dtype), list(s.shape)] for s in target.model.outputs},
            "arena_bytes": target.session.stats.arena_bytes, "lower_bound": target.session.stats.lower_bound}


def ort_session(ort: Any, src: str, threads: int) -> Any:
    """An ORT CPU session on `threads` intra-op threads and one inter-op thread, errors-only logging."""
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.log_severity_level = 3
    return ort.InferenceSession(src, so, providers=["CPUExecutionProvider"])


@contextlib.contextmanager
def omrt_threads(n: int) -> Iterator[None]:
    """omrt on n threads and numpy's OpenBLAS on one for the block (as ORT's n intra-op threads);
    one omrt thread and OpenBLAS's own count after."""
    from .kernels.parallel import _pin_blas, set_num_threads

    set_num_threads(n)
    _pin_blas(True)
    try:
        yield
    finally:
        set_num_threads(1)
        _pin_blas(False)


def check_outputs(got: Mapping[str, Any], ref: Mapping[str, Any]) -> dict[str, dict]:
    """Per array output: the largest absolute difference from ORT's, that difference relative to
    the output's magnitude, and whether it is within TOLERANCE."""
    check = {}
    for name, r in ref.items():
        g = got.get(name)
        if not isinstance(g, np.ndarray) or not isinstance(r, np.ndarray):
            continue
        if g.shape != r.shape:
            check[name] = {"max_abs_diff": math.inf, "scaled_error": math.inf, "close": False,
                           "shape": f"omrt {list(g.shape)}, ORT {list(r.shape)}"}
            continue
        diff = np.abs(g.astype(np.float64) - r.astype(np.float64))
        scaled = scaled_error(g, r)
        check[name] = {"max_abs_diff": float(np.max(diff, initial=0.0)), "scaled_error": scaled,
                       "close": scaled <= TOLERANCE}
    return check


def stats(times: list[float]) -> dict:
    """Median, 90th percentile and minimum in ms, and the number of runs."""
    a = np.asarray(times)
    return {"median_ms": float(np.median(a) * 1e3), "p90_ms": float(np.percentile(a, 90) * 1e3),
            "min_ms": float(a.min() * 1e3), "runs": len(times)}


def interleave(fns: Mapping[str, Callable[[], Any]], runs: int, block: int, budget: float,
               settle: float = SETTLE_S) -> dict[str, list[float]]:
    """Time each function `runs` times in interleaved blocks of `block`, each block `settle`
    seconds after the one before (so that each starts with the threads of the others quiet);
    stop early (after at least 5 runs each) once the blocks have taken `budget` seconds per
    function."""
    times: dict[str, list[float]] = {k: [] for k in fns}
    first = next(iter(fns))
    start = time.perf_counter()
    while len(times[first]) < runs:
        todo = min(block, runs - len(times[first]))
        for key, fn in fns.items():
            ts = times[key]
            time.sleep(settle)
            start += settle
            for _ in range(todo):
                t = time.perf_counter()
                fn()
                ts.append(time.perf_counter() - t)
        if time.perf_counter() - start > budget * len(fns) and len(times[first]) >= 5:
            break
    return times


def measure_threads(target: Target, threads: int, runs: int, warmup: int, block: int = 5,
                    budget: float = math.inf, settle: float = SETTLE_S) -> dict:
    """Time omrt, and ORT run() and IOBinding when onnxruntime is installed, on `threads` threads;
    with several, also how far apart omrt's first two cores were before and after (`round_trip_ns`,
    see `omrt.ThreadProfile.round_trip_ns`)."""
    from .native.blas import blas_threads

    ort = import_ort()
    sess, feeds = target.session, target.feeds
    fns: dict[str, Callable[[], Any]] = {"omrt": sess.run}
    rec: dict = {}
    if ort is not None:
        t = time.perf_counter()
        osess = ort_session(ort, target.src, threads)
        rec["ort_session_create_s"] = time.perf_counter() - t
        names = [o.name for o in osess.get_outputs()]
        io = osess.io_binding()
        for k, v in feeds.items():
            io.bind_cpu_input(k, v)
        ort_outs = {k: np.empty_like(v) for k, v in target.outputs.items()}
        for k in names:
            if k in ort_outs:
                v = ort_outs[k]
                io.bind_output(k, "cpu", 0, v.dtype, list(v.shape), v.ctypes.data)
            else:
                io.bind_output(k, "cpu")
        fns["ort_run"] = lambda: osess.run(names, feeds)
        fns["ort_iobinding"] = lambda: osess.run_with_iobinding(io)
    with omrt_threads(threads):
        rec["blas_threads"] = blas_threads()
        got = sess.run()
        if ort is not None:
            rec["check"] = check_outputs(got, dict(zip(names, osess.run(names, feeds))))
        for fn in fns.values():
            for _ in range(warmup):
                fn()
        copied0, runs0 = sess.stats.bytes_copied, sess.stats.runs
        times, trips = around_round_trips(sess.model.native, threads,
                                          lambda: interleave(fns, runs, block, budget, settle))
        if trips is not None:
            rec["round_trip_ns"] = list(trips)
        rec["bytes_copied_per_run"] = (sess.stats.bytes_copied - copied0) / max(sess.stats.runs - runs0, 1)
    rec.update({k: stats(v) for k, v in times.items()})
    if ort is not None:
        rec["ratio_vs_run"] = rec["omrt"]["median_ms"] / rec["ort_run"]["median_ms"]
        rec["ratio_vs_iobinding"] = rec["omrt"]["median_ms"] / rec["ort_iobinding"]["median_ms"]
    return rec


def startup(target: Target, threads: int, reps: int = STARTUP_REPS) -> dict:
    """omrt load + first session vs ORT session creation, in this process with both imports warm,
    alternating, medians of `reps` in ms."""
    ort = import_ort()
    omrt_s, ort_s = [], []
    for _ in range(reps):
        t = time.perf_counter()
        load_compiled(target.om).session(zero_copy="auto")
        omrt_s.append(time.perf_counter() - t)
        if ort is not None:
            t = time.perf_counter()
            ort_session(ort, target.src, threads)
            ort_s.append(time.perf_counter() - t)
    rec = {"reps": reps, "omrt_load_session_ms": statistics.median(omrt_s) * 1e3}
    if ort_s:
        rec["ort_session_create_ms"] = statistics.median(ort_s) * 1e3
        rec["ratio"] = rec["omrt_load_session_ms"] / rec["ort_session_create_ms"]
    return rec


def human_bytes(n: float) -> str:
    """Bytes in B, KiB, MiB or GiB, whichever keeps the number short."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def header(label: str) -> str:
    """The column titles of `row`, the first one `label`."""
    return (f"{label:<18}{'runs':>5}{'omrt':>18}{'ORT run()':>18}{'ORT IOBinding':>18}"
            f"{'vs run':>8}{'vs iob':>8}{'copied/run':>12}  check")


def row(label: str, rec: dict) -> str:
    """One measurement (a `measure_threads` record) as a table row: median / p90 ms of each variant,
    the ratios omrt/ORT, bytes copied per run and the output check."""
    def cell(key: str) -> str:
        return f"{rec[key]['median_ms']:.2f} / {rec[key]['p90_ms']:.2f}" if key in rec else "-"

    def ratio(key: str) -> str:
        return f"{rec[key]:.2f}" if key in rec else "-"

    if "check" not in rec:
        check = "ORT not measured"
    elif not rec["check"]:
        check = "no array outputs to compare"
    else:
        ok = all(c["close"] for c in rec["check"].values())
        check = f"{'ok' if ok else 'MISMATCH'} ({max(c['scaled_error'] for c in rec['check'].values()):.1e})"
    return (f"{label:<18}{rec['omrt']['runs']:>5}{cell('omrt'):>18}{cell('ort_run'):>18}"
            f"{cell('ort_iobinding'):>18}{ratio('ratio_vs_run'):>8}{ratio('ratio_vs_iobinding'):>8}"
            f"{human_bytes(rec['bytes_copied_per_run']):>12}  {check}")


def matches(rec: dict) -> bool:
    """Whether every compared output of a `measure_threads` record is close to ORT's."""
    return all(c["close"] for c in rec.get("check", {}).values())


def run(src: str, threads: Sequence[int] = (1, 2), runs: int = 50, warmup: int = 5,
        shapes: Mapping[str, Sequence[int]] | None = None, seed: int = 0, json_path: str | None = None,
        progress: Callable[[str], None] | None = None) -> int:
    """`omrt bench`: print the figures (and write them to `json_path`); 1 if outputs differ from ORT's."""
    if runs < 1 or warmup < 0:
        raise OmrtError(f"--runs {runs} --warmup {warmup}: need at least 1 timed run and 0 or more warm-up runs")
    ort = import_ort()
    import omrt

    versions = f"omrt {omrt.__version__}, " + (f"onnxruntime {ort.__version__}" if ort else ORT_MISSING)
    print(f"omrt bench {os.path.basename(src)}: {versions}")
    with tempfile.TemporaryDirectory() as tmp:
        target = prepare(src, os.path.join(tmp, "model.om"), shapes, seed, progress)
        doc: dict = {"model": src, "omrt": omrt.__version__, "onnxruntime": ort.__version__ if ort else None,
                     "seed": seed, "runs": runs, "warmup": warmup, **describe(target)}
        ins = ", ".join(f"{k} {d} {s}" for k, (d, s) in doc["inputs"].items())
        print(f"inputs (seed {seed}; floats uniform in [0, 1)): {ins}")
        print(f"compiled in {doc['compile_s']:.2f} s -> {human_bytes(doc['om_bytes'])} .om")
        doc["startup"] = start = startup(target, threads[0])
        line = f"load + first session: omrt {start['omrt_load_session_ms']:.1f} ms"
        if ort:
            line += (f", ORT session creation {start['ort_session_create_ms']:.1f} ms "
                     f"(omrt/ORT {start['ratio']:.3f})")
        print(f"{line}; medians of {start['reps']}, in this process, imports warm")
        doc["threads"] = {}
        print(f"\nlatency in ms, median / p90 of {runs} runs after {warmup} warm-up runs "
              f"(vs run / vs iob: omrt median / ORT median)")
        print(header("threads"))
        for n in threads:
            rec = doc["threads"][str(n)] = measure_threads(target, n, runs, warmup)
            print(row(f"{n} thread{'s' if n > 1 else ''}", rec), flush=True)
    if not ort:
        print(f"ONNX Runtime was not measured: {ORT_MISSING}")
    ok = all(matches(rec) for rec in doc["threads"].values())
    if not ok:
        print(f"omrt's outputs differ from ORT's (by more than {TOLERANCE:g} of their magnitude)")
    if json_path:
        with open(json_path, "w") as f:
            json.dump(doc, f, indent=1)
        print(f"wrote {json_path}")
    return 0 if ok else 1
