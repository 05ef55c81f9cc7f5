"""Side-by-side steady-state latency: omrt vs ONNX Runtime (run() and IOBinding), per model.

    python benchmarks/compare.py                                  # the whole suite, 1 and 2 threads
    python benchmarks/compare.py --models squeezenet,mlp --runs 50 --threads 1 --json out.json --png out.png
    python benchmarks/compare.py --models squeezenet --neighbour 2/10   # beside a process busy 2 ms in every 10
    python benchmarks/compare.py --hide-avx512                    # as on an AVX2 host (hide_avx512.py)

The suite: the nine light models the onnx package ships (their architectures, with weights redrawn
by `omrt.zoo.redrawn`, seeded, so that the output check means something), four real
architectures built with seeded weights (architectures.py: a MobileNetV3-style classifier, a
DBNet-style detector, a CRNN-style recognizer, a MiniLM-style encoder), an MLP (3 layers, 1024
wide, batch 64, MatMul+Add+Relu), an image preprocessing model over a 1080p uint8 HWC frame (Cast,
Sub, Div, Transpose to CHW), `transformer` (a BERT-base-like encoder, TRANSFORMER_LAYERS layers,
sequence 128, in the ops exporters emit) and `big_mlp` (over 500 MB of weights: 8 layers of
4096x4096 MatMul+Add+Relu, batch 8); when omrt registers a Resize kernel the suite also has
`preprocess_resize` (the same, then a linear Resize to 540x960). Synthetic models get deterministic
random weights.

Each model is measured in a subprocess of its own (so one model's memory never weighs on the
next), started with OPENBLAS_NUM_THREADS=1. In it the model is compiled once and measured at each
thread count by `omrt.bench` (`omrt bench` measures one model the same way; its docstring tells
the method): omrt with its I/O bound once, ORT `run()` and ORT IOBinding, the same seeded random
inputs for all three, warm-up runs, then timed runs in interleaved blocks (each after a pause that
lets the other runtime's spinning threads go quiet), medians and 90th
percentiles, the ratio omrt/ORT of medians, and an output check against ORT. Here the ratios are
also summed up as geometric means over the models (and over the light and the real models
apart), and a per-variant time budget caps the number
of runs for slow models (the count actually made is reported).

`--neighbour BUSY/PERIOD` times both runtimes beside another process, pinned to the last CPU the
worker may use, that keeps it busy BUSY ms in every PERIOD ms (a host's other tenants, made to
order): how much each runtime loses when a core it splits its layers over is lent out now and then.

`--hide-avx512` starts each worker through hide_avx512.py: on an AVX-512 host, numpy, OpenBLAS, ORT's
MLAS and omrt's kernels all see the CPU without AVX-512 and pick the kernels they run on an AVX2
host. Each worker reports what it saw (numpy's AVX512F, OpenBLAS's kernels, omrt's GEMM tile), and
the header says the view was hidden.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Iterator

from architectures import MODELS as REAL_MODELS
from figures import host
from hide_avx512 import cpuid_answers
from omrt import bench
from omrt.runtime.profile import round_trip_text

LIGHT = ["bvlc_alexnet", "densenet121", "inception_v1", "inception_v2", "resnet50", "shufflenet",
         "squeezenet", "vgg19", "zfnet512"]
REAL = list(REAL_MODELS)
"""Real architectures with seeded weights (architectures.py): MobileNetV3, DBNet, CRNN, MiniLM."""
SYNTHETIC = ["mlp", "preprocess", "preprocess_resize", "transformer", "big_mlp"]
TRANSFORMER_LAYERS = 4
"""Encoder layers in `transformer` (BERT-base has 12; 4 keep a suite run short)."""


# ---------------------------------------------------------------------------------- the models

def mlp_model(layers: int = 3, width: int = 1024, batch: int = 64):
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    nodes, inits, x = [], [], "x"
    for i in range(layers):
        w = (rng.standard_normal((width, width)) / math.sqrt(width)).astype(np.float32)
        b = (rng.standard_normal(width) * 0.1).astype(np.float32)
        inits += [numpy_helper.from_array(w, f"W{i}"), numpy_helper.from_array(b, f"b{i}")]
        nodes += [helper.make_node("MatMul", [x, f"W{i}"], [f"m{i}"]),
                  helper.make_node("Add", [f"m{i}", f"b{i}"], [f"a{i}"])]
        x = f"a{i}"
        if i < layers - 1:
            nodes.append(helper.make_node("Relu", [x], [f"r{i}"]))
            x = f"r{i}"
    nodes[-1].output[0] = "y"
    g = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, width])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, width])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def transformer_model(layers: int = TRANSFORMER_LAYERS, hidden: int = 768, heads: int = 12, ffn: int = 3072,
                      seq: int = 128, batch: int = 1):
    """A BERT-base-like encoder in the ops its exporters emit.

    Per layer: Q, K, V as MatMul+Add, Reshape/Transpose into heads (K transposed for the scores),
    MatMul, Div by sqrt(head size), Add of an additive attention mask (a constant: the last 16
    positions are padding), Softmax, MatMul, Transpose/Reshape back, output projection, residual
    Add, LayerNormalization; then FFN MatMul+Add, Gelu as x * 0.5 * (1 + Erf(x / sqrt(2))),
    MatMul+Add, residual Add, LayerNormalization. Input: hidden states (batch, seq, hidden).
    """
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    d = hidden // heads
    nodes, inits = [], []

    def const(name, value):
        inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def dense(x, n_in, n_out, name):
        w = (rng.standard_normal((n_in, n_out)) / math.sqrt(n_in)).astype(np.float32)
        b = (rng.standard_normal(n_out) * 0.02).astype(np.float32)
        nodes.append(helper.make_node("MatMul", [x, const(f"{name}.weight", w)], [f"{name}.mm"]))
        nodes.append(helper.make_node("Add", [f"{name}.mm", const(f"{name}.bias", b)], [f"{name}.out"]))
        return f"{name}.out"

    def layer_norm(x, name):
        scale = (1 + rng.standard_normal(hidden) * 0.02).astype(np.float32)
        bias = (rng.standard_normal(hidden) * 0.02).astype(np.float32)
        nodes.append(helper.make_node("LayerNormalization", [x, const(f"{name}.gamma", scale),
                                                             const(f"{name}.beta", bias)],
                                      [f"{name}.out"], axis=-1, epsilon=1e-12))
        return f"{name}.out"

    def op(op_type, inputs, name, **attrs):
        nodes.append(helper.make_node(op_type, inputs, [name], **attrs))
        return name

    mask = np.zeros((batch, 1, 1, seq), np.float32)
    mask[..., seq - 16:] = -10000.0
    const("attention_mask", mask)
    const("heads_shape", np.array([batch, seq, heads, d], np.int64))
    const("hidden_shape", np.array([batch, seq, hidden], np.int64))
    const("sqrt_d", np.array(math.sqrt(d), np.float32))
    const("sqrt_2", np.array(math.sqrt(2.0), np.float32))
    const("one", np.array(1.0, np.float32))
    const("half", np.array(0.5, np.float32))
    x = "hidden_states"
    for i in range(layers):
        p = f"layer{i}"
        q, k, v = (op("Reshape", [dense(x, hidden, hidden, f"{p}.{n}"), "heads_shape"], f"{p}.{n}.heads")
                   for n in ("query", "key", "value"))
        q = op("Transpose", [q], f"{p}.q", perm=[0, 2, 1, 3])
        k = op("Transpose", [k], f"{p}.kT", perm=[0, 2, 3, 1])
        v = op("Transpose", [v], f"{p}.v", perm=[0, 2, 1, 3])
        s = op("MatMul", [q, k], f"{p}.scores")
        s = op("Div", [s, "sqrt_d"], f"{p}.scaled")
        s = op("Add", [s, "attention_mask"], f"{p}.masked")
        s = op("Softmax", [s], f"{p}.probs", axis=-1)
        c = op("MatMul", [s, v], f"{p}.context")
        c = op("Transpose", [c], f"{p}.context.t", perm=[0, 2, 1, 3])
        c = op("Reshape", [c, "hidden_shape"], f"{p}.context.merged")
        a = op("Add", [dense(c, hidden, hidden, f"{p}.attention.output"), x], f"{p}.attention.residual")
        a = layer_norm(a, f"{p}.attention.norm")
        h = dense(a, hidden, ffn, f"{p}.intermediate")
        e = op("Erf", [op("Div", [h, "sqrt_2"], f"{p}.gelu.div")], f"{p}.gelu.erf")
        g = op("Mul", [op("Mul", [h, "half"], f"{p}.gelu.half"), op("Add", [e, "one"], f"{p}.gelu.add")],
               f"{p}.gelu")
        f = op("Add", [dense(g, ffn, hidden, f"{p}.output"), a], f"{p}.output.residual")
        x = layer_norm(f, f"{p}.output.norm")
    nodes[-1].output[0] = "last_hidden_state"
    shape = [batch, seq, hidden]
    g = helper.make_graph(nodes, "transformer",
                          [helper.make_tensor_value_info("hidden_states", TensorProto.FLOAT, shape)],
                          [helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, shape)], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def preprocess_model(resize: bool = False, height: int = 1080, width: int = 1920):
    """uint8 HWC frame -> float32 CHW, normalised with per-channel mean and std (and resized)."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    mean = np.array([0.485, 0.456, 0.406], np.float32).reshape(1, 1, 3) * 255
    std = np.array([0.229, 0.224, 0.225], np.float32).reshape(1, 1, 3) * 255
    nodes = [helper.make_node("Cast", ["frame"], ["f"], to=TensorProto.FLOAT),
             helper.make_node("Sub", ["f", "mean"], ["c"]),
             helper.make_node("Div", ["c", "std"], ["n"]),
             helper.make_node("Transpose", ["n"], ["chw" if resize else "out"], perm=[2, 0, 1])]
    inits = [numpy_helper.from_array(mean, "mean"), numpy_helper.from_array(std, "std")]
    out_shape = [3, height, width]
    if resize:
        out_shape = [3, height // 2, width // 2]
        inits.append(numpy_helper.from_array(np.array(out_shape, np.int64), "sizes"))
        nodes.append(helper.make_node("Resize", ["chw", "", "", "sizes"], ["out"], mode="linear"))
    g = helper.make_graph(nodes, "preprocess",
                          [helper.make_tensor_value_info("frame", TensorProto.UINT8, [height, width, 3])],
                          [helper.make_tensor_value_info("out", TensorProto.FLOAT, out_shape)], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])


