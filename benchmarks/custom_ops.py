"""Custom operators: a C one and a Python one compiled here and run in a fresh virtual environment
that has only numpy and omrt; two models sharing a library load it once; and the latency of a
model whose activation is a packed custom operator, beside ONNX Runtime running its own kernel.

    python benchmarks/custom_ops.py                       # everything
    python benchmarks/custom_ops.py --runs 200 --json custom_ops.json
    python benchmarks/custom_ops.py --skip-venv           # no virtual environment (no pip needed)

The models (seeded weights, built with onnx.helper):
- `ffn`: x[64, 768] -> MatMul(768x3072) -> com.microsoft::FastGelu -> MatMul(3072x768), a BERT
  feed-forward block. ONNX Runtime has FastGelu among its own contrib operators; omrt runs it as
  a packed custom operator, once in C (`c_source=`) and once in Python (numpy, `python=`).
- `ffn2`: the same block with other weights and the same C operator: a second model that
  carries the same library.
- `rotary`: q[1, 128, 12, 64] -> com.acme::RotaryEmbedding (Python) -> Mul(0.125).

Fresh environment: `python -m venv`, then `pip install --no-deps` of a copy of this source tree
and `pip install numpy`, nothing else (no onnx). A worker run there with `-I` loads `ffn` (C)
and `rotary` (Python) with `trust_kernels=True`, runs them, and loads `ffn2`; the parent compares
the outputs with numpy references in float64 (largest difference over the output's magnitude)
and prints the worker's `omrt.native.loader.stats()["content"]`.

Latency: one worker process with OPENBLAS_NUM_THREADS=1 and omrt's and ONNX Runtime's thread
counts at 1 times `ffn` in omrt (C operator, inputs and outputs bound), in omrt (Python
operator), and in ONNX Runtime (its FastGelu), in interleaved blocks of 10 runs after warm-up;
medians and ratios to ONNX Runtime; then the time of the FastGelu task alone in each omrt
variant (`Session.profile`).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

from figures import cpu_name

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

FAST_GELU_C = r"""
#include <math.h>
#include "omrt_custom.h"

