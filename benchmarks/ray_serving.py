"""omrt on Ray (`omrt.ray`): Ray Data throughput against one in-process session, and Ray Serve
against ONNX Runtime behind the same deployment.

    python benchmarks/ray_serving.py                   # both figures (about two minutes)
    python benchmarks/ray_serving.py --only data       # one figure
    python benchmarks/ray_serving.py --only serve
    python benchmarks/ray_serving.py --json ray.json   # also written as JSON

The model is a small CNN on 3x32x32 float32 images (three 3x3 convolutions with ReLU and max
pooling, global average pooling, a 10-way Gemm), its batch dim free, built with onnx.helper.

- data: IMAGES seeded images in BLOCKS blocks of Ray's object store (`ray.data.from_numpy`),
  `map_batches(omrt.ray.Predictor, concurrency=2, batch_size=BATCH)` with the model put in the
  object store once (`omrt.ray.put_model`), against one in-process session running the same
  images BATCH at a time. A Ray run is the whole pipeline, from starting its 2 actors to the
  materialized outputs, in order (`preserve_order`); the in-process run is the loop over the
  batches. Images per second, for the whole run and from the first batch's start to the last
  batch's end (the actors' start and model load left out), and the bytes omrt copied per batch
  (`copies_column`; the block size is a multiple of BATCH, so that no batch spans two blocks and
  Ray hands each batch as a read-only view of the object store).
- serve: the model served by `omrt.ray.deployment` (one replica, from the object store) and by
  ONNX Runtime in the same deployment code (`ModelServer` with another runner: ORT on one
  intra-op thread, as omrt runs on one), CLIENTS threads each sending REQUESTS requests of one
  image as an .npy body over a keep-alive HTTP connection. Requests per second, p50 and p99
  latency per round; the two servers alternate round by round. For scale, the time each engine
  takes to run one image in process (median of RUNS after WARMUP).

Figures are medians over ROUNDS after a warm-up round (data: a warm-up run of each). Every figure
runs in a worker process of its own that starts a local Ray (2 CPUs) and shuts it down; workers
start with OPENBLAS_NUM_THREADS=1, which Ray's actors inherit. The parent imports neither numpy
nor omrt nor Ray.
"""

from __future__ import annotations

import http.client
import os
import statistics
import sys
import threading
import time

import figures

FIGURES = ("data", "serve")
MODELS = {"data": ("cnn",), "serve": ("cnn",)}
IMAGES = 10240
BATCH = 256
BLOCKS = 20
"""IMAGES / BLOCKS = 512 images a block: two whole batches."""
CLIENTS = 8
REQUESTS = 100
"""Requests per client per round."""
RUNS, WARMUP = 200, 20
"""In-process runs of one image per engine, and untimed runs before them."""
ROUNDS = 3
TOL = 1e-4
"""Scaled error allowed between engines and batch splits (sums in another order)."""


# ---------------------------------------------------------------------------------------- model

def cnn_model():
    """x float32 [N,3,32,32] -> 3 x (3x3 Conv + Relu, 2x2 MaxPool after the first two) ->
    GlobalAveragePool -> Flatten -> Gemm -> y [N,10]; seeded He-scaled weights."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    nodes, weights, x = [], [], "x"
    for i, (cin, cout) in enumerate(((3, 16), (16, 32), (32, 64))):
        w = (rng.standard_normal((cout, cin, 3, 3)) * np.sqrt(2 / (cin * 9))).astype(np.float32)
        weights += [numpy_helper.from_array(w, f"w{i}"), numpy_helper.from_array(np.zeros(cout, np.float32), f"b{i}")]
        nodes += [helper.make_node("Conv", [x, f"w{i}", f"b{i}"], [f"c{i}"], pads=[1, 1, 1, 1]),
                  helper.make_node("Relu", [f"c{i}"], [f"r{i}"])]
        x = f"r{i}"
        if i < 2:
            nodes.append(helper.make_node("MaxPool", [x], [f"p{i}"], kernel_shape=[2, 2], strides=[2, 2]))
            x = f"p{i}"
    fc = (rng.standard_normal((64, 10)) / 8).astype(np.float32)
    weights += [numpy_helper.from_array(fc, "fc"), numpy_helper.from_array(np.zeros(10, np.float32), "fcb")]
    nodes += [helper.make_node("GlobalAveragePool", [x], ["gap"]), helper.make_node("Flatten", ["gap"], ["flat"]),
              helper.make_node("Gemm", ["flat", "fc", "fcb"], ["y"])]
    graph = helper.make_graph(nodes, "cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 32, 32])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 10])], weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def path(folder: str, suffix: str) -> str:
    return os.path.join(folder, f"cnn.{suffix}")


def worker_compile(folder: str) -> dict:
    """The CNN as .onnx (for ONNX Runtime) and .om; the versions and the host."""
    import numpy as np
    import onnx
    import onnxruntime
    import ray

    import omrt

    onnx.save(cnn_model(), path(folder, "onnx"))
    signatures = [{"x": (rows, 3, 32, 32)} for rows in (BATCH, 1)]  # the figures' batches, planned now
    result = omrt.compile(path(folder, "onnx"), path(folder, "om"), shapes_for=signatures)
    sizes = omrt.load(path(folder, "om"), trust_kernels=True).memory_sizes(signatures[0])
    return {"models": {"cnn": {"compile_s": result.seconds, "om_bytes": os.path.getsize(result.path), **sizes}},
            "versions": {"omrt": omrt.__version__, "ray": ray.__version__, "onnxruntime": onnxruntime.__version__,
                         "numpy": np.__version__},
            "host": figures.host()}


def images(count: int, seed: int = 0):
    import numpy as np

    return np.random.default_rng(seed).standard_normal((count, 3, 32, 32), dtype=np.float32)


def start_ray() -> None:
    """A local Ray of this worker's own, on 2 CPUs, quiet."""
    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    ray.data.DataContext.get_current().enable_progress_bars = False