def omrt_has(op: str) -> bool:
    from omrt.kernels import registered_ops

    return any(d == "" and o == op for d, o, _ in registered_ops())


def build(name: str, tmp: str) -> str:
    """Path of the ONNX file for a suite model (written into tmp for the synthetic ones)."""
    if os.path.isfile(name):
        return name
    import onnx

    if name in LIGHT:
        from omrt.zoo import redrawn

        proto = redrawn(name)
    elif name in REAL:
        proto = REAL_MODELS[name]()
    elif name == "mlp":
        proto = mlp_model()
    elif name == "big_mlp":
        proto = mlp_model(layers=8, width=4096, batch=8)
    elif name == "transformer":
        proto = transformer_model()
    elif name == "preprocess":
        proto = preprocess_model(resize=False)
    elif name == "preprocess_resize":
        proto = preprocess_model(resize=True)
    else:
        raise SystemExit(f"unknown model {name!r}: choose from {', '.join(LIGHT + REAL + SYNTHETIC)} or an .onnx "
                         f"path")
    path = os.path.join(tmp, f"{name}.onnx")
    onnx.checker.check_model(proto)
    onnx.save(proto, path)
    return path


# ---------------------------------------------------------------------------------- the worker

NEIGHBOUR = """
import os, sys, time
os.sched_setaffinity(0, {int(sys.argv[1])})
busy, rest = float(sys.argv[2]) / 1e3, float(sys.argv[3]) / 1e3
while True:
    end = time.perf_counter() + busy
    while time.perf_counter() < end:
        pass
    time.sleep(rest)
"""
"""The busy neighbour's loop (argv: its CPU, busy ms, resting ms)."""