OMRT_EXPORT int fast_gelu(const omrt_tensor *in, int n_in, const omrt_tensor *out, int n_out,
                          void *workspace, size_t workspace_bytes, const char *attrs,
                          char *error, size_t error_bytes) {
    if (in[0].dtype != OMRT_FLOAT) OMRT_FAIL("FastGelu takes float32, not dtype %d", in[0].dtype);
    const float *x = in[0].data;
    float *y = out[0].data;
    /* 0.5 v (1 + tanh(u)) = v / (1 + exp(-2u)): expf is several times faster than tanhf */
    for (int64_t i = 0; i < in[0].size; i++) {
        float v = x[i];
        y[i] = v / (1.0f + expf(-1.5957691216f * (v + 0.044715f * v * v * v)));
    }
    return 0;
}
"""


def fast_gelu(inputs, outputs, workspace, attrs):
    x, y = inputs[0], outputs[0]
    np.multiply(x, x, out=y)
    np.multiply(y, 0.044715, out=y)
    np.add(y, 1.0, out=y)
    np.multiply(y, x, out=y)
    np.multiply(y, 0.7978845608, out=y)
    np.tanh(y, out=y)
    np.add(y, 1.0, out=y)
    np.multiply(y, x, out=y)
    np.multiply(y, 0.5, out=y)


def rotary(inputs, outputs, workspace, attrs):
    x, y = inputs[0], outputs[0]            # (batch, seq, heads, dim)
    half = x.shape[-1] // 2
    inv = attrs["base"] ** (-np.arange(half, dtype=np.float32) / half)
    angle = np.arange(x.shape[1], dtype=np.float32)[:, None] * inv
    cos, sin = np.cos(angle)[None, :, None, :], np.sin(angle)[None, :, None, :]
    a, b = x[..., :half], x[..., half:]
    y[..., :half] = a * cos - b * sin
    y[..., half:] = a * sin + b * cos


def operators() -> dict:
    import omrt

    same = omrt.OutputRule(like=0)
    return {
        "c": omrt.CustomOp("com.microsoft", "FastGelu", infer=same, c_source=FAST_GELU_C, symbol="fast_gelu"),
        "python": omrt.CustomOp("com.microsoft", "FastGelu", infer=same, python=fast_gelu),
        "rotary": omrt.CustomOp("com.acme", "RotaryEmbedding", infer=same, python=rotary, attrs={"base": 10000.0}),
    }


def weights(seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((768, 3072)).astype(np.float32) / 28,
            rng.standard_normal((3072, 768)).astype(np.float32) / 55)


def ffn_model(seed: int):
    from onnx import TensorProto, helper, numpy_helper

    w1, w2 = weights(seed)
    nodes = [helper.make_node("MatMul", ["x", "W1"], ["h"]),
             helper.make_node("FastGelu", ["h"], ["g"], domain="com.microsoft"),
             helper.make_node("MatMul", ["g", "W2"], ["y"])]
    g = helper.make_graph(nodes, "ffn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 768])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [64, 768])],
                          [numpy_helper.from_array(w1, "W1"), numpy_helper.from_array(w2, "W2")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])


def rotary_model():
    from onnx import TensorProto, helper, numpy_helper

    nodes = [helper.make_node("RotaryEmbedding", ["q"], ["r"], domain="com.acme"),
             helper.make_node("Mul", ["r", "scale"], ["y"])]
    shape = [1, 128, 12, 64]
    g = helper.make_graph(nodes, "rotary", [helper.make_tensor_value_info("q", TensorProto.FLOAT, shape)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)],
                          [numpy_helper.from_array(np.array(0.125, np.float32), "scale")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.acme", 1)])


def ffn_reference(x: np.ndarray, seed: int) -> np.ndarray:
    w1, w2 = (w.astype(np.float64) for w in weights(seed))
    h = x.astype(np.float64) @ w1
    return (0.5 * h * (1 + np.tanh(0.7978845608 * (h + 0.044715 * h ** 3)))) @ w2


def rotary_reference(q: np.ndarray) -> np.ndarray:
    """Rotation as a complex product: (a + ib) * exp(i * position * base^(-j / half))."""
    half = q.shape[-1] // 2
    z = q[..., :half].astype(np.float64) + 1j * q[..., half:].astype(np.float64)
    angle = np.arange(q.shape[1])[:, None] * 10000.0 ** (-np.arange(half) / half)
    r = z * np.exp(1j * angle)[None, :, None, :]
    return 0.125 * np.concatenate([r.real, r.imag], axis=-1)


def inputs() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    return {"x": rng.standard_normal((64, 768)).astype(np.float32),
            "q": rng.standard_normal((1, 128, 12, 64)).astype(np.float32)}


def compile_all(folder: str) -> None:
    import omrt

    ops = operators()
    omrt.compile(ffn_model(1), os.path.join(folder, "ffn_c.om"), custom_ops=[ops["c"]])
    omrt.compile(ffn_model(2), os.path.join(folder, "ffn2_c.om"), custom_ops=[ops["c"]])
    omrt.compile(ffn_model(1), os.path.join(folder, "ffn_py.om"), custom_ops=[ops["python"]])
    omrt.compile(rotary_model(), os.path.join(folder, "rotary_py.om"), custom_ops=[ops["rotary"]])
    import onnx

    onnx.save(ffn_model(1), os.path.join(folder, "ffn.onnx"))
    np.savez(os.path.join(folder, "inputs.npz"), **inputs())


VENV_WORKER = """
import importlib.util, json, os, sys
import numpy as np, omrt
from omrt.native.loader import stats
feeds = np.load("inputs.npz")
out = {"onnx_importable": importlib.util.find_spec("onnx") is not None, "omrt": omrt.__file__,
       "modules": sorted(m for m in sys.modules if m.split(".")[0] in ("onnx", "onnxruntime", "custom_ops"))}