# ---------------------------------------------------------------------------------------- data

def timed_predictor():
    """omrt.ray.Predictor that also stamps each batch's rows with when its run started and ended
    (wall clock, comparable across the node's processes)."""
    import numpy as np

    from omrt.ray import Predictor

    class TimedPredictor(Predictor):
        def __call__(self, batch):
            started = time.time()
            out = super().__call__(batch)
            rows = len(out["y"])
            out["started"], out["ended"] = np.full(rows, started), np.full(rows, time.time())
            return out

    return TimedPredictor


def columns(dataset, *names: str) -> dict:
    """Columns of a materialized dataset, in order, as numpy arrays."""
    import numpy as np

    batches = list(dataset.iter_batches(batch_size=None, batch_format="numpy"))
    return {name: np.concatenate([b[name] for b in batches]) for name in names}


def worker_data(folder: str) -> dict:
    """In-process batches against the Ray Data pipeline, interleaved, after a warm-up of each."""
    import numpy as np
    import ray

    import omrt
    import omrt.ray
    from omrt.zoo import scaled_error

    data = images(IMAGES)
    session = omrt.load(path(folder, "om"), trust_kernels=True).session()

    def in_process():
        return np.concatenate([session.run({"x": data[i:i + BATCH]})["y"] for i in range(0, IMAGES, BATCH)])

    start_ray()
    try:
        ray.data.DataContext.get_current().execution_options.preserve_order = True
        dataset = ray.data.from_numpy(np.split(data, BLOCKS))
        predictor = {"model": omrt.ray.put_model(path(folder, "om")), "columns": {"x": "data"},
                     "copies_column": "copied", "trust_kernels": True}

        def pipeline():
            return dataset.map_batches(timed_predictor(), fn_constructor_kwargs=predictor, concurrency=2,
                                       batch_size=BATCH, batch_format="numpy").materialize()

        want, out = in_process(), columns(pipeline(), "y", "copied")
        times, spans = {"in_process": [], "ray": []}, []
        for _ in range(ROUNDS):
            for key, fn in (("in_process", in_process), ("ray", pipeline)):
                t = time.perf_counter()
                result = fn()
                times[key].append(time.perf_counter() - t)
            stamps = columns(result, "started", "ended")
            spans.append(float(stamps["ended"].max() - stamps["started"].min()))
    finally:
        ray.shutdown()
    return {"times": times, "batch_spans": spans, "error": scaled_error(out["y"], want), "rows": len(out["y"]),
            "copied_per_batch": [int(c) for c in out["copied"][::BATCH]],
            "in_process_copied": session.stats.bytes_copied, "host": figures.host()}


# ---------------------------------------------------------------------------------------- serve