def parse_neighbour(spec: str | None) -> tuple[float, float] | None:
    """`BUSY/PERIOD` in ms as (busy, period), or None when not given."""
    if not spec:
        return None
    try:
        busy, period = (float(v) for v in spec.split("/"))
    except ValueError:
        raise SystemExit(f"--neighbour {spec!r}: give BUSY/PERIOD in ms, e.g. 2/10") from None
    if not 0 < busy <= period:
        raise SystemExit(f"--neighbour {spec!r}: BUSY must be over 0 and at most PERIOD")
    return busy, period


@contextlib.contextmanager
def neighbour(spec: tuple[float, float] | None) -> Iterator[dict | None]:
    """A process busy spec[0] ms in every spec[1] ms on the last CPU this one may use, for the
    block's duration (nothing when spec is None); yields what the JSON records of it, to which
    the share of the block's time the neighbour spent on its CPU is added when it ends."""
    if spec is None:
        yield None
        return
    if not sys.platform.startswith("linux"):
        raise SystemExit("--neighbour pins its process to a CPU and reads its time from /proc: Linux only")
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        raise SystemExit(f"--neighbour needs two CPUs; this process may use {len(cpus)}")
    busy, period = spec
    proc = subprocess.Popen([sys.executable, "-c", NEIGHBOUR, str(cpus[-1]), str(busy), str(period - busy)])
    record = {"cpu": cpus[-1], "busy_ms": busy, "period_ms": period}
    start = time.perf_counter()
    try:
        yield record
    finally:
        with open(f"/proc/{proc.pid}/stat") as f:  # its user and system time, in clock ticks
            ticks = sum(int(v) for v in f.read().rsplit(")", 1)[1].split()[11:13])
        record["cpu_share"] = ticks / os.sysconf("SC_CLK_TCK") / (time.perf_counter() - start)
        proc.kill()
        proc.wait()


