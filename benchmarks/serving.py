"""`omrt serve`: what a request through the socket costs over a run in the process, and throughput.

    python benchmarks/serving.py                              # every figure (a few minutes)
    python benchmarks/serving.py --only frame                 # one figure: each is described below
    python benchmarks/serving.py --only resnet50
    python benchmarks/serving.py --only throughput
    python benchmarks/serving.py --json serving.json          # every figure, also written as JSON

- frame: a 1080p uint8 frame model (x uint8 [1, 1080, 1920, 3] -> every 8th row and column ->
  Cast -> ReduceMean over the image -> y float32 [1, 3]). In one worker process, interleaved in
  blocks: the model run in the process on bound numpy arrays, and the same request through an
  `omrt serve` process (another process, on a Unix socket) with the frame and the result in
  registered shared memory (fds), and with plain arrays (bytes over the socket). Median per
  request, the socket's overhead (socket median - in-process median), and the bytes the server
  copied per request (0 with fds).
- resnet50: the same for resnet50 (`omrt.zoo.redrawn`), x float32 [1, 3, 224, 224].
- throughput: 8 client processes send requests of one row each, as fast as their answers come,
  to an MLP with a free batch dim (x [N, 512] -> 3 x (MatMul 512x512, Relu)), registered memory;
  servers with 1 and 2 workers, dynamic batching off and on (a 2 ms window, up to 8 rows).
  Requests per second over the whole run, the clients' p50/p99 latency, runs and batches the
  server made, and bytes copied per request (the batch gathers and scatters, when batching).

Servers and clients run in processes of their own with OPENBLAS_NUM_THREADS=1 (omrt's default
of one thread, `--threads 1`), the servers with `--trust-kernels` (this script compiled the
models). Figures on a shared or loaded host move: compare variants measured in the same run.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time

import figures

FIGURES = ("frame", "resnet50", "throughput")
MODELS = {"frame": ("frame",), "resnet50": ("resnet50",), "throughput": ("mlp",)}
RUNS = {"frame": 100, "resnet50": 15}
"""Timed requests per variant in the overhead figures."""
WARMUP = 5
BLOCK = 5
CLIENTS = 8
REQUESTS = 300
"""Timed requests per client in `throughput` (after WARMUP)."""
MLP_WIDTH = 512
BATCHING = {"off": (), "on": ("--batch-window", "2", "--max-batch", "8")}


# ---------------------------------------------------------------------------------------- models

def om_path(folder: str, name: str) -> str:
    return os.path.join(folder, f"{name}.om")


def frame_model():
    """x uint8 [1, 1080, 1920, 3] -> every 8th row and column (Slice) -> Cast float32 ->
    ReduceMean over H and W -> y [1, 3]: the whole frame travels, little is computed."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    steps = {"starts": [0, 0], "ends": [1080, 1920], "axes": [1, 2], "steps": [8, 8]}
    consts = [numpy_helper.from_array(np.array(v, np.int64), k) for k, v in steps.items()]
    nodes = [helper.make_node("Slice", ["x", *steps], ["s"]),
             helper.make_node("Cast", ["s"], ["f"], to=TensorProto.FLOAT),
             helper.make_node("ReduceMean", ["f"], ["y"], axes=[1, 2], keepdims=0)]
    graph = helper.make_graph(nodes, "frame", [helper.make_tensor_value_info("x", TensorProto.UINT8,
                                                                             [1, 1080, 1920, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3])], consts)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def mlp_model():
    """x [N, 512] -> 3 x (MatMul 512x512 seeded, Relu) -> y [N, 512]."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    nodes, weights, value = [], [], "x"
    for i in range(3):
        weights.append(numpy_helper.from_array(
            (rng.standard_normal((MLP_WIDTH, MLP_WIDTH)) / MLP_WIDTH ** 0.5).astype(np.float32), f"w{i}"))
        nodes += [helper.make_node("MatMul", [value, f"w{i}"], [f"h{i}"]),
                  helper.make_node("Relu", [f"h{i}"], ["y" if i == 2 else f"r{i}"])]
        value = f"r{i}"
    x, y = (helper.make_tensor_value_info(n, TensorProto.FLOAT, ["N", MLP_WIDTH]) for n in "xy")
    return helper.make_model(helper.make_graph(nodes, "mlp", [x], [y], weights),
                             opset_imports=[helper.make_opsetid("", 17)])


def worker_compile(folder: str, names: list[str]) -> dict:
    """Compile each model into `folder` with its native kernels; compile times and versions."""
    import platform

    import numpy as np

    import omrt
    from omrt.zoo import redrawn

    sources = {"frame": frame_model, "mlp": mlp_model, "resnet50": lambda: redrawn("resnet50")}
    models = {name: {"compile_s": omrt.compile(sources[name](), om_path(folder, name)).seconds} for name in names}
    return {"models": models, "versions": {"omrt": omrt.__version__, "numpy": np.__version__,
                                           "python": platform.python_version()}}


# ---------------------------------------------------------------------------------------- a server

@contextlib.contextmanager
def server(folder: str, model: str, env: dict, *options: str):
    """An `omrt serve` process of `model` on a socket in `folder`, listening; stopped at the end."""
    import omrt

    path = os.path.join(folder, f"{model}.sock")
    proc = subprocess.Popen([sys.executable, "-m", "omrt.cli", "serve", om_path(folder, model), "--socket", path,
                             "--trust-kernels", "--threads", "1", *options], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"omrt serve failed: {proc.stderr.read()[-2000:]}")
            with contextlib.suppress(omrt.ServingError):
                omrt.Client(path, timeout=10).close()
                break
            if time.monotonic() > deadline:
                raise SystemExit("omrt serve did not listen within 120 s")
            time.sleep(0.05)
        yield path
    finally:
        proc.terminate()
        proc.wait()


# ---------------------------------------------------------------------------------------- overhead

def registered(client, arrays: dict) -> tuple[dict, list]:
    """Each array copied into shared memory registered with `client`: the views, and the memories
    (left open: the worker process ends with its requests)."""
    import omrt

    views, memories = {}, []
    for name, array in arrays.items():
        memory = omrt.Memory.allocate(array.nbytes, shared=True)
        client.register(memory)
        views[name] = memory.view(array.dtype, array.shape)
        views[name][...] = array
        memories.append(memory)
    return views, memories


def worker_overhead(folder: str, name: str, socket_path: str) -> dict:
    """In-process bound runs against requests through the server at `socket_path` (fds, bytes),
    interleaved; medians, bytes the server copied per request, outputs compared."""
    import numpy as np

    import omrt
    from omrt import bench
    from omrt.zoo import scaled_error

    model = bench.load_compiled(om_path(folder, name))
    feeds = bench.random_inputs(model.inputs)
    outputs = {s.name: np.empty(s.shape, s.dtype) for s in model.outputs}
    session = model.session(zero_copy="always")
    for key, array in {**feeds, **outputs}.items():
        session.bind(key, array)
    client = omrt.Client(socket_path, timeout=300)
    ins, _ = registered(client, feeds)
    outs, _ = registered(client, outputs)
    copied = {"fds": [], "bytes": []}

    def request(kind: str) -> None:
        client.run(ins, outs) if kind == "fds" else client.run(feeds)
        copied[kind].append(client.last["bytes_copied"])

    fns = {"in_process": session.run, "fds": lambda: request("fds"), "bytes": lambda: request("bytes")}
    for fn in fns.values():
        for _ in range(WARMUP):
            fn()
    times = bench.interleave(fns, RUNS[name], BLOCK, float("inf"), settle=0.0)
    first = next(iter(outputs))
    check = {"fds_vs_in_process": scaled_error(outs[first], outputs[first]),
             "bytes_vs_in_process": scaled_error(client.run(feeds)[first], outputs[first])}
    result = {"stats": {k: bench.stats(ts) for k, ts in times.items()}, "check": check,
              "copied_per_request": {k: max(v) for k, v in copied.items()},
              "input_bytes": sum(a.nbytes for a in feeds.values()),
              "output_bytes": sum(a.nbytes for a in outputs.values()), "server": client.stats()}
    client.close()
    return result


def measure_overhead(name: str, folder: str, env: dict) -> dict:
    with server(folder, name, env) as path:
        return spawn(["overhead", "--dir", folder, "--model", name, "--socket", path], env)


# ---------------------------------------------------------------------------------------- throughput

def worker_client(socket_path: str, start_at: float, seed: int) -> dict:
    """One of the clients of `throughput`: one row per request, registered memory, as fast as
    answers come, from `start_at` (a time.time() shared by every client)."""
    import numpy as np

    import omrt

    client = omrt.Client(socket_path, timeout=300)
    x = np.random.default_rng(seed).random((1, MLP_WIDTH), dtype=np.float32)
    ins, _ = registered(client, {"x": x})
    outs, _ = registered(client, {"y": np.empty((1, MLP_WIDTH), np.float32)})
    for _ in range(WARMUP):
        client.run(ins, outs)
    time.sleep(max(start_at - time.time(), 0))
    start, latencies, copied, batched = time.time(), [], 0, 0
    for _ in range(REQUESTS):
        t = time.perf_counter()
        client.run(ins, outs)
        latencies.append(time.perf_counter() - t)
        copied += client.last["bytes_copied"]
        batched += client.last["batch"] > 1
    client.close()
    return {"start": start, "end": time.time(), "latencies": latencies, "copied": copied, "batched": batched}


def measure_config(folder: str, env: dict, workers: int, batching: str) -> dict:
    """CLIENTS client processes against one server configuration."""
    import numpy as np

    with server(folder, "mlp", env, "--workers", str(workers), "--queue", str(4 * CLIENTS),
                *BATCHING[batching]) as path:
        start_at = time.time() + 3.0  # every client connected and warmed up by then
        procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker", "client", "--socket", path,
                                   "--start-at", str(start_at), "--seed", str(i)], env=env, stdout=subprocess.PIPE,
                                  text=True) for i in range(CLIENTS)]
        answers = [json.loads(p.communicate()[0].strip().splitlines()[-1]) for p in procs]
        import omrt

        with omrt.Client(path) as client:
            stats = client.stats()
    latencies = np.concatenate([a["latencies"] for a in answers]) * 1e3
    seconds = max(a["end"] for a in answers) - min(a["start"] for a in answers)
    requests = CLIENTS * REQUESTS
    return {"requests_per_s": requests / seconds, "p50_ms": float(np.percentile(latencies, 50)),
            "p99_ms": float(np.percentile(latencies, 99)), "seconds": seconds,
            "copied_per_request": sum(a["copied"] for a in answers) / requests,
            "batched_share": sum(a["batched"] for a in answers) / requests,
            "server": {k: stats[k] for k in ("requests", "runs", "batches", "batched_requests", "bytes_copied")}}


def measure_throughput(folder: str, env: dict) -> dict:
    return {f"{workers} workers, batching {batching}": measure_config(folder, env, workers, batching)
            for workers in (1, 2) for batching in ("off", "on")}


# ---------------------------------------------------------------------------------------- the parent

def spawn(args: list[str], env: dict) -> dict:
    return figures.spawn(__file__, args, env)


def cpu() -> str:
    """The host as figures.host() describes it: CPU, vector ISA, OpenBLAS kernels."""
    return ", ".join(f"{k} {v}" for k, v in figures.host().items())


def verdict(ok: bool, text: str, failures: list[str]) -> str:
    if not ok:
        failures.append(text)
    return f"{'PASS' if ok else 'FAIL'}  {text}"


def report_overhead(name: str):
    def report(res: dict, failures: list[str]) -> list[str]:
        s = {k: v["median_ms"] for k, v in res["stats"].items()}
        runs = res["stats"]["in_process"]["runs"]
        lines = [cpu(), f"{name}: input {res['input_bytes']:,} bytes, output {res['output_bytes']:,} bytes; median of "
                 f"{runs} per variant after {WARMUP} warm-up, interleaved blocks of {BLOCK}",
                 f"  in process, bound arrays          {s['in_process']:9.3f} ms",
                 *(f"  through the socket, {kind:<13} {s[kind]:9.3f} ms   overhead {s[kind] - s['in_process']:+.3f} "
                   f"ms   ({s[kind] / s['in_process']:.3f}x)" for kind in ("fds", "bytes")),
                 f"  outputs vs in process: fds {res['check']['fds_vs_in_process']:.1e}, bytes "
                 f"{res['check']['bytes_vs_in_process']:.1e}; server p50/p99 "
                 f"{res['server']['latency_ms']['p50']:.3f}/{res['server']['latency_ms']['p99']:.3f} ms",
                 f"  bytes copied per request with bytes: {res['copied_per_request']['bytes']:,}",
                 verdict(res["copied_per_request"]["fds"] == 0, f"bytes copied per request with fds: "
                         f"{res['copied_per_request']['fds']} (target 0)", failures)]
        return lines
    return report


def report_throughput(res: dict, failures: list[str]) -> list[str]:
    lines = [cpu(), f"mlp [1, {MLP_WIDTH}] per request, {CLIENTS} client processes x {REQUESTS} requests, registered "
             f"memory; batching on: {' '.join(BATCHING['on'])}",
             f"{'server':<28}{'req/s':>9}{'p50 ms':>9}{'p99 ms':>9}{'runs':>8}{'batches':>9}{'batched':>9}"
             f"{'copied/req':>12}"]
    for config, r in res.items():
        lines.append(f"{config:<28}{r['requests_per_s']:>9.0f}{r['p50_ms']:>9.3f}{r['p99_ms']:>9.3f}"
                     f"{r['server']['runs']:>8}{r['server']['batches']:>9}{100 * r['batched_share']:>8.0f}%"
                     f"{r['copied_per_request']:>12.0f}")
    unbatched = [r for c, r in res.items() if c.endswith("off")]
    lines.append(verdict(all(r["copied_per_request"] == 0 for r in unbatched),
                         "bytes copied per request without batching: 0 (fds)", failures))
    return lines


WORKERS = {
    "compile": lambda a: worker_compile(a.dir, a.models.split(",")),
    "overhead": lambda a: worker_overhead(a.dir, a.model, a.socket),
    "client": lambda a: worker_client(a.socket, float(a.start_at), int(a.seed)),
}
MEASURES = {
    "frame": lambda d, env, models: measure_overhead("frame", d, env),
    "resnet50": lambda d, env, models: measure_overhead("resnet50", d, env),
    "throughput": lambda d, env, models: measure_throughput(d, env),
}
REPORTS = {"frame": report_overhead("frame"), "resnet50": report_overhead("resnet50"),
           "throughput": report_throughput}


def main(argv=None) -> int:
    args = figures.parse(__doc__.splitlines()[0], FIGURES, ("--model", "--socket", "--start-at", "--seed"), argv)
    return figures.run(__file__, "serving", args, MODELS, MEASURES, REPORTS, WORKERS)


if __name__ == "__main__":
    sys.exit(main())