ffn = omrt.load("ffn_c.om", trust_kernels=True)
np.save("ffn_c.npy", ffn.session().run({"x": feeds["x"]})["y"])
rot = omrt.load("rotary_py.om", trust_kernels=True)
np.save("rotary_py.npy", rot.session().run({"q": feeds["q"]})["y"])
out["after_one_model"] = stats()["content"]
ffn2 = omrt.load("ffn2_c.om", trust_kernels=True)
ffn2.session().run({"x": feeds["x"]})
out["after_two_models"] = stats()["content"]
out["status"] = [str(op) for m in (ffn, rot, ffn2) for op in m.custom_ops]
print(json.dumps(out))
"""


def fresh_environment(folder: str) -> str:
    """The python of a new virtual environment with numpy and this omrt (from a copy of the tree)."""
    tree = os.path.join(folder, "omrt-src")
    shutil.copytree(os.path.join(ROOT, "src"), os.path.join(tree, "src"),
                    ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(os.path.join(ROOT, name), tree)
    venv = os.path.join(folder, "env")
    python = os.path.join(venv, "bin", "python")
    for step in ([sys.executable, "-m", "venv", venv], [python, "-m", "pip", "install", "-q", "--no-deps", tree],
                 [python, "-m", "pip", "install", "-q", "numpy"]):
        done = subprocess.run(step, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"{' '.join(step)} failed:\n{done.stderr}")
    return python


def relative_error(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.abs(got - want).max() / np.abs(want).max())


def run_fresh(folder: str) -> dict:
    python = fresh_environment(folder)
    done = subprocess.run([python, "-I", "-c", VENV_WORKER], capture_output=True, text=True, cwd=folder)
    if done.returncode != 0:
        raise SystemExit(f"the worker in the fresh environment failed:\n{done.stderr}")
    res = json.loads(done.stdout.strip().splitlines()[-1])
    feeds = np.load(os.path.join(folder, "inputs.npz"))
    res["error_c"] = relative_error(np.load(os.path.join(folder, "ffn_c.npy")), ffn_reference(feeds["x"], 1))
    res["error_python"] = relative_error(np.load(os.path.join(folder, "rotary_py.npy")), rotary_reference(feeds["q"]))
    res["numpy"] = subprocess.run([python, "-I", "-c", "import numpy; print(numpy.__version__)"],
                                  capture_output=True, text=True).stdout.strip()
    return res


def worker_latency(folder: str, runs: int, warmup: int) -> dict:
    import omrt
    import onnxruntime as ort

    omrt.set_num_threads(1)
    x = np.load(os.path.join(folder, "inputs.npz"))["x"]
    variants, sessions = {}, {}
    for name in ("c", "py"):
        sess = sessions[name] = omrt.load(os.path.join(folder, f"ffn_{name}.om"), trust_kernels=True).session(
            zero_copy="always")
        y = np.empty((64, 768), np.float32)
        sess.bind("x", x)
        sess.bind("y", y)
        variants[f"omrt_{name}"] = (sess.run, lambda y=y: y)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.inter_op_num_threads = 1, 1
    ort_sess = ort.InferenceSession(os.path.join(folder, "ffn.onnx"), opts, providers=["CPUExecutionProvider"])
    result: list = []
    variants["ort"] = (lambda: result.__setitem__(slice(None), ort_sess.run(None, {"x": x})),
                       lambda: result[0])
    times = {name: [] for name in variants}
    for _ in range(warmup):
        for run, _ in variants.values():
            run()
    for _ in range(max(runs // 10, 1)):
        for name, (run, _) in variants.items():
            for _ in range(10):
                t0 = time.perf_counter()
                run()
                times[name].append(time.perf_counter() - t0)
    outs = {name: out() for name, (_, out) in variants.items()}
    want = ffn_reference(x, 1)
    med = {name: statistics.median(t) * 1e3 for name, t in times.items()}
    fast_gelu_ms = {f"omrt_{name}": sess.profile(repeat=runs)["FastGelu"] * 1e3 for name, sess in sessions.items()}
    return {"median_ms": med, "ratio_vs_ort": {k: v / med["ort"] for k, v in med.items()},
            "fast_gelu_ms": fast_gelu_ms, "error": {k: relative_error(v, want) for k, v in outs.items()},
            "runs": len(times["ort"])}


def run_latency(folder: str, runs: int, warmup: int) -> dict:
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker",
                           json.dumps([folder, runs, warmup])], capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise SystemExit(f"the latency worker failed:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=100, help="timed runs per variant (default 100)")
    ap.add_argument("--warmup", type=int, default=10, help="warm-up runs per variant (default 10)")
    ap.add_argument("--skip-venv", action="store_true", help="do not build the fresh virtual environment")
    ap.add_argument("--json", metavar="FILE", help="also write the figures here")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        print(json.dumps(worker_latency(*json.loads(args.worker))))
        return 0
    print(f"CPU: {cpu_name()}")
    figures: dict = {"cpu": cpu_name()}
    with tempfile.TemporaryDirectory(prefix="omrt-custom-bench-") as folder:
        compile_all(folder)
        if not args.skip_venv:
            fresh = figures["fresh_environment"] = run_fresh(folder)
            print(f"fresh environment (numpy {fresh['numpy']}, onnx importable: {fresh['onnx_importable']}, "
                  f"onnx/user modules loaded: {fresh['modules'] or 'none'}):")
            print(f"  ffn with C FastGelu: largest difference / magnitude {fresh['error_c']:.2e}")
            print(f"  rotary with Python RotaryEmbedding: largest difference / magnitude {fresh['error_python']:.2e}")
            print(f"  custom libraries after one model: {fresh['after_one_model']}, after a second model "
                  f"with the same library: {fresh['after_two_models']}")
        lat = figures["latency"] = run_latency(folder, args.runs, args.warmup)
        med, ratio = lat["median_ms"], lat["ratio_vs_ort"]
        print(f"ffn 64x768, 1 thread, {lat['runs']} runs each: omrt (C FastGelu) {med['omrt_c']:.3f} ms "
              f"(x{ratio['omrt_c']:.2f}), omrt (Python FastGelu) {med['omrt_py']:.3f} ms (x{ratio['omrt_py']:.2f}), "
              f"ONNX Runtime (its FastGelu) {med['ort']:.3f} ms; largest difference / magnitude "
              f"{max(lat['error'].values()):.1e}")
        print(f"  FastGelu alone in omrt (mean per run, Session.profile): C {lat['fast_gelu_ms']['omrt_c']:.3f} ms, "
              f"Python {lat['fast_gelu_ms']['omrt_py']:.3f} ms")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