def cpu_view(target: bench.Target) -> dict:
    """What the libraries in this worker took the CPU to be: numpy's AVX512F, the kernels
    numpy's OpenBLAS runs, omrt's GEMM tile, and how many CPUIDs were answered with AVX-512
    hidden (None when it was not)."""
    try:
        from numpy._core._multiarray_umath import __cpu_features__
    except ImportError:  # numpy before 2.0
        from numpy.core._multiarray_umath import __cpu_features__

    from omrt.kernels.packed import gemm_tile
    from omrt.native.blas import openblas

    native = target.session.model.native
    tile = gemm_tile(native) if native is not None else None
    return {"numpy_avx512f": bool(__cpu_features__.get("AVX512F")), "blas_core": openblas().core,
            "omrt_tile": {2: "AVX-512", 1: "AVX2", 0: "C", None: "none (no native library)"}[tile],
            "cpuid_hidden": cpuid_answers()}


def measure(name: str, threads: list[int], runs: int, warmup: int, block: int, budget: float,
            settle: float, busy: tuple[float, float] | None = None) -> dict:
    """Compile `name`, then time omrt and ORT at each thread count (beside a busy neighbour when
    `busy` is given, see `neighbour`); returns a JSON-able dict."""
    import omrt

    out: dict = {"model": name}
    with tempfile.TemporaryDirectory() as tmp:
        if name == "preprocess_resize" and not omrt_has("Resize"):
            return {**out, "skipped": "omrt has no Resize kernel registered"}
        src = build(name, tmp)
        try:
            target = bench.prepare(src, os.path.join(tmp, "model.om"))
        except omrt.OmrtError as e:
            return {**out, "error": f"omrt: {type(e).__name__}: {e}"}
        out.update(bench.describe(target))
        out["cpu_view"] = cpu_view(target)
        with neighbour(busy) as beside:
            out["threads"] = {str(n): bench.measure_threads(target, n, runs, warmup, block, budget, settle)
                              for n in threads}
        if beside is not None:
            out["neighbour"] = beside
    return out