def ort_classes():
    """A runner of ONNX Runtime (one intra-op thread) with omrt.ray.Runner's interface, and
    omrt.ray.ModelServer answering with it instead of omrt."""
    import numpy as np

    from omrt import IOSpec
    from omrt.ray import ModelServer

    dtypes = {"tensor(float)": np.float32, "tensor(uint8)": np.uint8, "tensor(int64)": np.int64}

    class OrtRunner:
        bytes_copied = 0  # ORT's own copies are not counted

        def __init__(self, onnx_path: str) -> None:
            import onnxruntime as ort

            options = ort.SessionOptions()
            options.intra_op_num_threads = options.inter_op_num_threads = 1
            self.session = ort.InferenceSession(onnx_path, options, providers=["CPUExecutionProvider"])
            self.inputs = [IOSpec(a.name, np.dtype(dtypes[a.type]), tuple(a.shape)) for a in self.session.get_inputs()]
            self.outputs = [IOSpec(a.name, np.dtype(dtypes[a.type]), tuple(a.shape))
                            for a in self.session.get_outputs()]

        def __call__(self, feeds):
            return dict(zip([s.name for s in self.outputs], self.session.run(None, dict(feeds))))

    class OrtServer(ModelServer):
        def open(self, model, trust_kernels):
            return OrtRunner(model)

    return OrtRunner, OrtServer


def in_process_ms(runners: dict, x) -> dict:
    """Median ms of one run of each runner on `x`, interleaved, after WARMUP runs."""
    import math

    from omrt import bench

    for runner in runners.values():
        for _ in range(WARMUP):
            runner({"x": x})
    times = bench.interleave({k: (lambda r=r: r({"x": x})) for k, r in runners.items()}, RUNS, 5, math.inf,
                             settle=0.0)
    return {key: bench.stats(ts)["median_ms"] for key, ts in times.items()}