# ---------------------------------------------------------------------------------- the parent

def seen(view: dict) -> str:
    """A worker's `cpu_view` in words."""
    hidden = "" if view["cpuid_hidden"] is None else f", AVX-512 hidden ({view['cpuid_hidden']} CPUIDs answered)"
    return (f"numpy AVX512F {'on' if view['numpy_avx512f'] else 'off'}, OpenBLAS {view['blas_core']} kernels, "
            f"omrt tile {view['omrt_tile']}{hidden}")


def cores(rec: dict) -> str:
    """' (cores 62 / 70 ns)': a record's round trips, when it has them."""
    pair = rec.get("round_trip_ns")
    return f" (cores {round_trip_text(pair)})" if pair else ""


def geomean(xs: list[float]) -> float:
    xs = [x for x in xs if x and x > 0 and math.isfinite(x)]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def spawn(name: str, args: argparse.Namespace) -> dict:
    hide = [os.path.join(os.path.dirname(os.path.abspath(__file__)), "hide_avx512.py")] if args.hide_avx512 else []
    cmd = [sys.executable, *hide, os.path.abspath(__file__), "--worker", name, "--runs", str(args.runs),
           "--warmup", str(args.warmup), "--block", str(args.block), "--budget", str(args.budget),
           "--settle", str(args.settle),
           "--threads", ",".join(map(str, args.threads))] + (["--neighbour", args.neighbour] if args.neighbour else [])
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OPENBLAS_NUM_THREADS": "1"})
    if proc.returncode != 0:
        tail = proc.stderr.strip().splitlines()[-1:] or ["(no message)"]
        return {"model": name, "error": f"worker exit {proc.returncode}: {tail[0]}", "stderr": proc.stderr[-4000:]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


FAR = 2.0
"""A model ran on far cores when a cache line's round trip between omrt's first two threads, before
or after its runs, took more than FAR times the comparison's typical one (typical_round_trip)."""


def round_trips(results: list[dict]) -> list[float]:
    """Every round trip (ns) the workers timed between omrt's first two threads."""
    return [ns for res in results for rec in res.get("threads", {}).values()
            for ns in rec.get("round_trip_ns", []) if ns is not None]


def typical_round_trip(results: list[dict]) -> float:
    """The median of the comparison's round trips (inf without any). Not the fastest: one probe
    answered at 30 ns, against 58-67 for the rest, had every row of a comparison marked far."""
    trips = round_trips(results)
    return statistics.median(trips) if trips else math.inf


def far_cores(rec: dict, typical: float) -> str:
    """'  far cores (350 / 362 ns)' when `rec` ran on far cores (see FAR), else ''."""
    pair = rec.get("round_trip_ns", [])
    if not any(ns is not None and ns > FAR * typical for ns in pair):
        return ""
    return f"  far cores ({round_trip_text(pair)})"


def table(results: list[dict], threads: list[int]) -> tuple[str, dict]:
    """The latency tables, one per thread count, with geometric means of the ratios; and those means.
    Rows measured on far cores (see FAR) say so."""
    lines, summary = [], {}
    typical = typical_round_trip(results)
    for n in threads:
        lines.append("")
        lines.append(f"threads = {n}  (latency in ms: median / p90; ratio = omrt median / ORT median)")
        head = bench.header("model")
        lines.append(head)
        lines.append("-" * len(head))
        measured = []
        for res in results:
            rec = res.get("threads", {}).get(str(n))
            if rec is None:
                why = f"error: {res['error']}" if "error" in res else f"skipped: {res.get('skipped', 'no result')}"
                lines.append(f"{res['model']:<18}  {why}")
                continue
            lines.append(bench.row(res["model"], rec) + far_cores(rec, typical))
            measured.append((res, rec["ratio_vs_run"], rec["ratio_vs_iobinding"]))
        lines.append("-" * len(head))
        summary[str(n)] = {}
        for group, names in (("all", None), ("light", LIGHT), ("real", REAL)):
            picked = [(a, b) for res, a, b in measured if names is None or res["model"] in names]
            if not picked or (names is not None and len(picked) == len(measured)):
                continue
            g_run, g_iob = geomean([a for a, _ in picked]), geomean([b for _, b in picked])
            label = "geometric mean" if names is None else f"  {group} models"
            lines.append(f"{label:<18}{'':>5}{'':>18}{'':>18}{'':>18}{g_run:>8.2f}{g_iob:>8.2f}"
                         f"   ({len(picked)} models)")
            summary[str(n)][group] = {"geomean_vs_run": g_run, "geomean_vs_iobinding": g_iob, "models": len(picked)}
    return "\n".join(lines), summary


def chart(results: list[dict], threads: list[int], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [r["model"] for r in results if "threads" in r]
    fig, ax = plt.subplots(figsize=(max(8, 0.9 * len(names) + 2), 4.5))
    width = 0.8 / (2 * len(threads))
    k = 0
    for n in threads:
        for key, label in (("ratio_vs_run", "vs ORT run()"), ("ratio_vs_iobinding", "vs ORT IOBinding")):
            ys = [r["threads"][str(n)][key] if str(n) in r["threads"] else float("nan")
                  for r in results if "threads" in r]
            xs = [i + (k - (2 * len(threads) - 1) / 2) * width for i in range(len(names))]
            ax.bar(xs, ys, width, label=f"{label}, {n} thread{'s' if n > 1 else ''}")
            k += 1
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels(names, rotation=30, ha="right")
    ax.set_ylabel("omrt median latency / ORT median latency")
    ax.set_title("omrt vs ONNX Runtime (below 1: omrt faster)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def default_models() -> list[str]:
    names = LIGHT + REAL + ["mlp", "preprocess", "transformer", "big_mlp"]
    try:
        if omrt_has("Resize"):
            names.append("preprocess_resize")
    except Exception:  # noqa: BLE001 - the suite without it is still a suite
        pass
    return names


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", help=f"comma-separated, from {', '.join(LIGHT + REAL + SYNTHETIC)} or .onnx paths "
                    "(default: the whole suite)")
    ap.add_argument("--runs", type=int, default=50, help="timed runs per variant and thread count (default 50)")
    ap.add_argument("--warmup", type=int, default=None, help="warm-up runs per variant (default min(5, runs))")
    ap.add_argument("--threads", default="1,2", help="comma-separated thread counts (default 1,2)")
    ap.add_argument("--block", type=int, default=5, help="runs per variant in each interleaved block (default 5)")
    ap.add_argument("--budget", type=float, default=20.0,
                    help="seconds per variant and thread count after which a slow model stops early "
                         "(at least 5 runs are made; default 20)")
    ap.add_argument("--settle", type=float, default=bench.SETTLE_S,
                    help="seconds of pause before each block, so that it starts with the other runtime's "
                         f"threads quiet (default {bench.SETTLE_S:g}; 0 runs the blocks back to back)")
    ap.add_argument("--neighbour", metavar="BUSY/PERIOD",
                    help="time both runtimes beside a process that keeps the last CPU busy BUSY ms in every "
                         "PERIOD ms (e.g. 2/10)")
    ap.add_argument("--hide-avx512", action="store_true",
                    help="run every worker with AVX-512 hidden from it (hide_avx512.py): both runtimes as on "
                         "an AVX2 host")
    ap.add_argument("--json", metavar="FILE", help="write every figure here")
    ap.add_argument("--png", metavar="FILE", help="draw the ratios here")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if bench.import_ort() is None:
        raise SystemExit(f"compare.py measures omrt against ONNX Runtime: {bench.ORT_MISSING}")
    args.threads = [int(t) for t in str(args.threads).split(",") if t.strip()]
    if args.warmup is None:
        args.warmup = min(5, args.runs)
    busy = parse_neighbour(args.neighbour)

    if args.worker:
        print(json.dumps(measure(args.worker, args.threads, args.runs, args.warmup, args.block, args.budget,
                                 args.settle, busy)))
        return 0

    models = [m.strip() for m in args.models.split(",") if m.strip()] if args.models else default_models()
    machine = host()
    if args.hide_avx512:
        print(f"host: {machine['cpu']}, {machine['isa']} hidden from the workers (hide_avx512.py: they run as on an "
              f"AVX2 host), L2 {machine['l2']} per core, {os.cpu_count()} CPUs")
    else:
        print(f"host: {machine['cpu']}, {machine['isa']}, L2 {machine['l2']} per core, {os.cpu_count()} CPUs; "
              f"numpy's OpenBLAS runs its {machine['blas_core']} kernels")
    print(f"omrt vs ONNX Runtime: {len(models)} models, threads {args.threads}, {args.runs} timed runs "
          f"(budget {args.budget:g} s per variant), {args.warmup} warm-up runs, blocks of {args.block} "
          f"{args.settle:g} s apart" + (f"; beside a neighbour busy {busy[0]:g} ms in every {busy[1]:g} ms on the "
                                        f"last CPU" if busy else ""))
    load_before = os.getloadavg() if hasattr(os, "getloadavg") else None
    results = []
    for name in models:
        t = time.perf_counter()
        res = spawn(name, args)
        results.append(res)
        if "error" in res or "skipped" in res:
            print(f"  {name}: {'ERROR ' + res['error'] if 'error' in res else 'skipped: ' + res['skipped']}",
                  flush=True)
            continue
        recs = {n: res["threads"][str(n)] for n in args.threads}
        parts = [f"{n}t omrt {rec['omrt']['median_ms']:.2f} ms / ORT {rec['ort_run']['median_ms']:.2f} ms"
                 + cores(rec) for n, rec in recs.items()]
        print(f"  {name}: compiled in {res['compile_s']:.2f} s; {'; '.join(parts)} "
              f"({time.perf_counter() - t:.0f} s)", flush=True)
    text, summary = table(results, args.threads)
    print(text)
    trips = round_trips(results)
    if trips:
        print(f"\ncores: a cache line from omrt's first thread to its second and back took {min(trips):.0f} to "
              f"{max(trips):.0f} ns; rows marked far cores took over {FAR:g}x the median, on cores that share no "
              "cache (a virtual machine's CPUs can move so): there each layer's output crosses between the cores")
    print("\nthe workers saw: " + "; ".join(sorted({seen(r["cpu_view"]) for r in results if "cpu_view" in r})))
    load_after = os.getloadavg() if hasattr(os, "getloadavg") else None
    if load_before and load_after:
        print(f"\n{os.cpu_count()} CPUs; load average (1 min) {load_before[0]:.2f} before, {load_after[0]:.2f} after: "
              f"figures at N threads are only meaningful while N CPUs are otherwise idle")
    failed = [r["model"] for r in results if "error" in r]
    mismatched = sorted({r["model"] for r in results for rec in r.get("threads", {}).values()
                         if not bench.matches(rec)})
    if failed:
        print(f"\nfailed: {', '.join(failed)}")
    if mismatched:
        print(f"outputs differ from ORT's (by more than {bench.TOLERANCE:g} of their magnitude): "
              f"{', '.join(mismatched)}")
    if args.json:
        import platform

        doc = {"args": {k: v for k, v in vars(args).items() if k not in ("worker", "json", "png")},
               "python": platform.python_version(), "cpus": os.cpu_count(), **machine,
               "loadavg_before": load_before, "loadavg_after": load_after, "results": results,
               "summary": summary}
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
        print(f"wrote {args.json}")
    if args.png:
        chart(results, args.threads, args.png)
        print(f"wrote {args.png}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