def client(port: int, route: str, body: bytes, count: int, latencies: list[float]) -> None:
    """Send `count` requests over one keep-alive connection; append each one's latency."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    headers = {"Content-Type": "application/octet-stream"}
    for _ in range(count):
        t = time.perf_counter()
        connection.request("POST", route, body, headers)
        response = connection.getresponse()
        answer = response.read()
        latencies.append(time.perf_counter() - t)
        if response.status != 200:
            raise SystemExit(f"{route}: HTTP {response.status}: {answer[:500]!r}")
    connection.close()


def load_round(port: int, route: str, body: bytes, count: int) -> dict:
    """CLIENTS threads, `count` requests each: requests per second, p50 and p99 latency."""
    import numpy as np

    latencies: list[list[float]] = [[] for _ in range(CLIENTS)]
    threads = [threading.Thread(target=client, args=(port, route, body, count, lat)) for lat in latencies]
    t = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - t
    flat = np.concatenate(latencies)
    if len(flat) != CLIENTS * count:
        raise SystemExit(f"{route}: {len(flat)} of {CLIENTS * count} requests answered")
    return {"rps": len(flat) / wall, "p50_ms": float(np.percentile(flat, 50) * 1e3),
            "p99_ms": float(np.percentile(flat, 99) * 1e3)}


def post(port: int, route: str, body: bytes) -> tuple[dict, bytes]:
    """One request: the response's headers and body."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    connection.request("POST", route, body, {"Content-Type": "application/octet-stream"})
    response = connection.getresponse()
    answer = response.read()
    connection.close()
    return dict(response.getheaders()), answer


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker_serve(folder: str) -> dict:
    """Both servers up at once (one replica each); a warm-up round each, then ROUNDS alternating."""
    import io

    import numpy as np
    import ray
    from ray import serve

    import omrt
    import omrt.ray
    from omrt.zoo import scaled_error

    x = images(1, seed=1)
    body = io.BytesIO()
    np.save(body, x)
    body = body.getvalue()
    want = omrt.load(path(folder, "om"), trust_kernels=True).session().run({"x": x})["y"]
    OrtRunner, OrtServer = ort_classes()
    model_ms = in_process_ms({"omrt": omrt.ray.Runner(omrt.load(path(folder, "om"), trust_kernels=True)),
                              "ort": OrtRunner(path(folder, "onnx"))}, x)
    port = free_port()
    routes = {"omrt": "/omrt/v2/models/cnn/infer", "ort": "/ort/v2/models/cnn/infer"}
    start_ray()
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run(omrt.ray.deployment(omrt.ray.put_model(path(folder, "om")), name="cnn", trust_kernels=True),
                  name="omrt", route_prefix="/omrt")
        serve.run(serve.deployment(OrtServer, name="cnn").bind(path(folder, "onnx"), "cnn"),
                  name="ort", route_prefix="/ort")
        checks = {}
        for key, route in routes.items():
            headers, answer = post(port, route, body)
            checks[key] = {"error": scaled_error(np.load(io.BytesIO(answer)), want),
                           "bytes_copied": int(headers["omrt-bytes-copied"])}
            load_round(port, route, body, REQUESTS // 3)
        rounds = {key: [] for key in routes}
        for _ in range(ROUNDS):
            for key, route in routes.items():
                rounds[key].append(load_round(port, route, body, REQUESTS))
    finally:
        serve.shutdown()
        ray.shutdown()
    return {"rounds": rounds, "checks": checks, "model_ms": model_ms, "host": figures.host()}


# ---------------------------------------------------------------------------------------- the parent

def spawn(args: list[str], env: dict) -> dict:
    return figures.spawn(__file__, args, env)


def host_line(host: dict) -> str:
    return f"host: {host['cpu']} ({host['isa']}, OpenBLAS core {host['blas_core']}), {os.cpu_count()} CPUs"


def verdict(ok: bool, text: str, failures: list[str]) -> str:
    if not ok:
        failures.append(text)
    return f"{'PASS' if ok else 'FAIL'}  {text}"


def report_data(res: dict, failures: list[str]) -> list[str]:
    med = {key: statistics.median(ts) for key, ts in res["times"].items()}
    rate = {key: IMAGES / s for key, s in med.items()}
    span, copied = statistics.median(res["batch_spans"]), res["copied_per_batch"]
    return [host_line(res["host"]),
            f"{IMAGES} images 3x32x32 float32 in {BLOCKS} blocks, batches of {BATCH}; medians of {ROUNDS} runs each "
            f"after a warm-up run, interleaved",
            f"  one in-process session          {med['in_process']:7.2f} s   {rate['in_process']:8.0f} images/s",
            f"  Ray Data, 2 actors (whole run)  {med['ray']:7.2f} s   {rate['ray']:8.0f} images/s",
            f"    first batch start to last end {span:7.2f} s   {IMAGES / span:8.0f} images/s",
            f"  Ray / in-process throughput     {rate['ray'] / rate['in_process']:7.2f} (whole run), "
            f"{IMAGES / span / rate['in_process']:.2f} (batches)",
            f"  outputs vs in-process: scaled error {res['error']:.1e} over {res['rows']} rows",
            verdict(res["error"] <= TOL, f"Ray Data outputs match the in-process run (<= {TOL})", failures),
            verdict(max(copied) == 0, f"bytes omrt copied per batch: max {max(copied)} over {len(copied)} batches "
                    f"(target 0); in-process: {res['in_process_copied']}", failures)]


def report_serve(res: dict, failures: list[str]) -> list[str]:
    med = {key: {figure: statistics.median(r[figure] for r in rounds) for figure in ("rps", "p50_ms", "p99_ms")}
           for key, rounds in res["rounds"].items()}
    lines = [host_line(res["host"]),
             f"one replica each, {CLIENTS} concurrent clients x {REQUESTS} requests of one image (.npy body) per "
             f"round; medians of {ROUNDS} rounds after a warm-up round, the servers alternating",
             f"{'':22}{'requests/s':>12}{'p50':>11}{'p99':>11}"]
    for key, label in (("omrt", "omrt (omrt.ray)"), ("ort", "ONNX Runtime")):
        m = med[key]
        lines.append(f"  {label:<20}{m['rps']:>12.0f}{m['p50_ms']:>8.2f} ms{m['p99_ms']:>8.2f} ms")
    o, r, ms = med["omrt"], med["ort"], res["model_ms"]
    lines.append(f"  omrt / ORT: requests/s {o['rps'] / r['rps']:.2f}, p99 {o['p99_ms'] / r['p99_ms']:.2f}")
    lines.append(f"  one image in process (the model's share of a request): omrt {ms['omrt']:.3f} ms, ORT "
                 f"{ms['ort']:.3f} ms, omrt / ORT {ms['omrt'] / ms['ort']:.2f}")
    for key, check in res["checks"].items():
        lines.append(verdict(check["error"] <= TOL, f"{key}: answer vs in-process omrt, scaled error "
                             f"{check['error']:.1e} (<= {TOL})", failures))
    copied = res["checks"]["omrt"]["bytes_copied"]
    lines.append(verdict(copied == 0, f"omrt: bytes copied for a request (omrt-bytes-copied): {copied} "
                         f"(target 0)", failures))
    return lines


WORKERS = {
    "compile": lambda a: worker_compile(a.dir),
    "data": lambda a: worker_data(a.dir),
    "serve": lambda a: worker_serve(a.dir),
}
MEASURES = {
    "data": lambda d, env, models: spawn(["data", "--dir", d], env),
    "serve": lambda d, env, models: spawn(["serve", "--dir", d], env),
}
REPORTS = {"data": report_data, "serve": report_serve}


def main(argv=None) -> int:
    args = figures.parse(__doc__.splitlines()[0], FIGURES, (), argv)
    return figures.run(__file__, "on Ray", args, MODELS, MEASURES, REPORTS, WORKERS)


if __name__ == "__main__":
    sys.exit(main())
